"""A server reached by WebSocket (``"url": "ws://..."`` or ``"wss://..."``).

One JSON-RPC message per text frame (binary frames are read as UTF-8 too),
subprotocol ``mcp``, the config's ``headers`` sent with the handshake.

The link opens the TCP (and TLS) connection itself and hands it to
trio-websocket, so that it always closes it: trio-websocket does not when
the server closed first, a message was too big or its reader was cancelled
(the garbage collector would, some time later). The connection
lives in a task of the link's own (:meth:`WebSocketLink._run`), in the
nursery the Upstream gives the link, and trio-websocket's reader in a
nursery of that task: what the reader raises (a refused handshake arrives
that way) ends this connection, never the Upstream. :meth:`WebSocketLink.close`
asks that task to close the connection (a close handshake, bounded) and
waits for it; a daemon being cancelled cancels it, and the socket is closed
at once, with no handshake to wait for.

Size, in bytes (UTF-8): a message over ``broker.maxMessageBytes`` is handed
on as an :class:`~broker.wire.frames.Oversize` (its caller is answered with
an error, as for a stdio server); one over :data:`HARD_LIMIT_FACTOR` times
the limit closes the connection (1009) and the Upstream reconnects.
trio-websocket refuses such a message while it reads, but counts a text
message in characters; one within the hard limit in characters and over it
in bytes is refused the same way once read.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs
import orjson
import trio
import trio_websocket
from wsproto.utilities import RemoteProtocolError

from actors.errors import TransportClosed
from actors.links.link import LaunchError, LinkContext, configured_headers
from broker.config import ServerConfig
from broker.jsonrpc import Message
from broker.redact import shown_url
from broker.wire import websocket as wire
from broker.wire.frames import Frame, Oversize

CONNECT_TIMEOUT = 30.0
CLOSE_TIMEOUT = 2.0
HARD_LIMIT_FACTOR = 4
RECEIVE_BUFFER = 256 * 1024


class WebSocketLink:
    def __init__(self, url: str, max_message_bytes: int) -> None:
        self._ws: Any = None  # the trio-websocket connection, once open
        self._max = max_message_bytes
        self.info: Mapping[str, Any] = {"url": shown_url(url)}
        self._closing = trio.Event()  # close() asks _run to end the connection
        self._closed = trio.Event()  # _run has ended it
        self._too_big: str | None = None  # why receive() closed the connection (1009)

    def speak(self, version: str | None) -> None:
        pass  # (the era is in the messages alone)

    def encode(self, messages: list[Message]) -> list[bytes]:
        return [orjson.dumps(message) for message in messages]  # a frame each

    def send_nowait(self, units: list[bytes]) -> list[bytes]:
        if self._ws.closed is not None:
            raise TransportClosed
        return units  # (trio-websocket only writes by awaiting: the writer task does)

    async def send(self, units: list[bytes]) -> None:
        try:
            for unit in units:
                await self._ws.send_message(unit.decode())
        except trio_websocket.ConnectionClosed as exc:
            raise TransportClosed from exc

    async def receive(self) -> list[Frame]:
        try:
            message = await self._ws.get_message()
        except trio_websocket.ConnectionClosed:
            return []
        frame = wire.frame_of(message, self._max)
        if type(frame) is Oversize and frame.size > self._max * HARD_LIMIT_FACTOR:
            # (Within trio-websocket's limit in characters: see the module's docstring.)
            self._too_big = f"Exceeded maximum message size: {self._max * HARD_LIMIT_FACTOR} bytes"
            with trio.move_on_after(CLOSE_TIMEOUT):
                await self._ws.aclose(wire.MESSAGE_TOO_BIG, self._too_big)
            return []
        return [frame]

    async def ended(self) -> str:
        if self._too_big is not None:
            return f" (WebSocket closed: {wire.MESSAGE_TOO_BIG} MESSAGE_TOO_BIG ({self._too_big}))"
        closed = self._ws.closed
        if closed is None:
            return ""
        return (
            f" (WebSocket closed: {closed.code} {closed.name}{wire.reason_suffix(closed.reason)})"
        )

    async def close(self) -> None:
        self._closing.set()
        with trio.CancelScope(shield=True), trio.move_on_after(2 * CLOSE_TIMEOUT):
            await self._closed.wait()  # (_run bounds its own wait: this is a backstop)

    async def _run(
        self,
        stream: trio.abc.Stream,
        address: _Address,
        headers: list[tuple[bytes, bytes]],
        log: Any,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The connection from its handshake to its end (see the module's docstring)."""
        opened = False
        try:
            async with trio.open_nursery() as reader:
                self._ws = await trio_websocket.wrap_client_stream(
                    reader,
                    stream,  # type: ignore[arg-type]  # (SocketStream or SSLStream)
                    address.host_header,
                    address.resource,
                    subprotocols=[wire.SUBPROTOCOL],
                    extra_headers=headers,
                    max_message_size=self._max * HARD_LIMIT_FACTOR,
                    receive_buffer_size=RECEIVE_BUFFER,
                )
                opened = True
                task_status.started()
                await self._closing.wait()
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await self._ws.aclose()
                reader.cancel_scope.cancel()
        except Exception as exc:  # trio-websocket's reader's, in a group
            if not opened:
                raise OSError(f"WebSocket handshake failed ({_describe(exc)})") from exc
            log.warning("server.websocket_failed", error=_describe(exc))
        finally:
            # (Shielded: a cancelled caller's Cancelled would come out of
            # aclose_forcefully, and skip the next line.)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            self._closed.set()


