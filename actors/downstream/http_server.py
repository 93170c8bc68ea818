"""The HTTP/1.1 server under ``serve --http``: h11 on Trio's sockets, one task per connection.

Each accepted connection gets one task, which reads requests with h11 and
hands each, in that same task, to an ASGI-shaped application (the
listener's :class:`~actors.downstream.http.HttpListener`): ``scope``,
``receive`` and ``send`` are plain dicts and coroutines over the
connection, with no task, channel or timer per request. A response's SSE
stream is written on its connection by that task until it ends; the next
request on the connection is read after it (HTTP/1.1 carries one at a time).

Bounds: a request's head (``MAX_HEAD_BYTES``), the connections open at once
(``MAX_CONNECTIONS``; past it, 503 and close), a connection idle between
requests or slow to send one (``IDLE_SECONDS``), and what a client may send
ahead while its request is answered (``MAX_HEAD_BYTES`` more). Bad HTTP gets
h11's status (400, or 431 for a head too large) and the connection closes.
The body's limit is the application's: it refuses a Content-Length over it
before reading (and the connection then closes, its body unread).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from functools import partial
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import h11
import trio

from actors.logs import get_logger

MAX_HEAD_BYTES = 64 * 1024  # a request line and header fields, at most
MAX_CONNECTIONS = 2048  # open at once; past it, 503 and close
IDLE_SECONDS = 60.0  # between requests, or to send a whole request head or body
RECEIVE_BYTES = 65536

App = Callable[
    [dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Any]],
    Awaitable[None],
]

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_DISCONNECT = {"type": "http.disconnect"}


class _Gone(Exception):
    """The client sent nothing for too long."""


class ClientGone(OSError):
    """Raised by ``send`` once the client has closed or broken the connection
    (as ASGI asks of a server: an OSError of its own)."""


class _Exchange:
    """One connection: the h11 state, its socket, and the request being answered."""

    def __init__(self, stream: trio.SocketStream, idle_seconds: float) -> None:
        self.stream = stream
        self.idle_seconds = idle_seconds
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.head: bytes | None = None  # a response's head, sent with its first body
        self.gone = False  # the client left: nothing more is written
        self.usable = True  # False: close after this response (a write cut short, a bug)
        self.peer: Any = None

    async def next_event(self) -> Any:
        """h11's next event, reading from the socket as it needs."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            with trio.move_on_after(self.idle_seconds):
                self.h11.receive_data(await self._receive())
                continue
            raise _Gone("the client sent nothing for too long")

    async def _receive(self) -> bytes:
        try:
            return await self.stream.receive_some(RECEIVE_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    # -- ASGI, for the application ------------------------------------------

    async def receive(self) -> dict[str, Any]:
        """The request's body in pieces; once it is read, ``http.disconnect``
        when the client leaves (what it sends ahead meanwhile is kept for later)."""
        if self.h11.their_state is h11.SEND_BODY:
            chunks = []
            try:
                event = await self.next_event()
                while isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                    event = self.h11.next_event()  # (more of it already here: no wait)
            except (_Gone, h11.RemoteProtocolError):
                event = None
            if isinstance(event, h11.EndOfMessage):
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            if event is h11.NEED_DATA:
                return {"type": "http.request", "body": b"".join(chunks), "more_body": True}
            self.usable = False
            return _DISCONNECT
        while not self.gone:
            if len(self.h11.trailing_data[0]) > MAX_HEAD_BYTES:
                await trio.sleep_forever()  # it sends ahead too much: read no more
            data = await self._receive()
            if not data:
                self.gone = True
                break
            self.h11.receive_data(data)
        return _DISCONNECT

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = message["headers"]
            if not self._body_read():
                headers = [*headers, (b"connection", b"close")]  # its body is left unread
            status = message["status"]
            response = h11.Response(
                status_code=status, headers=headers, reason=_REASONS.get(status, b"")
            )
            self.head = self.h11.send(response)
            return
        body = message.get("body", b"")
        data = self.head or b""
        self.head = None
        if body:
            data += self.h11.send(h11.Data(data=body))
        if not message.get("more_body", False):
            data += self.h11.send(h11.EndOfMessage())
        await self.write(data)

    def _body_read(self) -> bool:
        """Whether the request is read to its end (what is here of a body the
        application did not read, it did not want: it is passed over)."""
        connection = self.h11
        while connection.their_state is h11.SEND_BODY:
            try:
                if connection.next_event() is h11.NEED_DATA:
                    return False
            except h11.RemoteProtocolError:
                return False
        return connection.their_state is h11.DONE

    async def write(self, data: bytes) -> None:
        if self.gone:
            raise ClientGone("the client closed the connection")
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
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
        self._log = get_logger(listener="http")

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Accept connections on ``host:port`` until cancelled; reports the port bound."""
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, self.handle, port, host=host))
            task_status.started(listeners[0].socket.getsockname()[1])

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        exchange = _Exchange(stream, self.idle_seconds)
        with contextlib.suppress(OSError):  # (it may have gone already)
            exchange.peer = stream.socket.getpeername()
        try:
            if self.connections > self.max_connections:
                await self._refuse(exchange, 503, b"Too many HTTP connections")
                return
            await self._requests(exchange)
        except (_Gone, ClientGone):
            pass
        finally:
            self.connections -= 1
            await trio.aclose_forcefully(stream)

    async def _requests(self, exchange: _Exchange) -> None:
        connection = exchange.h11
        while True:
            try:
                event = await exchange.next_event()
            except h11.RemoteProtocolError as exc:
                if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await self._refuse(exchange, exc.error_status_hint, f"Bad request: {exc}")
                return
            if not isinstance(event, h11.Request):
                return  # the client closed the connection
            await self._answer(exchange, event)
            if not exchange.usable or exchange.gone or connection.our_state is not h11.DONE:
                return
            if connection.their_state is not h11.DONE:
                return  # its body was left unread (it said: connection: close)
            try:
                connection.start_next_cycle()
            except h11.LocalProtocolError:
                return  # a side asked to close the connection

    async def _answer(self, exchange: _Exchange, request: h11.Request) -> None:
        path, _, query = bytes(request.target).partition(b"?")
        scope = {
            "type": "http",
            "http_version": request.http_version.decode(),
            "method": request.method.decode("ascii", "replace"),
            "path": unquote(path.decode("latin-1")),
            "query_string": query,
            "headers": [(bytes(name), bytes(value)) for name, value in request.headers],
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
            if exchange.h11.our_state is h11.SEND_RESPONSE:  # (nothing of its answer went)
                await self._refuse(exchange, 500, b"Internal server error")

    async def _refuse(self, exchange: _Exchange, status: int, text: str | bytes) -> None:
        body = (text.encode() if isinstance(text, str) else text) + b"\n"
        fields = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        response = h11.Response(
            status_code=status, headers=fields, reason=_REASONS.get(status, b"")
        )
        connection = exchange.h11
        await exchange.write(
            connection.send(response)
            + connection.send(h11.Data(data=body))
            + connection.send(h11.EndOfMessage())
        )


def _only_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says only that the client left (maybe in a group)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(ClientGone)[1] is None
    return isinstance(exc, ClientGone)
