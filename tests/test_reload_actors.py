"""Reload and shutdown at the actors' level (issue #14, items 2 and 5): the
daemon's tree without sockets or processes, over scripted servers, on
``autojump_clock`` (so ``broker.shutdownTimeout`` takes no time).

The end-to-end side, under load with real processes, is tests/test_reload_e2e.py.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.testing

import actors.upstream
from actors.daemon import Daemon
from actors.mailbox import SessionHandle
from actors.server_actor import Attach, ClientRequest, Detach, UpstreamStatistics
from actors.sharing import EraServer
from broker import jsonrpc
from broker.config import Config, parse_config
from broker.eras.versions import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY
from broker.states import ServerState
from broker.wire import ndjson
from broker.wire.envelope import Answer
from broker.wire.ndjson import LineFramer
from tests.scripted import ScriptedServer

TOOLS_CHANGED = "notifications/tools/list_changed"


class Scripts(dict[str, ScriptedServer]):
    """Scripted servers by the ``command`` that names them in a config."""

    def config(self, *names: str, broker: dict[str, Any] | None = None, **commands: str) -> Config:
        """Servers ``names``, each started by the script of the same name unless
        ``commands`` says another."""
        servers = {name: {"command": commands.get(name, name)} for name in names}
        return parse_config({"mcpServers": servers, "broker": broker or {}})


@pytest.fixture
def scripts(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> Scripts:
    found = Scripts()

    def launcher_for(config: Any, name: str = "") -> Any:
        if config.command not in found:
            found[config.command] = ScriptedServer(nursery, label=config.command)
        return found[config.command].launch

    monkeypatch.setattr(actors.upstream, "launcher_for", launcher_for)
    return found


class Client:
    """A raw client of the daemon over a memory stream: everything it got is kept."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.messages: list[Any] = []
        self.closed = False
        self._framer = LineFramer(1 << 30)
        self._arrived = trio.Event()

    async def read_forever(self) -> None:
        while data := await self.stream.receive_some():
            self.messages.extend(jsonrpc.decode(line) for line in self._framer.feed(data))
            self._arrived.set()
            self._arrived = trio.Event()
        self.closed = True
        self._arrived.set()

    async def send(self, message: Any) -> None:
        await self.stream.send_all(ndjson.encode(message))

    async def call(self, id: Any, tool: str, **arguments: Any) -> None:
        params = {"name": tool, "arguments": arguments}
        await self.send({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})

    def answers(self, id: Any) -> list[Any]:
        return [m for m in self.messages if m.get("id") == id and "method" not in m]

    async def answer(self, id: Any) -> Any:
        while not self.answers(id):
            assert not self.closed, f"closed without an answer to {id}"
            await self._arrived.wait()
        return self.answers(id)[0]

    async def request(self, id: Any, method: str, params: Any = None) -> Any:
        await self.send({"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}})
        return await self.answer(id)

    def told(self) -> list[str]:
        return [m["method"] for m in self.messages if "list_changed" in m.get("method", "")]


async def start(nursery: trio.Nursery, config: Config) -> Daemon:
    daemon = Daemon(config, "unused.sock")
    await daemon.start_servers(nursery)
    for upstream in daemon.upstreams.values():
        await upstream.wait_ready()
    return daemon


async def connect(
    nursery: trio.Nursery,
    daemon: Daemon,
    servers: list[str] | None = None,
    capabilities: dict[str, Any] | None = None,
) -> Client:
    ours, theirs = trio.testing.memory_stream_pair()
    nursery.start_soon(daemon._serve_client, theirs)
    client = Client(ours)
    nursery.start_soon(client.read_forever)
    if servers is not None:
        await client.send({"mcpbroker": {"servers": servers}})
    params = {
        "protocolVersion": "2025-06-18",
        "capabilities": capabilities or {},
        "clientInfo": {"name": "t"},
    }
    assert "result" in await client.request("init", "initialize", params)
    await client.send(jsonrpc.notification("notifications/initialized"))
    await client.request("ping", "ping")  # (the session is attached once this is answered)
    return client


def said(client: Client) -> list[Any]:
    """The log messages the client got (the daemon's last word, when it closes it)."""
    return [
        m["params"]["data"] for m in client.messages if m.get("method") == "notifications/message"
    ]


async def settle() -> None:
    await trio.sleep(1)  # (autojump: every task is idle by then)


async def test_a_restart_lets_the_call_in_flight_finish_on_the_old_server(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    daemon = await start(nursery, scripts.config("a", "b", b="b1"))
    every = await connect(nursery, daemon)
    named = await connect(nursery, daemon, ["a", "b"])
    only_a = await connect(nursery, daemon, ["a"])
    await every.call(1, "b__sleep", seconds=3, who="old")
    await settle()
    report = daemon.reload(scripts.config("a", "b", b="b2"))
    assert report.restarted == ("b",) and not report.added and not report.removed
    await every.call(2, "b__echo", who="new")
    started = trio.current_time()
    assert (await every.answer(1))["result"]["server"] == "b1"
    assert trio.current_time() - started == pytest.approx(2)  # (3 s, 1 s of which had passed)
    assert (await every.answer(2))["result"]["server"] == "b2"
    await settle()
    assert scripts["b1"].links[-1].exited.is_set()  # the old server was stopped
    # Its tools and prompts are the same, its resources not (the script names
    # them by its label): who sees it is told of those alone, nobody else at all.
    assert every.told() == named.told() == ["notifications/resources/list_changed"]
    assert only_a.told() == []


@pytest.mark.parametrize("sharing", [{}, {"pool": 2}])
async def test_a_call_cut_by_a_reload_restart_may_be_sent_again(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any, sharing: dict[str, Any]
) -> None:
    """A restarted server is back: what the reload cut is retryable (only a
    removed server's calls are not)."""

    def config(command: str) -> Config:
        servers = {"a": {"command": "a"}, "b": {"command": command, **sharing}}
        return parse_config({"mcpServers": servers, "broker": {"shutdownTimeout": 1}})

    daemon = await start(nursery, config("b1"))
    every = await connect(nursery, daemon)
    await every.call(1, "b__sleep", seconds=60, who="old")
    await settle()
    daemon.reload(config("b2"))
    error = (await every.answer(1))["error"]
    assert error["message"] == "MCP server 'b' was restarted by a reload of the configuration"
    assert error["data"] == {"server": "b", "retryable": True}


@pytest.mark.parametrize("sharing", [{}, {"pool": 2}, {"share": "per-session"}])
async def test_calls_waiting_for_a_start_a_reload_restarts_go_to_the_new_process(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any, sharing: dict[str, Any]
) -> None:
    """A reload restarts ``b`` while it is starting (its handshake takes 30 s):
    the calls waiting for it never reached a process, so the new one gets
    them, in the order they came, not an error."""

    def config(command: str) -> Config:
        servers = {"a": {"command": "a"}, "b": {"command": command, **sharing}}
        return parse_config({"mcpServers": servers, "broker": {"shutdownTimeout": 5}})

    daemon = await start(nursery, config("b1"))
    every = await connect(nursery, daemon)
    scripts["b2"] = ScriptedServer(nursery, label="b2", initialize_delay=30)
    daemon.reload(config("b2"))
    for id in (1, 2, 3):
        await every.call(id, "b__echo", n=id)
    await settle()
    started = trio.current_time()
    daemon.reload(config("b3"))
    for id in (1, 2, 3):
        assert (await every.answer(id))["result"]["server"] == "b3"
    assert trio.current_time() - started < 5
    calls = scripts["b3"].requests("tools/call")
    assert [call["params"]["arguments"]["n"] for call in calls] == [1, 2, 3]
    assert not scripts["b2"].requests("tools/call")


@pytest.mark.parametrize("then", ["waits", "cancels", "leaves"])
async def test_a_call_waiting_for_a_start_a_reload_restarts_goes_with_its_session(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any, then: str
) -> None:
    """Per-session ``b`` (handshakes take 20 s, then 8 s): A's call runs on
    A's instance, so the old group drains for all of shutdownTimeout (15 s);
    B's waits for B's instance to start when a reload restarts ``b``. B's
    call goes to the new process when it is ready, not when the drain ends;
    B's cancellation, or B's leaving, after the reload reaches it there: it
    is never sent, and no instance is started for B once B has left."""

    def config(command: str) -> Config:
        servers = {"a": {"command": "a"}, "b": {"command": command, "share": "per-session"}}
        return parse_config({"mcpServers": servers, "broker": {"shutdownTimeout": 15}})

    scripts["b1"] = ScriptedServer(nursery, label="b1", initialize_delay=20)
    scripts["b3"] = ScriptedServer(nursery, label="b3", initialize_delay=8)
    daemon = await start(nursery, config("b1"))
    a, b = await connect(nursery, daemon), await connect(nursery, daemon)
    await a.call(1, "b__sleep", seconds=100)
    await trio.sleep(21)  # (A's instance is ready, its call in flight)
    await b.call(7, "b__echo", n=7)  # (B's instance starts: the call waits)
    await trio.sleep(1)
    reloaded = trio.current_time()
    daemon.reload(config("b3"))
    await trio.sleep(1)
    if then == "waits":
        assert (await b.answer(7))["result"]["server"] == "b3"
        assert trio.current_time() - reloaded < 12  # (the drain ends at 15)
    elif then == "cancels":
        await b.send(jsonrpc.notification("notifications/cancelled", {"requestId": 7}))
    else:
        await b.stream.send_stream.aclose()
    await trio.sleep(40)
    calls = [
        (script, call["params"]["arguments"]["n"])
        for script in ("b1", "b3")
        for call in scripts[script].requests("tools/call")
        if "n" in call["params"]["arguments"]
    ]
    assert calls == ([("b3", 7)] if then == "waits" else [])
    if then == "leaves":
        assert not daemon.upstreams["b"]._mine  # type: ignore[attr-defined]


@pytest.mark.parametrize("then", ["restarts", "re-adds"])
async def test_a_server_a_reload_starts_over_is_waited_for_again(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any, then: str
) -> None:
    """A session waited 10 s in vain for ``b`` (b2's handshake never ends in
    time), so it waits for it no more; a reload then restarts ``b`` (or
    removes it and adds it back) with b3, which starts in 5 s: the session's
    next list waits for it and has its tools, as a new session's does. (It
    answered at once without them: the session never waited for ``b`` again,
    and kept the name of a removed server.) Found by probing."""
    scripts["b2"] = ScriptedServer(nursery, label="b2", initialize_delay=1000)
    scripts["b3"] = ScriptedServer(nursery, label="b3", initialize_delay=5)
    daemon = await start(nursery, scripts.config("a", "b", b="b1"))
    daemon.reload(scripts.config("a", "b", b="b2"))
    client = await connect(nursery, daemon)  # (its initialize waits 10 s for b, in vain)
    tools = await client.request(1, "tools/list")
    assert not [tool for tool in tools["result"]["tools"] if tool["name"].startswith("b__")]
    if then == "re-adds":
        daemon.reload(scripts.config("a"))
        await settle()
        sessions = daemon._sessions
        assert all(not session._protocol.waited_out for session in sessions)  # (none left)
    daemon.reload(scripts.config("a", "b", b="b3"))
    started = trio.current_time()
    tools = await client.request(2, "tools/list")
    assert trio.current_time() - started == pytest.approx(5, abs=0.5)
    assert [tool for tool in tools["result"]["tools"] if tool["name"].startswith("b__")]


@pytest.mark.parametrize("second", ["removes", "restarts"])
async def test_a_call_taken_over_by_an_instance_not_started_goes_on_with_a_second_reload(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any, second: str
) -> None:
    """Per-session ``b``: B's call waits for B's instance (its handshake takes
    20 s) when a reload restarts ``b``; the new group parks it in an
    instance of B's own, which starts only with the group. A second reload
    right then (before the group runs) finds it there all the same: it
    goes on to the next process, or is answered with the removal's error;
    no call is left unanswered."""

    def config(command: str | None) -> Config:
        servers: dict[str, Any] = {"a": {"command": "a"}}
        if command is not None:
            servers["b"] = {"command": command, "share": "per-session"}
        return parse_config({"mcpServers": servers, "broker": {"shutdownTimeout": 15}})

    scripts["b1"] = ScriptedServer(nursery, label="b1", initialize_delay=20)
    daemon = await start(nursery, config("b1"))
    b = await connect(nursery, daemon)
    await b.call(7, "b__echo", n=7)  # (B's instance starts: the call waits)
    await trio.sleep(1)
    daemon.reload(config("b3"))  # (B's call: in B's instance of the new group, not started)
    daemon.reload(config("b4" if second == "restarts" else None))
    with trio.fail_after(60):
        answer = await b.answer(7)
    if second == "restarts":
        assert answer["result"]["server"] == "b4"
    else:
        assert "removed" in answer["error"]["message"]
    await trio.sleep(30)
    assert not scripts.get("b3") or not scripts["b3"].requests("tools/call")


async def test_a_removed_server_answers_in_flight_then_is_gone(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """A call longer than broker.shutdownTimeout gets an error naming the server;
    the transparent session on it is refused, then closed; the others told."""
    daemon = await start(nursery, scripts.config("a", "b", broker={"shutdownTimeout": 2}))
    every = await connect(nursery, daemon)
    only_a = await connect(nursery, daemon, ["a"])
    only_b = await connect(nursery, daemon, ["b"])
    await only_b.call(1, "sleep", seconds=60)
    await only_b.call(2, "sleep", seconds=1)
    await every.call(1, "b__sleep", seconds=60)
    await settle()
    started = trio.current_time()
    report = daemon.reload(scripts.config("a", broker={"shutdownTimeout": 2}))
    assert report.removed == ("b",)
    refused = await only_b.request(3, "tools/list")
    assert refused["error"]["code"] == jsonrpc.CONNECTION_CLOSED
    assert (
        refused["error"]["message"]
        == "mcpbroker: MCP server 'b' was removed from the configuration"
    )
    assert refused["error"]["data"] == {"server": "b", "retryable": False}  # (as in flight)
    assert "result" in await only_b.answer(2)  # finished within the timeout
    for client in (only_b, every):
        error = (await client.answer(1))["error"]
        assert error["message"] == "MCP server 'b' was removed from the configuration", error
        assert error["data"] == {"server": "b", "retryable": False}  # (it is gone)
    assert trio.current_time() - started == pytest.approx(2)
    await settle()
    assert only_b.closed and not every.closed
    assert said(only_b) == ["mcpbroker: MCP server 'b' was removed from the configuration"]
    assert said(every) == []
    assert all(len(only_b.answers(id)) == 1 for id in (1, 2, 3))
    assert every.told() == [
        TOOLS_CHANGED,
        "notifications/prompts/list_changed",
        "notifications/resources/list_changed",
    ]
    assert only_a.told() == []
    tools = (await every.request(4, "tools/list"))["result"]["tools"]
    assert {tool["name"].split("__")[0] for tool in tools} == {"a"}


async def test_a_new_server_joins_the_views_of_every_server_only(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    daemon = await start(nursery, scripts.config("a", "b"))
    every = await connect(nursery, daemon)
    named = await connect(nursery, daemon, ["a", "b"])
    only_a = await connect(nursery, daemon, ["a"])
    report = daemon.reload(scripts.config("a", "b", "c"))
    assert report.added == ("c",)
    await settle()
    assert every.told() == [
        TOOLS_CHANGED,
        "notifications/prompts/list_changed",
        "notifications/resources/list_changed",
    ]
    assert named.told() == [] and only_a.told() == []
    answer = await every.request(1, "tools/call", {"name": "c__echo", "arguments": {"x": 1}})
    assert answer["result"]["server"] == "c"
    unknown = await named.request(2, "tools/call", {"name": "c__echo", "arguments": {}})
    assert unknown["error"]["code"] == jsonrpc.INVALID_PARAMS
    # The session attached to the new server: it hears the session's notifications.
    await every.send(jsonrpc.notification("notifications/roots/list_changed"))
    await settle()
    assert scripts["c"].requests("notifications/roots/list_changed")


async def test_a_server_a_reload_adds_takes_no_name_a_client_knows(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """``a``'s tool ``b__echo`` is ``a__b__echo``; a reload adds server ``a__b``
    (whose ``echo`` would be named so too) before ``a`` in the file: the name
    keeps reaching ``a``'s tool, and the newcomer's gets the suffix. The same
    after ``a`` is restarted. Names stay with their items: once ``a`` is
    removed, ``a__b__echo`` goes to no other item (``a__b``'s keeps its
    suffix), and ``a`` added again has it back, a clash with nothing."""
    scripts["a"] = ScriptedServer(nursery, label="a")
    scripts["a"].tools.append({"name": "b__echo", "inputSchema": {"type": "object"}})
    daemon = await start(nursery, scripts.config("a"))
    every = await connect(nursery, daemon)

    async def tool_of(id: int, name: str) -> tuple[str, str]:
        answer = await every.request(id, "tools/call", {"name": name, "arguments": {}})
        return answer["result"]["server"], answer["result"]["name"]

    async def suffixed(id: str) -> str:
        tools = (await every.request(id, "tools/list"))["result"]["tools"]
        return next(t["name"] for t in tools if t["name"].startswith("a__b__echo-"))

    daemon.reload(scripts.config("a__b", "a"))
    await settle()
    assert await tool_of(1, "a__b__echo") == ("a", "b__echo")
    assert await tool_of(2, await suffixed("list1")) == ("a__b", "echo")
    scripts["a2"] = scripts["a"]
    daemon.reload(scripts.config("a__b", "a", a="a2"))  # (a restart: still ``a``)
    await settle()
    assert await tool_of(3, "a__b__echo") == ("a", "b__echo")
    kept = await suffixed("list2")
    daemon.reload(scripts.config("a__b"))
    await settle()
    gone = await every.request(4, "tools/call", {"name": "a__b__echo", "arguments": {}})
    assert gone["error"]["code"] == jsonrpc.INVALID_PARAMS  # (not a__b's echo)
    assert await tool_of(5, kept) == ("a__b", "echo")
    daemon.reload(scripts.config("a__b", "a"))
    await settle()
    assert await tool_of(6, "a__b__echo") == ("a", "b__echo")
    assert await tool_of(7, kept) == ("a__b", "echo")


async def test_a_server_a_session_named_rejoins_its_view_when_configured_again(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """``connect a b``: a reload disables ``b`` (it leaves the view), another
    enables it again: it is back in the view, and the session is told; a
    server the session did not name stays out."""
    daemon = await start(nursery, scripts.config("a", "b"))
    named = await connect(nursery, daemon, ["a", "b"])
    disabled = {"mcpServers": {"a": {"command": "a"}, "b": {"command": "b", "disabled": True}}}
    daemon.reload(parse_config(disabled))
    await settle()
    gone = await named.request(1, "tools/call", {"name": "b__echo", "arguments": {}})
    assert gone["error"]["code"] == jsonrpc.INVALID_PARAMS
    del named.messages[:]
    report = daemon.reload(scripts.config("c", "b", "a"))
    assert set(report.added) == {"b", "c"}
    await settle()
    assert named.told() == [
        TOOLS_CHANGED,
        "notifications/prompts/list_changed",
        "notifications/resources/list_changed",
    ]
    back = await named.request(2, "tools/call", {"name": "b__echo", "arguments": {}})
    assert back["result"]["server"] == "b"
    tools = (await named.request(3, "tools/list"))["result"]["tools"]
    servers = [t["name"].split("__")[0] for t in tools]
    assert list(dict.fromkeys(servers)) == ["b", "a"]  # (config order; not c)
    # It attached to the new ``b``: it hears the session's notifications.
    await named.send(jsonrpc.notification("notifications/roots/list_changed"))
    await settle()
    assert scripts["b"].requests("notifications/roots/list_changed")


async def test_a_restart_with_other_tools_tells_those_who_see_them(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    daemon = await start(nursery, scripts.config("a", "b", b="b1"))
    every = await connect(nursery, daemon)
    only_a = await connect(nursery, daemon, ["a"])
    scripts["b2"] = ScriptedServer(nursery, label="b1")  # (the same resources)
    scripts["b2"].tools.append({"name": "extra", "inputSchema": {"type": "object"}})
    daemon.reload(scripts.config("a", "b", b="b2"))
    await settle()
    assert every.told() == [TOOLS_CHANGED]
    assert only_a.told() == []
    assert "result" in await every.request(1, "tools/call", {"name": "b__extra", "arguments": {}})


async def test_shutdown_drains_then_answers_what_is_left(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    daemon = await start(nursery, scripts.config("a", broker={"shutdownTimeout": 3}))
    client = await connect(nursery, daemon)
    await client.call(1, "a__sleep", seconds=1)
    await client.call(2, "a__sleep", seconds=60)
    await settle()
    started = trio.current_time()
    assert not daemon.statistics().stopping
    async with trio.open_nursery() as stopping:
        stopping.start_soon(daemon.shut_down)
        refused = await client.request(3, "ping")
        assert daemon.statistics().stopping  # (mcpbroker status says so, --json too)
        assert refused["error"]["code"] == jsonrpc.CONNECTION_CLOSED
        assert refused["error"]["message"] == "mcpbroker: the daemon is stopping"
        late = await connect_refused(nursery, daemon)
        assert "the daemon is stopping" in late["error"]["message"]
    assert "result" in await client.answer(1)
    error = (await client.answer(2))["error"]
    assert error["code"] == jsonrpc.CONNECTION_CLOSED
    assert (
        "the daemon is stopping" in error["message"] and "shutdownTimeout = 3 s" in error["message"]
    )
    assert trio.current_time() - started == pytest.approx(3, abs=0.1)
    assert client.closed
    assert all(len(client.answers(id)) == 1 for id in (1, 2, 3))
    assert said(client) == ["mcpbroker: the daemon is stopping"]  # its last message
    # The server heard that the request was cancelled (the session detached).
    await settle()
    assert scripts["a"].requests("notifications/cancelled")


async def test_a_client_that_comes_while_the_sessions_close_is_closed_not_waited_for(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """A client that asks for no notice (socat, a --no-resume shim) and comes
    after the drain stopped the sessions (one of them slow to close: its
    client does not read) was never stopped: the daemon waited for it for
    CLOSE_SESSIONS_TIMEOUT (10 s) on top."""
    from actors.daemon import CLOSE_SESSIONS_TIMEOUT
    from actors.session import FLUSH_SECONDS

    daemon = await start(nursery, scripts.config("a", broker={"shutdownTimeout": 1}))
    ours, theirs = trio.testing.lockstep_stream_pair()  # (its client never reads)
    nursery.start_soon(daemon._serve_client, theirs)
    params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}}
    initialize = {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": params}
    await ours.send_all(ndjson.encode(initialize))
    await settle()
    started = trio.current_time()
    async with trio.open_nursery() as stopping:
        stopping.start_soon(daemon.shut_down)
        while not any(session._stopping for session in daemon._sessions):
            await trio.sleep(0.01)  # (the drain has stopped the sessions)
        late_stream, theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(daemon._serve_client, theirs)
        late = Client(late_stream)
        nursery.start_soon(late.read_forever)
        await late.send(initialize)
        with trio.fail_after(1):
            while not late.closed:  # (closed at once: it goes to the next daemon)
                await trio.sleep(0.01)
    assert trio.current_time() - started < CLOSE_SESSIONS_TIMEOUT
    assert trio.current_time() - started <= 1 + FLUSH_SECONDS  # (the slow one, bounded)


async def connect_refused(nursery: trio.Nursery, daemon: Daemon) -> Any:
    """A client that comes while the daemon stops: its initialize is refused."""
    ours, theirs = trio.testing.memory_stream_pair()
    nursery.start_soon(daemon._serve_client, theirs)
    client = Client(ours)
    nursery.start_soon(client.read_forever)
    params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}}
    return await client.request("init", "initialize", params)


@pytest.mark.parametrize("sharing", [{"pool": 2}, {"share": "per-session"}])
async def test_a_removed_group_of_instances_answers_and_stops_each(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any, sharing: dict[str, Any]
) -> None:
    broker = {"shutdownTimeout": 2}
    config = parse_config(
        {"mcpServers": {"a": {"command": "a"}, "g": {"command": "g", **sharing}}, "broker": broker}
    )
    daemon = await start(nursery, config)
    client = await connect(nursery, daemon)
    for id in range(1, 5):
        await client.call(id, "g__sleep", seconds=60)
    await settle()
    daemon.reload(scripts.config("a", broker=broker))
    for id in range(1, 5):
        error = (await client.answer(id))["error"]
        assert error["message"] == "MCP server 'g' was removed from the configuration"
    await settle()
    assert all(link.exited.is_set() for link in scripts["g"].links)
    assert len(scripts["g"].links) >= 2  # (the catalog's instance and a pool's or the session's)
    assert "result" in await client.request(9, "tools/call", {"name": "a__echo", "arguments": {}})


async def test_an_era_of_per_client_on_reload_restarts_the_server_as_a_group(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """``era`` restarts its server (broker/configdiff.py), and ``"per-client"``
    brings the actor that opens it once for each era of client
    (actors/sharing.py); the session goes on calling it."""
    daemon = await start(nursery, scripts.config("a", "b"))
    client = await connect(nursery, daemon)
    servers = {"a": {"command": "a"}, "b": {"command": "b", "era": "per-client"}}
    report = daemon.reload(parse_config({"mcpServers": servers}))
    assert report.restarted == ("b",) and not report.added and not report.removed
    assert isinstance(daemon.upstreams["b"], EraServer)
    await settle()
    answer = await client.request(2, "tools/call", {"name": "b__echo", "arguments": {}})
    assert answer["result"]["server"] == "b"
    assert len(daemon.upstreams["b"].instances()) == 1  # (no modern client: one instance)


async def test_a_live_change_reaches_a_per_client_server_in_its_own_era(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """A setting that applies live (``timeout``) reaches the instances of a
    ``"per-client"`` server, each keeping the era it was opened in (the
    catalog instance legacy), not the group's ``"per-client"``."""
    servers = {"b": {"command": "b", "era": "per-client"}}
    daemon = await start(nursery, parse_config({"mcpServers": servers}))
    group = daemon.upstreams["b"]
    report = daemon.reload(parse_config({"mcpServers": {"b": {**servers["b"], "timeout": 5}}}))
    assert report.updated == ("b",) and not report.restarted
    assert [(i.config.era, i.config.timeout) for i in group.instances()] == [("legacy", 5)]


@pytest.mark.parametrize(
    "sharing", [{}, {"pool": 2}, {"share": "per-session"}, {"era": "per-client"}]
)
async def test_a_session_that_raced_a_reload_to_a_retired_server_is_answered(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any, sharing: dict[str, Any]
) -> None:
    """What reaches a server after a reload retired it (a session that was
    attaching while the reload ran) gets the reload's error: no request is
    left unread in its inbox, and no instance starts in a group whose
    nursery has closed (which raised into the session)."""
    servers = {"a": {"command": "a"}, "g": {"command": "g", **sharing}}
    daemon = await start(nursery, parse_config({"mcpServers": servers}))
    old = daemon.upstreams["g"]
    daemon.reload(scripts.config("a"))
    await settle()
    outbox, inbox = trio.open_memory_channel[Any](10)
    handle = SessionHandle(outbox, trio.CancelScope())
    modern = sharing.get("era") == "per-client"
    with trio.fail_after(5):
        await old.send(Attach(handle, {}, modern=modern))
        call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo"}}
        await old.send(ClientRequest(handle, [call], 100))
        await old.send(Detach(handle))
        (answer,), _size = await inbox.receive()
    assert answer["id"] == 7
    assert answer["error"]["message"] == "MCP server 'g' was removed from the configuration"
    assert old.statistics().in_flight == 0
    assert not [i for i in getattr(old, "instances", list)() if i.status is not ServerState.STOPPED]


async def test_a_session_that_reaches_a_new_group_before_it_runs_waits_for_it(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """A reload makes a per-session (or per-client) actor and tells each
    session to attach before the daemon's task runs it: the session's first
    request (which starts its instance) waits for the group to run. (It
    raised AssertionError in the group's _start, which ended the session: its
    calls on every server lost.)"""
    from actors.sharing import PerSessionServer

    config = scripts.config("g", broker={})
    group = PerSessionServer("g", config.servers["g"], config.broker)
    outbox, _ = trio.open_memory_channel[Any](10)
    handle = SessionHandle(outbox, trio.CancelScope())
    attached = trio.Event()

    async def attach() -> None:
        await group.send(Attach(handle, {}))
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        await group.send(ClientRequest(handle, [ping], 10))
        attached.set()

    nursery.start_soon(attach)
    await trio.sleep(1)
    assert not attached.is_set()  # (waiting for the group to run)
    await nursery.start(group.run)
    with trio.fail_after(5):
        await attached.wait()
    assert len(group.instances()) == 2  # the catalog's instance and the session's


async def test_a_parked_calls_retry_after_a_reload_removed_its_server_is_answered(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """A 2026-07-28 client's call parked at a legacy server (it asked a
    question) that a reload removes: the call is answered while the client is
    away, and its retry gets that answer; the session goes on. (The retry's
    answers to the server's questions went to a server no longer in the
    daemon's table: KeyError, and the session ended.)"""
    daemon = await start(nursery, scripts.config("a", "s"))
    ours, theirs = trio.testing.memory_stream_pair()
    nursery.start_soon(daemon._serve_client, theirs)
    client = Client(ours)
    nursery.start_soon(client.read_forever)
    meta = {PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {"elicitation": {}}}
    assert "result" in await client.request("l", "tools/list", {"_meta": meta})
    form = {"mode": "form", "message": "Colour?", "requestedSchema": {"type": "object"}}
    question = {"jsonrpc": "2.0", "id": "q1", "method": "elicitation/create", "params": form}
    line = jsonrpc.encode(question).decode()
    call = {"name": "s__raw", "arguments": {"line": line}, "_meta": meta}
    parked = await client.request(1, "tools/call", call)
    assert parked["result"]["resultType"] == "input_required"
    daemon.reload(scripts.config("a"))
    await settle()
    (key,) = parked["result"]["inputRequests"]
    retry = {**call, "requestState": parked["result"]["requestState"],
             "inputResponses": {key: {"action": "accept", "content": {}}}}  # fmt: skip
    answer = await client.request(2, "tools/call", retry)
    assert answer["error"]["message"] == "MCP server 's' was removed from the configuration"
    echo = {"name": "a__echo", "arguments": {}, "_meta": meta}
    assert "result" in await client.request(3, "tools/call", echo)


async def test_a_restart_by_reload_asks_the_new_process_what_its_sessions_asked(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """A session's subscription and log level at the server a reload
    restarts are asked of the new process at its handshake, as a crash's
    restart asks them. (The new actor started with none: no update reached
    the session again, and the server logged at its default.)"""
    scripts["s"] = script = ScriptedServer(nursery, label="s")
    script.capabilities.update(resources={"subscribe": True}, logging={})
    daemon = await start(nursery, scripts.config("s"))
    client = await connect(nursery, daemon)
    assert "result" in await client.request(1, "resources/subscribe", {"uri": "mem://s/readme"})
    assert "result" in await client.request(2, "logging/setLevel", {"level": "debug"})
    servers = {"s": {"command": "s", "env": {"CHANGED": "1"}}}
    assert daemon.reload(parse_config({"mcpServers": servers})).restarted == ("s",)
    await settle()
    link = script.links[-1]
    assert len(script.links) == 2 and not link.exited.is_set()  # (the new process)
    starts = [i for i, m in enumerate(script.received) if m.get("method") == "initialize"]
    since = script.received[starts[-1] :]  # (what the new process was asked)
    asked = [(m["method"], m.get("params")) for m in since if "id" in m and "method" in m]
    assert ("resources/subscribe", {"uri": "mem://s/readme"}) in asked
    assert ("logging/setLevel", {"level": "debug"}) in asked
    updated = jsonrpc.notification("notifications/resources/updated", {"uri": "mem://s/readme"})
    await link.send(updated)
    await settle()
    assert updated in client.messages


async def test_a_reload_whose_file_never_comes_blocks_nobody_and_is_refused(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    # (a config that is a named pipe, read again on the event loop: every session
    # hung, and SIGTERM with them)
    import threading

    daemon = await start(nursery, scripts.config("a"))
    released = threading.Event()

    def load() -> Config:
        released.wait(15)  # (open() of a named pipe that nobody writes)
        return scripts.config("a")

    daemon._load = load
    client = await connect(nursery, daemon)
    answered: list[Any] = []

    async def reload() -> None:
        answered.append(await daemon.reload_file())

    nursery.start_soon(reload)
    await client.call(7, "a__sleep", seconds=1)
    assert "result" in await client.answer(7)
    assert not answered  # (still reading)
    await trio.sleep(11)
    released.set()
    assert "could not be read within 10 s" in answered[0]["error"]


SHARINGS = [{}, {"pool": 2}, {"share": "per-session"}, {"era": "per-client"}]


@pytest.mark.parametrize("before", SHARINGS)
@pytest.mark.parametrize("after", SHARINGS)
async def test_the_counters_of_a_server_a_reload_restarts_go_on(
    nursery: trio.Nursery,
    scripts: Scripts,
    autojump_clock: Any,
    before: dict[str, Any],
    after: dict[str, Any],
) -> None:
    # (they started again from 0: a counter reset for Prometheus; a pool's
    # and a per-session server's did still, and a group's made shared)
    servers = {"a": {"command": "a", **before}}
    daemon = await start(nursery, parse_config({"mcpServers": servers}))
    client = await connect(nursery, daemon)
    for id in range(3):
        assert "result" in await client.request(id, "tools/call", {"name": "a__echo"})
    counted = daemon.upstreams["a"].statistics()
    servers = {"a": {"command": "a", "env": {"X": "1"}, **after}}
    assert daemon.reload(parse_config({"mcpServers": servers})).restarted == ("a",)
    await settle()
    now = daemon.upstreams["a"].statistics()
    assert now.requests >= counted.requests >= 3
    assert (now.errors, now.timeouts, now.restarts) >= (counted.errors, counted.timeouts, 0)


async def test_an_unchanged_reload_reads_no_token_file(socket_path: str, tmp_path: Any) -> None:
    """A reload that changes nothing the listeners' policies are made of
    keeps them as they are: it was refused once the token file (read at
    start) was gone, its failed servers not retried; a token file that is a
    named pipe blocked the event loop. (Found by review of 3638702.)"""
    import os
    import threading
    import time

    from tests.conftest import running_daemon

    token = tmp_path / "token"
    token.write_text("one\n")
    broker = {"websocket": "127.0.0.1:0", "tokenFile": str(token)}
    with trio.fail_after(60):
        async with running_daemon({}, socket_path, broker=broker) as daemon:
            same = parse_config({"mcpServers": {}, "broker": broker})
            os.unlink(token)
            daemon.reload(same)  # (raised StartError: the file is gone)
            os.mkfifo(token)  # (no writer yet: an open() blocks)
            threading.Thread(target=lambda: (time.sleep(3), token.write_text("one\n")),
                             daemon=True).start()  # fmt: skip
            began = time.monotonic()
            daemon.reload(same)
            assert time.monotonic() - began < 1.0


async def test_reloads_abandoned_in_a_read_leave_the_daemon_its_threads(
    nursery: trio.Nursery, scripts: Scripts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read abandoned at RELOAD_READ_TIMEOUT keeps its thread: it holds a
    limiter of the reload's own, not a token of Trio's shared one (40),
    whose loss stopped every thread of the daemon's (token reads, DNS
    lookups) after 40 refused reloads. (Found by review of ce3b795.)"""
    import threading

    import actors.daemon

    monkeypatch.setattr(actors.daemon, "RELOAD_READ_TIMEOUT", 0.05)
    daemon = await start(nursery, scripts.config("a"))
    released = threading.Event()

    def stuck() -> Config:
        released.wait(30)
        return scripts.config("a")

    daemon._load = stuck
    try:
        for _ in range(trio.to_thread.current_default_thread_limiter().total_tokens + 1):
            assert "could not be read" in (await daemon.reload_file())["error"]
        with trio.fail_after(5):
            await trio.to_thread.run_sync(lambda: None)
    finally:
        released.set()


class GatedScript(ScriptedServer):
    """A scripted server that cannot be started again once ``gate`` is set."""

    gate = False

    async def launch(self, context: Any) -> Any:
        if self.gate:
            raise actors.upstream.LaunchError("the gate is shut")
        return await super().launch(context)


async def test_a_per_session_instance_starts_on_the_sessions_first_request(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """A session that never uses a per-session server costs no process (every
    aggregated session started one of every per-session server at initialize);
    the instance its first request starts is told its Attach and log level."""
    scripts["g"] = ScriptedServer(nursery, label="g")
    scripts["g"].capabilities["logging"] = {}
    servers = {"a": {"command": "a"}, "g": {"command": "g", "share": "per-session"}}
    daemon = await start(nursery, parse_config({"mcpServers": servers}))
    group = daemon.upstreams["g"]
    idle = await connect(nursery, daemon)
    user = await connect(nursery, daemon)
    await idle.call(1, "a__echo")
    await user.request(2, "logging/setLevel", {"level": "error"})
    await settle()
    assert len(group.instances()) == 1  # the catalog's alone
    await user.call(3, "g__echo", who="me")
    assert "result" in await user.answer(3)
    assert len(group.instances()) == 2  # and the user's
    assert group.statistics().sessions == 1
    [setlevel] = scripts["g"].requests("logging/setLevel")  # (told at its handshake)
    assert setlevel["params"] == {"level": "error"}
    await user.stream.send_eof()  # type: ignore[attr-defined]
    await idle.stream.send_eof()  # type: ignore[attr-defined]
    await settle()
    assert len(group.instances()) == 1


@pytest.mark.parametrize("sharing", [{"pool": 2}, {"share": "per-session"}])
async def test_a_failed_catalog_instance_hands_the_catalog_to_a_live_one(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any, sharing: dict[str, Any]
) -> None:
    """The catalog's instance of a pool or per-session server fails while
    another instance is up: the server stays listed and served (it was taken
    out of every view, its calls refused as not running, status down)."""
    scripts["g"] = script = GatedScript(nursery, label="g")
    servers = {"a": {"command": "a"}, "g": {"command": "g", **sharing}}
    daemon = await start(nursery, parse_config({"mcpServers": servers}))
    client = await connect(nursery, daemon)
    named = await connect(nursery, daemon, ["g"])  # (transparent)
    await client.call(1, "g__echo", who="first")
    assert "result" in await client.answer(1)
    await settle()
    group = daemon.upstreams["g"]
    assert len(group.instances()) >= 2
    catalog = group._catalog  # type: ignore[attr-defined]
    script.gate = True
    await script.links[0].die()  # the catalog instance's process: it cannot start again
    with trio.fail_after(120):
        while catalog.status not in (ServerState.FAILED, ServerState.STOPPED):
            await trio.sleep(1)  # (failed: a per-session server stops it then)
    await settle()
    assert group.status is ServerState.READY
    await client.call(2, "g__echo", who="after")
    assert (await client.answer(2))["result"]["server"] == "g"
    tools = (await client.request(3, "tools/list"))["result"]["tools"]
    assert "g__echo" in {tool["name"] for tool in tools}
    listed = (await named.request(3, "tools/list"))["result"]["tools"]
    assert "echo" in {tool["name"] for tool in listed}
    assert daemon.registry.current.entry("g").serving
    # Its successor stays the catalog's when the sessions leave.
    await client.stream.send_eof()  # type: ignore[attr-defined]
    await named.stream.send_eof()  # type: ignore[attr-defined]
    await settle()
    assert group.status is ServerState.READY
    assert daemon.registry.current.entry("g").serving
    script.gate = False  # (a per-session server starts the new session's instance)
    later = await connect(nursery, daemon)
    await later.call(4, "g__echo", who="later")
    assert (await later.answer(4))["result"]["server"] == "g"


async def test_a_per_session_server_runs_at_most_max_instances(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """Past ``maxInstances`` a session's first request is refused (-32005,
    naming the server and the limit); room made by a departure is taken."""
    servers = {"g": {"command": "g", "share": "per-session", "maxInstances": 1}}
    daemon = await start(nursery, parse_config({"mcpServers": servers}))
    group = daemon.upstreams["g"]
    first = await connect(nursery, daemon)
    second = await connect(nursery, daemon)
    await first.call(1, "g__echo")
    assert "result" in await first.answer(1)
    await second.call(2, "g__echo")
    error = (await second.answer(2))["error"]
    assert error["code"] == jsonrpc.LIMIT_REACHED
    assert "'g' runs one process per session and already runs 1" in error["message"]
    assert "maxInstances" in error["message"]
    assert error["data"] == {"server": "g", "limit": 1}
    assert len(group.instances()) == 2  # the catalog's and the first session's
    await first.stream.send_eof()  # type: ignore[attr-defined]
    await settle()
    await second.call(3, "g__echo")
    assert "result" in await second.answer(3)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"share": "per-session"}, {"share": "per-session"}),
        ({}, {"share": "per-session"}),
        ({"pool": 2}, {"pool": 2}),
        ({"share": "per-session"}, {"pool": 2}),
        ({"pool": 2}, {}),
    ],
)
async def test_a_reload_restart_of_a_group_asks_the_new_instances_what_sessions_asked(
    nursery: trio.Nursery,
    scripts: Scripts,
    autojump_clock: Any,
    before: dict[str, Any],
    after: dict[str, Any],
) -> None:
    """A reload that restarts a per-session or pooled server (or makes one):
    the session's log level and subscriptions are asked of its new instance,
    and the updates reach it once. (They were lost: the new instances started
    with none, and the session got debug messages it had asked not to.)"""
    scripts["s"] = script = ScriptedServer(nursery, label="s")
    script.capabilities.update(resources={"subscribe": True}, logging={})
    servers = {"s": {"command": "s", **before}}
    daemon = await start(nursery, parse_config({"mcpServers": servers}))
    client = await connect(nursery, daemon)
    assert "result" in await client.request(1, "resources/subscribe", {"uri": "mem://s/readme"})
    assert "result" in await client.request(2, "logging/setLevel", {"level": "error"})
    await settle()
    links_before = len(script.links)
    servers = {"s": {"command": "s", "env": {"CHANGED": "1"}, **after}}
    assert daemon.reload(parse_config({"mcpServers": servers})).restarted == ("s",)
    await settle()
    new_links = script.links[links_before:]
    assert new_links and not any(link.exited.is_set() for link in new_links)
    starts = [i for i, m in enumerate(script.received) if m.get("method") == "initialize"]
    since = script.received[starts[-len(new_links)] :]  # (what the new processes were asked)
    asked = [(m["method"], m.get("params")) for m in since if "id" in m and "method" in m]
    assert asked.count(("resources/subscribe", {"uri": "mem://s/readme"})) == 1
    assert ("logging/setLevel", {"level": "error"}) in asked
    updated = jsonrpc.notification("notifications/resources/updated", {"uri": "mem://s/readme"})
    for link in new_links:
        await link.send(updated)
    await settle()
    assert client.messages.count(updated) == 1


async def test_a_second_catalog_hand_over_leaves_the_sessions_instance_running(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """Per-session: A's instance took over the catalog, then fails while B's is
    ready. The catalog moves on to B's, but A's instance stays A's (tried
    again): it was stopped, and A's later requests were never answered."""
    scripts["g"] = script = GatedScript(nursery, label="g")
    daemon = await start(
        nursery, parse_config({"mcpServers": {"g": {"command": "g", "share": "per-session"}}})
    )
    group = daemon.upstreams["g"]
    a = await connect(nursery, daemon)
    b = await connect(nursery, daemon)
    await a.call(1, "g__echo", who="a")
    assert "result" in await a.answer(1)
    await b.call(2, "g__echo", who="b")
    assert "result" in await b.answer(2)
    await settle()
    catalog = group._catalog  # type: ignore[attr-defined]
    [a_instance, b_instance] = group._mine.values()  # type: ignore[attr-defined]
    script.gate = True
    await script.links[0].die()  # the catalog's process
    with trio.fail_after(300):
        while catalog.status not in (ServerState.FAILED, ServerState.STOPPED):
            await trio.sleep(1)
    await settle()
    assert group._catalog is a_instance  # type: ignore[attr-defined]
    await script.links[1].die()  # A's process, the catalog's now
    with trio.fail_after(300):
        while a_instance.status not in (ServerState.FAILED, ServerState.STOPPED):
            await trio.sleep(1)
    await settle()
    assert group._catalog is b_instance  # type: ignore[attr-defined]
    assert a_instance.status is ServerState.FAILED  # (not stopped: A's still)
    script.gate = False
    await a.call(3, "g__echo", who="a again")
    with trio.fail_after(60):
        answer = await a.answer(3)
    assert "error" in answer  # (a failed server's refusal, naming it)
    a_instance.retry()  # (as a reload or retryFailedAfter does)
    await settle()
    await a.call(4, "g__echo", who="a, retried")
    with trio.fail_after(60):
        assert (await a.answer(4))["result"]["server"] == "g"


async def test_a_per_session_start_cut_short_leaves_nothing_behind(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """A session's first request, cancelled while it starts the session's
    instance (the session is closing), and the session's departure: the group
    keeps nothing of it (its kept Attach stayed, holding its handle, for the
    group's life; and a later request went to the instance that never ran)."""
    from actors.sharing import PerSessionServer

    config = scripts.config("g")
    server = attrs.evolve(config.servers["g"], share="per-session")
    group = PerSessionServer("g", server, config.broker)
    await nursery.start(group.run)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    outbox, inbox = trio.open_memory_channel[Any](10)
    handle = SessionHandle(outbox, trio.CancelScope())
    await group.send(Attach(handle, {}))
    with trio.CancelScope() as scope:
        scope.cancel()
        await group.send(ClientRequest(handle, [ping], 10))
    assert handle not in group._mine  # (its next request starts one that runs)
    await group.send(ClientRequest(handle, [ping], 10))
    with trio.fail_after(60):
        [answer], _ = await inbox.receive()
    assert not answer.is_error()
    await group.send(Detach(handle))
    other = SessionHandle(outbox, trio.CancelScope())  # (cut short, then gone)
    await group.send(Attach(other, {}))
    with trio.CancelScope() as scope:
        scope.cancel()
        await group.send(ClientRequest(other, [ping], 10))
    await group.send(Detach(other))
    await settle()
    assert (group._mine, group._waiting) == ({}, {})


async def test_a_pool_session_moved_off_a_failed_instance_leaves_its_subscriptions_there(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """A pool's session whose instance failed subscribes, then unsubscribes,
    on the one it is moved to; the failed one, tried again, does not subscribe
    for it anew (it did, and sent the session updates it had unsubscribed from)."""
    scripts["g"] = script = GatedScript(nursery, label="g")
    script.capabilities.update(resources={"subscribe": True})
    uri = "mem://g/readme"
    daemon = await start(nursery, parse_config({"mcpServers": {"g": {"command": "g", "pool": 2}}}))
    group = daemon.upstreams["g"]
    await connect(nursery, daemon)  # (assigned instance 0)
    second = await connect(nursery, daemon)  # (assigned instance 1)
    await settle()
    assert "result" in await second.request(1, "resources/subscribe", {"uri": uri})
    one = group._pool[1]  # type: ignore[attr-defined]
    script.gate = True
    await script.links[1].die()  # instance 1's process, which cannot start again
    with trio.fail_after(300):
        while one.status is not ServerState.FAILED:
            await trio.sleep(1)
    assert "result" in await second.request(2, "resources/subscribe", {"uri": uri})
    assert "result" in await second.request(3, "resources/unsubscribe", {"uri": uri})
    script.gate = False
    one.retry()  # (as a reload, or retryFailedAfter, does)
    with trio.fail_after(300):
        while one.status is not ServerState.READY:
            await trio.sleep(1)
    await settle()
    assert len(script.requests("resources/subscribe")) == 2  # (not a third, renewed)
    updated = jsonrpc.notification("notifications/resources/updated", {"uri": uri})
    await script.links[-1].send(updated)  # instance 1's new process
    await settle()
    assert updated not in second.messages


@pytest.mark.parametrize(
    "reloads",
    [
        [{"share": "per-session"}],
        [{}],
        [{"share": "per-session"}, {"share": "per-session", "env": {"X": "2"}}],
    ],
)
async def test_an_idle_per_session_sessions_log_level_outlives_reloads(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any, reloads: list[dict[str, Any]]
) -> None:
    """A session set its log level but has not used the per-session server
    yet (no instance: the group keeps the level); a reload restarts the server
    (or makes it shared), or two do. The new process is asked that level, and
    the session gets no message below it (it got the server's debug noise)."""
    scripts["s"] = script = ScriptedServer(nursery, label="s")
    script.capabilities.update(logging={})
    servers = {"a": {"command": "a"}, "s": {"command": "s", "share": "per-session"}}
    daemon = await start(nursery, parse_config({"mcpServers": servers}))
    client = await connect(nursery, daemon)
    assert "result" in await client.request(1, "logging/setLevel", {"level": "error"})
    await settle()
    for after in reloads:
        servers = {"a": {"command": "a"}, "s": {"command": "s", "env": {"X": "1"}, **after}}
        assert daemon.reload(parse_config({"mcpServers": servers})).restarted == ("s",)
        await settle()
    await client.call(2, "s__echo")  # (starts its per-session instance, if any)
    assert "result" in await client.answer(2)
    await settle()
    starts = [i for i, m in enumerate(script.received) if m.get("method") == "initialize"]
    asked = script.received[starts[-1] :]  # (what the newest process was asked)
    assert {"level": "error"} in [
        m["params"] for m in asked if m.get("method") == "logging/setLevel"
    ]
    debug = jsonrpc.notification("notifications/message", {"level": "debug", "data": "noise"})
    await script.links[-1].send(debug)
    await settle()
    assert not [m for m in client.messages if m.get("params", {}).get("data") == "noise"]


async def test_a_subscribed_session_a_reload_leaves_past_max_instances_is_told(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """A reload makes a shared server per-session with ``maxInstances: 1``
    while two sessions are subscribed: the second gets no instance, so no
    updates, and is told so (nothing told it: its updates silently stopped);
    its next request that finds room renews them."""
    scripts["s"] = script = ScriptedServer(nursery, label="s")
    script.capabilities.update(resources={"subscribe": True})
    uri = "mem://s/readme"
    daemon = await start(nursery, parse_config({"mcpServers": {"s": {"command": "s"}}}))
    one = await connect(nursery, daemon)
    two = await connect(nursery, daemon)
    for client in (one, two):
        assert "result" in await client.request(1, "resources/subscribe", {"uri": uri})
    await settle()
    before = len(script.links)
    servers = {"s": {"command": "s", "share": "per-session", "maxInstances": 1}}
    assert daemon.reload(parse_config({"mcpServers": servers})).restarted == ("s",)
    await settle()
    updated = jsonrpc.notification("notifications/resources/updated", {"uri": uri})
    for link in script.links[before:]:
        await link.send(updated)
    await settle()
    got = [client.messages.count(updated) for client in (one, two)]
    assert sorted(got) == [0, 1]
    [left_out] = [c for c, n in zip((one, two), got, strict=True) if n == 0]
    [told] = said(left_out)
    assert "'s'" in told and "maxInstances" in told and uri in told
    (served,) = {one, two} - {left_out}
    await served.stream.send_eof()  # type: ignore[attr-defined]
    await settle()
    assert "result" in await left_out.request(2, "ping")  # (the broker answers pings)
    await left_out.call(3, "s__echo")
    assert "result" in await left_out.answer(3)
    await settle()
    await script.links[-1].send(updated)  # (its instance was asked its subscription)
    await settle()
    assert left_out.messages.count(updated) == 1


async def test_a_list_changed_of_a_pools_other_instance_is_not_the_sessions(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """A pool's instance that is not the catalog's says its tools changed:
    the sessions are not told (each got it as it was, though the catalog,
    the catalog instance's lists, had not changed)."""
    servers = {"a": {"command": "a"}, "g": {"command": "g", "pool": 2}}
    daemon = await start(nursery, parse_config({"mcpServers": servers}))
    client = await connect(nursery, daemon)
    await settle()
    script = scripts["g"]
    assert len(script.links) == 2
    listed = len(script.links[1].script.requests("tools/list"))
    await script.links[1].send(jsonrpc.notification(TOOLS_CHANGED))  # (instance 1)
    await settle()
    assert TOOLS_CHANGED not in client.told()
    assert len(script.requests("tools/list")) == listed + 1  # (it re-listed: warm-up)


@pytest.mark.parametrize(
    ("before", "after"),
    [({"era": "per-client"}, {"era": "per-client"}), ({}, {"era": "per-client"})],
)
async def test_a_reload_restart_of_a_per_client_server_asks_what_its_sessions_asked(
    nursery: trio.Nursery,
    scripts: Scripts,
    autojump_clock: Any,
    before: dict[str, Any],
    after: dict[str, Any],
) -> None:
    """A reload restarts a per-client (era) server, or makes one: the legacy
    session's subscription and log level are asked of the new legacy
    instance, and its updates go on (they were dropped: its instances started
    anew, asked nothing)."""
    scripts["s"] = script = ScriptedServer(nursery, label="s")
    script.capabilities.update(resources={"subscribe": True}, logging={})
    daemon = await start(nursery, parse_config({"mcpServers": {"s": {"command": "s", **before}}}))
    client = await connect(nursery, daemon)  # (a legacy client: the catalog instance's)
    assert "result" in await client.request(1, "resources/subscribe", {"uri": "mem://s/readme"})
    assert "result" in await client.request(2, "logging/setLevel", {"level": "error"})
    await settle()
    links_before = len(script.links)
    servers = {"s": {"command": "s", "env": {"CHANGED": "1"}, **after}}
    assert daemon.reload(parse_config({"mcpServers": servers})).restarted == ("s",)
    await settle()
    [new_link] = script.links[links_before:]
    starts = [i for i, m in enumerate(script.received) if m.get("method") == "initialize"]
    asked = [
        (m["method"], m.get("params"))
        for m in script.received[starts[-1] :]
        if "id" in m and "method" in m
    ]
    assert ("resources/subscribe", {"uri": "mem://s/readme"}) in asked
    assert ("logging/setLevel", {"level": "error"}) in asked
    updated = jsonrpc.notification("notifications/resources/updated", {"uri": "mem://s/readme"})
    await new_link.send(updated)
    await settle()
    assert client.messages.count(updated) == 1


async def test_a_reload_hands_a_per_client_servers_modern_sessions_to_its_modern_instance(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """What a modern session asked of the server a reload replaced goes to the
    modern instance (its listen's URIs are subscribed once, never again);
    what a legacy one asked, to the catalog (legacy) instance: each once."""
    from broker.fanout import Fanout

    config = scripts.config("b")
    group = EraServer("b", attrs.evolve(config.servers["b"], era="per-client"), config.broker)
    outbox, _ = trio.open_memory_channel[Any](10)
    legacy, modern = (SessionHandle(outbox, trio.CancelScope()) for _ in range(2))

    class Old:
        identity = None  # (not open: see the next test for a modern one)

        def asked(self) -> Fanout:
            asked = Fanout()
            for session, uri in ((legacy, "mem://l"), (modern, "mem://m")):
                asked.subscribe(session, uri)
                asked.set_level(session, "error")
            return asked

        def modern_sessions(self) -> set[Any]:
            return {modern}

        def statistics(self) -> UpstreamStatistics:
            return UpstreamStatistics("b", "ready", "ready", None, 0, 2, 0, 0, None)

    group.inherit(Old())  # type: ignore[arg-type]
    await nursery.start(group.run)
    await group.send(Attach(modern, {}, modern=True))
    assert group._modern is not None
    catalog, other = group._catalog.asked(), group._modern.asked()
    assert (catalog.subscribed_uris(), other.subscribed_uris()) == (["mem://l"], ["mem://m"])
    assert (catalog.level_of(legacy), catalog.level_of(modern)) == ("error", None)
    assert other.level_of(modern) == "error"


async def test_a_reload_gives_a_per_client_servers_new_instances_what_never_was_sent(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """What the server a reload replaced never sent (Daemon.reload: take_over)
    goes to the instance of the session's era: a modern session's to the
    modern instance, made for it and started with the group; a legacy one's
    to the catalog instance. Both are answered."""
    config = scripts.config("b")
    group = EraServer("b", attrs.evolve(config.servers["b"], era="per-client"), config.broker)
    outbox, delivered = trio.open_memory_channel[Any](10)
    legacy, modern = (SessionHandle(outbox, trio.CancelScope()) for _ in range(2))

    class Old:
        identity = None

        def asked(self) -> Any:
            from broker.fanout import Fanout

            return Fanout()

        def modern_sessions(self) -> set[Any]:
            return {modern}

        def statistics(self) -> UpstreamStatistics:
            return UpstreamStatistics("b", "ready", "ready", None, 0, 2, 0, 0, None)

    def echo(id: int) -> Any:
        params = {"name": "echo", "arguments": {"n": id}}
        return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}

    group.inherit(Old())  # type: ignore[arg-type]
    group.take_over([ClientRequest(legacy, [echo(1)], 10), ClientRequest(modern, [echo(2)], 10)])
    assert group._modern is not None
    assert (group._catalog.statistics().parked, group._modern.statistics().parked) == (1, 1)
    await nursery.start(group.run)
    assert set(group.instances()) == {group._catalog, group._modern}
    answered = set()
    with trio.fail_after(60):
        while len(answered) < 2:
            messages, _ = await delivered.receive()
            answered |= {m.id for m in messages if isinstance(m, Answer) and not m.is_error()}
    assert answered == {1, 2}


async def test_a_reload_of_a_modern_only_per_client_server_starts_no_second_instance(
    nursery: trio.Nursery, scripts: Scripts
) -> None:
    """A per-client server whose catalog instance came up modern (a
    modern-only server: its modern clients share that instance) is
    restarted by a reload: a modern session's request it never sent, and
    that session's Attach as the new one opens, go to the new catalog
    instance; no second (modern) instance is made for them."""
    config = scripts.config("b")
    group = EraServer("b", attrs.evolve(config.servers["b"], era="per-client"), config.broker)
    outbox, _ = trio.open_memory_channel[Any](10)
    modern = SessionHandle(outbox, trio.CancelScope())

    class Old:
        identity = attrs.make_class("Identity", {"modern": attrs.field()})(True)

        def asked(self) -> Any:
            from broker.fanout import Fanout

            return Fanout()

        def modern_sessions(self) -> set[Any]:
            return {modern}

        def statistics(self) -> UpstreamStatistics:
            return UpstreamStatistics(
                "b", "ready", "ready", None, 0, 1, 0, 0, None, share="per-era"
            )

    echo = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo"}}
    group.inherit(Old())  # type: ignore[arg-type]
    group.take_over([ClientRequest(modern, [echo], 10)])
    with trio.fail_after(5):
        await group.send(Attach(modern, {}, modern=True))
    assert group._modern is None
    assert group._catalog.statistics().parked == 1
    assert group._catalog.statistics().inbox == 1  # (the Attach)


async def test_a_per_client_servers_modern_start_cut_short_leaves_no_dead_instance(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    """The first modern client's Attach is cancelled while it starts the
    modern instance (the session is closing): the next modern client starts
    one that runs (it got the instance that never ran, and no answers)."""
    config = scripts.config("b")
    group = EraServer("b", attrs.evolve(config.servers["b"], era="per-client"), config.broker)
    await nursery.start(group.run)
    outbox, _ = trio.open_memory_channel[Any](10)
    first, second = (SessionHandle(outbox, trio.CancelScope()) for _ in range(2))
    with trio.CancelScope() as scope:
        scope.cancel()
        await group.send(Attach(first, {}, modern=True))
    assert group._modern is None and first not in group._modern_sessions
    await group.send(Attach(second, {}, modern=True))
    assert group._modern is not None
    with trio.fail_after(60):
        await group._modern.wait_ready()


async def test_a_lowered_timeout_holds_for_what_is_sent_while_an_older_request_is_in_flight(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    # (the timer slept until the old request's deadline, 10 s after it was
    # sent: the next request ran its 3 s and was answered, though it was
    # given 1 s)
    daemon = await start(
        nursery, parse_config({"mcpServers": {"a": {"command": "a", "timeout": 10}}})
    )
    client = await connect(nursery, daemon)
    await client.call(1, "a__sleep", seconds=4)
    await settle()
    report = daemon.reload(parse_config({"mcpServers": {"a": {"command": "a", "timeout": 1}}}))
    assert report.updated == ("a",) and not report.restarted
    await client.call(2, "a__sleep", seconds=3)
    sent = trio.current_time()
    error = (await client.answer(2))["error"]
    assert error["code"] == jsonrpc.REQUEST_TIMEOUT
    assert trio.current_time() - sent == pytest.approx(1)
    assert "result" in await client.answer(1)  # (it keeps its deadline)


SAMPLING = {"messages": [], "maxTokens": 1}


@pytest.mark.parametrize("change", ["restart", "remove"])
async def test_a_clients_answer_reaches_the_process_that_asked_across_a_reload(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any, change: str
) -> None:
    # (the new process's ids began again at mcpbroker:a:1: the client had two
    # requests with one id, its answer to the old process went to the new one,
    # and the old one's call failed at shutdownTimeout; a removed server's
    # answer was dropped)
    broker = {"shutdownTimeout": 30}
    daemon = await start(nursery, scripts.config("a", "b", broker=broker, a="a1"))
    client = await connect(nursery, daemon, capabilities={"sampling": {}})
    await client.call(1, "a__sleep", seconds=10)
    await settle()
    asking = {"jsonrpc": "2.0", "id": 7, "method": "sampling/createMessage", "params": SAMPLING}
    await scripts["a1"].links[-1].send(asking)
    await settle()
    if change == "restart":
        daemon.reload(scripts.config("a", "b", broker=broker, a="a2"))
        await client.call(2, "a__sleep", seconds=10)
        await settle()
        await scripts["a2"].links[-1].send(asking)
    else:
        daemon.reload(scripts.config("b", broker=broker))
    await settle()
    asked = [m for m in client.messages if m.get("method") == "sampling/createMessage"]
    assert len({m["id"] for m in asked}) == len(asked) == (2 if change == "restart" else 1)
    for answer, question in zip(("old", "new"), asked, strict=False):
        await client.send(jsonrpc.result_response(question["id"], {"answer": answer}))
    await settle()
    askers = {"a1": "old", "a2": "new"} if change == "restart" else {"a1": "old"}
    for label, answer in askers.items():
        answers = [m for m in scripts[label].received if m.get("id") == 7 and "method" not in m]
        assert answers == [jsonrpc.result_response(7, {"answer": answer})], label
    assert "result" in await client.answer(1)  # (on the old process, in its time)


async def test_status_and_metrics_show_the_old_processes_a_reload_drains(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    # (status showed a restarted server with its new process and 0 in flight,
    # a removed one not at all, while the old processes ran and answered)
    from actors.metrics import BrokerCollector
    from broker.calls import CallStats

    broker = {"shutdownTimeout": 30}
    daemon = await start(nursery, scripts.config("a", "b", "c", broker=broker, a="a1"))
    client = await connect(nursery, daemon)
    await client.call(1, "a__sleep", seconds=10)
    await client.call(2, "b__sleep", seconds=10)
    await settle()
    daemon.reload(scripts.config("a", "c", broker=broker, a="a2"))
    await settle()
    status = daemon.statistics()
    assert [(s.name, s.in_flight) for s in status.servers] == [("a", 0), ("c", 0)]
    assert [(s.name, s.status, s.in_flight) for s in status.draining] == [
        ("b", "draining", 1),
        ("a", "draining", 1),
    ]
    assert all(s.pid is not None for s in status.draining)  # (its process, running)
    families = {f.name: f for f in BrokerCollector(daemon.statistics, CallStats()).collect()}
    in_flight = {
        s.labels["server"]: s.value for s in families["mcpbroker_server_requests_in_flight"].samples
    }
    assert in_flight == {"a": 1, "b": 1, "c": 0}
    old = {
        s.labels["server"]: s.value for s in families["mcpbroker_server_draining_instances"].samples
    }
    assert old == {"a": 1, "b": 1, "c": 0}
    assert "result" in await client.answer(1) and "result" in await client.answer(2)
    await settle()
    assert daemon.statistics().draining == ()


async def test_a_server_a_reload_starts_or_retires_logs_no_session(
    nursery: trio.Nursery, scripts: Scripts, autojump_clock: Any
) -> None:
    # (the reload runs in the task of the control session that asked it; the
    # server's tasks copied its context, and every line of the server named
    # that session: its start, its retirement, its later crashes)
    import structlog

    daemon = await start(nursery, scripts.config("a", "b", a="a1"))
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars]
    ) as captured:
        with structlog.contextvars.bound_contextvars(session=3):
            daemon.reload(scripts.config("a", "c", a="a2"))
        await settle()
        await scripts["a2"].links[-1].die()
        await settle()
    lines = {(line["event"], line.get("server")): line for line in captured}
    for event in ("server.started", "server.ready", "server.retired", "server.down"):
        assert (event, "a") in lines, event
    assert ("server.retired", "b") in lines and ("server.ready", "c") in lines
    assert [line for line in captured if "session" in line and "server" in line] == []
