"""The HTTP link (actors/links/http.py) against a legacy Streamable HTTP
server that misbehaves (tests/hostile_http.py): each test is one way a
server broke the link before 36ea9ec (found by probing a whole daemon; here
the link alone, driven as the Upstream drives it: its initialize and
``notifications/initialized``, then requests through ``link.send``, and
what it hands up read from ``link.receive``).

Two tests watch for a storm of requests over :data:`WATCH`; the others
wait for an event, bounded by :data:`WITHIN` per answer.
"""

from __future__ import annotations

import socket
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import orjson
import pytest
import trio

from actors.links import http as http_link
from actors.links.http import (
    BUDGET_FACTOR,
    HARD_LIMIT_FACTOR,
    MAX_STREAMS,
    HttpLink,
    launch_http,
)
from actors.links.http_redirects import MAX_MOVED, SameOriginRedirects, final_url
from actors.links.link import LinkContext
from actors.links.sse_budget import StreamBudget
from broker.config import ServerConfig
from broker.eras.probe import discover_request
from broker.eras.versions import LATEST_MODERN_VERSION
from broker.lifecycle import initialize_request
from broker.wire.frames import Failed, Renewed
from tests.hostile_http import (
    Reply,
    Request,
    event,
    json_reply,
    open_hostile_server,
    response,
    sse_reply,
    status_reply,
    text_result,
)

LIMIT = 64 * 1024  # the link's maxMessageBytes (small: an event past 4x it is cheap to send)
WATCH = 1.0  # seconds a test watches a storm it expects not to come
WITHIN = 3.0  # seconds an answer may take (they take milliseconds)
OTHER_ID = 987654  # the id of an answer to no request of the link's


class Log:
    """The link's log (``LinkContext.log``): the name of each event, in order."""

    def __init__(self, changed: Callable[[], None]) -> None:
        self.events: list[str] = []
        self._changed = changed

    def _record(self, event: str, **fields: Any) -> None:
        self.events.append(event)
        self._changed()

    debug = info = warning = error = _record


class Received:
    """What the link handed up: answers (parsed) and ``Failed`` frames by
    request id, ``Renewed`` frames, its log, and why it ended (None: it has not)."""

    def __init__(self) -> None:
        self.answers: dict[Any, Any] = {}
        self.renewed = 0
        self.ended: str | None = None
        self.log = Log(self._changed)
        self._change = trio.Event()

    def _changed(self) -> None:
        self._change.set()
        self._change = trio.Event()

    async def read(self, link: HttpLink) -> None:
        while frames := await link.receive():
            for frame in frames:
                if isinstance(frame, bytes):
                    message = orjson.loads(frame)
                    if "method" not in message:
                        self.answers[message.get("id")] = message
                elif isinstance(frame, Failed):
                    self.answers[frame.request] = frame
                elif isinstance(frame, Renewed):
                    self.renewed += 1
            self._changed()
        self.ended = await link.ended() or "ended"
        self._changed()

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._change.wait()

    async def take(self, id: Any) -> Any:
        """The answer to request ``id`` (or its ``Failed``), once it came."""
        with trio.move_on_after(WITHIN):
            await self.until(lambda: id in self.answers or self.ended is not None)
            assert id in self.answers, f"the link ended{self.ended} with no answer to {id!r}"
            return self.answers.pop(id)
        raise AssertionError(f"no answer to request {id!r} within {WITHIN} s")


@asynccontextmanager
async def open_link(url: str) -> AsyncIterator[tuple[HttpLink, Received]]:
    """A link to ``url`` past its handshake, as the Upstream opens one (the
    initialize answered, ``notifications/initialized`` sent: the GET stream
    follows), and what it hands up."""
    received = Received()
    async with trio.open_nursery() as nursery:
        context = LinkContext(nursery, LIMIT, received.log)
        link = await launch_http(ServerConfig(url=url), context)
        nursery.start_soon(received.read, link)
        try:
            await link.send(link.encode([initialize_request("init")]))
            assert "result" in await received.take("init")
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            await link.send(link.encode([initialized]))
            yield link, received
        finally:
            await link.close()
            nursery.cancel_scope.cancel()


async def call(link: HttpLink, id: int, name: str = "t") -> None:
    request = {"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": name, "arguments": {}}}  # fmt: skip
    await link.send(link.encode([request]))


def is_get(request: Request) -> bool:
    return request.method == "GET"


def answered_ok(answer: Any) -> bool:
    return isinstance(answer, dict) and answer.get("result", {}).get("content") is not None


async def test_a_get_answered_404_renews_the_session_once_not_for_ever() -> None:
    """A server that answers the GET stream 404 (where it means 405): the
    link takes it for an expired session once (a new session, its GET),
    and a 404 to the new session's GET for no GET stream. Over a second at
    most 3 GETs and 2 initializes (the first and one renewal), and calls go
    on. (Before, every 404 renewed the session again at once: hundreds of
    initializes and GETs a second, for as long as the link lived.)"""

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return status_reply(404)
        return json_reply(text_result(request.id, "ok"))

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            await server.wait_for(is_get)
            await trio.sleep(WATCH)
            gets, initializes = server.count("GET"), server.count(rpc_method="initialize")
            await call(link, 1)
            assert answered_ok(await got.take(1))
    assert gets <= 3 and initializes <= 2, (gets, initializes)
    assert got.renewed <= 1


