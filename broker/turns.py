"""Whose turn it is on a server that sends requests to clients (the gate).

On stdio nothing in a server's ``sampling/createMessage``,
``elicitation/create`` or ``roots/list`` says which client request caused
it. The broker never guesses (docs/rules/server-requests.md): a server that
asks clients things is given requests of one session at a time, so that
every request it sends while that session has requests at the server is
that session's. :class:`Turns` keeps that rule for one server instance.

Theory of operation. The gate is *off* or *on*. Off, requests go straight
to the server (the fast path; nothing here is asked). ``"exclusive"`` starts
on; ``"auto"`` turns on when the server first sends such a request;
``"concurrent"`` never does. On:

- A request goes to the server at once when the server has nothing of
  anyone's (*idle*) and nobody waits, or when it comes from the session
  whose turn it is (the *holder*). Its session then holds the turn.
- Otherwise it is *held*: opened (it has its upstream id and its deadline,
  so a timeout, a cancellation or a departure treats it like any other) but
  not written, in arrival order, at most ``limit`` of them and ``max_bytes``
  of what they hold (``jsonrpc.held_size``; one is always taken).
- While others wait, the holder may add :data:`HOLDER_EXTRA` more requests
  in its turn; after that its requests wait behind the others', so a chatty
  session cannot keep the turn for ever.
- When the server becomes idle, the turn passes to the session of the
  oldest held request, and every held request of that session is written,
  in order (:meth:`Turns.settle`).
- When the turn passes to a session other than the one whose roots the
  server last had, and the server has asked for roots, the server is sent
  ``notifications/roots/list_changed`` first: it asks again, and the new
  holder answers. No roots of an earlier client carry over.

The counts come from the caller: ``busy`` is the number of requests at the
server (opened, not held, not yet answered or forgotten).
"""

from __future__ import annotations

from collections.abc import Hashable

import attrs

from broker import jsonrpc
from broker.config import DEFAULT_MAX_QUEUED_BYTES
from broker.jsonrpc import Message

MODES = ("auto", "exclusive", "concurrent")
# Requests the holder may add while other sessions wait for their turn.
HOLDER_EXTRA = 16
DEFAULT_LIMIT = 1024
ROOTS_CHANGED = "notifications/roots/list_changed"


DEFAULT_MAX_BYTES = DEFAULT_MAX_QUEUED_BYTES


@attrs.define(slots=True)
class Held:
    session: Hashable
    message: Message
    size: int = 0  # what it holds (jsonrpc.held_size)


class Turns:
    def __init__(
        self, mode: str = "auto", limit: int = DEFAULT_LIMIT, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown serverRequests mode {mode!r}")
        self.mode = mode
        self.limit = limit
        self.max_bytes = max_bytes
        self.held_bytes = 0  # what the held requests hold, together
        self.on = mode == "exclusive"
        self.holder: Hashable | None = None
        # upstream id -> a request waiting for its session's turn, oldest first.
        self.held: dict[int, Held] = {}
        self.uses_roots = False  # the server has asked for roots at least once
        self._roots_of: Hashable | None = None  # whose roots the server has
        self._extra = 0  # requests the holder added while others waited

    def renewed(self) -> Turns:
        """The gate for a restarted server: what was learnt, nobody's turn."""
        fresh = Turns(self.mode, self.limit, self.max_bytes)
        fresh.on = self.on
        fresh.uses_roots = self.uses_roots
        return fresh

    def server_asks(self, method: str, causes: list[Hashable]) -> None:
        """The server sent a request to a client (``causes``: the sessions
        with requests at the server). In ``auto`` mode the gate turns on; the
        turn is the single cause's, or nobody's until the server is idle."""
        if method == "roots/list":
            self.uses_roots = True
            self._roots_of = None  # until it is known who was asked (roots_asked)
        if not self.on and self.mode == "auto":
            self.on = True
            self.holder = causes[0] if len(causes) == 1 else None

    def roots_asked(self, session: Hashable) -> None:
        """The server's ``roots/list`` went to ``session``: it has that one's roots."""
        self._roots_of = session

    def has_roots_of(self, session: Hashable) -> bool:
        return self._roots_of == session

    def full(self, size: int = 0) -> bool:
        """Whether a request holding ``size`` bytes may not be held too."""
        if len(self.held) >= self.limit:
            return True
        return bool(self.held) and self.held_bytes + size > self.max_bytes

    def admit(self, session: Hashable, busy: int) -> bool:
        """Whether a request of ``session`` may go to the server now (the gate
        is on); counts it against the holder's extra requests if so."""
        if busy == 0 and not self.held:
            return True
        if session != self.holder:
            return False
        if not self.held:
            return True
        if self._extra < HOLDER_EXTRA:
            self._extra += 1
            return True
        return False

    def hold(self, upstream_id: int, session: Hashable, message: Message, size: int = 0) -> None:
        self.held[upstream_id] = Held(session, message, size)
        self.held_bytes += size

    def take(self, session: Hashable) -> list[Message]:
        """``session`` holds the turn now: what the server must hear first."""
        out: list[Message] = []
        if session != self.holder:
            self.holder = session
            self._extra = 0
        if self.uses_roots and session != self._roots_of:
            self._roots_of = session
            out.append(jsonrpc.notification(ROOTS_CHANGED))
        return out

    def settle(self, busy: int) -> list[Message]:
        """The server's load changed: if it is idle and someone waits, the
        turn passes on. Returns the messages to write (in order)."""
        if busy:
            return []
        if not self.held:
            self.holder = None
            return []
        first = next(iter(self.held.values())).session
        out = self.take(first)
        for upstream_id in [uid for uid, held in self.held.items() if held.session == first]:
            held = self.held.pop(upstream_id)
            self.held_bytes -= held.size
            out.append(held.message)
        return out

    def drop(self, upstream_id: int) -> bool:
        """Forget a held request (cancelled, timed out, its session gone);
        False if it was not held (it is at the server)."""
        held = self.held.pop(upstream_id, None)
        if held is None:
            return False
        self.held_bytes -= held.size
        return True

    def clear(self) -> None:
        """Forget every held request (the server is gone: they are failed)."""
        self.held.clear()
        self.held_bytes = 0

    def session_gone(self, session: Hashable) -> None:
        if self._roots_of == session:
            self._roots_of = None
        if self.holder == session:
            self.holder = None
