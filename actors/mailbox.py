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

from broker.envelope import Answer
from broker.jsonrpc import Message

# Deliveries a session may have waiting to be written before it counts as not
# reading (and is disconnected). A delivery is one message, or the messages
# for this session that one read from a server's stdout produced (at most
# READ_CHUNK bytes of them). Large enough for 16 requests in flight each with
# plenty of progress notifications, small enough to bound memory.
OUTBOX_SIZE = 1024

# What a session writes: a message, a batch response (a JSON array), or a
# server's answer passed on unparsed (broker/envelope.py).
Outgoing = Message | list[Message] | Answer

_session_ids = itertools.count(1)


@attrs.define(eq=False)
class SessionHandle:
    outbox: trio.MemorySendChannel[list[Outgoing]]
    cancel_scope: trio.CancelScope
    id: int = attrs.field(factory=lambda: next(_session_ids))
    close_reason: str | None = None
    internal: bool = False  # the broker's own requests (catalog fetches), not a client

    def deliver(self, message: Outgoing) -> None:
        """Queue a message for the client without waiting; never raises."""
        self.deliver_all([message])

    def deliver_all(self, messages: list[Outgoing]) -> None:
        """Queue messages for the client, in order, as one delivery; never raises.

        One delivery rather than one per message: a server's read that answers
        many of this session's requests costs the session's queue one slot and
        its writer one wake-up.
        """
        try:
            self.outbox.send_nowait(messages)
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
    trio.MemorySendChannel[list[Outgoing]],
    trio.MemoryReceiveChannel[list[Outgoing]],
]:
    return trio.open_memory_channel[Any](OUTBOX_SIZE)