async def test_a_get_stream_that_says_retry_0_is_polled_no_faster_than_the_floor() -> None:
    """A GET stream that sends ``id: 1`` and ``retry: 0`` and ends, each
    time: the link polls it again, but no sooner than its floor (0.25 s),
    so at most 10 GETs in a second. (Before, ``retry: 0`` was taken as
    it came: thousands of GETs a second.)"""

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return sse_reply(event(id="1", retry=0))
        return json_reply(text_result(request.id, "ok"))

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url):
            await server.wait_for(is_get)
            await trio.sleep(WATCH)
            gets = server.count("GET")
    assert gets <= 10, gets


async def test_a_get_answered_200_json_is_no_get_stream_and_the_link_goes_on() -> None:
    """A GET answered 200 ``application/json`` (not an event stream, not
    405) is no GET stream, said in the log (``server.no_get_stream``); the
    link stays up, and a call after it is answered. (Before, httpx2's
    SSEError for the content type ended the link: a restart, again and
    again.)"""

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return json_reply({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return json_reply(text_result(request.id, "ok"))

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            await server.wait_for(is_get)
            await got.until(
                lambda: got.ended is not None or "server.no_get_stream" in got.log.events
            )
            assert got.ended is None, f"the link ended{got.ended}"
            await call(link, 1)
            assert answered_ok(await got.take(1))
            assert got.ended is None


async def test_answers_on_streams_the_server_leaves_open_never_use_up_the_link() -> None:
    """A server that answers each call on an SSE stream and leaves it open
    (the spec says it SHOULD close it): each answer ends the reading of its
    stream, so more calls than the link has request tasks (MAX_STREAMS, 64)
    are all answered, one after another. (Before, each answered stream held
    its task for good: the 65th call was never POSTed.)"""

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return status_reply(405)
        return sse_reply(event(text_result(request.id, "ok")), hold=True)

    calls = MAX_STREAMS + 6
    with trio.fail_after(30):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            for id in range(1, calls + 1):
                await call(link, id)
                assert answered_ok(await got.take(id)), id
            assert server.count(rpc_method="tools/call") == calls


async def test_an_answer_to_another_request_on_a_stream_fails_the_call_at_once() -> None:
    """A call whose SSE stream carries the answer to another id, then ends:
    the call is ``Failed`` at once, naming the answer to another request,
    as for the same answer in a JSON body. (Before, any answer on the
    stream counted as the call's: nothing came for it until its timeout,
    300 s by default.)"""

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return status_reply(405)
        return sse_reply(event(text_result(OTHER_ID, "not yours")))

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            await call(link, 1)
            failed = await got.take(1)
            assert isinstance(failed, Failed), failed
            assert "another request" in failed.detail and str(OTHER_ID) in failed.detail


async def test_an_sse_event_past_the_hard_limit_fails_its_call_not_the_link() -> None:
    """A call answered on an SSE stream with an event over 4x the link's
    limit (~300 KiB against 64 KiB): that call is ``Failed`` (its stream
    broke), the link goes on, and the next call is answered. (Before,
    httpx2's SSEError for the size ended the link: every call in flight
    failed, and the session was lost.)"""
    padding = "x" * (LIMIT * HARD_LIMIT_FACTOR + 40 * 1024)

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return status_reply(405)
        if request.body["params"]["name"] == "big":
            return sse_reply(event(text_result(request.id, padding)))
        return json_reply(text_result(request.id, "ok"))

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            await call(link, 1, "big")
            failed = await got.take(1)
            assert isinstance(failed, Failed), failed
            limit = LIMIT * HARD_LIMIT_FACTOR
            assert (
                failed.detail == f"an SSE event of over {limit} bytes (4 x broker.maxMessageBytes)"
            )
            await call(link, 2)
            assert answered_ok(await got.take(2))
            assert got.ended is None


def session_of(request: Request) -> str | None:
    return request.headers.get("mcp-session-id")


async def test_a_notification_refused_404_in_a_new_session_too_costs_the_link_nothing() -> None:
    """A server that answers ``notifications/cancelled`` 404 (a cancel of a
    request it does not know; legacy servers mean "session gone" by it):
    the link opens a new session once, the cancel meets 404 there too and is
    dropped with a warning, and calls go on. (Before, the second 404 ended
    the link: one client's cancel failed every other client's call.)"""

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return status_reply(405)
        if request.rpc_method == "notifications/cancelled":
            return status_reply(404)
        return json_reply(text_result(request.id, "ok"))

    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
    with trio.fail_after(15):
        async with (
            open_hostile_server(script, frozenset({"notifications/cancelled"})) as server,
            open_link(server.url) as (link, got),
        ):
            await link.send(link.encode([cancel]))
            await got.until(lambda: "server.message_refused" in got.log.events)
            assert server.count(rpc_method="notifications/cancelled") == 2
            await call(link, 1)
            assert answered_ok(await got.take(1))
            assert got.ended is None and got.renewed == 1


async def test_a_notifications_initialized_never_answered_ends_the_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that never answers the POST of ``notifications/initialized``:
    the link ends at NOTICE_TIMEOUT, saying so (the Upstream connects again
    with backoff, and the calls fail naming the server). (Before, every
    request waited for it unPOSTed: each timed out, the catalog came up
    empty, and the server looked ready.)"""
    monkeypatch.setattr(http_link, "NOTICE_TIMEOUT", 0.5)

    def script(request: Request) -> Reply:
        if request.rpc_method == "notifications/initialized":
            return Reply(b"", hold=True)
        return status_reply(405)

    with trio.fail_after(15):
        async with (
            open_hostile_server(script, frozenset({"notifications/initialized"})) as server,
            open_link(server.url) as (_, got),
        ):
            await got.until(lambda: got.ended is not None)
    assert got.ended is not None and "notifications/initialized was not taken" in got.ended


async def test_a_new_session_that_never_opens_ends_the_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The session expired (404 to a call) and the new one's
    ``notifications/initialized`` is never answered: the renewal ends the
    link at RENEW_TIMEOUT. (Before, it had no deadline: the calls waiting
    for it timed out one by one, and the next met the same wait.)"""
    monkeypatch.setattr(http_link, "RENEW_TIMEOUT", 0.5)

    def script(request: Request) -> Reply:
        if request.rpc_method == "notifications/initialized":
            hang = session_of(request) == "session-2"
            return Reply(b"", hold=True) if hang else status_reply(202)
        if request.method == "GET":
            return status_reply(405)
        if session_of(request) == "session-1":
            return status_reply(404)
        return json_reply(text_result(request.id, "ok"))

    with trio.fail_after(15):
        async with (
            open_hostile_server(script, frozenset({"notifications/initialized"})) as server,
            open_link(server.url) as (link, got),
        ):
            await call(link, 1)
            await got.until(lambda: got.ended is not None)
            assert server.sessions == 2
    assert got.ended is not None and "not opened within 0.5 s" in got.ended


class _BadHeader(httpx2.Auth):
    """An auth that puts a value HTTP refuses (a token read with its CR) on requests."""

    def auth_flow(self, request: httpx2.Request) -> Any:
        request.headers["Authorization"] = "Bearer HDR-SECRET-1\r"
        yield request


async def _end_of(url: str, auth: httpx2.Auth | None = None) -> tuple[HttpLink, str]:
    """A link to ``url`` sent its initialize; why it ended (a link that
    cannot open is an OSError, whose words are the same)."""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            received = Received()
            try:
                link = await launch_http(
                    ServerConfig(url=url), LinkContext(nursery, LIMIT, received.log), auth
                )
            except OSError as exc:
                raise AssertionError(f"not opened: {exc}") from exc
            await link.send(link.encode([initialize_request("init")]))
            await received.read(link)
            nursery.cancel_scope.cancel()
    return link, received.ended or ""


async def test_the_links_info_and_errors_show_no_secret_of_its_url() -> None:
    """A password in the URL's userinfo and an API key in its query reach no
    error a client reads, no status and no log line (broker/redact.py)."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    url = f"http://user:PW-SECRET-2@127.0.0.1:{port}/mcp?key=Q-SECRET-3"
    link, why = await _end_of(url)
    assert link.info["url"] == f"http://***@127.0.0.1:{port}/mcp?key=***"
    assert "could not connect" in why and f"127.0.0.1:{port}/mcp" in why
    assert "SECRET" not in why


async def test_a_header_value_http_refuses_is_not_quoted_in_the_error() -> None:
    async with open_hostile_server(lambda request: status_reply(500)) as server:
        _, why = await _end_of(server.url, _BadHeader())
    assert "LocalProtocolError" in why
    assert "SECRET" not in why


def initialize_reply(request: Request, *, session: bytes, version: str) -> Reply:
    """The initialize's answer with this session id (its bytes as they are)
    and this ``protocolVersion``."""
    answer = {"protocolVersion": version, "capabilities": {"tools": {}},
              "serverInfo": {"name": "hostile", "version": "1"}}  # fmt: skip
    body = orjson.dumps({"jsonrpc": "2.0", "id": request.id, "result": answer})
    head = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: application/json\r\n"
    head += b"mcp-session-id: " + session + f"\r\ncontent-length: {len(body)}\r\n\r\n".encode()
    return Reply(head + body)


async def test_a_get_streams_event_id_that_is_no_header_is_not_sent_back() -> None:
    """A GET stream whose event id is not ASCII (``café``: the SSE format
    allows it), then ends: the link polls again with a plain GET (no
    ``Last-Event-ID``), and calls go on. (Before, httpx2's
    UnicodeEncodeError for the header ended the link as an internal error
    of the broker: every call in flight failed, and it restarted in a loop.)"""

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return sse_reply(event(id="caf\u00e9", retry=0))
        return json_reply(text_result(request.id, "ok"))

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            await server.wait_for(lambda request: server.count("GET") >= 2)
            await call(link, 1)
            assert answered_ok(await got.take(1))
            assert got.ended is None, f"the link ended{got.ended}"
    gets = [request for request in server.requests if is_get(request)]
    assert all("last-event-id" not in request.headers for request in gets)


async def test_a_calls_event_id_that_is_no_header_fails_that_call_alone() -> None:
    """A call's stream gives a priming event whose id is not ASCII, then
    ends: it cannot be resumed, so that call fails, saying why, and the next
    call is answered. (Before: the link ended as an internal error.)"""

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return status_reply(405)
        if request.body["params"]["name"] == "cut":
            return sse_reply(event(id="caf\u00e9"))
        return json_reply(text_result(request.id, "ok"))

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            await call(link, 1, "cut")
            failed = await got.take(1)
            assert isinstance(failed, Failed) and "Last-Event-ID" in failed.detail, failed
            await call(link, 2)
            assert answered_ok(await got.take(2))
            assert got.ended is None


async def test_a_session_id_that_is_not_visible_ascii_is_refused_naming_it() -> None:
    """An initialize answered with an ``Mcp-Session-Id`` in UTF-8 (the spec
    allows visible ASCII only): the link ends saying so, not as an internal
    error of the broker (httpx2's UnicodeEncodeError on the next POST)."""
    async with open_hostile_server(lambda request: status_reply(405)) as server:
        server.answer = lambda request: (  # type: ignore[method-assign]
            initialize_reply(request, session="s\u00e9ssion".encode(), version="2025-11-25")
            if request.rpc_method == "initialize"
            else status_reply(202)
        )
        _, why = await _end_of(server.url)
    assert "Mcp-Session-Id" in why and "visible ASCII" in why, why
    assert "internal error" not in why


async def test_a_protocol_version_that_is_no_header_is_not_sent() -> None:
    """An initialize answer whose ``protocolVersion`` is not ASCII: it goes
    in no ``MCP-Protocol-Version`` header (the Upstream refuses the version,
    naming it); the link does not end as an internal error of the broker."""

    def answer(request: Request) -> Reply:
        if request.rpc_method == "initialize":
            return initialize_reply(request, session=b"s1", version="2025-11-25\u00e9")
        return status_reply(405) if is_get(request) else status_reply(202)

    with trio.fail_after(15):
        async with open_hostile_server(answer) as server:
            server.answer = answer  # type: ignore[method-assign]
            async with open_link(server.url) as (_, got):
                await server.wait_for(is_get)
                assert got.ended is None, f"the link ended{got.ended}"
    assert all("mcp-protocol-version" not in request.headers for request in server.requests)


async def test_calls_answered_on_the_get_stream_never_use_up_the_link() -> None:
    """A server that answers each call on the GET stream (at its next poll)
    and leaves the call's own POST stream open: each answer closes its
    call's stream, so more calls than the link has request tasks
    (MAX_STREAMS, 64) are all POSTed and answered. (Before, each such
    stream held its task for good: after 64, nothing more was POSTed.)"""
    pending: list[Any] = []

    def script(request: Request) -> Reply:
        if request.method == "GET":
            answers = [event(text_result(id, "ok")) for id in pending]
            pending.clear()
            return sse_reply(*answers, event(retry=0))
        pending.append(request.id)
        return sse_reply(event(id=f"p{request.id}"), hold=True)

    calls = MAX_STREAMS + 6
    with trio.fail_after(30):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            async with trio.open_nursery() as nursery:
                for id in range(1, calls + 1):
                    nursery.start_soon(call, link, id)
            for id in range(1, calls + 1):
                assert answered_ok(await got.take(id)), id
            assert server.count(rpc_method="tools/call") == calls


async def test_a_call_answered_on_another_calls_stream_has_its_own_closed() -> None:
    """A call whose answer comes on another call's stream (the other fails:
    no answer of its own came), its own stream left open: it is closed,
    so rounds past MAX_STREAMS all go through."""

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return status_reply(405)
        name = request.body["params"]["name"]
        if name == "held":
            return sse_reply(event(id=f"p{request.id}"), hold=True)
        return sse_reply(event(text_result(int(name), "ok")))

    rounds = MAX_STREAMS + 6
    with trio.fail_after(30):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            for round in range(rounds):
                held, other = 2 * round + 1, 2 * round + 2
                await call(link, held, "held")
                await server.wait_for(lambda request, held=held: request.id == held)
                await call(link, other, str(held))
                assert answered_ok(await got.take(held)), held
                assert isinstance(await got.take(other), Failed)


async def test_a_get_stream_resumed_from_an_id_the_server_forgot_is_opened_afresh() -> None:
    """A GET stream that gave ``id: g1`` and ended, whose server then no
    longer knows g1 and answers its resumption with an empty stream (the
    SDK's server does so): the link opens the GET stream afresh (no
    ``Last-Event-ID``) and takes what comes on it. (Before, it polled with
    g1 every second for ever, and the stream never came back.)"""

    def script(request: Request) -> Reply:
        if request.method == "POST":
            return json_reply(text_result(request.id, "ok"))
        if "last-event-id" in request.headers:
            return sse_reply()
        if server.count("GET") == 1:
            return sse_reply(event(id="g1", retry=0))
        return sse_reply(event(text_result(OTHER_ID, "on the fresh stream")), hold=True)

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url) as (_, got):
            await got.until(lambda: OTHER_ID in got.answers or got.ended is not None)
            assert OTHER_ID in got.answers, f"the link ended{got.ended}"
    headers = [
        request.headers.get("last-event-id") for request in server.requests if is_get(request)
    ]
    assert headers == [None, "g1", None], headers


async def test_a_renewed_session_resumes_no_event_id_of_the_old_one() -> None:
    """The session expired (404 to a call) while the GET stream was polled
    with event ids: the new session's GET carries no ``Last-Event-ID`` of
    the old session's. (Before, the old id went on in the new session,
    whose server could not know it.)"""
    polls = 0

    def script(request: Request) -> Reply:
        nonlocal polls
        if request.method == "GET" and session_of(request) == "session-1":
            polls += 1
            return sse_reply(event(id=f"g{polls}", retry=0))
        if request.method == "GET":
            return sse_reply(hold=True)
        if session_of(request) == "session-1":
            return status_reply(404)
        return json_reply(text_result(request.id, "ok"))

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            await server.wait_for(lambda request: "last-event-id" in request.headers)
            await call(link, 1)
            assert answered_ok(await got.take(1))
            first = await server.wait_for(
                lambda request: is_get(request) and session_of(request) == "session-2"
            )
    assert "last-event-id" not in first.headers, first.headers


async def test_a_get_poll_answered_503_is_polled_again_not_given_up() -> None:
    """A GET stream that ends, whose next poll meets a 503 (a gateway during
    a deploy): the link polls again after a backoff and takes what the
    stream then brings. (Before, any status but 2xx was taken for "no GET
    stream": the link never polled again, and the server's notifications
    reached no client until the link restarted.)"""

    def script(request: Request) -> Reply:
        if request.method == "POST":
            return json_reply(text_result(request.id, "ok"))
        gets = server.count("GET")
        if gets == 1:
            return sse_reply(event(retry=0))
        if gets == 2:
            return status_reply(503)
        return sse_reply(event(text_result(OTHER_ID, "after the 503")), hold=True)

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url) as (_, got):
            await got.until(lambda: OTHER_ID in got.answers or got.ended is not None)
            assert OTHER_ID in got.answers, f"the link ended{got.ended}"
    assert "server.get_stream_refused" in got.log.events


async def test_a_resumption_refused_400_is_polled_again_without_its_id() -> None:
    """A GET stream resumed from an id the server refuses (400): the next
    poll, after a backoff, goes without ``Last-Event-ID``."""

    def script(request: Request) -> Reply:
        if request.method == "POST":
            return json_reply(text_result(request.id, "ok"))
        if "last-event-id" in request.headers:
            return status_reply(400)
        if server.count("GET") == 1:
            return sse_reply(event(id="g1", retry=0))
        return sse_reply(hold=True)

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url):
            await server.wait_for(lambda request: server.count("GET") >= 3)
    headers = [
        request.headers.get("last-event-id") for request in server.requests if is_get(request)
    ]
    assert headers == [None, "g1", None], headers


