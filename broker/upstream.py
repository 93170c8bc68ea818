"""One upstream server's side of the broker, sans-I/O.

:class:`UpstreamProtocol` holds the handshake state and the id map of one
server connection. The Upstream actor feeds it what clients send and what the
server writes, and carries out the actions it returns:

- :class:`SendUpstream`: write this message to the server;
- :class:`Deliver`: put this message in that session's outbound queue;
- :class:`Broadcast`: give this notification to every session using the server;
- :class:`Ready`: the handshake is done (the server's identity attached).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from typing import Any

import attrs

from broker import jsonrpc
from broker.jsonrpc import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    JsonRpcError,
    Kind,
    Message,
)
from broker.lifecycle import (
    HandshakeError,
    ServerIdentity,
    initialize_request,
    read_initialize_result,
)
from broker.requestmap import InFlight, RequestMap
from broker.server_requests import Route, ServerRequests
from broker.timeouts import Deadlines, TimeoutPolicy

HANDSHAKE_ID = "mcpbroker-initialize"


@attrs.frozen
class SendUpstream:
    message: Message


@attrs.frozen
class Deliver:
    session: Hashable
    message: Message


@attrs.frozen
class Broadcast:
    message: Message


@attrs.frozen
class Ready:
    identity: ServerIdentity


@attrs.frozen
class Warn:
    """Something the operator should hear about (logged as a warning)."""

    event: str
    detail: str


Action = SendUpstream | Deliver | Broadcast | Ready | Warn


class Phase(enum.Enum):
    HANDSHAKE = "handshake"
    READY = "ready"
    GONE = "gone"


class UpstreamProtocol:
    def __init__(self, name: str, timeouts: TimeoutPolicy | None = None) -> None:
        self.name = name
        self.phase = Phase.HANDSHAKE
        self.identity: ServerIdentity | None = None
        self.requests = RequestMap()
        self.deadlines = Deadlines(timeouts or TimeoutPolicy())
        self.server_requests = ServerRequests(name)
        # Sessions using this server -> their capabilities, least recently active first.
        self.sessions: dict[Hashable, dict[str, Any]] = {}

    def restarted(self) -> UpstreamProtocol:
        """A fresh protocol for a new server process, keeping the attached sessions."""
        fresh = UpstreamProtocol(self.name, self.deadlines.policy)
        fresh.sessions = self.sessions
        return fresh

    # -- the handshake ------------------------------------------------------

    def start(self) -> Message:
        """The first message to write to a freshly started server."""
        return initialize_request(HANDSHAKE_ID)

    # -- from clients -------------------------------------------------------

    def client_request(self, session: Hashable, request: Message, now: float = 0.0) -> Message:
        """Rewrite a client's request for the server (raises JsonRpcError)."""
        if self.phase is not Phase.READY:
            raise JsonRpcError(
                CONNECTION_CLOSED, f"Server {self.name!r} is not running", id=request["id"]
            )
        self.deadlines.add(self.requests.open(session, request), now)
        if session in self.sessions:  # now the most recently active
            self.sessions[session] = self.sessions.pop(session)
        return request

    def attach(self, session: Hashable, capabilities: dict[str, Any]) -> None:
        """A session uses this server from now on (it declared these capabilities)."""
        self.sessions[session] = capabilities

    def client_response(self, session: Hashable, response: Message) -> Message | None:
        """A client's answer to a request this server sent it, in the server's terms."""
        return self.server_requests.answer(session, response)

    def client_notification(self, session: Hashable, message: Message) -> Message | None:
        """A client's notification this server should hear (roots changed)."""
        if message["method"] == "notifications/roots/list_changed" and session in self.sessions:
            return message
        return None

    def expire(self, now: float) -> list[Action]:
        """Requests that outlived their timeout: cancel upstream, answer with an error."""
        actions: list[Action] = []
        for upstream_id in self.deadlines.expired(now):
            entry = self.requests.forget(upstream_id)
            if entry is None:
                continue
            timeout = self.deadlines.policy.timeout
            error = jsonrpc.error_response(
                entry.client_id,
                REQUEST_TIMEOUT,
                f"Request {entry.method!r} to MCP server {self.name!r} timed out "
                f"(no answer or progress for {timeout:g} s)",
                data={"server": self.name},
            )
            actions += [
                SendUpstream(_cancelled(upstream_id, "timed out")),
                Deliver(entry.session, error),
            ]
        return actions

    def client_cancelled(self, session: Hashable, params: dict[str, Any]) -> Message | None:
        """Translate a client's ``notifications/cancelled``; None if nothing to cancel."""
        upstream_id = self.requests.cancel(session, params.get("requestId"))
        if upstream_id is None:
            return None
        self.deadlines.discard(upstream_id)
        return _cancelled(upstream_id, params.get("reason"))

    def session_closed(self, session: Hashable) -> list[Message]:
        """A session went away: cancel what it still had in flight."""
        self.sessions.pop(session, None)
        gone = self.requests.drop_session(session)
        for upstream_id in gone:
            self.deadlines.discard(upstream_id)
        cancels = [_cancelled(upstream_id, "client disconnected") for upstream_id in gone]
        return cancels + self.server_requests.session_gone(session)

    # -- from the server ----------------------------------------------------

    def server_message(self, message: Any, now: float = 0.0) -> list[Action]:
        """Everything a decoded line from the server leads to."""
        kind = jsonrpc.classify(message)
        if kind is Kind.RESPONSE:
            return self._response(message)
        if kind is Kind.NOTIFICATION:
            return self._notification(message, now)
        return self._server_request(message)

    def server_gone(self, reason: str) -> list[Deliver]:
        """The server exited or its pipe broke: fail every request in flight."""
        self.phase = Phase.GONE
        self.deadlines = Deadlines(self.deadlines.policy)
        return [self._fail(entry, reason) for entry in self.requests.drain()]

    def _fail(self, entry: InFlight, reason: str) -> Deliver:
        error = jsonrpc.error_response(
            entry.client_id,
            CONNECTION_CLOSED,
            f"MCP server {self.name!r} {reason}",
            data={"server": self.name},
        )
        return Deliver(entry.session, error)

    def _response(self, message: Message) -> list[Action]:
        if self.phase is Phase.HANDSHAKE and message.get("id") == HANDSHAKE_ID:
            return self._handshake_done(message)
        upstream_id = message.get("id")
        entry = self.requests.close(message)
        if entry is None:
            return []
        self.deadlines.discard(upstream_id)  # type: ignore[arg-type]
        return [Deliver(entry.session, message)]

    def _handshake_done(self, message: Message) -> list[Action]:
        self.identity = read_initialize_result(message)  # may raise HandshakeError
        self.phase = Phase.READY
        initialized = jsonrpc.notification("notifications/initialized")
        return [SendUpstream(initialized), Ready(self.identity)]

    def _notification(self, message: Message, now: float) -> list[Action]:
        method = message["method"]
        if method == "notifications/progress":
            upstream_id = message.get("params", {}).get("progressToken")
            entry = self.requests.progress(message)
            if entry is None:
                return []
            self.deadlines.touch(upstream_id, now)
            return [Deliver(entry.session, message)]
        params = message.get("params") or {}
        if method == "notifications/cancelled":
            routed = self.server_requests.server_cancelled(params)
            return [] if routed is None else [Deliver(*routed)]
        if method == "notifications/elicitation/complete":
            session = self.server_requests.elicitation_complete(params)
            return [] if session is None else [Deliver(session, message)]
        return [Broadcast(message)]

    def _server_request(self, message: Message) -> list[Action]:
        if message["method"] == "ping":
            return [SendUpstream(jsonrpc.result_response(message["id"], {}))]
        route = self.server_requests.route(message, self.requests.sessions(), self.sessions)
        if not isinstance(route, Route):
            return [SendUpstream(route)]
        actions: list[Action] = [Deliver(route.session, route.message)]
        if route.ambiguous:
            actions.append(
                Warn(
                    "server.request_ambiguous",
                    f"{message['method']} arrived while several sessions had requests in flight; "
                    "it went to the most recent one. If this server keeps per-client state, "
                    'configure it with "share": "per-session".',
                )
            )
        return actions


def _cancelled(upstream_id: int, reason: Any) -> Message:
    params: dict[str, Any] = {"requestId": upstream_id}
    if isinstance(reason, str):
        params["reason"] = reason
    return jsonrpc.notification("notifications/cancelled", params)


__all__ = [
    "Action",
    "Broadcast",
    "Deliver",
    "HandshakeError",
    "Phase",
    "Ready",
    "SendUpstream",
    "UpstreamProtocol",
    "Warn",
]
