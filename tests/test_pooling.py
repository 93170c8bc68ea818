"""broker.pooling: which instance of a pool takes a request, and which a session is assigned."""

from __future__ import annotations

from typing import Any

import attrs
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.mailbox import SessionHandle
from actors.server_actor import ClientRequest, UpstreamStatistics
from actors.sharing import PooledServer
from broker.config import BrokerSettings, ServerConfig
from broker.pooling import (
    PINNED,
    InstanceFacts,
    PoolRouting,
    Route,
    least_loaded,
    owner,
    pinned,
    serving,
)
from broker.states import ServerState

TOOLS = frozenset({"a", "b"})


def up(load: int = 0, tools: frozenset[str] | None = TOOLS) -> InstanceFacts:
    return InstanceFacts(True, load, tools)


def down(load: int = 0, tools: frozenset[str] | None = TOOLS) -> InstanceFacts:
    return InstanceFacts(False, load, tools)


def given_up() -> InstanceFacts:
    """An instance that failed (its process gone, until a retry)."""
    return InstanceFacts(ready=False, load=0, tools=TOOLS, failed=True)


# -- which instances serve ------------------------------------------------------


def test_every_ready_instance_serves_in_pool_order() -> None:
    assert serving([up(), up(), up()]) == [0, 1, 2]


def test_an_instance_that_is_not_ready_serves_nothing() -> None:
    assert serving([up(), down(), up()]) == [0, 2]
    assert serving([down(), up()]) == [1]


def test_an_instance_missing_a_tool_the_catalog_shows_serves_nothing() -> None:
    assert serving([up(), up(tools=frozenset({"a"})), up(tools=TOOLS | {"c"})]) == [0, 2]


def test_tools_not_known_yet_do_not_hold_an_instance_back() -> None:
    assert serving([up(tools=None), up(tools=frozenset())]) == [0, 1]  # the catalog's not listed
    assert serving([up(), up(tools=None)]) == [0, 1]  # that instance has not listed its own


def test_when_none_serves_the_catalog_instance_takes_the_call() -> None:
    assert serving([down(), down()]) == [0]
    assert serving([down(), up(tools=frozenset())]) == [0]


# -- where a request goes -------------------------------------------------------


def test_a_request_goes_to_the_least_loaded_serving_instance() -> None:
    routing = PoolRouting()
    assert routing.pick("s", "tools/call", [up(3), up(1), up(2)]) == 1
    assert routing.pick("s", "tools/call", [up(3), down(0), up(2)]) == 2


def test_a_tie_goes_to_the_first() -> None:
    assert least_loaded([up(2), up(1), up(1)]) == 1
    assert least_loaded([up(0), up(0)]) == 0


def test_subscriptions_stick_to_the_sessions_instance_whatever_the_load() -> None:
    routing = PoolRouting()
    pool = [up(), up(), up()]
    routing.attach("s1", pool)
    assert routing.attach("s2", pool) == 1
    busy = [up(0), up(50), up(0)]
    for method in PINNED:
        assert routing.pick("s2", method, busy) == 1
    assert routing.pick("s2", "tools/call", busy) == 0  # the rest goes by load
    assert routing.pick("s2", "resources/read", busy) == 0


def test_a_subscription_of_a_session_never_assigned_goes_by_load() -> None:
    assert PoolRouting().pick("nobody", "resources/subscribe", [up(5), up(1)]) == 1


def test_a_departed_session_has_no_instance_any_more() -> None:
    routing = PoolRouting()
    pool = [up(), up()]
    routing.attach("s", pool)
    routing.detach("s")
    routing.detach("s")  # (twice is harmless)
    assert routing.assigned("s") is None
    assert routing.pick("s", "resources/subscribe", [up(5), up(1)]) == 1


# -- which instance a session is assigned ---------------------------------------


