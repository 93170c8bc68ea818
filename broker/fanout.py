"""Which sessions hear a shared server's notifications: log levels, subscriptions.

Logging: each session sets its own level (``logging/setLevel``, answered by
the broker). The server is asked for the most verbose level any of its
sessions wants, and each session then receives ``notifications/message`` only
at or above its own level. A session that never set a level receives what the
server sends. A message without one of the eight levels or without ``data``
goes to nobody (:func:`is_log_message`).

Subscriptions: ``resources/subscribe`` is reference-counted per URI. Until the
server has accepted a subscribe of the URI, each session's goes to it (and
that session hears the server's own answer: one refused, by the server or by
a limit of the broker's, leaves no subscriber); once one was accepted, later
ones are answered by the broker. The server is unsubscribed when the last
subscriber leaves (by ``resources/unsubscribe`` or by disconnecting).
``notifications/resources/updated`` goes only to the sessions subscribed to
that URI. (Until 2026-11-27 only the first subscribe went up, the others were
answered at once, even while it was on its way: its refusal left them told
success, and the URI subscribed for nobody.)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from typing import Any

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_RANK = {name: rank for rank, name in enumerate(LOG_LEVELS)}


def level_rank(level: Any) -> int | None:
    return _RANK.get(level) if isinstance(level, str) else None


def is_log_message(params: Any) -> bool:
    """Whether a ``notifications/message``'s params are what MCP allows: an
    object with one of the eight levels (RFC 5424's) and ``data``. One that
    is not has no level to filter it by, and is dropped (docs/rules/logging.md)."""
    return type(params) is dict and level_rank(params.get("level")) is not None and "data" in params


class Fanout:
    def __init__(self) -> None:
        self._levels: dict[Hashable, int] = {}
        self._sent_level: int | None = None
        self._subscribers: dict[str, set[Hashable]] = {}  # subscribed, or asking
        self._accepted: set[str] = set()  # URIs the server took a subscribe of

    # -- logging --------------------------------------------------------------

    def set_level(self, session: Hashable, level: str) -> str | None:
        """Record a session's level; the level to ask the server for, if it changed."""
        self._levels[session] = _RANK[level]
        return self._upstream_level_change()

    def clear_level(self, session: Hashable) -> str | None:
        """A session wants no log messages now; the level to ask the server
        for, if the others want a less verbose one."""
        self._levels.pop(session, None)
        return self._upstream_level_change()

    def admits(self, session: Hashable, level: str) -> bool:
        """Whether a session gets a message of ``level`` (one of the eight:
        :func:`is_log_message`)."""
        wanted = self._levels.get(session)
        return wanted is None or _RANK[level] >= wanted

    def level_of(self, session: Hashable) -> str | None:
        """The level a session set (None: it set none)."""
        wanted = self._levels.get(session)
        return None if wanted is None else LOG_LEVELS[wanted]

    def upstream_level(self) -> str | None:
        """The level the server should log at (None: nobody asked)."""
        return LOG_LEVELS[self._sent_level] if self._sent_level is not None else None

    def _upstream_level_change(self) -> str | None:
        if not self._levels:
            return None  # keep what the server was last told: MCP has no "unset"
        wanted = min(self._levels.values())
        if wanted == self._sent_level:
            return None
        self._sent_level = wanted
        return LOG_LEVELS[wanted]

    # -- subscriptions --------------------------------------------------------

    def subscribe(self, session: Hashable, uri: str) -> bool:
        """Add a subscriber; True if the server must be asked (it has not
        accepted a subscribe of ``uri`` yet: :meth:`accepted`, :meth:`refused`)."""
        self._subscribers.setdefault(uri, set()).add(session)
        return uri not in self._accepted

    def accepted(self, uri: str) -> None:
        """The server took a subscribe of ``uri`` (unless all its subscribers
        left meanwhile: the server is then told to drop it, after)."""
        if uri in self._subscribers:
            self._accepted.add(uri)

    def refused(self, session: Hashable, uri: str) -> bool:
        """The session's subscribe was refused (by the server, or before it
        went): it is no subscriber. True if the server must be told to drop
        ``uri`` all the same (it took another session's, who has left)."""
        if not self._leave(session, uri):
            return False
        accepted = uri in self._accepted
        self._accepted.discard(uri)
        return accepted

    def unsubscribe(self, session: Hashable, uri: str) -> bool:
        """Remove a subscriber; True if the server must be told (the last one left)."""
        if not self._leave(session, uri):
            return False
        self._accepted.discard(uri)
        return True

    def _leave(self, session: Hashable, uri: str) -> bool:
        """Take ``session`` off ``uri``'s subscribers; True if it was the last
        (the URI is forgotten)."""
        subscribers = self._subscribers.get(uri)
        if not subscribers or session not in subscribers:
            return False
        subscribers.discard(session)
        if subscribers:
            return False
        del self._subscribers[uri]
        return True

    def subscribers(self, uri: Any) -> set[Hashable]:
        return self._subscribers.get(uri, set()) if isinstance(uri, str) else set()

    def subscribed_uris(self) -> list[str]:
        return list(self._subscribers)

    def for_new_server(self) -> Fanout:
        """What the sessions asked of this server, for the process a reload
        starts in its place: the same subscribers and levels, which it is
        asked for at its handshake (``UpstreamProtocol.renewed``), as a
        restarted process is."""
        return self._of(lambda session: True)

    def merged(self, other: Fanout) -> Fanout:
        """This and ``other`` together (the instances of a group): each
        session's level and subscriptions, whichever instance had them."""
        levels = dict(self._levels)
        for session, rank in other._levels.items():
            levels[session] = min(rank, levels.get(session, rank))
        subscribers = {uri: set(sessions) for uri, sessions in self._subscribers.items()}
        for uri, sessions in other._subscribers.items():
            subscribers.setdefault(uri, set()).update(sessions)
        return _made(levels, subscribers)

    def only(self, sessions: set[Hashable]) -> Fanout:
        """What ``sessions`` asked, for a new process that serves them alone."""
        return self._of(lambda session: session in sessions)

    def without(self, sessions: Collection[Hashable]) -> Fanout:
        """What every session but ``sessions`` asked (a copy)."""
        return self._of(lambda session: session not in sessions)

    def _of(self, kept: Callable[[Hashable], bool]) -> Fanout:
        subscribers = {}
        for uri, sessions in self._subscribers.items():
            if wanting := {s for s in sessions if kept(s)}:
                subscribers[uri] = wanting
        return _made({s: rank for s, rank in self._levels.items() if kept(s)}, subscribers)

    def levels_only(self) -> Fanout:
        """The sessions' log levels alone (no subscriptions)."""
        return _made(dict(self._levels), {})

    def subscribing(self) -> set[Hashable]:
        """The sessions subscribed to something."""
        return set().union(*self._subscribers.values()) if self._subscribers else set()

    def drop_subscriptions(self, session: Hashable) -> None:
        """Forget what ``session`` subscribed to, with nothing to tell the
        server (its process is gone: a pool's session moved off a failed
        instance). A URI nobody else wants is then not renewed at its restart."""
        for uri in list(self._subscribers):
            self.unsubscribe(session, uri)  # (what it says to tell the server is not told)

    # -- sessions -------------------------------------------------------------

    def session_gone(self, session: Hashable) -> tuple[list[str], str | None]:
        """Forget a session: URIs nobody is subscribed to any more, and a new log level."""
        emptied = [uri for uri in list(self._subscribers) if self.unsubscribe(session, uri)]
        self._levels.pop(session, None)
        return emptied, self._upstream_level_change()


def _made(levels: dict[Hashable, int], subscribers: dict[str, set[Hashable]]) -> Fanout:
    """A new process's Fanout of these levels and subscriptions: the level it
    is sent at its handshake is the most verbose of them."""
    fresh = Fanout()
    fresh._levels, fresh._subscribers = levels, subscribers
    fresh._sent_level = min(levels.values()) if levels else None
    return fresh