async def test_a_probe_left_unanswered_is_given_up_when_the_link_goes_legacy() -> None:
    """``server/discover`` answered with a stream that never brings an
    answer, and the Upstream's probe expires (the link is told legacy, an
    initialize follows): the probe's stream is closed, which is how a
    modern request is given up, and the legacy session opens. (Before, it
    stayed open for the connection's life, holding a request task, a
    connection and the server's handler.)"""

    def script(request: Request) -> Reply:
        if request.rpc_method == "server/discover":
            return sse_reply(b": keep-alive\n\n", hold=True)
        if request.method == "GET":
            return status_reply(405)
        return json_reply(text_result(request.id, "ok"))

    def is_probe(request: Request) -> bool:
        return request.rpc_method == "server/discover"

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, trio.open_nursery() as nursery:
            got = Received()
            context = LinkContext(nursery, LIMIT, got.log)
            link = await launch_http(ServerConfig(url=server.url), context)
            nursery.start_soon(got.read, link)
            link.speak(LATEST_MODERN_VERSION)
            await link.send(link.encode([discover_request("probe", LATEST_MODERN_VERSION)]))
            await server.wait_for(is_probe)
            link.speak(None)  # (what the Upstream says when the probe expired)
            await link.send(link.encode([initialize_request("init")]))
            assert "result" in await got.take("init")
            await server.wait_for(is_probe, hung_up=True)
            assert "probe" not in got.answers
            await link.close()
            nursery.cancel_scope.cancel()


