"""Notifications across the eras: ``subscriptions/listen`` and per-request log levels.

Modern clients opt in to change notifications by opening streams
(``subscriptions/listen``, each named by its request id); legacy clients get
``list_changed`` always and ``resources/updated`` by ``resources/subscribe``.
Log messages are asked for per request in the modern era
(``_meta["io.modelcontextprotocol/logLevel"]``) and per session in the
legacy one (``logging/setLevel``).

- :class:`Listeners`: one modern session's streams. ``listen`` acknowledges
  (the first message of a stream), ``route`` copies a notification to every
  stream that asked for it with its ``subscriptionId``, ``cancel`` and
  ``close_all`` end them. The URIs the session listens to come out as
  :class:`Changes`, which the broker turns into ``resources/subscribe`` and
  ``resources/unsubscribe`` at legacy servers (broker/fanout.py counts them).
- :class:`UpstreamListen`: the broker's one stream at a modern server, on
  behalf of its legacy sessions (what they subscribed to, and every list);
  its notifications come out as legacy ones, ``subscriptionId`` removed.
- :class:`RequestLogLevels`: a modern session's requests in flight that
  asked for log messages; the most verbose of them is the session's level
  at a legacy server, and no such request means no log messages at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from broker import jsonrpc
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    LATEST_MODERN_VERSION,
    PROTOCOL_VERSION_KEY,
    SUBSCRIPTION_ID_KEY,
)
from broker.fanout import LOG_LEVELS, level_rank
from broker.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    LIMIT_REACHED,
    JsonRpcError,
    Message,
    RequestId,
)

MAX_LISTENS = 64  # streams open at once per session
MAX_URIS = 1024  # resource URIs per stream
LIST_FLAGS = {
    "toolsListChanged": "notifications/tools/list_changed",
    "promptsListChanged": "notifications/prompts/list_changed",
    "resourcesListChanged": "notifications/resources/list_changed",
}
FLAG_OF = {method: flag for flag, method in LIST_FLAGS.items()}
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
UPDATED = "notifications/resources/updated"


@attrs.frozen
class Filter:
    """What a stream asked for (or was granted): list flags and resource URIs."""

    lists: frozenset[str] = frozenset()  # of LIST_FLAGS' keys
    uris: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {flag: True for flag in LIST_FLAGS if flag in self.lists}
        if self.uris:
            out["resourceSubscriptions"] = sorted(self.uris)
        return out

    def wants(self, notification: Message) -> bool:
        method = notification.get("method")
        if method == UPDATED:
            params = notification.get("params")
            uri = params.get("uri") if isinstance(params, dict) else None
            return isinstance(uri, str) and uri in self.uris  # (a list uri is unhashable)
        flag = FLAG_OF.get(method) if isinstance(method, str) else None
        return flag is not None and flag in self.lists


def read_filter(params: Any) -> Filter:
    """The ``notifications`` filter of a ``subscriptions/listen`` (raises -32602)."""
    wanted = params.get("notifications") if isinstance(params, dict) else None
    if not isinstance(wanted, dict):
        raise JsonRpcError(INVALID_PARAMS, "subscriptions/listen needs params.notifications")
    uris = wanted.get("resourceSubscriptions", [])
    if not isinstance(uris, list) or not all(isinstance(uri, str) for uri in uris):
        raise JsonRpcError(INVALID_PARAMS, "resourceSubscriptions must be a list of URIs")
    if len(uris) > MAX_URIS:
        raise JsonRpcError(INVALID_PARAMS, f"more than {MAX_URIS} resourceSubscriptions")
    lists = frozenset(flag for flag in LIST_FLAGS if wanted.get(flag) is True)
    return Filter(lists, frozenset(uris))


@attrs.frozen
class Offer:
    """What a view can honour: list flags, and resource subscriptions or not."""

    lists: frozenset[str] = frozenset()
    subscribe: bool = False


def offer_of(capabilities: dict[str, Any]) -> Offer:
    """What a view with these (server) capabilities can honour."""
    lists = set()
    for flag, kind in zip(LIST_FLAGS, ("tools", "prompts", "resources"), strict=True):
        offered = capabilities.get(kind)
        if isinstance(offered, dict) and offered.get("listChanged"):
            lists.add(flag)
    resources = capabilities.get("resources")
    subscribe = isinstance(resources, dict) and bool(resources.get("subscribe"))
    return Offer(frozenset(lists), subscribe)


@attrs.frozen
class Changes:
    """Resource URIs a session now listens to, or no longer does."""

    added: frozenset[str] = frozenset()
    removed: frozenset[str] = frozenset()


class Listeners:
    """One modern session's ``subscriptions/listen`` streams."""

    def __init__(self, offered: Offer, limit: int = MAX_LISTENS) -> None:
        self.offered = offered
        self.limit = limit
        self._streams: dict[tuple[type, RequestId], tuple[RequestId, Filter]] = {}

    def __len__(self) -> int:
        return len(self._streams)

    def listen(
        self, request: Message, accept: Callable[[str], bool] | None = None
    ) -> tuple[list[Message], Changes]:
        """Open a stream: its acknowledgement (what is granted) and the new URIs.
        ``accept``: whether a resource URI can be subscribed to (all, if None)."""
        id = request["id"]
        key = jsonrpc.id_key(id)
        if key in self._streams:
            raise JsonRpcError(INVALID_REQUEST, f"subscription {id!r} is already open", id=id)
        if len(self._streams) >= self.limit:
            message = f"mcpbroker: {self.limit} subscriptions are open on this session"
            raise JsonRpcError(LIMIT_REACHED, message, id=id)
        try:
            asked = read_filter(request.get("params"))
        except JsonRpcError as exc:
            exc.id = id
            raise
        granted = Filter(
            asked.lists & self.offered.lists,
            frozenset(uri for uri in asked.uris if accept is None or accept(uri))
            if self.offered.subscribe
            else frozenset(),
        )
        before = self.uris()
        self._streams[key] = (id, granted)
        params = {"_meta": {SUBSCRIPTION_ID_KEY: id}, "notifications": granted.to_json()}
        ack = jsonrpc.notification(ACKNOWLEDGED, params)
        return [ack], Changes(added=granted.uris - before)

    def cancel(self, id: Any) -> Changes | None:
        """The client cancelled a stream (None: no such stream); no answer is due."""
        if not jsonrpc.is_valid_id(id) or jsonrpc.id_key(id) not in self._streams:
            return None
        before = self.uris()
        del self._streams[jsonrpc.id_key(id)]
        return Changes(removed=before - self.uris())

    def close_all(self) -> tuple[list[Message], Changes]:
        """End every stream gracefully (the broker shuts down): their results."""
        before = self.uris()
        results = [
            jsonrpc.result_response(
                id, {"resultType": "complete", "_meta": {SUBSCRIPTION_ID_KEY: id}}
            )
            for id, _ in self._streams.values()
        ]
        self._streams.clear()
        return results, Changes(removed=before)

    def route(self, notification: Message) -> list[Message]:
        """A copy of the notification for each stream that asked for it."""
        out = []
        for id, granted in self._streams.values():
            if granted.wants(notification):
                out.append(_stamped(notification, id))
        return out

    def uris(self) -> frozenset[str]:
        return frozenset().union(*(granted.uris for _, granted in self._streams.values()))


