"""A server reached by HTTP (``"url": "http://..."`` or ``"https://..."``):
Streamable HTTP, or the older HTTP+SSE (the rules: broker/wire/http_upstream.py).

One ``httpx2.AsyncClient`` per link (its connections, kept alive between
POSTs, on actors/links/http_pool.py's stack), SSE parsed by httpx2's own
``EventSource`` (the parser of httpx-sse, which the official SDK uses too).

**Writing never waits.** :meth:`HttpLink.send_nowait` puts each message (a
*unit*: its bytes, and what the link must know of it) in one of two bounded
lanes and returns what they cannot take, like the WebSocket link; POSTs
happen in the link's own tasks. Requests go in the request lane, served by
:data:`MAX_STREAMS` tasks (a request's POST stays open while its SSE stream
runs, so this bounds the connections); notifications and answers to the
server's requests in the notice lane, served by a few tasks of their own, so
that a client's answer to a sampling request never waits behind the calls
that wait for it. What comes back (a POST's JSON body, its stream's events,
the GET stream's) is handed to :meth:`HttpLink.receive` in order per stream.

**Whose request it is.** A message with a ``method`` that comes on a POST's
stream is handed up as ``OnStream(frame, request)``: a request of the
server's there belongs to the session whose request that POST carried
(docs/rules/server-requests.md). The GET stream's messages are plain frames.

**Failures.** A POST answered with an error status (or that ends without its
answer and cannot be polled again) fails that one request: ``Failed(id,
detail)``, and its caller gets an error naming the server. A connection that
fails (refused, reset, a timeout connecting or writing), or a legacy stream
that ends, ends the link: the Upstream fails what is in flight, naming the
server, and connects again (a new session, initialized afresh) with backoff.
Reading has no timeout: a request's deadline is the Upstream's, and when the
broker cancels a request the link closes that request's stream.

**An expired session** (a 404 to a request that carried the session id) is
opened again inside the link (:meth:`HttpLink._renew`): the initialize again,
then the POST that met the 404, once; ``Renewed`` tells the rules to ask the
new session for what the old one held (subscriptions, the log level).

**Closing** DELETEs the session (bounded, shielded), then closes the pool.

**A modern server** (2026-07-28; the rules: broker/wire/http_upstream_modern.py,
docs/eras.md "A modern server by URL"): while the Upstream says the
connection speaks a modern version (:meth:`HttpLink.speak`: the probe's,
then the server's), each request is its own POST with the headers mirroring
its body, sent at once (no initialize, no session, no GET stream, no
DELETE); its stream's messages go up as plain frames, as from stdio;
cancelling it closes its stream (no ``notifications/cancelled`` is POSTed).
The era is the Upstream's word, never read from a request's ``_meta``. An
initialize refused with a 4xx and a JSON-RPC error that is no modern
server's sign has the link ask ``server/discover`` before it falls back
(:meth:`HttpLink._modern_only`).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx2
import orjson
import trio

from actors.errors import TransportClosed
from actors.links.http_pool import StackTransport
from actors.links.http_redirects import SameOriginRedirects, final_url, redirect_note
from actors.links.link import LaunchError, LinkContext, configured_headers
from actors.links.sse_budget import OverBudget, StreamBudget
from broker import oauth as oauth_rules
from broker.config import ServerConfig
from broker.eras.probe import discover_request
from broker.eras.versions import LATEST_MODERN_VERSION
from broker.jsonrpc import Message
from broker.redact import shown_url
from broker.wire import http_upstream as rules
from broker.wire import http_upstream_modern as modern_rules
from broker.wire.frames import KEPT_ENDS, Failed, LinkFrame, OnStream, Oversize, Renewed

MAX_STREAMS = 64  # requests whose POST is open at once (each holds a connection)
NOTICE_TASKS = 4  # POSTs of notifications and answers at once
LANE_SIZE = 64  # units waiting in each lane (more wait in the Upstream's backlog)
FRAMES_SIZE = 64  # batches of frames waiting for the Upstream's reader
CONNECT_TIMEOUT = 10.0
WRITE_TIMEOUT = 30.0
CLOSE_TIMEOUT = 2.0
RECONNECT_DELAY = 1.0  # before polling a stream again when the server gave no retry
# The least wait before a poll, whatever ``retry`` the server gave (0: the
# daemon polled a thousand times a second).
MIN_RETRY = 0.25
MAX_GET_BACKOFF = 30.0  # the longest wait between polls of a GET stream refused (a 503)
MAX_RESUMES = 100  # polls in a row that bring nothing new before a POST's stream is failed
HARD_LIMIT_FACTOR = 4  # past this many times maxMessageBytes, a message is not read at all
# What a link's SSE streams may hold in unfinished events at once, in all,
# in maxMessageBytes (actors/links/sse_budget.py): two events at the hard
# limit, eight at the message limit.
BUDGET_FACTOR = 8
ERROR_BODY = 200  # characters of an error answer's body kept for the message
# What httpx2 raises when the server or the connection fails us (a bug of
# ours, such as a closed client, is not among them).
HTTP_ERRORS = (httpx2.HTTPError, httpx2.StreamError)
# What breaks one response's body after its head came (a connection lost in
# mid-read, bad framing, an SSE event past the limit): on a modern POST, that
# request's failure, never the link's (a request of a legacy session's breaks
# the session's, so there it ends the link).
STREAM_ERRORS = (httpx2.ReadError, httpx2.RemoteProtocolError, httpx2.SSEError)
# The link's own server/discover, for a server that refused the initialize
# (_modern_only), and how long it waits for its answer (the Upstream's probe's).
DISCOVER_ID = "mcpbroker-http-discover"
DISCOVER_TIMEOUT = 5.0
# How long a notification's or an answer's POST may take (a server answers
# it 202 at once; nothing else bounds it: no caller waits for it), and a
# new session (its initialize and notifications/initialized).
NOTICE_TIMEOUT = 30.0
RENEW_TIMEOUT = 30.0


class Unit(bytes):
    """One message's body, and what the link must know of it."""

    id: Any = None  # a request's id (None: a notification or an answer)
    method: str | None = None
    cancels: Any = None  # a notifications/cancelled's requestId
    modern: dict[str, str] | None = None  # a 2026-07-28 request's headers (its own POST)
    lists_tools: bool | None = None  # a modern tools/list: whether it lists afresh


