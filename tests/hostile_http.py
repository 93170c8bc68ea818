"""A scriptable HTTP/1.1 server that misbehaves on cue, for the HTTP link's
tests (tests/test_http_link_hostile.py).

It plays a legacy Streamable HTTP MCP server (2025-11-25, sessions by
``Mcp-Session-Id``) where the link needs one to get going: an ``initialize``
POST is answered 200 with a JSON result and a new session id (``session-1``,
then ``session-2`` after a renewal, ...), a POST that carries no request (a
notification, an answer) 202 (but the notifications the test names, which
go to its script), a DELETE 200. Every other request is given to
the test's *script*, which returns the bytes to write back as they are
(:class:`Reply`; :func:`json_reply`, :func:`status_reply` and
:func:`sse_reply` build the usual ones).

One request per connection: its request line, headers and
``Content-Length`` body are read, recorded (:attr:`HostileServer.requests`),
and answered; then the connection is closed (every helper's answer says
``connection: close``), or, for a :class:`Reply` with ``hold``, kept open
until the client closes it: a stream the server never ends. Trio's
sockets and nothing else, so what reaches the link is exactly what the test
wrote.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import orjson
import trio

PROTOCOL_VERSION = "2025-11-25"
SESSION_HEADER = "mcp-session-id"
REASONS = {200: "OK", 202: "Accepted", 404: "Not Found", 405: "Method Not Allowed"}


@attrs.frozen
class Request:
    """What one request brought: its HTTP ``method``, its ``headers`` (names
    in lower case) and its ``body`` parsed as JSON (None if it had none)."""

    method: str
    headers: dict[str, str]
    body: Any
    path: str = ""  # (its target: path and query)

    @property
    def rpc_method(self) -> str | None:
        """The JSON-RPC method of the body (None: no JSON-RPC request or notification)."""
        method = self.body.get("method") if isinstance(self.body, dict) else None
        return method if isinstance(method, str) else None

    @property
    def id(self) -> Any:
        """The JSON-RPC id of the body (None: a notification, or no body)."""
        return self.body.get("id") if isinstance(self.body, dict) else None


@attrs.frozen
class Reply:
    """Bytes to write back as they are; ``hold``: then keep the connection
    open until the client closes it (else it is closed at once)."""

    data: bytes
    hold: bool = False


Script = Callable[[Request], Reply]
Before = Callable[[Request], Reply | None]


def response(
    status: int, headers: dict[str, str], body: bytes = b"", *, sized: bool = True
) -> bytes:
    """An HTTP/1.1 response that says ``connection: close``; ``sized``: with
    a ``Content-Length`` (else the body ends when the connection does)."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Whatever')}", "connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if sized:
        lines.append(f"content-length: {len(body)}")
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + body


def json_reply(message: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    """``message`` as an ``application/json`` body."""
    head = {"content-type": "application/json", **(headers or {})}
    return Reply(response(status, head, orjson.dumps(message)))


def status_reply(status: int) -> Reply:
    """A status and no body (a 202, a 404, a 405)."""
    return Reply(response(status, {}))


def event(data: Any = None, *, id: str | None = None, retry: int | None = None) -> bytes:
    """One SSE event: ``data`` as JSON (bytes as they are), an ``id``, a ``retry`` (ms)."""
    fields = b""
    if id is not None:
        fields += f"id: {id}\n".encode()
    if retry is not None:
        fields += f"retry: {retry}\n".encode()
    if data is not None:
        fields += b"data: " + (data if isinstance(data, bytes) else orjson.dumps(data)) + b"\n"
    return fields + b"\n"


def sse_reply(*events: bytes, hold: bool = False) -> Reply:
    """A ``text/event-stream`` of ``events`` (see :func:`event`) that ends
    with the connection: at once, or, ``hold``, when the client closes it."""
    head = {"content-type": "text/event-stream", "cache-control": "no-cache"}
    return Reply(response(200, head, b"".join(events), sized=False), hold=hold)


def result(id: Any, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "result": value}


def text_result(id: Any, text: str) -> dict[str, Any]:
    """A ``tools/call`` result that says ``text``."""
    return result(id, {"content": [{"type": "text", "text": text}], "isError": False})


class HostileServer:
    """The server: :attr:`url` to give the link, the :attr:`requests` it
    received (in order), how many :attr:`sessions` it opened."""

    def __init__(self, script: Script, notices: frozenset[str] = frozenset()) -> None:
        self.script = script
        self.notices = notices  # the notifications the script answers (else 202)
        self.before: Before | None = None  # answers first, if it gives a reply (a redirect)
        self.url = ""
        self.requests: list[Request] = []
        self.hung_up: list[Request] = []  # those of held answers the client closed
        self.sessions = 0
        self._arrived = trio.Event()

    def count(self, method: str | None = None, *, rpc_method: str | None = None) -> int:
        """How many requests came with this HTTP method and JSON-RPC method (None: any)."""
        return sum(
            1
            for request in self.requests
            if method in (None, request.method) and rpc_method in (None, request.rpc_method)
        )

    async def wait_for(
        self, matches: Callable[[Request], bool], *, hung_up: bool = False
    ) -> Request:
        """The first request received that ``matches``, once there is one;
        ``hung_up``: the first whose held answer the client closed."""
        while True:
            for request in self.hung_up if hung_up else self.requests:
                if matches(request):
                    return request
            await self._arrived.wait()

    def _wake(self) -> None:
        self._arrived.set()
        self._arrived = trio.Event()

    def answer(self, request: Request) -> Reply:
        """The session's own part, or the script's (:attr:`before`'s first)."""
        if self.before is not None and (reply := self.before(request)) is not None:
            return reply
        if request.method == "POST" and request.rpc_method == "initialize":
            self.sessions += 1
            answer = result(
                request.id,
                {
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hostile", "version": "1"},
                },
            )
            return json_reply(answer, headers={SESSION_HEADER: f"session-{self.sessions}"})
        if request.method == "POST" and (request.rpc_method is None or request.id is None):
            return self.script(request) if request.rpc_method in self.notices else status_reply(202)
        if request.method == "DELETE":
            return status_reply(200)
        return self.script(request)

    async def serve(self, stream: trio.SocketStream) -> None:
        """One connection: one request, its answer, then closed or held."""
        async with stream:
            try:
                request = await _read_request(stream)
                if request is None:
                    return
                self.requests.append(request)
                self._wake()
                reply = self.answer(request)
                try:
                    await stream.send_all(reply.data)
                    if reply.hold:
                        while await stream.receive_some():
                            pass  # (until the client closes it)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # (the client went away mid-answer: clients may)
                if reply.hold:
                    self.hung_up.append(request)
                    self._wake()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # (the client went away before its request was read)


async def _read_request(stream: trio.SocketStream) -> Request | None:
    """The request on ``stream``; None if the client closed it first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    line, *fields = head.decode("latin-1").split("\r\n")
    headers = {}
    for field in fields:
        name, _, value = field.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = await stream.receive_some()
        if not chunk:
            return None
        body += chunk
    method, target, *_ = line.split(" ")
    return Request(method, headers, orjson.loads(body) if body else None, target)


@asynccontextmanager
async def open_hostile_server(
    script: Script, notices: frozenset[str] = frozenset()
) -> AsyncIterator[HostileServer]:
    """A :class:`HostileServer` on a free port of 127.0.0.1, for the block's
    time (held connections are cut when it ends); ``notices``: the
    notifications its script answers."""
    server = HostileServer(script, notices)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, server.serve, 0, host="127.0.0.1"))
        server.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/mcp"
        yield server
        nursery.cancel_scope.cancel()