async def test_an_http_sse_stream_may_send_a_retry_and_a_ping_before_its_endpoint() -> None:
    """An HTTP+SSE server (``"type": "sse"``) whose stream opens with a
    ``retry:`` alone and an ``event: ping`` before ``endpoint``: those are
    skipped, as the official SDK's client skips them, and the initialize
    is POSTed where the endpoint says. (Before, the link refused the server:
    "its SSE stream began with 'message', not 'endpoint'", a restart loop.)"""
    preamble = b"retry: 3000\n\nevent: ping\ndata:\n\n"
    endpoint = b"event: endpoint\ndata: /messages?session_id=abc\n\n"
    head = {"content-type": "text/event-stream", "cache-control": "no-cache"}

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return Reply(response(200, head, preamble + endpoint, sized=False), hold=True)
        return status_reply(202)

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, trio.open_nursery() as nursery:
            got = Received()
            config = ServerConfig(url=server.url, type="sse")
            link = await launch_http(config, LinkContext(nursery, LIMIT, got.log))
            await link.send(link.encode([initialize_request("init")]))
            posted = await server.wait_for(lambda request: request.method == "POST")
            assert posted.path == "/messages?session_id=abc" and posted.rpc_method == "initialize"
            await link.close()
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("status", [307, 308])
async def test_a_same_origin_redirect_is_followed_with_its_method_body_and_headers(
    status: int,
) -> None:
    """A server mounted at ``/mcp/`` that answers ``/mcp`` with ``307`` (or
    ``308``) to ``/mcp/`` (Starlette's ``redirect_slashes``): every request
    goes there, a POST with its body, with the configured headers (the
    origin is the same), and the link works. A ``307`` is temporary: each
    request asks ``/mcp`` first. A ``308`` is permanent: only the first
    does, the others go to ``/mcp/`` at once. (Before, the initialize's 307
    ended the link, "initialize was answered with HTTP 307", naming no
    location; and, later, a 308 was asked through again at every call, two
    round trips each.)"""

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return status_reply(405)
        return json_reply(text_result(request.id, "ok"))

    def moved(request: Request) -> Reply | None:
        if request.path != "/mcp":
            return None
        return Reply(response(status, {"location": server.url + "/"}))

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, trio.open_nursery() as nursery:
            server.before = moved
            got = Received()
            config = ServerConfig(url=server.url, headers={"Authorization": "Bearer T"})
            link = await launch_http(config, LinkContext(nursery, LIMIT, got.log))
            nursery.start_soon(got.read, link)
            await link.send(link.encode([initialize_request("init")]))
            assert "result" in await got.take("init")
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            await link.send(link.encode([initialized]))
            await call(link, 1)
            assert answered_ok(await got.take(1))
            await link.close()
            nursery.cancel_scope.cancel()
    followed = [request for request in server.requests if request.path == "/mcp/"]
    posted = [request.rpc_method for request in followed if request.method == "POST"]
    assert posted == ["initialize", "notifications/initialized", "tools/call"], posted
    assert all(request.headers.get("authorization") == "Bearer T" for request in followed)
    asked = [(request.method, request.rpc_method) for request in server.requests
             if request.path == "/mcp"]  # fmt: skip
    if status == 307:
        assert [rpc for method, rpc in asked if method == "POST"] == posted, asked
    else:
        assert asked == [("POST", "initialize")], asked


