"""``mcpbroker status`` against a live daemon: every figure checked against
what the test did, and the server's CPU and memory against psutil's view."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import attrs
import psutil
import pytest
import trio
from mcp.shared.exceptions import MCPError

from actors.server_actor import UpstreamStatistics
from cli.status import fetch_status, render
from tests.conftest import MCPBROKER, running_daemon, sdk_server, shim_client, text_of
from tests.test_websocket_e2e import ws_client


async def test_status_counts_what_the_clients_did(socket_path: str) -> None:
    servers = {"sdk": {**sdk_server(), "timeout": 0.5}, "pool": {**sdk_server("p"), "pool": 2}}
    broker = {"websocket": "127.0.0.1:0"}
    with trio.fail_after(60):
        async with running_daemon(servers, socket_path, broker=broker) as daemon:
            first = await trio.to_thread.run_sync(fetch_status, socket_path)
            before = {s["name"]: s["requests"] for s in first["servers"]}
            assert daemon.websocket_url is not None
            async with (
                shim_client(socket_path, "sdk") as a,
                shim_client(socket_path) as b,
                ws_client(daemon.websocket_url + "/sdk") as c,
            ):
                await c.initialize()
                for n in range(3):
                    assert text_of(await a.call_tool("echo", {"text": f"{n}"})) == f"{n}"
                    await b.call_tool("sdk__echo", {"text": "x"})
                    await c.call("echo", text="y")
                with pytest.raises(MCPError):  # over the server's 0.5 s: -32001
                    await a.call_tool("slow", {"seconds": 5})
                await b.call_tool("pool__echo", {"text": "p"})

                status = await trio.to_thread.run_sync(fetch_status, socket_path)
                by_name = {s["name"]: s for s in status["servers"]}
                sdk = by_name["sdk"]
                assert sdk["requests"] - before["sdk"] == 3 * 3 + 1
                assert (sdk["timeouts"], sdk["errors"]) == (1, 1)
                assert sdk["sessions"] == 3 and sdk["share"] == "shared"
                assert sdk["in_flight"] <= 1  # (the timed-out call may still be cancelling)
                assert sdk["uptime"] > 0 and sdk["restarts"] == 0
                pool = by_name["pool"]
                assert (pool["share"], pool["instances"]) == ("pool", 2)
                assert pool["requests"] - before["pool"] == 1

                process = psutil.Process(sdk["pid"])
                cpu = process.cpu_times()
                assert 0 < sdk["cpu"] <= cpu.user + cpu.system + 0.05
                assert sdk["rss"] == pytest.approx(process.memory_info().rss, rel=0.2)
                assert pool["rss"] > sdk["rss"]  # two processes
                assert sdk["pids"] == [sdk["pid"]]
                assert len(set(pool["pids"])) == 2 and pool["pid"] in pool["pids"]
                assert all(psutil.pid_exists(pid) for pid in pool["pids"])

                sessions = status["sessions"]
                assert sorted(s["transport"] for s in sessions) == ["unix", "unix", "websocket"]
                assert sorted(tuple(s["view"]) for s in sessions) == [
                    ("sdk",),
                    ("sdk",),
                    ("sdk", "pool"),
                ]
                assert {s["client"]["name"] for s in sessions} >= {"ws-test"}
                assert all(s["queued_bytes"] == 0 for s in sessions)

                text = render(status)
                assert "3 sessions" in text and "errors" in text
                row = next(line for line in text.splitlines() if line.startswith("sdk "))
                assert "shared" in row and str(sdk["pid"]) in row and "MiB" in row
                row = next(line for line in text.splitlines() if line.startswith("pool "))
                assert f"{pool['pid']} +1" in row  # the catalog instance's, and one more
                assert "websocket" in text and "ws-test" in text


async def test_status_watch_prints_again(socket_path: str) -> None:
    def watch() -> int:
        # Read until the third frame rather than for a fixed time: the
        # command's start (rich, psutil) takes seconds on a loaded machine.
        process = subprocess.Popen(
            [MCPBROKER, "status", "--socket", socket_path, "--watch", "0.2"],
            stdout=subprocess.PIPE,
            text=True,
        )
        frames = 0
        try:
            assert process.stdout is not None
            for line in process.stdout:
                frames += "mcpbroker daemon pid" in line
                if frames == 3:
                    break
        finally:
            process.terminate()
            process.communicate()
        return frames

    with trio.fail_after(30):
        async with running_daemon({"sdk": sdk_server()}, socket_path):
            frames = await trio.to_thread.run_sync(watch, abandon_on_cancel=True)
            assert frames == 3


def test_requests_waiting_for_their_turn_are_shown_apart() -> None:
    def server(name: str, in_flight: int, waiting: int) -> dict[str, Any]:
        figures = UpstreamStatistics(name, "ready", "ready", 7, 0, 2, in_flight, 0, None)
        return attrs.asdict(attrs.evolve(figures, waiting=waiting))

    status = {"pid": 1, "socket": "s", "uptime": 5.0, "sessions": []}
    status["servers"] = [server("gated", 1, 3), server("plain", 2, 0)]
    lines = render(status).splitlines()
    assert "3 requests in flight, 3 waiting for their turn, " in lines[1]
    assert "1 (+3 waiting)" in next(line for line in lines if line.startswith("gated "))
    plain = next(line for line in lines if line.startswith("plain ")).split()
    assert "2" in plain and "waiting" not in plain
    status["servers"] = [server("plain", 2, 0)]
    assert "waiting" not in render(status)


def test_listeners_carried_over_from_a_daemon_that_went_away_are_said() -> None:
    status = {"pid": 1, "socket": "s", "uptime": 5.0, "sessions": [], "servers": []}
    assert "carried over" not in render(status)
    status["listeners_from"] = {"pid": 4242, "gone_by": 1764279602.0}
    (line,) = [line for line in render(status).splitlines() if "carried over" in line]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1764279602.0))
    assert line == (
        f"listeners carried over from the daemon that stopped by {when} (pid 4242): "
        "it did not stop cleanly"
    )


def test_the_old_processes_a_reload_drains_are_shown_with_their_requests() -> None:
    def server(name: str, status: str, pid: int, in_flight: int) -> dict[str, Any]:
        return attrs.asdict(
            UpstreamStatistics(name, status, "ready", pid, 0, 1, in_flight, 0, None)
        )

    status = {"pid": 1, "socket": "s", "uptime": 5.0, "sessions": []}
    status["servers"] = [server("a", "ready", 8, 0)]
    status["draining"] = [server("a", "draining", 7, 2), server("b", "draining", 6, 1)]
    lines = render(status).splitlines()
    assert "1 servers (+2 draining after a reload), 0 sessions, 3 requests in flight" in lines[1]
    rows = [line.split() for line in lines if line.startswith(("a ", "b "))]
    assert [row[:4] for row in rows] == [
        ["a", "ready", "shared", "8"],
        ["a", "draining", "(ready)", "shared"],
        ["b", "draining", "(ready)", "shared"],
    ]
    assert [row[4] for row in rows[1:]] == ["7", "6"]


def test_a_daemon_that_is_stopping_says_so() -> None:
    status = {"pid": 1, "socket": "s", "uptime": 5.0, "sessions": [], "servers": []}
    assert "stopping" not in render(status)
    status["stopping"] = True
    assert render(status).splitlines()[1] == (
        "stopping: the requests in flight get broker.shutdownTimeout to finish, "
        "new ones are refused; then it exits"
    )
