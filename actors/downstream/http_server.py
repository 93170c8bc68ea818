"""The HTTP/1.1 server under ``serve --http``: llhttp (httptools) on Trio, a task per connection.

Each accepted connection gets one task, which reads requests
(actors/downstream/http_parser.py: httptools parses, that module bounds)
and hands each, in that same task, to an ASGI-shaped application (the
listener's :class:`~actors.downstream.http.HttpListener`): ``scope``,
``receive`` and ``send`` are plain dicts and coroutines over the
connection, with no task, channel or timer per request. A response's SSE
stream is written on its connection by that task until it ends; the next
request on the connection is read after it (HTTP/1.1 carries one at a time).

Responses are written here, without a library: a status line from a table,
the application's fields as given (they are the listener's own; one check
that none holds a line break), and the framing HTTP/1.1 asks for: the
body as is when the application gave its Content-Length, else chunked
(to an HTTP/1.0 client: until the connection closes); no body to a HEAD
request or for 204 and 304; ``connection: close`` when the request asked
for it or the connection cannot carry another. ``Expect: 100-continue``
gets its ``100 Continue`` when the application first reads the body.

Bounds: a request's head (``MAX_HEAD_BYTES``), the connections open at once
(``MAX_CONNECTIONS``; past it, 503 and close), a connection idle between
requests or slow to send one (``IDLE_SECONDS``), and what a client may send
ahead while its request is answered (``MAX_HEAD_BYTES`` more). Bad HTTP gets
400 (431 for a head too large) saying what is wrong, and the connection
closes. The body's limit is the application's: it refuses a Content-Length
over it before reading (and the connection then closes, its body unread).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import trio

from actors.downstream.http_parser import (
    END,
    MAX_HEAD_BYTES,
    NEED_DATA,
    BadRequest,
    Request,
    RequestParser,
)
from actors.logs import get_logger

__all__ = ["MAX_HEAD_BYTES", "ClientGone", "HttpServer"]

MAX_CONNECTIONS = 2048  # open at once; past it, 503 and close
IDLE_SECONDS = 60.0  # between requests, or to send a whole request head or body
RECEIVE_BYTES = 65536

App = Callable[
    [dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Any]],
    Awaitable[None],
]

_STATUS_LINES = {
    status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode())
    for status in HTTPStatus
}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"connection: close\r\n"
_CHUNKED = b"transfer-encoding: chunked\r\n"
_NO_BODY = (204, 304)
_DISCONNECT = {"type": "http.disconnect"}


class ClientGone(OSError):
    """Raised by ``send`` once the client has closed or broken the connection
    (as ASGI asks of a server: an OSError of its own)."""


class _Exchange:
    """One connection: its parser, its socket, and the request being answered."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        # Around everything the connection does: cancelled by the server's
        # watch once the connection has waited too long for a request or its
        # body (since ``waiting_since``; None: it is not waiting for one).
        self.idle = trio.CancelScope()
        self.waiting_since: float | None = None
        self.parser = RequestParser()
        self.peer: Any = None
        self.gone = False  # the client left: nothing more is written
        self.usable = True  # False: close after this response (a write cut short, a bug)
        # The request being answered, and where its answer is.
        self.request: Request | None = None
        self.body_done = True  # its body is read to its end
        self.head: bytes | None = None  # a response's head, sent with its first body
        self.started = False  # its response's head is made
        self.finished = False  # its response is written whole
        self.chunked = False
        self.bodiless = False  # a HEAD request's, or a 204's or 304's
        self.keep_alive = True  # the connection carries another request after it

    def begin(self, request: Request) -> None:
        self.request = request
        self.body_done = False
        self.head = None
        self.started = self.finished = False
        self.keep_alive = request.keep_alive

    async def next_event(self) -> Any:
        """The parser's next event, reading from the socket as it needs."""
        while True:
            event = self.parser.next_event()
            if event is not NEED_DATA:
                return event
            self.waiting_since = trio.current_time()  # (the server's watch reads it)
            data = await self._receive()
            self.waiting_since = None
            self.parser.receive_data(data)

    async def _receive(self) -> bytes:
        """What came next (``b""``: the client closed or broke the connection).
        It waits to be told the socket has data before asking it for any: a
        request comes after its answer went, so asking first would be a
        system call that finds nothing, each time."""
        while True:
            await trio.lowlevel.wait_readable(self.sock)
            try:
                return self.sock.recv(RECEIVE_BYTES)
            except BlockingIOError:
                continue
            except OSError:
                return b""

    # -- ASGI, for the application ------------------------------------------

    async def receive(self) -> dict[str, Any]:
        """The request's body in pieces; once it is read, ``http.disconnect``
        when the client leaves (what it sends ahead meanwhile is kept for later)."""
        if not self.body_done:
            return await self._read_body()
        ahead = 0
        while not self.gone:
            if ahead > MAX_HEAD_BYTES:
                await trio.sleep_forever()  # it sends ahead too much: read no more
            data = await self._receive()
            if not data:
                self.gone = True
                break
            ahead += len(data)
            self.parser.receive_data(data)
        return _DISCONNECT

    async def _read_body(self) -> dict[str, Any]:
        assert self.request is not None
        if self.request.expect_continue and not self.started:
            self.request.expect_continue = False
            await self.write(_CONTINUE)
        pieces = []
        try:
            event = await self.next_event()
            while isinstance(event, bytes):
                pieces.append(event)
                event = self.parser.next_event()  # (more of it already here: no wait)
        except BadRequest:
            event = None
        if event is END:
            self.body_done = True
            return {"type": "http.request", "body": b"".join(pieces), "more_body": False}
        if event is NEED_DATA:
            return {"type": "http.request", "body": b"".join(pieces), "more_body": True}
        self.usable = False  # it left, or went silent, or sent bad HTTP mid-body
        return _DISCONNECT

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self._start(message["status"], message["headers"])
            return
        if self.finished:
            raise RuntimeError("the response is already written")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        data = self.head or b""
        self.head = None
        if body and not self.bodiless:
            data += b"%x\r\n%b\r\n" % (len(body), body) if self.chunked else body
        if not more:
            self.finished = True
            if self.chunked:
                data += b"0\r\n\r\n"
        if data:
            await self.write(data)

    def _start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        if self.started:
            raise RuntimeError("the response has started already")
        self.started = True
        assert self.request is not None
        if not self._body_read():
            self.keep_alive = False  # its body is left unread
        fields = b"".join([name + b": " + value + b"\r\n" for name, value in headers])
        if fields.count(b"\n") != len(headers):
            raise ValueError(f"a response field holds a line break: {headers!r}")
        self.bodiless = status in _NO_BODY or self.request.method == "HEAD"
        self.chunked = False
        framed = fields.startswith(b"content-length:") or fields.find(b"\ncontent-length:") >= 0
        if not self.bodiless and not framed:
            if self.request.http_version == "1.1":
                self.chunked = True
                fields += _CHUNKED
            else:  # an HTTP/1.0 client: the body ends with the connection
                self.keep_alive = False
        if not self.keep_alive:
            fields += _CLOSE
        line = _STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status
        self.head = line + fields + b"\r\n"

    def _body_read(self) -> bool:
        """Whether the request is read to its end (what is here of a body the
        application did not read, it did not want: it is passed over)."""
        parser = self.parser
        while not self.body_done:
            try:
                event = parser.next_event()
            except BadRequest:
                return False
            if event is END:
                self.body_done = True
            elif not isinstance(event, bytes):
                return False  # (NEED_DATA or CLOSED)
        return True

    async def write(self, data: bytes) -> None:
        """Write all of ``data``. What the socket takes at once is written
        without a trip through Trio's scheduler (the connection's task yields
        at its next read, or here when the socket's buffer is full)."""
        if self.gone:
            raise ClientGone("the client closed the connection")
        await trio.lowlevel.checkpoint_if_cancelled()
        rest: bytes | memoryview = data
        try:
            while True:
                try:
                    sent = self.sock.send(rest)
                except BlockingIOError:
                    sent = 0
                if sent == len(rest):
                    return
                rest = memoryview(rest)[sent:]
                await trio.lowlevel.wait_writable(self.sock)
        except OSError as exc:
            self.gone = True
            raise ClientGone("the client closed the connection") from exc
        except BaseException:
            self.usable = False  # cut short (cancelled): the rest of it never goes
            raise


