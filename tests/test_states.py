"""The lifecycle tables (broker/states.py), and the objects and actors that move by them."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio
import trio.lowlevel
from hypothesis import given
from hypothesis import strategies as st

from actors.links.link import LaunchError, LinkContext
from actors.server_actor import ServerEvent
from actors.upstream import Upstream
from broker import jsonrpc
from broker.catalog import Catalog, ServerEntry, not_serving_message
from broker.config import BrokerSettings, ServerConfig
from broker.jsonrpc import CONNECTION_CLOSED, JsonRpcError
from broker.session import Reply, SessionProtocol
from broker.states import (
    COMING_UP,
    DOWN,
    SERVER_TRANSITIONS,
    SESSION_TRANSITIONS,
    STATUS,
    LifecycleError,
    ServerState,
    ServerTrigger,
    SessionState,
    SessionTrigger,
    next_server_state,
    next_session_state,
)
from broker.upstream import HANDSHAKE_ID, Ready, UpstreamProtocol
from tests.scripted import ScriptedServer

S, T = ServerState, ServerTrigger
C, E = SessionState, SessionTrigger

# The tables as the theory of operation states them, written out again.
SERVER_MOVES = [
    (S.IDLE, T.START_REQUESTED, S.STARTING),
    (S.STARTING, T.LAUNCHED, S.INITIALIZING),
    (S.STARTING, T.ENDED, S.RESTARTING),
    (S.STARTING, T.UNREACHABLE, S.FAILED),
    (S.INITIALIZING, T.HANDSHAKE_DONE, S.READY),
    (S.INITIALIZING, T.WARM_UP, S.WARMING),
    (S.INITIALIZING, T.ENDED, S.RESTARTING),
    (S.WARMING, T.WARMED, S.READY),
    (S.WARMING, T.ENDED, S.RESTARTING),
    (S.READY, T.ENDED, S.RESTARTING),
    (S.RESTARTING, T.ENDED, S.RESTARTING),
    (S.RESTARTING, T.BACKOFF_ELAPSED, S.STARTING),
    (S.RESTARTING, T.GAVE_UP, S.FAILED),
    (S.FAILED, T.RETRY, S.STARTING),
    *[(state, T.STOP, S.STOPPED) for state in S if state is not S.STOPPED],
]
SESSION_MOVES = [
    (C.CONNECTING, E.INITIALIZED, C.OPERATING),
    (C.CONNECTING, E.CLIENT_CLOSED, C.CLOSING),
    (C.OPERATING, E.CLIENT_CLOSED, C.CLOSING),
    (C.CONNECTING, E.ENDED, C.CLOSED),
    (C.OPERATING, E.ENDED, C.CLOSED),
    (C.CLOSING, E.ENDED, C.CLOSED),
    (C.ERROR, E.ENDED, C.ERROR),
    *[(state, E.FAILED, C.ERROR) for state in C],
]
SERVER_ILLEGAL = [
    (state, trigger)
    for state, trigger in itertools.product(S, T)
    if (state, trigger) not in SERVER_TRANSITIONS
]
SESSION_ILLEGAL = [
    (state, trigger)
    for state, trigger in itertools.product(C, E)
    if (state, trigger) not in SESSION_TRANSITIONS
]


class Snapshot:
    def __init__(self, catalog: Catalog) -> None:
        self.current = catalog


class Broken:
    """A catalog source that fails: a bug of the broker's, as the session sees it."""

    @property
    def current(self) -> Catalog:
        raise RuntimeError("a bug")


def server_protocol(state: ServerState) -> UpstreamProtocol:
    return UpstreamProtocol("s", state=state)


def session_protocol(state: SessionState = C.CONNECTING, catalogs: Any = None) -> SessionProtocol:
    proto = SessionProtocol(("s",), catalogs or Snapshot(Catalog([ServerEntry("s", S.READY)])))
    proto.state = state
    return proto


# -- the tables ------------------------------------------------------------------


def test_the_tables_are_the_documented_ones() -> None:
    assert {(s, t): new for s, t, new in SERVER_MOVES} == SERVER_TRANSITIONS
    assert {(s, t): new for s, t, new in SESSION_MOVES} == SESSION_TRANSITIONS


@pytest.mark.parametrize(("state", "trigger", "new"), SERVER_MOVES)
def test_every_legal_server_move(state: ServerState, trigger: ServerTrigger, new: Any) -> None:
    assert next_server_state(state, trigger) is new
    proto = server_protocol(state)
    assert proto.move(trigger) is new and proto.state is new


@pytest.mark.parametrize(("state", "trigger", "new"), SESSION_MOVES)
def test_every_legal_session_move(state: SessionState, trigger: SessionTrigger, new: Any) -> None:
    assert next_session_state(state, trigger) is new
    proto = session_protocol(state)
    assert proto.move(trigger) is new and proto.state is new


