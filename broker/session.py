"""One downstream MCP session, sans-I/O: lifecycle, local answers, routing.

The broker is the server its clients see. :class:`SessionProtocol` takes each
decoded message a client sends and returns what to do with it:

- :class:`Reply`: answer the client (initialize, ping, every error);
- :class:`Forward`: send the request to the named upstream server;
- :class:`CancelUpstream`: pass a client's ``notifications/cancelled`` on to
  every server the session uses (only the one holding the request acts on it);
- :class:`Defer`: wait for the view's servers to settle, then try again.

List requests are answered from the catalog snapshot; calls are routed by
:mod:`broker.views` (by name, URI or completion ref) to the owning server.

Theory of operation: the session's state is its lifecycle's
(:mod:`broker.states`: the table, and where a handshake-less session of the
2026-07-28 era will start). It starts ``CONNECTING`` and accepts only
``initialize`` and ``ping``. Once it has answered ``initialize`` it is
``OPERATING`` (clients commonly send requests before
``notifications/initialized``, and the spec's "SHOULD NOT" there is not worth
failing them for). A second ``initialize`` is an error. Its actor moves it to
``CLOSING`` when the client closes its side and ``CLOSED`` when it ends. An
unexpected exception inside it moves it to ``ERROR``, and it refuses further
use (raises :class:`~broker.states.LifecycleError`).

JSON-RPC batches are accepted only from clients that negotiated 2025-03-26,
the one version whose schema has them; their responses are collected by
:class:`BatchCollector` and written as one array.
"""

from __future__ import annotations

from typing import Any, Final, NoReturn, Protocol

import attrs

from broker import jsonrpc
from broker.calls import CallTracker
from broker.catalog import KIND_BY_METHOD, Catalog
from broker.fanout import level_rank
from broker.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    LIMIT_REACHED,
    MAX_ID_LENGTH,
    METHOD_NOT_FOUND,
    JsonRpcError,
    Kind,
    Message,
    RequestId,
    id_key,
)
from broker.lifecycle import BATCH_VERSIONS, negotiate_version, read_client_initialize
from broker.records import Record
from broker.related import Related
from broker.server_requests import server_of
from broker.states import LifecycleError, SessionState, SessionTrigger, next_session_state
from broker.views import initialize_for, route
from broker.wire.envelope import Answer
from broker.wire.frames import Frame

DEFAULT_MAX_IN_FLIGHT = 4096
# The URIs one (aggregated) session may hold subscriptions of at once
# (docs/rules/subscriptions.md).
MAX_SUBSCRIPTIONS = 4096
# The longest URI any session may subscribe to: with MAX_SUBSCRIPTIONS, what
# its notes (and a shared server's table of subscribers) hold is bounded in
# bytes, not only in URIs (docs/rules/subscriptions.md).
MAX_SUBSCRIBED_URI = 8192

# Requests answered from the catalog, and requests routed to the server that owns them.
LIST_METHODS = KIND_BY_METHOD
ROUTED_METHODS: Final = frozenset(
    {
        "tools/call",
        "prompts/get",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "completion/complete",
        "tasks/get",
        "tasks/result",
        "tasks/cancel",
        "tasks/list",
    }
)
# Routed by where the session's subscription of the URI is (SessionProtocol.subscribed).
SUBSCRIPTION_METHODS: Final = frozenset({"resources/subscribe", "resources/unsubscribe"})


class CatalogSource(Protocol):
    """Where a session finds the latest catalog snapshot (the Registry)."""

    @property
    def current(self) -> Catalog: ...


class Reply(Record):
    """Write ``message`` to the client (a record made per message: broker/records.py)."""

    __slots__ = ("message",)

    def __init__(self, message: Message | list[Message]) -> None:
        self.message = message

    def fields(self) -> tuple[Any, ...]:
        return (self.message,)


class Forward(Record):
    """Send ``message`` to ``server`` (a record made per message: broker/records.py)."""

    __slots__ = ("message", "server")

    def __init__(self, server: str, message: Message) -> None:
        self.server = server
        self.message = message

    def fields(self) -> tuple[Any, ...]:
        return (self.server, self.message)


