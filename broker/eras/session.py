"""A modern (2026-07-28) client's session: the legacy rules, told per request.

A client whose first message is a modern request (broker/eras/modern.py,
``client_era``) gets a :class:`ModernSessionProtocol` in place of the
:class:`~broker.session.SessionProtocol` its actor made (:func:`become_modern`),
the way wsproto hands a finished handshake over to a connection. It has no
handshake: it is ``OPERATING`` from the start (broker/states.py) and attaches
to its view's servers on its first request. It reuses the legacy session's
routing, limits and in-flight table, and changes what the eras differ in:

- every request's ``_meta`` is checked (-32602, -32022); it goes to the
  server as it is, and the Upstream strips the modern keys for a legacy one;
- ``server/discover`` is answered by the broker; ``initialize`` is -32022
  (this session is modern); ``ping``, ``logging/setLevel``,
  ``resources/subscribe`` and the tasks methods, gone in 2026-07-28, are
  -32601;
- ``subscriptions/listen`` opens a stream (broker/eras/subscriptions.py):
  ``list_changed`` reaches the client only on the streams that asked, stamped
  with their id; ``notifications/message`` only while a request that asked
  for log messages (``_meta`` logLevel) is in flight, at or above its level;
- every result carries ``resultType`` (and, on lists and reads, ``ttlMs`` and
  ``cacheScope``);
- a server's question (sampling, elicitation, roots) during the client's
  call becomes an ``input_required`` answer to that call, and the client's
  retry with ``inputResponses`` hands the answer to the server and takes the
  call over (broker/eras/bridge.py, ``AnsweringServers``; here the call is
  named by the client's first id, which the server's answer still carries).
  A call whose client does not come back within ``input_timeout`` is given
  up (:meth:`ModernSessionProtocol.expire_parked`; the actor keeps the clock).
"""

from __future__ import annotations

import base64
import hashlib
import math
from typing import Any, Final

from broker import jsonrpc
from broker.eras import bridge
from broker.eras.metacache import MetaCache
from broker.eras.modern import (
    INPUT_METHODS,
    RequestMeta,
    complete_answer,
    complete_modern_answer,
    complete_result,
    discover_result,
    read_meta,
)
from broker.eras.subscriptions import (
    FLAG_OF,
    UPDATED,
    Changes,
    Listeners,
    RequestLogLevels,
    offer_of,
)
from broker.eras.tokens import is_brokers, is_ours
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LATEST_MODERN_VERSION,
    LOG_LEVEL_KEY,
    MODERN_VERSIONS,
    PROTOCOL_VERSION_KEY,
    UNSUPPORTED_PROTOCOL_VERSION,
)
from broker.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MAX_ID_LENGTH,
    METHOD_NOT_FOUND,
    JsonRpcError,
    Message,
    RequestId,
)
from broker.lifecycle import BROKER_CLIENT_CAPABILITIES
from broker.related import Related
from broker.server_requests import server_of
from broker.session import (
    DEFAULT_MAX_IN_FLIGHT,
    LIST_METHODS,
    ROUTED_METHODS,
    Action,
    Attach,
    CancelUpstream,
    CatalogSource,
    Defer,
    Forward,
    Reply,
    RespondUpstream,
    SessionProtocol,
    SetLogLevel,
)
from broker.states import SessionState, SessionTrigger
from broker.tasks import TASK_METHODS
from broker.views import initialize_for, route
from broker.wire.envelope import Answer
from broker.wire.frames import Frame

# Methods of the legacy era that 2026-07-28 removed.
GONE: Final = frozenset(
    {"ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe", "tasks/list"}
    | TASK_METHODS
)
MODERN_ROUTED: Final = ROUTED_METHODS - GONE
# What forward_fast takes: the routed methods that are neither lists nor streams.
FAST_METHODS: Final = (
    MODERN_ROUTED - set(LIST_METHODS) - {"server/discover", "subscriptions/listen"}
)
# Each of them, to its own str: a call's record holds these, not the one its
# request decoded to (a new str per request, out of the CPU's cache by the
# time the answer reads it back: 40% of that read's time, perf, 2026-11-27).
_FAST_METHOD: Final = {method: method for method in FAST_METHODS}
# The ids of the session's own requests (subscriptions for its streams), a
# tag of the session's own after it (from its key: no client guesses it).
OWN_PREFIX = "mcpbroker:subscription:"
# The session's own name for itself in the bridge (a session has one bridge).
SELF = "session"

