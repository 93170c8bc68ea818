"""The shim's own logic: argument parsing and the hello line (no processes)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.shim import UsageError, hello_line, parse_args
from broker.hello import Hello, read_hello


@given(st.lists(st.text(min_size=1), min_size=1, max_size=5))
def test_hello_line_is_json_the_daemon_reads(servers: list[str]) -> None:
    line = hello_line(servers)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"mcpbroker": {"servers": servers}}
    assert read_hello(json.loads(line)) == Hello(tuple(dict.fromkeys(servers)))


def test_parse_args() -> None:
    argv = ["--socket", "/s", "--server", "a", "--server=b", "--config=c.json"]
    assert parse_args(argv) == ("/s", "c.json", ["a", "b"])


@pytest.mark.parametrize("argv", [["--bogus"], ["--server"], ["--socket="], ["-h"]])
def test_parse_args_rejects(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        parse_args(argv)
