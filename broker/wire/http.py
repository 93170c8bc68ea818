"""Streamable HTTP, the MCP transport of 2025-03-26 to 2025-11-25: its rules, sans-I/O.

One MCP session spans many HTTP requests to one endpoint (``/mcp``, or
``/mcp/NAME`` for one server as it is):

- **POST** carries one JSON-RPC message (a JSON array batch only in a
  session that negotiated 2025-03-26). Notifications and responses get 202
  and no body. Requests open a *stream*: the answer comes back on that
  POST, as ``application/json`` (one message) or as ``text/event-stream``,
  which also carries what belongs to the request (its progress, its log
  messages, the requests a server sends the client because of it) before
  its answer, then ends. :func:`choose_mode` decides which: what the
  client accepts; when it accepts both (as SDK clients do), JSON unless
  something comes before the answer (:func:`json_first`: the stream turns
  SSE at the first message that is not its answer, in
  :meth:`HttpStreams.add`, or when its writer has waited long enough to
  owe a keep-alive comment); ``initialize`` in JSON, a batch as SSE.
- **GET** opens the session's *standalone* stream (number 0): everything
  that belongs to no open request (``list_changed``, ``resources/updated``,
  requests not tied to one). With ``Last-Event-ID`` it resumes the stream
  that event was on instead: the events after it still held are replayed,
  then the stream goes on live.
- **DELETE** ends the session.

``Mcp-Session-Id`` is issued with the answer to ``initialize``; any other
request without one is refused (400), one with an unknown or ended id gets
404 (the client must then initialize again). ``MCP-Protocol-Version``, when
sent, is a legacy version; absent, 2025-03-26 is assumed, as the spec says.
Any other version is a 2026-07-28 client's request (or one at a version the
broker does not know), which broker/wire/http_modern.py's rules answer.
Who may connect at all (Host, Origin, token) is decided as for WebSocket
(:func:`broker.wire.websocket.check_access`).

:class:`HttpStreams` holds one session's streams: which stream each message
for the client goes on (:meth:`HttpStreams.route`), the events waiting to be
written (bounded: past the bound the oldest of the standalone stream are
dropped, and if that is not enough the session is not reading and ends,
:class:`Overflow`), and the written ones kept for replay (bounded, oldest
forgotten first). docs/hosts.md and docs/security.md say what clients see.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import orjson

from broker import jsonrpc
from broker.eras.versions import HEADER_MISMATCH, PROTOCOL_VERSION_KEY
from broker.jsonrpc import INVALID_REQUEST, JsonRpcError, Kind, RequestId, id_key
from broker.lifecycle import BATCH_VERSIONS, LEGACY_VERSIONS
from broker.related import Related
from broker.wire import frames, sse
from broker.wire.envelope import Answer
from broker.wire.websocket import (
    Policy,
    Reject,
    absolute_form,
    check_access,
    fields_of,
    route_of,
)

SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
LAST_EVENT_HEADER = "last-event-id"
DEFAULT_VERSION = "2025-03-26"  # the version a request without the header is taken to speak
PRIMING_VERSIONS = frozenset({"2025-11-25"})  # clients that expect a priming event
METHODS = ("GET", "POST", "DELETE")
STANDALONE = 0  # the number of the GET stream
# Events that may wait to be written to one session, and the written ones
# kept for a client that reconnects with Last-Event-ID.
MAX_PENDING_EVENTS = 1024
REPLAY_EVENTS = 256
REPLAY_BYTES = 1024 * 1024
# Ids of server requests sent to the client and not yet answered, remembered
# so that the server's cancellation goes on the same stream.
MAX_SERVER_REQUESTS = 1024
RETRY_MS = 1000  # how long a client should wait before it reconnects


@attrs.frozen
class Refuse:
    """An HTTP error answer: ``reason`` goes in a JSON-RPC error with no id
    (code ``code``), which the spec allows as the body of any refusal."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...] = ()
    code: int = INVALID_REQUEST
    id: RequestId | None = None
    data: Any = None  # the error's data (a -32022's supported versions)

    def body(self) -> bytes:
        return orjson.dumps(jsonrpc.error_response(self.id, self.code, self.reason, self.data))


@attrs.frozen
class Target:
    """An allowed request: the view its path names (None: every server), and
    its header fields by lower-case name."""

    method: str
    view: tuple[str, ...] | None
    transparent: bool
    fields: dict[str, str]
    modern: bool = False  # a 2026-07-28 request (broker/wire/http_modern.py's rules)

    @property
    def session_id(self) -> str | None:
        return self.fields.get(SESSION_HEADER)


