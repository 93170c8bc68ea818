"""What a shared server says besides its answers, and which sessions hear it.

:class:`ServerNotices` takes an :class:`~broker.upstream.UpstreamProtocol`'s
server notifications and requests (its ``server_message`` hands them over)
and says where each goes, reading the protocol's tables (the in-flight
table, the fan-out, the gate):

- ``notifications/progress`` to the session whose request it is for (its
  token and id restored), which also pushes that request's deadline later;
- ``notifications/message`` to the sessions whose log level admits it
  (broker/fanout.py; at a modern server, only those with a request in
  flight that asked for logs), named ``SERVER/logger``;
- ``notifications/resources/updated`` to that URI's subscribers, a task's
  status to its session, ``list_changed`` to the catalog first (which then
  tells the sessions that see the server), anything else to every session;
- a request (sampling, elicitation, roots) to the one session it belongs to
  (broker/server_requests.py, the gate: broker/turns.py), or refused; a
  ``ping`` is answered here (docs/rules/server-requests.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker import jsonrpc
from broker.jsonrpc import Message
from broker.server_requests import CAPABILITY_OF, Route
from broker.upstream_actions import Action, Broadcast, Deliver, ListChanged, SendUpstream, Warn

if TYPE_CHECKING:
    from broker.upstream import UpstreamProtocol

LIST_CHANGED = frozenset(
    {
        "notifications/tools/list_changed",
        "notifications/prompts/list_changed",
        "notifications/resources/list_changed",
    }
)


class ServerNotices:
    """Where one server's notifications and requests go (see the module's text)."""

    def __init__(self, upstream: UpstreamProtocol) -> None:
        self.upstream = upstream

    def notification(self, message: Message, now: float) -> list[Action]:
        upstream = self.upstream
        if upstream.modern is not None:  # its listen's, in legacy terms (or its own business)
            received = upstream.modern.listen.receive(message)
            if received is None:
                return []
            message = received
        method = message["method"]
        if method == "notifications/progress":
            sent: dict[str, Any] = message.get("params") or {}  # (progress() replaces it)
            entry = upstream.requests.progress(message)
            if entry is None:
                return []
            upstream.deadlines.touch(sent["progressToken"], now)  # matched: the upstream id
            return [Deliver(entry.session, message, entry.client_id)]
        params = message.get("params") or {}
        if method == "notifications/cancelled":
            routed = upstream.server_requests.server_cancelled(params)
            return [] if routed is None else [Deliver(*routed)]
        if method == "notifications/elicitation/complete":
            session = upstream.server_requests.elicitation_complete(params)
            return [] if session is None else [Deliver(session, message)]
        if method == "notifications/message":
            return self._log_message(message, params)
        if method == "notifications/tasks/status":
            routed = upstream.tasks.status(message)
            return [] if routed is None else [Deliver(*routed)]
        if method == "notifications/resources/updated":
            return [Deliver(s, message) for s in upstream.fanout.subscribers(params.get("uri"))]
        if method in LIST_CHANGED:
            if upstream.warm_up and method == "notifications/tools/list_changed":
                upstream.warming.tools = upstream.checked = None  # unchecked until listed again
                return [ListChanged(message), upstream.list_tools()]
            return [ListChanged(message)]
        return [Broadcast(message)]

    def _log_message(self, message: Message, params: dict[str, Any]) -> list[Action]:
        upstream = self.upstream
        logger = params.get("logger")
        named = {**params, "logger": f"{upstream.name}/{logger}" if logger else upstream.name}
        note = {**message, "params": named}
        level = params.get("level")
        admitted = [s for s in upstream.sessions if upstream.fanout.admits(s, level)]
        if upstream.modern is not None:  # it logs for requests that asked
            admitted = upstream.modern.logs_to(admitted)
        sole = upstream.requests.sole_requests(upstream.turns.held) if admitted else {}
        return [Deliver(s, note, sole.get(s)) for s in admitted]

    def request(self, message: Message, related: int | str | None = None) -> list[Action]:
        """A server's request; ``related``: the upstream id of the request on
        whose stream it came, if the link can tell (Streamable HTTP)."""
        upstream = self.upstream
        method = message["method"]
        if method == "ping":
            return [SendUpstream(jsonrpc.result_response(message["id"], {}))]
        turns = upstream.turns
        if related is not None:
            # The transport says whose request it came for: that session's, if
            # the request is still in flight (nobody's otherwise), and the gate
            # has nothing to learn from it.
            entry = upstream.requests.get(related)
            causes = [] if entry is None else [entry.session]
        else:
            causes = upstream.requests.sessions(turns.held)
            if method in CAPABILITY_OF:
                turns.server_asks(method, causes)
        route = upstream.server_requests.route(message, causes, upstream.sessions)
        if isinstance(route, Route):
            if method == "roots/list":
                turns.roots_asked(route.session)
            related = upstream.requests.sole_requests(turns.held).get(route.session)
            return [Deliver(route.session, route.message, related)]
        actions: list[Action] = [SendUpstream(route.message)]
        if route.reason != "unknown" and "error" in route.message:  # (not roots: none)
            actions.append(Warn("server.request_refused", route.message["error"]["message"]))
        return actions
