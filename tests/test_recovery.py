"""Restarts and liveness (broker/recovery.py, docs/rules/restarts.md): the
rules alone, then the Upstream actor on memory streams under ``autojump_clock``
(backoff, jitter, attempts, crash loops, retries, pings)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from actors.links.link import LinkContext
from actors.links.stream import StreamLink
from actors.upstream import Upstream
from broker import jsonrpc
from broker.config import BrokerSettings, ConfigError, ServerConfig, parse_config
from broker.recovery import STABLE_AFTER, Liveness, RestartPolicy, Restarts
from broker.states import ServerState
from tests.scripted import ScriptedServer
from tests.test_actors import SETTINGS, Broker, call, open_client

# -- the rules -----------------------------------------------------------------


def test_the_backoff_doubles_up_to_its_maximum_with_equal_jitter() -> None:
    policy = RestartPolicy(delay=0.5, max_delay=4.0, attempts=0)
    low, high = Restarts(policy), Restarts(policy)
    assert [low.ended(None, 0.0) for _ in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert [high.ended(None, 0.999999) for _ in range(6)] == pytest.approx(
        [0.5, 1.0, 2.0, 4.0, 4.0, 4.0], rel=1e-5
    )


def test_a_stable_run_resets_the_backoff() -> None:
    restarts = Restarts(RestartPolicy(delay=1.0, max_delay=60.0, attempts=3))
    assert restarts.ended(None, 0.5) == 0.75
    assert restarts.ended(STABLE_AFTER - 0.1, 0.5) == 1.5  # ready, but not for long
    assert restarts.ended(STABLE_AFTER, 0.5) == 0.75  # stable: the first end again
    assert restarts.failures == 1


def test_attempts_in_a_row_then_it_is_given_up() -> None:
    restarts = Restarts(RestartPolicy(delay=1.0, max_delay=60.0, attempts=3))
    assert all(restarts.ended(None, 0.0) is not None for _ in range(3))
    assert restarts.ended(None, 0.0) is None  # the fourth end in a row: a crash loop
    restarts.reset()
    assert restarts.ended(None, 0.0) == 0.5


def test_zero_attempts_never_gives_up() -> None:
    restarts = Restarts(RestartPolicy(delay=1.0, max_delay=2.0, attempts=0))
    delays = [restarts.ended(None, 0.5) for _ in range(1000)]
    assert None not in delays and delays[-1] == 1.5


def test_liveness_counts_silent_intervals_in_a_row() -> None:
    liveness = Liveness(3)
    assert not liveness.tick(heard=False)  # nothing was pinged yet: no miss
    assert not liveness.tick(heard=False)
    assert not liveness.tick(heard=False)
    assert not liveness.tick(heard=True)  # a word from it: the count starts again
    assert [liveness.tick(heard=False) for _ in range(3)] == [False, False, True]
    assert liveness.misses == 3


def test_the_policy_takes_the_servers_keys_then_the_brokers() -> None:
    config = parse_config(
        {
            "mcpServers": {
                "own": {"command": "x", "restartDelay": 2, "pingInterval": 0, "pingMisses": 5},
                "default": {"command": "x"},
            },
            "broker": {"restartAttempts": 2, "pingInterval": None, "retryFailedAfter": 0},
        }
    )
    own = RestartPolicy.for_server(config.servers["own"], config.broker)
    default = RestartPolicy.for_server(config.servers["default"], config.broker)
    assert own == RestartPolicy(2.0, 30.0, 2, 0.0, 0.0, 5)
    assert default == RestartPolicy(0.5, 30.0, 2, 0.0, 0.0, 3)
    plain = parse_config({"mcpServers": {"s": {"command": "x"}}})
    assert RestartPolicy.for_server(plain.servers["s"], plain.broker) == RestartPolicy()


@pytest.mark.parametrize(
    ("entry", "broker", "key"),
    [
        ({"restartDelay": 0}, {}, "mcpServers.s.restartDelay"),
        ({"restartDelay": 5, "restartMaxDelay": 1}, {}, "mcpServers.s.restartMaxDelay"),
        ({"restartAttempts": -1}, {}, "mcpServers.s.restartAttempts"),
        ({"pingInterval": -1}, {}, "mcpServers.s.pingInterval"),
        # (floors: they spun the daemon)
        ({"restartDelay": 1e-9}, {}, "mcpServers.s.restartDelay"),
        ({"pingInterval": 1e-9}, {}, "mcpServers.s.pingInterval"),
        ({}, {"restartDelay": 0.001}, "broker.restartDelay"),
        ({"pingMisses": 0}, {}, "mcpServers.s.pingMisses"),
        ({}, {"retryFailedAfter": -1}, "broker.retryFailedAfter"),
        ({}, {"restartAttempts": 1.5}, "broker.restartAttempts"),
    ],
)
def test_bad_recovery_keys_are_refused_by_name(
    entry: dict[str, Any], broker: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config({"mcpServers": {"s": {"command": "x", **entry}}, "broker": broker})


# -- the actor -------------------------------------------------------------------


def settings(**changes: Any) -> BrokerSettings:
    return attrs.evolve(SETTINGS, **changes)


class Crashing:
    """A server that exits right after it starts (its first ``good`` starts aside)."""

    def __init__(self, nursery: trio.Nursery, good: int = 0) -> None:
        self.script = ScriptedServer(nursery)
        self.good = good
        self.launched_at: list[float] = []

    async def launch(self, context: LinkContext) -> StreamLink:
        self.launched_at.append(trio.current_time())
        link = await self.script.launch(context)
        if len(self.launched_at) > self.good:
            await self.script.links[-1].die(3)
        return link

    def gaps(self) -> list[float]:
        times = self.launched_at
        return [later - earlier for earlier, later in itertools.pairwise(times)]


async def start(
    nursery: trio.Nursery, launch: Any, broker: BrokerSettings, config: ServerConfig | None = None
) -> Upstream:
    upstream = Upstream("s", config or ServerConfig(command="scripted"), broker, launch=launch)
    upstream._random = random.Random(7)
    await nursery.start(upstream.run)
    return upstream


async def serve(nursery: trio.Nursery, launch: Any, broker: BrokerSettings) -> tuple[Upstream, Any]:
    """An Upstream, its Registry and one client session (transparent)."""
    upstream = Upstream("s", ServerConfig(command="scripted"), broker, launch=launch)
    served = Broker({"s": upstream})
    await nursery.start(served.registry.run)
    client = await open_client(nursery, served, settings=broker)
    await nursery.start(upstream.run)
    await client.initialize()
    return upstream, client


async def wait_state(upstream: Upstream, state: ServerState) -> None:
    while upstream.status is not state:
        await trio.sleep(0.01)


async def test_a_crash_loop_backs_off_with_jitter_then_fails(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    crashing = Crashing(nursery)
    broker = settings(restart_delay=1.0, restart_max_delay=8.0, restart_attempts=5)
    upstream = await start(nursery, crashing.launch, broker)
    await wait_state(upstream, ServerState.FAILED)
    assert len(crashing.launched_at) == 6  # the first start and five restarts
    for gap, backoff in zip(crashing.gaps(), [1.0, 2.0, 4.0, 8.0, 8.0], strict=True):
        assert backoff / 2 <= gap <= backoff + 0.01  # (jitter: between half and all)
    assert (
        len(
            {
                round(gap / backoff, 3)
                for gap, backoff in zip(crashing.gaps(), [1, 2, 4, 8, 8], strict=True)
            }
        )
        > 1
    )
    stats = upstream.statistics()
    assert (stats.status, stats.state, stats.restarts) == ("down", "failed", 5)
    assert "with code 3" in stats.last_error and "5 restarts in a row" in stats.last_error
    await trio.sleep(599)  # nothing is started while it is failed
    assert len(crashing.launched_at) == 6
    await trio.sleep(2)  # retryFailedAfter (600 s): a new round of attempts
    assert len(crashing.launched_at) > 6


@pytest.mark.parametrize("steps", [0, 1, 5])
async def test_a_failed_server_a_reload_retries_then_retires_stops_quietly(
    nursery: trio.Nursery, autojump_clock: Any, steps: int
) -> None:
    """What a reload does to a failed server it removes or restarts: every
    failed server is retried, then this one retired and cancelled. Its
    supervisor, woken by the retry (and ``steps`` scheduling steps into a
    new launch), moves it nowhere: it raised LifecycleError out of the
    daemon's nursery (STOPPED cannot retry, or be launched), and the daemon
    ended."""
    crashing = Crashing(nursery)
    broker = settings(restart_delay=0.1, restart_max_delay=0.1, restart_attempts=2,
                      retry_failed_after=0.0)  # fmt: skip
    upstream = Upstream("s", ServerConfig(command="scripted"), broker, launch=crashing.launch)
    with trio.fail_after(60):
        async with trio.open_nursery() as own:
            await own.start(upstream.run)
            await wait_state(upstream, ServerState.FAILED)
            upstream.retry()
            for _ in range(steps):
                await trio.lowlevel.checkpoint()
            upstream.retire("was removed from the configuration")
            own.cancel_scope.cancel()
    assert upstream.status is ServerState.STOPPED


async def test_a_failed_server_is_retried_at_once_on_request(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    crashing = Crashing(nursery)
    broker = settings(restart_delay=0.1, restart_max_delay=0.1, restart_attempts=2,
                      retry_failed_after=0.0)  # fmt: skip
    upstream = await start(nursery, crashing.launch, broker)
    await wait_state(upstream, ServerState.FAILED)
    assert len(crashing.launched_at) == 3
    await trio.sleep(10_000)  # retryFailedAfter 0: only a retry (a reload) brings it back
    assert len(crashing.launched_at) == 3
    crashing.good = 10  # (fixed meanwhile)
    upstream.retry()
    await upstream.wait_ready()
    assert len(crashing.launched_at) == 4


async def test_a_server_that_ran_long_enough_is_restarted_after_the_first_delay(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    crashing = Crashing(nursery, good=1)
    broker = settings(restart_delay=2.0, restart_max_delay=60.0, restart_attempts=1)
    upstream = await start(nursery, crashing.launch, broker)
    await upstream.wait_ready()
    await trio.sleep(STABLE_AFTER + 1)
    crashing.good = 2  # it dies once, after a long run, and comes back
    await crashing.script.links[-1].die()
    await wait_state(upstream, ServerState.RESTARTING)
    await upstream.wait_ready()
    assert 1.0 <= crashing.gaps()[-1] - (STABLE_AFTER + 1) <= 2.01
    assert upstream.statistics().restarts == 1


async def test_a_silent_server_is_declared_dead_after_its_missed_pings(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery)
    upstream, client = await serve(nursery, script.launch, settings(ping_interval=5.0))
    await trio.sleep(60)  # a server that answers its pings is left alone
    assert script.launches == 1 and len(script.requests("ping")) >= 11
    script.silent = True  # (SIGSTOP)
    stopped_at = trio.current_time()
    await client.send({"jsonrpc": "2.0", "id": "x", "method": "tools/call", "params": call("echo")})
    error = await client.receive()
    assert error["id"] == "x" and error["error"]["data"] == {"server": "s", "retryable": True}
    assert "no answer to 3 pings" in error["error"]["message"]
    assert 3 * 5.0 <= trio.current_time() - stopped_at <= 4 * 5.0 + 1
    script.silent = False
    await upstream.wait_ready()
    assert script.launches == 2
    answer = await client.request("tools/call", call("echo", again=1))
    assert answer["result"]["echo"] == {"again": 1}


async def test_pings_use_ids_no_client_has_and_their_answers_reach_nobody(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery)
    _, client = await serve(nursery, script.launch, settings(ping_interval=1.0))
    for n in range(5):  # client ids that look like the broker's own
        sent = {"jsonrpc": "2.0", "id": f"mcpbroker-{n}", "method": "tools/call",
                "params": call("sleep", seconds=1.5, n=n)}  # fmt: skip
        await client.send(sent)
    answers = [await client.receive() for _ in range(5)]
    assert sorted(a["id"] for a in answers) == [f"mcpbroker-{n}" for n in range(5)]
    assert all(a["result"]["echo"]["n"] == int(a["id"][-1]) for a in answers)
    pings = script.requests("ping")
    assert pings and all(isinstance(p["id"], str) for p in pings)
    calls = script.requests("tools/call")
    assert all(type(c["id"]) is int for c in calls)  # (client requests are renumbered)
    await trio.sleep(3)
    assert client.others == [] and client._pending == []


async def test_no_pings_when_the_interval_is_zero(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery)
    upstream = await start(nursery, script.launch, settings(),
                           ServerConfig(command="scripted", ping_interval=0))  # fmt: skip
    await upstream.wait_ready()
    script.silent = True
    await trio.sleep(3600)
    assert script.requests("ping") == [] and script.launches == 1


async def test_a_restart_with_other_tools_tells_sessions_once(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery)
    _, client = await serve(nursery, script.launch, SETTINGS)
    await client.request("tools/list")
    script.tools.append({"name": "new", "inputSchema": {"type": "object"}})
    await script.links[-1].die()
    note = await client.receive()
    assert note == jsonrpc.notification("notifications/tools/list_changed")
    names = [t["name"] for t in (await client.request("tools/list"))["result"]["tools"]]
    assert "new" in names
    await trio.sleep(60)
    assert client.others == [] and client._pending == []  # once, and only for tools


async def test_a_launch_that_never_opens_is_given_up_at_the_startup_timeout(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """A link whose launch waits on the server (HTTP+SSE waits for its
    endpoint event) is bounded as a handshake is: down, said why, and
    started again with backoff. (It stayed "starting" for good.)"""
    launched: list[float] = []

    async def never(context: LinkContext) -> StreamLink:
        launched.append(trio.current_time())
        await trio.sleep_forever()
        raise AssertionError

    upstream = await start(nursery, never, settings(restart_delay=1.0, restart_max_delay=1.0))
    with trio.fail_after(120):
        while len(launched) < 2:
            await trio.sleep(1)
    assert launched[1] - launched[0] >= 30
    assert "did not open its connection within 30 s" in (upstream.statistics().last_error or "")
