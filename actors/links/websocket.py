"""A server reached by WebSocket (``"url": "ws://..."`` or ``"wss://..."``).

One JSON-RPC message per text frame (binary frames are read as UTF-8 too),
subprotocol ``mcp``, the config's ``headers`` sent with the handshake. The
connection's reader is trio-websocket's own task, in the nursery the
Upstream gives the link, so it ends with the connection.

Size: a message over ``broker.maxMessageBytes`` is handed on as an
:class:`~broker.wire.frames.Oversize` (its caller is answered with an error,
as for a stdio server); one over :data:`HARD_LIMIT_FACTOR` times the limit
is refused by trio-websocket itself, which closes the connection (1009) and
the Upstream reconnects.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import orjson
import trio
import trio_websocket

from actors.errors import TransportClosed
from actors.links.link import LaunchError, LinkContext
from broker.config import ServerConfig
from broker.jsonrpc import Message
from broker.wire import websocket as wire
from broker.wire.frames import Frame

CONNECT_TIMEOUT = 30.0
CLOSE_TIMEOUT = 2.0
HARD_LIMIT_FACTOR = 4
RECEIVE_BUFFER = 256 * 1024


class WebSocketLink:
    def __init__(self, connection: Any, url: str, max_message_bytes: int) -> None:
        self._ws = connection
        self._max = max_message_bytes
        self.info: Mapping[str, Any] = {"url": url}

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
        return [wire.frame_of(message, self._max)]

    async def ended(self) -> str:
        closed = self._ws.closed
        if closed is None:
            return ""
        return (
            f" (WebSocket closed: {closed.code} {closed.name}{wire.reason_suffix(closed.reason)})"
        )

    async def close(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
            await self._ws.aclose()


async def launch_websocket(config: ServerConfig, context: LinkContext) -> WebSocketLink:
    """Connect to a WebSocket server as configured (a refused or failed
    connection is an ``OSError`` to retry with backoff, like a process that
    could not start)."""
    url = config.url or ""
    if not url.startswith(("ws://", "wss://")):
        raise LaunchError(f"has a url mcpbroker cannot reach yet ({url}: only ws:// and wss://)")
    headers = [(k.encode(), v.encode()) for k, v in config.headers.items()]
    tls = ssl.create_default_context() if url.startswith("wss://") else None
    try:
        with trio.fail_after(CONNECT_TIMEOUT):
            connection = await trio_websocket.connect_websocket_url(
                context.nursery,
                url,
                tls,
                subprotocols=[wire.SUBPROTOCOL],
                extra_headers=headers,
                max_message_size=context.max_message_bytes * HARD_LIMIT_FACTOR,
                receive_buffer_size=RECEIVE_BUFFER,
            )
    except trio.TooSlowError as exc:
        raise OSError(f"no WebSocket handshake within {CONNECT_TIMEOUT:g} s") from exc
    except trio_websocket.HandshakeError as exc:
        raise OSError(f"WebSocket handshake refused ({_describe(exc)})") from exc
    return WebSocketLink(connection, url, context.max_message_bytes)


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    return f"HTTP {status}" if status is not None else str(exc) or type(exc).__name__
