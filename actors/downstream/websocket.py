"""The WebSocket listener (``mcpbroker serve --ws HOST:PORT``) and its connections.

Hosts that connect by URL reach the daemon at ``ws://HOST:PORT/mcp`` (every
server, aggregated) or ``ws://HOST:PORT/mcp/NAME`` (one server, as it is).
Each WebSocket is one MCP session, one JSON-RPC message per text frame,
subprotocol ``mcp``. Who may connect is decided by the handshake's rules
(broker/wire/websocket.py: Host, Origin, bearer token, path), before any
session exists; a refused client gets an HTTP status and a one-line reason.

A message over ``broker.maxMessageBytes`` closes that connection with 1009
(Message Too Big) and a reason. trio-websocket enforces the limit while it
reads, but counts a text message in characters: one over it in characters is
never held whole; one within it in characters but over it in bytes (UTF-8,
at most four times the limit) is refused the same way once read.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import trio
import trio_websocket
import wsproto.utilities
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection, TextMessage

from actors.errors import TransportClosed
from actors.logs import get_logger
from actors.mailbox import Outgoing
from broker.config import BrokerSettings
from broker.wire import websocket as wire
from broker.wire.frames import Frame

CLOSE_TIMEOUT = 2.0
HANDSHAKE_TIMEOUT = 10.0
# Connections open at once (as the HTTP listener's); past it, a handshake is
# refused 503: idle sessions by the thousand must not take every descriptor.
MAX_CONNECTIONS = 2048
RECEIVE_BUFFER = 256 * 1024

# What the listener does with an accepted connection: run a session on it.
OpenSession = Callable[["WebSocketConnection", tuple[str, ...] | None, bool], Awaitable[None]]


class WebSocketConnection:
    """One client's WebSocket, as a :class:`~actors.downstream.connection.Connection`."""

    transport = "websocket"

    def __init__(self, ws: Any, max_message_bytes: int) -> None:
        self._ws = ws
        self._max = max_message_bytes

    async def receive(self) -> tuple[list[Frame], int]:
        try:
            message = await self._ws.get_message()
        except trio_websocket.ConnectionClosed:
            return [], 0
        data = message.encode() if isinstance(message, str) else bytes(message)
        if len(data) > self._max:  # (within the limit in characters: see the module's docstring)
            reason = f"Exceeded maximum message size: {self._max} bytes"  # (trio-websocket's words)
            with trio.move_on_after(CLOSE_TIMEOUT):
                await self._ws.aclose(wire.MESSAGE_TOO_BIG, reason)
            return [], 0
        return [data], len(data)

    async def send(self, messages: list[Outgoing]) -> None:
        """Write the messages as one ``send_all``: a frame each, encoded by the
        connection's wsproto, written under trio-websocket's lock as its own
        ``send_message`` does. One write per wake-up, not one per message (two
        checkpoints each): a server's burst is delivered faster than that, and
        a client that reads would be cut off as not reading."""
        ws = self._ws
        if ws.closed is not None:
            raise TransportClosed
        try:
            data = b"".join([ws._wsproto.send(TextMessage(wire.text_of(m))) for m in messages])
        except wsproto.utilities.LocalProtocolError as exc:  # (closing meanwhile)
            raise TransportClosed from exc
        async with ws._stream_lock:
            try:
                await ws._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                await ws._abort_web_socket()  # (what trio-websocket's own write does)
                raise TransportClosed from exc

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
            await self._ws.aclose()


def read_token(path: str) -> str:
    """The bearer token in ``path`` (surrounding whitespace removed)."""
    from actors.downstream.unix import ConfigRefused

    path = os.path.expanduser(path)  # (as broker.auditLog: a JSON file has no shell)
    try:
        with open(path, encoding="utf-8") as file:
            token = file.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigRefused(f"cannot read the token file {path}: {exc}") from None
    if not token or any(c.isspace() for c in token):
        raise ConfigRefused(f"the token file {path} must hold one token (no spaces)")
    return token


