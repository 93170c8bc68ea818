"""Crash recovery and liveness on the real daemon (docs/rules/restarts.md,
docs/faults.md): servers killed, crash-looping and SIGSTOPped under clients
speaking raw NDJSON (tests/faultkit.py), with tests/servers/misbehaving.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
from pathlib import Path

import psutil
import trio

from broker.jsonrpc import CONNECTION_CLOSED
from tests.faultkit import Client, DaemonProcess, connect, id_key, misbehaving, running_daemon

URI = "mem://recoverable/a"
FAST = {"restartDelay": 0.2, "restartMaxDelay": 1}  # restarts, quickly


async def ready_again(daemon: DaemonProcess, name: str, old_pid: int, within: float = 10) -> int:
    """Wait until ``name`` runs again in a new process; its pid."""
    with trio.fail_after(within):
        while True:
            server = await daemon.server(name)
            if server["state"] == "ready" and server["pid"] not in (None, old_pid):
                return int(server["pid"])
            await trio.sleep(0.05)


def cpu(daemon: DaemonProcess) -> float:
    times = daemon.ps.cpu_times()
    return times.user + times.system


def changes(client: Client) -> list[str]:
    return [m["method"] for m in client.messages if "list_changed" in str(m.get("method"))]


async def call_sleeping(client: Client, seconds: float) -> int:
    id = client.new_id()
    params = {"name": "sleep", "arguments": {"seconds": seconds}}
    await client.send({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    return id


async def test_calls_in_flight_on_a_killed_server_each_get_one_retryable_error() -> None:
    with trio.fail_after(60):
        async with (
            running_daemon({"r": misbehaving("recoverable")}, FAST) as daemon,
            connect(daemon, ["r"]) as a,
            connect(daemon, ["r"]) as b,
            connect(daemon, ["r"]) as c,
        ):
            clients = (a, b, c)
            ids = {
                client: [await call_sleeping(client, 60) for _ in range(2)] for client in clients
            }
            while (await daemon.server("r"))["in_flight"] < 6:
                await trio.sleep(0.02)
            pid = (await daemon.server("r"))["pid"]
            killed = trio.current_time()
            os.kill(pid, signal.SIGKILL)
            for client in clients:
                for id in ids[client]:
                    error = (await client.response(id, within=5))["error"]
                    assert error["code"] == CONNECTION_CLOSED, error
                    assert error["data"] == {"server": "r", "retryable": True}, error
                    assert "'r'" in error["message"] and "exited" in error["message"], error
            assert trio.current_time() - killed < 2, "the errors were not sent at once"
            await ready_again(daemon, "r", pid)
            for client in clients:
                assert await client.call("echo", {"text": "back"}) == "back"
                for id in ids[client]:
                    assert len(client.responses[id_key(id)]) == 1, client.responses[id_key(id)]
                assert changes(client) == []  # it came back with the same lists
            assert (await daemon.server("r"))["restarts"] == 1


async def test_subscriptions_and_log_level_are_replayed_after_a_restart() -> None:
    with trio.fail_after(60):
        async with (
            running_daemon({"r": misbehaving("recoverable")}, FAST) as daemon,
            connect(daemon, ["r"]) as subscriber,
            connect(daemon, ["r"]) as other,
        ):
            assert "result" in await subscriber.request("resources/subscribe", {"uri": URI})
            assert "result" in await subscriber.request("logging/setLevel", {"level": "debug"})
            told = {"subscribed": [URI], "level": "debug"}
            assert json.loads(await other.call("state")) == told
            pid = (await daemon.server("r"))["pid"]
            os.kill(pid, signal.SIGKILL)
            await ready_again(daemon, "r", pid)
            assert json.loads(await other.call("state")) == told  # the new process was told
            await other.call("touch", {"uri": URI})
            updated = "notifications/resources/updated"
            await subscriber.wait_until(
                lambda: bool(subscriber.notifications(updated)), 5, "no resources/updated"
            )
            assert subscriber.notifications(updated)[0]["params"] == {"uri": URI}
            await trio.sleep(0.3)
            assert other.notifications(updated) == []  # only to the subscriber


async def test_list_changed_only_when_a_restart_changed_the_catalog() -> None:
    extra = Path(tempfile.mkdtemp(prefix="mcprec-")) / "extra"
    server = misbehaving("recoverable", env={"MISBEHAVING_EXTRA": str(extra)})
    with trio.fail_after(60):
        async with running_daemon({"r": server}, FAST) as daemon, connect(daemon) as client:
            names = await tool_names(client)
            assert "r__extra" not in names
            pid = (await daemon.server("r"))["pid"]
            os.kill(pid, signal.SIGKILL)
            pid = await ready_again(daemon, "r", pid)
            await trio.sleep(1)  # (the catalog is read again meanwhile)
            assert changes(client) == [] and await tool_names(client) == names
            extra.touch()  # its next process offers one more tool
            os.kill(pid, signal.SIGKILL)
            await ready_again(daemon, "r", pid)
            await client.wait_until(lambda: bool(changes(client)), 5, "no list_changed")
            await trio.sleep(1)
            assert changes(client) == ["notifications/tools/list_changed"]
            assert await tool_names(client) == [*names, "r__extra"]
    extra.unlink()
    extra.parent.rmdir()


async def tool_names(client: Client) -> list[str]:
    return [tool["name"] for tool in (await client.request("tools/list"))["result"]["tools"]]


async def test_a_crash_loop_ends_failed_and_costs_the_daemon_nothing() -> None:
    servers = {"demo": misbehaving(), "crash": misbehaving("crash-at-start", 7)}
    broker = {"restartDelay": 0.05, "restartMaxDelay": 0.4, "restartAttempts": 6}
    with trio.fail_after(60):
        async with running_daemon(servers, broker, ready={"demo"}) as daemon:
            started, before = trio.current_time(), cpu(daemon)
            while (await daemon.server("crash"))["state"] != "failed":
                await trio.sleep(0.1)
            looped, spent = trio.current_time() - started, cpu(daemon) - before
            crash = await daemon.server("crash")
            assert crash["restarts"] == 6 and crash["pid"] is None, crash
            assert "with code 7" in crash["last_error"], crash
            assert "crashing at start" in crash["last_error"], crash  # its last stderr line
            assert "6 restarts in a row" in crash["last_error"], crash
            failed = [e for e in daemon.log() if e.get("event") == "server.failed"]
            assert len(failed) == 1 and "crashing at start" in failed[0]["stderr"][-1], failed
            assert spent < 0.5 * looped + 0.5, f"{spent:.2f} s of CPU in {looped:.2f} s of loop"
            # Failed: nothing runs, nothing is spent.
            children = {p.pid for p in daemon.ps.children(recursive=True)}
            before = cpu(daemon)
            await trio.sleep(3)
            idle = cpu(daemon) - before
            assert idle < 0.1, f"the daemon used {idle:.2f} s of CPU in 3 s with a failed server"
            assert {p.pid for p in daemon.ps.children(recursive=True)} == children
            assert (await daemon.server("crash"))["restarts"] == 6
            async with connect(daemon, ["demo"]) as client:  # the others are served
                assert await client.call("echo", {"text": "fine"}) == "fine"
                response = await client.request("tools/call", {"name": "crash__echo"})
                assert response.get("error", {}).get("code") is not None


async def test_a_sigstopped_server_is_declared_dead_after_its_missed_pings() -> None:
    server = misbehaving("recoverable", pingInterval=0.5, pingMisses=2)
    with trio.fail_after(60):
        async with (
            running_daemon({"r": server}, FAST) as daemon,
            connect(daemon, ["r"]) as client,
        ):
            assert await client.call("echo", {"text": "hi"}) == "hi"
            await trio.sleep(1.2)  # it answers its pings: nothing happens
            assert (await daemon.server("r"))["restarts"] == 0
            pid = (await daemon.server("r"))["pid"]
            os.kill(pid, signal.SIGSTOP)
            stopped = trio.current_time()
            try:
                id = client.new_id()
                params = {"name": "echo", "arguments": {"text": "lost"}}
                await client.send(
                    {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}
                )
                error = (await client.response(id, within=10))["error"]
                dead_after = trio.current_time() - stopped
                assert error["data"] == {"server": "r", "retryable": True}, error
                assert "stopped answering (no answer to 2 pings" in error["message"], error
                assert 1.0 <= dead_after <= 3.5, f"declared dead after {dead_after:.1f} s"
                await ready_again(daemon, "r", pid, within=15)
                assert await client.call("echo", {"text": "back"}) == "back"
                assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
                log = [e.get("event") for e in daemon.log()]
                assert "server.down" in log and "server.restart_scheduled" in log
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