def test_sessions_are_spread_over_the_serving_instances() -> None:
    routing = PoolRouting()
    pool = [up(), up(), up()]
    assert [routing.attach(f"s{i}", pool) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_a_session_is_not_assigned_an_instance_that_does_not_serve() -> None:
    routing = PoolRouting()
    pool = [up(), down(), up(tools=frozenset({"a"})), up()]
    assert [routing.attach(f"s{i}", pool) for i in range(4)] == [0, 3, 0, 3]


def test_a_departure_makes_room_on_its_instance() -> None:
    routing = PoolRouting()
    pool = [up(), up()]
    routing.attach("s0", pool)
    routing.attach("s1", pool)
    routing.detach("s0")
    assert routing.attach("s2", pool) == 0


def test_load_does_not_decide_an_assignment() -> None:
    routing = PoolRouting()
    assert routing.attach("s", [up(100), up(0)]) == 0


# -- properties -------------------------------------------------------------------

facts = st.builds(
    InstanceFacts,
    st.booleans(),
    st.integers(0, 20),
    st.one_of(st.none(), st.frozensets(st.sampled_from("abc"))),
)
pools = st.lists(facts, min_size=1, max_size=6)
methods = st.sampled_from(["tools/call", "resources/read", *sorted(PINNED)])
steps = st.lists(
    st.tuples(st.sampled_from(["attach", "detach", "pick"]), st.integers(0, 4), methods, pools),
    max_size=40,
)


def shows(catalog: InstanceFacts, instance: InstanceFacts) -> bool:
    return catalog.tools is None or instance.tools is None or catalog.tools <= instance.tools


@given(pools)
def test_serving_is_what_the_rule_says(pool: list[InstanceFacts]) -> None:
    chosen = serving(pool)
    wanted = [i for i, f in enumerate(pool) if f.ready and shows(pool[0], f)]
    assert chosen == (wanted or [0])


@given(steps)
def test_routing_keeps_its_rules(ops: list[tuple[str, int, str, list[InstanceFacts]]]) -> None:
    # Pools of one size throughout, as a pool's size is fixed.
    size = len(ops[0][3]) if ops else 1
    routing = PoolRouting()
    model: dict[str, int] = {}
    for op, who, method, pool in ops:
        pool = (pool * size)[:size]
        session = f"s{who}"
        if op == "attach" and session in model:  # (assigned already: it keeps it)
            assert routing.attach(session, pool) == model[session]
        elif op == "attach":
            counts = [list(model.values()).count(i) for i in range(size)]
            choice = routing.attach(session, pool)
            assert choice in serving(pool)
            assert counts[choice] == min(counts[i] for i in serving(pool))
            model[session] = choice
        elif op == "detach":
            routing.detach(session)
            model.pop(session, None)
        else:
            choice = routing.pick(session, method, pool)
            if method in PINNED and session in model:
                assert choice == model[session]
            else:
                assert choice in serving(pool)
                assert pool[choice].load == min(pool[i].load for i in serving(pool))
        assert routing.assigned(session) == model.get(session)


# -- tasks on a pool (a task lives in one instance's process) -------------------


def test_a_task_request_goes_to_the_instance_that_made_the_task() -> None:
    routing = PoolRouting()
    routing.attach("a", [up(), up()])  # (instance 0)
    # Instance 1 made the task: it takes the request, whatever the load or the session's.
    assert routing.pick("a", "tasks/get", [up(), up(load=5)], owner=1) == 1
    assert routing.pick("a", "tasks/result", [up(load=5), up()], owner=0) == 0


def test_a_sessions_task_calls_and_task_list_stick_to_its_instance() -> None:
    routing = PoolRouting()
    routing.attach("a", [up(), up()])
    routing.attach("b", [up(), up()])  # (instance 1)
    task_call = {"method": "tools/call", "params": {"name": "t", "task": {}}}
    plain_call = {"method": "tools/call", "params": {"name": "t"}}
    assert pinned(task_call) and not pinned(plain_call)
    assert pinned({"method": "tasks/list"})
    busy_one = [up(), up(load=5)]
    assert routing.pick("b", "tools/call", busy_one, pinned=pinned(task_call)) == 1
    assert routing.pick("b", "tasks/list", busy_one) == 1
    assert routing.pick("b", "tools/call", busy_one, pinned=pinned(plain_call)) == 0


@attrs.define
class FakeInstance:
    """What a PooledServer sees of an instance: state, load, tools, tasks."""

    tasks: set[tuple[object, str]] = attrs.Factory(set)
    got: list[object] = attrs.Factory(list)
    status: ServerState = ServerState.READY
    load: int = 0
    tools: frozenset[str] | None = None
    states: set[str] = attrs.Factory(set)  # the requestStates it gave

    def owns_task(self, session: object, task_id: object) -> bool:
        return (session, task_id) in self.tasks

    def mints(self, state: object) -> bool:
        return state in self.states

    async def send(self, item: object) -> None:
        self.got.append(item)


async def test_a_pool_sends_a_task_request_to_the_instance_that_made_the_task() -> None:
    pool = PooledServer("pl", ServerConfig(command="x", pool=2), BrokerSettings())
    fakes = [FakeInstance(), FakeInstance(load=3)]
    pool._pool = fakes  # type: ignore[assignment]
    outbox, _ = trio.open_memory_channel[Any](1)
    session = SessionHandle(outbox, trio.CancelScope())
    fakes[1].tasks.add((session, "t1"))
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"taskId": "t1"}}
        await pool.send(ClientRequest(session, [request], 10))
    assert fakes[0].got == []  # (the least loaded, which knows nothing of t1)
    assert [item.messages[0]["method"] for item in fakes[1].got] == [  # type: ignore[attr-defined]
        "tasks/get",
        "tasks/result",
        "tasks/cancel",
    ]