def check_request(
    method: str,
    path: str,
    host: str,
    headers: Sequence[tuple[bytes, bytes]],
    servers: Iterable[str],
    policy: Policy,
) -> Target | Refuse:
    """Whether to serve an HTTP request at all, before its body is read:
    Host, Origin, token (403, 401), path (404), verb (405), protocol version (400).
    A request whose ``MCP-Protocol-Version`` is not a legacy one is ``modern``:
    broker/wire/http_modern.py's rules decide the rest."""
    fields = fields_of(headers)
    if sum(name.lower() == b"host" for name, _ in headers) > 1:
        # (RFC 9112 section 3.2: a MUST; readers of the first and of the last disagree)
        return Refuse(400, "Bad Request: more than one Host header")
    path, host = absolute_form(path, host)
    refused = check_access(host, fields, policy)
    if refused is not None:
        return _refuse(refused)
    route = route_of(path, servers)
    if isinstance(route, Reject):
        return _refuse(route)
    if method not in METHODS:
        return Refuse(405, f"Method {method} not allowed", (("Allow", ", ".join(METHODS)),))
    version = fields.get(VERSION_HEADER)
    if version is not None and version not in LEGACY_VERSIONS:
        return Target(method, route[0], route[1], fields, modern=True)
    return Target(method, route[0], route[1], fields)


def _refuse(reject: Reject) -> Refuse:
    return Refuse(reject.status, reject.reason, reject.headers)


def check_session(target: Target, known: bool, initialize: bool = False) -> Refuse | None:
    """The session id's rules: a POST of ``initialize`` opens a session (it must
    not name one), anything else must name a live one."""
    session_id = target.session_id
    if session_id is None:
        if initialize:
            return None
        return Refuse(400, "Bad Request: no Mcp-Session-Id header (send initialize first)")
    if not known:
        return Refuse(404, "Session not found: it ended or never existed (initialize again)")
    return None


def _media_types(fields: dict[str, str]) -> set[str]:
    accept = fields.get("accept")
    if accept is None:
        return {"*/*"}
    return {part.split(";")[0].strip().lower() for part in accept.split(",")}


def accepts_sse(fields: dict[str, str]) -> bool:
    return bool(_media_types(fields) & {sse.CONTENT_TYPE, "text/*", "*/*"})


def accepts_json(fields: dict[str, str]) -> bool:
    return bool(_media_types(fields) & {"application/json", "application/*", "*/*"})


def choose_mode(fields: dict[str, str], initialize: bool = False) -> bool | Refuse:
    """How to answer a POST that carries requests: True for an SSE stream (the
    client accepts one: it is the only way progress and server requests
    reach it before the answer; :func:`json_first` says whether it is one
    only if something must go first), False for one JSON answer, or 406.
    ``initialize`` is answered in JSON when the client takes it: nothing can
    come before its answer, and the session id goes out only with a success."""
    json = bool(_media_types(fields) & {"application/json", "application/*", "*/*"})
    if initialize and json:
        return False
    if accepts_sse(fields):
        return True
    if json:
        return False
    return Refuse(406, "Not Acceptable: accept application/json or text/event-stream")


@attrs.frozen
class Post:
    """What a POST body holds, as far as the transport must know."""

    requests: tuple[RequestId, ...]  # ids of its requests, in order
    answers: tuple[RequestId, ...]  # ids of its responses (to the server's requests)
    tokens: tuple[Any, ...]  # progress tokens its requests carry
    initialize: bool  # it is an initialize request
    batch: bool
    # ids of the client's requests its notifications/cancelled name (no answer will come)
    cancelled: tuple[RequestId, ...] = ()


def json_first(fields: dict[str, str], post: Post) -> bool:
    """Whether a POST :func:`choose_mode` answers as SSE is answered in JSON
    unless something must go before its answer (:class:`Stream`'s
    ``json_first``): its client accepts JSON too, and it is not a batch
    (whose JSON answer is every answer at once). The spec lets the server
    answer either way; JSON costs the daemon a fifth less per call."""
    return not post.batch and accepts_json(fields)


