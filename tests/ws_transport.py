"""The official SDK's client over a WebSocket: a ``Transport`` for ``Client``.

The SDK's 2.x line has no WebSocket client, so this is one, as its
``stdio_client`` is built: two memory streams of ``SessionMessage``, fed and
drained by a reader and a writer task over trio-websocket (one MCP message
per WebSocket message, subprotocol ``mcp``, as ``serve --ws`` speaks it).
With it the SDK's ``Client`` (either era) reaches the broker by WebSocket.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import trio
import trio_websocket
from mcp import types
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage


@asynccontextmanager
async def websocket_transport(url: str) -> AsyncIterator[TransportStreams]:
    to_client, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_stream, from_client = anyio.create_memory_object_stream[SessionMessage](16)
    async with trio_websocket.open_websocket_url(url, subprotocols=["mcp"]) as ws:
        assert ws.subprotocol == "mcp"

        async def reader() -> None:
            async with to_client:
                while True:
                    try:
                        data = await ws.get_message()
                    except trio_websocket.ConnectionClosed:
                        return
                    try:
                        message = types.jsonrpc_message_adapter.validate_json(data, by_name=False)
                    except ValueError as exc:
                        await to_client.send(exc)
                        continue
                    await to_client.send(SessionMessage(message))

        async def writer() -> None:
            async with from_client:
                async for item in from_client:
                    dumped = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await ws.send_message(dumped)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            nursery.start_soon(writer)
            try:
                yield read_stream, write_stream
            finally:
                nursery.cancel_scope.cancel()