async def test_a_pool_sends_a_modern_retry_to_the_instance_that_made_its_state() -> None:
    # (Only that instance's process can read its requestState: the SDK's
    # server refuses another's, -32602.)
    pool = PooledServer("pl", ServerConfig(command="x", pool=2), BrokerSettings())
    fakes = [FakeInstance(), FakeInstance(load=3)]
    pool._pool = fakes  # type: ignore[assignment]
    outbox, _ = trio.open_memory_channel[Any](1)
    session = SessionHandle(outbox, trio.CancelScope())
    fakes[1].states.add("blob-1")
    params = {"name": "ask", "requestState": "blob-1", "inputResponses": {}}
    retry = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
    await pool.send(ClientRequest(session, [retry], 10))
    assert fakes[0].got == []  # (the least loaded, which never saw blob-1)
    assert [item.messages[0]["id"] for item in fakes[1].got] == [2]  # type: ignore[attr-defined]
    other = {**retry, "id": 3, "params": {**params, "requestState": "unknown"}}
    await pool.send(ClientRequest(session, [other], 10))  # (no instance made it: by load)
    assert [item.messages[0]["id"] for item in fakes[0].got] == [3]  # type: ignore[attr-defined]


def test_instances_that_swap_places_take_their_sessions_along() -> None:
    routing = PoolRouting()
    for session in "abc":
        routing.attach(session, [up(), up(), up()])  # (0, 1, 2)
    routing.swap(0, 2)
    assert [routing.assigned(s) for s in "abc"] == [2, 1, 0]


def test_a_session_whose_instance_failed_is_moved_to_one_that_serves() -> None:
    routing = PoolRouting()
    routing.attach("a", [up(), up()])
    routing.attach("b", [up(), up()])  # (instance 1)
    failed = given_up()
    assert routing.pick("b", "resources/subscribe", [up(), failed]) == 0
    assert routing.assigned("b") == 0  # (its unsubscribe follows it there)
    # Restarting is not failed: the session waits for its instance.
    routing.attach("c", [down(), up()])
    assert routing.pick("c", "resources/subscribe", [up(), down()]) == 1
    # Every one failed: it stays (the instance answers as a failed server does).
    failed_too = attrs.evolve(failed)
    assert routing.pick("c", "resources/subscribe", [failed_too, failed]) == 1
    # One restarting (it comes back), the session's failed: it moves there.
    assert routing.pick("c", "resources/subscribe", [down(), failed]) == 0


