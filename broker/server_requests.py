"""Requests a shared server sends to a client: which client, and in whose ids.

A server asks its client for sampling (``sampling/createMessage``), user input
(``elicitation/create``) or the roots it may use (``roots/list``). Behind the
broker, "its client" is one of many sessions. On stdio nothing in the
message says which client request caused it, so the broker decides by this
rule (docs/rules/server-requests.md):

1. Only sessions that declared the needed capability are candidates (for a
   URL-mode elicitation, ``elicitation.url``).
2. Among them, a session with a request in flight on this server is chosen
   before one without, and the one whose request is the most recent wins:
   with one session in flight (the common case) that is exactly the cause.
   Several sessions in flight make the choice a guess, which
   :class:`Route` reports as ``ambiguous`` so the broker can log a warning
   recommending ``"share": "per-session"`` for such servers.
3. Otherwise the session that used the server most recently.
4. No candidate at all: the server gets a JSON-RPC error.

The request reaches the client with an id of the broker's own,
``"mcpbroker:SERVER:N"`` (unique per server, so sessions never see two
servers' requests collide), and the client's answer goes back with the
server's id restored.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

import attrs

from broker import jsonrpc
from broker.jsonrpc import INTERNAL_ERROR, METHOD_NOT_FOUND, Message, RequestId

ID_PREFIX = "mcpbroker:"
CAPABILITY_OF = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}


def supports(capabilities: dict[str, Any], method: str, params: dict[str, Any]) -> bool:
    """Whether a client with these capabilities can take this request."""
    capability = CAPABILITY_OF.get(method)
    if capability is None or not isinstance(capabilities.get(capability), dict):
        return False
    if method == "elicitation/create" and params.get("mode") == "url":
        return isinstance(capabilities["elicitation"].get("url"), dict)
    return True


def server_of(downstream_id: Any) -> str | None:
    """The server a client's response belongs to, from the id the broker gave it."""
    if not isinstance(downstream_id, str) or not downstream_id.startswith(ID_PREFIX):
        return None
    server, _, number = downstream_id[len(ID_PREFIX) :].rpartition(":")
    return server if server and number.isdigit() else None


@attrs.frozen
class Route:
    session: Hashable
    message: Message  # the request, rewritten for the client
    ambiguous: bool  # several sessions had requests in flight: the choice was a guess


@attrs.define
class _Pending:
    session: Hashable
    server_id: RequestId
    method: str


class ServerRequests:
    def __init__(self, server: str, numbering: tuple[int, int] = (1, 1)) -> None:
        """``numbering`` (first, step) keeps ids apart between instances of a pool."""
        self.server = server
        self._next, self._step = numbering
        self._pending: dict[str, _Pending] = {}
        self._elicitations: dict[str, Hashable] = {}  # URL-mode elicitationId -> session

    def route(
        self,
        request: Message,
        in_flight: Iterable[Hashable],
        attached: dict[Hashable, dict[str, Any]],
    ) -> Route | Message:
        """Where a server's request goes (a Route), or the error to answer it with.

        ``in_flight`` lists the sessions of the requests in flight on this
        server, oldest first; ``attached`` maps every session using the server
        to its capabilities, least recently active first.
        """
        method, params = request["method"], request.get("params") or {}
        if method not in CAPABILITY_OF:
            return jsonrpc.error_response(
                request["id"], METHOD_NOT_FOUND, f"Method not found: {method}"
            )
        capable = {s for s, caps in attached.items() if supports(caps, method, params)}
        busy = list(dict.fromkeys(reversed(list(in_flight))))  # most recent first
        chosen = next((s for s in busy if s in capable), None)
        if chosen is None:
            chosen = next((s for s in reversed(attached) if s in capable), None)
        if chosen is None:
            return jsonrpc.error_response(
                request["id"],
                METHOD_NOT_FOUND,
                f"No client connected through mcpbroker can handle {method}",
            )
        downstream_id = f"{ID_PREFIX}{self.server}:{self._next}"
        self._next += self._step
        self._pending[downstream_id] = _Pending(chosen, request["id"], method)
        if method == "elicitation/create" and isinstance(params.get("elicitationId"), str):
            self._elicitations[params["elicitationId"]] = chosen
        return Route(chosen, {**request, "id": downstream_id}, ambiguous=len(busy) > 1)

    def answer(self, session: Hashable, response: Message) -> Message | None:
        """A client's response, in the server's terms (None: not ours to pass on)."""
        id = response.get("id")
        pending = self._pending.get(id) if isinstance(id, str) else None
        if pending is None or pending.session != session:
            return None
        del self._pending[response["id"]]
        return {**response, "id": pending.server_id}

    def server_cancelled(self, params: dict[str, Any]) -> tuple[Hashable, Message] | None:
        """The server gave up on a request of its own: tell the client that has it."""
        for downstream_id, pending in self._pending.items():
            if pending.server_id == params.get("requestId"):
                del self._pending[downstream_id]
                note = jsonrpc.notification(
                    "notifications/cancelled", {**params, "requestId": downstream_id}
                )
                return pending.session, note
        return None

    def elicitation_complete(self, params: dict[str, Any]) -> Hashable | None:
        """The session that was given the URL-mode elicitation now complete."""
        elicitation_id = params.get("elicitationId")
        if not isinstance(elicitation_id, str):
            return None
        return self._elicitations.pop(elicitation_id, None)

    def session_gone(self, session: Hashable) -> list[Message]:
        """Errors for the server's requests a departed session will never answer."""
        gone = [key for key, pending in self._pending.items() if pending.session == session]
        errors = []
        for key in gone:
            pending = self._pending.pop(key)
            errors.append(
                jsonrpc.error_response(
                    pending.server_id,
                    INTERNAL_ERROR,
                    f"The client handling {pending.method} disconnected",
                )
            )
        self._elicitations = {k: s for k, s in self._elicitations.items() if s != session}
        return errors
