"""The modern HTTP contexts (actors/downstream/http_modern.py) under trio's
autojump clock: a session per request, parked across an input_required round,
and the bounds on parked calls (count and time); the client closing its
stream ends the context. The session here is a small script that answers
the way the broker's modern session does."""

from __future__ import annotations

import tracemalloc
from functools import partial
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from actors.downstream.http_modern import ModernContext, ModernHttp
from actors.errors import TransportClosed
from actors.mailbox import SessionHandle
from broker.eras.tokens import OWN_PREFIX
from broker.wire import http
from broker.wire.http_modern import LISTEN, ModernPost

TARGET = http.Target("POST", None, False, {}, modern=True)


class Script:
    """Stands in for the daemon's sessions: the first request of a context is
    answered input_required (a broker token), a retry with the result."""

    def __init__(self) -> None:
        self.opened = 0
        self.ended: list[int] = []
        self.retries: list[tuple[int, Any]] = []

    async def open_session(self, context: Any, view: Any, transparent: bool) -> None:
        self.opened += 1
        number = self.opened
        try:
            while True:
                frames, _ = await context.receive()
                if not frames:
                    return
                message = orjson.loads(frames[0])
                state = message["params"].get("requestState")
                if state is None and message["method"] == "tools/call":
                    result = {
                        "resultType": "input_required",
                        "requestState": f"{OWN_PREFIX}{number}",
                    }
                else:
                    self.retries.append((number, message["id"]))
                    result = {"resultType": "complete", "content": []}
                if message["method"] == "slow":
                    await trio.sleep(60)
                await context.send([{"jsonrpc": "2.0", "id": message["id"], "result": result}])
        finally:
            self.ended.append(number)


