"""The Streamable HTTP listener (``mcpbroker serve --http HOST:PORT``) and its sessions.

Hosts that connect by URL reach the daemon at ``http://HOST:PORT/mcp`` (every
server, aggregated) or ``http://HOST:PORT/mcp/NAME`` (one server, as it is).
The HTTP server is actors/downstream/http_server.py (httptools' llhttp on
Trio, one task per connection) running the small ASGI-shaped application below;
the rules (verbs, statuses, session ids, which stream a message goes on,
the events kept for replay) are broker/wire/http.py's, the SSE encoding broker/wire/sse.py's.

One MCP session (``Mcp-Session-Id``) is one broker :class:`~actors.session.Session`
over an :class:`HttpConnection`, whatever number of HTTP requests it spans:
POST handlers hand the session their bodies (``receive``), and the session's
writer hands the connection messages (``send``), which it queues on the
stream each belongs to, never waiting; the HTTP response writing that stream
(a POST's SSE stream or JSON answer, or the GET stream) takes them from
there. A POST whose client accepts both is answered in JSON unless
something belonging to its request comes before the answer (then as an
SSE stream, that first), as the 2026-07-28 requests are (http_modern.py).
A session that no request or stream has used for
:data:`IDLE_SECONDS` ends, as does one the client DELETEs.

The POST bodies waiting for a session's reader are bounded in items
(:data:`INBOX_SIZE`) and in bytes (``broker.maxQueuedBytes``): a POST is let
in before its body is read, and past the bound it waits, its body unread in
its socket (:meth:`HttpConnection.let_in`; docs/architecture.md, "The seams").
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import trio

from actors.downstream.http_modern import ModernHttp
from actors.downstream.http_server import HttpServer
from actors.downstream.replies import Receive, Send, respond, write
from actors.errors import NotReading, TransportClosed
from actors.logs import get_logger
from actors.mailbox import Outgoing
from broker.jsonrpc import JsonRpcError
from broker.session import CatalogSource
from broker.wire import http as wire
from broker.wire import http_modern, param_headers, sse
from broker.wire.frames import Frame
from broker.wire.websocket import Policy

IDLE_SECONDS = 1800.0  # a session nobody has used this long ends
MAX_SESSIONS = 1024  # HTTP sessions at once; past it, initialize gets 503
INBOX_SIZE = 16  # POST bodies waiting for the session's reader (and in bytes: maxQueuedBytes)
REAP_SECONDS = 30.0  # how often idle sessions are looked for

# What the listener does with a new session: run it until it ends.
OpenSession = Callable[["HttpConnection", tuple[str, ...] | None, bool], Awaitable[None]]


class HttpConnection:
    """One HTTP MCP session, as a :class:`~actors.downstream.connection.Connection`."""

    transport = "http"
    related = True  # messages come with the request they belong to (broker/related.py)

    def __init__(self, session_id: str, max_queued_bytes: int) -> None:
        self.id = session_id
        self.streams = wire.HttpStreams(max_queued_bytes)
        self.closed = False
        self.cancel_scope = trio.CancelScope()  # cancelled: the session ends
        self.busy = 0  # HTTP requests of this session being answered now
        self.last_active = trio.current_time()
        self._inbox_send, self._inbox = trio.open_memory_channel[tuple[list[Frame], int]](
            INBOX_SIZE
        )
        # Bytes of POST bodies let in (being read, or waiting in the inbox),
        # at most ``max_inbox_bytes`` unless one body alone is more: a POST
        # is let in before its body is read (see let_in).
        self.max_inbox_bytes = max_queued_bytes
        self.inbox_bytes = 0
        self._inbox_room = trio.Event()
        self._room_waiters = 0
        self._wakers: dict[int, trio.Event] = {}
        self._told_dropped = False
        self._log = get_logger(http_session=session_id[:8])

    # -- the Connection protocol ------------------------------------------

    async def receive(self) -> tuple[list[Frame], int]:
        try:
            frames, size = await self._inbox.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return [], 0
        self.inbox_bytes -= size  # (let_out, inline: once per POST)
        if self._room_waiters:
            self._wake_room()
        return frames, size

    async def send(self, messages: list[Outgoing]) -> None:
        if self.closed:
            raise TransportClosed("the HTTP session ended")
        touched: set[int] = set()
        for message in messages:
            try:
                number = self.streams.add(message, wire.encode(message))
            except wire.Overflow as exc:
                self._log.warning("http.session_not_reading", detail=str(exc))
                raise NotReading(f"outbound queue full: {exc}") from None
            if number is not None:
                touched.add(number)
        if self.streams.dropped and not self._told_dropped:
            self._told_dropped = True
            self._log.warning(
                "http.standalone_dropped",
                detail="the client opens no GET stream and lets its messages pile up; "
                "the oldest are dropped",
            )
        for number in touched:
            waker = self._wakers.pop(number, None)
            if waker is not None:
                waker.set()

    async def aclose(self) -> None:
        self.closed = True
        self._inbox_send.close()
        self._inbox_room.set()
        for waker in self._wakers.values():
            waker.set()
        self._wakers.clear()

    # -- for the HTTP handlers ----------------------------------------------

    def waker(self, number: int) -> trio.Event:
        """Set when stream ``number`` has something new (or the session ended).
        Take it before looking, so that nothing comes unnoticed in between."""
        if self.closed:
            done = trio.Event()
            done.set()
            return done
        return self._wakers.setdefault(number, trio.Event())

    def wake_all(self) -> None:
        wakers, self._wakers = self._wakers, {}
        for waker in wakers.values():
            waker.set()

    def wake(self, number: int) -> None:
        waker = self._wakers.pop(number, None)
        if waker is not None:
            waker.set()

    def let_in_nowait(self, size: int) -> bool:
        """Count in a POST body of at most ``size`` bytes, if the inbox has
        room for it (or holds nothing: one body always goes in)."""
        if self.inbox_bytes and self.inbox_bytes + size > self.max_inbox_bytes:
            return False
        self.inbox_bytes += size
        return True

    async def let_in(self, size: int) -> bool:
        """Wait until a POST body of at most ``size`` bytes has room, and count
        it in; False if the session ended first. Asked before the body is
        read: while the session's reader lags, the bodies of its next POSTs
        wait unread in their sockets (TCP's backpressure, as on the unix
        socket), not in the daemon's memory."""
        while not self.let_in_nowait(size):
            if self.closed:
                return False
            self._room_waiters += 1
            try:
                await self._inbox_room.wait()
            finally:
                self._room_waiters -= 1
        return True

    def let_out(self, size: int) -> None:
        """``size`` bytes counted in by :meth:`let_in` left (read by the
        session, or the POST ended without handing them over)."""
        self.inbox_bytes -= size
        if self._room_waiters:
            self._wake_room()

    def _wake_room(self) -> None:
        self._inbox_room.set()
        self._inbox_room = trio.Event()

    async def deliver(self, body: bytes, counted: int = 0) -> bool:
        """Hand a POST body to the session; False if it has ended. ``counted``:
        the bytes :meth:`let_in` counted in for it (which the body's own
        length replaces; they are let out again when the session reads it)."""
        size = len(body)
        self.inbox_bytes += size - counted
        if counted > size and self._room_waiters:
            self._wake_room()
        item: tuple[list[Frame], int] = ([body], size)
        try:
            try:
                self._inbox_send.send_nowait(item)  # no pass through the scheduler
            except trio.WouldBlock:  # when there is room (the usual case)
                await self._inbox_send.send(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.let_out(size)
            return False
        except BaseException:
            self.let_out(size)
            raise
        return True

    def end(self, reason: str) -> None:
        self._log.info("http.session_ending", reason=reason)
        self.cancel_scope.cancel()


class HttpListener:
    """The ASGI application: every HTTP request of every session."""

    def __init__(
        self,
        policy: Callable[[], Policy],
        servers: Iterable[str],
        max_message_bytes: int,
        max_queued_bytes: int,
        open_session: OpenSession,
        idle_seconds: float = IDLE_SECONDS,
        catalogs: CatalogSource | None = None,
    ) -> None:
        """``catalogs``: where the tools' schemas are read, to check a modern
        ``tools/call``'s ``Mcp-Param-*`` headers (without: not checked)."""
        self._policy = policy
        self._catalogs = catalogs
        self._servers = servers  # (read at each request: a reload may change them)
        self._limit = max_message_bytes
        self._max_queued_bytes = max_queued_bytes
        self._open_session = open_session
        self.idle_seconds = idle_seconds
        self.sessions: dict[str, HttpConnection] = {}
        self.ticks = 0  # how often the streams were told to look (see _tick)
        # 2026-07-28 clients: no HTTP session, a context per request (http_modern.py)
        self.modern = ModernHttp(open_session, max_queued_bytes)
        self._nursery: trio.Nursery | None = None
        self._log = get_logger()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the sessions' tasks and end idle sessions, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._tick)
            await nursery.start(self.modern.run)
            task_status.started()
            while True:
                await trio.sleep(min(REAP_SECONDS, self.idle_seconds / 4))
                self.reap(trio.current_time())

    async def _tick(self) -> None:
        """Wake every stream's writer now and then, so that one with nothing
        to say writes its keep-alive comment (one task for all of them: a
        timer per wait cost a tenth of an SSE answer's CPU)."""
        while True:
            await trio.sleep(sse.TICK_SECONDS)
            self.ticks += 1
            for session in list(self.sessions.values()):
                session.wake_all()

    def reap(self, now: float) -> None:
        for session in list(self.sessions.values()):
            if not session.busy and now - session.last_active > self.idle_seconds:
                session.end(f"idle for more than {self.idle_seconds:g} s")

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        headers = scope["headers"]
        host = next((v.decode("latin-1") for k, v in headers if k.lower() == b"host"), "")
        target = wire.check_request(
            scope["method"], scope["path"], host, headers, tuple(self._servers), self._policy()
        )
        if isinstance(target, wire.Refuse):
            return await self._refuse(send, target, scope)
        if target.modern:
            await self._modern_post(target, scope, receive, send)
        elif target.method == "POST":
            await self._post(target, scope, receive, send)
        elif target.method == "GET":
            await self._get(target, scope, receive, send)
        else:
            await self._delete(target, scope, send)

    # -- the verbs ----------------------------------------------------------

    async def _post(self, target: wire.Target, scope: Any, receive: Receive, send: Send) -> None:
        session = self.sessions.get(target.session_id or "")
        counted = 0  # bytes let into the session's inbox for this body, until handed over
        if session is not None:  # (else an initialize, or a session that ended: refused below)
            declared = wire.content_length(target.fields)
            if declared is not None and declared > self._limit:
                return await self._refuse(send, wire.too_large(declared, self._limit), scope)
            counted = self._limit if declared is None else declared  # (chunked: the most)
            if not session.let_in_nowait(counted) and not await session.let_in(counted):
                return await self._refuse(send, _ENDED, scope)
        try:
            body = await _read_body(receive, target.fields, self._limit)
            if isinstance(body, wire.Refuse):
                return await self._refuse(send, body, scope)
            version = session.streams.version if session else None
            header = target.fields.get(wire.VERSION_HEADER)
            post = wire.read_post(body, self._limit, version, header)
            if isinstance(post, wire.Refuse):
                return await self._refuse(send, post, scope)
            refused = wire.check_session(target, session is not None, post.initialize)
            if refused is not None:
                return await self._refuse(send, refused, scope)
            mode = wire.choose_mode(target.fields, post.initialize) if post.requests else False
            if isinstance(mode, wire.Refuse):
                return await self._refuse(send, mode, scope)
            new = session is None
            if session is None:
                if len(self.sessions) >= MAX_SESSIONS:
                    busy = wire.Refuse(503, f"Too many HTTP sessions ({MAX_SESSIONS})")
                    return await self._refuse(send, busy, scope)
                session = self._start_session(target)
            json_first = mode is True and wire.json_first(target.fields, post)
            session.busy += 1
            try:
                number = session.streams.open(post, mode, json_first) if post.requests else None
                if isinstance(number, wire.Refuse):
                    return await self._refuse(send, number, scope)
                for cancelled in session.streams.answered(post):
                    session.wake(cancelled)  # (its stream may be over now)
                handed, counted = counted, 0
                if not await session.deliver(body, handed):
                    return await self._refuse(send, _ENDED, scope)
                if number is None:
                    return await respond(send, 202)
                fields = [(b"mcp-session-id", session.id.encode())]
                if mode and not json_first:
                    priming = session.streams.priming(number)
                    await self._stream(session, number, receive, send, fields, [], priming, False)
                else:
                    await self._answer(session, number, receive, send, fields, new)
            finally:
                session.busy -= 1
                session.last_active = trio.current_time()
                if new and session.streams.version is None:
                    session.end("initialize failed")
        finally:
            if counted and session is not None:  # (its body never reached the session)
                session.let_out(counted)

    async def _modern_post(
        self, target: wire.Target, scope: Any, receive: Receive, send: Send
    ) -> None:
        """A 2026-07-28 request: checked here, answered by its own context."""
        if target.method != "POST":
            header = target.fields.get(wire.VERSION_HEADER)
            return await self._refuse(send, http_modern.wrong_verb(target.method, header), scope)
        body = await _read_body(receive, target.fields, self._limit)
        if isinstance(body, wire.Refuse):
            return await self._refuse(send, body, scope)
        post = http_modern.read_post(body, target.fields, scope["headers"])
        if isinstance(post, wire.Refuse):
            return await self._refuse(send, post, scope)
        if not post.request:
            return await respond(send, 202)  # (no client notification means anything here)
        if post.method == "tools/call" and self._catalogs is not None:
            refused = self._check_params(target, post.message, scope["headers"])
            if refused is not None:
                return await self._refuse(send, refused, scope)
        mode = http_modern.answer_mode(target.fields, post.method)
        if isinstance(mode, wire.Refuse):
            return await self._refuse(send, mode, scope)
        json = wire.accepts_json(target.fields)
        await self.modern.answer(target, post, body, mode, receive, send, json_ok=json)

    def _check_params(
        self, target: wire.Target, request: dict[str, Any], headers: Any
    ) -> wire.Refuse | None:
        """A modern ``tools/call``'s ``Mcp-Param-*`` headers against its
        arguments, as its tool's schema marks them (broker/wire/param_headers.py)."""
        assert self._catalogs is not None
        view = tuple(self._servers) if target.view is None else target.view
        params = request["params"]
        catalog = self._catalogs.current
        schema = param_headers.tool_schema(catalog, view, target.transparent, params.get("name"))
        try:
            param_headers.check(schema, params.get("arguments"), headers)
        except JsonRpcError as exc:
            return wire.Refuse(400, exc.message, code=exc.code, id=request["id"])
        return None

    async def _get(self, target: wire.Target, scope: Any, receive: Receive, send: Send) -> None:
        session = self.sessions.get(target.session_id or "")
        refused = wire.check_session(target, session is not None)
        if refused is None and not wire.accepts_sse(target.fields):
            refused = wire.Refuse(406, "Not Acceptable: a GET stream is text/event-stream")
        if refused is not None or session is None:
            return await self._refuse(send, refused or _ENDED, scope)
        last = target.fields.get(wire.LAST_EVENT_HEADER)
        if last is not None:
            resumed = session.streams.resume(last)
            if isinstance(resumed, wire.Refuse):
                return await self._refuse(send, resumed, scope)
            number, replay = resumed
            priming = None
        else:
            number, replay = wire.STANDALONE, []
            priming = session.streams.priming(number)
        session.busy += 1
        try:
            await self._stream(session, number, receive, send, [], replay, priming, True)
        finally:
            session.busy -= 1
            session.last_active = trio.current_time()

    async def _delete(self, target: wire.Target, scope: Any, send: Send) -> None:
        session = self.sessions.get(target.session_id or "")
        refused = wire.check_session(target, session is not None)
        if refused is not None or session is None:
            return await self._refuse(send, refused or _ENDED, scope)
        session.end("the client deleted it")
        await respond(send, 204)

    # -- answers ------------------------------------------------------------

    async def _stream(
        self,
        session: HttpConnection,
        number: int,
        receive: Receive,
        send: Send,
        fields: list[tuple[bytes, bytes]],
        replay: list[wire.Event],
        priming: bytes | None,
        watch: bool,
    ) -> None:
        """Write stream ``number`` as SSE until it is done (a POST's: its
        answers written), the session ends, the client leaves, or another
        GET takes the stream over."""
        writer = object()
        if session.streams.attach(number, writer) is not None:
            session.wake(number)  # the response writing it until now stops
        first = (priming or b"") + b"".join(event.data for event in replay)
        try:
            await self._sse(session, number, writer, receive, send, fields, first, watch)
        finally:
            session.streams.detach(number, writer)

    async def _sse(
        self,
        session: HttpConnection,
        number: int,
        writer: object,
        receive: Receive,
        send: Send,
        fields: list[tuple[bytes, bytes]],
        first: bytes,
        watch: bool,
    ) -> None:
        """The SSE response ``writer`` writes stream ``number`` as, ``first``
        first. A GET stream (``watch``) has a task watching for the client
        leaving; a POST's stream ends with its answers, so a client that left
        is found by the next write (an answer, progress, or the keep-alive
        comment), which raises (ASGI's OSError) and ends the response."""
        headers = [
            (b"content-type", sse.CONTENT_TYPE.encode()),
            (b"cache-control", b"no-cache"),
            *fields,
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if not watch:
            await self._write_stream(session, number, writer, send, first)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_until_disconnect, receive, nursery.cancel_scope)
            await self._write_stream(session, number, writer, send, first)
            nursery.cancel_scope.cancel()

    async def _write_stream(
        self, session: HttpConnection, number: int, writer: object, send: Send, first: bytes
    ) -> None:
        if first:
            await write(send, first)
        if not await self._pump(session, number, writer, send):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, session: HttpConnection, number: int, writer: object, send: Send) -> bool:
        """Write the stream's events as they come; whether its last went
        with the response's end (one write, not two, for a POST's answer)."""
        streams = session.streams
        written = self.ticks
        while not session.closed and streams.writer_of(number) is writer:
            waker = session.waker(number)
            events = streams.take(number)
            if events:
                data = b"".join(event.data for event in events)
                if streams.done(number):
                    await send({"type": "http.response.body", "body": data, "more_body": False})
                    return True
                await write(send, data)
                written = self.ticks
                continue
            if streams.done(number):
                return False
            if self.ticks - written >= sse.KEEPALIVE_TICKS:  # quiet for 15 to 20 s
                await write(send, sse.KEEPALIVE)
                written = self.ticks
                continue
            await waker.wait()
        return False

    async def _answer(
        self,
        session: HttpConnection,
        number: int,
        receive: Receive,
        send: Send,
        fields: list[tuple[bytes, bytes]],
        new: bool,
    ) -> None:
        """Answer a POST with one JSON body once its answers are in (a new
        session's id goes with it only if the session did initialize); or,
        if its stream becomes SSE first (it was opened ``json_first`` and
        something that belongs to its request came before the answer, or it
        has waited ``sse.KEEPALIVE_SECONDS`` without a word), as that stream.

        No task watches for the client leaving meanwhile (one per request
        halved the throughput): the answer comes, or the broker's request
        timeout answers for it, or the keep-alive comment goes, and writing
        to a client that left closes the connection."""
        writer = object()
        streams = session.streams
        streams.attach(number, writer)
        since, quiet = self.ticks, b""
        stream: wire.Stream | None = None
        try:
            events: list[wire.Event] = []
            while not session.closed:
                waker = session.waker(number)
                stream = streams.streams.get(number)
                if stream is None or (not stream.waiting and not stream.sse):
                    events = streams.take(number)
                    break
                if stream.sse:  # something came before the answer (or nothing for long)
                    first = (stream.opening or b"") + quiet
                    await self._sse(session, number, writer, receive, send, fields, first, False)
                    return
                if stream.json_first and self.ticks - since >= sse.KEEPALIVE_TICKS:
                    streams.as_sse(number)  # quiet for 15 to 20 s: say so, as SSE
                    quiet = sse.KEEPALIVE
                    continue
                await waker.wait()
            if not events and (session.closed or stream is None):
                await self._refuse(send, _ENDED, None)
            elif not events:  # (its requests were cancelled: no answer comes)
                await respond(send, 202)
            else:
                body = events[0].data
                if len(events) > 1:
                    body = b"[" + b",".join(event.data for event in events) + b"]"
                initialized = not new or session.streams.version is not None
                await respond(send, 200, body, fields if initialized else [])
        finally:
            streams.detach(number, writer)

    async def _refuse(self, send: Send, refuse: wire.Refuse, scope: Any) -> None:
        if scope is not None:
            log = self._log.warning if refuse.status in (401, 403) else self._log.info
            log(
                "http.refused",
                status=refuse.status,
                reason=refuse.reason,
                method=scope.get("method"),
                peer=str(scope.get("client")),
            )
        extra = [(k.lower().encode(), v.encode()) for k, v in refuse.headers]
        await respond(send, refuse.status, refuse.body(), extra)

    # -- sessions -----------------------------------------------------------

    def _start_session(self, target: wire.Target) -> HttpConnection:
        assert self._nursery is not None
        session = HttpConnection(secrets.token_urlsafe(32), self._max_queued_bytes)
        self.sessions[session.id] = session
        self._nursery.start_soon(self._run_session, session, target.view, target.transparent)
        return session

    async def _run_session(
        self, session: HttpConnection, view: tuple[str, ...] | None, transparent: bool
    ) -> None:
        try:
            with session.cancel_scope:
                await self._open_session(session, view, transparent)
        finally:
            self.sessions.pop(session.id, None)
            await session.aclose()  # (idempotent: the Session closed it already)


_ENDED = wire.Refuse(404, "Session not found: it ended (initialize again)")


async def _read_body(receive: Receive, fields: dict[str, str], limit: int) -> bytes | wire.Refuse:
    """A request's body, or 413 as soon as it is known to be over ``limit``."""
    length = wire.content_length(fields)
    if length is not None and length > limit:
        return wire.too_large(length, limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return wire.Refuse(400, "The client left before its request's body was read")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return wire.too_large(size, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _until_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once the client has gone (ASGI's ``http.disconnect``)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def serve_http(
    host: str,
    port: int,
    policy: Callable[[], Policy],
    servers: Iterable[str],
    max_message_bytes: int,
    max_queued_bytes: int,
    open_session: OpenSession,
    catalogs: CatalogSource | None = None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve Streamable HTTP clients on ``host:port`` until cancelled; reports
    the port bound. ``policy()`` says who may connect, asked at each request
    (a reload may change it)."""
    listener = HttpListener(
        policy, servers, max_message_bytes, max_queued_bytes, open_session, catalogs=catalogs
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        bound = await nursery.start(HttpServer(listener).serve, host, port)
        task_status.started(bound)