def _stamped(notification: Message, subscription: RequestId) -> Message:
    params = notification.get("params")
    params = params if isinstance(params, dict) else {}
    meta = params.get("_meta")
    meta = {**meta} if isinstance(meta, dict) else {}
    meta[SUBSCRIPTION_ID_KEY] = subscription
    return {**notification, "params": {**params, "_meta": meta}}


class UpstreamListen:
    """The broker's one ``subscriptions/listen`` at a modern server.

    Its filter is every list the server offers to announce, and the URIs the
    server's sessions subscribed to (``resources/subscribe`` of legacy
    clients, the streams of modern ones: broker/fanout.py counts them). A
    changed filter replaces the stream, make before break: the old stream
    (if it was acknowledged) is relayed until the new one is acknowledged,
    and only then cancelled (:meth:`take_retired`), so that no update of a
    URI both hold falls in a gap; an empty filter closes it. A stream the
    server ends gracefully (its result) is opened again, and its lists are
    fetched again (events in the gap are lost: no replay in 2026-07-28); one
    it refuses (an error) is not asked again until the filter changes."""

    def __init__(self, capabilities: dict[str, Any]) -> None:
        self.capabilities = capabilities  # what the broker declares as the client
        self.id: RequestId | None = None
        self.filter: Filter | None = None
        self.granted: Filter | None = None  # None until acknowledged
        self.refused: Filter | None = None  # the filter the server last refused
        # The acknowledged stream the current one replaces, until that one is
        # acknowledged: its id, filter and grant (None: none).
        self.old: tuple[RequestId, Filter | None, Filter] | None = None
        self._retired: list[Message] = []  # its cancel, once it is replaced

    def want(self, filter: Filter, new_id: RequestId) -> list[Message]:
        """Listen for ``filter`` (the lists, and the URIs legacy sessions
        subscribed to): the messages to send, none if it already does. A
        changed filter replaces the stream (the old one is cancelled once
        the new one is acknowledged; at once if it never was)."""
        if (filter == self.filter and self.id is not None) or filter == self.refused:
            return []
        out = []
        if self.id is not None and self.granted is not None and self.old is None:
            self.old = (self.id, self.filter, self.granted)  # (relayed until replaced)
        elif self.id is not None:
            out.append(_cancel(self.id))
        self.refused = None
        if not filter.lists and not filter.uris:  # nothing to hear of: no stream
            if self.old is not None:
                out.append(_cancel(self.old[0]))
            self.id = self.filter = self.granted = self.old = None
            return out
        self.id, self.filter, self.granted = new_id, filter, None
        meta = {
            PROTOCOL_VERSION_KEY: LATEST_MODERN_VERSION,
            CLIENT_CAPABILITIES_KEY: self.capabilities,
        }
        params = {"_meta": meta, "notifications": filter.to_json()}
        out.append(
            {"jsonrpc": "2.0", "id": new_id, "method": "subscriptions/listen", "params": params}
        )
        return out

    def receive(self, notification: Message) -> Message | None:
        """A server notification in legacy terms (None: the broker's own business,
        or not of the current stream: an old stream's stragglers are dropped)."""
        params = notification.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if not isinstance(params, dict) or not isinstance(meta, dict):
            return notification  # request-scoped (progress, log): not a stream's
        if SUBSCRIPTION_ID_KEY not in meta:
            return notification
        subscription = meta[SUBSCRIPTION_ID_KEY]
        if self.old is not None and subscription == self.old[0]:
            if notification.get("method") == ACKNOWLEDGED:
                return None
        elif subscription != self.id or self.id is None:
            return None
        elif notification.get("method") == ACKNOWLEDGED:
            try:
                self.granted = read_filter(params)
            except JsonRpcError:
                self.granted = Filter()  # an acknowledgement, if a garbled one
            if self.old is not None:  # (the stream it replaces carries nothing more)
                self._retired.append(_cancel(self.old[0]))
                self.old = None
            return None
        elif self.granted is None:
            return None  # before the acknowledgement: the server broke the order
        kept = {k: v for k, v in meta.items() if k != SUBSCRIPTION_ID_KEY}
        new_params = {k: v for k, v in params.items() if k != "_meta"}
        if kept:
            new_params["_meta"] = kept
        return {**notification, "params": new_params}

    def take_retired(self) -> list[Message]:
        """The cancel of a stream the current one replaced, once that one is
        acknowledged (to send): nearly always none."""
        retired, self._retired = self._retired, []
        return retired

    def dropped(self) -> Filter | None:
        """The stream broke (the link lost it): the filter to listen for again
        if it had been acknowledged (it worked: a drop, as the spec's abrupt
        close), else None (taken as refused: never a loop of failing listens;
        the stream it was to replace, if any, goes on as the listen)."""
        filter, worked = self.filter, self.granted is not None
        self.id = self.filter = self.granted = None
        if worked:
            return filter
        self.refused = filter
        self._restore()
        return None

    def _restore(self) -> None:
        # The replacement failed before its acknowledgement: the stream it was
        # to replace (still open at the server) is the listen again.
        if self.old is not None:
            self.id, self.filter, self.granted = self.old
            self.old = None

    def ended(self, response: Message) -> Filter | None:
        """The server answered the stream's request: it is over. The filter
        to listen for again (a graceful end), else None (not this stream's
        answer, or a refusal, which is not asked again until the filter
        changes)."""
        if self.id is None or response.get("id") != self.id:
            return None
        filter = self.filter
        self.id = self.filter = self.granted = None
        if "result" in response:
            return filter
        self.refused = filter
        self._restore()
        return None


