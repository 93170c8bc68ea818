"""A session's address: how other actors deliver messages to it.

Upstreams hold a :class:`SessionHandle` for every session they serve and put
responses and notifications into its outbound queue with :meth:`deliver`,
which never waits: the reader of a shared server must never block on one
slow client. A session whose queue is full is disconnected, with the reason
logged, and the others carry on.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import trio

from broker.jsonrpc import Message

# Messages a session may have waiting to be written before it counts as not
# reading (and is disconnected). Large enough for 16 requests in flight each
# with plenty of progress notifications, small enough to bound memory.
OUTBOX_SIZE = 1024

_session_ids = itertools.count(1)


@attrs.define(eq=False)
class SessionHandle:
    outbox: trio.MemorySendChannel[Message | list[Message]]
    cancel_scope: trio.CancelScope
    id: int = attrs.field(factory=lambda: next(_session_ids))
    close_reason: str | None = None
    internal: bool = False  # the broker's own requests (catalog fetches), not a client

    def deliver(self, message: Message | list[Message]) -> None:
        """Queue a message for the client without waiting; never raises."""
        try:
            self.outbox.send_nowait(message)
        except trio.WouldBlock:
            self.disconnect(f"outbound queue full ({OUTBOX_SIZE} messages): client not reading")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the session is already gone; what it would have got goes with it

    def disconnect(self, reason: str) -> None:
        if self.close_reason is None:
            self.close_reason = reason
        self.cancel_scope.cancel()

    def __repr__(self) -> str:
        return f"<session {self.id}>"


def open_outbox() -> tuple[
    trio.MemorySendChannel[Message | list[Message]],
    trio.MemoryReceiveChannel[Message | list[Message]],
]:
    return trio.open_memory_channel[Any](OUTBOX_SIZE)
