"""Newline-delimited JSON over a byte stream: a unix socket connection.

The shim (``mcpbroker connect``) relays a host's stdio here byte for byte, so
this is the transport nearly every client uses: frames come from
:class:`~broker.wire.ndjson.LineFramer`, messages go out as lines, every
ready message in one ``send_all``. Tests run it over memory streams.
"""

from __future__ import annotations

import contextlib
import socket

import trio

from actors.errors import TransportClosed, map_transport_errors
from actors.fastio import FastIO
from actors.mailbox import Outgoing
from broker.wire import ndjson
from broker.wire.envelope import Bytes
from broker.wire.frames import Frame

READ_CHUNK = 256 * 1024
SEND_BUFFER = 1024 * 1024


class StreamConnection:
    transport = "unix"

    def __init__(self, stream: trio.abc.Stream, max_message_bytes: int) -> None:
        self.stream = stream
        self._io = FastIO(stream)
        self._framer = ndjson.LineFramer(max_message_bytes)
        if isinstance(stream, trio.SocketStream):
            # Room for a large result to leave in one or two sends, best effort.
            with contextlib.suppress(OSError):
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)

    async def receive(self) -> tuple[list[Frame], int]:
        while True:
            try:
                with map_transport_errors():
                    data = await self._io.receive_some(READ_CHUNK)
            except TransportClosed:
                return [], 0
            if not data:
                return [], 0
            # The frames of this read count as the read (plus the start of a
            # line an earlier read began).
            size = self._framer.pending + len(data)
            frames = self._framer.feed(data)
            if frames:
                return frames, size

    async def send(self, messages: list[Outgoing]) -> None:
        chunks: list[Bytes] = []
        ndjson.write_messages(messages, chunks)
        if chunks:
            with map_transport_errors():
                await self._io.send_all(b"".join(chunks))

    async def aclose(self) -> None:
        await self.stream.aclose()