def test_a_session_handed_an_instance_keeps_it_when_it_attaches() -> None:
    routing = PoolRouting()
    routing.assign("a", 1)  # (a reload: its subscriptions are there)
    assert routing.attach("a", [up(), up()]) == 1
    assert routing.pick("a", "resources/unsubscribe", [up(), up()]) == 1
    assert routing.attach("b", [up(), up()]) == 0


@attrs.define(eq=False)
class Figures:
    """An instance as statistics see it."""

    figures: UpstreamStatistics

    def statistics(self) -> UpstreamStatistics:
        return self.figures


def figures(
    status: str, pid: int, error: str | None = None, in_flight: int = 0, waiting: int = 0
) -> UpstreamStatistics:
    state = "ready" if status == "ready" else "restarting"
    return UpstreamStatistics(
        "pl", status, state, pid, 0, 1, in_flight, 0, error, waiting=waiting, pids=(pid,)
    )


def test_a_pools_row_shows_a_ready_instance_while_the_catalog_one_restarts() -> None:
    pool = PooledServer("pl", ServerConfig(command="x", pool=2), BrokerSettings())
    catalog = Figures(figures("down", 11, "exited with 1"))
    ready = Figures(figures("ready", 22, in_flight=2, waiting=3))
    pool._catalog = catalog  # type: ignore[assignment]
    pool._scopes = {catalog: trio.CancelScope(), ready: trio.CancelScope()}  # type: ignore[dict-item]
    row = pool.statistics()
    assert (row.status, row.state, row.pid) == ("ready", "ready", 22)
    assert row.last_error == "exited with 1"  # (what happened to the other one)
    assert (row.pids, row.instances, row.in_flight, row.waiting) == ((11, 22), 2, 2, 3)
    catalog.figures = figures("ready", 11)
    assert (pool.statistics().pid, pool.statistics().last_error) == (11, None)
    ready.figures = figures("down", 22)
    catalog.figures = figures("down", 11)
    assert (pool.statistics().status, pool.statistics().pid) == ("down", 11)


class Moving:
    """What a group's catalog watcher uses of an instance, with Upstream's events."""

    def __init__(self, status: ServerState) -> None:
        self.status = status
        self.events: object = None
        self.tools = None
        self.load = 0
        self._changed = trio.Event()

    async def wait_status_changed(self) -> None:
        await self._changed.wait()

    def status_event(self) -> trio.Event:
        return self._changed

    def move(self, status: ServerState) -> None:  # (as Upstream._set_status)
        self.status = status
        self._changed.set()
        self._changed = trio.Event()

    def statistics(self) -> UpstreamStatistics:
        return figures("down", 1, "crash loop")

    def announce(self) -> None:
        pass


async def test_the_catalog_goes_to_an_instance_that_becomes_ready_as_the_watcher_looks(
    autojump_clock: Any,
) -> None:
    """The catalog instance has failed and the other is warming up; it becomes
    ready just after the watcher looked. The watcher sees it (it missed it about
    one time in two: each waiting task read the instance's event only when it
    first ran, by then the one after the move)."""
    for _ in range(30):  # (trio runs a batch in either order: both are met)
        pool = PooledServer("pl", ServerConfig(command="x", pool=2), BrokerSettings())
        catalog, other = Moving(ServerState.FAILED), Moving(ServerState.WARMING)
        pool._catalog = pool._pool[0] = catalog  # type: ignore[assignment]
        pool._pool[1] = other  # type: ignore[call-overload]
        pool._scopes = {catalog: trio.CancelScope(), other: trio.CancelScope()}  # type: ignore[dict-item]

        async def warm_up(other: Moving = other) -> None:
            await trio.lowlevel.checkpoint()
            other.move(ServerState.READY)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool._watch_catalog)
            nursery.start_soon(warm_up)
            with trio.move_on_after(5):
                while pool._catalog is not other:
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        assert pool._catalog is other


