"""What an Upstream talks to its server through: a :class:`Link`.

A link takes messages and gives frames (each one message's bytes, or an
:class:`~broker.wire.frames.Oversize`: broker/wire/frames.py); the wire
format and what carries it (a child's pipes, a WebSocket) are its own
business, and so are the details only one kind has (a process's pid, exit
code and stderr belong to :mod:`actors.links.stdio`).

Writing never waits in the Upstream's dispatcher: :meth:`Link.encode` turns
messages into the link's *units* (a stream link's bytes, a WebSocket's
frames), :meth:`Link.send_nowait` writes what the link takes at once and
returns the rest, which the Upstream keeps in its backlog (bounded) and its
writer task hands to :meth:`Link.send`. A stream link takes nearly
everything at once; a link that cannot write without waiting (a WebSocket)
returns every unit.

A :data:`Launcher` opens a link, given a :class:`LinkContext`: the nursery of
that connection, where the link may run tasks of its own (a stderr pump, a
WebSocket's reader), all cancelled when the connection ends; the message
size limit; the server's log.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import trio

from broker.jsonrpc import Message
from broker.wire.frames import LinkFrame
from broker.wire.http_upstream import MissingVariable, expand


class LaunchError(Exception):
    """A server that cannot be reached as configured, however often one tries."""


class Link(Protocol):
    @property
    def info(self) -> Mapping[str, Any]:
        """What logs and ``mcpbroker status`` say of this connection (``pid``, ``url``)."""

    def speak(self, version: str | None) -> None:
        """The era the connection's requests go in from now on, as the
        Upstream decided it (broker/eras/upstream.py: the probe's, then the
        server's): a modern protocol version, or None (legacy, the era a link
        starts in). Only a link whose wire differs by era (HTTP) follows it."""

    def encode(self, messages: list[Message]) -> list[bytes]:
        """The messages as units to write. Raises ``TypeError`` if a message
        cannot be encoded (orjson's errors are TypeErrors)."""

    def send_nowait(self, units: list[bytes]) -> list[bytes]:
        """Write what the link takes now without waiting; the rest, in order.
        Raises :class:`~actors.errors.TransportClosed` if the link is closed."""

    async def send(self, units: list[bytes]) -> None:
        """Write units, in order, waiting as long as it takes. Raises
        :class:`~actors.errors.TransportClosed` if the link is closed."""

    async def receive(self) -> Sequence[LinkFrame]:
        """The next frames the server sent (at least one); ``[]`` once its side
        has ended (exited, closed the connection). A link that knows more than
        the bytes says it with the frame (broker/wire/frames.py): a message
        ``OnStream`` to the request on whose stream it came, an answer that
        ``Failed`` to come, a session with the server ``Renewed``."""

    async def ended(self) -> str:
        """After :meth:`receive` returned ``[]``: how it ended, to add to the
        log line (``" with code 1"``; ``""`` if there is nothing to say)."""

    async def close(self) -> None:
        """End the connection, bounded and shielded: no process is left behind."""


def configured_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A url server's ``headers``, each ``${NAME}`` replaced by the daemon's
    environment variable (LaunchError naming one that is not set)."""
    try:
        expanded = {key: expand(value, os.environ) for key, value in headers.items()}
    except MissingVariable as exc:
        raise LaunchError(
            f"has headers that use ${{{exc.name}}}, and the environment variable "
            f"{exc.name} is not set (in the environment the daemon was started with)"
        ) from None
    for key, value in expanded.items():
        # (the config check refused such a value written in the file; this is
        # one a ${NAME} brought: named, not shown, as it may be a secret)
        if not _SENDABLE.fullmatch(value):
            raise LaunchError(
                f"has the header {key} whose value, once its ${{NAME}} are replaced, is "
                "not plain ASCII text (a non-ASCII or control character)"
            )
    return expanded


_SENDABLE = re.compile(r"[\t\x20-\x7e]*")


@attrs.frozen
class LinkContext:
    nursery: trio.Nursery
    max_message_bytes: int
    log: Any
    # Where a process's last stderr lines go (the report of a crash loop).
    stderr_tail: collections.deque[str] = attrs.field(factory=lambda: collections.deque(maxlen=5))


Launcher = Callable[[LinkContext], Awaitable[Link]]