class _Ended(Exception):
    """The link is over (``str(exc)`` says why, for the Upstream's log line)."""


class HttpLink:
    def __init__(
        self, url: str, mode: str, headers: dict[str, str], context: LinkContext, name: str = ""
    ) -> None:
        self.info: Mapping[str, Any] = {"url": shown_url(url)}  # (no secrets: broker/redact.py)
        self._name = name  # the server's in the config (what `mcpbroker auth` takes)
        self._url = url
        self._mode = mode  # rules.STREAMABLE, rules.SSE or rules.DETECT (until it is known)
        self._headers = headers
        self._max = context.max_message_bytes
        self._budget = StreamBudget(self._max * BUDGET_FACTOR)
        self._log = context.log
        self._client: httpx2.AsyncClient | None = None
        self._endpoint = url  # where POSTs go (HTTP+SSE: the endpoint event's)
        self._parsed = (url, httpx2.URL(url))  # _endpoint, parsed
        self._session_id: str | None = None
        self._version: str | None = None
        self._last_event_id: str | None = None  # the GET stream's
        self._initialize: Unit | None = None  # the Upstream's, sent again for a new session
        self._renewing = trio.Lock()
        self._requests_send, self._requests = trio.open_memory_channel[Unit](LANE_SIZE)
        self._notices_send, self._notices = trio.open_memory_channel[Unit](LANE_SIZE)
        self._frames_send, self._frames = trio.open_memory_channel[list[LinkFrame]](FRAMES_SIZE)
        self._initialized = trio.Event()  # notifications/initialized went: requests may follow
        self._streams: dict[Any, trio.CancelScope] = {}  # request id -> its POST's scope
        # The 2026-07-28 revision (docs/eras.md, "A modern server by URL").
        self._era: str | None = None  # the modern version requests go in (None: legacy)
        self._params = modern_rules.ParamHeaders()  # tools' Mcp-Param-* marks
        self._modern: set[Any] = set()  # modern requests not yet answered
        self._withdrawn: set[Any] = set()  # of those, cancelled before their POST
        self._relists = 0  # the link's own tools/list, after a HeaderMismatch
        self._why: str | None = None  # why the link ended
        self._tasks: trio.Nursery | None = None
        self._closing = trio.Event()
        self._closed = trio.Event()

    # -- the Link interface ---------------------------------------------------

    def speak(self, version: str | None) -> None:
        if version is None and self._era is not None:
            # Legacy from now on (the probe expired or was refused): the
            # modern requests left (the probe's) are given up as a modern
            # server is told so: their streams are closed (else one held a
            # request task, a connection and the server's handler for good).
            for request in list(self._modern):
                scope = self._streams.get(request)
                if scope is not None:
                    scope.cancel()
                else:
                    self._withdrawn.add(request)  # (its POST has not begun)
        self._era = version

    def encode(self, messages: list[Message]) -> list[bytes]:
        units: list[bytes] = []
        for message in messages:
            unit = Unit(orjson.dumps(message))
            method = message.get("method")
            unit.method = method if isinstance(method, str) else None
            if unit.method is not None and "id" in message:
                unit.id = message["id"]
                if self._era is not None:
                    self._modern_unit(unit, message, self._era)
            elif unit.method == "notifications/cancelled":
                params = message.get("params")
                unit.cancels = params.get("requestId") if isinstance(params, dict) else None
            units.append(unit)
        return units

    def send_nowait(self, units: list[bytes]) -> list[bytes]:
        if self._why is not None:
            raise TransportClosed(self._why)
        for i, unit in enumerate(units):
            assert isinstance(unit, Unit)
            if self._cancelling(unit):
                continue
            try:
                self._lane(unit).send_nowait(unit)
            except trio.WouldBlock:
                return units[i:]
        return []

    async def send(self, units: list[bytes]) -> None:
        for unit in units:
            assert isinstance(unit, Unit)
            if self._why is not None:
                raise TransportClosed(self._why)
            if not self._cancelling(unit):
                await self._lane(unit).send(unit)

    async def receive(self) -> list[LinkFrame]:
        try:
            return await self._frames.receive()
        except trio.EndOfChannel:
            return []

    async def ended(self) -> str:
        return f" ({self._why})" if self._why else ""

    async def close(self) -> None:
        self._closing.set()
        with trio.CancelScope(shield=True), trio.move_on_after(2 * CLOSE_TIMEOUT):
            await self._closed.wait()  # (_run bounds its own wait: this is a backstop)

    # -- the link's tasks -------------------------------------------------------

    async def _run(
        self,
        auth: httpx2.Auth | None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The client, its tasks, and the end: a DELETE of the session. An end
        before the link is open is an ``OSError`` (to retry with backoff)."""
        timeout = httpx2.Timeout(CONNECT_TIMEOUT, read=None, write=WRITE_TIMEOUT, pool=None)
        # (no limit on connections to configure: the link's tasks bound how many
        # requests are open at once, and the stack never waits for one:
        # actors/links/http_pool.py)
        started = False
        try:
            transport = SameOriginRedirects(StackTransport())
            # Bodies uncompressed: the SSE budget sees an event's end in the
            # bytes as they come (actors/links/sse_budget.py), and in a gzip
            # stream (a proxy's gzip_types text/event-stream) it never would.
            headers = httpx2.Headers(self._headers)
            headers["accept-encoding"] = "identity"
            async with httpx2.AsyncClient(
                headers=headers, timeout=timeout, transport=transport, auth=auth
            ) as client:
                self._client = client
                try:
                    async with trio.open_nursery() as tasks:
                        self._tasks = tasks
                        if self._mode == rules.SSE:
                            await tasks.start(self._legacy_stream)
                        for _ in range(MAX_STREAMS):
                            tasks.start_soon(self._serve, self._requests)
                        for _ in range(NOTICE_TASKS):
                            tasks.start_soon(self._serve, self._notices)
                        started = True
                        task_status.started()
                        await self._closing.wait()
                        tasks.cancel_scope.cancel()
                except BaseExceptionGroup as group:
                    ended, rest = group.split(_Ended)
                    bugs, rest = rest.split(Exception) if rest is not None else (None, None)
                    if rest is not None:  # (cancelled: the daemon stops)
                        raise rest from None
                    why = str(_first(ended)) if ended is not None else "ended"
                    if bugs is not None:  # a bug of the broker's: this connection only
                        self._log.error("server.link_failed", exc_info=bugs)
                        bug = type(_first(bugs)).__name__
                        why = f"stopped after an internal error of the broker ({bug})"
                    if not started:
                        raise OSError(why) from None
                    self._end(why)
                finally:  # (however it ends: the daemon stopping too)
                    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                        await self._delete_session(client)
        finally:
            self._end(self._why or "closed")
            self._closed.set()

    def _end(self, why: str) -> None:
        """The link is over: the Upstream's reader sees it after what came before."""
        if self._why is None:
            self._why = why
        self._frames_send.close()
        if self._tasks is not None:
            self._tasks.cancel_scope.cancel()

    async def _serve(self, lane: trio.MemoryReceiveChannel[Unit]) -> None:
        notices = lane is self._notices
        async for unit in lane:
            if unit.method != "initialize" and unit.modern is None and not notices:
                await self._initialized.wait()
            try:
                # (a request's deadline is the Upstream's, which cancels it)
                with trio.move_on_after(NOTICE_TIMEOUT if notices else math.inf) as bound:
                    await self._post(unit)
            except HTTP_ERRORS as exc:
                raise _Ended(f"{_describe(exc)} at {shown_url(self._endpoint)}") from exc
            if bound.cancelled_caught:
                self._notice_lost(unit, f"no answer to its POST within {NOTICE_TIMEOUT:g} s")

    def _notice_lost(self, unit: Unit, detail: str) -> None:
        """A notification or an answer the server did not take: logged, and
        the link goes on (one client's cancel costs no other client a
        thing), but for ``notifications/initialized``, without which the
        session never serves a request: that ends the link."""
        if unit.method == "notifications/initialized":
            raise _Ended(f"notifications/initialized was not taken: {detail}")
        self._log.warning("server.message_refused", method=unit.method, detail=detail)

    async def _emit(self, frames: list[LinkFrame]) -> None:
        if frames:
            await self._frames_send.send(frames)

    # -- POST -------------------------------------------------------------------

    async def _post(self, unit: Unit) -> None:
        """One message to the server, and what its answer brings."""
        request = unit.id
        if unit.modern is not None and request in self._withdrawn:
            self._withdrawn.discard(request)  # (cancelled while it waited in the lane)
            self._modern.discard(request)
            return
        with trio.CancelScope() as scope:
            if request is not None:
                self._streams[request] = scope
            try:
                if unit.modern is not None:
                    await self._modern_exchange(unit)
                else:
                    await self._exchange(unit)
            finally:
                if request is not None:
                    self._streams.pop(request, None)
                    self._modern.discard(request)
        if unit.method == "notifications/initialized":
            self._initialized.set()
            if self._mode == rules.STREAMABLE:
                assert self._tasks is not None
                self._tasks.start_soon(self._listen)

    async def _exchange(self, unit: Unit, *, again: bool = False) -> None:
        """POST one message; ``again``: it met a 404 and a new session was opened."""
        assert self._client is not None
        initialize = unit.method == "initialize"
        if initialize:
            self._initialize = unit
        headers = self._request_headers(rules.ACCEPT_POST)
        headers["content-type"] = "application/json"
        async with self._client.stream(
            "POST", self._endpoint_url(), content=unit, headers=headers
        ) as response:
            if initialize and self._mode != rules.SSE:
                self._session_id = _session_of(response) or self._session_id
            outcome = rules.outcome_of(
                response.status_code,
                response.headers.get("content-type", ""),
                has_session=rules.SESSION_HEADER in headers,
                initialize=initialize,
                detecting=self._mode == rules.DETECT,
            )
            if self._mode == rules.SSE:  # (every answer comes on the stream)
                outcome = rules.ACCEPTED if 200 <= response.status_code < 300 else outcome
            if initialize and outcome in (rules.FALLBACK, rules.FAILED):
                body = await _error_body(response)
                refusal = modern_rules.modern_refusal(body, unit.id)
                if refusal is None and 400 <= response.status_code < 500:
                    refusal = await self._modern_only(unit, body)
                if refusal is not None:  # a modern server: the Upstream probes it
                    await self._emit([self._frame(refusal)])
                    return
                refused = _status_text(response, body, self._name)
                if outcome == rules.FAILED:
                    raise _Ended(f"initialize was answered with {refused}")
                await response.aclose()  # (FALLBACK: an initialize's alone)
                await self._fall_back(unit, refused)
                return
            if initialize and self._mode == rules.DETECT:
                self._mode = rules.STREAMABLE
            if outcome == rules.EXPIRED:
                if again and unit.id is None:
                    # (a server that answers 404 to what it does not know,
                    # such as a cancel of a request of the old session)
                    self._notice_lost(unit, "404 Not Found in a new session too")
                    return
                if again:
                    raise _Ended("the server ended a new HTTP session at once: 404 Not Found")
                await response.aclose()
                await self._renew(headers[rules.SESSION_HEADER])
                await self._exchange(unit, again=True)
                return
            if outcome == rules.JSON:
                await self._emit(await self._body(response, unit))
            elif outcome == rules.STREAM:
                await self._stream(response, unit)
            elif outcome == rules.FAILED:
                await self._failed(unit, await _status(response, self._name))
            elif unit.id is not None and self._mode != rules.SSE:
                await self._untyped(response, unit)

    async def _modern_only(self, initialize: Unit, body: bytes) -> bytes | None:
        """An initialize refused with a 4xx whose JSON-RPC error is no modern
        server's sign (the SDK's modern-only handler answers -32602): if
        ``server/discover`` then names only modern versions, the refusal
        such a server gives (-32022 naming them), for the Upstream to open
        it modern; None: not so (an old server: the refusal stands)."""
        refused = modern_rules.error_answer(body, initialize.id)
        if refused is None or self._mode == rules.SSE:
            return None
        probe = discover_request(DISCOVER_ID, LATEST_MODERN_VERSION)
        answer: bytes | None = None
        with trio.move_on_after(DISCOVER_TIMEOUT):
            answer = await self._own_answer(probe, LATEST_MODERN_VERSION)
        versions = None if answer is None else modern_rules.only_modern_versions(answer)
        if versions is None:
            return None
        self._log.info("server.http_modern_only", url=self.info["url"], versions=versions)
        return modern_rules.modern_only_refusal(refused, versions)

    async def _fall_back(self, unit: Unit, refused: str) -> None:
        """An initialize refused as an old server refuses it (``refused``, its
        status in words): HTTP+SSE. If that fails too, the error says both:
        the server's own reason for the refusal is often the one that
        matters (a missing API key), the GET's 405 says only that it is no
        HTTP+SSE server either."""
        self._log.info(
            "server.http_fallback", url=self.info["url"], transport="sse", refused=refused
        )
        self._mode = rules.SSE
        assert self._tasks is not None
        try:
            await self._tasks.start(self._legacy_stream)
        except _Ended as exc:
            raise _Ended(
                f"initialize was answered with {refused}; as an HTTP+SSE server: {exc}"
            ) from None
        await self._exchange(unit)

    async def _failed(self, unit: Unit, detail: str) -> None:
        if unit.method == "initialize":
            raise _Ended(f"initialize was answered with {detail}")
        if unit.id is not None:
            await self._emit([Failed(unit.id, detail)])
        else:
            self._log.warning("server.message_refused", method=unit.method, detail=detail)

    async def _body(self, response: httpx2.Response, unit: Unit) -> list[LinkFrame]:
        """A JSON answer: its message (a batch's or JSON lines', each), unparsed
        if it is one; and the request's failure if it holds no answer to it."""
        body = await self._read_body(response)
        if body is None:
            limit = self._max * HARD_LIMIT_FACTOR
            return [] if unit.id is None else [Failed(unit.id, f"an answer of over {limit} bytes")]
        if initialize_version := self._version_of(unit, body):
            self._version = initialize_version
        messages, problem = rules.json_body(body, unit.id)
        if problem is not None and unit.method == "initialize":
            raise _Ended(f"initialize was answered with {problem}")
        # What came goes on (for the rules to take, or to log: a notification,
        # a bad line); a request no answer came for, its caller is told at once.
        failed: list[LinkFrame] = [] if problem is None else [Failed(unit.id, problem)]
        if problem is not None:
            for message in messages:
                self._answered_elsewhere(message)
        return [self._frame(message) for message in messages] + failed

    async def _read_body(self, response: httpx2.Response) -> bytes | None:
        """A body whole; None if it is past the hard limit (not read on)."""
        limit = self._max * HARD_LIMIT_FACTOR
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def _untyped(self, response: httpx2.Response, unit: Unit) -> None:
        """A request's POST answered 2xx with no body it says it has (no
        ``Content-Type``, or a 202, 204): a body that is its JSON-RPC answer
        is taken (a lenient server's omission, as the SDK's client takes
        it); else the request fails, saying what came."""
        status = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
        body = await self._read_body(response)
        if body is None:
            limit = self._max * HARD_LIMIT_FACTOR
            await self._failed(unit, f"{status} and no Content-Type: a body of over {limit} bytes")
            return
        if not body.strip():
            await self._failed(unit, f"{status} and an empty body: no answer")
            return
        messages, problem = rules.json_body(body, unit.id)
        if problem is not None:
            await self._failed(
                unit, f"{status} and no Content-Type: no answer in its body ({problem})"
            )
            return
        if initialize_version := self._version_of(unit, body):
            self._version = initialize_version
        await self._emit([self._frame(message) for message in messages])

    async def _stream(self, response: httpx2.Response, unit: Unit) -> None:
        """A POST's SSE stream: its messages, related to its request; if it
        ends before the answer and gave event ids, it is polled again (GET,
        ``Last-Event-ID``), as the spec asks."""
        answered, last_id, retry = await self._read_events(response, unit)
        resumes = 0
        while not answered and unit.id is not None:
            if last_id is None or resumes >= MAX_RESUMES:
                await self._failed(unit, "a stream that ended before its answer")
                return
            if not rules.header_safe(last_id):
                unsent = "its event id cannot go back in a Last-Event-ID header to resume it"
                await self._failed(unit, f"a stream that ended before its answer ({unsent})")
                return
            resumes += 1
            await trio.sleep(max(retry, MIN_RETRY))
            assert self._client is not None
            headers = self._request_headers(rules.ACCEPT_STREAM)
            headers[rules.LAST_EVENT_HEADER] = last_id
            async with self._client.stream("GET", self._endpoint, headers=headers) as again:
                if again.status_code == 404 and rules.SESSION_HEADER in headers:
                    await self._renew(headers[rules.SESSION_HEADER])
                    await self._failed(
                        unit,
                        "HTTP 404 to a poll of its stream: the session ended before its answer",
                    )
                    return
                if not 200 <= again.status_code < 300:
                    status = await _status(again, self._name)
                    await self._failed(unit, f"a stream cut before its answer ({status} to a poll)")
                    return
                answered, newer, retry = await self._read_events(again, unit, last_id, retry)
                if newer != last_id:  # (it moved on: count only polls that bring nothing)
                    resumes, last_id = 0, newer

    async def _read_events(
        self,
        response: httpx2.Response,
        unit: Unit,
        last_id: str | None = None,
        retry: float = RECONNECT_DELAY,
    ) -> tuple[bool, str | None, float]:
        """Hand on a POST stream's messages; whether its answer came, the last
        event id (``last_id`` until one comes), the delay the server asked for
        before polling again."""
        try:
            async for event in self._events(response):
                if event.id:
                    last_id = event.id
                if event.retry is not None:
                    retry = event.retry / 1000
                if event.event != "message" or not event.data:
                    continue  # (a priming event: an id and no data)
                data = event.data.encode()
                if rules.may_be_request(data):
                    related = unit.id is not None and len(data) <= self._max
                    await self._emit([OnStream(data, unit.id) if related else self._frame(data)])
                    continue
                if version := self._version_of(unit, data):
                    self._version = version
                await self._emit([self._frame(data)])  # (another's: the rules say so)
                problem = rules.not_its_answer(data, unit.id)
                if problem is not None:
                    self._answered_elsewhere(data)
                    await self._failed(unit, problem)
                    return True, last_id, retry  # (its caller is told: no poll)
                # Its answer: the stream is done with (the server SHOULD close
                # it; one left open held one of the link's request tasks for
                # good, and past MAX_STREAMS nothing was sent any more).
                return True, last_id, retry
        except httpx2.SSEError as exc:  # (an event past the limit: this request's alone)
            await self._failed(unit, self._broken(exc))
            return True, last_id, retry
        except httpx2.TransportError as exc:
            if last_id is None:
                if unit.id is None:
                    raise
                raise _Ended(f"{_describe(exc)} at {shown_url(self._endpoint)}") from exc
        return False, last_id, retry

    # -- the 2026-07-28 revision ----------------------------------------------------

    def _modern_unit(self, unit: Unit, message: Message, era: str) -> None:
        """A request while the connection speaks the 2026-07-28 revision goes
        as it has it: its own POST, with the headers mirroring its body
        (broker/wire/http_upstream_modern.py; the version its ``_meta``
        names, which the Upstream stamped: ``era`` if it names none)."""
        version = modern_rules.modern_version(message) or era
        unit.modern = modern_rules.modern_headers(message, version, self._params)
        if unit.method == "tools/list":
            unit.lists_tools = modern_rules.is_tools_list_start(message)
        self._modern.add(unit.id)

    async def _modern_exchange(self, unit: Unit, *, again: bool = False) -> None:
        """POST one modern request: no session id, no resuming; an error
        status with a JSON-RPC error is its answer, anything else fails it.
        A call refused with ``HeaderMismatch`` goes once more if listing the
        tools again changed its ``Mcp-Param-*`` headers (``again``: it is that)."""
        assert self._client is not None and unit.modern is not None
        if self._mode == rules.SSE:  # (the probe of a "type": "sse" server)
            await self._failed(unit, "HTTP+SSE has no 2026-07-28 revision")
            return
        headers = {"accept": rules.ACCEPT_POST, "content-type": "application/json", **unit.modern}
        answer: bytes | None = None  # (an error status's JSON-RPC error)
        async with self._client.stream(
            "POST", self._endpoint, content=unit, headers=headers
        ) as response:
            status = response.status_code
            media = response.headers.get("content-type", "").partition(";")[0].strip().lower()
            if 200 <= status < 300 and media == "application/json":
                try:
                    frames = await self._body(response, unit)
                except STREAM_ERRORS as exc:  # (this request's alone: there is no session)
                    await self._failed(unit, f"an answer that broke off ({_describe(exc)})")
                    return
                if unit.lists_tools is not None and len(frames) == 1 and type(frames[0]) is bytes:
                    frames = [self._learnt(frames[0], unit.lists_tools)]
                await self._emit(frames)
            elif 200 <= status < 300 and media == "text/event-stream":
                await self._modern_events(response, unit)
            else:
                body = await _error_body(response)
                answer = modern_rules.error_answer(body, unit.id)
                if answer is None:
                    await self._failed(unit, _status_text(response, body, self._name))
                    return
        if answer is not None:  # (out of the first POST: its connection is free)
            mismatch = unit.method == "tools/call" and modern_rules.is_header_mismatch(answer)
            retry = await self._remarked(unit) if mismatch and not again else None
            if retry is not None:
                await self._modern_exchange(retry, again=True)
            else:
                await self._emit([self._frame(answer)])

    async def _remarked(self, unit: Unit) -> Unit | None:
        """A call the server refused with ``HeaderMismatch``: list its tools
        again (the spec's advice), and the call with the headers the marks
        give now; None if they give the same (or the list failed)."""
        assert unit.modern is not None
        call = orjson.loads(bytes(unit))  # (orjson reads no subclass of bytes)
        version = unit.modern[rules.VERSION_HEADER]
        cursor: str | None = None
        for page in range(modern_rules.MAX_RELIST_PAGES):
            self._relists += 1
            own = modern_rules.relist_request(call, f"mcpbroker-relist-{self._relists}", cursor)
            listed = await self._own_answer(own, version)
            if listed is None:
                return None
            self._params.learn(listed, first_page=page == 0)
            cursor = modern_rules.next_cursor(listed)
            if cursor is None:
                break
        headers = modern_rules.modern_headers(call, version, self._params)
        if headers == unit.modern:
            return None
        self._log.info("server.tool_marks_changed", tool=call["params"].get("name"))
        retry = Unit(unit)
        retry.id, retry.method, retry.modern = unit.id, unit.method, headers
        return retry

    async def _own_answer(self, request: Message, version: str) -> bytes | None:
        """POST one of the link's own modern requests: its answer (JSON or the
        last of an SSE stream), None if it brought none within the size limit
        or its stream broke (it is the link's, for the request it serves: that
        request goes on without it, and the link with it)."""
        try:
            return await self._own_exchange(request, version)
        except STREAM_ERRORS:
            return None

    async def _own_exchange(self, request: Message, version: str) -> bytes | None:
        assert self._client is not None
        headers = {"accept": rules.ACCEPT_POST, "content-type": "application/json"}
        headers.update(modern_rules.modern_headers(request, version, self._params))
        content = orjson.dumps(request)
        async with self._client.stream(
            "POST", self._endpoint, content=content, headers=headers
        ) as response:
            media = response.headers.get("content-type", "").partition(";")[0].strip().lower()
            if not 200 <= response.status_code < 300:
                return None
            if media == "application/json":
                body = b""
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > self._max:
                        return None
                return body
            if media == "text/event-stream":
                async for event in self._events(response, self._max):
                    data = event.data.encode()
                    if event.event == "message" and data and modern_rules.is_answer(data):
                        return data
            return None

    async def _modern_events(self, response: httpx2.Response, unit: Unit) -> None:
        """A modern POST's SSE stream: its notifications (a listen's: for as
        long as it lasts), then its answer, as plain frames (the stdio link's
        shape: a modern server sends no requests). A stream that ends or
        breaks before its answer fails the request (the Upstream opens a
        listen again: broker/eras/subscriptions.py)."""
        try:
            async for event in self._events(response):
                if event.event != "message" or not event.data:
                    continue  # (a priming event, a keep-alive)
                data = event.data.encode()
                if not modern_rules.is_answer(data):
                    await self._emit([self._frame(data)])
                    continue
                problem = rules.not_its_answer(data, unit.id)
                if problem is None and unit.lists_tools is not None and len(data) <= self._max:
                    data = self._learnt(data, unit.lists_tools)
                await self._emit([self._frame(data)])
                if problem is not None:
                    await self._failed(unit, problem)
                return  # (the answer ends the stream: closing it is no cancellation now)
        except STREAM_ERRORS as exc:  # (this request's alone: there is no session)
            await self._failed(unit, self._broken(exc))
            return
        await self._failed(unit, "a stream that ended before its answer")

    def _broken(self, exc: Exception) -> str:
        """Why a request's SSE stream failed it, in words that follow
        "answered with" (an SSEError: an event past the hard limit, the
        content type being checked before the stream is read)."""
        if isinstance(exc, OverBudget):
            budget = f"{BUDGET_FACTOR} x broker.maxMessageBytes"
            return (
                f"an SSE event that took its streams past {self._budget.limit} bytes "
                f"of unfinished events at once ({budget})"
            )
        if isinstance(exc, httpx2.SSEError):
            limit = self._max * HARD_LIMIT_FACTOR
            factor = f"{HARD_LIMIT_FACTOR} x broker.maxMessageBytes"
            return f"an SSE event of over {limit} bytes ({factor})"
        return f"a stream that broke off ({_describe(exc)})"

    def _learnt(self, answer: bytes, first_page: bool) -> bytes:
        """A modern ``tools/list`` answer: its ``x-mcp-header`` marks learnt,
        and without the tools whose marks are invalid (the spec's rule for a
        client over Streamable HTTP), each said in the log."""
        learnt = self._params.learn(answer, first_page=first_page)
        for name in learnt.dropped:
            self._log.warning(
                "server.tool_rejected",
                tool=name,
                reason="invalid x-mcp-header marks in its inputSchema",
            )
        return learnt.answer

    # -- a new session --------------------------------------------------------------

    async def _renew(self, stale: str) -> None:
        """The server ended the session (a 404 to ``stale``, its id): open a new
        one, as the spec asks: the Upstream's initialize again, without the
        id, then ``notifications/initialized``. Every task that met the 404
        waits for one renewal, then POSTs again with the new id. What the
        server held for the broker is asked again (``Renewed``); what was in
        flight in the old session is lost with it (its streams end)."""
        async with self._renewing:
            if self._session_id != stale:
                return  # (another task met the 404 first)
            if self._initialize is None:
                raise _Ended("the server ended the HTTP session before its initialize")
            with trio.move_on_after(RENEW_TIMEOUT):
                await self._open_anew()
                return
            raise _Ended(f"a new HTTP session was not opened within {RENEW_TIMEOUT:g} s")

    async def _open_anew(self) -> None:
        """The new session of :meth:`_renew`."""
        assert self._initialize is not None
        self._log.info("server.http_session_renewed")
        answer, session_id = await self._reinitialize(self._initialize)
        if not _is_result(answer):
            detail = answer[:ERROR_BODY].decode(errors="replace")
            raise _Ended(f"a new HTTP session was refused ({detail})")
        self._session_id = session_id
        self._version = self._version_of(self._initialize, answer) or self._version
        self._last_event_id = None  # (the old session's: the GET stream opens afresh)
        notice = Unit(orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        notice.method = "notifications/initialized"
        await self._exchange(notice, again=True)
        await self._emit([Renewed()])

    async def _reinitialize(self, initialize: Unit) -> tuple[bytes, str | None]:
        """POST the initialize with no session id: its answer, and the new id."""
        assert self._client is not None
        headers = {"accept": rules.ACCEPT_POST, "content-type": "application/json"}
        async with self._client.stream(
            "POST", self._endpoint, content=initialize, headers=headers
        ) as response:
            session_id = _session_of(response)
            media = response.headers.get("content-type", "")
            outcome = rules.outcome_of(
                response.status_code, media, has_session=False, initialize=True, detecting=False
            )
            if outcome == rules.JSON:
                return await response.aread(), session_id
            if outcome == rules.STREAM:
                async for event in self._events(response):
                    data = event.data.encode()
                    if event.event == "message" and data and not rules.may_be_request(data):
                        return data, session_id
                # (its body is read: there is no status to tell of)
                raise _Ended(
                    "a new HTTP session was refused (its initialize's stream ended "
                    "without an answer)"
                )
            raise _Ended(f"a new HTTP session was refused ({await _status(response, self._name)})")

    # -- the GET stream -----------------------------------------------------------

    async def _listen(self) -> None:
        """Streamable HTTP's GET stream: the server's messages unrelated to any
        request. Polled again when it ends (``Last-Event-ID``; a plain GET
        after a resumption that brought nothing: the server has nothing
        after that id, or no longer knows it); none if the server offers
        none (405)."""
        assert self._client is not None
        renewed = False  # (this GET's session was opened for it: a 404 again is no expiry)
        refusals = 0  # polls refused in a row (a 503: each waits twice as long)
        while True:
            headers = self._request_headers(rules.ACCEPT_STREAM)
            resuming = self._last_event_id
            if resuming is not None:
                headers[rules.LAST_EVENT_HEADER] = resuming
            retry = RECONNECT_DELAY
            try:
                async with self._client.stream("GET", self._endpoint, headers=headers) as response:
                    status = response.status_code
                    if status == 404 and rules.SESSION_HEADER in headers and not renewed:
                        await self._renew(headers[rules.SESSION_HEADER])
                        self._last_event_id = None  # (the old session's)
                        renewed = True  # (a 404 to a new session's GET: it has none)
                        continue
                    kind = response.headers.get("content-type", "")
                    if not 200 <= status < 300:
                        refused = rules.poll_refused(status, resuming=resuming is not None)
                        if refused == rules.NO_GET_STREAM:
                            if status != 405:
                                self._log.info("server.no_get_stream", status=status, type=kind)
                            return
                        if refused == rules.POLL_AFRESH:
                            self._last_event_id = None
                        refusals += 1
                        retry = min(RECONNECT_DELAY * 2 ** (refusals - 1), MAX_GET_BACKOFF)
                        self._log.info("server.get_stream_refused", status=status, retry=retry)
                    elif not kind.startswith(rules.ACCEPT_STREAM):
                        self._log.info("server.no_get_stream", status=status, type=kind)
                        return
                    else:
                        renewed, refusals = False, 0
                        retry = await self._listened(response, resuming)
            except STREAM_ERRORS as exc:  # (an event past the limit too: not the link's end)
                self._log.info("server.get_stream_broken", error=_describe(exc))
            except HTTP_ERRORS as exc:
                raise _Ended(f"{_describe(exc)} at {shown_url(self._endpoint)}") from exc
            await trio.sleep(max(retry, MIN_RETRY))

    async def _listened(self, response: httpx2.Response, resuming: str | None) -> float:
        """Hand on the GET stream's messages until it ends; the delay the
        server asked for before polling again. A resumption (from the id
        ``resuming``) that brought nothing (no message, no newer id) leaves
        no id: the next poll is a plain GET."""
        retry = RECONNECT_DELAY
        brought = False  # (a message came on it)
        async for event in self._events(response):
            if event.id:  # (one that cannot be sent back: poll afresh)
                self._last_event_id = event.id if rules.header_safe(event.id) else None
            if event.retry is not None:
                retry = event.retry / 1000
            if event.event == "message" and event.data:
                brought = True
                data = event.data.encode()
                if not rules.may_be_request(data):  # (an answer: a resumed stream's)
                    self._answered_elsewhere(data)
                await self._emit([self._frame(data)])
        if resuming is not None and not brought and self._last_event_id == resuming:
            self._last_event_id = None  # (nothing after it: a plain GET next)
        return retry

    async def _legacy_stream(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """HTTP+SSE: the one stream, whose first event says where to POST.
        Its end is the link's end (the old transport cannot resume)."""
        assert self._client is not None
        started = False
        try:
            headers = self._request_headers(rules.ACCEPT_STREAM)
            async with self._client.stream("GET", self._url, headers=headers) as response:
                if not 200 <= response.status_code < 300:
                    status = await _status(response, self._name)
                    raise _Ended(f"GET {self.info['url']} was answered with {status}")
                async for event in self._events(response):
                    if not started:
                        if event.event != "endpoint":
                            continue  # (a `retry:`, a ping: skipped, as the SDK's client does)
                        came_from = str(final_url(response))  # (a redirect's target)
                        self._endpoint = urljoin(came_from, event.data.strip())
                        if urlsplit(self._endpoint)[:2] != urlsplit(self._url)[:2]:
                            elsewhere = shown_url(self._endpoint)
                            raise _Ended(f"its endpoint {elsewhere} is on another origin")
                        started = True
                        task_status.started()
                    elif event.event == "message" and event.data:
                        await self._emit([self._frame(event.data.encode())])
        except HTTP_ERRORS as exc:
            raise _Ended(f"{_describe(exc)} at {self.info['url']}") from exc
        raise _Ended("the server closed its SSE stream")

    # -- helpers --------------------------------------------------------------------

    def _request_headers(self, accept: str) -> dict[str, str]:
        headers = {"accept": accept}
        if self._session_id is not None:
            headers[rules.SESSION_HEADER] = self._session_id
        if self._version is not None and self._mode == rules.STREAMABLE:
            headers[rules.VERSION_HEADER] = self._version
        return headers

    def _events(
        self, response: httpx2.Response, limit: int | None = None
    ) -> AsyncIterator[httpx2.ServerSentEvent]:
        """A stream's events, each at most ``limit`` bytes (the hard limit if
        None), within the link's budget (:data:`BUDGET_FACTOR`)."""
        return self._budget.events(response, limit or self._max * HARD_LIMIT_FACTOR)

    def _endpoint_url(self) -> httpx2.URL:
        """Where POSTs go, parsed once (httpx2 parses a string on every request)."""
        if self._parsed[0] is not self._endpoint:
            self._parsed = (self._endpoint, httpx2.URL(self._endpoint))
        return self._parsed[1]

    def _lane(self, unit: Unit) -> trio.MemorySendChannel[Unit]:
        return self._notices_send if unit.id is None else self._requests_send

    def _cancelling(self, unit: Unit) -> bool:
        """A cancellation on its way: close the stream of the request it cancels
        (a legacy server is told by the notification: a closed stream alone is
        not a cancellation). True: the unit is not to be sent: at a modern
        server closing the stream *is* the cancellation, and the revision
        has no notification from the client over HTTP."""
        if unit.cancels is not None:
            scope = self._streams.get(unit.cancels)
            if scope is not None:
                scope.cancel()
            elif unit.cancels in self._modern:
                self._withdrawn.add(unit.cancels)  # (its POST has not begun)
        return self._era is not None and unit.id is None

    def _answered_elsewhere(self, data: bytes) -> None:
        """An answer that came elsewhere than on its request's POST stream
        (the GET stream, another request's stream or body): that stream has
        nothing more to give, so it is closed, as when its answer comes on it
        (one left open held one of the link's request tasks for good: past
        MAX_STREAMS, nothing more was POSTed). Not on the hot path: the
        usual answer comes on its own stream."""
        for id in rules.answer_ids(data):
            scope = self._streams.get(id)
            if scope is not None:
                scope.cancel()

    def _frame(self, data: bytes) -> LinkFrame:
        if len(data) <= self._max:
            return data
        return Oversize(len(data), data[:KEPT_ENDS], data[-KEPT_ENDS:])

    def _version_of(self, unit: Unit, data: bytes) -> str | None:
        """The protocol version the initialize's answer chose (sent from then on)."""
        if unit.method != "initialize":
            return None
        try:
            version = orjson.loads(data)["result"]["protocolVersion"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None
        # (one HTTP cannot carry is no version the broker speaks: the
        # Upstream refuses it, naming it)
        return version if isinstance(version, str) and rules.header_safe(version) else None

    async def _delete_session(self, client: httpx2.AsyncClient) -> None:
        """End the server's session (the spec asks it of a client that leaves)."""
        if self._session_id is None or self._mode != rules.STREAMABLE:
            return
        try:
            response = await client.delete(self._endpoint, headers=self._request_headers("*/*"))
        except httpx2.TransportError:
            return  # (gone already)
        if response.status_code not in (200, 202, 204, 404, 405):
            self._log.info("server.session_delete_refused", status=response.status_code)


async def launch_http(
    config: ServerConfig, context: LinkContext, auth: httpx2.Auth | None = None, name: str = ""
) -> HttpLink:
    """Open a link to an HTTP server as configured (``name``: the server's, in
    its errors). ``auth`` is where OAuth (or any ``httpx2.Auth``) goes: every
    request of the link passes through it.

    Nothing is sent before the Upstream's initialize but, for ``"type": "sse"``,
    the GET that opens the stream (a refused connection is an ``OSError`` to
    retry with backoff, like a process that could not start)."""
    url = config.url or ""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise LaunchError(f"has a url that is not a valid http(s):// URL ({shown_url(url)})")
    try:
        mode = rules.mode_of(config.type)
    except ValueError as exc:
        raise LaunchError(f"has {exc}") from None
    link = HttpLink(url, mode, configured_headers(config.headers), context, name)
    await context.nursery.start(link._run, auth)
    return link


async def _status(response: httpx2.Response, name: str = "") -> str:
    """``HTTP 500 Internal Server Error``, and the start of the body if it
    says more (read only so far: a server's error page is not held whole)."""
    return _status_text(response, await _error_body(response), name)


def _status_text(response: httpx2.Response, body: bytes, name: str = "") -> str:
    """An error status in words; for a 401, or a 403 ``insufficient_scope``
    (the token lacks a scope: RFC 6750 section 3.1), what the user runs
    (``mcpbroker auth NAME``: docs/oauth.md)."""
    text = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
    text += redirect_note(response)
    run = f"`mcpbroker auth {name}`" if name else "`mcpbroker auth` with this server's name"
    if response.status_code == 401:
        text += f" (it asks for authorization: run {run})"
    elif response.status_code == 403:
        challenge = oauth_rules.parse_challenge(response.headers.get("www-authenticate"))
        if challenge.error == oauth_rules.INSUFFICIENT_SCOPE:
            scope = oauth_rules.challenged_scope(challenge)
            scope_of = f", scope {scope!r}" if scope else ""
            text += f" (it asks for more authorization than its grant has{scope_of}: run {run})"
    said = body[:ERROR_BODY].decode(errors="replace").strip()
    return f"{text}: {said}" if said else text


async def _error_body(response: httpx2.Response) -> bytes:
    """The start of an error status's body (enough for a JSON-RPC error)."""
    chunks, size = [], 0
    try:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > modern_rules.MAX_ERROR_BODY:
                break
    except httpx2.HTTPError:
        pass  # (what came is what there is)
    return b"".join(chunks)[: modern_rules.MAX_ERROR_BODY]


def _session_of(response: httpx2.Response) -> str | None:
    """The ``Mcp-Session-Id`` a response gives (None: none); one that is not
    visible ASCII, as the spec requires, cannot be sent back: that ends the
    link, saying so (its value is not shown: it is the session's secret)."""
    session_id = response.headers.get(rules.SESSION_HEADER)
    if session_id is not None and not rules.is_session_id(session_id):
        raise _Ended(
            "the server gave an Mcp-Session-Id that is not visible ASCII "
            "(the spec allows 0x21 to 0x7E only): it cannot be sent back"
        )
    return session_id


def _describe(exc: BaseException) -> str:
    """One place where httpx2's errors become words (as actors/errors.py does)."""
    if isinstance(exc, httpx2.ConnectTimeout):
        return f"no connection within {CONNECT_TIMEOUT:g} s"
    if isinstance(exc, httpx2.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    if isinstance(exc, httpx2.ConnectError):
        return f"could not connect ({exc or 'refused'})"
    if isinstance(exc, httpx2.LocalProtocolError):
        # (its words quote what could not be sent: a header's value, a token)
        return "could not send a request (LocalProtocolError: a header value HTTP does not allow)"
    return (
        f"connection lost ({type(exc).__name__}: {exc})"
        if str(exc)
        else f"connection lost ({type(exc).__name__})"
    )


def _is_result(answer: bytes) -> bool:
    try:
        message = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return False
    return isinstance(message, dict) and "result" in message


def _first(group: BaseException) -> BaseException:
    while isinstance(group, BaseExceptionGroup) and group.exceptions:
        group = group.exceptions[0]
    return group
