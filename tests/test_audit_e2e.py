"""The audit log (``broker.auditLog``) of a live daemon: one JSON line per tool
call, ok, refused, timed out or cancelled, with arguments only when asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
from mcp.shared.exceptions import MCPError

from tests.conftest import running_daemon, sdk_server, shim_client


async def make_calls(socket_path: str) -> None:
    async with shim_client(socket_path) as client:
        await client.call_tool("alpha__echo", {"text": "hello"})
        with pytest.raises(MCPError):
            await client.call_tool("alpha__nope", {"x": 1})  # unknown: refused by the broker
        with pytest.raises(MCPError):
            await client.call_tool("alpha__slow_pid", {"seconds": 3})  # times out (1 s)
        async with trio.open_nursery() as nursery:  # cancelled by the client
            nursery.start_soon(client.call_tool, "alpha__slow_pid", {"seconds": 5})
            await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
        await client.send_ping()


async def audited(socket_path: str, path: Path, arguments: bool) -> list[dict[str, Any]]:
    server = {**sdk_server("alpha"), "timeout": 1.0}
    broker = {"auditLog": str(path), "auditArguments": arguments}
    with trio.fail_after(60):
        async with running_daemon({"alpha": server}, socket_path, broker=broker):
            await make_calls(socket_path)
            # (the session's end is seen by the daemon a moment after the client's)
            while len(path.read_text().splitlines()) < 4:
                await trio.sleep(0.05)
    return [json.loads(row) for row in path.read_text().splitlines()]


@pytest.mark.parametrize("arguments", [False, True])
async def test_every_tool_call_is_audited_with_its_outcome(
    socket_path: str, tmp_path: Path, arguments: bool
) -> None:
    path = tmp_path / "audit.jsonl"
    lines = await audited(socket_path, path, arguments)
    assert [(r["server"], r["tool"], r["outcome"], r.get("code")) for r in lines] == [
        ("alpha", "echo", "ok", None),
        ("", "alpha__nope", "error", -32602),
        ("alpha", "slow_pid", "timeout", -32001),
        ("alpha", "slow_pid", "cancelled", None),
    ]
    for record in lines:
        assert record["client"] == "mcp" and isinstance(record["clientVersion"], str)
        assert record["time"].endswith("Z") and isinstance(record["session"], int)
    assert lines[2]["duration"] >= 1.0  # the timeout
    assert 0.2 <= lines[3]["duration"] < 5
    if arguments:
        assert [r["arguments"] for r in lines] == [
            {"text": "hello"},
            {"x": 1},
            {"seconds": 3},
            {"seconds": 5},
        ]
    else:
        assert not any("arguments" in r for r in lines)
    assert oct(path.stat().st_mode & 0o777) == "0o600"


class FullDisk:
    def write(self, text: str) -> None:
        pass  # (buffered)

    def flush(self) -> None:
        raise OSError(28, "No space left on device")


def test_an_audit_log_that_cannot_be_written_loses_records_not_sessions(tmp_path: Path) -> None:
    # (the ENOSPC of the flush came out into the session, which was cut mid-call)
    from actors.audit import AuditLog
    from broker.calls import AuditRecord

    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    audit._file = FullDisk()  # type: ignore[assignment]
    record = AuditRecord("files", "read", 0.5, "ok")
    with structlog.testing.capture_logs() as captured:
        for _ in range(3):
            audit.write([record, record], session=1, client={"name": "c"})
    failures = [entry for entry in captured if entry["event"] == "audit.write_failed"]
    assert len(failures) == 1 and failures[0]["records_lost"] == 2, failures