@pytest.mark.parametrize(("state", "trigger"), SERVER_ILLEGAL)
def test_an_illegal_server_move_raises(state: ServerState, trigger: ServerTrigger) -> None:
    with pytest.raises(LifecycleError, match=f"is {state.value} cannot {trigger.value}"):
        next_server_state(state, trigger)
    proto = server_protocol(state)
    with pytest.raises(LifecycleError):
        proto.move(trigger)
    assert proto.state is state


@pytest.mark.parametrize(("state", "trigger"), SESSION_ILLEGAL)
def test_an_illegal_session_move_raises(state: SessionState, trigger: SessionTrigger) -> None:
    with pytest.raises(LifecycleError, match=f"is {state.value} cannot {trigger.value}"):
        next_session_state(state, trigger)
    proto = session_protocol(state)
    with pytest.raises(LifecycleError):
        proto.move(trigger)
    assert proto.state is state


def reachable(table: dict[tuple[Any, Any], Any], start: Any) -> set[Any]:
    seen, todo = {start}, [start]
    while todo:
        state = todo.pop()
        for (source, _), new in table.items():
            if source is state and new not in seen:
                seen.add(new)
                todo.append(new)
    return seen


def test_every_state_is_reachable_and_the_ends_are_ends() -> None:
    assert reachable(SERVER_TRANSITIONS, S.IDLE) == set(S)
    assert reachable(SESSION_TRANSITIONS, C.CONNECTING) == set(C)
    assert not any(source is S.STOPPED for source, _ in SERVER_TRANSITIONS)
    assert {new for (source, _), new in SESSION_TRANSITIONS.items() if source is C.ERROR} == {
        C.ERROR
    }
    assert {new for (source, _), new in SESSION_TRANSITIONS.items() if source is C.CLOSED} == {
        C.ERROR
    }


def test_every_server_state_is_coming_up_ready_or_down_and_has_a_status_word() -> None:
    assert set(COMING_UP) | {S.READY} | set(DOWN) == set(S)
    assert len(COMING_UP) + 1 + len(DOWN) == len(S)
    assert set(STATUS) == set(S)
    assert set(STATUS.values()) == {"idle", "starting", "ready", "down"}  # as before the table
    assert {STATUS[s] for s in COMING_UP if s is not S.IDLE} == {"starting"}
    assert {STATUS[s] for s in DOWN} == {"down"}
    assert (STATUS[S.IDLE], STATUS[S.READY]) == ("idle", "ready")


@given(st.lists(st.sampled_from(list(T)), max_size=40))
def test_random_server_triggers_move_by_the_table_or_raise(triggers: list[ServerTrigger]) -> None:
    proto = server_protocol(S.IDLE)
    state = S.IDLE
    for trigger in triggers:
        expected = SERVER_TRANSITIONS.get((state, trigger))
        if expected is None:
            with pytest.raises(LifecycleError):
                proto.move(trigger)
        else:
            assert proto.move(trigger) is expected
            if expected is S.READY:  # only through the handshake
                assert state in (S.INITIALIZING, S.WARMING)
            state = expected
        assert proto.state is state
        assert proto.restarted().state is state  # a new process keeps it


@given(st.lists(st.sampled_from(list(E)), max_size=40))
def test_random_session_triggers_move_by_the_table_or_raise(
    triggers: list[SessionTrigger],
) -> None:
    proto = session_protocol()
    state = C.CONNECTING
    for trigger in triggers:
        expected = SESSION_TRANSITIONS.get((state, trigger))
        if expected is None:
            with pytest.raises(LifecycleError):
                proto.move(trigger)
        else:
            assert proto.move(trigger) is expected
            state = expected
        assert proto.state is state
        if state is C.ERROR:  # nothing leaves it
            assert all(SESSION_TRANSITIONS.get((state, t), C.ERROR) is C.ERROR for t in E)


# -- the server connection's moves in its protocol -------------------------------

INIT = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {}}


def test_the_handshake_makes_it_ready() -> None:
    proto = server_protocol(S.STARTING)
    proto.move(T.LAUNCHED)
    proto.start()
    assert proto.state is S.INITIALIZING
    actions = proto.server_message(jsonrpc.result_response(HANDSHAKE_ID, INIT))
    assert isinstance(actions[-1], Ready) and proto.state is S.READY


def test_a_warm_up_instance_warms_then_is_ready() -> None:
    proto = UpstreamProtocol("s", warm_up=True, state=S.INITIALIZING)
    actions = proto.server_message(jsonrpc.result_response(HANDSHAKE_ID, INIT))
    assert proto.state is S.WARMING and not any(isinstance(a, Ready) for a in actions)
    assert isinstance(proto.warm_up_expired()[-1], Ready) and proto.state is S.READY