# A request forwarded and not yet answered, as the session must know it: its
# method (which its answer's resultType and caching hints depend on), its
# server, the capabilities it declared (a server may ask in a call) and its
# params (a retry of it must repeat them). One
# record per call: written once, read and popped once. A call the fast paths
# send to a modern server (``Catalog.modern``) gets none: such a server asks
# nothing mid-call, and its answer passes as it came (or, had it come back
# legacy since, is stamped by the method the Upstream kept: ``Answer.method``).
Call = tuple[str, str, dict[str, Any], dict[str, Any]]


class ModernSessionProtocol(SessionProtocol):
    def __init__(
        self,
        view: tuple[str, ...],
        catalogs: CatalogSource,
        *,
        key: bytes,
        transparent: bool = False,
        refusal: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        input_timeout: float = math.inf,
    ) -> None:
        """``key``: the secret the session's ``requestState`` tokens are made with;
        ``input_timeout``: how long a call a server asked a question in waits
        for the client's retry (broker.inputTimeout); the rest as
        :class:`~broker.session.SessionProtocol`'s."""
        super().__init__(
            view,
            catalogs,
            transparent=transparent,
            refusal=refusal,
            max_in_flight=max_in_flight,
        )
        self.state = SessionState.OPERATING  # no handshake (broker/states.py)
        self.fast_methods = FAST_METHODS
        self.protocol_version = LATEST_MODERN_VERSION
        self.attached = False
        self.listeners: Listeners | None = None  # made on the first listen
        self.log_levels = RequestLogLevels()
        self.level_changed = False  # (lowered by an answer: take_level_change)
        self.open_calls: dict[RequestId, Call] = {}  # forwarded and unanswered, by first id
        self.aliases: dict[RequestId, RequestId] = {}  # a call's first id -> its retry's
        # A call a retry took over, by its first id: the first request's
        # progressToken (the server's progress carries it) -> the retry's own.
        self.retry_tokens: dict[RequestId, tuple[Any, Any]] = {}
        self.questions = bridge.AnsweringServers("", key, timeout=input_timeout)
        self.meta_cache = MetaCache()  # the _meta bytes its client sends on every call
        self.subscribed: dict[str, str] = {}  # URIs the streams want -> their server
        self.own_requests = 0
        tag = base64.urlsafe_b64encode(hashlib.sha256(b"own ids" + key).digest()[:9]).decode()
        self.own_prefix = f"{OWN_PREFIX}{tag}:"
        # The ids of its own requests not answered yet: their answers are
        # its own (a client's request of any other id is answered as sent).
        self.own_pending: set[str] = set()
        # Answers to servers' questions that the writer decided: the actor sends them.
        self.upstream_answers: list[tuple[str, Message]] = []

    # -- input --------------------------------------------------------------

    def forward_fast(self, message: Any) -> tuple[str, Message] | None:
        """The common case, as the legacy session's: a call (``tools/call``,
        ``prompts/get``, ``resources/read``, ``completion/complete``) with a
        good ``_meta`` and no log level, once attached; its ``_meta`` checked,
        then routed as :meth:`SessionProtocol.forward_fast` does
        (so the inherited ``take_forwards`` sends a run of them to a server
        at once). None for anything else: :meth:`receive` decides.
        tests/test_eras_fuzz.py holds the two to the same answers."""
        if not self.attached or type(message) is not dict:
            return None
        # (the method is tested once, by the inherited forward_fast: its
        # fast_methods are this session's FAST_METHODS)
        # (Any: a str once forward_fast took it, which it records)
        method: Any = message.get("method")
        params = message.get("params")
        if type(params) is not dict:
            return None
        # read_meta's checks, for a good request: anything else receive() refuses.
        meta = params.get("_meta")
        if type(meta) is not dict or meta.get(PROTOCOL_VERSION_KEY) != LATEST_MODERN_VERSION:
            return None
        capabilities = meta.get(CLIENT_CAPABILITIES_KEY)
        if type(capabilities) is not dict or LOG_LEVEL_KEY in meta:
            return None  # (a log level may change the session's: receive() says so)
        if (
            "requestState" in params
            and type(method) is str  # (any JSON value: a list is unhashable)
            and method in INPUT_METHODS
        ):
            return None  # a retry: the bridge's, or receive() says whose
        # (with its _meta, as receive() forwards it: a modern server reads it,
        # the Upstream strips it for a legacy one)
        forward = super().forward_fast(message)
        if forward is None:
            return None
        self.client_info = meta.get(CLIENT_INFO_KEY)
        if forward[0] not in self.catalogs.current.modern:
            self.open_calls[message["id"]] = (method, forward[0], capabilities, params)
        return forward

    def take_forwards(
        self, frames: list[Frame], start: int, forwards: dict[str, list[Message]]
    ) -> int:
        """:meth:`SessionProtocol.take_forwards`, each line first read with the
        ``_meta`` bytes its client sent last (:class:`~broker.eras.metacache.MetaCache`:
        not decoded or checked again); a line that does not carry them is
        decoded in full and, taken, its ``_meta`` remembered."""
        if self.state is not SessionState.OPERATING or self.refusal is not None:
            return start
        cache = self.meta_cache
        # (one snapshot a run: nothing changes it while the run is read)
        modern_servers = self.catalogs.current.modern
        try:
            for i in range(start, len(frames)):
                frame = frames[i]
                if type(frame) is not bytes:
                    return i
                # (typed: a compiled build reads a dict it knows is one;
                # decode returns one whose params is one too)
                message = cache.decode(frame)
                if message is not None:
                    # forward_fast's checks, in line, but those the read
                    # settled (a dict, its params one, the _meta known good
                    # with no log level) and the session's own (above). It is
                    # attached: a _meta is remembered only once forward_fast
                    # took its request, which it does only once attached.
                    method: Any = message.get("method")
                    id: Any = message.get("id")
                    if (
                        message.get("jsonrpc") != "2.0"
                        or type(method) is not str  # (a list is unhashable)
                        or (method := _FAST_METHOD.get(method)) is None
                        or (
                            type(id) is not int and (type(id) is not str or len(id) > MAX_ID_LENGTH)
                        )
                    ):
                        return i
                    params = cache.params  # (message["params"], as decode read it)
                    if "requestState" in params and method in INPUT_METHODS:
                        return i  # a retry: the bridge's, or receive() says whose
                    forward = self.route_fast(message, id)
                    if forward is None:
                        return i
                    self.client_info = cache.client_info
                    if forward[0] not in modern_servers:  # (a record: see Call)
                        self.open_calls[id] = (method, forward[0], cache.capabilities, params)
                else:
                    # (Any, not Message: a compiled build would check that a
                    # line such as '1' decodes to a dict)
                    try:
                        decoded: Any = jsonrpc.decode(frame)
                    except JsonRpcError:
                        return i
                    forward = self.forward_fast(decoded)
                    if forward is None:
                        return i
                    cache.remember(frame, decoded["params"]["_meta"])
                forwards.setdefault(forward[0], []).append(forward[1])
        except Exception:
            self.move(SessionTrigger.FAILED)
            raise
        return len(frames)

    def _request(self, request: Message, settled: bool) -> list[Action]:
        method = request["method"]
        if self.refusal is not None:
            raise JsonRpcError(
                self.refusal_code, f"mcpbroker: {self.refusal}", data=self.refusal_data
            )
        if method == "initialize":
            raise JsonRpcError(
                UNSUPPORTED_PROTOCOL_VERSION,
                "This session speaks 2026-07-28 (it began without initialize)",
                data={"supported": list(MODERN_VERSIONS), "requested": _requested(request)},
            )
        meta = read_meta(request)
        actions = self._attach()
        self.client_info = meta.client_info
        try:
            return [*actions, *self._answer(request, meta, settled)]
        except BaseException:
            # (the first request's refusal: the next one attaches; the
            # attachment went with the actions, and the session never
            # heard from its servers)
            if actions:
                self.attached = False
            raise

    def _answer(self, request: Message, meta: RequestMeta, settled: bool) -> list[Action]:
        method, id = request["method"], request["id"]
        if method == "server/discover":
            catalog = self.catalogs.current
            if not settled and not self.servers_settled(catalog):
                return self._defer(request)
            result = discover_result(catalog, self.view, self.transparent)
            return [Reply(jsonrpc.result_response(id, result))]
        if method in GONE:
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method} (not in 2026-07-28)")
        if method == "subscriptions/listen":
            return self._listen(request)
        if method in LIST_METHODS:
            return self._stamped(method, self._list(request, settled))
        if method in MODERN_ROUTED:
            params = request.get("params") or {}
            state = params.get("requestState") if method in INPUT_METHODS else None
            retrying = state is not None  # (a null one taken as none)
            if retrying and type(state) is not str:
                self._admit(id)
                raise JsonRpcError(INVALID_PARAMS, "requestState must be a string")
            if is_ours(state):
                return self._retry(request, meta)
            if is_brokers(state) and self._at_legacy_server(request):
                # Some other mcpbroker's (one before a restart): a legacy
                # server keeps no state, so it names nothing there. (Any
                # other string is let through: a server of "era":
                # "per-client" looks legacy in the catalog, and its modern
                # instance serves this client's retry.)
                self._admit(id)
                raise JsonRpcError(INVALID_PARAMS, bridge.UNKNOWN_STATE)
            # (a server's own, a broker's behind this one too: the server's to read)
            return self._forward_modern(request, meta, settled)
        raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}")

    def _attach(self) -> list[Action]:
        """On the first request: hear from the view's servers and the catalog.
        Capabilities are declared per request, so the servers' questions are
        let through to the session (as everything the broker can carry), which
        puts each to the client only if the call it came in declared it (the
        call's own, in ``open_calls``: the session keeps no capabilities of
        its own, ``client_capabilities`` stays empty)."""
        if self.attached:
            return []
        self.attached = True
        return [Attach(self.view, BROKER_CLIENT_CAPABILITIES)]

    def _listen(self, request: Message) -> list[Action]:
        if self.listeners is None:
            told = initialize_for(
                self.catalogs.current, self.view, self.transparent, LATEST_MODERN_VERSION
            )
            offer = offer_of(told["capabilities"])
            self.listeners = Listeners(offer)
        self._admit(request["id"])  # (an id in use, by a call or a stream: refused, id null)
        acks, changes = self.listeners.listen(request, self._subscribable)
        self.streams.add(request["id"])
        return [*(Reply(ack) for ack in acks), *self._subscriptions(changes)]

    def end_streams(self) -> list[Message]:
        """Each open ``subscriptions/listen`` stream's result, which ends it
        gracefully (the schema's ``SubscriptionsListenResult``: "for example,
        during server shutdown")."""
        if self.listeners is None:
            return []
        results, _ = self.listeners.close_all()  # (the session detaches: no unsubscribe)
        self.streams.clear()
        return results

    def _at_legacy_server(self, request: Message) -> bool:
        """Whether ``request`` goes to a server opened in the legacy era."""
        server = self._server_of(request)
        return server is not None and server not in self.catalogs.current.modern

    def _server_of(self, request: Message) -> str | None:
        """The server ``request`` goes to (None: no server of the view has
        what it names; forwarding it says why)."""
        try:
            server, _ = route(self.catalogs.current, self.view, self.transparent, request)
        except JsonRpcError:
            return None
        return server

    def _subscribable(self, uri: str) -> bool:
        """Whether a server of the view owns ``uri`` and takes subscriptions."""
        catalog = self.catalogs.current
        try:
            server = catalog.route_resource(self.view, uri)
        except JsonRpcError:
            return False
        identity = catalog.entry(server).identity
        resources = identity.capabilities.get("resources") if identity is not None else None
        return isinstance(resources, dict) and bool(resources.get("subscribe"))

    def _subscriptions(self, changes: Changes) -> list[Action]:
        """The URIs the session's streams now want, or no longer do, as the
        legacy ``resources/subscribe`` and ``unsubscribe`` the servers count
        (broker/fanout.py); their answers are the broker's own (dropped)."""
        actions: list[Action] = []
        for uri in sorted(changes.added):
            self.subscribed[uri] = server = self.catalogs.current.route_resource(self.view, uri)
            actions.append(Forward(server, self._own("resources/subscribe", uri)))
        for uri in sorted(changes.removed):
            server = self.subscribed.pop(uri)
            actions.append(Forward(server, self._own("resources/unsubscribe", uri)))
        return actions

    def _own(self, method: str, uri: str) -> Message:
        self.own_requests += 1
        id = f"{self.own_prefix}{self.own_requests}"
        self.own_pending.add(id)
        return {"jsonrpc": "2.0", "id": id, "method": method, "params": {"uri": uri}}

    def _stamped(self, method: str, actions: list[Action]) -> list[Action]:
        for action in actions:
            if isinstance(action, Reply) and isinstance(action.message, dict):
                result = action.message.get("result")
                if result is not None:
                    action.message = {**action.message, "result": complete_result(method, result)}
        return actions

    def _forward_modern(self, request: Message, meta: RequestMeta, settled: bool) -> list[Action]:
        """Forward a request, recording what its answer needs: its method (for
        resultType), its server and capabilities (a call a server may ask in),
        its log level."""
        # (with its _meta: a modern server reads it; the Upstream strips it for a legacy one)
        actions = self._forward(request, settled)
        out: list[Action] = []
        for action in actions:
            if isinstance(action, Defer):
                out.append(Defer(request))  # asked again as the client sent it
                continue
            out.append(action)
            if isinstance(action, Forward):
                id = request["id"]
                params = request.get("params") or {}
                self.open_calls[id] = (request["method"], action.server, meta.capabilities, params)
                changed = self.log_levels.open(id, meta.log_level)
                if changed is not None:
                    out.append(SetLogLevel(changed))
        return out

    def _retry(self, request: Message, meta: RequestMeta) -> list[Action]:
        """A retry carrying the broker's ``requestState``: the answers go to the
        server, and the call waiting there now answers this request (its
        progress with the retry's ``progressToken``, its log messages at the
        retry's ``logLevel``: a request of its own)."""
        capabilities = meta.capabilities
        self._admit(request["id"])
        params = request.get("params") or {}
        call = self.questions.call_of(SELF, params.get("requestState"))
        at = self.open_calls.get(call) if type(call) is int or type(call) is str else None
        server = self._server_of(request) if at is not None else None
        if (
            at is not None
            and at[0] == request["method"]  # (another method: the bridge says so)
            and server is not None  # (none: a reload removed the call's, say)
            and server != at[1]
        ):
            # (its answer would have come as this request's: another tool's)
            raise JsonRpcError(
                INVALID_PARAMS, f"requestState belongs to a call at MCP server {at[1]!r}"
            )
        if at is not None and at[0] == request["method"] and _asked(params) != _asked(at[3]):
            # (the call goes on upstream with what it first asked: its answer
            # is not one to these)
            raise JsonRpcError(
                INVALID_PARAMS,
                "a retry must repeat its call's params (but _meta, inputResponses"
                " and requestState)",
            )
        out: list[Action] = []
        for action in self.questions.retry(SELF, request, capabilities):
            if isinstance(action, bridge.SendServer):
                out.append(RespondUpstream(server_of(action.message["id"]) or "", action.message))
            elif isinstance(action, bridge.Rebind):
                first = action.call
                assert type(first) is int or type(first) is str  # a call is named by its first id
                earlier = self.aliases.get(first, first)
                self.aliases[first] = action.client_id
                method, server, _, asked = self.open_calls.get(
                    first, (request["method"], "", {}, params)
                )
                self.open_calls[first] = (method, server, capabilities, asked)
                self.inflight.add(action.client_id)
                self._take_over(first, earlier, asked, request, meta, out)
            elif isinstance(action, bridge.Finish):
                self._finish(action.call)
                out.append(Reply(self._answer_of(action.message, request["method"])))
            elif isinstance(action, bridge.AnswerClient):
                out.append(Reply(self._answer_of(action.message, request["method"])))
        return out

    def _take_over(
        self,
        first: RequestId,
        earlier: RequestId,
        asked: Message,
        retry: Message,
        meta: RequestMeta,
        out: list[Action],
    ) -> None:
        """The retry took the call over from ``earlier`` (its first request,
        or an earlier retry): the call's progress goes out with the retry's
        token (none: none goes out), and its log level is the retry's."""
        first_token = _progress_token(asked)
        if first_token is not None:
            token = _progress_token(retry.get("params") or {})
            if token is not None and jsonrpc.bad_progress_token(token) is not None:
                token = None
            self.retry_tokens[first] = (first_token, token)
        self._close_level(earlier)
        self._close_level(first)
        changed = self.log_levels.open(retry["id"], meta.log_level)
        if changed is not None:
            out.append(SetLogLevel(changed))

    def _finish(self, first: Any) -> None:
        """A call answered while its client was away ends with the retry that
        takes its answer: forgotten by its first id, and by an earlier
        retry's (the retry itself is answered as the session's own reply)."""
        assert type(first) is int or type(first) is str  # a call is named by its first id
        earlier = self.aliases.pop(first, first)
        for id in {first, earlier}:
            self.inflight.discard(id)
            self._close_level(id)
        self._forget(first)

    def _close_level(self, id: Any) -> None:
        """A request ended: if it was the one that asked for the most verbose
        log level, the servers are told the session's new one (the actor
        asks :meth:`take_level_change` after its write)."""
        if self.log_levels.close(id):
            self.level_changed = True

    def take_level_change(self) -> tuple[bool, str | None]:
        """Whether the session's log level changed since the last call, and
        the level it is now (None: no request in flight asks for one)."""
        changed, self.level_changed = self.level_changed, False
        return changed, self.log_levels.level()

    def bridge_pending(self) -> bool:
        """Whether the bridge left the actor work after a read or write: calls
        parked since the last look (their clocks to start, :meth:`arm_parked`),
        or answers to servers' questions to send
        (:meth:`take_upstream_answers`). Nearly always False: one test, where
        reading the clock on every write cost a modern session's writer a
        share of each call."""
        return bool(self.questions.unarmed) or bool(self.upstream_answers) or self.level_changed

    def arm_parked(self, now: float) -> float | None:
        """Start the clock of the calls parked since the last call (the actor
        calls it after each read and write, with its time): the earliest new
        deadline, for its timer (None: nothing new)."""
        return self.questions.arm(now)

    def expire_parked(self, now: float) -> list[Action]:
        """Give up the parked calls whose client did not come back by ``now``:
        each is cancelled upstream (by its first id) and forgotten here, then
        the server's questions are answered with errors; the client's late
        retry is told its ``requestState`` expired (broker/eras/bridge.py)."""
        cancels: list[Action] = []
        answers: list[Action] = []
        for action in self.questions.expire(now):
            if isinstance(action, bridge.CancelCall):
                first = action.call
                assert type(first) is int or type(first) is str  # (named by its first id)
                current = self.aliases.pop(first, first)
                for id in {first, current}:
                    self.inflight.discard(id)
                    self._close_level(id)
                    if self.calls is not None:
                        self.calls.cancelled(id)
                self._forget(first)
                reason = "mcpbroker: the client did not come back with its input in time"
                cancels.append(CancelUpstream({"requestId": first, "reason": reason}))
            elif isinstance(action, bridge.SendServer):
                server = server_of(action.message["id"]) or ""
                answers.append(RespondUpstream(server, action.message))
        return cancels + answers  # (cancelled first: a late answer is then dropped upstream)

    def _answer_of(self, message: Message, method: str) -> Message:
        if "result" in message:
            return {**message, "result": complete_result(method, message["result"])}
        return message

    def _notification(self, message: Message) -> list[Action]:
        if message["method"] != "notifications/cancelled":
            return []  # initialized and roots/list_changed are not in 2026-07-28
        params = message.get("params") or {}
        request_id = params.get("requestId")
        if not jsonrpc.is_valid_id(request_id):
            return []  # names no request: ignored, as the legacy session does
        ended = self.listeners.cancel(request_id) if self.listeners is not None else None
        if ended is not None:  # a stream: the broker's own (its URIs may be let go)
            self.streams.discard(request_id)
            return self._subscriptions(ended)
        if self.aliases.get(request_id, request_id) != request_id:
            # A call's first request, answered input_required, whose call a
            # retry carries now: that request is complete, and a cancel of it
            # (sent as its answer crossed) is ignored, as of any answered one.
            return []
        first = self._first(request_id)
        cancel = {**params, "requestId": first}
        actions = super()._notification({**message, "params": cancel})
        self.inflight.discard(request_id)
        for action in self.questions.cancelled(first):
            if isinstance(action, bridge.SendServer):
                self.upstream_answers.append(
                    (server_of(action.message["id"]) or "", action.message)
                )
        self._forget(first)
        return actions

    # -- output -------------------------------------------------------------

    def take_outgoing(
        self,
        delivery: list[Message | list[Message] | Answer | Related],
        out: list[Message | list[Message] | Answer | Related],
    ) -> None:
        if self.state in (SessionState.ERROR, SessionState.CLOSED):
            self._refuse()
        try:
            # (Any: a compiled build checks no item's type; a delivery holds
            # what the upstream made, and anything else is passed over below.)
            items: list[Any] = delivery
            for message in items:
                if type(message) is Related:  # (a stream per request: not in this era yet)
                    message = message.message
                method: str | None = None
                if type(message) is Answer:
                    if self._answer_fast(message):
                        out.append(message)
                        continue
                    method = message.method
                    message = message.read()
                if isinstance(message, dict):
                    out.extend(self._outgoing_modern(message, method))
        except Exception:
            self.move(SessionTrigger.FAILED)
            raise

    def _answer_fast(self, answer: Answer) -> bool:
        """The common case of :meth:`_outgoing_modern`, without parsing: the
        answer to a request passed on, while no call waits for a retry (the
        bridge's) and none was taken over by one; completed by
        :func:`~broker.eras.modern.complete_answer`, or if a 2026-07-28
        server wrote it (``Answer.modern``) by
        :func:`~broker.eras.modern.complete_modern_answer` (as it is when it
        carries the era's keys). False: read it."""
        if self.aliases or self.questions.parked:  # (a dict: no __len__ call per answer)
            return False
        id = answer.id
        # (none at all while every call goes to a modern server: no lookup)
        call = self.open_calls.get(id) if self.open_calls else None
        if call is not None:
            # (an answer the rules cannot complete unread: read)
            if answer.modern:
                if complete_modern_answer(answer, call[0]) is None:
                    return False
            elif complete_answer(answer, call[0]) is None:
                return False
            del self.open_calls[id]  # (what _forget does, in fewer steps)
        elif answer.modern:
            # No record: a call the fast path sent to a modern server; the
            # Upstream kept its method.
            if complete_modern_answer(answer, answer.method) is None:
                return False
        else:
            # No record: a call routed to a server that was modern then, and is
            # legacy now (it came back so); the Upstream kept its method.
            method = answer.method
            if method is None or complete_answer(answer, method) is None:
                return False
        self.inflight.discard(id)
        if self.log_levels.ranks:
            self._close_level(id)
        if self.calls is not None:
            self.calls.answered(id, answer)
        return True

    def take_upstream_answers(self) -> list[tuple[str, Message]]:
        answers, self.upstream_answers = self.upstream_answers, []
        return answers

    def _outgoing_modern(self, message: Message, method: str | None = None) -> list[Message]:
        """What the client reads of a message bound for it. An answer gets
        ``resultType`` (and on a read the caching hints) where it lacks them
        (:func:`~broker.eras.modern.complete_result`, which keeps what the
        server said), whichever era's server wrote it (the schema has a
        2026-07-28 server include them; one that does not is completed all
        the same, docs/eras.md)."""
        if "method" in message:
            if "id" in message:
                return self._server_asks(message)
            return self._notify(message)
        id = message.get("id")
        if type(id) is not int and type(id) is not str:
            return [message]
        if self.own_pending and id in self.own_pending:
            self.own_pending.discard(id)
            return []  # the answer to a subscribe of the session's streams
        call = self.open_calls.get(id)
        if (
            call is not None
            and call[0] in INPUT_METHODS
            and self.questions.call_answered(id, message)
        ):
            return []  # the client is away: kept for its retry
        current = self.aliases.pop(id, id)
        self.inflight.discard(id)
        self.inflight.discard(current)
        if call is not None:
            method = call[0]  # (else the Upstream's, given: a call with no record)
        self._forget(id)
        self._close_level(current)
        if current != id:
            message = {**message, "id": current}
        if self.calls is not None:
            self.calls.answered(current, message)
        return [self._answer_of(message, method or "")]

    def _server_asks(self, request: Message) -> list[Message]:
        """A server's question: on the one call this session has at that server,
        an input_required answer to it; else an error back to the server."""
        id = request.get("id")
        server = server_of(id)
        waiting = [
            first
            for first, (method, at, _, _) in self.open_calls.items()
            if at == server and method in INPUT_METHODS
        ]
        if server is None or len(waiting) != 1:
            error = jsonrpc.error_response(
                id if jsonrpc.is_valid_id(id) else None,
                INTERNAL_ERROR,
                "mcpbroker: a 2026-07-28 client is asked only during its one call at this server",
            )
            self.upstream_answers.append((server or "", error))
            return []
        (first,) = waiting
        current = self.aliases.get(first, first)
        method, _, capabilities, _ = self.open_calls[first]
        call = (first, current, method)
        out: list[Message] = []
        for action in self.questions.server_asked(SELF, capabilities, call, request):
            if isinstance(action, bridge.AnswerClient):
                if current != first:
                    self.inflight.discard(current)
                message = self._answer_of(action.message, call[2])
                if self.calls is not None:  # (the request is answered; the call goes on)
                    self.calls.answered(current, message)
                out.append(message)
            elif isinstance(action, bridge.SendServer):
                self.upstream_answers.append((server, action.message))
        return out

    def _notify(self, message: Message) -> list[Message]:
        method = message["method"]
        if method == "notifications/progress" and self.retry_tokens:
            return self._retry_progress(message)
        if method == "notifications/message":
            return [message] if self.log_levels.admits(message) else []
        if method == "notifications/elicitation/complete":
            return []  # not in 2026-07-28: the client learns the outcome by retrying
        if method in FLAG_OF or method == UPDATED:
            return self.listeners.route(message) if self.listeners is not None else []
        return [message]

    def _retry_progress(self, message: Message) -> list[Message]:
        """Progress of a call a retry took over carries the retry's token
        (the first request, answered, is no active request); dropped if the
        retry sent none."""
        params = message.get("params")
        token = params.get("progressToken") if isinstance(params, dict) else None
        for first_token, retry_token in self.retry_tokens.values():
            if token == first_token and type(token) is type(first_token):
                if retry_token is None:
                    return []
                assert isinstance(params, dict)
                return [{**message, "params": {**params, "progressToken": retry_token}}]
        return [message]

    def _first(self, id: Any) -> Any:
        """The first id of the call a retry took over (the id itself otherwise)."""
        return next((first for first, retry in self.aliases.items() if retry == id), id)

    def _forget(self, first: Any) -> None:
        if type(first) is not int and type(first) is not str:
            return
        self.open_calls.pop(first, None)
        self._close_level(first)
        if self.retry_tokens:
            self.retry_tokens.pop(first, None)


