"""WebSocket: one JSON-RPC message per text frame, and the handshake's rules.

The daemon's WebSocket listener (``mcpbroker serve --ws``) and its WebSocket
links to servers both carry one message per frame, subprotocol ``mcp``.
:func:`frame_of` turns a received message into a frame for the rules.

:func:`check_handshake` decides whether to accept a client's opening
request, and what session it opens (docs/security.md says why each check):

- the path: ``/mcp`` is the aggregated view of every server, ``/mcp/NAME``
  one server seen as it is (as ``mcpbroker connect NAME``); 404 otherwise;
- ``Host`` must be a loopback name (or one in ``broker.allowedHosts``): a
  page that rebinds its own domain name to 127.0.0.1 still sends its own;
- ``Origin``, which browsers send and other clients do not, must be in
  ``broker.allowedOrigins`` (empty by default): a web page must not reach
  the daemon (403);
- with a token configured, ``Authorization: Bearer TOKEN``, compared in
  constant time (401);
- a client that proposes subprotocols must propose ``mcp``.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote, urlsplit

import attrs

from broker.wire import frames
from broker.wire.envelope import Answer
from broker.wire.frames import KEPT_ENDS, Frame, Oversize

SUBPROTOCOL = "mcp"
PATH = "/mcp"
MESSAGE_TOO_BIG = 1009  # the close code for a message over the limit (RFC 6455)
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
# A Host field: a name or an IPv6 literal in brackets, then maybe a port;
# anything else (``[::1]evil``, ``localhost:1, evil``, ``user@host``) names no host.
_HOST = re.compile(r"(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9._-]+))(?::[0-9]*)?")


def frame_of(message: str | bytes, limit: int) -> Frame:
    """A received WebSocket message as a frame (over ``limit`` bytes: Oversize)."""
    data = message.encode() if isinstance(message, str) else bytes(message)
    if len(data) > limit:
        return Oversize(len(data), data[:KEPT_ENDS], data[-KEPT_ENDS:])
    return data


def text_of(message: object) -> str:
    """An outgoing message (an unparsed answer too) as a text frame's text."""
    data = message.encode() if isinstance(message, Answer) else frames.encode(message)
    return data.decode()


def reason_suffix(reason: str | None) -> str:
    return f" ({reason})" if reason else ""


@attrs.frozen
class Accept:
    """Open a session: on ``view`` (None: every server), transparent if one was named."""

    view: tuple[str, ...] | None
    transparent: bool
    subprotocol: str | None


@attrs.frozen
class Reject:
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class Policy:
    """Who may open a session (from ``broker`` settings)."""

    allowed_origins: frozenset[str] = frozenset()
    allowed_hosts: frozenset[str] = frozenset()
    token: str | None = None


def check_handshake(
    path: str,
    host: str,
    headers: Sequence[tuple[bytes, bytes]],
    subprotocols: Iterable[str],
    servers: Iterable[str],
    policy: Policy,
) -> Accept | Reject:
    """What to answer a client's opening request (see the module's docstring):
    ``host`` is its Host field, ``headers`` its other fields."""
    path, host = absolute_form(path, host)
    refused = check_access(host, fields_of(headers), policy)
    if refused is not None:
        return refused
    route = route_of(path, servers)
    if isinstance(route, Reject):
        return route
    proposed = tuple(subprotocols)
    if proposed and SUBPROTOCOL not in proposed:
        return Reject(400, f"Subprotocol {SUBPROTOCOL!r} is required")
    return Accept(route[0], route[1], SUBPROTOCOL if proposed else None)


def check_access(host: str, fields: dict[str, str], policy: Policy) -> Reject | None:
    """Host, Origin and token (the module's docstring), for any request by URL
    (the Streamable HTTP listener's too); None: allowed. ``fields`` by
    lower-case name, as :func:`fields_of` gives them."""
    authority, host = host.lower(), _host_name(host)
    if host not in LOOPBACK_HOSTS and not _allowed(host, policy.allowed_hosts):
        return Reject(403, f"Host {host!r} is not allowed (see broker.allowedHosts)")
    origin = fields.get("origin")
    if (
        origin is not None
        and origin not in policy.allowed_origins
        and not _same_origin(origin, authority)
    ):
        return Reject(403, f"Origin {origin!r} is not allowed (see broker.allowedOrigins)")
    if policy.token is not None and not _token_matches(fields.get("authorization"), policy.token):
        return Reject(
            401, "A bearer token is required", (("WWW-Authenticate", 'Bearer realm="mcpbroker"'),)
        )
    return None


def _same_origin(origin: str, authority: str) -> bool:
    """An Origin naming the listener itself (the Host it was reached by): a
    page there would be one the daemon served, and it serves none, so this
    is a client that sends its own address (the conformance suite does)."""
    scheme, _, rest = origin.lower().partition("://")
    return scheme in ("http", "https", "ws", "wss") and rest.rstrip("/") == authority


def route_of(path: str, servers: Iterable[str]) -> tuple[tuple[str, ...] | None, bool] | Reject:
    """The view a path names: ``/mcp`` every server (None), ``/mcp/NAME`` one,
    transparent; 404 otherwise."""
    try:
        path = urlsplit(path).path.rstrip("/")
    except ValueError:  # ("//[/mcp": an authority that does not parse)
        return Reject(400, "Bad request target")
    if path == PATH:
        return None, False
    if path.startswith(PATH + "/"):
        name = unquote(path[len(PATH) + 1 :])
        configured = tuple(servers)
        if name in configured:
            return (name,), True
        listed = ", ".join(configured) or "none"
        return Reject(404, f"Unknown server {name!r} (configured servers: {listed})")
    return Reject(404, f"Not found: the paths are {PATH} and {PATH}/NAME")


def fields_of(headers: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    """Header fields by lower-case name (the first of each; latin-1, as HTTP)."""
    fields: dict[str, str] = {}
    for name, value in headers:
        fields.setdefault(name.decode("latin-1").lower(), value.decode("latin-1").strip())
    return fields


def _host_name(host: str) -> str:
    """The name in a Host field, lower case, without its port (``[::1]:8080``
    -> ``::1``; ``LOCALHOST`` -> ``localhost``: RFC 3986 section 3.2.2); ``""``
    for a field that is not one host (allowed nowhere)."""
    match = _HOST.fullmatch(host)
    if match is None:
        return ""
    return (match.group(1) or match.group(2)).lower()


def _allowed(host: str, allowed: frozenset[str]) -> bool:
    return host in allowed or any(host == name.lower() for name in allowed)


def absolute_form(target: str, host: str) -> tuple[str, str]:
    """The path and the host a request names: an absolute-form target
    (``POST http://name/mcp``) names both, and its authority is the host
    (RFC 9112 section 3.2.2: the server MUST ignore the Host field then)."""
    if target.startswith("/"):
        return target, host
    try:
        parts = urlsplit(target)
    except ValueError:  # ("http://[/mcp"): no host at all, which no rule allows
        return target, ""
    if not parts.scheme or not parts.netloc:
        return target, host
    return parts.path or "/", parts.netloc


def _token_matches(authorization: str | None, token: str) -> bool:
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())