class Exchange:
    """One POST's ASGI side: what was sent back, and a client that may leave."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.leave = trio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def answer(self) -> dict[str, Any]:
        body = b"".join(m.get("body", b"") for m in self.sent)
        answer: dict[str, Any] = orjson.loads(body)
        return answer


def call(id: int, method: str = "tools/call", **params: Any) -> tuple[ModernPost, bytes]:
    message = {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
    return ModernPost(message, True), orjson.dumps(message)


async def ask(contexts: ModernHttp, id: int, method: str = "tools/call", **params: Any) -> Exchange:
    exchange = Exchange()
    post, body = call(id, method, **params)
    await contexts.answer(TARGET, post, body, True, exchange.receive, exchange.send)
    return exchange


async def test_a_retry_finds_its_parked_call_and_ends_it(autojump_clock: Any) -> None:
    script = Script()
    contexts = ModernHttp(script.open_session, 1 << 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        first = await ask(contexts, 1)
        assert first.answer()["result"]["requestState"] == OWN_PREFIX + "1"
        assert list(contexts.parked) == [OWN_PREFIX + "1"] and script.ended == []
        retry = await ask(contexts, 2, requestState=OWN_PREFIX + "1")
        assert retry.answer()["result"]["resultType"] == "complete"
        assert script.retries == [(1, 2)]  # the same session took the retry
        await trio.testing.wait_all_tasks_blocked()
        assert script.ended == [1] and not contexts.parked and not contexts.contexts
        # The token is spent: the same retry again opens a context of its own.
        await ask(contexts, 3, requestState=OWN_PREFIX + "1")
        assert script.retries[-1] == (2, 3)
        nursery.cancel_scope.cancel()


async def test_a_parked_call_ends_when_no_retry_comes_in_time(autojump_clock: Any) -> None:
    script = Script()
    contexts = ModernHttp(script.open_session, 1 << 20, park_seconds=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        await ask(contexts, 1)
        await trio.sleep(29)
        assert contexts.parked and script.ended == []
        await trio.sleep(2)
        assert not contexts.parked and script.ended == [1] and not contexts.contexts
        nursery.cancel_scope.cancel()


async def test_past_the_bound_the_oldest_parked_call_ends(autojump_clock: Any) -> None:
    script = Script()
    contexts = ModernHttp(script.open_session, 1 << 20, max_parked=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        for id in (1, 2, 3):
            await ask(contexts, id)
        await trio.testing.wait_all_tasks_blocked()
        assert list(contexts.parked) == [OWN_PREFIX + "2", OWN_PREFIX + "3"]
        assert script.ended == [1]
        nursery.cancel_scope.cancel()


async def test_closing_the_stream_ends_the_context(autojump_clock: Any) -> None:
    script = Script()
    contexts = ModernHttp(script.open_session, 1 << 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        exchange = Exchange()
        post, body = call(1, "slow")
        nursery.start_soon(
            contexts.answer, TARGET, post, body, True, exchange.receive, exchange.send
        )
        await trio.sleep(20)
        # Silent past the keep-alive: the answer became an SSE stream, kept alive.
        assert exchange.sent[0]["status"] == 200
        assert (b"content-type", b"text/event-stream") in exchange.sent[0]["headers"]
        assert exchange.sent[1]["body"].startswith(b":")
        exchange.leave.set()
        await trio.testing.wait_all_tasks_blocked()
        assert script.ended == [1] and not contexts.contexts
        nursery.cancel_scope.cancel()


async def test_too_many_contexts_is_503(autojump_clock: Any) -> None:
    script = Script()
    contexts = ModernHttp(script.open_session, 1 << 20, max_contexts=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        await ask(contexts, 1)  # parked: it still counts
        refused = await ask(contexts, 2)
        assert refused.sent[0]["status"] == 503
        assert refused.answer()["error"]["code"] == -32005  # (a limit: docs/protocol.md)
        nursery.cancel_scope.cancel()


async def test_a_context_drops_what_comes_while_parked_and_bounds_the_rest() -> None:
    context = ModernContext(100)
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x"}}
    await context.send([note])  # no POST waits: nobody to tell
    assert context.dropped == 1 and context.take() == []
    context.begin(1)
    await context.send([note])
    assert [orjson.loads(data) for _, data in context.take()] == [note]
    context.begin(1)
    big = {**note, "params": {"data": "x" * 200}}
    with pytest.raises(TransportClosed, match="client not reading"):
        await context.send([big])
    await context.aclose()
    assert await context.receive() == ([], 0)
    with pytest.raises(TransportClosed):
        await context.send([note])


async def test_what_a_post_took_counts_until_written() -> None:
    # A listen whose client does not read: what its POST took and is still
    # writing is held too, so it counts against the bound until written.
    context = ModernContext(1000)
    context.begin("L")
    note = {"jsonrpc": "2.0", "method": "notifications/resources/updated"}
    update = {**note, "params": {"uri": "file:///a" + "x" * 300}}
    await context.send([update, update])
    taken = context.take()
    assert [message for message, _ in taken] == [None, None]  # (bytes only, not both)
    with pytest.raises(TransportClosed, match="client not reading"):
        await context.send([update, update])
    context.begin("L")
    await context.send([update, update])
    context.take()
    context.written()
    await context.send([update, update])  # (written: room again)


async def test_what_waits_in_a_context_is_held_as_counted() -> None:
    # orjson's bytes keep a buffer up to 8 times their size: what waits is
    # held compact, and counted in the session's queue too (one bound).
    context = ModernContext(1 << 30)
    handle = SessionHandle(trio.open_memory_channel[Any](1)[0], trio.CancelScope())
    context.bind(handle)
    context.begin("L")
    update = {"jsonrpc": "2.0", "method": "n", "params": {"pad": "P" * 4000}}
    tracemalloc.start()
    try:
        for _ in range(200):
            await context.send([update])
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 2 * context.pending_bytes
    assert handle.queued_bytes == context.pending_bytes
    context.take()
    context.written()
    assert handle.queued_bytes == 0


async def test_a_client_that_takes_no_json_gets_its_answer_as_sse(autojump_clock: Any) -> None:
    script = Script()
    contexts = ModernHttp(script.open_session, 1 << 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        exchange = Exchange()
        post, body = call(1, "tools/list")
        await contexts.answer(
            TARGET, post, body, True, exchange.receive, exchange.send, json_ok=False
        )
        assert (b"content-type", b"text/event-stream") in exchange.sent[0]["headers"]
        data = b"".join(m.get("body", b"") for m in exchange.sent)
        assert data.startswith(b"data: ") and orjson.loads(data[6:])["id"] == 1
        nursery.cancel_scope.cancel()


async def test_a_retry_at_another_url_does_not_find_the_call(autojump_clock: Any) -> None:
    script = Script()
    contexts = ModernHttp(script.open_session, 1 << 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        await ask(contexts, 1)
        elsewhere = http.Target("POST", ("s",), True, {}, modern=True)
        exchange = Exchange()
        post, body = call(2, requestState=OWN_PREFIX + "1")
        await contexts.answer(elsewhere, post, body, True, exchange.receive, exchange.send)
        assert script.retries == [(2, 2)]  # a context of its own (the broker's: -32602)
        assert list(contexts.parked) == [OWN_PREFIX + "1"]  # still waiting for its retry
        await ask(contexts, 3, requestState=OWN_PREFIX + "1")
        assert script.retries[-1] == (1, 3)
        nursery.cancel_scope.cancel()


async def test_an_answered_context_serves_the_next_post_to_its_url(autojump_clock: Any) -> None:
    script = Script()
    contexts = ModernHttp(script.open_session, 1 << 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        for id in (1, 2, 3):
            exchange = await ask(contexts, id, method="tools/list")
            assert exchange.answer()["id"] == id
        assert script.opened == 1 and script.retries == [(1, 1), (1, 2), (1, 3)]
        assert contexts.idle_count == 1 and script.ended == []
        # (the answers it wrote count no more: they held its session's queue)
        assert [c.pending_bytes for c in contexts.contexts] == [0]
        # Another URL's view: a context of its own.
        elsewhere = http.Target("POST", ("s",), True, {}, modern=True)
        exchange = Exchange()
        post, body = call(4, "tools/list")
        await contexts.answer(elsewhere, post, body, True, exchange.receive, exchange.send)
        assert script.opened == 2 and contexts.idle_count == 2
        nursery.cancel_scope.cancel()


async def test_idle_contexts_are_bounded_and_end_when_not_taken(autojump_clock: Any) -> None:
    script = Script()
    contexts = ModernHttp(script.open_session, 1 << 20, max_idle=1, idle_seconds=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        async with trio.open_nursery() as posts:  # two at once: two contexts
            for id in (1, 2):
                posts.start_soon(partial(ask, contexts, id, method="slow"))
        await trio.testing.wait_all_tasks_blocked()
        assert script.opened == 2 and len(script.ended) == 1  # room for one idle
        assert contexts.idle_count == 1
        await trio.sleep(30 + 10)  # (idle ones are looked for at each tick)
        assert len(script.ended) == 2 and not contexts.contexts and contexts.idle_count == 0
        nursery.cancel_scope.cancel()


class PerSessionScript(Script):
    """A session whose view has a per-session server: its first request
    starts the session's own instance, a 2026-07-28 server whose tools/call
    asks input_required with a requestState of its own, whose retry only
    that instance knows."""

    state: str | None = None  # (every instance's requestState, if set: they clash)

    async def open_session(self, context: Any, view: Any, transparent: bool) -> None:
        self.opened += 1
        number = self.opened
        handle = SessionHandle(trio.open_memory_channel[Any](1)[0], trio.CancelScope())
        context.bind(handle)
        try:
            while True:
                frames, _ = await context.receive()
                if not frames:
                    return
                handle.owns_instance = True
                message = orjson.loads(frames[0])
                state = message["params"].get("requestState")
                mine = self.state or f"server-{number}"
                if state is None and message["method"] == "tools/call":
                    result = {"resultType": "input_required", "requestState": mine}
                else:
                    self.retries.append((number, message["id"]))
                    ok = state in (None, mine)
                    result = {"resultType": "complete", "isError": not ok, "content": []}
                await context.send([{"jsonrpc": "2.0", "id": message["id"], "result": result}])
        finally:
            self.ended.append(number)


async def test_a_context_owning_a_per_session_instance_is_never_kept(
    autojump_clock: Any,
) -> None:
    # The instance is its request's: given back at the answer, never another
    # POST's (whose client would see the first one's state).
    script = PerSessionScript()
    contexts = ModernHttp(script.open_session, 1 << 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        for id in (1, 2):
            await ask(contexts, id, method="tools/list")
            await trio.testing.wait_all_tasks_blocked()
        assert script.opened == 2 and script.ended == [1, 2]
        assert contexts.idle_count == 0 and not contexts.contexts
        nursery.cancel_scope.cancel()


async def test_a_per_session_servers_input_required_waits_for_its_retry(
    autojump_clock: Any,
) -> None:
    script = PerSessionScript()
    contexts = ModernHttp(script.open_session, 1 << 20, park_seconds=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        first = await ask(contexts, 1)
        second = await ask(contexts, 2)
        assert first.answer()["result"]["requestState"] == "server-1"
        assert second.answer()["result"]["requestState"] == "server-2"
        assert set(contexts.parked) == {"server-1", "server-2"}
        retry = await ask(contexts, 3, requestState="server-2")
        assert retry.answer()["result"]["isError"] is False  # its own instance took it
        assert script.retries == [(2, 3)]
        await trio.testing.wait_all_tasks_blocked()
        assert script.ended == [2] and list(contexts.parked) == ["server-1"]
        await trio.sleep(31)  # no retry: the instance is given back
        assert script.ended == [2, 1] and not contexts.contexts
        nursery.cancel_scope.cancel()


async def test_two_instances_giving_the_same_request_state_wait_for_no_retry(
    autojump_clock: Any,
) -> None:
    """Server states are the server's: two per-session instances may give the
    same one. Whose retry it is cannot be told, so neither call waits for it
    (the second client's retry reached the first client's instance); both
    retries are then unknown, never another client's. (Found by review.)"""
    script = PerSessionScript()
    script.state = "step-1"
    contexts = ModernHttp(script.open_session, 1 << 20, park_seconds=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        await ask(contexts, 1)
        assert set(contexts.parked) == {"step-1"}
        await ask(contexts, 2)
        await trio.testing.wait_all_tasks_blocked()
        assert not contexts.parked and sorted(script.ended) == [1, 2]
        retry = await ask(contexts, 3, requestState="step-1")
        assert retry.answer()["id"] == 3
        assert script.retries == [(3, 3)]  # (a new session of its own, not the first's)
        nursery.cancel_scope.cancel()


async def test_a_listen_or_cancelled_context_is_not_kept(autojump_clock: Any) -> None:
    script = Script()
    contexts = ModernHttp(script.open_session, 1 << 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        await ask(contexts, 1, method=LISTEN)
        await trio.testing.wait_all_tasks_blocked()
        assert script.ended == [1] and contexts.idle_count == 0
        nursery.cancel_scope.cancel()


async def test_the_client_is_watched_only_once_a_post_outlives_a_tick(autojump_clock: Any) -> None:
    script = Script()
    contexts = ModernHttp(script.open_session, 1 << 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        quick = Watched()
        post, body = call(1, "tools/list")
        await contexts.answer(TARGET, post, body, True, quick.receive, quick.send)
        assert quick.receives == 0  # answered at once: no watcher was started
        slow = Watched()
        post, body = call(2, "slow")
        await contexts.answer(TARGET, post, body, False, slow.receive, slow.send)  # (JSON)
        assert slow.receives == 1 and slow.answer()["id"] == 2
        await trio.testing.wait_all_tasks_blocked()
        assert slow.watching == 0  # (stopped with the answer: the connection reads next)
        nursery.cancel_scope.cancel()


class Watched(Exchange):
    """A client that never leaves, counting the watcher's reads."""

    def __init__(self) -> None:
        super().__init__()
        self.receives = 0
        self.watching = 0

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        self.watching += 1
        try:
            await trio.sleep_forever()
        finally:
            self.watching -= 1
        raise AssertionError("unreachable")


class Broken(Exchange):
    """A connection whose read fails (a bug in it, say) once the watcher reads."""

    async def receive(self) -> dict[str, Any]:
        raise RuntimeError("the connection broke")


async def test_a_watcher_that_fails_ends_its_own_context_not_the_listener(
    autojump_clock: Any,
) -> None:
    """The watcher runs in the listener's shared nursery: what goes wrong in
    it ends that POST's context, and every other context goes on."""
    script = Script()
    contexts = ModernHttp(script.open_session, 1 << 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(contexts.run)
        other = Exchange()
        post, body = call(1, "slow")
        nursery.start_soon(contexts.answer, TARGET, post, body, True, other.receive, other.send)
        broken = Broken()
        post, body = call(2, "slow")
        nursery.start_soon(contexts.answer, TARGET, post, body, True, broken.receive, broken.send)
        await trio.sleep(20)  # (past a tick: both are watched; the broken one's read fails)
        # (which session each POST opened is the scheduler's order: counted)
        assert len(contexts.contexts) == 1 and len(script.ended) == 1
        assert broken.answer()["id"] == 2 and "error" in broken.answer()  # told, over its stream
        other.leave.set()  # the other is still served, and watched
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(script.ended) == [1, 2] and not contexts.contexts
        nursery.cancel_scope.cancel()