def test_a_task_call_goes_by_load_when_the_sessions_instance_does_not_serve() -> None:
    """A session's instance re-listed and lacks a tool the catalog shows: its
    task calls go to one that serves (it was refused -32602 while another
    could serve it); its tasks/list and subscriptions stay there; an
    instance only coming up keeps its session's task calls."""
    routing = PoolRouting()
    routing.attach("s0", [up(), up()])
    routing.attach("s1", [up(), up()])  # (instance 1)
    lacking = [up(), up(tools=frozenset({"a"}))]
    call = {"method": "tools/call", "params": {"name": "b", "task": {}}}
    assert routing.pick("s1", "tools/call", lacking, pinned=pinned(call)) == 0
    assert routing.pick("s1", "tasks/list", lacking) == 1
    assert routing.pick("s1", "resources/subscribe", lacking) == 1
    assert routing.assigned("s1") == 1  # (it is not moved)
    assert routing.pick("s1", "tools/call", [up(load=5), down()], pinned=pinned(call)) == 1


def test_a_session_handed_a_failed_instance_is_moved_all_the_same() -> None:
    """A reload handed the session an instance that has failed before the
    session attached: its subscription request moves it to one that serves
    (it was 'moved' back to the failed one: attach kept what was handed)."""
    routing = PoolRouting()
    routing.assign("a", 1)
    failed = given_up()
    assert routing.pick("a", "resources/subscribe", [up(), failed]) == 0
    assert routing.assigned("a") == 0


def test_a_session_moved_before_it_attached_keeps_the_instance_it_moved_to() -> None:
    """Handed a failed instance by a reload, the session's subscription moved
    it (to 1) before it attached; attaching keeps it there, where it
    subscribed, rather than choosing again (by then 2, with no session)."""
    routing = PoolRouting()
    routing.attach("other", [up(), up(), up()])  # (instance 0)
    routing.assign("a", 0)
    assert routing.pick("a", "resources/subscribe", [given_up(), up(), up()]) == 1
    assert routing.attach("a", [up(), up(), up()]) == 1
    assert routing.pick("a", "resources/unsubscribe", [up(), up(), up()]) == 1


def test_the_owner_is_the_instance_that_made_the_task_or_the_request_state() -> None:
    made = [FakeInstance(), FakeInstance(tasks={("s", "t1")}, states={"blob"})]
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        assert owner("s", {"method": method, "params": {"taskId": "t1"}}, made) == 1
        assert owner("other", {"method": method, "params": {"taskId": "t1"}}, made) is None
        assert owner("s", {"method": method}, made) is None
    for method in ("tools/call", "prompts/get", "resources/read"):
        assert owner("s", {"method": method, "params": {"requestState": "blob"}}, made) == 1
        assert owner("s", {"method": method, "params": {"requestState": "x"}}, made) is None
        assert owner("s", {"method": method, "params": {"name": "t"}}, made) is None
    assert owner("s", {"method": "tasks/list", "params": {"taskId": "t1"}}, made) is None


def test_a_route_names_the_failed_instance_a_session_was_moved_off() -> None:
    routing = PoolRouting()
    routing.attach("a", [up(), up()])
    routing.attach("b", [up(), up()])  # (instance 1)
    subscribe = {"method": "resources/subscribe", "params": {"uri": "u"}}
    nothing = [FakeInstance(), FakeInstance()]
    assert routing.route("b", subscribe, [up(), up()], nothing) == Route(1)
    assert routing.route("b", subscribe, [up(), given_up()], nothing) == Route(0, left=1)
    assert routing.route("b", subscribe, [up(), up()], nothing) == Route(0)
    made = [FakeInstance(), FakeInstance(tasks={("a", "t")})]
    get = {"method": "tasks/get", "params": {"taskId": "t"}}
    assert routing.route("a", get, [up(), up(load=9)], made) == Route(1)
    assert routing.route("nobody", subscribe, [up(3), up()], made) == Route(1)
