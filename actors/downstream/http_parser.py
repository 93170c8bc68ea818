"""The requests on one HTTP/1.1 connection, from its bytes: httptools parses, this bounds.

Sans-I/O, in h11's shape: :meth:`RequestParser.receive_data` takes what came
on the socket, :meth:`RequestParser.next_event` hands out, in order, a
:class:`Request` (its head), the pieces of its body (``bytes``), ``END`` once
it is whole, then the next request's; ``NEED_DATA`` when it needs more bytes,
``CLOSED`` once the client has closed and everything is handed out. Bad HTTP
is a :class:`BadRequest` raised by ``next_event`` where it comes in the
stream (after the requests before it), carrying the status to answer.

httptools binds llhttp (Node's parser, in C; uvicorn's too): it does the
grammar, the framing (Content-Length, chunked bodies, what a request without
either carries), smuggling's defences (both framings, two Content-Lengths,
bad chunk sizes: refused) and keep-alive (``should_keep_alive``: HTTP/1.0,
``Connection: close``). What it has no notion of, this module adds: a bound
on a request's head (:data:`MAX_HEAD_BYTES`: larger is 431, refused before
it ends), header names lowercased (as ASGI has them), ``Expect:
100-continue`` noted, and an ``Upgrade`` (which the broker never grants)
taken as the connection's last request, its body read by its Content-Length
(llhttp would hand the body to the new protocol).

Why not h11, which this server ran on first: per request h11 builds event
objects, validates every header field with regular expressions in Python and
steps a state machine, about a quarter of the listener's CPU per call at 64
clients (benchmarks/README.md, "Streamable HTTP (#13)"); llhttp does the same
work in C, calling back into Python once per header.
"""

from __future__ import annotations

from collections import deque
from typing import Final

import httptools

MAX_HEAD_BYTES = 64 * 1024  # a request line and header fields, at most


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA: Final = _Marker("NEED_DATA")
END: Final = _Marker("END")  # the request's body is whole
CLOSED: Final = _Marker("CLOSED")  # the client closed its side; nothing more comes


class BadRequest(Exception):
    """What the client sent is not HTTP/1.1 the server takes: answer ``status`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Request:
    """A request's head: what its method, target, version and fields are."""

    __slots__ = ("expect_continue", "headers", "http_version", "keep_alive", "method", "target")

    def __init__(
        self,
        method: str,
        target: bytes,
        http_version: str,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
        expect_continue: bool,
    ) -> None:
        self.method = method
        self.target = target
        self.http_version = http_version
        self.headers = headers  # names lowercased, in the order sent
        self.keep_alive = keep_alive  # False: the connection ends with this request
        self.expect_continue = expect_continue  # the client waits for "100 Continue"


Event = Request | bytes | _Marker


