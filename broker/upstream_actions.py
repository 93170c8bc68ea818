"""What the rules of one upstream server ask their actor to do: the actions.

:class:`~broker.upstream.UpstreamProtocol` (and its modern side,
broker/eras/upstream.py) answer what they are fed with a list of these; the
Upstream actor (actors/upstream.py) carries them out:

- :class:`SendUpstream`: write this message to the server;
- :class:`Deliver`: put this message in that session's outbound queue;
- :class:`Broadcast`: give this notification to every session using the server;
- :class:`ListChanged`: one of the server's lists changed: the catalog refreshes
  it before sessions hear of it;
- :class:`Ready`: the server is ready for clients (the server's identity
  attached): its handshake is done and, for an instance that warms up, it
  has listed its tools;
- :class:`Warn`: something the operator should hear about;
- :class:`Speak`: the era the connection's requests go in from now on, which
  the link follows (HTTP: a modern request is its own POST, docs/eras.md);
- :class:`Reconnect`: end this connection; the supervisor opens it again,
  which finds out the server's era anew (docs/eras.md).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import attrs

from broker.jsonrpc import Message, RequestId
from broker.lifecycle import ServerIdentity
from broker.records import Record


class SendUpstream(Record):
    """Write ``message`` to the server (a record made per message: broker/records.py)."""

    __slots__ = ("message",)

    def __init__(self, message: Message) -> None:
        self.message = message

    def fields(self) -> tuple[Any, ...]:
        return (self.message,)


class Deliver(Record):
    """Hand ``message`` to ``session`` (a record made per message: broker/records.py)."""

    __slots__ = ("message", "related", "session")

    def __init__(
        self, session: Hashable, message: Message, related: RequestId | None = None
    ) -> None:
        self.session = session
        self.message = message
        # The client's id of the request the message belongs to, when the server
        # says (progress) or it can be told (broker/related.py); None: unknown.
        self.related = related

    def fields(self) -> tuple[Any, ...]:
        return (self.session, self.message, self.related)


@attrs.frozen
class Broadcast:
    message: Message


@attrs.frozen
class ListChanged:
    """A ``notifications/*/list_changed`` from the server (``message``)."""

    message: Message


@attrs.frozen
class Ready:
    identity: ServerIdentity


@attrs.frozen
class Warn:
    """Something the operator should hear about (logged as a warning)."""

    event: str
    detail: str


@attrs.frozen
class Speak:
    """The connection's requests go in this era from now on: at a modern
    protocol ``version`` (the probe's, then the server's), or legacy (None,
    from the ``initialize`` on). Given before the first request it concerns."""

    version: str | None


@attrs.frozen
class ListenLater:
    """Open the modern server's listen again in ``delay`` seconds (its
    listens end as soon as they are opened: not at once, again and again)."""

    delay: float


@attrs.frozen
class Reconnect:
    """End this connection (``reason``: why, as the log and the requests
    still in flight are told); the supervisor opens it again, probing the
    server's era as at the start (a modern server that refused the era)."""

    reason: str


Action = (
    SendUpstream
    | Deliver
    | Broadcast
    | ListChanged
    | Ready
    | Warn
    | Speak
    | ListenLater
    | Reconnect
)
