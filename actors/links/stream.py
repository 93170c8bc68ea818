"""Newline-delimited JSON over a pair of byte streams: what every stdio-like
link shares (a child's pipes; memory streams in tests)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson
import trio

from actors.errors import TransportClosed, map_transport_errors
from actors.fastio import FastIO
from broker.jsonrpc import Message
from broker.wire import ndjson
from broker.wire.frames import Frame

READ_CHUNK = 256 * 1024


class StreamLink:
    def __init__(
        self,
        send_stream: trio.abc.SendStream,
        receive_stream: trio.abc.ReceiveStream,
        max_message_bytes: int,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        self.info: Mapping[str, Any] = info or {}
        self._send = FastIO(send_stream)
        self._receive = FastIO(receive_stream)
        self._framer = ndjson.LineFramer(max_message_bytes)

    def speak(self, version: str | None) -> None:
        pass  # (the era is in the messages alone)

    def encode(self, messages: list[Message]) -> list[bytes]:
        # (a comprehension, not map() of a function: no Python frame a message;
        # functools.partial with a keyword copies a dict a call, more again)
        return [b"".join([_dumps(message, option=_LINE) for message in messages])]

    def send_nowait(self, units: list[bytes]) -> list[bytes]:
        data = units[0] if len(units) == 1 else b"".join(units)
        with map_transport_errors():
            sent = self._send.send_nowait(data)
        return [data[sent:]] if sent < len(data) else []

    async def send(self, units: list[bytes]) -> None:
        with map_transport_errors():
            await self._send.send_all(b"".join(units))

    async def receive(self) -> list[Frame]:
        while True:
            try:
                with map_transport_errors():
                    data = await self._receive.receive_some(READ_CHUNK)
            except TransportClosed:
                return []
            if not data:
                return []
            frames = self._framer.feed(data)
            if frames:
                return frames

    async def ended(self) -> str:
        return ""

    async def close(self) -> None:
        with trio.CancelScope(shield=True):
            await self._send.stream.aclose()
            await self._receive.stream.aclose()


_dumps: Final = orjson.dumps
_LINE: Final = orjson.OPT_APPEND_NEWLINE  # one message, one line (newline included)