def _progress_token(params: Message) -> Any:
    meta = params.get("_meta")
    return meta.get("progressToken") if isinstance(meta, dict) else None


def _asked(params: Message) -> Message:
    """What a call asks: its params but those a retry adds or may change."""
    return {k: v for k, v in params.items() if k not in _RETRY_KEYS}


_RETRY_KEYS: Final = frozenset({"_meta", "inputResponses", "requestState"})


def become_modern(
    legacy: SessionProtocol, key: bytes, input_timeout: float = math.inf
) -> ModernSessionProtocol:
    """The modern protocol that takes over a session whose first message was modern."""
    modern = ModernSessionProtocol(
        legacy.view,
        legacy.catalogs,
        transparent=legacy.transparent,
        refusal=legacy.refusal,
        max_in_flight=legacy.max_in_flight,
        key=key,
        input_timeout=input_timeout,
    )
    modern.refusal_code = legacy.refusal_code  # (a stopping daemon's refusal is -32000)
    modern.refusal_data = legacy.refusal_data
    modern.calls = legacy.calls  # (metrics and the audit log count its requests too)
    return modern


def _requested(request: Message) -> str:
    params = request.get("params")
    version = params.get("protocolVersion") if isinstance(params, dict) else None
    return version if isinstance(version, str) else ""