async def test_an_http_sse_endpoint_is_resolved_against_the_url_its_stream_came_from() -> None:
    """An HTTP+SSE server whose stream is at ``/mcp/`` (the configured
    ``/mcp`` redirected there) and whose ``endpoint`` event is relative,
    ``messages?session_id=abc``: POSTs go to ``/mcp/messages?...``, the url
    relative to the stream's own, as a browser's EventSource resolves it.
    (Before, it was resolved against the configured url: ``/messages?...``,
    where the server has nothing.)"""
    endpoint = b"event: endpoint\ndata: messages?session_id=abc\n\n"
    head = {"content-type": "text/event-stream", "cache-control": "no-cache"}

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return Reply(response(200, head, endpoint, sized=False), hold=True)
        return status_reply(202)

    def moved(request: Request) -> Reply | None:
        if request.path != "/mcp":
            return None
        return Reply(response(307, {"location": server.url + "/"}))

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, trio.open_nursery() as nursery:
            server.before = moved
            got = Received()
            config = ServerConfig(url=server.url, type="sse")
            link = await launch_http(config, LinkContext(nursery, LIMIT, got.log))
            await link.send(link.encode([initialize_request("init")]))
            posted = await server.wait_for(lambda request: request.method == "POST")
            assert posted.path == "/mcp/messages?session_id=abc", posted.path
            await link.close()
            nursery.cancel_scope.cancel()


