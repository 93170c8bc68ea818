"""The bridge between the eras: server questions as requests, or as input_required.

A legacy server asks its client things by sending it requests
(``sampling/createMessage``, ``elicitation/create``, ``roots/list``) in the
middle of a call. A modern server instead answers the call with an
``input_required`` result listing the questions (``inputRequests``, and an
opaque ``requestState``), and the client asks the call again with the
answers (``inputResponses``). The broker translates both ways, as two state
machines that return actions and do no I/O:

**A legacy client at a modern server** (:class:`AskingClients`, one per
modern server). The client's ``tools/call`` goes up carrying the record
:class:`~broker.requestmap.InputRound` (its request and the rounds so far).
An ``input_required`` answer becomes one request to the client per
question, with ids of the broker's own; once every answer is in, the call
goes up again with ``inputResponses`` and the server's ``requestState``.
The client sees one request and one answer; a question it did not declare
the capability for is never asked: its call is answered -32021. After
:data:`MAX_ROUNDS` rounds the call is answered with an error. The answers
must come within the call's own timeout (``input_required``'s ``timeout``;
the actor's clock, :meth:`AskingClients.expire`), or the questions are
withdrawn and the call answered -32001.

**A modern client at a legacy server** (:class:`AnsweringServers`; a
modern session keeps one, naming each call by its first id:
broker/eras/session.py). When the server asks a question during a modern client's
call, the call is kept waiting upstream and the client's request is
answered ``input_required`` with the question and a ``requestState`` of the
broker's own (broker/eras/tokens.py). The client's retry (a new id, the
same request, ``inputResponses`` and that ``requestState``) hands the answers
to the server and takes over the waiting call: the final result goes to
the retry's id. A question the server asks while the client is away waits
for the retry, whose answer is then the next ``input_required``. A client
that does not come back within ``timeout`` (the actor's clock:
:meth:`AnsweringServers.arm`, :meth:`AnsweringServers.expire`) is given up:
the server's questions get errors, the call is cancelled, and a retry that
comes later is told so.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any, Final

import attrs
import orjson

from broker import jsonrpc
from broker.eras.modern import check_input_requests
from broker.eras.tokens import RequestStates, TooManyStates
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LOG_LEVEL_KEY,
    PROTOCOL_VERSION_KEY,
    SUBSCRIPTION_ID_KEY,
)
from broker.jsonrpc import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    LIMIT_REACHED,
    REQUEST_TIMEOUT,
    JsonRpcError,
    Message,
    RequestId,
)
from broker.requestmap import InputRound
from broker.server_requests import CAPABILITY_OF, MAX_PENDING, ClientIds, supports
from broker.wire.envelope import COPIED, Answer

MAX_ROUNDS = 10  # as the SDKs' clients (mcp/client/_input_required.py)
MAX_EXPIRED = 256  # expired requestStates remembered per session, to tell a late retry why
MODERN_META_KEYS = (
    PROTOCOL_VERSION_KEY,
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LOG_LEVEL_KEY,
    SUBSCRIPTION_ID_KEY,
)
_MODERN_META_SET = frozenset(MODERN_META_KEYS)


# -- actions -----------------------------------------------------------------


@attrs.frozen
class AskClient:
    """Send this request to the client (session)."""

    session: Hashable
    message: Message


@attrs.frozen
class AnswerClient:
    """Answer the client's request (the message carries the client's id)."""

    session: Hashable
    message: Message


@attrs.frozen
class SendServer:
    """Send this to the server: a retry to forward (a request, in the client's
    id, with its :class:`~broker.requestmap.InputRound` note), or an answer to
    one of the server's own requests."""

    message: Message
    note: Any = None
    session: Hashable | None = None  # whose call a retry is (AskingClients)


@attrs.frozen
class Rebind:
    """The call in flight upstream now answers the client's request ``client_id``."""

    call: Hashable
    session: Hashable
    client_id: RequestId