@pytest.mark.parametrize(("trigger", "state"), [(T.ENDED, S.RESTARTING), (T.UNREACHABLE, S.FAILED)])
def test_a_server_that_cannot_start_is_restarting_or_failed(
    trigger: ServerTrigger, state: ServerState
) -> None:
    proto = server_protocol(S.STARTING)
    assert proto.server_gone("could not be started", trigger) == []
    assert proto.state is state
    with pytest.raises(JsonRpcError) as info:
        proto.client_request("a", {"jsonrpc": "2.0", "id": 1, "method": "tools/call"})
    assert info.value.code == CONNECTION_CLOSED


# -- the catalog reads the same state --------------------------------------------


@pytest.mark.parametrize(
    ("entry", "settled", "serving"),
    [
        (ServerEntry("s", S.READY), True, True),
        (ServerEntry("s", S.READY, loading=True), False, False),  # its lists are on the way
        *[(ServerEntry("s", state), False, False) for state in COMING_UP],
        *[(ServerEntry("s", state), True, False) for state in DOWN],
    ],
)
def test_a_catalog_entry_is_settled_when_served_or_down(
    entry: ServerEntry, settled: bool, serving: bool
) -> None:
    assert (entry.settled, entry.serving) == (settled, serving)
    assert Catalog([entry]).settled(("s",)) is settled


def test_a_failed_server_is_not_running() -> None:
    entry = ServerEntry("s", S.FAILED, error="has no command to start")
    assert (
        not_serving_message(entry) == "MCP server 's' is not running (it has no command to start)"
    )


# -- the session's moves in its protocol -----------------------------------------

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}},
}


def test_initialize_makes_a_session_operating() -> None:
    proto = session_protocol()
    proto.receive(INITIALIZE, settled=True)
    assert proto.state is C.OPERATING


def test_a_bug_inside_the_session_moves_it_to_error_and_it_refuses_further_use() -> None:
    proto = session_protocol(catalogs=Broken())
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    assert proto.receive(ping) == [Reply(jsonrpc.result_response(2, {}))]  # (no catalog)
    with pytest.raises(RuntimeError, match="a bug"):
        proto.receive(INITIALIZE)
    assert proto.state is C.ERROR
    with pytest.raises(LifecycleError, match="error"):
        proto.receive(ping)
    with pytest.raises(LifecycleError):
        proto.take_outgoing([jsonrpc.result_response(2, {})], [])
    assert proto.take_forwards([b'{"jsonrpc":"2.0","id":3,"method":"ping"}'], 0, {}) == 0
    proto.move(E.ENDED)
    assert proto.state is C.ERROR


def test_a_bug_in_a_batch_item_moves_the_session_to_error() -> None:
    proto = session_protocol(C.OPERATING, catalogs=Broken())
    proto.protocol_version = "2025-03-26"
    with pytest.raises(RuntimeError):
        proto.receive([{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}])
    assert proto.state is C.ERROR


def test_a_closing_session_still_writes_answers_and_a_closed_one_nothing() -> None:
    proto = session_protocol()
    proto.receive(INITIALIZE, settled=True)
    proto.move(E.CLIENT_CLOSED)
    out: list[Any] = []
    proto.take_outgoing([jsonrpc.result_response(5, {})], out)
    assert out == [jsonrpc.result_response(5, {})]
    proto.move(E.ENDED)
    assert proto.state is C.CLOSED
    with pytest.raises(LifecycleError, match="closed"):
        proto.take_outgoing([jsonrpc.result_response(6, {})], [])
    with pytest.raises(LifecycleError):
        proto.receive({"jsonrpc": "2.0", "id": 7, "method": "ping"})


# -- the Upstream actor tells the Registry every move it makes -------------------

SETTINGS = BrokerSettings()


def upstream(launch: Any, *, lazy: bool = False) -> tuple[Upstream, Any]:
    send, receive = trio.open_memory_channel[ServerEvent](100)
    up = Upstream("s", ServerConfig(command="scripted"), SETTINGS, launch, lazy=lazy, events=send)
    return up, receive


def told(receive: Any) -> list[ServerState]:
    out = []
    while True:
        try:
            event = receive.receive_nowait()
        except trio.WouldBlock:
            return out
        if event.status is not None:
            out.append(event.status)


