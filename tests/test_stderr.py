"""A server's stderr reaches the log bounded: rate-limited, capped, counted."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from actors.stderr import BURST, LINE_SHOWN, RATE, REPORT_EVERY, LineBudget, pump_stderr


class RecordingLog:
    """The log the pump writes to, as a list of (event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))

    warning = info

    def events(self, name: str) -> list[dict[str, Any]]:
        return [fields for event, fields in self.lines if event == name]


def test_the_budget_allows_a_burst_then_a_rate() -> None:
    budget = LineBudget(burst=10, rate=2.0, now=0.0)
    assert budget.take(25, 0.0) == 10
    assert budget.take(25, 1.0) == 2
    assert budget.take(25, 100.0) == 10  # never more than a burst, however long the quiet


async def test_a_flood_is_read_to_its_end_and_counted(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    send, receive = trio.testing.memory_stream_pair()
    log = RecordingLog()
    done = trio.Event()

    async def pump() -> None:
        await pump_stderr(receive, log)
        done.set()

    nursery.start_soon(pump)
    line = b"e" * 99 + b"\n"
    chunk = line * 10_000  # 1 MB
    for _second in range(20):  # 100 MB in all, over 20 s
        for _ in range(5):
            await send.send_all(chunk)
        await trio.sleep(1)
    await send.aclose()
    await done.wait()
    shown = log.events("server.stderr")
    dropped = log.events("server.stderr_dropped")
    total = 20 * 5 * 10_000
    assert BURST <= len(shown) <= BURST + RATE * 21
    assert len(shown) + sum(d["lines"] for d in dropped) == total
    assert sum(d["bytes"] for d in dropped) == (total - len(shown)) * len(line)
    assert len(dropped) <= 20 / REPORT_EVERY + 2


async def test_a_long_line_is_shown_capped(nursery: trio.Nursery, autojump_clock: Any) -> None:
    send, receive = trio.testing.memory_stream_pair()
    log = RecordingLog()
    nursery.start_soon(pump_stderr, receive, log)
    await send.send_all(b"x" * 1_000_000 + b"\nshort\n")
    await send.aclose()
    await trio.testing.wait_all_tasks_blocked()
    (long, short) = log.events("server.stderr")
    assert len(long["line"]) < LINE_SHOWN and "(1000000 bytes)" in long["line"]
    assert short["line"] == "short"


# -- the fault-containing code paths log without raising -----------------------


async def test_a_registry_event_that_fails_is_logged_and_the_registry_goes_on(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    from actors.registry import Subscribe
    from tests.scripted import ScriptedServer
    from tests.test_actors import start_upstream

    broker = await start_upstream(nursery, ScriptedServer(nursery))
    registry = broker.registry
    handle = registry._handle
    failures = []

    def flaky(event: Any) -> None:
        if isinstance(event, Subscribe) and not failures:
            failures.append(event)
            raise RuntimeError("a bug in the registry")
        handle(event)

    registry._handle = flaky  # type: ignore[method-assign]
    first, second = object(), object()
    await registry.events.send(Subscribe(first, frozenset({"s"})))  # type: ignore[arg-type]
    await registry.events.send(Subscribe(second, frozenset({"s"})))  # type: ignore[arg-type]
    await trio.testing.wait_all_tasks_blocked()
    assert failures and second in registry._subscribers and first not in registry._subscribers


async def test_an_event_the_registry_has_no_room_for_is_logged_not_raised(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    from actors.upstream import Upstream
    from broker.config import ServerConfig
    from tests.scripted import ScriptedServer
    from tests.test_actors import SETTINGS

    full, _keep = trio.open_memory_channel[Any](0)  # nobody receives: every event is dropped
    script = ScriptedServer(nursery)
    upstream = Upstream(
        "s", ServerConfig(command="scripted"), SETTINGS, launch=script.launch, events=full
    )
    await nursery.start(upstream.run)
    with trio.fail_after(5):
        await upstream.wait_ready()
    assert upstream.statistics().restarts == 0