@attrs.frozen
class CancelCall:
    """Give up the call in flight upstream (cancel it at the server)."""

    call: Hashable


@attrs.frozen
class Finish:
    """The call ended while its client was away: its answer (in the id of the
    retry it answers) goes to the client, and the call is over."""

    call: Hashable
    session: Hashable
    message: Message


UNKNOWN_STATE: Final = "requestState is unknown, expired, or not this client's"

Action = AskClient | AnswerClient | SendServer | Rebind | CancelCall | Finish


# -- translation of single messages --------------------------------------------


# (a static in a compiled build: orjson.Fragment was looked up by name on each
# call, a quarter of legacy_params's work)
_Fragment: Final = orjson.Fragment


def legacy_params(params: dict[str, Any]) -> dict[str, Any] | None:
    """A modern client's request's ``params`` for a legacy server: without the
    modern ``_meta`` keys (version, capabilities, client info, log level), all
    else kept, as a new dict (``params`` itself is left as it is: the
    session's records may hold it); None if its ``_meta`` holds no modern
    key (nothing to strip)."""
    meta = params.get("_meta")
    if type(meta) is _Fragment:  # a remembered _meta: the modern keys alone (metacache.py)
        stripped = dict(params)
        del stripped["_meta"]
        return stripped
    if not isinstance(meta, dict) or meta.keys().isdisjoint(_MODERN_META_SET):
        return None
    new_params = dict(params)
    if meta.keys() <= _MODERN_META_SET:  # (the usual: the modern keys alone)
        del new_params["_meta"]
    else:
        new_params["_meta"] = {k: v for k, v in meta.items() if k not in _MODERN_META_SET}
    return new_params


def modern_params(
    params: Any,
    version: str,
    capabilities: dict[str, Any],
    client_info: Any = None,
    log_level: str | None = None,
) -> dict[str, Any]:
    """A legacy client's request's ``params`` for a modern server: what its
    ``initialize`` said (version, capabilities, client info) and its log
    level, in ``_meta`` (over the client's own keys), as a new dict
    (``params`` itself is left as it is)."""
    stamped: dict[str, Any] = {PROTOCOL_VERSION_KEY: version, CLIENT_CAPABILITIES_KEY: capabilities}
    if client_info is not None:
        stamped[CLIENT_INFO_KEY] = client_info
    if log_level is not None:
        stamped[LOG_LEVEL_KEY] = log_level
    if type(params) is not dict:
        return {"_meta": stamped}
    meta = params.get("_meta")
    if type(meta) is dict:  # (the client's own keys first, the stamp's over them)
        stamped = {**meta, **stamped}
    return {**params, "_meta": stamped}


def is_input_required(result: Any) -> bool:
    return isinstance(result, dict) and result.get("resultType") == "input_required"


def ends_round(answer: Answer) -> bool:
    """Whether a modern server's answer, unparsed, is a call's last (not
    :func:`is_input_required`), so it may pass on as any other answer does.
    Cheap and one-sided: a result whose bytes name ``"input_required"``
    anywhere is left to the parser, which tells; so is an error whose bytes
    name a missing back-channel (:func:`refuses_back_channel`, which the
    Upstream warns of)."""
    needle = _NO_BACK_CHANNEL if answer.is_error() else _INPUT_REQUIRED
    # (the line searched in place, once; not `in`: see broker/jsonrpc.py LONG;
    # partition, which parses no argument format, where its copies of the
    # two sides are small)
    line = answer.written()
    if len(line) > COPIED:  # (a view's whole line: not copied twice)
        return line.find(needle) < 0
    return not line.partition(needle)[1]


_INPUT_REQUIRED = b'"input_required"'
_NO_BACK_CHANNEL = b"no back-channel"


