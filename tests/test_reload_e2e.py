"""Reload and graceful shutdown on the real daemon, under load (issue #14,
items 2 and 5; docs/faults.md lists the cases).

Each test runs ``mcpbroker serve`` as a process with several raw clients
calling slow tools throughout, changes something (``mcpbroker reload``,
SIGHUP, SIGTERM) and asserts that every request from a live client got
exactly one response or error, that ``list_changed`` reached exactly the
sessions whose catalog changed, and that no server process was left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import attrs
import orjson
import psutil
import pytest
import trio

from tests.conftest import REPO
from tests.faultkit import Client, DaemonProcess, connect, id_key, running_daemon

TOOLS_CHANGED = "notifications/tools/list_changed"
CONNECTION_CLOSED, INVALID_PARAMS = -32000, -32602


def demo(name: str = "demo") -> dict[str, Any]:
    """The demo server, telling its name (serverInfo) from its environment."""
    return {
        "command": sys.executable,
        "args": ["-m", "tools.demo_server"],
        "cwd": str(REPO),
        "env": {"MCPBROKER_DEMO_NAME": name},
    }


def slow(seconds: float) -> dict[str, Any]:
    return {"seconds": seconds, "steps": 2}


@attrs.define
class Load:
    """Workers calling tools on their clients until stopped; every id they sent is kept."""

    sent: list[tuple[Client, Any]] = attrs.Factory(list)
    stopping: bool = False

    async def worker(self, client: Client, tools: list[str], seconds: float = 0.2) -> None:
        turn = 0
        while not self.stopping and not client.eof:
            tool = tools[turn % len(tools)]
            turn += 1
            id = client.new_id()
            self.sent.append((client, id))
            params = {"name": tool, "arguments": slow(seconds)}
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await client.send(
                    {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}
                )
            answer = await client.response(id, within=20)
            if "error" in answer:
                if "the daemon is stopping" in answer["error"]["message"]:
                    return  # (what it sends from now on would not be read)
                await trio.sleep(0.05)

    async def check(self, *, within: float = 20) -> dict[str, int]:
        """Every request sent got exactly one answer; counts results and errors."""
        self.stopping = True
        for client, id in self.sent:
            await client.response(id, within=within)
        await trio.sleep(0.5)  # (a second answer would have come by now)
        counts = {"results": 0, "errors": 0}
        for client, id in self.sent:
            answers = client.responses[id_key(id)]
            assert len(answers) == 1, f"id {id}: {answers}"
            counts["results" if "result" in answers[0] else "errors"] += 1
        return counts


@contextlib.asynccontextmanager
async def under_load(load: Load, *work: tuple[Client, list[str]]) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        for client, tools in work:
            for _ in range(3):  # three calls in flight per client
                nursery.start_soon(load.worker, client, tools)
        await trio.sleep(0.5)
        yield
        load.stopping = True


def server_pids(status: dict[str, Any]) -> dict[str, int]:
    return {s["name"]: s["pid"] for s in status["servers"]}


async def gone(pids: list[int], *, within: float = 10) -> None:
    """Each process has exited (and was reaped)."""
    with trio.move_on_after(within):
        while any(_running(pid) for pid in pids):
            await trio.sleep(0.05)
        return
    raise AssertionError(f"still running: {[pid for pid in pids if _running(pid)]}")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def all_ready(daemon: DaemonProcess, names: list[str], *, within: float = 15) -> None:
    with trio.move_on_after(within):
        while True:
            status = await daemon.status()
            if [s["name"] for s in status["servers"]] == names and all(
                s["status"] == "ready" for s in status["servers"]
            ):
                return
            await trio.sleep(0.05)
    raise AssertionError(f"servers never became {names}: {await daemon.status()}")


async def test_a_reload_adds_removes_and_restarts_servers_under_load() -> None:
    """keep stays, gone goes, changed changes (its env), new comes; four sessions:
    every server (aggregated), transparent on keep, a named view of keep and
    changed, transparent on gone."""
    with trio.fail_after(90):
        servers = {"keep": demo("keep"), "gone": demo("gone"), "changed": demo("changed")}
        # (the call in flight on gone outlasts `mcpbroker reload` starting on a busy machine)
        async with running_daemon(servers, {"shutdownTimeout": 10}) as daemon:
            before = server_pids(await daemon.status())
            load = Load()
            async with (
                connect(daemon) as every,
                connect(daemon, ["keep"]) as one,
                connect(daemon, ["keep", "changed"]) as named,
                connect(daemon, ["gone"]) as doomed,
            ):
                aggregated = ["keep__slow", "changed__slow", "gone__slow"]
                work = [
                    (every, aggregated),
                    (one, ["slow"]),
                    (named, ["keep__slow", "changed__slow"]),
                ]
                async with under_load(load, *work):
                    # A call in flight on the server about to go: it is answered.
                    last_call = doomed.new_id()
                    params = {"name": "slow", "arguments": slow(6)}
                    await doomed.send(
                        {
                            "jsonrpc": "2.0",
                            "id": last_call,
                            "method": "tools/call",
                            "params": params,
                        }
                    )
                    with trio.fail_after(
                        10
                    ):  # (in flight before the reload, on a busy machine too)
                        while not (await daemon.server("gone"))["in_flight"]:
                            await trio.sleep(0.02)
                    daemon.write_config(
                        {"keep": demo("keep"), "changed": demo("changed-2"), "new": demo("new")},
                        {"shutdownTimeout": 10},  # (the new file's holds for this reload's wait)
                    )
                    reload = await daemon.reload()
                    assert reload.returncode == 0, reload.stderr
                    said = reload.stdout.decode()
                    assert "servers started: new" in said, said
                    assert "stopped (after their requests in flight): gone" in said, said
                    assert "restarted (after their requests in flight): changed" in said, said
                    # New requests of the session whose server went are refused at once.
                    refused = await doomed.request(
                        "tools/call", {"name": "echo", "arguments": {"text": "x"}}
                    )
                    assert refused["error"]["code"] == CONNECTION_CLOSED, refused
                    assert (
                        "'gone' was removed from the configuration" in refused["error"]["message"]
                    )
                    answer = await doomed.response(last_call, within=15)
                    assert "result" in answer, answer
                    assert answer["result"]["content"][0]["text"] == "done after 2 steps", answer
                    await doomed.wait_until(
                        lambda: doomed.eof, 5, "the session on gone was not closed"
                    )
                    last = doomed.notifications("notifications/message")[-1]["params"]
                    assert "'gone' was removed from the configuration" in last["data"], last
                    await all_ready(daemon, ["keep", "changed", "new"])
                    # The session that sees every server sees the new one.
                    await every.wait_until(
                        lambda: bool(every.notifications(TOOLS_CHANGED)), 10, "no list_changed"
                    )
                    tools = {
                        t["name"] for t in (await every.request("tools/list"))["result"]["tools"]
                    }
                    assert {"new__echo", "keep__echo", "changed__echo"} <= tools, tools
                    assert not any(name.startswith("gone__") for name in tools), tools
                    assert await every.call("new__echo", {"text": "hi"}) == "hi"
                    await trio.sleep(1)  # (a list_changed for the restart would have come)
                counts = await load.check()
                assert counts["results"] > 20, counts
                # Who was told: only the session whose catalog changed.
                assert not one.notifications(TOOLS_CHANGED), one.messages[-3:]
                assert not named.notifications(TOOLS_CHANGED), named.messages[-3:]
                assert not any("list_changed" in str(m.get("method")) for m in one.messages)
                assert not any("list_changed" in str(m.get("method")) for m in named.messages)
                # A call of the restarted server reaches the new process.
                assert await named.call("changed__echo", {"text": "again"}) == "again"
                after = server_pids(await daemon.status())
                assert after["keep"] == before["keep"]
                assert after["changed"] != before["changed"]
                await gone([before["gone"], before["changed"]])
                tools = {t["name"] for t in (await named.request("tools/list"))["result"]["tools"]}
                assert tools == {f"{s}__{t}" for s in ("keep", "changed") for t in _demo_tools()}


def _demo_tools() -> set[str]:
    from tools.demo_server import TOOLS

    return set(TOOLS)


async def test_a_bad_config_is_refused_and_the_old_one_goes_on_serving() -> None:
    with trio.fail_after(60):
        async with running_daemon({"demo": demo()}) as daemon:
            pid = server_pids(await daemon.status())["demo"]
            async with connect(daemon, ["demo"]) as client:
                for text, reason in (
                    ("{not json", "is not valid JSON"),
                    ('{"mcpServers": {"demo": {"args": []}}}', 'needs exactly one of "command"'),
                    ('{"servers": {"demo": {"command": "x"}}}', "VS Code"),
                ):
                    with open(daemon.config_path, "w") as file:
                        file.write(text)
                    reload = await daemon.reload()
                    assert reload.returncode == 1, reload
                    assert reason in reload.stderr.decode(), reload.stderr
                    assert "unchanged" in reload.stderr.decode()
                    assert await client.call("echo", {"text": "still"}) == "still"
                    assert server_pids(await daemon.status()) == {"demo": pid}
                # Unknown keys are applied around, and said.
                with open(daemon.config_path, "w") as file:
                    file.write(_json({"mcpServers": {"demo": demo()}, "extra": 1}))
                reload = await daemon.reload()
                assert reload.returncode == 0, reload.stderr
                assert "unknown top-level key 'extra' ignored" in reload.stderr.decode()
                assert reload.stdout.decode().strip() == "no change"
                # A setting that needs a new daemon is said not to be applied.
                daemon.write_config(
                    {"demo": demo()}, {"maxMessageBytes": 2048, "requestTimeout": 60}
                )
                reload = await daemon.reload()
                assert reload.returncode == 0, reload.stderr
                said = reload.stdout.decode()
                assert "settings applied: broker.requestTimeout" in said, said
                assert "need a restart of the daemon: broker.maxMessageBytes" in said, said
                assert await client.call("echo", {"text": "x" * 4000}) == "x" * 4000
                assert daemon.alive()


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


async def test_sighup_does_what_reload_does() -> None:
    with trio.fail_after(60):
        async with running_daemon({"a": demo("a"), "b": demo("b")}) as daemon:
            pids = server_pids(await daemon.status())
            load = Load()
            async with connect(daemon) as every, connect(daemon, ["a"]) as one:
                async with under_load(load, (every, ["a__slow", "b__slow"]), (one, ["slow"])):
                    daemon.write_config({"a": demo("a"), "c": demo("c")})
                    daemon.process.send_signal(signal.SIGHUP)
                    await all_ready(daemon, ["a", "c"])
                    await every.wait_until(
                        lambda: bool(every.notifications(TOOLS_CHANGED)), 10, "no list_changed"
                    )
                    assert await every.call("c__echo", {"text": "c"}) == "c"
                await load.check()
                assert not one.notifications(TOOLS_CHANGED)
                await gone([pids["b"]])
            log = daemon.log()
            reloaded = [e for e in log if e.get("event") == "daemon.reloaded"]
            assert reloaded and reloaded[0]["added"] == ["c"] and reloaded[0]["removed"] == ["b"]
            # A bad file on SIGHUP: refused, logged, the daemon serves on.
            with open(daemon.config_path, "w") as file:
                file.write("{")
            daemon.process.send_signal(signal.SIGHUP)
            with trio.move_on_after(10):
                while not any(e.get("event") == "config.reload_refused" for e in daemon.log()):
                    await trio.sleep(0.05)
            refused = [e for e in daemon.log() if e.get("event") == "config.reload_refused"]
            assert refused and "not valid JSON" in refused[0]["error"], refused
            assert [s["name"] for s in (await daemon.status())["servers"]] == ["a", "c"]


async def test_sigterm_drains_then_stops_everything() -> None:
    """Calls of 0.3 s throughout, and one of 60 s: on SIGTERM the short ones
    finish, the long one gets an error naming the shutdown after
    broker.shutdownTimeout (2 s); new requests are refused; exit code 0, no
    server left, socket removed."""
    with trio.fail_after(60):
        servers = {"a": demo("a"), "b": demo("b")}
        async with running_daemon(servers, {"shutdownTimeout": 2}) as daemon:
            children = daemon.ps.children(recursive=True)
            assert len(children) == 2
            load = Load()
            async with (
                connect(daemon) as every,
                connect(daemon, ["a"]) as one,
                connect(daemon, ["b"]) as late,
            ):
                long_call = every.new_id()
                params = {"name": "b__slow", "arguments": slow(60)}
                await every.send(
                    {"jsonrpc": "2.0", "id": long_call, "method": "tools/call", "params": params}
                )
                async with under_load(load, (every, ["a__slow", "b__slow"]), (one, ["slow"])):
                    stopped_at = trio.current_time()
                    daemon.process.send_signal(signal.SIGTERM)
                    await trio.sleep(0.5)
                    refused = await late.request(
                        "tools/call", {"name": "echo", "arguments": {"text": "x"}}
                    )
                    assert refused["error"]["code"] == CONNECTION_CLOSED, refused
                    assert "the daemon is stopping" in refused["error"]["message"]
                    answer = await every.response(long_call, within=10)
                    waited = trio.current_time() - stopped_at
                    assert answer["error"]["code"] == CONNECTION_CLOSED, answer
                    assert "the daemon is stopping" in answer["error"]["message"], answer
                    assert "shutdownTimeout" in answer["error"]["message"], answer
                    assert 1.5 < waited < 6, waited
                counts = await load.check()
                assert counts["results"] >= 6, counts
                for client in (every, one, late):
                    await client.wait_until(lambda c=client: c.eof, 10, "the session stayed open")
                    last = client.notifications("notifications/message")[-1]["params"]
                    assert last["level"] == "error", last
                    assert last["data"] == "mcpbroker: the daemon is stopping", last
            with trio.fail_after(15):
                code = await daemon.process.wait()
            assert code == 0
            assert not os.path.exists(daemon.socket_path)
            await gone([child.pid for child in children], within=1)
            # Every answer that was an error says why.
            for client, id in load.sent:
                answer = client.responses[id_key(id)][0]
                if "error" in answer:
                    assert "the daemon is stopping" in answer["error"]["message"], answer


async def test_serve_prints_the_warnings_and_connect_fails_loudly_on_a_vs_code_file(
    tmp_path: Any,
) -> None:
    import json

    from tests.faultkit import ENV, MCPBROKER

    with trio.fail_after(30):
        config = tmp_path / "c.json"
        config.write_text(json.dumps({"mcpServers": {"demo": demo()}, "autoStart": True}))
        socket_path = str(tmp_path / "s.sock")
        serve = await trio.lowlevel.open_process(
            [MCPBROKER, "serve", "--config", str(config), "--socket", socket_path],
            env=ENV,
            stderr=-1,  # (a pipe)
        )
        try:
            assert serve.stderr is not None
            first = await serve.stderr.receive_some()
            assert b"mcpbroker: warning: unknown top-level key 'autoStart' ignored" in first
        finally:
            serve.terminate()
            await serve.wait()
        # A host's VS Code file given to the shim: the daemon it starts refuses it,
        # and the shim says why instead of serving nothing.
        vscode = tmp_path / "mcp.json"
        vscode.write_text(json.dumps({"servers": {"demo": {"type": "stdio", **demo()}}}))
        shim = await trio.run_process(
            [MCPBROKER, "connect", "--socket", str(tmp_path / "t.sock"), "--config", str(vscode)],
            env=ENV,
            stdin=b"",
            capture_stderr=True,
            check=False,
        )
        assert shim.returncode == 1
        said = shim.stderr.decode()
        assert "the daemon failed to start" in said, said
        assert "VS Code" in said and '"mcpServers"' in said, said


async def test_a_reload_reaches_websocket_sessions(socket_path: str) -> None:
    """/mcp sees a new server, /mcp/NAME of a removed one is refused then closed,
    /mcp/NEW opens: the listener's names follow the reload."""
    import trio_websocket

    from broker.config import parse_config
    from tests.conftest import running_daemon as daemon_in_process
    from tests.test_websocket_e2e import text, ws_client

    broker = {"websocket": "127.0.0.1:0"}
    with trio.fail_after(60):
        async with daemon_in_process(
            {"a": demo("a"), "b": demo("b")}, socket_path, broker=broker
        ) as d:
            assert d.websocket_url is not None
            async with (
                ws_client(d.websocket_url) as every,
                ws_client(d.websocket_url + "/b") as on_b,
            ):
                await every.initialize()
                await on_b.initialize()
                with pytest.raises(trio_websocket.HandshakeError):
                    async with ws_client(d.websocket_url + "/c"):
                        pass
                d.reload(
                    parse_config({"mcpServers": {"a": demo("a"), "c": demo("c")}, "broker": broker})
                )
                # Nothing in flight on b: its session is closed at once (a request
                # it sends meanwhile is refused; tests above cover that).
                with pytest.raises(trio_websocket.ConnectionClosed):
                    with trio.fail_after(10):
                        while True:
                            answer = orjson.loads(await on_b.ws.get_message())
                            assert "result" not in answer, answer
                await d.upstreams["c"].wait_ready()
                with trio.fail_after(10):
                    while not any(m.get("method") == TOOLS_CHANGED for m in every.others):
                        every.others.append(orjson.loads(await every.ws.get_message()))
                assert text(await every.call("c__echo", text="hi")) == "hi"
                async with ws_client(d.websocket_url + "/c") as on_c:
                    await on_c.initialize()
                    assert text(await on_c.call("echo", text="c")) == "c"


