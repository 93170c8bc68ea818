"""What a Session reads and writes through, whatever the transport.

A :class:`Connection` hands the session *frames* (each one message's bytes,
or an :class:`~broker.wire.frames.Oversize`: broker/wire/frames.py) and
takes the messages the session's rules decided to write
(:meth:`broker.session.SessionProtocol.take_outgoing`), which it encodes in
its own wire format. The session never sees a newline or a WebSocket frame.
"""

from __future__ import annotations

from typing import Protocol

from actors.mailbox import Outgoing
from broker.wire.frames import Frame


class Connection(Protocol):
    # What ``mcpbroker status`` calls this kind of connection ("unix", "websocket").
    transport: str

    async def receive(self) -> tuple[list[Frame], int]:
        """The next frames the client sent (at least one), and the bytes they
        count as against the limits (what the client sent for them); ``([], 0)``
        once the client has closed its side. Raises
        :class:`~actors.errors.TransportClosed` if the connection broke."""

    async def send(self, messages: list[Outgoing]) -> None:
        """Write messages, in order, each as the wire format frames one. Raises
        :class:`~actors.errors.TransportClosed` once the client is gone."""

    async def aclose(self) -> None:
        """Close the connection (bounded; the session calls it shielded)."""
