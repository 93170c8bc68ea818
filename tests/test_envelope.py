"""Large answers whose result crosses the broker unparsed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from broker.envelope import LARGE, parse_large_answer
from broker.upstream import UpstreamProtocol
from tests.test_fuzz import _ready_upstream, json_values

PAD = "x" * LARGE


def line_of(message: Any) -> bytes:
    return orjson.dumps(message)


@given(st.integers(0, 2**62), json_values)
def test_an_answer_comes_out_as_it_went_in(id: int, value: Any) -> None:
    try:
        line = line_of({"jsonrpc": "2.0", "id": id, "result": {"pad": PAD, "value": value}})
    except TypeError:  # an integer past 64 bits: no server's answer holds one either
        assume(False)
    answer = parse_large_answer(line)
    assert answer is not None and answer["id"] == id
    assert orjson.loads(orjson.dumps(answer)) == orjson.loads(line)


@pytest.mark.parametrize(
    "line",
    [
        line_of({"jsonrpc": "2.0", "id": 1, "result": "small"}),  # not worth it
        line_of({"jsonrpc": "2.0", "id": "s", "result": PAD}),  # not one of ours
        line_of({"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": PAD}}),
        line_of({"id": 1, "jsonrpc": "2.0", "result": PAD}),  # another order
        b'{"jsonrpc": "2.0", "id": 1, "result": "' + PAD.encode() + b'"}',  # spaces
        b'{"jsonrpc":"2.0","id":01,"result":"' + PAD.encode() + b'"}',  # not JSON
        b'{"jsonrpc":"2.0","id":-1,"result":"' + PAD.encode() + b'"}',
        b'{"jsonrpc":"2.0","id":1,"result":"' + PAD.encode() + b'"',  # cut short
    ],
)
def test_other_lines_are_left_to_the_parser(line: bytes) -> None:
    assert parse_large_answer(line) is None


def forwarded(proto: UpstreamProtocol, request: dict[str, Any]) -> int:
    proto.client_request("A", request)
    return int(request["id"])


def test_an_answer_the_broker_must_read_is_not_taken_unparsed() -> None:
    proto = _ready_upstream()
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}}
    plain = forwarded(proto, dict(call))
    tasked = forwarded(proto, {**call, "id": 2, "params": {"name": "t", "task": {}}})
    for upstream_id, taken in ((plain, True), (tasked, False)):
        answer = parse_large_answer(line_of({"jsonrpc": "2.0", "id": upstream_id, "result": PAD}))
        assert answer is not None
        assert (proto.response_fast(answer) is not None) is taken