async def test_a_reload_reaches_http_sessions(socket_path: str) -> None:
    """An HTTP session on /mcp sees a server a reload adds, as a WebSocket
    one does (both are views of every server), and /mcp/NEW opens."""
    from broker.config import parse_config
    from tests.conftest import running_daemon as daemon_in_process
    from tests.conftest import text_of
    from tests.test_http_e2e import http_session

    broker = {"http": "127.0.0.1:0"}
    with trio.fail_after(60):
        async with daemon_in_process({"a": demo("a")}, socket_path, broker=broker) as d:
            assert d.http_url is not None
            async with http_session(d.http_url) as every:
                assert [
                    t.name for t in (await every.list_tools()).tools if t.name.startswith("c__")
                ] == []
                d.reload(
                    parse_config({"mcpServers": {"a": demo("a"), "c": demo("c")}, "broker": broker})
                )
                await d.upstreams["c"].wait_ready()
                with trio.fail_after(10):
                    while "c__echo" not in {t.name for t in (await every.list_tools()).tools}:
                        await trio.sleep(0.05)
                assert text_of(await every.call_tool("c__echo", {"text": "hi"})) == "hi"
                async with http_session(d.http_url + "/c") as on_c:
                    assert text_of(await on_c.call_tool("echo", {"text": "c"})) == "c"