def refuses_back_channel(message: Message) -> bool:
    """Whether a modern server's answer is the official SDK's refusal to ask
    its client the legacy way (``ctx.elicit``, ``create_message``,
    ``list_roots``: an error saying "this transport context has no
    back-channel for server-initiated requests"). Such a tool works only in
    the legacy era: the Upstream says so, naming the setting that opens the
    server so (docs/eras.md)."""
    error = message.get("error")
    if error is None:
        return False
    try:
        return jsonrpc.encode(error).find(_NO_BACK_CHANNEL) >= 0
    except TypeError:  # (an integer past 64 bits, read exactly: no refusal text either)
        return False


# -- a legacy client at a modern server ---------------------------------------


@attrs.define
class _Exchange:
    session: Hashable
    round: InputRound
    request_state: Any
    asks: dict[str, str]  # the broker's id of a question to the client -> its input key
    answers: dict[str, Any]
    timeout: float = math.inf  # seconds the client has to answer them all
    deadline: float = math.inf  # ... that is, until then (the actor's clock)


class AskingClients:
    """The questions a modern server's ``input_required`` results put to legacy clients."""

    def __init__(
        self, server: str, ids: ClientIds | tuple[int, int] = (1, 1), max_rounds: int = MAX_ROUNDS
    ) -> None:
        """``ids``: the server instance's, shared with its own requests
        (broker/server_requests.py, ``ClientIds``)."""
        self.server = server
        self.max_rounds = max_rounds
        self.ids = ids if isinstance(ids, ClientIds) else ClientIds(server, ids)
        self._by_ask: dict[str, _Exchange] = {}
        self._by_call: dict[tuple[Hashable, RequestId], _Exchange] = {}

    def __len__(self) -> int:
        return len(self._by_call)

    def input_required(
        self,
        session: Hashable,
        capabilities: dict[str, Any],
        note: InputRound,
        result: dict[str, Any],
        now: float = 0.0,
        timeout: float = math.inf,
    ) -> list[Action]:
        """The server answered the call in ``note`` with ``input_required``
        (at ``now``): its questions are put to the client, which has
        ``timeout`` seconds to answer them all (:meth:`expire`)."""
        client_id = note.request["id"]
        rounds = note.rounds + 1
        if rounds > self.max_rounds:
            return [self._fail(session, client_id, f"more than {self.max_rounds} rounds")]
        requests = result.get("inputRequests") or {}
        try:
            if not isinstance(requests, dict):
                raise JsonRpcError(INVALID_PARAMS, "inputRequests is not an object")
            check_input_requests(capabilities, requests)
        except JsonRpcError as exc:
            exc.id = client_id
            exc.message = f"MCP server {self.server!r} asked: {exc.message}"
            return [AnswerClient(session, exc.to_response())]
        if len(self._by_ask) + len(requests) > MAX_PENDING:
            return [self._too_many(session, client_id, len(requests))]
        round = InputRound(note.request, rounds)
        exchange = _Exchange(session, round, result.get("requestState"), {}, {})
        exchange.timeout, exchange.deadline = timeout, now + timeout
        if not requests:  # state only: ask again at once (the actor may pace it)
            return [self._retry(exchange)]
        actions: list[Action] = []
        for key, request in requests.items():
            ask_id = self.ids.take()
            exchange.asks[ask_id] = key
            self._by_ask[ask_id] = exchange
            message = {"jsonrpc": "2.0", "id": ask_id, "method": request["method"]}
            if "params" in request:
                message["params"] = request["params"]
            actions.append(AskClient(session, message))
        self._by_call[(session, client_id)] = exchange
        return actions

    def owns(self, ask_id: Any) -> bool:
        return isinstance(ask_id, str) and ask_id in self._by_ask

    def client_answered(self, session: Hashable, response: Message) -> list[Action] | None:
        """A client's answer to one of the questions (None: not one of ours)."""
        ask_id = response.get("id")
        exchange = self._by_ask.get(ask_id) if isinstance(ask_id, str) else None
        if exchange is None or exchange.session != session:
            return None
        assert isinstance(ask_id, str)
        del self._by_ask[ask_id]
        key = exchange.asks.pop(ask_id)
        if "result" not in response:
            error = response.get("error")
            said = error.get("message") if isinstance(error, dict) else error
            return [
                *self._drop(exchange),
                self._fail(session, exchange.round.request["id"], f"the client refused: {said}"),
            ]
        exchange.answers[key] = response["result"]
        if exchange.asks:
            return []
        del self._by_call[(session, exchange.round.request["id"])]
        return [self._retry(exchange)]

    def cancel(self, session: Hashable, client_id: Any) -> list[Action]:
        """The client cancelled its call: withdraw the questions still open."""
        exchange = self._by_call.get((session, client_id))
        return [] if exchange is None else self._drop(exchange)

    def session_gone(self, session: Hashable) -> None:
        for exchange in [e for e in self._by_call.values() if e.session == session]:
            self._drop(exchange)

    def next_deadline(self) -> float | None:
        """When the first call waiting for its client's answers runs out
        (None: none waits, or none has a deadline)."""
        if not self._by_call:
            return None
        first = min(exchange.deadline for exchange in self._by_call.values())
        return None if first == math.inf else first

    def expire(self, now: float) -> list[Action]:
        """The calls whose client did not answer every question by ``now``:
        the questions still open are withdrawn and the call is answered
        -32001, as a call that timed out upstream is (the server has nothing
        of it between rounds: nothing is cancelled there)."""
        actions: list[Action] = []
        for exchange in [e for e in self._by_call.values() if e.deadline <= now]:
            actions += self._drop(exchange)
            request = exchange.round.request
            message = (
                f"Request {request['method']!r} to MCP server {self.server!r} timed out: "
                f"the client did not answer the server's questions within {exchange.timeout:g} s"
            )
            error = jsonrpc.error_response(
                request["id"], REQUEST_TIMEOUT, message, data={"server": self.server}
            )
            actions.append(AnswerClient(exchange.session, error))
        return actions

    def server_gone(self, why: str, retryable: bool = False) -> list[Action]:
        """The server went away: every call waiting for its clients' answers
        fails (its questions withdrawn), ``retryable`` as every request in
        flight there is (the call sent again from the start: a retry of the
        round would find a new process that knows nothing of its
        ``requestState``)."""
        actions: list[Action] = []
        for exchange in list(self._by_call.values()):
            actions += self._drop(exchange)
            client_id = exchange.round.request["id"]
            message = f"MCP server {self.server!r} {why}"
            data = {"server": self.server, "retryable": retryable}
            error = jsonrpc.error_response(client_id, CONNECTION_CLOSED, message, data=data)
            actions.append(AnswerClient(exchange.session, error))
        return actions

    def _retry(self, exchange: _Exchange) -> SendServer:
        request = exchange.round.request
        params = dict(request.get("params") or {})
        params["inputResponses"] = exchange.answers
        params.pop("requestState", None)
        if exchange.request_state is not None:
            params["requestState"] = exchange.request_state
        return SendServer({**request, "params": params}, exchange.round, exchange.session)

    def _drop(self, exchange: _Exchange) -> list[Action]:
        self._by_call.pop((exchange.session, exchange.round.request["id"]), None)
        withdrawn: list[Action] = []
        for ask_id in exchange.asks:
            del self._by_ask[ask_id]
            note = jsonrpc.notification("notifications/cancelled", {"requestId": ask_id})
            withdrawn.append(AskClient(exchange.session, note))
        exchange.asks.clear()
        return withdrawn

    def _too_many(self, session: Hashable, client_id: RequestId, asked: int) -> AnswerClient:
        """A round that would put more questions to clients at once than a
        legacy server may (MAX_PENDING): the call fails instead, -32005."""
        waiting = len(self._by_ask)
        message = (
            f"MCP server {self.server!r} asked {asked} questions, with {waiting} of its "
            f"questions already waiting for clients' answers (the limit is {MAX_PENDING})"
        )
        data = {"server": self.server, "limit": MAX_PENDING}
        return AnswerClient(
            session, jsonrpc.error_response(client_id, LIMIT_REACHED, message, data=data)
        )

    def _fail(self, session: Hashable, client_id: RequestId, why: str) -> AnswerClient:
        message = f"MCP server {self.server!r} needed input: {why}"
        return AnswerClient(session, jsonrpc.error_response(client_id, INTERNAL_ERROR, message))