class RequestParser:
    """One connection's requests (see the module's docstring)."""

    def __init__(self, max_head_bytes: int = MAX_HEAD_BYTES) -> None:
        self.max_head_bytes = max_head_bytes
        self._parser = httptools.HttpRequestParser(self)
        self._events: deque[Event | BadRequest] = deque()
        self._failed = False  # a BadRequest is queued: nothing after it is parsed
        self._closed = False
        self._upgrade_body: int | None = None  # what is still to come of an Upgrade's body
        # The request whose head is being read: its target's pieces and fields,
        # and the bytes of it seen so far (a lower bound while it is unfinished).
        self._target: list[bytes] = []
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect = False
        self._in_head = False
        self._head_bytes = 0
        self._fields_bytes = 0
        self._count_whole_feed = True  # its head began with the bytes fed last
        self._completed_in_feed = False

    # -- the interface ------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Take bytes from the socket (``b""``: the client closed its side)."""
        if self._failed or self._closed:
            return
        if not data:
            self._closed = True
            return
        if self._upgrade_body is not None:
            self._take_upgrade_body(data)
            return
        self._completed_in_feed = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._upgrade(data[exc.args[0] :])
            return
        except httptools.HttpParserError as exc:
            failure = exc.__context__ if isinstance(exc.__context__, BadRequest) else None
            self._fail(failure or BadRequest(400, f"Bad request: {_reason(exc)}"))
            return
        if self._in_head:  # a head is not whole yet: is it too large already?
            if self._count_whole_feed:
                self._head_bytes += len(data)
            self._count_whole_feed = True
            if self._head_bytes > self.max_head_bytes:
                self._fail(_head_too_large(self.max_head_bytes))

    def next_event(self) -> Event:
        """The next thing the client sent (raises :class:`BadRequest` where
        its stream stops being HTTP)."""
        if self._events:
            event = self._events.popleft()
            if isinstance(event, BadRequest):
                raise event
            return event
        return CLOSED if self._closed else NEED_DATA

    # -- httptools' callbacks -------------------------------------------------

    def on_message_begin(self) -> None:
        self._target = []
        self._headers = []
        self._expect = False
        self._in_head = True
        self._head_bytes = 0
        self._fields_bytes = 0  # the fields' exact size (what is whole of them)
        # Begun after another request ended in the same bytes, its start in
        # them is unknown: they count for nothing, the bytes after them fully.
        self._count_whole_feed = not self._completed_in_feed

    def on_url(self, piece: bytes) -> None:
        self._target.append(piece)

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        value = value.rstrip(b" \t")  # (llhttp drops the whitespace before a value only)
        self._headers.append((name, value))
        self._fields_bytes += len(name) + len(value) + 4
        if name == b"expect":
            self._expect = value.lower() == b"100-continue"

    def on_headers_complete(self) -> None:
        self._in_head = False
        target = b"".join(self._target)
        headers = self._headers
        if len(target) + 16 + self._fields_bytes > self.max_head_bytes:
            raise _head_too_large(self.max_head_bytes)  # (stops the parse: see receive_data)
        parser = self._parser
        self._events.append(
            Request(
                parser.get_method().decode("ascii"),
                target,
                parser.get_http_version(),
                headers,
                parser.should_keep_alive() and not parser.should_upgrade(),
                self._expect,
            )
        )

    def on_body(self, piece: bytes) -> None:
        self._events.append(piece)

    def on_message_complete(self) -> None:
        self._events.append(END)
        self._completed_in_feed = True

    # -- -----------------------------------------------------------------------

    def _upgrade(self, rest: bytes) -> None:
        """A request asked for another protocol (``Upgrade``, as ``curl
        --http2`` does with h2c). llhttp ends it at its head, taking what
        follows for the new protocol; the broker grants none, so the request
        is answered as HTTP/1.1: its body is what its Content-Length says,
        and the connection then closes."""
        request = next(event for event in reversed(self._events) if isinstance(event, Request))
        if self._events[-1] is END:
            self._events.pop()
        fields = dict(request.headers)
        if b"transfer-encoding" in fields:
            self._fail(BadRequest(400, "Bad request: a chunked body with Upgrade"))
            return
        length = fields.get(b"content-length", b"0")
        self._upgrade_body = int(length) if length.isdigit() else 0
        self._take_upgrade_body(rest)

    def _take_upgrade_body(self, data: bytes) -> None:
        assert self._upgrade_body is not None
        piece = data[: self._upgrade_body]
        if piece:
            self._events.append(piece)
            self._upgrade_body -= len(piece)
        if not self._upgrade_body:
            self._events.append(END)
            self._upgrade_body = None
            self._closed = True  # (what follows is not HTTP/1.1)

    def _fail(self, error: BadRequest) -> None:
        self._failed = True
        self._in_head = False
        self._events.append(error)


def _head_too_large(limit: int) -> BadRequest:
    return BadRequest(431, f"Request header fields too large (more than {limit} bytes)")


def _reason(exc: Exception) -> str:
    """llhttp's reason, as it says it ("Invalid method encountered", ...)."""
    return str(exc) or type(exc).__name__