async def test_a_shim_whose_server_a_reload_removes_ends_and_a_new_one_works_once_it_is_back() -> (
    None
):
    """The daemon closes a transparent session on a removed server; the
    resuming shim took that for a restart, was refused ("unknown server")
    when it replayed the session, and relayed the refusing session for good,
    even once the server was back: the host never saw its server end.
    Now the shim ends (exit 1, the refusal on stderr), and a shim started
    again once the server is configured again is served. (Found by probing.)"""
    from tests.conftest import MCPBROKER

    def line(message: dict[str, Any]) -> bytes:
        return orjson.dumps({"jsonrpc": "2.0", **message}) + b"\n"

    initialize = line(
        {
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "host", "version": "1"},
            },
        }
    )
    initialized = line({"method": "notifications/initialized"})
    call = line(
        {"id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hi"}}}
    )

    async def host(daemon: DaemonProcess) -> trio.Process:
        shim = await trio.lowlevel.open_process(
            [MCPBROKER, "connect", "--socket", daemon.socket_path, "a"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert shim.stdin is not None
        await shim.stdin.send_all(initialize + initialized + call)
        return shim

    async def read_all(stream: Any) -> bytes:
        out = b""
        while chunk := await stream.receive_some():
            out += chunk
        return out

    async def until(stream: Any, wanted: bytes) -> bytes:
        out = b""
        while wanted not in out:
            chunk = await stream.receive_some()
            assert chunk, out
            out += chunk
        return out

    with trio.fail_after(60):
        async with running_daemon({"a": demo("a"), "b": demo("b")}) as daemon:
            shim = await host(daemon)
            assert shim.stdout is not None and shim.stderr is not None
            await until(shim.stdout, b'"id":1')
            daemon.write_config({"b": demo("b")})
            assert (await daemon.reload()).returncode == 0
            with trio.fail_after(15):
                await read_all(shim.stdout)  # the host sees its server end
            assert await shim.wait() == 1
            said = (await read_all(shim.stderr)).decode()
            assert "the daemon refused the session (mcpbroker: unknown server 'a'" in said, said
            assert "reconnected" not in said
            daemon.write_config({"a": demo("a"), "b": demo("b")})
            assert (await daemon.reload()).returncode == 0
            await all_ready(daemon, ["a", "b"])
            again = await host(daemon)
            assert again.stdout is not None and again.stdin is not None
            out = await until(again.stdout, b'"id":1')
            (answer,) = [orjson.loads(x) for x in out.splitlines() if b'"id":1' in x]
            assert answer["result"]["content"][0]["text"] == "hi", answer
            await again.stdin.aclose()
            assert await again.wait() == 0