async def test_a_redirect_to_another_origin_is_not_followed_and_the_error_names_it() -> None:
    """A ``307`` to another origin (``localhost`` for ``127.0.0.1``): not
    followed (no header the config gives, no token, goes there), and the
    error names where it pointed and why it was not followed."""
    async with open_hostile_server(lambda request: status_reply(405)) as server:
        elsewhere = server.url.replace("127.0.0.1", "localhost") + "/"
        server.before = lambda request: Reply(response(307, {"location": elsewhere}))
        _, why = await _end_of(server.url)
    assert all(request.path == "/mcp" for request in server.requests)
    assert "HTTP 307" in why and f"to {elsewhere}, not followed: another origin" in why, why


async def test_a_new_session_whose_initialize_stream_ends_without_an_answer_says_so() -> None:
    """The session expired (404 to a call) and the new session's
    initialize is answered with a stream that holds a priming event and
    ends: the link ends saying so. (Before: "connection lost
    (StreamConsumed: ...)", httpx2's words for a body read twice, which
    blamed the connection and redirects.)"""

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return status_reply(405)
        return status_reply(404)  # (the session is gone)

    def renewal(request: Request) -> Reply | None:
        if request.rpc_method == "initialize" and server.sessions > 0:
            return sse_reply(event(id="p1"))
        return None

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            server.before = renewal
            await call(link, 1)
            await got.until(lambda: got.ended is not None)
    assert got.ended is not None
    assert "a new HTTP session was refused (its initialize's stream ended without an answer)" in (
        got.ended
    ), got.ended