async def test_an_upstream_moves_through_start_ready_restart_and_stop(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery)
    up, receive = upstream(script.launch, lazy=True)
    assert up.status is S.IDLE and up.statistics().status == "idle"
    async with trio.open_nursery() as own:
        own.start_soon(up.run)
        await trio.sleep(1)
        assert up.status is S.IDLE and told(receive) == []  # nobody needed it
        up.request_start()
        await up.wait_ready()
        assert told(receive) == [S.STARTING, S.INITIALIZING, S.READY]
        assert (up.statistics().status, up.statistics().state) == ("ready", "ready")
        await script.links[-1].die()
        while up.status is S.READY:
            await trio.sleep(0.01)
        assert up.status is S.RESTARTING
        assert (up.statistics().status, up.statistics().state) == ("down", "restarting")
        await up.wait_ready()
        assert told(receive) == [S.RESTARTING, S.STARTING, S.INITIALIZING, S.READY]
        own.cancel_scope.cancel()
    assert up.status is S.STOPPED and told(receive) == [S.STOPPED]


async def test_an_upstream_that_cannot_be_reached_has_failed(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    async def unreachable(context: LinkContext) -> Any:
        raise LaunchError("has no command to start")

    up, receive = upstream(unreachable)
    assert up.status is S.STARTING
    nursery.start_soon(up.run)
    await trio.sleep(60)
    assert up.status is S.FAILED and told(receive) == [S.FAILED]
    stats = up.statistics()
    assert (stats.status, stats.state, stats.restarts) == ("down", "failed", 0)
    assert stats.last_error == "has no command to start"


async def test_a_launch_that_raises_anything_fails_that_server_alone(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    # (a library's refusal no check foresaw: httpx's UnicodeEncodeError on a
    # header, open_process's ValueError on a NUL; it killed the daemon)
    async def refused(context: LinkContext) -> Any:
        raise ValueError("embedded null byte")

    up, _ = upstream(refused)
    nursery.start_soon(up.run)
    await trio.sleep(60)
    assert up.status is S.FAILED
    assert up.statistics().last_error == "could not be started (ValueError: embedded null byte)"


async def test_a_link_task_that_raises_restarts_that_server_alone(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    launches = 0

    async def broken(context: LinkContext) -> Any:
        nonlocal launches
        launches += 1

        async def fail() -> None:
            raise UnicodeEncodeError("ascii", "\u2019", 0, 1, "ordinal not in range(128)")

        context.nursery.start_soon(fail)
        await trio.sleep_forever()

    up, _ = upstream(broken)
    nursery.start_soon(up.run)
    await trio.sleep(5)
    assert launches >= 2  # (restarted, with backoff)
    assert "UnicodeEncodeError" in (up.statistics().last_error or "")


async def test_a_cwd_that_does_not_exist_is_named_not_the_command(
    nursery: trio.Nursery, tmp_path: Any
) -> None:
    # (the message named the command, and docs/troubleshooting.md answered it
    # with "the command is not on the daemon's PATH")
    import functools
    import sys

    from actors.links.stdio import launch_stdio

    config = ServerConfig(command=sys.executable, cwd=str(tmp_path / "gone"))
    up = Upstream("s", config, SETTINGS, functools.partial(launch_stdio, config))
    with trio.fail_after(10):
        nursery.start_soon(up.run)
        while up.statistics().last_error is None:
            await trio.sleep(0.01)
    assert up.statistics().last_error == (
        f"could not be started (No such file or directory: its cwd {tmp_path / 'gone'})"
    )


# -- the Session actor moves its session -----------------------------------------


async def test_a_session_closes_once_its_client_left_and_its_answers_are_written(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    from tests.test_actors import call, open_client, start_upstream

    broker = await start_upstream(nursery, ScriptedServer(nursery))
    client = await open_client(nursery, broker)
    await client.initialize()
    protocol = client.session._protocol
    assert protocol.state is C.OPERATING
    await client.send({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": call("sleep")})
    await trio.sleep(0.5)
    await client.stream.send_eof()
    await trio.sleep(0.1)
    assert protocol.state is C.CLOSING  # its call is still in flight
    assert (await client.receive())["id"] == 9
    while protocol.state is C.CLOSING:
        await trio.sleep(0.1)
    assert protocol.state is C.CLOSED


def test_status_shows_the_state_behind_the_word() -> None:
    from cli.status import render

    counts = {"restarts": 0, "sessions": 0, "in_flight": 0, "requests": 0, "timeouts": 0}
    servers = [
        {"name": name, "status": STATUS[state], "state": state.value, "pid": None}
        | counts
        | {"last_error": None}
        for name, state in [("a", S.READY), ("b", S.RESTARTING), ("c", S.INITIALIZING)]
    ]
    text = render({"pid": 1, "socket": "/s", "uptime": 1, "servers": servers, "sessions": []})
    rows = {line.split()[0]: line for line in text.splitlines() if line}
    assert rows["a"].split()[1] == "ready"
    assert "  down (restarting)  " in rows["b"]
    assert "  starting (initializing)  " in rows["c"]