@attrs.frozen
class CancelUpstream:
    params: dict[str, Any]


@attrs.frozen
class RespondUpstream:
    """A client's answer to a request a server sent it (through the broker)."""

    server: str
    message: Message


@attrs.frozen
class NotifyUpstreams:
    """A client notification every server of the view should hear."""

    message: Message


@attrs.frozen
class SetLogLevel:
    """The session's log level changed: every server of the view should know."""

    level: str


@attrs.frozen
class Attach:
    """The session is initialized: from now on it hears from the view's servers
    (their notifications and requests) and from the catalog (list_changed)."""

    view: tuple[str, ...]
    capabilities: dict[str, Any]


@attrs.frozen
class Defer:
    """Wait until every server of the view has settled, then receive this again."""

    message: Message


# What to do with a message read while a request waits (Defer): see while_waiting.
HOLD: Final = "hold"
NOW: Final = "now"
DROP: Final = "drop"


def while_waiting(message: Any, waiting: Any, inflight: set[Any]) -> str:
    """What a session does with ``message``, read while its request
    ``waiting`` (an id) waits for the view's servers: :data:`NOW`, receive
    it at once (a ping, or a cancel of a request in ``inflight``: answered,
    or passed on); :data:`DROP`, a cancel of the waiting request (the wait
    ends; it is never tried, and no answer is due: its id leaves
    ``inflight``, where :meth:`SessionProtocol.receive` put it when it
    deferred it); :data:`HOLD`, anything else, received after the wait in
    the order it came (a cancel of a request read but not taken yet too: it
    must follow its request)."""
    method = message.get("method") if isinstance(message, dict) else None
    if method == "ping":
        return NOW if "id" in message else HOLD
    if method != "notifications/cancelled":
        return HOLD
    params = message.get("params")
    target = params.get("requestId") if isinstance(params, dict) else None
    if type(target) is type(waiting) and target == waiting:
        inflight.discard(waiting)  # (in flight no more)
        return DROP
    return NOW if jsonrpc.is_valid_id(target) and target in inflight else HOLD


Action = (
    Reply
    | Forward
    | CancelUpstream
    | RespondUpstream
    | NotifyUpstreams
    | SetLogLevel
    | Attach
    | Defer
)


class AnonymousError(JsonRpcError):
    """An error answered with id null: the request's id belongs to another
    request of the session still in flight, whose answer must stay the only
    one with that id (the id is in ``data``)."""


# A session in one of these takes nothing more, in or out.
_OVER = (SessionState.ERROR, SessionState.CLOSED)