def read_post(
    body: bytes, limit: int, version: str | None, header: str | None = None
) -> Post | Refuse:
    """Read a POST body (at most ``limit`` bytes: 413) in a session that
    negotiated ``version`` (None: none yet), sent with ``header`` as its
    ``MCP-Protocol-Version`` (None: none, or a legacy version). A body that
    is not JSON, or not a JSON-RPC message, is refused (400) with the
    JSON-RPC error; so is a batch outside 2025-03-26, and a request whose
    ``_meta`` names a version of 2026-07-28 or later (:func:`_header_mismatch`)."""
    if len(body) > limit:
        return too_large(len(body), limit)
    try:
        message = jsonrpc.decode(body)
    except JsonRpcError as exc:
        return Refuse(400, exc.message, code=exc.code)
    batch = type(message) is list
    items: list[Any] = message if batch else [message]
    if batch:
        if version not in BATCH_VERSIONS:
            return Refuse(
                400,
                "JSON-RPC batches are only allowed in protocol version 2025-03-26 "
                f"(this session negotiated {version or 'none yet'})",
            )
        if not items:
            return Refuse(400, "Empty batch")
    requests: list[RequestId] = []
    answers: list[RequestId] = []
    tokens: list[Any] = []
    cancelled: list[RequestId] = []
    initialize = False
    invalid: JsonRpcError | None = None  # (a batch's first item that is no message)
    for item in items:
        try:
            kind = jsonrpc.classify(item)
            if kind is Kind.REQUEST:
                too_long = jsonrpc.long_id(item["id"])
                if too_long is not None:  # (no stream could be keyed to it)
                    raise too_long
        except JsonRpcError as exc:
            if not batch:
                return Refuse(400, exc.message, code=exc.code, id=exc.id)
            # The session answers it in the batch's answer, beside the
            # others' (JSON-RPC 2.0, section 6), as on every transport.
            invalid = invalid or exc
            continue
        if kind is Kind.REQUEST:
            if item["method"] == "initialize":
                if batch:
                    return Refuse(400, "initialize must not be part of a batch", id=item["id"])
                initialize = True
            if any(id_key(item["id"]) == id_key(other) for other in requests):
                return Refuse(400, f"Two requests with id {item['id']!r} in one batch")
            requests.append(item["id"])
            meta = (item.get("params") or {}).get("_meta")
            refused = _header_mismatch(item, meta, header)
            if refused is not None:
                return refused
            token = meta.get("progressToken") if isinstance(meta, dict) else None
            if jsonrpc.is_valid_id(token):
                tokens.append(token)
        elif kind is Kind.RESPONSE and jsonrpc.is_valid_id(item.get("id")):
            answers.append(item["id"])
        elif kind is Kind.NOTIFICATION and item["method"] == "notifications/cancelled":
            params = item.get("params")
            request = params.get("requestId") if isinstance(params, dict) else None
            if jsonrpc.is_valid_id(request):
                cancelled.append(request)
    if invalid is not None and not requests:  # (no answer's stream to carry its error)
        return Refuse(400, invalid.message, code=invalid.code, id=invalid.id)
    return Post(tuple(requests), tuple(answers), tuple(tokens), initialize, batch, tuple(cancelled))


def _header_mismatch(request: Any, meta: Any, header: str | None) -> Refuse | None:
    """A request taken for a legacy one (its ``MCP-Protocol-Version`` absent
    or legacy) whose ``_meta`` says it speaks a later version: the client
    forgot the header that version requires. Refused 400 with -32020, as a
    2026-07-28 server refuses a header the body contradicts, rather than
    answered as a legacy request without a session ("send initialize
    first"), which would send the client the wrong way."""
    said = meta.get(PROTOCOL_VERSION_KEY) if isinstance(meta, dict) else None
    if not isinstance(said, str) or said in LEGACY_VERSIONS:
        return None
    sent = "absent" if header is None else repr(header)
    return Refuse(
        400,
        f"Header mismatch: MCP-Protocol-Version header {sent} (taken as "
        f"{header or DEFAULT_VERSION}) does not match the body's "
        f"{PROTOCOL_VERSION_KEY} {said!r}",
        code=HEADER_MISMATCH,
        id=request["id"],
    )


def content_length(fields: dict[str, str]) -> int | None:
    """A request's declared Content-Length (None: none, or a chunked body;
    the HTTP server refused one that is not a number)."""
    length = fields.get("content-length")
    return int(length) if length is not None and length.isdecimal() else None


def too_large(size: int, limit: int) -> Refuse:
    return Refuse(
        413,
        f"Message too large: {size} bytes or more (the limit is broker.maxMessageBytes = {limit})",
    )


class Overflow(Exception):
    """More is waiting to be written than the session may hold: its client is
    not reading (the session ends, as any session whose queue stays full)."""