async def test_no_type_and_both_transports_refused_the_error_gives_the_initializes_reason() -> None:
    """No ``type``: the initialize is refused 400 with the server's reason
    (a missing API key), and the HTTP+SSE fallback's GET 405: the error
    says both, the server's reason first. (Before, only the GET's 405: the
    reason the server gave appeared nowhere.)"""
    refusal = b"Bad Request: missing X-API-Key header"

    def refused(request: Request) -> Reply | None:
        if request.rpc_method == "initialize":
            return Reply(response(400, {"content-type": "text/plain"}, refusal))
        return None

    async with open_hostile_server(lambda request: status_reply(405)) as server:
        server.before = refused
        _, why = await _end_of(server.url)
    assert f"initialize was answered with HTTP 400 Whatever: {refusal.decode()}" in why, why
    assert "as an HTTP+SSE server: GET" in why and "HTTP 405" in why, why


async def test_a_json_answer_without_a_content_type_is_taken_and_an_empty_one_said() -> None:
    """A call answered 200 with its JSON-RPC answer and no
    ``Content-Type`` (a lenient server's omission): the answer is taken.
    One answered 200 with an empty body and no type fails saying so.
    (Before, both: "HTTP 200 and no answer", the answer dropped.)"""

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return status_reply(405)
        if request.body["params"]["name"] == "empty":
            return Reply(response(200, {}))
        return Reply(response(200, {}, orjson.dumps(text_result(request.id, "ok"))))

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            await call(link, 1)
            assert answered_ok(await got.take(1))
            await call(link, 2, "empty")
            failed = await got.take(2)
            assert isinstance(failed, Failed), failed
            assert failed.detail == "HTTP 200 OK and an empty body: no answer", failed.detail