class HttpServer:
    """Serves an ASGI-shaped ``app`` over HTTP/1.1 on Trio's sockets."""

    def __init__(
        self,
        app: App,
        idle_seconds: float = IDLE_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._app = app
        self.idle_seconds = idle_seconds
        self.max_connections = max_connections
        self.connections = 0
        self._exchanges: set[_Exchange] = set()
        self._log = get_logger(listener="http")

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Accept connections on ``host:port`` until cancelled; reports the port bound."""
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, self.handle, port, host=host))
            nursery.start_soon(self._watch_idle)
            task_status.started(listeners[0].socket.getsockname()[1])

    async def _watch_idle(self) -> None:
        """Close connections that have waited more than ``idle_seconds`` for a
        request or its body (one task looking every so often, rather than a
        timer per read: that cost a tenth of the CPU a call takes)."""
        while True:
            await trio.sleep(self.idle_seconds / 8)
            now = trio.current_time()
            for exchange in self._exchanges:
                since = exchange.waiting_since
                if since is not None and now - since > self.idle_seconds:
                    exchange.idle.cancel()

    async def handle(self, stream: trio.SocketStream) -> None:
        # The connection's own socket, read and written here directly: Trio's
        # SocketStream would ask the socket first and wait after, and pass
        # through the scheduler after every call that did not wait.
        sock = socket.socket(fileno=stream.socket.detach())
        sock.setblocking(False)
        self.connections += 1
        exchange = _Exchange(sock)
        self._exchanges.add(exchange)
        with contextlib.suppress(OSError):  # (it may have gone already)
            exchange.peer = sock.getpeername()
        try:
            if self.connections > self.max_connections:
                await self._refuse(exchange, 503, b"Too many HTTP connections")
                return
            await self._requests(exchange)
        except ClientGone:
            pass
        finally:
            self.connections -= 1
            self._exchanges.discard(exchange)
            trio.lowlevel.notify_closing(sock)
            sock.close()

    async def _requests(self, exchange: _Exchange) -> None:
        with exchange.idle:
            await self._serve_requests(exchange)

    async def _serve_requests(self, exchange: _Exchange) -> None:
        while True:
            try:
                event = await exchange.next_event()
            except BadRequest as exc:
                await self._refuse(exchange, exc.status, str(exc))
                return
            if not isinstance(event, Request):
                return  # the client closed the connection
            exchange.begin(event)
            await self._answer(exchange, event)
            if not exchange.finished or not exchange.usable or exchange.gone:
                return
            if not exchange.keep_alive or not exchange.body_done:
                return  # (the request or the response said: connection: close)

    async def _answer(self, exchange: _Exchange, request: Request) -> None:
        path, _, query = request.target.partition(b"?")
        scope = {
            "type": "http",
            "http_version": request.http_version,
            "method": request.method,
            "path": unquote(path.decode("latin-1"))
            if path.find(b"%") >= 0
            else path.decode("latin-1"),
            "query_string": query,
            "headers": request.headers,
            "client": exchange.peer,
        }
        try:
            await self._app(scope, exchange.receive, exchange.send)
        except Exception as exc:
            exchange.usable = False
            if _only_gone(exc):
                return
            # A bug in answering one request ends that connection, not the daemon.
            self._log.exception("http.request_failed", method=scope["method"], path=scope["path"])
            if not exchange.started:  # (nothing of its answer went)
                await self._refuse(exchange, 500, b"Internal server error")

    async def _refuse(self, exchange: _Exchange, status: int, text: str | bytes) -> None:
        body = (text.encode() if isinstance(text, str) else text) + b"\n"
        head = _STATUS_LINES[status] + (
            b"content-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\n" % len(body) + _CLOSE + b"\r\n"
        )
        await exchange.write(head + body)


def _only_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says only that the client left (maybe in a group)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(ClientGone)[1] is None
    return isinstance(exc, ClientGone)