# -- a modern client at a legacy server ---------------------------------------


@attrs.define
class _Question:
    server_id: RequestId
    method: str
    params: Any


@attrs.define
class _Parked:
    """A modern client's call at a legacy server that asked it something."""

    session: Hashable
    call: Hashable  # its upstream id, or whatever names it to the caller
    method: str
    client_id: RequestId | None  # None: answered input_required, waiting for the retry
    asking: dict[str, _Question]  # input key -> question, put to the client
    waiting: list[_Question]  # asked by the server since; put on the retry
    final: Message | None = None  # the call's answer, come while the client was away
    token: str | None = None
    keys: int = 0


class AnsweringServers:
    """A legacy server's questions to modern clients, as ``input_required`` rounds."""

    def __init__(
        self, server: str, key: bytes, limit: int = 4096, timeout: float = math.inf
    ) -> None:
        """``timeout``: the seconds a parked call waits for its client's retry
        (from :meth:`arm`; infinite: until the call ends otherwise)."""
        self.server = server
        self.states = RequestStates(key, limit)
        self.timeout = timeout
        self.parked: dict[Hashable, _Parked] = {}  # the calls waiting for a retry, by name
        self.unarmed: list[_Parked] = []  # parked since the last arm()
        # requestState -> (its deadline, the timeout it was given): the parked calls.
        self._deadlines: dict[str, tuple[float, float]] = {}
        # requestStates given up (expire), to tell a late retry: -> (session, timeout).
        self._expired: dict[str, tuple[Hashable, float]] = {}

    def server_asked(
        self,
        session: Hashable,
        capabilities: dict[str, Any],
        call: tuple[Hashable, RequestId, str],
        request: Message,
    ) -> list[Action]:
        """The server asked ``request`` during the modern client's ``call``
        (what names it, such as its upstream id; the client's id; its method)."""
        method, params = request["method"], request.get("params") or {}
        name, client_id, call_method = call
        if not isinstance(params, dict):
            message = f"Invalid params: {method} needs an object"
            return [SendServer(jsonrpc.error_response(request["id"], INVALID_PARAMS, message))]
        if method not in CAPABILITY_OF:
            message = f"Method not found: {method}"
            return [SendServer(jsonrpc.error_response(request["id"], -32601, message))]
        if not supports(capabilities, method, params):
            message = (
                f"mcpbroker: the client whose request caused {method} did not declare "
                f"the {CAPABILITY_OF[method]!r} capability"
            )
            return [SendServer(jsonrpc.error_response(request["id"], -32601, message))]
        parked = self.parked.get(name)
        if parked is None:
            parked = _Parked(session, name, call_method, client_id, {}, [])
            self.parked[name] = parked
        parked.waiting.append(_Question(request["id"], method, params))
        if parked.client_id is None:
            return []  # the client is away: it hears this on its retry
        return self._ask(parked)

    def call_of(self, session: Hashable, token: Any) -> Hashable | None:
        """The call a token of this session's names (None: none)."""
        parked = self.states.peek(session, token)
        return parked.call if isinstance(parked, _Parked) else None

    def retry(
        self, session: Hashable, request: Message, capabilities: dict[str, Any] | None = None
    ) -> list[Action]:
        """A modern client's request carrying one of the broker's
        ``requestState``s, declaring ``capabilities`` (per request in
        2026-07-28: a question the retry does not declare is not put to it,
        but goes back to the server as an error; None: not checked again)."""
        params = request.get("params") or {}
        token = params.get("requestState")
        parked = self.states.peek(session, token)
        if not isinstance(parked, _Parked) or parked.method != request.get("method"):
            if isinstance(parked, _Parked):
                message = f"requestState belongs to a {parked.method} request"
            else:
                message = self._unknown(session, token)
            error = jsonrpc.error_response(request["id"], INVALID_PARAMS, message)
            return [AnswerClient(session, error)]
        malformed = _malformed_responses(params.get("inputResponses", {}), parked.asking)
        if malformed is not None:  # (refused before it is spent: a good retry may follow)
            error = jsonrpc.error_response(request["id"], INVALID_PARAMS, malformed)
            return [AnswerClient(session, error)]
        self.states.redeem(session, token)
        if parked.token is not None:
            self._deadlines.pop(parked.token, None)
        parked.token = None
        parked.client_id = request["id"]
        responses = params.get("inputResponses")
        responses = responses if isinstance(responses, dict) else {}
        actions: list[Action] = []
        for key in list(parked.asking):
            if key in responses:
                question = parked.asking.pop(key)
                actions.append(
                    SendServer(jsonrpc.result_response(question.server_id, responses[key]))
                )
        if capabilities is not None:
            actions.extend(self._undeclared(parked, capabilities))
        if parked.final is not None:  # answered while the client was away
            del self.parked[parked.call]
            return [*actions, Finish(parked.call, session, {**parked.final, "id": request["id"]})]
        actions.append(Rebind(parked.call, session, request["id"]))
        if parked.asking or parked.waiting:
            actions.extend(self._ask(parked))
        return actions

    def _undeclared(self, parked: _Parked, capabilities: dict[str, Any]) -> list[Action]:
        """The questions of ``parked`` the retry's ``capabilities`` do not
        cover, taken out and answered with errors (as :meth:`server_asked`
        answers one the call did not declare)."""
        refused = [q for q in [*parked.asking.values(), *parked.waiting]
                   if not supports(capabilities, q.method, q.params)]  # fmt: skip
        if not refused:
            return []
        parked.asking = {k: q for k, q in parked.asking.items() if q not in refused}
        parked.waiting = [q for q in parked.waiting if q not in refused]
        return [
            SendServer(
                jsonrpc.error_response(
                    q.server_id,
                    -32601,
                    f"mcpbroker: the client's retry of the request that caused {q.method} "
                    f"did not declare the {CAPABILITY_OF[q.method]!r} capability",
                )
            )
            for q in refused
        ]

    def call_answered(self, call: Hashable, response: Message) -> bool:
        """The call itself was answered. True: the client is away, the answer is
        kept for its retry (do not deliver it now)."""
        parked = self.parked.get(call)
        if parked is None:
            return False
        if parked.client_id is None:
            parked.final = response
            return True
        del self.parked[call]
        return False

    def arm(self, now: float) -> float | None:
        """Start the clock of the calls parked since the last call (``now``:
        the actor's time); the earliest deadline among them (None: none)."""
        if not self.unarmed:
            return None
        first: float | None = None
        for parked in self.unarmed:
            token = parked.token
            if token is None or parked.client_id is not None or math.isinf(self.timeout):
                continue  # (taken over or ended already, or no deadline now)
            deadline = now + self.timeout
            self._deadlines[token] = (deadline, self.timeout)
            first = deadline if first is None else min(first, deadline)
        self.unarmed.clear()
        return first

    def next_deadline(self) -> float | None:
        """When the first parked call runs out (None: none waits with a deadline)."""
        if not self._deadlines:
            return None
        return min(deadline for deadline, _ in self._deadlines.values())

    def expire(self, now: float) -> list[Action]:
        """The parked calls whose client did not come back by ``now``: the
        server's questions get errors and the call is given up (cancelled
        upstream); a retry that comes later is told its state expired."""
        actions: list[Action] = []
        for token, (deadline, timeout) in list(self._deadlines.items()):
            if deadline > now:
                continue
            del self._deadlines[token]
            parked = self.states.discard(token)
            if not isinstance(parked, _Parked):
                continue
            parked.token = None
            while len(self._expired) >= MAX_EXPIRED:
                del self._expired[next(iter(self._expired))]
            self._expired[token] = (parked.session, timeout)
            why = f"the client did not come back with its input within {timeout:g} s"
            actions.extend(self._abandon(parked, why))
        return actions

    def _unknown(self, session: Hashable, token: Any) -> str:
        """Why a retry's ``requestState`` names no parked call."""
        expired = self._expired.get(token) if isinstance(token, str) else None
        if expired is None or expired[0] != session:
            return UNKNOWN_STATE
        del self._expired[token]
        return (
            f"requestState expired: no retry came within {expired[1]:g} s, so mcpbroker "
            "gave the call up (the server's questions were answered with errors and the "
            "call cancelled); call again without it"
        )

    def session_gone(self, session: Hashable) -> list[Action]:
        actions: list[Action] = []
        for parked in [p for p in self.parked.values() if p.session == session]:
            if parked.token is not None:
                self.states.discard(parked.token)
                self._deadlines.pop(parked.token, None)
            actions.extend(self._abandon(parked, "the client disconnected"))
        return actions

    def cancelled(self, call: Hashable) -> list[Action]:
        """The client cancelled the call (or it timed out): its questions get errors."""
        parked = self.parked.get(call)
        if parked is None:
            return []
        if parked.token is not None:
            self.states.discard(parked.token)
            self._deadlines.pop(parked.token, None)
        return self._abandon(parked, "the client cancelled the request", cancel=False)

    def _ask(self, parked: _Parked) -> list[Action]:
        for question in parked.waiting:
            parked.keys += 1
            parked.asking[f"{question.method.split('/')[0]}-{parked.keys}"] = question
        parked.waiting = []
        client_id = parked.client_id
        assert client_id is not None
        try:
            parked.token = self.states.mint(parked.session, parked)
        except TooManyStates as exc:
            return self._abandon(parked, str(exc))
        parked.client_id = None
        if not math.isinf(self.timeout):
            self.unarmed.append(parked)
        requests = {
            key: {"method": q.method, "params": q.params} for key, q in parked.asking.items()
        }
        result = {"resultType": "input_required", "inputRequests": requests}
        result["requestState"] = parked.token
        return [AnswerClient(parked.session, jsonrpc.result_response(client_id, result))]

    def _abandon(self, parked: _Parked, why: str, *, cancel: bool = True) -> list[Action]:
        """End a parked call: the server's open questions get errors; the
        client, if it waits, an error; the call is cancelled upstream unless
        the caller already did (``cancel``)."""
        self.parked.pop(parked.call, None)
        parked.token = None  # (its token is discarded: no clock for it either)
        message = f"mcpbroker: {why}"
        actions: list[Action] = [
            SendServer(jsonrpc.error_response(q.server_id, INTERNAL_ERROR, message))
            for q in [*parked.asking.values(), *parked.waiting]
        ]
        if cancel and parked.client_id is not None:
            error = jsonrpc.error_response(parked.client_id, INTERNAL_ERROR, message)
            actions.append(AnswerClient(parked.session, error))
        if cancel:
            actions.append(CancelCall(parked.call))
        return actions


def _malformed_responses(responses: Any, asking: dict[str, Any]) -> str | None:
    """Why a retry's ``inputResponses`` is not a valid ``InputResponses`` for
    the questions asked (an object, each answer a result object: MRTR's
    SHOULD validate), or None. An answer to no open question is ignored."""
    if not isinstance(responses, dict):
        return "inputResponses must be an object (the answers by their inputRequests key)"
    for key in asking:
        if key in responses and not isinstance(responses[key], dict):
            return f"inputResponses[{key!r}] must be an object (the {key!r} request's result)"
    return None
