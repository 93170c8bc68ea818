"""2026-07-28 clients on the Streamable HTTP listener: a call per POST.

The modern revision has no HTTP session (broker/wire/http_modern.py has its
rules). Each request POST is its own *context*: a broker
:class:`~actors.session.Session` (running :class:`~broker.eras.session.ModernSessionProtocol`,
as on the unix socket and WebSocket) over a :class:`ModernContext`, which
hands the session the POST's body and takes what the session writes for the
POST being answered. The answer goes out as JSON, unless something comes
before it (progress, a log message the request asked for, a listen stream's
acknowledgement) or it takes longer than ``sse.KEEPALIVE_SECONDS``: then as
an SSE stream (a JSON error keeps its HTTP status, as the SDK's server does).

A context whose request is answered is kept *idle* for the next POST to the
same URL (at most :data:`MAX_IDLE`, each for :data:`IDLE_SECONDS`): its
session stays attached to its servers, so a call costs what a legacy HTTP
session's does, not a session's opening and closing. A context serves one
POST at a time, its session's per-request state (the call's method, log
level, capabilities) is forgotten with its answer, and an idle context is not
a client's: ``mcpbroker status`` does not list it (docs/eras.md, "Over
Streamable HTTP"). A context ends instead of waiting idle when its request
was a listen stream, was cancelled (below), or was parked; and these two
kinds outlive their answer:

- ``subscriptions/listen``: its stream stays open, carrying the
  notifications stamped with its subscription id, until the client closes it.
- a call a legacy server asked a question in: the answer is
  ``input_required`` with a ``requestState`` of the broker's, and the call
  stays in flight at the server. The context is *parked* under that token
  (at most :data:`MAX_PARKED`, each for :data:`PARK_SECONDS`), and the
  client's retry, a new POST carrying the token, is handed to it instead of
  a new context: the session gives the server its answers and the retry
  takes the call over (docs/eras.md, "The bridge"). Past either bound the
  parked call is cancelled upstream and its token is unknown from then on.

Closing a POST's stream before its answer is the request's cancellation: the
context ends, and its session's end cancels what it had in flight upstream
(``notifications/cancelled`` to the server), as when any client leaves. A
task watches for that only once a POST has waited past one tick of the
listener's clock (``sse.TICK_SECONDS``; the same tick paces the SSE
keep-alive comments): nearly every call is answered sooner, and a watcher
per POST cost more than the rest of the POST's handling (the client that
leaves sooner is noticed by then, or by the write of its answer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from actors.downstream.replies import Receive, Send, respond, write
from actors.errors import TransportClosed
from actors.logs import get_logger
from actors.mailbox import Outgoing, SessionHandle
from broker import jsonrpc
from broker.eras.tokens import is_ours
from broker.jsonrpc import CONNECTION_CLOSED, LIMIT_REACHED, RequestId, id_key
from broker.wire import http as wire
from broker.wire import http_modern, sse
from broker.wire.envelope import Answer
from broker.wire.frames import Frame
from broker.wire.http_modern import LISTEN, ModernPost, status_of

PARK_SECONDS = 600.0  # how long a call that asked for input waits for its client's retry
MAX_PARKED = 1024  # calls waiting so at once; past it the oldest is cancelled
MAX_CONTEXTS = 4096  # modern requests at once (answering, listening or parked): past it, 503
MAX_IDLE = 256  # answered contexts kept for the next POSTs (their sessions stay open)
IDLE_SECONDS = 60.0  # an idle context not taken again this long ends

Route = tuple[tuple[str, ...] | None, bool]  # a URL's view: its servers, and whether transparent
OpenSession = Callable[[Any, tuple[str, ...] | None, bool], Awaitable[None]]

_SSE_HEADERS = [
    (b"content-type", sse.CONTENT_TYPE.encode()),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class ModernContext:
    """One modern call (or listen stream) as a session's
    :class:`~actors.downstream.connection.Connection`: the bodies of its POST
    and of its retries in, the messages for the POST being answered out."""

    transport = "http"
    related = False  # one request at a time: everything it is sent is that request's
    per_request = True  # (its session's opening and closing are logged at debug)
    # Kept for the next POST (since ``idle_since``): no client's session (status omits it).
    idle = False
    idle_since = 0.0

    def __init__(self, max_queued_bytes: int, log: Any = None) -> None:
        self.max_queued_bytes = max_queued_bytes
        self.cancel_scope = trio.CancelScope()  # cancelled: the context ends
        self.closed = False
        self.waiting: RequestId | None = None  # the id of the request being answered
        self.pending: list[tuple[Any, bytes]] = []
        self.pending_bytes = 0  # (with what a POST took and is writing: taken_bytes)
        self.taken_bytes = 0
        self.dropped = 0  # messages that came while no POST was being answered
        self.token: str | None = None  # parked under this requestState
        self.route: Route = (None, False)  # its URL's view
        self.park_scope: trio.CancelScope | None = None  # (its timer's, while parked)
        self.handle: SessionHandle | None = None  # its session's (bind)
        self._inbox_send, self._inbox = trio.open_memory_channel[tuple[list[Frame], int]](1)
        self._waker = trio.Event()
        self._log = get_logger() if log is None else log  # (its listener's: one per call cost)

    def bind(self, handle: SessionHandle) -> None:
        """Its session's handle (told by the Session as it starts)."""
        self.handle = handle

    @property
    def owns_instance(self) -> bool:
        """Whether a per-session server runs an instance for its session: the
        instance is this request's (and its retries'), never another POST's."""
        return self.handle is not None and self.handle.owns_instance

    # -- the Connection protocol ------------------------------------------

    async def receive(self) -> tuple[list[Frame], int]:
        try:
            return await self._inbox.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return [], 0

    async def send(self, messages: list[Outgoing]) -> None:
        if self.closed:
            raise TransportClosed("the request's stream closed")
        before = self.pending_bytes
        for message in messages:
            if self.waiting is None:  # parked: the call's progress and log go nowhere
                self.dropped += 1
                continue
            data = wire.encode(message)
            kept: Any = message
            if type(message) is Answer:  # (unparsed, from the session's fast path)
                kept = message.read()  # this listener reads each answer: its status
            elif type(message) is dict and "method" in message:
                kept = None  # (no answer: only its bytes are kept, not both)
            if self.pending:  # (it waits behind others: the client reads slowly, or not)
                data = bytes(memoryview(data))  # (orjson's bytes hold up to 8 times their size)
            self.pending.append((kept, data))
            self.pending_bytes += len(data)
            if self.pending_bytes > self.max_queued_bytes:
                self._log.warning("http.modern_not_reading", bytes=self.pending_bytes)
                raise TransportClosed(
                    f"{self.pending_bytes} bytes wait to be written (broker.maxQueuedBytes = "
                    f"{self.max_queued_bytes}): client not reading"
                )
        self._held(self.pending_bytes - before)
        self._wake()

    async def aclose(self) -> None:
        self.closed = True
        self._inbox_send.close()
        self._wake()

    # -- for the POST handler ---------------------------------------------

    def begin(self, id: RequestId) -> None:
        """A POST (the first, or a retry) waits for the answer to request ``id``."""
        self.waiting = id
        self.pending.clear()
        self._held(-self.pending_bytes)
        self.pending_bytes = self.taken_bytes = 0

    async def deliver(self, body: bytes) -> bool:
        """Hand a POST body to the session; False if the context has ended."""
        item: tuple[list[Frame], int] = ([body], len(body))
        try:
            try:
                self._inbox_send.send_nowait(item)  # no pass through the scheduler
            except trio.WouldBlock:  # when the session is not waiting for it yet
                await self._inbox_send.send(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    def waker(self) -> trio.Event:
        """Set when something new is pending (or the context ended). Take it
        before looking, so that nothing comes unnoticed in between."""
        if self.closed:
            done = trio.Event()
            done.set()
            return done
        return self._waker

    def take(self) -> list[tuple[Any, bytes]]:
        """What is pending, for the POST to write: it still counts against
        the bound (it is held) until :meth:`written` says it all went."""
        taken, self.pending = self.pending, []
        self.taken_bytes = self.pending_bytes
        return taken

    def written(self) -> None:
        """What was taken last is written (or skipped), and let go."""
        self.pending_bytes -= self.taken_bytes
        self._held(-self.taken_bytes)
        self.taken_bytes = 0

    def _held(self, size: int) -> None:
        # What waits here counts in its session's queue too, against the same
        # broker.maxQueuedBytes: the two hold no more than that together.
        if self.handle is not None:
            self.handle.queued_bytes += size

    def end(self, reason: str) -> None:
        self._log.debug("http.modern_context_ending", reason=reason)
        self.cancel_scope.cancel()

    def wake(self) -> None:
        """Wake the POST waiting on it (to look at the time: a tick)."""
        self._wake()

    def _wake(self) -> None:
        self._waker.set()
        self._waker = trio.Event()


class ModernHttp:
    """Every modern request of one HTTP listener: its contexts, the parked ones."""

    def __init__(
        self,
        open_session: OpenSession,
        max_queued_bytes: int,
        *,
        park_seconds: float = PARK_SECONDS,
        max_parked: int = MAX_PARKED,
        max_contexts: int = MAX_CONTEXTS,
        max_idle: int = MAX_IDLE,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self._open_session = open_session
        self._max_queued_bytes = max_queued_bytes
        self.park_seconds = park_seconds
        self.max_parked = max_parked
        self.max_contexts = max_contexts
        self.max_idle = max_idle
        self.idle_seconds = idle_seconds
        self.contexts: set[ModernContext] = set()
        # Answered contexts by their URL's view, the most recently used last.
        self.idle: dict[Route, list[ModernContext]] = {}
        self.idle_count = 0
        self.parked: dict[str, ModernContext] = {}  # by requestState, oldest first
        self.ticks = 0  # how often the waiting POSTs were told to look (see run)
        self._nursery: trio.Nursery | None = None
        self._log = get_logger()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the contexts' sessions (and the parked ones' timers) until
        cancelled; every ``sse.TICK_SECONDS``, wake the POSTs waiting for an
        answer (one task for all: a timer per wait cost a tenth of a call)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await trio.sleep(sse.TICK_SECONDS)
                self.ticks += 1
                for context in self.contexts:
                    if context.waiting is not None:
                        context.wake()
                self._end_idle(trio.current_time() - self.idle_seconds)

    async def answer(
        self,
        target: wire.Target,
        post: ModernPost,
        body: bytes,
        sse_ok: bool,
        receive: Receive,
        send: Send,
        *,
        json_ok: bool = True,
    ) -> None:
        """Answer one request POST (checked already: broker/wire/http_modern.py):
        as an SSE stream if ``sse_ok`` and something must go before the answer,
        or the client takes no JSON (not ``json_ok``); else as JSON."""
        route = (target.view, target.transparent)
        context = self._unpark(post.request_state, route)
        parked = context is not None
        if context is None:
            context = self._take_idle(route)
        if context is None:
            if len(self.contexts) - self.idle_count >= self.max_contexts:
                why = f"mcpbroker: too many 2026-07-28 requests at once ({self.max_contexts})"
                return await respond(send, 503, _error(post.id, why, LIMIT_REACHED))
            context = self._start(target)
        context.begin(post.id)
        if not await context.deliver(body):
            return await respond(
                send, 200, _error(post.id, "mcpbroker: the request's session ended")
            )
        answer: dict[str, Any] | None = None
        reason = "the client closed the request's stream (cancelled)"
        watch = _Watch(context, receive)
        try:
            answer = await self._write_answer(context, watch, post.id, sse_ok, json_ok, send)
            reason = "answered"
        finally:
            await watch.stop()
            context.waiting = None
            token = http_modern.parked_token(answer)
            failed = answer is not None and "error" in answer
            if token is None and parked and failed and is_ours(post.request_state):
                # A retry refused (another method, a bad _meta, ...) may have
                # left its requestState unspent, as it does on a socket: the
                # call is parked again under it. (Spent, by an error that
                # ended the call, it names nothing there: the next retry is
                # told so, and the context goes at its time.)
                token = post.request_state
            if token is None and context.owns_instance:
                # A 2026-07-28 server's input_required, from this request's own
                # per-session instance: its retry must reach that instance (no
                # other knows its requestState), so the context waits for it.
                token = http_modern.retry_state(answer)
            if token is not None and token in self.parked and not is_ours(token):
                # Two of a server's instances gave the same requestState (a
                # server's own, not a broker's token): whose retry it is cannot
                # be told, so neither call waits for one (a retry reaching the
                # other's instance would be another client's).
                self.parked.pop(token).end("another call was given the same requestState")
                token = None
            if token is not None and not context.closed and token not in self.parked:
                self._park(context, token)
            elif answer is None or parked or post.method == LISTEN or not self._keep(context):
                context.end(reason)

    async def _write_answer(
        self,
        context: ModernContext,
        watch: _Watch,
        id: RequestId,
        sse_ok: bool,
        json_ok: bool,
        send: Send,
    ) -> dict[str, Any] | None:
        """Write what the context has for request ``id`` until its answer (which is
        returned), as one JSON body or, once something must go before it, an SSE
        stream. None if the context ended first. At the first tick it is still
        waiting, the client's leaving is watched for (``watch``)."""
        streaming = sse_ok and not json_ok and await _start_sse(send)
        wanted = id_key(id)
        written = self.ticks
        while True:
            waker = context.waker()
            try:
                for message, data in context.take():
                    if http_modern.answers(message, wanted):
                        if streaming:
                            await write(send, sse.event(data), more=False)
                        else:
                            error = message.get("error")
                            code = error.get("code") if isinstance(error, dict) else None
                            await respond(send, status_of(code) if type(code) is int else 200, data)
                        return message  # type: ignore[no-any-return]
                    if not sse_ok:
                        continue  # (a client that takes JSON only gets the answer alone)
                    if not streaming:
                        streaming = await _start_sse(send)
                    await write(send, sse.event(data))
                    written = self.ticks
            finally:
                context.written()  # (what was taken is let go: the answer too, or a failed write)
            if context.closed:
                if streaming:
                    await write(send, b"", more=False)
                else:
                    ended = _error(id, "mcpbroker: the request's session ended before its answer")
                    await respond(send, 200, ended)
                return None
            if self.ticks != written:
                watch.start(self._nursery)
                if self.ticks - written >= sse.KEEPALIVE_TICKS and sse_ok:  # quiet for 15 to 20 s
                    if not streaming:
                        streaming = await _start_sse(send)
                    await write(send, sse.KEEPALIVE)
                    written = self.ticks
            await waker.wait()

    # -- contexts -----------------------------------------------------------

    def _keep(self, context: ModernContext) -> bool:
        """Keep an answered context idle for the next POST to its URL, if there
        is room and no per-session instance is its own (docs/eras.md)."""
        if context.closed or self.idle_count >= self.max_idle or context.owns_instance:
            return False
        context.idle, context.idle_since = True, trio.current_time()
        self.idle.setdefault(context.route, []).append(context)
        self.idle_count += 1
        return True

    def _take_idle(self, route: Route) -> ModernContext | None:
        """The idle context used last for this URL (one whose session is still open)."""
        idle = self.idle.get(route)
        while idle:
            context = idle.pop()
            self.idle_count -= 1
            context.idle = False
            if not context.closed:
                return context
        return None

    def _end_idle(self, before: float) -> None:
        """End the idle contexts not taken since ``before``."""
        for route, idle in list(self.idle.items()):
            stale = [context for context in idle if context.idle_since < before]
            for context in stale:
                idle.remove(context)
                self.idle_count -= 1
                context.idle = False
                context.end(f"idle for more than {self.idle_seconds:g} s")
            if not idle:
                del self.idle[route]

    def _start(self, target: wire.Target) -> ModernContext:
        assert self._nursery is not None
        context = ModernContext(self._max_queued_bytes, self._log)
        context.route = (target.view, target.transparent)
        self.contexts.add(context)
        self._nursery.start_soon(self._run, context, target.view, target.transparent)
        return context

    async def _run(
        self, context: ModernContext, view: tuple[str, ...] | None, transparent: bool
    ) -> None:
        try:
            with context.cancel_scope:
                await self._open_session(context, view, transparent)
        finally:
            self.contexts.discard(context)
            if context.idle:  # (its session ended while it waited: a reload, a shutdown)
                context.idle = False
                self.idle[context.route].remove(context)
                self.idle_count -= 1
            if context.token is not None and self.parked.get(context.token) is context:
                del self.parked[context.token]
            if context.park_scope is not None:
                context.park_scope.cancel()
            await context.aclose()  # (idempotent: the Session closed it already)

    def _park(self, context: ModernContext, token: str) -> None:
        """Keep a call that asked for input until its retry (or its bounds) come."""
        assert self._nursery is not None
        while len(self.parked) >= self.max_parked:
            _, oldest = _pop_oldest(self.parked)
            oldest.end(f"more than {self.max_parked} calls wait for their clients' input")
        context.token = token
        context.park_scope = park_scope = trio.CancelScope()
        self.parked[token] = context
        self._nursery.start_soon(self._expire, context, token, park_scope)

    async def _expire(self, context: ModernContext, token: str, scope: trio.CancelScope) -> None:
        with scope:
            await trio.sleep(self.park_seconds)
            if self.parked.get(token) is context:
                del self.parked[token]
                context.end(f"no retry came within {self.park_seconds:g} s")

    def _unpark(self, token: str | None, route: Route) -> ModernContext | None:
        """The parked call a retry's ``requestState`` names (spent: taken out),
        if the retry came to the same URL (elsewhere the token is unknown)."""
        if token is None:
            return None
        context = self.parked.get(token)
        if context is None or context.route != route:
            return None
        del self.parked[token]
        context.token = None
        if context.park_scope is not None:
            context.park_scope.cancel()
        return context


def _pop_oldest(parked: dict[str, ModernContext]) -> tuple[str, ModernContext]:
    token = next(iter(parked))
    return token, parked.pop(token)


def _error(id: RequestId, message: str, code: int = CONNECTION_CLOSED) -> bytes:
    return jsonrpc.encode(jsonrpc.error_response(id, code, message))


async def _start_sse(send: Send) -> bool:
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    return True


class _Watch:
    """A task watching one POST's client leave (ASGI's ``http.disconnect``),
    which ends its context; started only for a POST still waiting at a tick."""

    def __init__(self, context: ModernContext, receive: Receive) -> None:
        self._context = context
        self._receive = receive
        self._scope: trio.CancelScope | None = None
        self._done: trio.Event | None = None

    def start(self, nursery: trio.Nursery | None) -> None:
        if self._scope is not None or nursery is None:
            return
        self._scope, self._done = trio.CancelScope(), trio.Event()
        nursery.start_soon(self._run, self._scope, self._done)

    async def stop(self) -> None:
        """Stop watching, and wait until the task is gone: the connection's
        task reads the socket next."""
        if self._scope is None or self._done is None:
            return
        self._scope.cancel()
        with trio.CancelScope(shield=True):
            await self._done.wait()

    async def _run(self, scope: trio.CancelScope, done: trio.Event) -> None:
        # (a task of the listener's shared nursery: whatever goes wrong here
        # ends this POST's context, never the listener and every client's)
        try:
            with scope:
                while (await self._receive())["type"] != "http.disconnect":
                    pass
                self._context.end("the client closed the request's stream (cancelled)")
        except Exception as exc:
            get_logger().exception("http.modern_watch_failed")
            self._context.end(f"mcpbroker: watching the request failed ({exc!r})")
        finally:
            done.set()