@attrs.define(slots=True)
class Event:
    stream: int
    number: int
    data: bytes  # ready to write: an SSE event, or (JSON answer) the message

    @property
    def id(self) -> str:
        return f"{self.stream}-{self.number}"


class Stream:
    """One stream of a session: the GET stream (number 0), or a POST's."""

    # (a plain class: mypyc compiles broker/, and attrs' factories do not mix with it)
    def __init__(self, number: int, sse: bool, json_first: bool = False) -> None:
        self.number = number
        self.sse = sse
        # Not decided yet: JSON if the answer comes first, SSE if anything else
        # does (HttpStreams.add) or the writer asks for it (HttpStreams.as_sse).
        self.json_first = json_first
        self.opening: bytes | None = None  # what an SSE stream decided late opens with
        self.waiting: set[tuple[type, RequestId]] = set()  # answers still due
        self.tokens: list[Any] = []
        self.pending: collections.deque[Event] = collections.deque()
        self.writer: object | None = None  # the HTTP response writing it now, if any
        self.abandoned = False  # a JSON answer whose client left: nobody can get it
        self.kept = 0  # its events in the replay buffer

    @property
    def done(self) -> bool:
        """Every answer it was opened for has been written out."""
        return self.number != STANDALONE and not self.waiting and not self.pending


