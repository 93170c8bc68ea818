"""Fault injection, the servers' side (issue #10): nothing a server sends, or
fails to read, can take down, wedge or bloat the daemon or its other sessions.

Same invariants as tests/test_faults_e2e.py: exactly one answer per request of
a live client, the daemon lives, its RSS and descriptors come back, and a
bystander on the healthy demo server sees no error and no call over 1 s. The
misbehaving servers are tests/servers/misbehaving.py; docs/faults.md lists
the cases.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from tests.conftest import demo_server
from tests.faultkit import (
    MB,
    Client,
    bystander,
    connect,
    id_key,
    misbehaving,
    running_daemon,
)

TIMEOUT, QUEUE_FULL, INTERNAL_ERROR = -32001, -32005, -32603


async def test_a_deeply_nested_notification_from_a_server_is_dropped() -> None:
    with trio.fail_after(30):
        servers = {"m": misbehaving("deep-notification", 600), "demo": demo_server()}
        async with running_daemon(servers) as daemon, bystander(daemon) as watcher:
            before = daemon.usage()
            pid = (await daemon.server("m"))["pid"]
            async with connect(daemon, ["m"]) as one, connect(daemon) as other:
                assert await one.call("misbehave") == "done"
                for client, echo in ((one, "echo"), (other, "m__echo")):
                    await client.wait_until(lambda c=client: _got_after(c), 5, "no later message")
                    assert await client.call(echo, {"text": "still"}) == "still"
                    assert not client.eof
            assert (await daemon.server("m"))["pid"] == pid, "the server was restarted"
            await daemon.recovers(before)
        watcher.check()


def _got_after(client: Client) -> bool:
    """The shallow message the server sent right after the deep one arrived."""
    messages = client.notifications("notifications/message")
    return any(m["params"].get("data") == "after" for m in messages)


async def test_a_tool_with_a_deeply_nested_schema_is_left_out_of_the_catalog() -> None:
    with trio.fail_after(30):
        servers = {"m": misbehaving("deep-schema", 600), "demo": demo_server()}
        async with running_daemon(servers) as daemon, bystander(daemon) as watcher:
            before = daemon.usage()
            for view, prefix in ((None, "m__"), (["m"], ""), (None, "m__")):
                async with connect(daemon, view) as client:
                    response = await client.request("tools/list")
                    assert "result" in response, response
                    names = {tool["name"] for tool in response["result"]["tools"]}
                    assert f"{prefix}echo" in names and f"{prefix}pid" in names, names
                    assert f"{prefix}deep" not in names
                    assert await client.call(f"{prefix}echo", {"text": "x"}) == "x"
            await daemon.recovers(before)
        watcher.check()


async def test_a_server_that_stops_reading_wedges_nobody() -> None:
    """400 requests of 100 kB pipelined to a deaf server (timeout 3 s): each gets one
    error, soon; meanwhile the same session's other server and a new session answer."""
    with trio.fail_after(40):
        servers = {"deaf": misbehaving("deaf", timeout=3), "demo": demo_server()}
        async with running_daemon(servers) as daemon, bystander(daemon) as watcher:
            before = daemon.usage()
            async with connect(daemon) as client, trio.open_nursery() as nursery:
                burst = Burst(client)
                started = trio.current_time()
                nursery.start_soon(burst.write)
                await burst.underway.wait()
                await _newcomer_gets_its_tools(daemon, within=2)
                with trio.move_on_after(2.5):
                    await burst.written.wait()
                assert burst.written.is_set(), f"the daemon stopped reading: {burst.sent} sent"
                answer = await client.response("demo", within=1)
                assert answer["result"]["content"][0]["text"] == "meanwhile", answer
                await burst.all_answered(within=started + 3 + 4 - trio.current_time())
            await daemon.recovers(before)
        watcher.check()