def policy_for(host: str, settings: BrokerSettings, kind: str = "WebSocket") -> wire.Policy:
    """Who may connect to a listener on ``host`` (a ``kind`` one: WebSocket,
    HTTP), by the settings; off loopback, a token is required (docs/security.md)."""
    from actors.downstream.unix import ConfigRefused

    token = read_token(settings.token_file) if settings.token_file else None
    if token is None and not is_loopback(host):
        raise ConfigRefused(
            f"a {kind} listener on {host}, off loopback, needs a token "
            "(--token-file or broker.tokenFile)"
        )
    return wire.Policy(
        frozenset(settings.allowed_origins), frozenset(settings.allowed_hosts), token
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve_websocket(
    host: str,
    port: int,
    policy: Callable[[], wire.Policy],
    servers: Iterable[str],
    max_message_bytes: int,
    open_session: OpenSession,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve WebSocket clients on ``host:port`` until cancelled; reports the port
    bound. ``policy()`` says who may connect, asked at each handshake (a
    reload may change it)."""
    log = get_logger()

    open_now = 0

    async def handle(request: Any) -> None:
        nonlocal open_now
        if open_now >= MAX_CONNECTIONS:
            reason = f"more than {MAX_CONNECTIONS} connections at once"
            log.warning("websocket.refused", status=503, reason=reason, peer=str(request.remote))
            with contextlib.suppress(trio_websocket.ConnectionClosed, trio.BrokenResourceError):
                await request.reject(503, body=reason.encode() + b"\n")
            return
        open_now += 1
        try:
            await _serve_one(request)
        finally:
            open_now -= 1

    async def _serve_one(request: Any) -> None:
        try:
            decision = wire.check_handshake(
                request.path,
                _host_of(request),
                request.headers,
                request.proposed_subprotocols,
                tuple(servers),  # (as they are now: a reload may change them)
                policy(),
            )
            if isinstance(decision, wire.Reject):
                log.warning(
                    "websocket.refused",
                    status=decision.status,
                    reason=decision.reason,
                    peer=str(request.remote),
                )
                headers = [(k.encode(), v.encode()) for k, v in decision.headers]
                await request.reject(
                    decision.status, extra_headers=headers, body=decision.reason.encode() + b"\n"
                )
                return
            ws = await request.accept(subprotocol=decision.subprotocol)
        except (trio_websocket.ConnectionClosed, trio.BrokenResourceError):
            return  # the client left during the handshake
        except Exception:  # a bug of the broker's: this client is refused, the daemon goes on
            log.exception("websocket.handshake_failed", peer=str(request.remote))
            with contextlib.suppress(trio_websocket.ConnectionClosed, trio.BrokenResourceError):
                await request.reject(500, body=b"mcpbroker: internal error\n")
            return
        await open_session(
            WebSocketConnection(ws, max_message_bytes), decision.view, decision.transparent
        )

    async def serve(*, task_status: trio.TaskStatus[Any]) -> None:
        server = _GuardedServer(
            handle,
            await trio.open_tcp_listeners(port, host=host),
            max_message_size=max_message_bytes,
            receive_buffer_size=RECEIVE_BUFFER,
            connect_timeout=HANDSHAKE_TIMEOUT,
            disconnect_timeout=CLOSE_TIMEOUT,
        )
        await server.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve)
        task_status.started(server.port)


class _GuardedServer(trio_websocket.WebSocketServer):
    """trio-websocket's server, with each connection guarded: an exception
    from reading one client's handshake or frames ends that connection only.

    wsproto decodes some fields strictly (Host as IDNA; Connection, Upgrade,
    Sec-WebSocket-Protocol and -Extensions as ASCII) and raises a plain
    ``UnicodeError``, which trio-websocket's reader does not catch: unguarded,
    one request with ``Host: xn--zz-`` ended the daemon, before the Host,
    Origin or token checks ran. Its connections are :class:`_Connection`."""

    async def _handle_connection(self, stream: trio.abc.Stream) -> None:
        # (trio-websocket's own, with _Connection, and the guard around it)
        answered = False
        try:
            async with trio.open_nursery() as nursery:
                connection = _Connection(
                    stream,
                    WSConnection(ConnectionType.SERVER),
                    message_queue_size=self._message_queue_size,
                    max_message_size=self._max_message_size,
                    receive_buffer_size=self._receive_buffer_size,
                )
                nursery.start_soon(connection._reader_task)
                with trio.move_on_after(self._connect_timeout) as connect_scope:
                    request = await connection._get_request()
                if connect_scope.cancelled_caught:
                    nursery.cancel_scope.cancel()
                    await stream.aclose()
                    return
                answered = True  # (from here on, an HTTP status can no longer be written)
                try:
                    await self._handler(request)
                finally:
                    with trio.move_on_after(self._disconnect_timeout):
                        await connection.aclose()
        except Exception as exc:  # (trio.Cancelled is not an Exception)
            await _refuse_unreadable(stream, exc, answered=answered)


class _Connection(trio_websocket.WebSocketConnection):
    """trio-websocket's connection, failing a broken one as RFC 6455 says.

    wsproto reports a frame it cannot parse (a text that is not UTF-8, an
    unmasked frame, RSV bits, a continuation with no start, a bad control
    frame) as a ``CloseConnection`` with the code to fail the connection with
    (1007, 1002), its state still ``OPEN``; trio-websocket answers a close
    only in ``REMOTE_CLOSING`` (the peer's), so it cut the TCP connection
    with no Close frame. Here the Close frame is sent first (section 7.1.7),
    and the failure logged with its reason."""

    async def _handle_close_connection_event(self, event: CloseConnection) -> None:
        if self._wsproto.state is ConnectionState.OPEN:  # (not the peer's close: ours)
            get_logger().warning(
                "websocket.failed", code=event.code, reason=event.reason, peer=str(self.remote)
            )
            with contextlib.suppress(trio_websocket.ConnectionClosed):
                await self._send(CloseConnection(code=event.code, reason=event.reason))
        await super()._handle_close_connection_event(event)


async def _refuse_unreadable(stream: trio.abc.Stream, exc: Exception, *, answered: bool) -> None:
    """End a connection an exception came out of (called in its ``except``):
    before any answer, a request trio-websocket could not read, refused 400
    saying why; after, logged with the traceback. Then close."""
    log = get_logger()
    cause = _leaf(exc)
    if isinstance(cause, UnicodeError):
        reason = "a header field cannot be decoded (not ASCII, or a Host that is not a valid name)"
    else:
        reason = "a malformed request"
    peer = _peer_of(stream)
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            if not answered:
                log.warning(
                    "websocket.refused", status=400, reason=reason, error=repr(cause), peer=peer
                )
                body = reason.encode() + b"\n"
                await stream.send_all(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n"
                    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
                )
            else:  # (the session's, or a frame's: a bug of the broker's or a library's)
                log.exception("websocket.failed", reason="the connection failed", peer=peer)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.aclose()


def _leaf(exc: BaseException) -> BaseException:
    """The first exception an exception group holds (the group is the nursery's)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _peer_of(stream: trio.abc.Stream) -> str:
    try:
        address = stream.socket.getpeername()  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return "?"
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


def _host_of(request: Any) -> str:
    """The request's Host field. trio-websocket hands on wsproto's request event,
    which keeps Host apart from the other fields, but offers no property for
    it; without one, the Host check refuses (an empty name is not loopback)."""
    event = getattr(request, "_event", None)
    host = getattr(event, "host", "")
    return host if isinstance(host, str) else ""