def _cancel(id: RequestId) -> Message:
    cancel = {"requestId": id, "reason": "subscriptions changed"}
    return jsonrpc.notification("notifications/cancelled", cancel)


class RequestLogLevels:
    """A modern session's requests in flight that asked for log messages."""

    def __init__(self) -> None:
        # (read by the session to skip closing when no request asked)
        self.ranks: dict[tuple[type, RequestId], int] = {}

    def open(self, id: RequestId, level: str | None) -> str | None:
        """Record a request; the session's new level if it changed, else None."""
        rank = level_rank(level)
        if rank is None:
            return None
        before = self.level()
        self.ranks[jsonrpc.id_key(id)] = rank
        after = self.level()
        return after if after != before else None

    def close(self, id: Any) -> bool:
        """Forget a request answered; True if the session's level changed."""
        if not jsonrpc.is_valid_id(id):
            return False
        before = self.level()
        if self.ranks.pop(jsonrpc.id_key(id), None) is None:
            return False
        return self.level() != before

    def level(self) -> str | None:
        """The most verbose level any request in flight asked for (None: none asked)."""
        return LOG_LEVELS[min(self.ranks.values())] if self.ranks else None

    def admits(self, notification: Message) -> bool:
        """Whether a ``notifications/message`` may go to this session now."""
        params = notification.get("params")
        rank = level_rank(params.get("level") if isinstance(params, dict) else None)
        return bool(self.ranks) and rank is not None and rank >= min(self.ranks.values())
