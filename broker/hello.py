"""The optional hello line a client may send before any MCP message.

The daemon's socket speaks plain newline-delimited MCP, so any program that
can open a unix socket is a client. ``mcpbroker connect`` may send one extra
first line to say which servers its session should see::

    {"mcpbroker": {"servers": ["github", "files"]}}

or asks for a control command instead of a session (``mcpbroker status``,
``mcpbroker reload``)::

    {"mcpbroker": {"command": "status"}}

A hello may also name the *notices* its client understands: lines of the
same shape the daemon may then send it among the session's messages, never
to be passed to an MCP host. The one there is, ``stopping``, tells the shim
that the daemon has begun to stop (:data:`STOPPING_NOTICE`; cli/reconnect.py
holds the host's new requests for the next daemon)::

    {"mcpbroker": {"notices": ["stopping"]}}      (from the shim)
    {"mcpbroker": {"notice": "stopping"}}         (from the daemon, later)

A hello has no ``"jsonrpc"`` key, so it can never be mistaken for MCP. Without
one, a session sees every configured server. Keys a daemon does not know are
ignored (a newer shim may speak to an older daemon), and so are notices.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

HELLO_KEY = "mcpbroker"


class HelloError(Exception):
    """A hello the daemon cannot honour; the message is meant for the user,
    ``data`` for the error answer's ``data`` (a program's to act on)."""

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.data = data


# ``tokens``: the stored OAuth tokens of the servers it names changed
# (``mcpbroker auth NAME``, ``--logout``): docs/oauth.md.
COMMANDS = frozenset({"status", "reload", "tokens"})
NOTICES = frozenset({"stopping"})
# What the daemon sends a client that asked for it, once it has begun to stop.
STOPPING_NOTICE = {HELLO_KEY: {"notice": "stopping"}}


@attrs.frozen
class Hello:
    servers: tuple[str, ...] | None = None  # None: every configured server
    # A control command instead of an MCP session: the daemon answers it with
    # one line of JSON and closes the connection (``mcpbroker status``).
    command: str | None = None
    notices: frozenset[str] = frozenset()  # what the client may be sent (NOTICES)

    @property
    def transparent(self) -> bool:
        """Naming exactly one server asks to see it as it is (docs/naming-and-routing.md)."""
        return self.servers is not None and len(self.servers) == 1


def read_hello(message: Any) -> Hello | None:
    """The hello in a first line, or None if the line is plain MCP."""
    if not isinstance(message, dict) or "jsonrpc" in message or HELLO_KEY not in message:
        return None
    body = message[HELLO_KEY]
    if not isinstance(body, dict):
        raise HelloError('the "mcpbroker" hello must be an object')
    command = body.get("command")
    if command is not None:
        # Only a str can be a command (a list or an object is unhashable).
        if not isinstance(command, str) or command not in COMMANDS:
            raise HelloError(f"unknown command {command!r} (known: {', '.join(sorted(COMMANDS))})")
        return Hello(_servers(body.get("servers")), command=command)
    return Hello(_servers(body.get("servers")), notices=_notices(body.get("notices")))


def _notices(notices: Any) -> frozenset[str]:
    if notices is None:
        return frozenset()
    if not isinstance(notices, list) or not all(isinstance(n, str) for n in notices):
        raise HelloError('"notices" in the hello must be a list of names')
    return NOTICES.intersection(notices)


def _servers(servers: Any) -> tuple[str, ...] | None:
    if servers is None:
        return None
    if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
        raise HelloError('"servers" in the hello must be a list of server names')
    return tuple(dict.fromkeys(servers))


def resolve_view(hello: Hello | None, configured: Iterable[str]) -> tuple[str, ...]:
    """The servers a session sees, in configuration order unless it named them."""
    configured = tuple(configured)
    if hello is None or hello.servers is None:
        return configured
    unknown = [name for name in hello.servers if name not in configured]
    if unknown:
        listed = ", ".join(configured) or "none"
        # (retryable false: the same hello is refused until a reload configures
        # them; the resuming shim ends on it, and on nothing less: cli/reconnect.py)
        raise HelloError(
            f"unknown server {', '.join(map(repr, unknown))} (configured servers: {listed})",
            data={"unknown": unknown, "retryable": False},
        )
    return hello.servers


@attrs.frozen
class Opening:
    """What a connection's first message decided: the session's view, or a
    control command instead of a session, or a refusal (every request is then
    answered with it)."""

    view: tuple[str, ...] = ()
    transparent: bool = False
    command: str | None = None
    refusal: str | None = None
    refusal_data: dict[str, Any] | None = None  # (that error's data: HelloError.data)
    # The view is every configured server (the hello named none): a reload that
    # adds or removes servers changes it.
    every: bool = False
    notices: frozenset[str] = frozenset()  # (Hello.notices)


def open_session(first: Any, configured: Iterable[str]) -> Opening | None:
    """The rule of the first message: a hello there (and only there) sets the
    session's view or asks for a command; None if it is plain MCP (then the
    session sees every configured server, and the message is MCP's)."""
    try:
        hello = read_hello(first)
        if hello is None:
            return None
        if hello.command is not None:
            return Opening(hello.servers or (), command=hello.command)
        view = resolve_view(hello, configured)
        return Opening(
            view, transparent=hello.transparent, every=hello.servers is None, notices=hello.notices
        )
    except HelloError as exc:
        return Opening(refusal=str(exc), refusal_data=exc.data)
