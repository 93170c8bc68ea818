"""A session's address: how other actors deliver messages to it.

Upstreams hold a :class:`SessionHandle` for every session they serve and put
responses and notifications into its outbound queue with :meth:`deliver`,
which never waits: the reader of a shared server must never block on one
slow client. The queue is bounded twice: in deliveries (:data:`OUTBOX_SIZE`)
and in bytes (``broker.maxQueuedBytes``, counted as what each message holds
in memory: its bytes, and for a decoded one its objects, ``jsonrpc.held_size``;
or, for the session's own answers, the bytes they will have). A session past
either bound is not reading: it is disconnected, with the reason logged, and
the others carry on.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import trio

from broker.config import DEFAULT_MAX_QUEUED_BYTES
from broker.jsonrpc import Message
from broker.related import Related
from broker.wire.envelope import Answer

# Deliveries a session may have waiting to be written before it counts as not
# reading (and is disconnected). A delivery is one message, or the messages
# for this session that one read from a server's stdout produced (at most
# READ_CHUNK bytes of them). Large enough for 16 requests in flight each with
# plenty of progress notifications, small enough to bound memory.
OUTBOX_SIZE = 1024

# What a session writes: a message, a batch response (a JSON array), a
# server's answer passed on unparsed (broker/wire/envelope.py), or a message
# with the request it belongs to (broker/related.py; only to sessions that
# asked: ``SessionHandle.related``).
Outgoing = Message | list[Message] | Answer | Related

# What a message the broker made itself (an error, a list_changed) is counted
# as, when nobody measured it: more than most such messages take.
SMALL_MESSAGE = 512

# One entry of the outbound queue: messages, and the bytes they are counted as.
Delivery = tuple[list[Outgoing], int]

_session_ids = itertools.count(1)


@attrs.define(eq=False)
class SessionHandle:
    outbox: trio.MemorySendChannel[Delivery]
    cancel_scope: trio.CancelScope
    id: int = attrs.field(factory=lambda: next(_session_ids))
    close_reason: str | None = None
    internal: bool = False  # the broker's own requests (catalog fetches), not a client
    max_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    queued_bytes: int = 0  # delivered and not yet written (see :meth:`written`)
    related: bool = False  # give it messages with their cause, as Related (broker/related.py)
    # A per-session server runs an instance for it (actors/sharing.py): a
    # 2026-07-28 HTTP context holding one is never kept for another POST.
    owns_instance: bool = False

    def outgoing(self, message: Message, related: Any) -> Outgoing:
        """What to deliver of a message that belongs to the client's request
        ``related`` (None: unknown): wrapped, if this session asked for it."""
        return message if related is None or not self.related else Related(message, related)

    def deliver(self, message: Outgoing, size: int = SMALL_MESSAGE) -> None:
        """Queue a message for the client without waiting; never raises."""
        self.deliver_all([message], size)

    def deliver_all(self, messages: list[Outgoing], size: int) -> None:
        """Queue messages for the client, in order, as one delivery; never raises.

        ``size`` is the bytes they count for. One delivery rather than one per
        message: a server's read that answers many of this session's requests
        costs the session's queue one slot and its writer one wake-up.
        """
        queued = self.queued_bytes
        if queued + size > self.max_bytes and queued and not self.internal:
            self.disconnect(
                f"outbound queue full ({queued} bytes waiting, the limit is "
                f"broker.maxQueuedBytes = {self.max_bytes}): client not reading"
            )
            return
        try:
            self.outbox.send_nowait((messages, size))
        except trio.WouldBlock:
            self.disconnect(f"outbound queue full ({OUTBOX_SIZE} deliveries): client not reading")
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the session is already gone; what it would have got goes with it
        self.queued_bytes = queued + size

    async def send(self, messages: list[Outgoing], size: int) -> None:
        """Queue messages of the session's own (its answers to its client): waits
        while the queue is full of deliveries (it is the client's own reader that
        waits), and disconnects past the byte limit as :meth:`deliver_all` does."""
        if self.queued_bytes + size > self.max_bytes and self.queued_bytes:
            self.deliver_all(messages, size)  # (says why, and disconnects)
            return
        self.queued_bytes += size
        try:
            try:
                self.outbox.send_nowait((messages, size))  # no checkpoint when there is room
            except trio.WouldBlock:
                await self.outbox.send((messages, size))
        except BaseException:
            self.queued_bytes -= size
            raise

    def written(self, size: int) -> None:
        """The session wrote (or dropped) deliveries counted as ``size`` bytes."""
        self.queued_bytes -= size

    def disconnect(self, reason: str) -> None:
        if self.close_reason is None:
            self.close_reason = reason
        self.cancel_scope.cancel()

    def __repr__(self) -> str:
        return f"<session {self.id}>"


def open_outbox() -> tuple[trio.MemorySendChannel[Delivery], trio.MemoryReceiveChannel[Delivery]]:
    return trio.open_memory_channel[Any](OUTBOX_SIZE)
