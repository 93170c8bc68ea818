"""``mcpbroker logs`` on real log files (rotated, followed) and on the log of a
real daemon, whose lines carry the server, session and request they concern."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
from mcp.shared.exceptions import MCPError

from actors.daemon import Daemon
from broker.config import parse_config
from cli.logs import Filter, follow, last_lines, render
from tests.conftest import MCPBROKER, REPO, sdk_server, shim_client

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def line(event: str, **fields: Any) -> str:
    record = {"event": event, "level": "info", "timestamp": "2026-11-25T10:00:00.123456Z"}
    return json.dumps({**fields, **record})


def write(path: Path, *lines: str) -> None:
    with path.open("a") as file:
        file.write("".join(each + "\n" for each in lines))


def logs(*args: str) -> list[str]:
    done = subprocess.run(
        [MCPBROKER, "logs", *args], env=ENV, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_logs_filters_by_server_session_and_level_and_reads_rotated_files(
    tmp_path: Path,
) -> None:
    log = tmp_path / "d.log"
    write(
        Path(f"{log}.1"),
        line("server.started", server="a", pid=1),
        line("session.opened", session=1),
    )
    write(
        log,
        "Traceback (most recent call last): not JSON",
        line("server.ready", server="b"),
        line("session.opened", session=2),
        json.dumps(
            {
                "event": "server.down",
                "level": "error",
                "server": "a",
                "reason": "exited",
                "timestamp": "2026-11-25T10:00:01Z",
                "exception": "Traceback\n  boom",
            }
        ),
        line("server.request_timed_out", server="a", session=2, request=7),
    )
    every = logs("--file", str(log))
    assert len(every) == 2 + 5 + 2  # both files, oldest first; the traceback's two lines
    assert every[0].startswith("2026-11-25 10:00:00.123 info") and "server=a pid=1" in every[0]
    assert every[2] == "Traceback (most recent call last): not JSON"
    server_a = logs("--file", str(log), "--server", "a")
    assert [row.split()[3] for row in server_a if not row.startswith(" ")] == [
        "server.started",
        "server.down",
        "server.request_timed_out",
    ]
    assert "server=a session=2 request=7" in server_a[-1]  # the context first
    assert logs("--file", str(log), "--server", "a", "-n", "1") == server_a[-1:]
    session_2 = logs("--file", str(log), "--session", "2")
    assert [row.split()[3] for row in session_2] == ["session.opened", "server.request_timed_out"]
    errors = logs("--file", str(log), "--level", "error")
    assert errors[0].split()[2:4] == ["error", "server.down"] and errors[1:] == [
        "    Traceback",
        "      boom",
    ]
    assert json.loads(logs("--file", str(log), "--json", "-n", "1")[0])["request"] == 7
    missing = subprocess.run(
        [MCPBROKER, "logs", "--file", str(tmp_path / "none.log")],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert missing.returncode == 1 and "no log at" in missing.stderr


def test_last_lines_and_follow_miss_nothing_across_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "d.log"
    write(log, line("one"), line("two"))
    shown, position = last_lines(str(log), Filter(), 1)
    assert [render(each).split()[3] for each in shown] == ["two"]
    lines = follow(str(log), position, poll=0.01)
    four = line("four")
    with log.open("a") as file:
        file.write(line("three") + "\n" + four[:10])  # a half-written last line
    assert json.loads(next(lines))["event"] == "three"
    with log.open("a") as file:
        file.write(four[10:] + "\n")
    assert json.loads(next(lines))["event"] == "four"
    log.rename(f"{log}.1")  # rotated, as RotatingFileHandler does
    write(Path(f"{log}.1"), line("five"))  # (the old file's last line, after the rename)
    write(log, line("six"))
    assert [json.loads(next(lines))["event"] for _ in range(2)] == ["five", "six"]
    lines.close()


def test_logs_follow_prints_lines_as_they_come(tmp_path: Path) -> None:
    log = tmp_path / "d.log"
    write(log, line("old", session=1))
    follower = subprocess.Popen(
        [MCPBROKER, "logs", "--file", str(log), "--follow", "--session", "1", "-n", "0"],
        env=ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)  # (it starts, prints nothing, and watches)
        write(log, line("other", session=2), line("new", session=1, request=3))
        assert follower.stdout is not None
        row = follower.stdout.readline()
        assert row.split()[3] == "new" and "session=1 request=3" in row
    finally:
        follower.terminate()
        follower.wait(timeout=10)


async def test_a_daemon_logs_the_server_session_and_request_of_each_line(
    tmp_path: Path,
) -> None:
    os.chmod(tmp_path, 0o700)
    socket_path, log = str(tmp_path / "s.sock"), tmp_path / "s.log"
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps({"mcpServers": {"alpha": {**sdk_server("alpha"), "timeout": 0.5}}})
    )
    argv = ["serve", "--config", str(config), "--socket", socket_path, "--log-file", str(log)]
    serve = await trio.lowlevel.open_process([MCPBROKER, *argv], env=ENV)
    try:
        with trio.fail_after(60):
            while not log.exists() or "server.ready" not in log.read_text():
                await trio.sleep(0.05)
            async with shim_client(socket_path) as client:
                with pytest.raises(MCPError) as late:
                    await client.call_tool("alpha__slow_pid", {"seconds": 2})
                assert late.value.error.code == -32001
    finally:
        serve.terminate()
        with trio.move_on_after(10):
            await serve.wait()
    records = [json.loads(row) for row in log.read_text().splitlines() if row.startswith("{")]
    [opened] = [r for r in records if r["event"] == "session.opened"]
    session = opened["session"]
    [initialized] = [r for r in records if r["event"] == "session.initialized"]
    assert initialized["session"] == session and initialized["client"] == "mcp"
    [timed_out] = [r for r in records if r["event"] == "server.request_timed_out"]
    assert timed_out["server"] == "alpha" and timed_out["session"] == session
    assert isinstance(timed_out["request"], int)
    rows = logs("--file", str(log), "--session", str(session))
    assert [row.split()[3] for row in rows] == [
        "session.opened",
        "session.initialized",
        "server.request_timed_out",
        "session.closed",
    ]
    assert all(f"session={session}" in row for row in rows)


class BrokenConnection:
    """A client connection whose transport fails with a bug (not a closed peer)."""

    transport = "unix"

    async def receive(self) -> Any:
        raise RuntimeError("a bug in a transport")

    async def send(self, messages: Any) -> None:
        pass

    async def aclose(self) -> None:
        pass


async def test_a_crashed_session_is_logged_with_its_id(socket_path: str) -> None:
    daemon = Daemon(parse_config({"mcpServers": {}}), socket_path)
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars]
    ) as captured:
        await daemon._serve_session(BrokenConnection())  # type: ignore[arg-type]
    [opened] = [e for e in captured if e["event"] == "session.opened"]
    [crashed] = [e for e in captured if e["event"] == "session.crashed"]
    assert crashed["session"] == opened["session"]
    assert structlog.contextvars.get_contextvars() == {}  # (bound for the session only)


def test_a_log_path_that_is_a_directory_is_said_and_exit_1(tmp_path: Path) -> None:
    """(It was read as an empty log: nothing said, exit 0.)"""
    done = subprocess.run(
        [MCPBROKER, "logs", "--file", str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1 and "is a directory, not a log file" in done.stderr


def test_a_negative_line_count_is_refused(tmp_path: Path) -> None:
    """(It printed nothing and exited 0, as if the log were empty.)"""
    log = tmp_path / "daemon.log"
    write(log, line("daemon.started"))
    done = subprocess.run([MCPBROKER, "logs", "--file", str(log), "-n", "-3"],
                          env=ENV, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 2 and "-n/--lines must be 0 or more" in done.stderr


def test_control_characters_from_a_server_are_escaped_not_played() -> None:
    # (ESC ]0; retitled the reader's terminal, ESC [2J cleared it, ESC [8m hid text)
    hostile = "\x1b]0;PWNED\x07\x1b[2J\x1b[8mhidden\x9b"
    line = json.dumps({"event": "server.stderr", "level": "info", "line": hostile})
    for shown in (render(line), render("not json " + hostile)):
        assert not any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in shown), shown
        assert "\\u001b]0;PWNED\\u0007" in shown
