"""Requests a server sends to a client: which client, and in whose ids.

A server asks its client for sampling (``sampling/createMessage``), user input
(``elicitation/create``) or the roots it may use (``roots/list``). Behind the
broker, "its client" is one of many sessions. On stdio nothing in the
message says which client request caused it, so the broker never guesses
(docs/rules/server-requests.md). :meth:`ServerRequests.route` is given the
*causes*: the sessions with requests at the server when the request came.
The gate (broker/turns.py) sees to it that there is at most one once the
server has shown that it asks clients things.

1. Exactly one cause: the request is that session's. If that session did not
   declare the capability the request needs (``sampling``, ``elicitation``,
   or ``elicitation.url`` for a URL-mode elicitation, ``roots``), the server
   gets an error saying so; the request never goes to another session.
2. No cause: nobody's. ``roots/list`` is answered with no roots (the union
   of the roots of no client); sampling and elicitation get an error.
3. Several causes (a ``"concurrent"`` server, or the first such request of an
   ``"auto"`` one): the server gets an error; no session is picked.

The request reaches the client with an id of the broker's own,
``"mcpbroker:SERVER:N"`` (unique per server, so sessions never see two
servers' requests collide), and the client's answer goes back with the
server's id restored. N comes from one sequence per server name for the
daemon's life (:class:`ClientIds`), shared by its processes, a pool's
instances and the actor a reload puts in place of another: the old
process, draining, and the new one never ask a client with the same id.

What waits for a client's answer is bounded: at most :data:`MAX_PENDING`
requests per server instance (past that the server gets ``-32005`` at once),
each for at most the server's request timeout (then the server gets
``-32001`` and the client ``notifications/cancelled``): a client that never
answers, or a server that keeps asking, cannot grow the table without end.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import attrs

from broker import jsonrpc
from broker.jsonrpc import (
    INTERNAL_ERROR,
    LIMIT_REACHED,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    Message,
    RequestId,
)

ID_PREFIX = "mcpbroker:"
CAPABILITY_OF = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}
# A server's requests that may wait for clients' answers, per server instance
# (and URL-mode elicitations whose completion may still come: the oldest is
# forgotten past it).
MAX_PENDING = 1024


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


@attrs.frozen
class Refusal:
    """The answer the server gets instead (``reason``: why, for the log)."""

    message: Message
    reason: str


@attrs.define
class _Pending:
    session: Hashable
    server_id: RequestId
    method: str
    sent: float = 0.0  # when it went to the client


@attrs.frozen
class Expired:
    """A request of the server's its client did not answer in time: the
    server's error (``error``) and the client's cancellation (``cancel``)."""

    session: Hashable
    error: Message
    cancel: Message


class ClientIds:
    """The ids of what the broker asks clients for one server instance,
    ``mcpbroker:SERVER:N``: its own requests (:class:`ServerRequests`) and,
    in the 2026-07-28 era, the questions of its ``input_required`` answers
    (broker/eras/bridge.py, ``AskingClients``), from one sequence, so no two
    are alike (a client answering one is never taken to answer the other).
    One object is shared by whatever asks under the server's name (the
    daemon keeps one per name: actors/daemon.py), so the ids stay apart
    between the instances of a pool and across restarts and reloads too.
    ``numbering`` (first, step): where it starts, and its step."""

    def __init__(self, server: str, numbering: tuple[int, int] = (1, 1)) -> None:
        self._prefix = f"{ID_PREFIX}{server}:"
        self._next, self._step = numbering

    def take(self) -> str:
        id = f"{self._prefix}{self._next}"
        self._next += self._step
        return id


class ServerRequests:
    def __init__(self, server: str, ids: ClientIds | tuple[int, int] = (1, 1)) -> None:
        """``ids``: the instance's (or a pool's numbering for new ones)."""
        self.server = server
        self.ids = ids if isinstance(ids, ClientIds) else ClientIds(server, ids)
        self._pending: dict[str, _Pending] = {}
        self._elicitations: dict[str, Hashable] = {}  # URL-mode elicitationId -> session

    def route(
        self,
        request: Message,
        causes: list[Hashable],
        capabilities: dict[Hashable, dict[str, Any]],
        now: float = 0.0,
    ) -> Route | Refusal:
        """Where a server's request goes (a Route), or what the server gets instead.

        ``causes`` lists, once each, the sessions with requests at the server
        when it sent this one; ``capabilities`` maps the sessions using the
        server to what they declared; ``now``, when it goes (for :meth:`expire`).
        """
        method, params = request["method"], request.get("params") or {}
        if method not in CAPABILITY_OF:
            return _refuse(request, METHOD_NOT_FOUND, f"Method not found: {method}", "unknown")
        if not causes:
            if method == "roots/list":
                return Refusal(jsonrpc.result_response(request["id"], {"roots": []}), "no cause")
            return _refuse(
                request,
                INTERNAL_ERROR,
                f"mcpbroker: no client request is in progress on this server, so no client "
                f"can be asked ({method} goes only to the client whose request caused it)",
                "no cause",
            )
        if len(causes) > 1:
            return _refuse(
                request,
                INTERNAL_ERROR,
                f"mcpbroker: {len(causes)} clients have requests in progress on this server, "
                f"so which one caused {method} is unknown; it is refused, not guessed "
                '(see "serverRequests" in the broker\'s configuration)',
                "ambiguous",
            )
        (cause,) = causes
        if not supports(capabilities.get(cause, {}), method, params):
            needs = CAPABILITY_OF[method]
            if method == "elicitation/create" and params.get("mode") == "url":
                needs = "elicitation.url"
            return _refuse(
                request,
                METHOD_NOT_FOUND,
                f"mcpbroker: the client whose request caused {method} did not declare "
                f"the {needs!r} capability",
                "not capable",
            )
        if len(self._pending) >= MAX_PENDING:
            return _refuse(
                request,
                LIMIT_REACHED,
                f"mcpbroker: {len(self._pending)} requests of this server already wait for "
                f"clients' answers (the limit is {MAX_PENDING})",
                "too many",
            )
        downstream_id = self.ids.take()
        self._pending[downstream_id] = _Pending(cause, request["id"], method, now)
        if method == "elicitation/create" and isinstance(params.get("elicitationId"), str):
            if len(self._elicitations) >= MAX_PENDING:  # (the oldest's completion: dropped)
                del self._elicitations[next(iter(self._elicitations))]
            self._elicitations[params["elicitationId"]] = cause
        return Route(cause, {**request, "id": downstream_id})

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

    def next_deadline(self, timeout: float) -> float | None:
        """When the oldest request waiting for a client's answer expires."""
        for pending in self._pending.values():  # (in the order they were sent)
            return pending.sent + timeout
        return None

    def expire(self, now: float, timeout: float) -> list[Expired]:
        """The requests that waited ``timeout`` seconds for an answer, forgotten."""
        expired: list[Expired] = []
        for downstream_id, pending in list(self._pending.items()):
            if pending.sent + timeout > now:
                break  # (the rest were sent later)
            del self._pending[downstream_id]
            error = jsonrpc.error_response(
                pending.server_id,
                REQUEST_TIMEOUT,
                f"mcpbroker: the client did not answer {pending.method} within {timeout:g} s",
            )
            reason = {"requestId": downstream_id, "reason": "timed out"}
            cancel = jsonrpc.notification("notifications/cancelled", reason)
            expired.append(Expired(pending.session, error, cancel))
        return expired

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


def _refuse(request: Message, code: int, message: str, reason: str) -> Refusal:
    return Refusal(jsonrpc.error_response(request["id"], code, message), reason)