class SessionProtocol:
    def __init__(
        self,
        view: tuple[str, ...],
        catalogs: CatalogSource,
        *,
        transparent: bool = False,
        refusal: str | None = None,
        refusal_data: dict[str, Any] | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        self.view = view
        self.max_in_flight = max_in_flight
        self.catalogs = catalogs
        self.transparent = transparent and len(view) == 1
        # Set when the session cannot be served at all (a hello naming unknown
        # servers): every request is then answered with this error message.
        self.refusal = refusal
        # The error code of that answer: -32602 for a hello that cannot be
        # served; -32000 when the daemon is stopping or the session's server
        # was removed (actors/session.py, ``Session.refuse``).
        self.refusal_code = INVALID_PARAMS
        # (that error's data: a removed server's; unknown servers' for a hello)
        self.refusal_data = refusal_data
        self.state = SessionState.CONNECTING
        # Ids of requests forwarded and not yet answered (the session's in-flight
        # table). Only valid ids (int, str) enter it, so the ids themselves are
        # keys: 1 and "1" stay apart, and no bool or float can alias an int.
        self.inflight: set[RequestId] = set()
        # Ids of requests open with no server (a 2026-07-28 session's
        # subscriptions/listen streams): in use as in flight ones are, but
        # no answer is waited for (a drain or a client's leaving ends them).
        self.streams: set[RequestId] = set()
        self.protocol_version: str | None = None
        self.client_capabilities: dict[str, Any] = {}
        self.client_info: Any = None
        self.batches = BatchCollector()
        # What each request came to, counted (broker/calls.py): set by the actor
        # when the daemon keeps metrics or an audit log.
        self.calls: CallTracker | None = None
        # The methods forward_fast takes (a modern session takes fewer): the
        # session's own, so a subclass's fast path tests a method once. Not
        # the (rare) subscriptions, which _forward routes by ``subscribed``.
        self.fast_methods: frozenset[str] = ROUTED_METHODS - SUBSCRIPTION_METHODS
        # The URIs this (aggregated) session subscribed to, each with the
        # server it went to: the unsubscribe goes there, and so does a repeat
        # subscribe, whichever server the catalog routes the URI to now
        # (docs/rules/subscriptions.md). At most MAX_SUBSCRIPTIONS.
        self.subscribed: dict[str, str] = {}
        # The subscribes on their way, by id: the URI, the server, and the
        # URI's note before (put back if the server refuses it).
        self.subscribing: dict[RequestId, tuple[str, str, str | None]] = {}
        # The servers of the view a request of this session already waited
        # for the whole time (SETTLE_TIMEOUT) in vain: no request waits for
        # them again (docs/protocol.md), it takes what the catalog has.
        self.waited_out: frozenset[str] = frozenset()

    # -- waiting for the view's servers --------------------------------------

    def servers_settled(self, catalog: Catalog) -> bool:
        """Whether a request needs the catalog of no server of the view that
        it should wait for (a :class:`Defer`)."""
        return catalog.settled(self.awaited())

    def awaited(self) -> tuple[str, ...]:
        """The servers of the view a request waits for, if they have not settled."""
        if not self.waited_out:
            return self.view
        return tuple(name for name in self.view if name not in self.waited_out)

    def waited_in_vain(self, catalog: Catalog) -> None:
        """A request waited the whole time for the view's servers: those still
        not settled in ``catalog`` are waited for no more by this session."""
        unsettled = {
            name
            for name in self.view
            if name in catalog.servers and not catalog.entry(name).settled
        }
        self.waited_out |= unsettled

    def wait_again(self, name: str) -> None:
        """A reload restarted, added or removed ``name``: a request waits for
        it again, as for a server it never waited for (while in the view)."""
        if name in self.waited_out:
            self.waited_out = self.waited_out - {name}

    # -- the lifecycle ------------------------------------------------------

    def move(self, trigger: SessionTrigger) -> SessionState:
        """Move the session's state (raises LifecycleError if illegal)."""
        self.state = next_session_state(self.state, trigger)
        return self.state

    def _refuse(self) -> NoReturn:
        raise LifecycleError(f"this session is {self.state.value}: it takes nothing more")

    # -- input --------------------------------------------------------------

    def receive(self, message: Any, *, settled: bool = False) -> list[Action]:
        """Everything one decoded message (object or batch array) leads to.

        A request that needs the catalog while a server of the view is still
        starting comes back as :class:`Defer`; the actor waits for the view to
        settle and hands it in again with ``settled=True``. An exception other
        than the JSON-RPC errors it answers moves the session to ``ERROR``.
        A deferred request's id is in flight until it is received again (or
        its wait is cancelled: :func:`while_waiting`), so no other request
        takes it meanwhile.
        """
        if self.state in _OVER:
            self._refuse()
        if settled and type(message) is dict:
            id = message.get("id")
            if type(id) is int or type(id) is str:
                self.inflight.discard(id)  # (its _defer's: it is taken now)
        try:
            return self._receive(message, settled)
        except Exception:
            self.move(SessionTrigger.FAILED)
            raise

    def _receive(self, message: Any, settled: bool) -> list[Action]:
        if isinstance(message, list):
            return self._receive_batch(message)
        try:
            return self._receive_one(message, settled)
        except JsonRpcError as exc:
            return [Reply(exc.to_response())]

    def forward_fast(self, message: Any) -> tuple[str, Message] | None:
        """The common case, cheaply: a request to forward on an operating session.

        Returns the server and the request in its terms, as the one
        :class:`Forward` that :meth:`receive` would return; None for anything
        else (then :meth:`receive` decides). tests/test_fuzz.py holds the two
        to the same answers.
        """
        if (
            type(message) is not dict
            or self.state is not SessionState.OPERATING
            or self.refusal is not None
            or message.get("jsonrpc") != "2.0"
            or type(message.get("params", {})) is not dict
        ):
            return None
        method, id = message.get("method"), message.get("id")
        if (type(id) is not int and (type(id) is not str or len(id) > MAX_ID_LENGTH)) or (
            type(method) is not str or method not in self.fast_methods
        ):
            return None
        return self.route_fast(message, id)

    def route_fast(self, message: Message, id: RequestId) -> tuple[str, Message] | None:
        """:meth:`forward_fast` once the message is known to be a request it
        takes (a modern session's own read knows more of it, and checks the
        rest itself): routed and counted in flight, or None."""
        if (
            id in self.inflight
            or len(self.inflight) >= self.max_in_flight
            or (self.streams and id in self.streams)
        ):
            return None  # receive() refuses it
        try:
            server, rewritten = route(self.catalogs.current, self.view, self.transparent, message)
        except JsonRpcError:
            return None  # unknown (or not yet known) name: receive() answers or defers
        self.inflight.add(id)
        if self.calls is not None:
            self.calls.routed(id, server, rewritten)
        return server, rewritten

    def take_forwards(
        self, frames: list[Frame], start: int, forwards: dict[str, list[Message]]
    ) -> int:
        """The hot path of a client's input, a run of frames at a time (each
        frame one message's bytes, broker/wire/frames.py): from ``frames[start]``
        on, each request that :meth:`forward_fast` takes is added, in its
        server's terms, to that server's list in ``forwards``, up to the first
        frame that needs more (not JSON, too long, or anything else). Returns
        that frame's index (``len(frames)``: none); the caller reads it again.
        Before the handshake (or on a refused session) it takes nothing, so
        those frames are decoded once, by the caller."""
        if self.state is not SessionState.OPERATING or self.refusal is not None:
            return start
        try:
            for i in range(start, len(frames)):
                frame = frames[i]
                if type(frame) is not bytes:
                    return i
                try:
                    forward = self.forward_fast(jsonrpc.decode(frame))
                except JsonRpcError:
                    return i
                if forward is None:
                    return i
                forwards.setdefault(forward[0], []).append(forward[1])
        except Exception:
            self.move(SessionTrigger.FAILED)
            raise
        return len(frames)

    def _receive_one(self, message: Any, settled: bool) -> list[Action]:
        kind = jsonrpc.classify(message)
        if kind is Kind.REQUEST:
            id = message["id"]
            if self.calls is not None and (type(id) is int or len(id) <= MAX_ID_LENGTH):
                self.calls.start(id, message)
            try:
                if id in self.inflight or id in self.streams:
                    self._in_use(id)  # (whoever answers it: the broker or a server)
                return self._request(message, settled)
            except AnonymousError:
                raise
            except JsonRpcError as exc:
                exc.id = message["id"]
                raise
        if kind is Kind.NOTIFICATION:
            return self._notification(message)
        # (a server a reload removed left the view, but its old process may
        # still wait for this answer while it drains; only the instance that
        # gave this client that id takes it: broker/server_requests.py)
        server = server_of(message.get("id"))
        return [] if server is None else [RespondUpstream(server, message)]

    def _request(self, request: Message, settled: bool) -> list[Action]:
        method, id = request["method"], request["id"]
        if self.refusal is not None:
            raise JsonRpcError(
                self.refusal_code, f"mcpbroker: {self.refusal}", data=self.refusal_data
            )
        if method == "ping":
            return [Reply(jsonrpc.result_response(id, {}))]
        if method == "server/discover":
            raise JsonRpcError(
                METHOD_NOT_FOUND, "Method not found: server/discover (use initialize)"
            )
        if method == "initialize":
            return self._initialize(request, settled)
        if self.state is SessionState.CONNECTING:
            raise JsonRpcError(INVALID_REQUEST, "Session not initialized: send initialize first")
        if method in LIST_METHODS:
            return self._list(request, settled)
        if method == "logging/setLevel":
            level = (request.get("params") or {}).get("level")
            if level_rank(level) is None:
                raise JsonRpcError(INVALID_PARAMS, f"Unknown log level: {level!r}")
            return [Reply(jsonrpc.result_response(id, {})), SetLogLevel(str(level))]
        if method in ROUTED_METHODS:
            return self._forward(request, settled)
        raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}")

    def _initialize(self, request: Message, settled: bool) -> list[Action]:
        if self.state is not SessionState.CONNECTING:
            raise JsonRpcError(INVALID_REQUEST, "Session already initialized")
        requested, capabilities, info = read_client_initialize(request.get("params"))
        catalog = self.catalogs.current
        if not settled and not self.servers_settled(catalog):
            return self._defer(request)
        version = negotiate_version(requested)
        result = initialize_for(catalog, self.view, self.transparent, version)
        self.move(SessionTrigger.INITIALIZED)
        self.protocol_version = version
        self.client_capabilities = capabilities
        self.client_info = info
        return [
            Reply(jsonrpc.result_response(request["id"], result)),
            Attach(self.view, capabilities),
        ]

    def _list(self, request: Message, settled: bool) -> list[Action]:
        catalog = self.catalogs.current
        if not settled and not self.servers_settled(catalog):
            return self._defer(request)
        cursor = (request.get("params") or {}).get("cursor")
        result = catalog.page(LIST_METHODS[request["method"]], self.view, self.transparent, cursor)
        return [Reply(jsonrpc.result_response(request["id"], result))]

    def _forward(self, request: Message, settled: bool) -> list[Action]:
        self._admit(request["id"])
        if request["method"] == "resources/subscribe":
            self._room_for(request)  # (before the try: no wait for the view changes it)
        catalog = self.catalogs.current
        try:
            if request["method"] in SUBSCRIPTION_METHODS and not self.transparent:
                server, rewritten = self._route_subscription(catalog, request)
            else:
                server, rewritten = route(catalog, self.view, self.transparent, request)
        except JsonRpcError:
            if settled or self.servers_settled(catalog):
                raise
            return self._defer(request)  # it may be in a catalog still loading
        self.inflight.add(request["id"])
        if self.calls is not None:
            self.calls.routed(request["id"], server, rewritten)
        return [Forward(server, rewritten)]

    def _route_subscription(self, catalog: Catalog, request: Message) -> tuple[str, Message]:
        """A subscribe or unsubscribe goes to the server that holds the
        session's subscription of the URI, if any (still in the view), else
        where a read would go; the URI is noted as held there, or not held
        (a subscribe's note is undone if the server refuses it)."""
        uri = (request.get("params") or {}).get("uri")
        held = self.subscribed.get(uri) if isinstance(uri, str) else None
        if held is None or held not in self.view:
            held, request = route(catalog, self.view, False, request)
        assert isinstance(uri, str)  # (route takes no other)
        if request["method"] == "resources/subscribe":
            self.subscribing[request["id"]] = (uri, held, self.subscribed.get(uri))
            self.subscribed[uri] = held
        else:
            self.subscribed.pop(uri, None)
        return held, request

    def _room_for(self, request: Message) -> None:
        """Refuse a subscribe of a URI over MAX_SUBSCRIBED_URI long (any
        session's), or of a new URI past MAX_SUBSCRIPTIONS (an aggregated
        session's; the notes of servers that left the view are let go first)."""
        uri = (request.get("params") or {}).get("uri")
        if isinstance(uri, str) and len(uri) > MAX_SUBSCRIBED_URI:
            raise JsonRpcError(
                INVALID_PARAMS,
                f"mcpbroker: a URI of over {MAX_SUBSCRIBED_URI} characters is not subscribed to",
            )
        if (
            self.transparent
            or not isinstance(uri, str)
            or uri in self.subscribed
            or len(self.subscribed) < MAX_SUBSCRIPTIONS
        ):
            return
        view, inflight = self.view, self.inflight
        self.subscribed = {u: server for u, server in self.subscribed.items() if server in view}
        self.subscribing = {id: note for id, note in self.subscribing.items() if id in inflight}
        if len(self.subscribed) >= MAX_SUBSCRIPTIONS:
            raise JsonRpcError(
                LIMIT_REACHED,
                f"mcpbroker: this session already holds subscriptions of {MAX_SUBSCRIPTIONS} "
                "resources (the limit): unsubscribe from some first",
            )

    def _subscribe_answered(self, id: RequestId, answer: Message) -> None:
        """A subscribe's answer: refused, the URI's note is what it was before
        (unless something since changed it), so the URI is not pinned to a
        server that holds nothing of it."""
        uri, server, before = self.subscribing.pop(id)
        if "error" in answer and self.subscribed.get(uri) == server:
            if before is None:
                del self.subscribed[uri]
            else:
                self.subscribed[uri] = before

    def end_streams(self) -> list[Message]:
        """The daemon ends the session: the graceful end of each request it
        holds open with no server (none in the legacy era)."""
        return []

    def _defer(self, request: Message) -> list[Action]:
        """Wait for the view's servers, then take ``request`` again; its id
        is in flight meanwhile (:meth:`receive`)."""
        self.inflight.add(request["id"])
        return [Defer(request)]

    def _in_use(self, id: RequestId) -> NoReturn:
        """Refuse a request whose id belongs to a request in flight."""
        raise AnonymousError(
            INVALID_REQUEST,
            f"Invalid Request: id {id!r} is already in use by a request in flight",
            data={"id": id},
        )

    def _admit(self, id: RequestId) -> None:
        """Refuse a request the session's in-flight table cannot take."""
        if id in self.inflight or id in self.streams:
            self._in_use(id)
        too_long = jsonrpc.long_id(id)
        if too_long is not None:
            raise AnonymousError(too_long.code, too_long.message)
        if len(self.inflight) >= self.max_in_flight:
            raise JsonRpcError(
                LIMIT_REACHED,
                f"mcpbroker: this session already has {len(self.inflight)} requests in flight "
                f"(the limit is broker.maxInFlight = {self.max_in_flight})",
            )

    def _notification(self, message: Message) -> list[Action]:
        method = message["method"]
        if method == "notifications/cancelled":
            params = message.get("params") or {}
            request_id = params.get("requestId")
            if not jsonrpc.is_valid_id(request_id):
                return []
            self.inflight.discard(request_id)
            if self.subscribing:
                self.subscribing.pop(request_id, None)  # (it may have been taken: noted)
            if self.calls is not None:
                self.calls.cancelled(request_id)
            actions: list[Action] = [CancelUpstream(params)]
            finished = self.batches.forget(request_id)
            if finished:
                actions.append(Reply(finished))
            return actions
        if method == "notifications/roots/list_changed":
            return [NotifyUpstreams(message)]
        return []  # initialized; progress on a server's request is not relayed

    def _receive_batch(self, items: list[Any]) -> list[Action]:
        if not items:
            return [Reply(jsonrpc.error_response(None, INVALID_REQUEST, "Empty batch"))]
        if self.protocol_version not in BATCH_VERSIONS:
            return [
                Reply(
                    jsonrpc.error_response(
                        None,
                        INVALID_REQUEST,
                        "JSON-RPC batches are only allowed in protocol version 2025-03-26 "
                        f"(this session negotiated {self.protocol_version or 'none yet'})",
                    )
                )
            ]
        return self.batches.run(items, self._receive_batch_item)

    def _receive_batch_item(self, item: Any) -> list[Action]:
        if isinstance(item, dict) and item.get("method") == "initialize":
            error = JsonRpcError(INVALID_REQUEST, "initialize must not be part of a batch")
            error.id = item.get("id") if jsonrpc.is_valid_id(item.get("id")) else None
            return [Reply(error.to_response())]
        if isinstance(item, list):
            return [Reply(jsonrpc.error_response(None, INVALID_REQUEST, "Nested batch"))]
        return self._receive(item, False)

    # -- output -------------------------------------------------------------

    def outgoing(
        self, message: Message | list[Message] | Answer | Related
    ) -> Message | list[Message] | Answer | Related | None:
        """What to write for a message bound for the client (None: hold it)."""
        if type(message) is Answer:  # nearly every one: an answer, unparsed
            if self.inflight:
                self.inflight.discard(message.id)
            if self.calls is not None:
                self.calls.answered(message.id, message)
            if not self.batches.pending:
                return message
            message = message.read()  # (batches are rare: look inside this one)
        if type(message) is dict and "method" not in message:
            if self.inflight:
                id = message.get("id")
                if type(id) is int or type(id) is str:
                    self.inflight.discard(id)
                    if self.subscribing and id in self.subscribing:  # (parsed: broker/upstream.py)
                        self._subscribe_answered(id, message)
            if self.calls is not None:
                self.calls.answered(message.get("id"), message)
            if self.batches.pending:
                return self.batches.collect(message)
        return message

    def take_outgoing(
        self,
        delivery: list[Message | list[Message] | Answer | Related],
        out: list[Message | list[Message] | Answer | Related],
    ) -> None:
        """Add to ``out`` what to write for a delivery of messages bound for the
        client, in order (answers held for a batch are added when it is
        complete). The connection's wire format then writes them. An
        unexpected exception moves the session to ``ERROR``."""
        if self.state in _OVER:
            self._refuse()
        try:
            for message in delivery:
                written = self.outgoing(message)
                if written is not None:
                    out.append(written)
        except Exception:
            self.move(SessionTrigger.FAILED)
            raise