async def test_unfinished_events_on_many_streams_are_bounded_for_the_link() -> None:
    """Calls whose streams each hold an unfinished event under the per-event
    limit (here 3/4 of it), held open: past the link's budget
    (BUDGET_FACTOR x maxMessageBytes in all) the stream that crosses it fails
    its call, saying so, and the link goes on. (Before, only each event was
    bounded: with 65 streams a server could make the daemon hold some 4 GiB
    at the defaults.)"""
    part = b"data: " + b"x" * (LIMIT * HARD_LIMIT_FACTOR * 3 // 4)
    streams = BUDGET_FACTOR * 2 // 3 + 1  # (their events, together, past the budget)
    head = {"content-type": "text/event-stream"}

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return status_reply(405)
        if request.body["params"]["name"] == "part":
            return Reply(response(200, head, part, sized=False), hold=True)
        return json_reply(text_result(request.id, "ok"))

    with trio.fail_after(15):
        async with open_hostile_server(script) as server, open_link(server.url) as (link, got):
            calls = range(1, streams + 1)
            for id in calls:
                await call(link, id, "part")
            await got.until(lambda: any(id in got.answers for id in calls))
            failed = [got.answers[id] for id in calls if id in got.answers]
            assert all(isinstance(answer, Failed) for answer in failed), failed
            assert "of unfinished events at once" in failed[0].detail, failed[0]
            await call(link, 100)
            assert answered_ok(await got.take(100))
            assert got.ended is None


async def test_keep_alive_comments_on_an_idle_stream_are_never_held_against_the_budget() -> None:
    """An HTTP+SSE server whose one stream, after its ``endpoint``, sends
    nothing but keep-alive comments (``: ping - <time>``, as the official
    SDK's servers do every 15 s), more of them than the link's budget, then
    a message: the message comes and the link goes on. (Before, a comment
    completed no event, so its bytes were held until the next message: a
    quiet server's link ended, "of unfinished events at once", after some
    hours at a small maxMessageBytes.)"""
    ping = b": ping - 2026-11-27 22:00:00.000000+00:00\r\n\r\n"
    pings = ping * (2 * LIMIT * BUDGET_FACTOR // len(ping))  # (twice the budget)
    endpoint = b"event: endpoint\ndata: /messages?session_id=abc\n\n"
    message = b"event: message\ndata: " + orjson.dumps(text_result("x", "ok")) + b"\n\n"
    head = {"content-type": "text/event-stream", "cache-control": "no-cache"}

    def script(request: Request) -> Reply:
        if request.method == "GET":
            return Reply(response(200, head, endpoint + pings + message, sized=False), hold=True)
        return status_reply(202)

    await _sse_link_answers_x(script)


async def test_a_proxy_that_gzips_event_streams_is_asked_not_to() -> None:
    """An HTTP+SSE server behind a proxy that gzips event streams for the
    clients that accept it (nginx's ``gzip_types text/event-stream``), each
    event flushed as it goes: the link asks for bodies as they are, so its
    budget sees the blank lines of the keep-alive comments, which are let go
    (before, it counted the compressed bytes and saw no blank line in them:
    the link ended, "of unfinished events at once"). Found by probing."""
    ping = b": ping - 2026-11-27 22:00:00.000000+00:00\r\n\r\n"
    pings = [ping] * (3 * LIMIT * BUDGET_FACTOR // 16)  # (8 bytes each, gzipped: 1.5 budgets)
    endpoint = b"event: endpoint\ndata: /messages?session_id=abc\n\n"
    message = b"event: message\ndata: " + orjson.dumps(text_result("x", "ok")) + b"\n\n"
    head = {"content-type": "text/event-stream", "cache-control": "no-cache"}

    def script(request: Request) -> Reply:
        if request.method == "POST":
            return status_reply(202)
        body = [endpoint, *pings, message]
        if "gzip" in request.headers.get("accept-encoding", ""):
            gzip = zlib.compressobj(wbits=31)
            body = [gzip.compress(part) + gzip.flush(zlib.Z_SYNC_FLUSH) for part in body]
            head["content-encoding"] = "gzip"
        return Reply(response(200, head, b"".join(body), sized=False), hold=True)

    await _sse_link_answers_x(script)


async def _sse_link_answers_x(script: Callable[[Request], Reply]) -> None:
    """An HTTP+SSE link to ``script``'s server lives on and hands up the
    answer to "x" (the server's stream carries it)."""
    with trio.fail_after(15):
        async with open_hostile_server(script) as server, trio.open_nursery() as nursery:
            got = Received()
            config = ServerConfig(url=server.url, type="sse")
            link = await launch_http(config, LinkContext(nursery, LIMIT, got.log))
            nursery.start_soon(got.read, link)
            await got.until(lambda: "x" in got.answers or got.ended is not None)
            assert got.ended is None, f"the link ended{got.ended}"
            assert answered_ok(got.answers["x"])
            await link.close()
            nursery.cancel_scope.cancel()


class _Chunks(httpx2.AsyncByteStream):
    def __init__(self, chunks: list[bytes], budget: StreamBudget) -> None:
        self._chunks = chunks
        self._budget = budget
        self.held: list[int] = []  # the budget's bytes held after each chunk

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk
            self.held.append(self._budget.held)


@pytest.mark.parametrize(
    ("chunks", "held"),
    [
        ([b": ping\n", b"\n", b"data: 1"], [7, 0, 7]),  # (a blank line split LF | LF)
        ([b": ping\r\n", b"\r\n", b"data: 1"], [8, 0, 7]),  # (CRLF | CRLF)
        ([b": ping\r", b"\n", b"\n"], [7, 8, 0]),  # (CR | LF is one line end, then LF)
        ([b": ping\r", b"\r"], [7, 0]),  # (CR | CR)
        ([b"data: 1\n\ndata: 2", b"2\n", b"\r\ndata"], [7, 9, 4]),  # (LF | CRLF: blank)
        ([b"\n\n", b": a\n\n: b\n"], [0, 4]),
        ([b"data: 1\n\r\ndata: 2\r\r\n: c"], [3]),  # (LF CRLF, CR CRLF)
    ],
)
async def test_a_streams_bytes_are_held_until_the_blank_line_that_ends_their_event(
    chunks: list[bytes], held: list[int]
) -> None:
    """What a stream holds against its link's budget: the bytes read since
    its last blank line (LF, CR or CRLF line ends, split across chunks
    anywhere), comments included, the events the parser gives aside."""
    budget = StreamBudget(1000)
    request = httpx2.Request("GET", "http://x/")
    head = {"content-type": "text/event-stream"}
    feed = _Chunks(chunks, budget)
    answer = httpx2.Response(200, headers=head, stream=feed, request=request)
    async for _ in budget.events(answer, 1000):
        pass
    assert feed.held == held
    await answer.aclose()
    assert budget.held == 0


async def test_the_permanent_redirects_remembered_are_bounded() -> None:
    """Each url's ``308`` is remembered (later requests go where it led at
    once), but only the last :data:`MAX_MOVED` urls': the oldest is asked
    again (an HTTP+SSE server may move each session's endpoint)."""
    asked: list[str] = []

    def server(request: httpx2.Request) -> httpx2.Response:
        asked.append(request.url.path)
        if request.url.path.endswith("/"):
            return httpx2.Response(200)
        return httpx2.Response(308, headers={"location": request.url.path + "/"})

    redirects = SameOriginRedirects(httpx2.MockTransport(server))
    urls = [f"http://x/{n}" for n in range(MAX_MOVED + 1)]
    for url in [*urls, urls[-1], urls[0]]:
        answer = await redirects.handle_async_request(httpx2.Request("GET", url))
        assert answer.status_code == 200
        assert final_url(answer) == httpx2.URL(url + "/")
    assert asked[-3:] == [f"/{MAX_MOVED}/", "/0", "/0/"], asked[-3:]
