"""The shim's own logic: argument parsing and the hello line (no processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.downstream.unix import hold_socket_lock
from actors.paths import lock_path_for
from broker.hello import Hello, read_hello
from cli.daemon_socket import _lock_state, daemon_environ
from cli.shim import ShowHelp, UsageError, hello_line, parse_args
from tests.conftest import REPO


@given(st.lists(st.text(min_size=1), min_size=1, max_size=5))
def test_hello_line_is_json_the_daemon_reads(servers: list[str]) -> None:
    line = hello_line(servers)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"mcpbroker": {"servers": servers}}
    assert read_hello(json.loads(line)) == Hello(tuple(dict.fromkeys(servers)))


def test_parse_args() -> None:
    argv = ["--socket", "/s", "--server", "a", "--server=b", "--config=c.json"]
    assert parse_args(argv) == ("/s", "c.json", ["a", "b"])


def test_a_server_may_be_named_without_a_flag() -> None:
    # (the MCP Inspector takes --server as its own option: `connect time` reaches us)
    assert parse_args(["time", "--socket", "/s", "--server", "git", "files"]) == (
        "/s",
        None,
        ["time", "git", "files"],
    )


@pytest.mark.parametrize("argv", [["--bogus"], ["--server"], ["--socket="]])
def test_parse_args_rejects(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        parse_args(argv)


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["time", "--help"]])
def test_help_is_asked_for(argv: list[str]) -> None:
    with pytest.raises(ShowHelp):
        parse_args(argv)


RELAY_TO_A_GONE_HOST = """
import socket, sys
from cli.copy_relay import CopyRelay
ours, daemon = socket.socketpair()
daemon.sendall(b'{"jsonrpc":"2.0","method":"notifications/message"}\\n')
sys.exit(CopyRelay(ours).run())
"""


def test_the_copying_relay_leaves_quietly_when_the_host_closed_its_stdout() -> None:
    """The daemon's bytes meet a stdout whose reader is gone (the host left
    while its stdin is still open): exit 0, not taken for the daemon's close
    (which would exit 1 saying so)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # (the host has gone)
    stdin_read, stdin_write = os.pipe()  # (and its stdin is still open)
    try:
        done = subprocess.run(
            [sys.executable, "-c", RELAY_TO_A_GONE_HOST],
            stdin=stdin_read,
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=REPO,
            timeout=20,
        )
    finally:
        for fd in (write_end, stdin_read, stdin_write):
            os.close(fd)
    assert done.returncode == 0, done.stderr.decode()
    assert b"daemon closed" not in done.stderr


def test_a_daemon_the_shim_starts_is_not_its_hosts_service_managers() -> None:
    """A host run as a systemd service passes its notify socket to the shim;
    the daemon the shim starts outlives the host, and must not tell that
    manager it is ready or stopping (actors/sdnotify.py)."""
    host = {"PATH": "/bin", "NOTIFY_SOCKET": "/run/user/1/systemd/notify", "LISTEN_FDS": "1"}
    assert daemon_environ(host) == {"PATH": "/bin", "MCPBROKER_STARTED_BY": "shim"}


def test_a_socket_path_too_long_is_said_as_the_daemon_says_it(tmp_path: object) -> None:
    """(The shim said 'cannot connect to PATH: None'.)"""
    from cli.daemon_socket import DaemonUnavailable, connect

    with pytest.raises(DaemonUnavailable, match="longer than a unix socket allows"):
        connect("/tmp/" + "x" * 200 + ".sock")


def test_the_lock_state_is_the_pid_it_names_and_whether_it_is_held(tmp_path: object) -> None:
    """What a shim waiting for a daemon sees of the daemon lock, opened once."""
    socket_path = f"{tmp_path}/d.sock"
    assert _lock_state(socket_path, 1) == (None, False)  # (no lock file)
    with hold_socket_lock(socket_path):  # (as a daemon holds it)
        assert _lock_state(socket_path, 1) == (os.getpid(), True)
        assert _lock_state(socket_path, os.getpid()) == (os.getpid(), False)  # (not tried)
    assert _lock_state(socket_path, 1) == (os.getpid(), False)  # (let go: its pid stays)
    os.symlink(lock_path_for(socket_path), lock_path_for(f"{tmp_path}/link.sock"))
    assert _lock_state(f"{tmp_path}/link.sock", 1) == (None, False)  # (a link is not followed)