class Burst:
    """400 pipelined calls of 100 kB to deaf__echo, then one to demo__echo (id "demo")."""

    count = 400

    def __init__(self, client: Client) -> None:
        self.client = client
        self.sent = 0
        self.underway = trio.Event()  # 50 sent
        self.written = trio.Event()  # all sent, the demo call too

    async def write(self) -> None:
        text = "x" * 100_000
        for first in range(0, self.count, 10):
            ids = range(first, first + 10)
            await self.client.send(*[_call(f"burst-{i}", "deaf__echo", text) for i in ids])
            self.sent += 10
            if self.sent >= 50:
                self.underway.set()
        await self.client.send(_call("demo", "demo__echo", "meanwhile"))
        self.written.set()

    async def all_answered(self, *, within: float) -> None:
        responses = self.client.responses
        keys = [id_key(f"burst-{i}") for i in range(self.count)]
        await self.client.wait_until(
            lambda: all(responses[key] for key in keys),
            max(within, 0),
            lambda: f"{sum(1 for key in keys if responses[key])} answers of 400",
        )
        for key in keys:
            answers = responses[key]
            assert len(answers) == 1, answers
            assert answers[0].get("error", {}).get("code") in (TIMEOUT, QUEUE_FULL), answers[0]


def _call(id: Any, tool: str, text: str) -> dict[str, Any]:
    params = {"name": tool, "arguments": {"text": text}}
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}


async def _newcomer_gets_its_tools(daemon: Any, *, within: float) -> None:
    """A new session (aggregated: the deaf server too) initializes and lists its tools."""
    started = trio.current_time()
    async with connect(daemon) as newcomer:
        response = await newcomer.request("tools/list", within=within)
        names = {tool["name"] for tool in response["result"]["tools"]}
        assert {"deaf__echo", "demo__echo"} <= names, names
    took = trio.current_time() - started
    assert took < within, f"a new session took {took:.1f} s to initialize and list its tools"


async def test_an_answer_over_max_message_bytes_is_an_error_at_once() -> None:
    with trio.fail_after(30):
        servers = {"bigmouth": misbehaving(), "demo": demo_server()}
        async with (
            running_daemon(servers, {"maxMessageBytes": MB}) as daemon,
            bystander(daemon) as watcher,
        ):
            before = daemon.usage()
            async with connect(daemon, ["bigmouth"]) as client:
                call = {"name": "payload", "arguments": {"size": 2 * MB}}
                response = await client.request("tools/call", call, within=2)
                error = response.get("error", {})
                assert error.get("code") == INTERNAL_ERROR, response
                assert "bigmouth" in error["message"], error
                assert "maxMessageBytes" in error["message"], error
                data = error.get("data", {})
                assert {"server": "bigmouth", "limit": MB}.items() <= data.items(), error
                assert await client.call("echo", {"text": "next"}) == "next"
            await daemon.recovers(before)
        watcher.check()


async def test_a_burst_of_list_changed_is_absorbed() -> None:
    """3,000 tools/list_changed in one write: no restart, no TypeError, one refresh seen."""
    with trio.fail_after(30):
        servers = {"m": misbehaving("list-changed-burst", 3000), "demo": demo_server()}
        async with running_daemon(servers) as daemon, bystander(daemon) as watcher:
            before = daemon.usage()
            server = await daemon.server("m")
            async with connect(daemon, ["m"]) as one, connect(daemon) as other:
                assert await one.call("misbehave") == "done"
                for client, prefix in ((one, ""), (other, "m__")):
                    await client.wait_until(
                        lambda c=client: bool(c.notifications("notifications/tools/list_changed")),
                        10,
                        "no notifications/tools/list_changed",
                    )
                    response = await client.request("tools/list")
                    assert f"{prefix}extra" in {t["name"] for t in response["result"]["tools"]}
                    assert await client.call(f"{prefix}echo", {"text": "ok"}) == "ok"
            after = await daemon.server("m")
            assert (after["pid"], after["restarts"]) == (server["pid"], server["restarts"]), after
            assert b"TypeError" not in Path(daemon.log_path).read_bytes()
            await daemon.recovers(before)
        watcher.check()


async def test_a_server_flooding_its_stderr_slows_nobody() -> None:
    """50 MB of stderr, as fast as the pipe takes it: the bystander's p50 stays under 50 ms."""
    with trio.fail_after(60):
        servers = {"m": misbehaving("stderr-flood", 50_000_000), "demo": demo_server()}
        async with running_daemon(servers) as daemon, bystander(daemon) as watcher:
            before = daemon.usage()
            async with connect(daemon, ["m"]) as client:
                calls = len(watcher.latencies)
                assert await client.call("misbehave", within=40) == "done"
                during = watcher.latencies[calls:]
            await daemon.recovers(before)
        watcher.check(since=calls, p50=0.05)
        assert len(during) >= 3, f"only {len(during)} bystander calls during the flood"