@attrs.define
class _Batch:
    waiting: set[tuple[type, RequestId]]
    responses: list[Message]
    running: bool = True  # still being received: run() sends what is ready at its end


class BatchCollector:
    """Gathers the responses to one batch's requests into one array."""

    def __init__(self) -> None:
        self._by_id: dict[tuple[type, RequestId], _Batch] = {}

    @property
    def pending(self) -> bool:
        return bool(self._by_id)

    def run(self, items: list[Any], receive: Any) -> list[Action]:
        batch = _Batch(set(), [])
        actions: list[Action] = []
        for item in items:
            for action in receive(item):
                message = action.message if isinstance(action, Reply) else None
                if isinstance(message, dict) and message.get("id") is None:
                    batch.responses.append(message)  # an error with no id to match
                else:
                    actions.append(action)
            if isinstance(item, dict) and "method" in item and jsonrpc.is_valid_id(item.get("id")):
                key = id_key(item["id"])
                if key not in self._by_id:
                    batch.waiting.add(key)
                    self._by_id[key] = batch
        batch.running = False
        if not batch.waiting and batch.responses:
            actions.append(Reply(batch.responses))
        return actions

    def forget(self, id: RequestId) -> list[Message] | None:
        """Stop waiting for a cancelled request (its answer may never come).

        Returns the batch's responses if that was the last one it waited for.
        """
        key = id_key(id)
        batch = self._by_id.pop(key, None)
        if batch is None:
            return None
        batch.waiting.discard(key)
        return batch.responses if not batch.waiting and not batch.running else None

    def collect(self, message: Message) -> Message | list[Message] | None:
        id = message.get("id")
        if not jsonrpc.is_valid_id(id):
            return message
        key = id_key(id)
        batch = self._by_id.pop(key, None)
        if batch is None:
            return message
        batch.responses.append(message)
        batch.waiting.discard(key)
        return batch.responses if not batch.waiting else None