@attrs.frozen
class _Address:
    host: str
    port: int
    secure: bool
    resource: str  # the path and query to ask for
    host_header: str


def _address(url: str) -> _Address:
    """Where a ``ws://`` or ``wss://`` URL leads; LaunchError if it leads nowhere."""
    try:
        parts = urlsplit(url)
        port = parts.port  # (raises ValueError if it is not a port)
    except ValueError as exc:
        raise LaunchError(f"has a url that is not valid ({shown_url(url)}: {exc})") from None
    if parts.scheme not in ("ws", "wss"):
        raise LaunchError(
            f"has a url mcpbroker cannot reach yet ({shown_url(url)}: only ws:// and wss://)"
        )
    if not parts.hostname:
        raise LaunchError(f"has a url without a host ({shown_url(url)})")
    secure = parts.scheme == "wss"
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    return _Address(
        host=host,
        port=port or (443 if secure else 80),
        secure=secure,
        resource=(parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
        host_header=shown if port is None else f"{shown}:{port}",
    )


async def launch_websocket(config: ServerConfig, context: LinkContext) -> WebSocketLink:
    """Connect to a WebSocket server as configured (a refused or failed
    connection is an ``OSError`` to retry with backoff, like a process that
    could not start)."""
    url = config.url or ""
    address = _address(url)
    headers = [(k.encode(), v.encode()) for k, v in configured_headers(config.headers).items()]
    link = WebSocketLink(url, context.max_message_bytes)
    try:
        with trio.fail_after(CONNECT_TIMEOUT):
            stream = await _connect(address)
            await context.nursery.start(link._run, stream, address, headers, context.log)
    except trio.TooSlowError as exc:
        raise OSError(f"no WebSocket handshake within {CONNECT_TIMEOUT:g} s") from exc
    return link


async def _connect(address: _Address) -> trio.abc.Stream:
    """The TCP connection, and over ``wss://`` its TLS handshake (done here, so
    that a bad certificate is said as such, not as a handshake that never came)."""
    if not address.secure:
        return await trio.open_tcp_stream(address.host, address.port)
    stream = await trio.open_ssl_over_tcp_stream(
        address.host, address.port, ssl_context=ssl.create_default_context(), https_compatible=True
    )
    try:
        await stream.do_handshake()
    except BaseException as exc:  # (cancelled, timed out too: the socket is closed first)
        await trio.aclose_forcefully(stream)
        if isinstance(exc, trio.BrokenResourceError):
            raise OSError(f"TLS handshake failed ({exc.__cause__ or exc})") from exc
        raise
    return stream


def _describe(exc: BaseException) -> str:
    """What went wrong, said for a user. trio-websocket answers a bad handshake
    answer (a wrong ``Sec-WebSocket-Accept``, a subprotocol not asked for) by
    sending a server-only event, so what comes out is h11's complaint about
    that ("can't handle event type Response when role=CLIENT"), with wsproto's
    real reason as its context: that reason is said instead."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    status = getattr(exc, "status_code", None)
    if status is not None:
        return f"HTTP {status}"
    cause: BaseException | None = exc
    for _ in range(8):  # (a chain is short; a cycle must not loop)
        if cause is None:
            break
        if isinstance(cause, RemoteProtocolError):
            return f"the server's answer is not a valid WebSocket handshake: {cause}"
        if isinstance(cause, UnicodeError):
            detail = str(cause)
            if isinstance(cause, UnicodeDecodeError):
                detail = f"byte 0x{cause.object[cause.start : cause.start + 1].hex()}"
            return f"the server's handshake answer has a field that cannot be decoded ({detail})"
        cause = cause.__cause__ or cause.__context__
    return str(exc) or type(exc).__name__
