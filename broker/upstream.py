"""One upstream server's side of the broker, sans-I/O: the rules of one
server connection (its lifecycle, its requests in flight, what it sends).

:class:`UpstreamProtocol` holds the handshake state and the id map of one
server connection. The Upstream actor feeds it what clients send and what the
server writes, and carries out the actions it returns (broker/upstream_actions.py:
write to the server, deliver to a session, a list changed, ready, ...).

**Its state** (:attr:`UpstreamProtocol.state`) is the server connection's
one lifecycle (broker/states.py): the actor moves it as the process starts
and ends (:meth:`UpstreamProtocol.move`), the protocol as the handshake and
the warm-up complete; the actor, the Registry and the catalog all read it.

**The gate.** A server that sends requests to clients is given requests of
one session at a time (broker/turns.py; docs/rules/server-requests.md), so
that the session each such request belongs to is known, never guessed.
While the gate is off (every server until it first asks a client something,
unless configured otherwise) nothing here changes on the hot path but one
test. Requests whose turn came are written from :attr:`UpstreamProtocol.released`,
which the actor empties after each thing it hands the protocol.

**The era** is decided by the opening (:attr:`UpstreamProtocol.probe`,
broker/eras/upstream.py ``EraProbe``): ``server/discover`` or ``initialize``,
and the verdicts on their answers. A modern server (2026-07-28) gets
:attr:`UpstreamProtocol.modern` and its modern side,
:attr:`UpstreamProtocol.modern_server` (``ModernServer``, same module:
stamping, the listen, the bridge's rounds); at a legacy server that is None,
and the legacy rules are all there is. docs/eras.md says it all.

**Warm-up.** An instance of a per-session server or a pool (``warm_up``) is
ready only once it offers the tools the catalog shows (``expected_tools``),
as a ``tools/list`` of the broker's own says (broker/warmup.py), or once
the actor gives up waiting (:meth:`UpstreamProtocol.warm_up_expired`).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from typing import Any

from broker import jsonrpc
from broker.eras.bridge import (
    UNKNOWN_STATE,
    SendServer,
    ends_round,
    legacy_params,
    refuses_back_channel,
)
from broker.eras.modern import INPUT_METHODS
from broker.eras.probe import Legacy, Modern
from broker.eras.upstream import (
    HANDSHAKE_ID,
    PROBE_ID,
    EraProbe,
    EraRefusals,
    ModernServer,
    may_refuse_era,
)
from broker.fanout import Fanout, is_log_message
from broker.jsonrpc import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    LIMIT_REACHED,
    REQUEST_TIMEOUT,
    JsonRpcError,
    Kind,
    Message,
    RequestId,
)
from broker.lifecycle import HandshakeError, ServerIdentity, read_initialize_result
from broker.requestmap import (
    CreatesTask,
    InFlight,
    InputRound,
    Note,
    RequestMap,
    Subscribing,
    TaskList,
    TaskQuery,
)
from broker.server_requests import CAPABILITY_OF, ClientIds, Route, ServerRequests
from broker.states import ServerState, ServerTrigger, next_server_state
from broker.tasks import TASK_METHODS, TaskTable
from broker.timeouts import Deadlines, TimeoutPolicy
from broker.turns import DEFAULT_LIMIT, DEFAULT_MAX_BYTES, Turns
from broker.upstream_actions import (
    Action,
    Broadcast,
    Deliver,
    ListChanged,
    Ready,
    SendUpstream,
    Speak,
    Warn,
)
from broker.warmup import WarmUp
from broker.wire.envelope import HELD, Answer, answer_id, split_answer
from broker.wire.frames import LinkFrame, Oversize

DEFAULT_MAX_IN_FLIGHT = 16384
LIST_CHANGED = frozenset(
    {
        "notifications/tools/list_changed",
        "notifications/prompts/list_changed",
        "notifications/resources/list_changed",
    }
)


# requestStates a pool's instance remembers (past it, the oldest is forgotten:
# its retry then goes by load, as before)
MAX_MINTED = 4096


class UpstreamProtocol:
    def __init__(
        self,
        name: str,
        timeouts: TimeoutPolicy | None = None,
        numbering: tuple[int, int] | ClientIds = (1, 1),
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        *,
        server_requests: str = "auto",
        max_waiting: int = DEFAULT_LIMIT,
        max_waiting_bytes: int = DEFAULT_MAX_BYTES,
        warm_up: bool = False,
        expected_tools: frozenset[str] | None = None,
        state: ServerState = ServerState.INITIALIZING,
        era: str = "legacy",
        process: bool = True,
        unprobed: str | None = None,
    ) -> None:
        self.name = name
        # The server is a child process (stdio), not reached by URL: one that
        # ends while probed may have ended because of the probe (restarted).
        self.process = process
        # "auto", "legacy" or "modern" (broker/config.py); what this connection
        # speaks is decided by its opening (:meth:`start`, :attr:`probe`).
        self.era = era
        # Why a server of "era": "auto" is no longer probed, but opened with
        # initialize (:meth:`restarted`): None while it is probed.
        self.unprobed = unprobed
        self.probe = EraProbe(era if unprobed is None else "legacy")
        # A modern server's refusals of the era on a call (kept across restarts).
        self.refusals = EraRefusals(name, era)
        self.back_channel_warned = False  # (_back_channel_refused)
        self.log_message_warned = False  # (_invalid_log_message)
        # A pool's instance (PooledServer): the requestStates (their hashes)
        # of the input_required answers it gave modern clients, the latest
        # MAX_MINTED, so that a retry goes to the one instance that knows
        # its state. None: not kept (not a pool's: no lookup per answer).
        self.minted: dict[int, None] | None = None
        # Whether it speaks the modern era (decided by the probe), and its
        # modern side then (None: a legacy server).
        self.modern = False
        self.modern_server: ModernServer | None = None
        # (one sequence for its every process: restarted, this protocol's is
        # the next one's, and a client's late answer to the one that went
        # away never passes for an answer to the new one)
        self.numbering = ClientIds(name, numbering) if isinstance(numbering, tuple) else numbering
        self.max_in_flight = max_in_flight
        self.warm_up = warm_up
        self.warming = WarmUp(expected_tools)  # (its tools: warm-up instances, once listed)
        # What calls are checked against: its tools, if it was expected to offer some.
        self.checked: frozenset[str] | None = None
        self.turns = Turns(server_requests, max_waiting, max_waiting_bytes)
        self.released: list[Message] = []  # requests whose turn came, to write now
        # The server connection's one state (broker/states.py), kept across its
        # processes (restarted). A protocol made without one is for a server
        # whose initialize is about to be sent (INITIALIZING).
        self.state = state
        self.identity: ServerIdentity | None = None
        self.requests = RequestMap(name, max_in_flight)
        self.deadlines = Deadlines(timeouts or TimeoutPolicy())
        self.server_requests = ServerRequests(name, self.numbering)
        self.fanout = Fanout()
        self.last_error: str | None = None  # why the last process went away
        self.tasks = TaskTable(name)
        self._own_ids = itertools.count(1)
        # Sessions using this server -> their capabilities.
        self.sessions: dict[Hashable, dict[str, Any]] = {}
        # Those of them that are modern clients (their requests carry their own
        # _meta; a modern server's input_required goes to them as it is).
        self.modern_sessions: set[Hashable] = set()
        # The legacy ones' clientInfo (their initialize's), which a modern
        # server is told on each of their requests.
        self.client_infos: dict[Hashable, Any] = {}

    def restarted(self) -> UpstreamProtocol:
        """A fresh protocol for a new server process, keeping the attached sessions.

        A process that ended before its handshake was done, once it had been
        sent the ``server/discover`` probe (answered, timed out or not), is
        not probed again: some legacy servers exit on any first request but
        ``initialize``, and probing each new process would make a crash loop
        of a working server. (A ``url`` server that could not be reached is
        no such sign.) Its next processes are opened with ``initialize``, and
        still opened modern if they refuse it as a modern-only server does."""
        unprobed = self.unprobed
        if (
            unprobed is None
            and self.process
            and self.era == "auto"
            and self.probe.sent
            and self.identity is None
        ):
            unprobed = (
                f"it ended before its handshake once asked server/discover ({self.last_error})"
            )
        fresh = UpstreamProtocol(
            self.name,
            self.deadlines.policy,
            self.numbering,
            self.max_in_flight,
            warm_up=self.warm_up,
            expected_tools=self.expected_tools,
            state=self.state,
            era=self.era,
            process=self.process,
            unprobed=unprobed,
        )
        fresh.turns = self.turns.renewed()
        fresh.sessions = self.sessions
        fresh.modern_sessions = self.modern_sessions
        fresh.client_infos = self.client_infos
        fresh.fanout = self.fanout  # subscriptions and log level are renewed on ready
        fresh.tasks = self.tasks
        fresh.last_error = self.last_error
        fresh.refusals = self.refusals
        if self.minted is not None:  # (a new process knows none of the old one's)
            fresh.minted = {}
        return fresh

    def mints(self, state: Any) -> bool:
        """Whether this instance gave a modern client ``requestState`` (a pool's)."""
        return self.minted is not None and type(state) is str and hash(state) in self.minted

    def _minted(self, message: Message) -> None:
        """Keep the ``requestState`` of an ``input_required`` answer (a pool's instance)."""
        result = message.get("result")
        if type(result) is not dict or result.get("resultType") != "input_required":
            return
        state = result.get("requestState")
        if type(state) is str and self.minted is not None:
            if len(self.minted) >= MAX_MINTED:
                del self.minted[next(iter(self.minted))]
            self.minted[hash(state)] = None

    @property
    def expected_tools(self) -> frozenset[str] | None:
        """The tools the catalog shows, which a warm-up instance must offer."""
        return self.warming.expected

    @expected_tools.setter
    def expected_tools(self, tools: frozenset[str] | None) -> None:
        self.warming.expected = tools

    @property
    def tools(self) -> frozenset[str] | None:
        """The tools this instance offers (warm-up instances, once listed)."""
        return self.warming.tools

    def move(self, trigger: ServerTrigger) -> ServerState:
        """Move the server connection's state (raises LifecycleError if illegal)."""
        self.state = next_server_state(self.state, trigger)
        return self.state

    # -- the handshake ------------------------------------------------------

    def reconfigure(
        self,
        timeouts: TimeoutPolicy,
        max_in_flight: int,
        max_waiting: int,
        max_waiting_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        """New limits and timeouts (a reload), for what comes next."""
        self.deadlines.set_policy(timeouts)
        self.requests.limit = max_in_flight
        self.turns.limit = max_waiting
        self.turns.max_bytes = max_waiting_bytes

    def start(self) -> Message:
        """The first message to write to a freshly started server: the
        ``server/discover`` probe unless the server is configured legacy
        (docs/eras.md), ``initialize`` then; :attr:`speaking` says its era."""
        return self.probe.opening()

    @property
    def speaking(self) -> str | None:
        """The era the connection's requests go in now: a modern protocol
        version, or None (legacy). Each change comes as a ``Speak`` action."""
        return self.probe.speaking

    @property
    def probing(self) -> bool:
        """The era is not decided yet: the probe awaits its answer."""
        return self.probe.probes > 0 and self.state is ServerState.INITIALIZING

    def probe_expired(self) -> list[Action]:
        """The actor's clock ran out on the probe: a server of ``"era": "auto"``
        is opened with ``initialize`` (a forced modern one waits for the
        startup timeout, the only verdict left)."""
        return self.probe.expired() if self.probing else []

    def probe_failed(self, request: RequestId, detail: str) -> list[Action] | None:
        """The link could not get an answer to ``request`` (HTTP: an error
        status with no JSON-RPC error, such as a legacy server's 400 for a
        POST without a session): if it was the probe, the server is legacy
        (docs/eras.md); None: not the probe."""
        if request != PROBE_ID or not self.probing:
            return None
        return self.probe.follow(Legacy(f"server/discover failed: {detail}"))

    def _probed(self, message: Message) -> list[Action]:
        """The server answered the probe: open the connection in its era."""
        verdict = self.probe.answered(message)
        if not isinstance(verdict, Modern):
            return self.probe.follow(verdict)
        identity = verdict.identity
        self.modern = True
        self.modern_server = ModernServer(
            identity,
            self.name,
            self.server_requests.ids,
            sessions=self.sessions,
            modern_sessions=self.modern_sessions,
            client_infos=self.client_infos,
            fanout=self.fanout,
            requests=self.requests,
        )
        # No notifications/initialized; the subscriptions are the listen's
        # filter, and log levels go on each request (docs/eras.md).
        return [*self.probe.modern(identity.protocol_version), *self._opened(identity)]

    def _opened(self, identity: ServerIdentity) -> list[Action]:
        """The handshake is done, in either era: ready, or warming up first."""
        self.identity = identity
        warming = self.warm_up and "tools" in identity.capabilities
        self.move(ServerTrigger.WARM_UP if warming else ServerTrigger.HANDSHAKE_DONE)
        actions: list[Action] = []
        if self.modern_server is not None:
            actions += self.modern_server.listen_actions()
        else:
            actions.append(SendUpstream(jsonrpc.notification("notifications/initialized")))
            actions += self.renewed()  # a restarted server: what its sessions asked of the last
        if warming:
            return [*actions, self._list_tools()]
        return [*actions, Ready(identity)]

    # -- from clients -------------------------------------------------------

    def client_request(self, session: Hashable, request: Message, now: float = 0.0) -> list[Action]:
        """A client's request: forwarded rewritten, or answered here (raises JsonRpcError)."""
        if self.state is not ServerState.READY:
            raise self._not_running(request["id"])
        if self.forward_fast(session, request, now):
            return [SendUpstream(request)]
        method, params = request["method"], request.get("params")
        if not isinstance(params, dict):
            params = {}
        note: Note | None = None
        if method == "tools/call":
            self.warming.check(self.name, request, params.get("name"))
            if isinstance(params.get("task"), dict):
                note = CreatesTask()
        elif method in ("resources/subscribe", "resources/unsubscribe"):
            uri = _uri_of(request)
            answered = self._subscription(session, request, uri)
            if answered is not None:
                return answered
            note = Subscribing(uri)  # (only a first subscribe goes upstream)
        elif method in TASK_METHODS:
            self.tasks.check(session, params.get("taskId"))
            note = TaskQuery()
        elif method == "tasks/list":
            note = TaskList()
        modern = self.modern_server
        if note is None and modern is not None and modern.asks_legacy(session, method):
            note = InputRound(_as_sent(request))
        try:
            upstream_id = self._open(session, request, now)
        except JsonRpcError:
            if isinstance(note, Subscribing):  # (refused before it went: no subscriber)
                self.fanout.refused(session, note.uri)  # (never accepted: nothing to drop)
            raise
        if note is not None:
            self.requests.note(upstream_id, note)
        if self.turns.on:
            return self._take_turn(session, request, upstream_id)
        return [SendUpstream(request)]

    def _not_running(self, id: Any) -> JsonRpcError:
        """The error for a request to a server that is down: retryable if it is
        being restarted (docs/rules/restarts.md)."""
        retryable = self.state not in (ServerState.FAILED, ServerState.STOPPED)
        message = f"MCP server {self.name!r} is not running"
        if self.last_error:
            message += f" (it {self.last_error}; {'restarting' if retryable else 'failed'})"
        data = {"server": self.name, "retryable": retryable}
        return JsonRpcError(CONNECTION_CLOSED, message, data=data, id=id)

    def ping(self) -> Message:
        """A ``ping`` of the broker's own (liveness, broker/recovery.py): its
        answer, like any message from the server, is a sign of life, and is
        dropped (its id, a string, is never a client's upstream id). A modern
        server has no ``ping``: it is asked ``server/discover``, which every
        modern server answers."""
        if self.modern:
            return self._own_request("server/discover", {})
        return self._own_request("ping", {})

    def _take_turn(self, session: Hashable, request: Message, upstream_id: int) -> list[Action]:
        """The gate is on: the request goes now (with whatever must precede it)
        or waits for its session's turn."""
        turns = self.turns
        if turns.admit(session, len(self.requests) - len(turns.held) - 1):
            actions: list[Action] = [SendUpstream(m) for m in turns.take(session)]
            actions.append(SendUpstream(request))
            return actions
        size = _held_size(request)
        if turns.full(size):
            entry = self.requests.forget(upstream_id)
            self.deadlines.discard(upstream_id)
            raise JsonRpcError(
                LIMIT_REACHED,
                f"MCP server {self.name!r} serves one client at a time (it sends requests to "
                f"clients) and {len(turns.held)} requests ({turns.held_bytes} bytes) already "
                "wait for their turn (broker.maxWaitingRequests, broker.maxQueuedBytes)",
                data={"server": self.name},
                # (the request's own id: it carries the upstream id by now)
                id=None if entry is None else entry.client_id,
            )
        turns.hold(upstream_id, session, request, size)
        return []

    def _settle(self) -> None:
        """Requests were answered or forgotten while the gate is on: if the
        server is idle, the next session's turn comes (see :attr:`released`)."""
        turns = self.turns
        out = turns.settle(len(self.requests) - len(turns.held))
        if out:
            self.released += out

    def take_released(self) -> list[Message]:
        """The requests whose turn came (and what precedes them), to write now."""
        out, self.released = self.released, []
        return out

    def forward_fast(self, session: Hashable, request: Message, now: float = 0.0) -> bool:
        """The common case of :meth:`client_request` (which starts with it): a
        request that needs no note (not a subscription or a task) but the
        ``InputRound`` of a legacy client's call at a modern server, rewritten
        in place for the server. False: not such a request (nothing changed), or
        the server is not ready. Raises what :meth:`client_request` would (a
        reused id). The actor calls it first to skip building actions.
        """
        # (The gate, and the tools a warmed-up instance checks calls against,
        # are the general path's.)
        if self.state is not ServerState.READY or self.turns.on or self.checked is not None:
            return False
        method = request["method"]
        if method == "tools/call":
            params = request.get("params")
            if type(params) is dict and "task" in params and isinstance(params["task"], dict):
                return False
        elif method in NOTED_METHODS:
            return False
        if self.modern:
            # (a modern client's request is tested once: its session is in the set)
            legacy_client = session not in self.modern_sessions
            if legacy_client and method in INPUT_METHODS:
                # (_asks_legacy: its answer may be input_required, for the broker
                # to put to the client)
                note = InputRound(_as_sent(request))
                self.requests.note(self._open(session, request, now, True), note)
                return True
            self._open(session, request, now, legacy_client)
            return True
        self._open(session, request, now)
        return True

    def take_requests(
        self, session: Hashable, requests: list[Message], start: int, out: list[Message], now: float
    ) -> int:
        """:meth:`forward_fast` for a run of a session's requests: from
        ``requests[start]`` on, each it takes is appended, rewritten, to ``out``,
        up to the first it does not take or that raises. Returns that request's
        index (``len(requests)``: none); the caller hands it to
        :meth:`client_request`, which answers or raises."""
        for i in range(start, len(requests)):
            request = requests[i]
            try:
                if not self.forward_fast(session, request, now):
                    return i
            except Exception:  # the same again from client_request, answered there
                return i
            out.append(request)
        return len(requests)

    def _open(
        self, session: Hashable, request: Message, now: float, legacy_client: bool | None = None
    ) -> int:
        """Record a request to forward (rewriting it in place); its upstream id.
        ``legacy_client``: whether ``session`` is a legacy client's, if the
        caller knows (a modern server's request is stamped for one)."""
        if self.modern_server is None and self.modern_sessions and session in self.modern_sessions:
            self._check_state(request)  # (before the open rewrites its id)
        upstream_id = self.requests.open(session, request)
        self.deadlines.add(upstream_id, now)
        if self.modern_server is not None:
            if legacy_client is None:
                legacy_client = session not in self.modern_sessions
            if legacy_client:  # (a modern client's carries its own)
                self.modern_server.stamp(request, session)
        else:  # a legacy server gets no modern keys, whichever client sent them
            params = request.get("params")
            if type(params) is dict and "_meta" in params:
                stripped = legacy_params(params)
                if stripped is not None:
                    request["params"] = stripped
        return upstream_id

    @staticmethod
    def _check_state(request: Message) -> None:
        """A modern client's request to a legacy server: one carrying a
        ``requestState`` is a retry with a state the broker did not give it
        (its own are the session's to read); a legacy server keeps none, so
        it names nothing there, and run as a new call it would do the work
        again: refused."""
        params = request.get("params")
        if type(params) is dict and "requestState" in params:
            raise JsonRpcError(INVALID_PARAMS, UNKNOWN_STATE, id=request["id"])

    def _subscription(self, session: Hashable, request: Message, uri: str) -> list[Action] | None:
        """Reference-counted (un)subscribe: None to forward the client's own request."""
        done = Deliver(session, jsonrpc.result_response(request["id"], {}))
        if self.modern_server is not None:  # (it has no resources/subscribe: the listen's filter)
            return [*self.modern_server.subscribe(session, request, uri), done]
        if request["method"] == "resources/subscribe":
            return None if self.fanout.subscribe(session, uri) else [done]
        if self.fanout.unsubscribe(session, uri):
            return [SendUpstream(self._own_request("resources/unsubscribe", {"uri": uri})), done]
        return [done]

    def listen_failed(
        self, request: RequestId, detail: str, now: float = 0.0
    ) -> list[Action] | None:
        """The link lost the answer to ``request`` (HTTP: its stream broke):
        if it was a modern server's listen, what to do (listen again if it
        had worked, and fetch the lists again); None: not the listen."""
        if self.modern_server is None or not self.modern_server.is_listen(request):
            return None
        return self.modern_server.listen_failed(detail, now)

    def client_log_level(self, session: Hashable, level: str | None) -> list[Action]:
        """A session set its log level (None: it wants none now); ask the
        server for the most verbose one wanted."""
        if self.modern_server is not None:  # (a modern server is told it in each request's stamp)
            self.modern_server.forget_stamp(session)
        if level is None:
            return self._log_level_actions(self.fanout.clear_level(session))
        return self._log_level_actions(self.fanout.set_level(session, level))

    def _log_level_actions(self, level: str | None) -> list[Action]:
        has_logging = self.identity is not None and "logging" in self.identity.capabilities
        if level is None or not has_logging or self.state not in _UP or self.modern:
            return []
        return [SendUpstream(self._own_request("logging/setLevel", {"level": level}))]

    def _own_request(self, method: str, params: dict[str, Any]) -> Message:
        """A request of the broker's own; its answer matches no client and is dropped."""
        id = f"mcpbroker-{next(self._own_ids)}"
        request = {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
        if self.modern_server is not None:
            self.modern_server.stamp(request, None)
        return request

    def attach(
        self,
        session: Hashable,
        capabilities: dict[str, Any],
        modern: bool = False,
        client_info: Any = None,
    ) -> None:
        """A session uses this server from now on (it declared these
        capabilities, and named itself ``client_info``; ``modern``: a
        2026-07-28 client, whose requests say both)."""
        self.sessions[session] = capabilities
        if modern:
            self.modern_sessions.add(session)
        elif client_info is not None:
            self.client_infos[session] = client_info
        else:  # (attached again, naming none: not the last name it gave)
            self.client_infos.pop(session, None)
        if self.modern_server is not None:
            self.modern_server.forget_stamp(session)

    def client_response(self, session: Hashable, response: Message) -> Message | None:
        """A client's answer to a request this server sent it, in the server's terms."""
        return self.server_requests.answer(session, response)

    def client_answer(self, session: Hashable, response: Message, now: float = 0.0) -> list[Action]:
        """A client's answer to a request the broker sent it for this server:
        the server's own request (legacy), or a question of a modern server's
        ``input_required`` (which, once all are answered, sends the call again)."""
        if self.modern_server is not None:
            asked = self.modern_server.client_answered(session, response)
            if asked is not None:
                return self._bridged(asked, now)
        answer = self.server_requests.answer(session, response)
        return [] if answer is None else [SendUpstream(answer)]

    def withdraw(self, session: Hashable, params: dict[str, Any]) -> list[Action]:
        """A client cancelled a call that waits for its own answers (between
        a modern server's rounds): the questions still open are withdrawn."""
        if self.modern_server is None:
            return []
        return self._bridged(self.modern_server.withdraw(session, params.get("requestId")), 0.0)

    def _bridged(self, bridged: list[Deliver | SendServer], now: float) -> list[Action]:
        """A modern server's questions to legacy clients, carried out: what
        goes to clients, and calls sent again (recorded anew, with their round)."""
        out: list[Action] = []
        for action in bridged:
            if isinstance(action, SendServer):
                out += self._ask_again(action, now)
            else:
                out.append(action)
        return out

    def _ask_again(self, send: SendServer, now: float) -> list[Action]:
        request, session = send.message, send.session
        if self.state is not ServerState.READY:
            return [Deliver(session, self._not_running(request["id"]).to_response())]
        try:
            upstream_id = self._open(session, request, now)
        except JsonRpcError as exc:
            exc.id = request["id"]
            return [Deliver(session, exc.to_response())]
        self.requests.note(upstream_id, send.note)
        return [SendUpstream(request)]

    def client_notification(self, session: Hashable, message: Message) -> Message | None:
        """A client's notification this server should hear (roots changed)."""
        if message["method"] != "notifications/roots/list_changed" or session not in self.sessions:
            return None
        if self.turns.on and not self.turns.has_roots_of(session):
            return None  # the server has another client's roots: it asks this one on its turn
        return message

    def expire(self, now: float) -> list[Action]:
        """Requests that outlived their timeout: cancel upstream, answer with an error."""
        actions: list[Action] = []
        for upstream_id in self.deadlines.expired(now):
            entry = self.requests.forget(upstream_id)
            if entry is None:
                continue
            timeout = self.deadlines.policy.timeout
            if self.turns.drop(upstream_id):  # (a held request never reached the server)
                why = (
                    f"waited {timeout:g} s for its turn and was never sent: the server serves "
                    "one client at a time (serverRequests) and another client's request was "
                    "in progress"
                )
            else:
                actions.append(SendUpstream(_cancelled(upstream_id, "timed out")))
                why = f"no answer or progress for {timeout:g} s"
            error = jsonrpc.error_response(
                entry.client_id,
                REQUEST_TIMEOUT,
                f"Request {entry.method!r} to MCP server {self.name!r} timed out ({why})",
                data={"server": self.name},
            )
            actions.append(Deliver(entry.session, error))
        if self.turns.on:
            self._settle()
        server = self.modern_server
        if server is not None and server.asking:  # calls waiting for their clients' answers
            actions += self._bridged(server.bridged(server.asking.expire(now)), now)
        # The server's own requests its clients did not answer in time.
        policy = self.deadlines.policy
        for expired in self.server_requests.expire(now, policy.timeout) if policy.enabled else ():
            actions.append(SendUpstream(expired.error))
            actions.append(Deliver(expired.session, expired.cancel))
            actions.append(Warn("server.request_unanswered", expired.error["error"]["message"]))
        return actions

    def next_deadline(self) -> float | None:
        """When :meth:`expire` has something to do next (None: nothing waits):
        a request's deadline, a call's whose clients were asked its questions,
        or one of the server's requests to a client."""
        policy = self.deadlines.policy
        deadlines = [
            self.deadlines.next_deadline(),
            None if self.modern_server is None else self.modern_server.asking.next_deadline(),
            self.server_requests.next_deadline(policy.timeout) if policy.enabled else None,
        ]
        return min((d for d in deadlines if d is not None), default=None)

    def client_cancelled(self, session: Hashable, params: dict[str, Any]) -> Message | None:
        """Translate a client's ``notifications/cancelled``; None if nothing to cancel."""
        upstream_id = self.requests.cancel(session, params.get("requestId"))
        if upstream_id is None:
            return None
        self.deadlines.discard(upstream_id)
        if self.turns.on:
            held = self.turns.drop(upstream_id)
            self._settle()
            if held:
                return None  # it never reached the server
        return _cancelled(upstream_id, params.get("reason"))

    def session_closed(self, session: Hashable) -> list[Message]:
        """A session went away: cancel what it still had in flight."""
        self.sessions.pop(session, None)
        self.modern_sessions.discard(session)
        self.client_infos.pop(session, None)
        if self.modern_server is not None:
            self.modern_server.asking.session_gone(session)
            self.modern_server.forget_stamp(session)
        gone = self.requests.drop_session(session)
        for upstream_id in gone:
            self.deadlines.discard(upstream_id)
        turns = self.turns
        sent = [upstream_id for upstream_id in gone if not turns.drop(upstream_id)]
        out = [_cancelled(upstream_id, "client disconnected") for upstream_id in sent]
        out += self.server_requests.session_gone(session)
        turns.session_gone(session)
        if turns.on:
            self._settle()
        self.tasks.forget_session(session)
        modern = self.modern_server
        if self.state is ServerState.READY and modern is not None:
            self.fanout.session_gone(session)
            out += [a.message for a in modern.listen_actions() if isinstance(a, SendUpstream)]
        elif self.state is ServerState.READY:
            emptied, level = self.fanout.session_gone(session)
            out += [self._own_request("resources/unsubscribe", {"uri": uri}) for uri in emptied]
            out += [
                a.message for a in self._log_level_actions(level) if isinstance(a, SendUpstream)
            ]
        else:
            self.fanout.session_gone(session)
        return out

    # -- from the server ----------------------------------------------------

    def server_message(
        self, message: Any, now: float = 0.0, related: int | str | None = None
    ) -> list[Action]:
        """Everything a decoded line from the server leads to. ``related``: the
        upstream id of the request on whose answer's stream it came, if the
        link can tell (Streamable HTTP: broker/wire/frames.py ``OnStream``)."""
        kind = jsonrpc.classify(message)
        if kind is Kind.RESPONSE:
            return self._response(message, now)
        if kind is Kind.NOTIFICATION:
            return self._notification(message, now)
        return self._server_request(message, related, now)

    def response_fast(self, message: Any) -> Hashable | None:
        """The common case of :meth:`server_message`, cheaply: the answer to a
        request that needs no note, given its client's id back in place;
        returns the session to deliver it to. None: not such an answer
        (nothing changed), use :meth:`server_message`. tests/test_fuzz.py
        holds the two to the same answers.
        """
        if type(message) is not dict or "method" in message:
            return None
        upstream_id = message.get("id")
        if (
            type(upstream_id) is not int
            or message.get("jsonrpc") != "2.0"
            or ("result" in message) is ("error" in message)
        ):
            return None
        if self.modern and ("error" in message or self.minted is not None):
            return None  # (it may refuse the era, or be a pool's input_required: _response)
        entry = self.requests.close_plain(upstream_id)
        if entry is None:
            return None
        self.deadlines.discard(upstream_id)
        if self.turns.on:
            self._settle()
        message["id"] = entry.client_id
        return entry.session

    def answer_fast(self, answer: Answer) -> Hashable | None:
        """:meth:`response_fast` for an answer left unparsed (broker/wire/envelope.py):
        the session to deliver it to, with the client's id put in place. None:
        not the answer to a request that needs no note, nor the final answer
        of an ``InputRound`` (nothing changed); parse the line and use
        :meth:`server_message`."""
        upstream_id = answer.id
        if type(upstream_id) is not int:
            return None
        if self.modern and (
            (answer.is_error() and may_refuse_era(answer))  # (_response: EraRefusals)
            or (self.minted is not None and not ends_round(answer))  # (a pool's: _minted)
        ):
            return None
        entry = self.requests.close_plain(upstream_id)
        if entry is None:
            # A legacy client's call at a modern server: its final answer is
            # passed on as any other; a round of questions is the bridge's.
            # (A pool's instance searched the answer above.)
            if not self.modern or (self.minted is None and not ends_round(answer)):
                return None
            entry = self.requests.close_round(upstream_id)
            if entry is None:
                return None
        self.deadlines.discard(upstream_id)
        if self.turns.on:
            self._settle()
        answer.id = entry.client_id
        answer.modern = self.modern
        answer.method = entry.method
        return entry.session

    def take_answers(
        self,
        frames: Sequence[LinkFrame],
        start: int,
        deliveries: dict[Hashable, list[Any]],
        sizes: dict[Hashable, int],
    ) -> int:
        """The hot path of a server's output, a run of frames at a time (each
        frame one message's bytes, broker/wire/frames.py): from ``frames[start]``
        on, each answer that :meth:`answer_fast` takes (unparsed) is added to
        its session's list in ``deliveries`` (and what it holds, its bytes and
        ``envelope.HELD``, to the session's count in ``sizes``), up to the
        first frame that needs more. Returns that frame's index
        (``len(frames)``: none)."""
        for i in range(start, len(frames)):
            frame = frames[i]
            answer = split_answer(frame) if isinstance(frame, bytes) else None
            session = None if answer is None else self.answer_fast(answer)
            if session is None:
                return i
            deliveries.setdefault(session, []).append(answer)
            sizes[session] = sizes.get(session, 0) + len(frame) + HELD  # type: ignore[arg-type]
        return len(frames)

    def oversize(self, frame: Oversize, limit: int) -> list[Action]:
        """A message from the server over the size limit: if it was an answer,
        its caller gets an error now (not a timeout later); either way it is said."""
        upstream_id = answer_id(frame.head, frame.tail)
        detail = f"a message of {frame.size} bytes, over broker.maxMessageBytes ({limit})"
        data = {"server": self.name, "size": frame.size, "limit": limit}
        failed = [] if upstream_id is None else self.fail_now(upstream_id, detail, data)
        if not failed:
            return [Warn("server.message_too_large", f"dropped {detail}")]
        return [*failed, Warn("server.answer_too_large", detail)]

    def fail_now(
        self, upstream_id: int, detail: str, data: dict[str, Any] | None = None
    ) -> list[Action]:
        """The server answered this request with something the broker cannot
        take (``detail``): its caller gets -32603 now; [] if nobody waits."""
        entry = self.requests.forget(upstream_id)
        if entry is None:
            return []
        self.deadlines.discard(upstream_id)
        if self.turns.on:
            self._settle()
        error = jsonrpc.error_response(
            entry.client_id,
            INTERNAL_ERROR,
            f"MCP server {self.name!r} answered with {detail}",
            data=data or {"server": self.name},
        )
        return [Deliver(entry.session, error)]

    def server_gone(
        self,
        reason: str,
        trigger: ServerTrigger = ServerTrigger.ENDED,
        *,
        retryable: bool | None = None,
    ) -> list[Deliver]:
        """The server exited or its pipe broke (or it cannot be reached at all:
        ``UNREACHABLE``): fail every request in flight. ``retryable`` overrides
        what the new state says (a server a reload stops and starts anew)."""
        self.move(trigger)
        self.last_error = reason
        self.deadlines = Deadlines(self.deadlines.policy)
        self.turns.clear()  # (failed below with the rest)
        self.released.clear()
        if retryable is None:
            retryable = self.state is ServerState.RESTARTING
        failed = [self._fail(entry, reason, retryable) for entry in self.requests.drain()]
        modern = self.modern_server
        if modern is not None:
            for action in modern.bridged(modern.asking.server_gone(reason, retryable)):
                assert isinstance(action, Deliver)  # (no call is sent again)
                failed.append(action)
        return failed

    def _fail(self, entry: InFlight, reason: str, retryable: bool) -> Deliver:
        """A request the server will never answer: the client may send it again
        (``retryable``) once the server is back, unless it cannot come back."""
        error = jsonrpc.error_response(
            entry.client_id,
            CONNECTION_CLOSED,
            f"MCP server {self.name!r} {reason}",
            data={"server": self.name, "retryable": retryable},
        )
        return Deliver(entry.session, error)

    def _response(self, message: Message, now: float = 0.0) -> list[Action]:
        if self.state is ServerState.INITIALIZING:
            if message.get("id") == HANDSHAKE_ID:
                return self._handshake_done(message)
            if message.get("id") == PROBE_ID and self.probe.probes:
                return self._probed(message)
        upstream_id = message.get("id")
        if upstream_id == self.warming.listing and upstream_id is not None:
            return self._tools_listed(message)
        if self.modern_server is not None and self.modern_server.is_listen(upstream_id):
            return self.modern_server.listen_ended(message, now)
        entry = self.requests.close(message)
        if entry is None:
            return []
        self.deadlines.discard(upstream_id)  # type: ignore[arg-type]
        if self.turns.on:
            self._settle()
        note = entry.note
        warned: list[Action] = []
        if self.modern and "error" in message:
            refused = self.refusals.refused(message, now)
            if refused is not None:  # (it may be opened again: docs/eras.md)
                message, warned = refused
        if note is None:  # nearly every response
            if self.minted is not None and entry.session in self.modern_sessions:
                self._minted(message)
            return [*warned, Deliver(entry.session, message)]
        if isinstance(note, Subscribing):
            if "error" not in message:
                self.fanout.accepted(note.uri)
            elif self.fanout.refused(entry.session, note.uri):
                drop = self._own_request("resources/unsubscribe", {"uri": note.uri})
                return [SendUpstream(drop), Deliver(entry.session, message)]
        elif isinstance(note, CreatesTask):
            self.tasks.created(entry.session, message.get("result"))
        elif isinstance(note, TaskQuery):
            self.tasks.rename(message.get("result"))
        elif isinstance(note, TaskList):
            self.tasks.listed(entry.session, message.get("result"))
        elif isinstance(note, InputRound) and self.modern_server is not None:
            timeout = self.deadlines.policy.timeout  # (the call's own, between rounds too)
            bridged = self.modern_server.round_answered(entry.session, note, message, now, timeout)
            return [*warned, *self._back_channel_refused(message), *self._bridged(bridged, now)]
        return [*warned, Deliver(entry.session, message)]

    def _back_channel_refused(self, message: Message) -> list[Action]:
        """A legacy client's call that the modern server failed because its
        tool asks the legacy way (the SDK's ``ctx.elicit``): the operator is
        told which setting makes it work (docs/eras.md), once per connection."""
        if self.back_channel_warned or not refuses_back_channel(message):
            return []
        self.back_channel_warned = True
        return [
            Warn(
                "server.needs_legacy_era",
                f"a tool of MCP server {self.name!r} asks its client the legacy way "
                "(server-to-client requests), which the 2026-07-28 era this server "
                'was opened in does not have: set "era": "legacy" for it (or "per-client", '
                "where modern clients use it too)",
            )
        ]

    def _handshake_done(self, message: Message) -> list[Action]:
        probed = self.probe.refused(message)
        if probed is not None:  # a modern-only server refused initialize: it is probed
            return probed
        return self._opened(read_initialize_result(message))  # (may raise HandshakeError)

    def renewed(self) -> list[Action]:
        """What the server must be asked again in a new session: the
        subscriptions and log level its sessions asked for. After a restart's
        handshake, and when the link opened a new session under the same
        connection (broker/wire/frames.py ``Renewed``). Neither exists in the
        modern era (docs/eras.md)."""
        if self.modern:
            return []
        actions: list[Action] = [
            SendUpstream(self._own_request("resources/subscribe", {"uri": uri}))
            for uri in self.fanout.subscribed_uris()
        ]
        return actions + self._log_level_actions(self.fanout.upstream_level())

    # -- warm-up: the instance's own tools ----------------------------------

    def _list_tools(self, cursor: str | None = None) -> SendUpstream:
        """Ask the server for its tools (a first page, or the next one)."""
        request = self._own_request("tools/list", {} if cursor is None else {"cursor": cursor})
        self.warming.asked(request, cursor)
        return SendUpstream(request)

    def _tools_listed(self, message: Message) -> list[Action]:
        """The instance listed its tools: ready once it offers the expected ones."""
        cursor = self.warming.listed(message)
        if cursor is not None:
            return [self._list_tools(cursor)]
        self.checked = self.warming.checked()
        if self.state is not ServerState.WARMING or not self.warming.complete():
            return []  # (ready already; or some come later: it says so with list_changed)
        return self._ready()

    def _ready(self) -> list[Action]:
        assert self.identity is not None
        self.move(ServerTrigger.WARMED)
        return [Ready(self.identity)]

    def warm_up_expired(self) -> list[Action]:
        """The actor waited long enough for the expected tools: ready anyway
        (calls for the tools still missing get -32602)."""
        if self.state is not ServerState.WARMING:
            return []
        missing = self.warming.missing()
        warn = Warn(
            "server.tools_missing",
            f"this instance does not offer {', '.join(missing) or 'its tools list'} "
            "that the catalog shows; calls for them are refused",
        )
        return [warn, *self._ready()]

    def _notification(self, message: Message, now: float) -> list[Action]:
        if self.modern_server is not None:  # its listen's, in legacy terms (or its own business)
            received = self.modern_server.listen.receive(message)
            if received is None:  # (an acknowledgement may retire a replaced stream)
                return [SendUpstream(m) for m in self.modern_server.listen.take_retired()]
            message = received
        method = message["method"]
        if method == "notifications/progress":
            sent: dict[str, Any] = message.get("params") or {}  # (progress() replaces it)
            entry = self.requests.progress(message)
            if entry is None:
                return []
            self.deadlines.touch(sent["progressToken"], now)  # matched: the upstream id
            return [Deliver(entry.session, message, entry.client_id)]
        params = message.get("params") or {}
        if method == "notifications/cancelled":
            routed = self.server_requests.server_cancelled(params)
            return [] if routed is None else [Deliver(*routed)]
        if method == "notifications/elicitation/complete":
            session = self.server_requests.elicitation_complete(params)
            return [] if session is None else [Deliver(session, message)]
        if method == "notifications/message":
            if not is_log_message(message.get("params")):
                return self._invalid_log_message(message)
            logger = params.get("logger")
            named = {**params, "logger": f"{self.name}/{logger}" if logger else self.name}
            note = {**message, "params": named}
            level = params["level"]  # (one of the eight: is_log_message)
            admitted = [s for s in self.sessions if self.fanout.admits(s, level)]
            if self.modern_server is not None:  # it logs for requests that asked
                admitted = self.modern_server.logs_to(admitted)
            sole = self.requests.sole_requests(self.turns.held) if admitted else {}
            return [Deliver(s, note, sole.get(s)) for s in admitted]
        if method == "notifications/tasks/status":
            routed = self.tasks.status(message)
            return [] if routed is None else [Deliver(*routed)]
        if method == "notifications/resources/updated":
            return [Deliver(s, message) for s in self.fanout.subscribers(params.get("uri"))]
        if method in LIST_CHANGED:
            if self.warm_up and method == "notifications/tools/list_changed":
                self.warming.tools = self.checked = None  # not checked until listed again
                return [ListChanged(message), self._list_tools()]
            return [ListChanged(message)]
        return [Broadcast(message)]

    def _invalid_log_message(self, message: Message) -> list[Action]:
        """A ``notifications/message`` MCP does not allow (no level of the
        eight, or no ``data``): dropped, with a warning the first time."""
        if self.log_message_warned:
            return []
        self.log_message_warned = True
        return [
            Warn(
                "server.invalid_log_message",
                "dropped a notifications/message without one of the eight levels or data "
                f"({repr(message.get('params'))[:200]}); any more from this server are "
                "dropped without a word",
            )
        ]

    def _server_request(
        self, message: Message, related: int | str | None = None, now: float = 0.0
    ) -> list[Action]:
        method = message["method"]
        if method == "ping":
            return [SendUpstream(jsonrpc.result_response(message["id"], {}))]
        turns = self.turns
        if related is not None:
            # The transport says whose request it came for: that session's, if
            # the request is still in flight (nobody's otherwise), and the gate
            # has nothing to learn from it.
            entry = self.requests.get(related)
            causes = [] if entry is None else [entry.session]
        else:
            causes = self.requests.sessions(turns.held)
            if method in CAPABILITY_OF:
                turns.server_asks(method, causes)
        route = self.server_requests.route(message, causes, self.sessions, now)
        if isinstance(route, Route):
            if method == "roots/list":
                turns.roots_asked(route.session)
            related = self.requests.sole_requests(turns.held).get(route.session)
            return [Deliver(route.session, route.message, related)]
        actions: list[Action] = [SendUpstream(route.message)]
        if route.reason != "unknown" and "error" in route.message:  # (not roots: none)
            actions.append(Warn("server.request_refused", route.message["error"]["message"]))
        return actions


# Requests whose answer the broker reads (or that it may answer itself).
NOTED_METHODS = frozenset({"resources/subscribe", "resources/unsubscribe", "tasks/list"}) | (
    TASK_METHODS
)


_UP = (ServerState.WARMING, ServerState.READY)  # initialized


def _uri_of(request: Message) -> str:
    uri = (request.get("params") or {}).get("uri")
    if not isinstance(uri, str):
        raise JsonRpcError(INVALID_PARAMS, f"{request['method']} needs params.uri (a string)")
    return uri


def _held_size(request: Message) -> int:
    """What a request waiting for its turn holds (as a queue counts it)."""
    try:
        return jsonrpc.held_size(jsonrpc.encode(request))
    except TypeError:  # (the writer answers for what it cannot encode)
        return 0


def _as_sent(request: Message) -> Message:
    """A legacy client's call to a modern server as the client sent it, kept
    (an :class:`InputRound`'s) for a retry before :meth:`UpstreamProtocol._open`
    rewrites the request. Its params are kept, not copied, unless they hold a
    ``_meta``: ``_open`` gives the request new params (the stamp) and changes
    the client's only to rewrite a ``progressToken`` there. (``copy``, not
    ``{**request}``: CPython clones a small dict's table whole.)"""
    params = request.get("params")
    if type(params) is not dict or "_meta" in params:
        params = dict(params) if type(params) is dict else {}
    sent = request.copy()
    sent["params"] = params
    return sent


def _cancelled(upstream_id: int, reason: Any) -> Message:
    params: dict[str, Any] = {"requestId": upstream_id}
    if isinstance(reason, str):
        params["reason"] = reason
    return jsonrpc.notification("notifications/cancelled", params)


__all__ = [
    "HANDSHAKE_ID",
    "PROBE_ID",
    "Action",
    "Broadcast",
    "Deliver",
    "HandshakeError",
    "ListChanged",
    "Ready",
    "SendUpstream",
    "Speak",
    "UpstreamProtocol",
    "Warn",
]