class HttpStreams:
    """One HTTP session's streams and events (see the module's docstring)."""

    def __init__(self, max_pending_bytes: int, max_pending: int = MAX_PENDING_EVENTS) -> None:
        self.max_pending_bytes = max_pending_bytes
        self.max_pending = max_pending
        self.streams: dict[int, Stream] = {STANDALONE: Stream(STANDALONE, True)}
        self.version: str | None = None  # negotiated, read from the initialize answer
        self.dropped = 0  # events of the standalone stream dropped unwritten
        self.pending_bytes = 0
        self.pending_count = 0
        self._initialize: RequestId | None = None
        self._by_request: dict[tuple[type, RequestId], int] = {}
        self._by_token: dict[tuple[type, RequestId], int] = {}
        self._by_server_request: dict[str, int] = {}
        self._replay: collections.deque[Event] = collections.deque()
        self._replay_bytes = 0
        self._next_stream = 1
        self._next_event = 1

    # -- what clients send --------------------------------------------------

    def open(self, post: Post, sse: bool, json_first: bool = False) -> int | Refuse:
        """A POST's requests open a stream; returns its number (or 400 if one
        of their ids is already in flight in this session). ``json_first``
        (with ``sse``): JSON unless something must go before the answer."""
        for request in post.requests:
            if id_key(request) in self._by_request:
                return Refuse(
                    400, f"Invalid Request: id {request!r} is already in use by a request in flight"
                )
        number = self._next_stream
        self._next_stream += 1
        stream = Stream(number, sse and not json_first, sse and json_first)
        for request in post.requests:
            stream.waiting.add(id_key(request))
            self._by_request[id_key(request)] = number
        for token in post.tokens:
            stream.tokens.append(id_key(token))
            self._by_token[id_key(token)] = number
        if post.initialize:
            self._initialize = post.requests[0]
        self.streams[number] = stream
        return number

    def answered(self, post: Post) -> list[int]:
        """The client answered requests of the server's (in ``post``), or
        cancelled its own: those get no answer (MCP's cancellation), so they
        are struck off their streams, which end if nothing else is due, and
        their ids are free again. Returns the streams that changed."""
        for answer in post.answers:
            if isinstance(answer, str):
                self._by_server_request.pop(answer, None)
        changed = []
        for request in post.cancelled:
            key = id_key(request)
            number = self._by_request.pop(key, None)
            stream = self.streams.get(number) if number is not None else None
            if stream is not None and key in stream.waiting:
                stream.waiting.discard(key)
                self._tokens_over(stream)
                self._forget_if_over(stream)
                changed.append(stream.number)
        return changed

    # -- what goes to the client --------------------------------------------

    def route(self, message: Any) -> int:
        """The stream a message for the client goes on."""
        if type(message) is Related:
            number = self._usable(self._by_request.get(id_key(message.request)))
            inner = message.message
            if "id" in inner and isinstance(inner["id"], str):
                self._remember_server_request(inner["id"], number)
            return number
        if type(message) is Answer:
            return self._answer_stream(message.id)
        if type(message) is list:
            for item in message:
                if isinstance(item, dict) and jsonrpc.is_valid_id(item.get("id")):
                    key = id_key(item["id"])
                    if key in self._by_request:
                        return self._by_request[key]
            return STANDALONE
        if type(message) is not dict:
            return STANDALONE
        method = message.get("method")
        if method is None:
            id = message.get("id")
            return self._answer_stream(id) if jsonrpc.is_valid_id(id) else STANDALONE
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if method == "notifications/progress":
            token = params.get("progressToken")
            if jsonrpc.is_valid_id(token):
                return self._usable(self._by_token.get(id_key(token)))
            return STANDALONE
        if method == "notifications/cancelled":
            request = params.get("requestId")
            if isinstance(request, str) and request in self._by_server_request:
                return self._usable(self._by_server_request.pop(request))
            return STANDALONE
        if "id" in message or method == "notifications/message":
            # (the upstream could not tell whose: broker/related.py)
            stream = self._sole_open_stream()
            if "id" in message and isinstance(message["id"], str):
                self._remember_server_request(message["id"], stream)
            return stream
        return STANDALONE

    def _answer_stream(self, id: Any) -> int:
        key = id_key(id)
        number = self._by_request.get(key)
        return STANDALONE if number is None else number

    def _usable(self, number: int | None) -> int:
        """``number`` if its stream can carry what belongs to its request
        (an SSE stream not yet answered), else the standalone stream."""
        stream = self.streams.get(number) if number is not None else None
        if stream is None or not (stream.sse or stream.json_first) or not stream.waiting:
            return STANDALONE
        return stream.number

    def _sole_open_stream(self) -> int:
        """A server's request or log message names no client request. When
        exactly one of the session's requests streams is open, the message
        can belong to nothing else (the broker gives a server that asks
        clients things one session at a time: docs/rules/server-requests.md);
        otherwise the standalone stream carries it."""
        found = STANDALONE
        for number, stream in self.streams.items():
            if number != STANDALONE and stream.waiting:
                if found != STANDALONE:
                    return STANDALONE
                found = number
        return self._usable(found) if found != STANDALONE else STANDALONE

    def _remember_server_request(self, id: str, stream: int) -> None:
        if len(self._by_server_request) >= MAX_SERVER_REQUESTS:
            del self._by_server_request[next(iter(self._by_server_request))]
        self._by_server_request[id] = stream

    def add(self, message: Any, data: bytes) -> int | None:
        """Queue a message (``data``: its bytes) on the stream :meth:`route`
        chooses; returns that stream's number, or None if it was dropped (an
        answer whose client left a JSON POST). Raises :class:`Overflow` when
        the session holds too much unwritten."""
        number = self.route(message)
        stream = self.streams[number]
        if number != STANDALONE:
            self._settle(stream, message)
            if stream.json_first:  # JSON if this is its answer, SSE if it goes first
                stream.json_first = False
                if stream.waiting:
                    self._become_sse(stream)
        if stream.abandoned:
            self._forget_if_over(stream)
            return None
        event_number = self._next_event
        self._next_event += 1
        if stream.sse:
            data = sse.event(data, f"{number}-{event_number}")
        stream.pending.append(Event(number, event_number, data))
        self.pending_bytes += len(data)
        self.pending_count += 1
        self._bound()
        return number

    def _settle(self, stream: Stream, message: Any) -> None:
        """An answer for ``stream``: strike its id off (and note the version
        an initialize answer negotiated)."""
        if type(message) is Related:
            return
        items = message if type(message) is list else [message]
        for item in items:
            id = item.id if type(item) is Answer else item.get("id")
            if (type(item) is dict and "method" in item) or not jsonrpc.is_valid_id(id):
                continue
            key = id_key(id)
            if key in stream.waiting:
                stream.waiting.discard(key)
                del self._by_request[key]
                if self._initialize is not None and key == id_key(self._initialize):
                    self._initialize = None
                    result = item.get("result") if type(item) is dict else None
                    version = result.get("protocolVersion") if isinstance(result, dict) else None
                    self.version = version if isinstance(version, str) else None
        self._tokens_over(stream)

    def _tokens_over(self, stream: Stream) -> None:
        """A stream with no answer due: its progress tokens are nobody's now."""
        if not stream.waiting:
            for token in stream.tokens:
                if self._by_token.get(token) == stream.number:
                    del self._by_token[token]
            stream.tokens.clear()

    def as_sse(self, number: int) -> None:
        """Stream ``number``, not decided yet, is to be SSE from now on (its
        writer waited long enough to write a keep-alive comment)."""
        stream = self.streams[number]
        if stream.json_first:
            stream.json_first = False
            self._become_sse(stream)

    def _become_sse(self, stream: Stream) -> None:
        stream.sse = True
        stream.opening = self.priming(stream.number)  # (numbered before what it carries)

    def _bound(self) -> None:
        standalone = self.streams[STANDALONE].pending
        while self.pending_count > self.max_pending or self.pending_bytes > self.max_pending_bytes:
            if not standalone:
                raise Overflow(
                    f"{self.pending_count} events ({self.pending_bytes} bytes) wait to be "
                    f"written (the limits are {self.max_pending} and broker.maxQueuedBytes = "
                    f"{self.max_pending_bytes}): client not reading"
                )
            event = standalone.popleft()
            self.pending_bytes -= len(event.data)
            self.pending_count -= 1
            self.dropped += 1

    # -- writing ------------------------------------------------------------

    def take(self, number: int) -> list[Event]:
        """What stream ``number`` has to write now (kept for replay if it is SSE)."""
        stream = self.streams.get(number)
        if stream is None or not stream.pending:
            return []
        events = list(stream.pending)
        stream.pending.clear()
        for event in events:
            self.pending_bytes -= len(event.data)
            self.pending_count -= 1
            if stream.sse:
                self._keep(stream, event)
        return events

    def _keep(self, stream: Stream, event: Event) -> None:
        self._replay.append(event)
        self._replay_bytes += len(event.data)
        stream.kept += 1
        while len(self._replay) > REPLAY_EVENTS or self._replay_bytes > REPLAY_BYTES:
            old = self._replay.popleft()
            self._replay_bytes -= len(old.data)
            owner = self.streams.get(old.stream)
            if owner is not None:
                owner.kept -= 1
                self._forget_if_over(owner)

    def done(self, number: int) -> bool:
        """Whether stream ``number`` has nothing more to write, ever (or is gone)."""
        stream = self.streams.get(number)
        return stream is None or stream.done

    def attach(self, number: int, writer: object) -> object | None:
        """``writer`` (an HTTP response) writes stream ``number`` from now on;
        returns the one it replaces (which should stop), if any."""
        stream = self.streams[number]
        previous, stream.writer = stream.writer, writer
        return previous

    def writer_of(self, number: int) -> object | None:
        stream = self.streams.get(number)
        return stream.writer if stream is not None else None

    def detach(self, number: int, writer: object) -> None:
        """``writer`` stopped writing stream ``number`` (it ended, or its client
        left). A JSON answer not yet given can then never be: it is dropped
        when it comes."""
        stream = self.streams.get(number)
        if stream is None or stream.writer is not writer:
            return
        stream.writer = None
        if not stream.sse and not stream.done:
            stream.json_first = False  # (what belongs to its request goes elsewhere)
            stream.abandoned = True
            self.pending_bytes -= sum(len(event.data) for event in stream.pending)
            self.pending_count -= len(stream.pending)
            stream.pending.clear()
        self._forget_if_over(stream)

    def _forget_if_over(self, stream: Stream) -> None:
        if stream.number == STANDALONE or stream.writer is not None or stream.kept:
            return
        if stream.done or (stream.abandoned and not stream.waiting):
            del self.streams[stream.number]

    def resume(self, last_event_id: str) -> tuple[int, list[Event]] | Refuse:
        """A GET with ``Last-Event-ID``: the stream that event was on, and its
        events after it that are still held (then :meth:`take` goes on)."""
        stream_text, _, event_text = last_event_id.partition("-")
        if not (stream_text.isdigit() and event_text.isdigit()):
            return Refuse(400, f"Last-Event-ID {last_event_id!r} is not one of this session's")
        number, after = int(stream_text), int(event_text)
        stream = self.streams.get(number)
        if stream is None or not stream.sse:
            return Refuse(
                400, f"Last-Event-ID {last_event_id!r}: that stream is over and no longer held"
            )
        return number, [e for e in self._replay if e.stream == number and e.number > after]

    def priming(self, number: int) -> bytes | None:
        """The event that opens stream ``number`` (MCP 2025-11-25: an id a
        client can resume from before any message came), for clients of that
        version; None for older ones (whose SDKs took empty data for an error)."""
        if self.version not in PRIMING_VERSIONS:
            return None
        event_number = self._next_event
        self._next_event += 1
        return sse.priming(f"{number}-{event_number}", RETRY_MS)


def encode(message: Any) -> bytes:
    """One message's bytes (an answer passed on unparsed keeps the server's)."""
    if type(message) is Answer:
        return message.encode()
    return frames.encode(message.message if type(message) is Related else message)
