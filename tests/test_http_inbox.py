"""What a legacy Streamable HTTP session's POSTs may make the daemon hold
(actors/downstream/http.py, ``HttpConnection.let_in``): the bodies waiting
for the session's reader are bounded in bytes (``broker.maxQueuedBytes``), and
a POST past the bound waits with its body unread in its socket.

A scripted session stands in for the Session actor, so that its reader can
lag at will; the listener, and in the last test its HTTP server on real
loopback sockets, are the real ones."""

from __future__ import annotations

from typing import Any

import orjson
import trio
import trio.testing

from actors.downstream.http import HttpConnection, HttpListener
from actors.downstream.http_server import HttpServer
from broker.wire.websocket import Policy

HEADERS = [(b"host", b"127.0.0.1"), (b"accept", b"application/json, text/event-stream")]
LIMIT = 1 << 20  # broker.maxMessageBytes
QUEUED = 1 << 20  # broker.maxQueuedBytes


def notification(size: int) -> bytes:
    """A client notification whose body is ``size`` bytes."""
    head = b'{"jsonrpc":"2.0","method":"notifications/padding","params":{"pad":"'
    tail = b'"}}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


class Lagging:
    """Sessions that answer every request; the first one's reader, once it
    has answered initialize, reads nothing more until ``go`` is set."""

    def __init__(self) -> None:
        self.go = trio.Event()
        self.read: list[bytes] = []  # the bodies the lagging session read, in order
        self.opened = 0

    async def __call__(self, connection: HttpConnection, view: Any, transparent: bool) -> None:
        self.opened += 1
        lagging = self.opened == 1
        try:
            while True:
                frames, _ = await connection.receive()
                if not frames:
                    return
                message = orjson.loads(frames[0])
                if "id" in message:
                    result = {"protocolVersion": "2025-06-18", "echo": message["method"]}
                    answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
                    await connection.send([answer])
                    if lagging and message["method"] == "initialize":
                        await self.go.wait()
                elif lagging:
                    self.read.append(bytes(frames[0]))
        finally:
            await connection.aclose()


def initialize_body() -> bytes:
    params = {"protocolVersion": "2025-06-18", "capabilities": {}}
    return orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})


class Asgi:
    """Calls the listener as the HTTP server would, noting what it read."""

    def __init__(self, app: HttpListener) -> None:
        self.app = app
        self.bodies_read = 0  # POSTs whose body the listener asked for

    async def post(self, body: bytes, session: str | None = None, declared: bool = True) -> int:
        headers = list(HEADERS)
        if session is not None:
            headers.append((b"mcp-session-id", session.encode()))
        if declared:
            headers.append((b"content-length", str(len(body)).encode()))
        else:
            headers.append((b"transfer-encoding", b"chunked"))
        incoming = [{"type": "http.request", "body": body}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if incoming:
                self.bodies_read += 1
                return incoming.pop(0)
            await trio.sleep_forever()
            raise AssertionError

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}
        await self.app(scope, receive, send)
        self.last_headers = dict(sent[0]["headers"])
        return int(sent[0]["status"])

    async def open_session(self) -> str:
        assert await self.post(initialize_body()) == 200
        return self.last_headers[b"mcp-session-id"].decode()


async def test_bodies_past_the_bytes_bound_wait_unread(autojump_clock: Any) -> None:
    sessions = Lagging()
    app = HttpListener(lambda: Policy(), ["s"], LIMIT, QUEUED, sessions)
    asgi = Asgi(app)
    statuses: list[int] = []
    body = notification(300_000)  # three fit in QUEUED, a fourth does not

    async def post(session: str) -> None:
        statuses.append(await asgi.post(body, session))

    async with trio.open_nursery() as nursery:
        await nursery.start(app.run)
        session = await asgi.open_session()
        connection = app.sessions[session]
        read_before = asgi.bodies_read
        for _ in range(20):
            nursery.start_soon(post, session)
        await trio.testing.wait_all_tasks_blocked()
        # Items alone (16) would have let every body in: 16 in the inbox,
        # the others read and waiting for room, 6 MB for a 1 MB bound.
        assert asgi.bodies_read - read_before == 3
        assert connection.inbox_bytes == 3 * len(body) <= QUEUED
        assert statuses == [202] * 3  # handed to the session: accepted

        sessions.go.set()  # the reader catches up; the others go in turn
        await trio.testing.wait_all_tasks_blocked()
        assert statuses == [202] * 20
        assert sessions.read == [body] * 20
        assert connection.inbox_bytes == 0
        nursery.cancel_scope.cancel()


async def test_a_body_of_no_declared_length_counts_as_the_largest(autojump_clock: Any) -> None:
    sessions = Lagging()
    app = HttpListener(lambda: Policy(), ["s"], LIMIT, QUEUED, sessions)
    asgi = Asgi(app)
    statuses: list[int] = []

    async def post(session: str) -> None:
        statuses.append(await asgi.post(notification(1000), session, declared=False))

    async with trio.open_nursery() as nursery:
        await nursery.start(app.run)
        session = await asgi.open_session()
        connection = app.sessions[session]
        read_before = asgi.bodies_read
        for _ in range(3):
            nursery.start_soon(post, session)
        await trio.testing.wait_all_tasks_blocked()
        # The first is let in as LIMIT bytes (the whole bound); read, it
        # counts as what it was, and the next is still LIMIT bytes too many.
        assert asgi.bodies_read - read_before == 1
        assert connection.inbox_bytes == 1000
        sessions.go.set()
        await trio.testing.wait_all_tasks_blocked()
        assert statuses == [202] * 3 and len(sessions.read) == 3
        assert connection.inbox_bytes == 0
        nursery.cancel_scope.cancel()


async def test_posts_waiting_for_room_get_404_when_the_session_ends(autojump_clock: Any) -> None:
    sessions = Lagging()
    app = HttpListener(lambda: Policy(), ["s"], LIMIT, QUEUED, sessions)
    asgi = Asgi(app)
    statuses: list[int] = []
    body = notification(QUEUED)  # one at a time

    async def post(session: str) -> None:
        statuses.append(await asgi.post(body, session))

    async with trio.open_nursery() as nursery:
        await nursery.start(app.run)
        session = await asgi.open_session()
        for _ in range(3):
            nursery.start_soon(post, session)
        await trio.testing.wait_all_tasks_blocked()
        assert statuses == [202]
        app.sessions[session].end("test")
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(statuses) == [202, 404, 404]
        assert app.sessions == {}
        nursery.cancel_scope.cancel()


async def test_a_body_over_the_limit_is_refused_without_waiting_for_room(
    autojump_clock: Any,
) -> None:
    sessions = Lagging()
    app = HttpListener(lambda: Policy(), ["s"], LIMIT, QUEUED, sessions)
    asgi = Asgi(app)
    async with trio.open_nursery() as nursery:
        await nursery.start(app.run)
        session = await asgi.open_session()
        assert await asgi.post(notification(QUEUED), session) == 202  # (the inbox is full)
        with trio.fail_after(1):
            assert await asgi.post(notification(LIMIT + 1), session) == 413
        nursery.cancel_scope.cancel()


# -- on real sockets ------------------------------------------------------------


class Counting:
    """The listener under the HTTP server, counting the body bytes it read."""

    def __init__(self, app: HttpListener) -> None:
        self.app = app
        self.body_bytes = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def counted() -> dict[str, Any]:
            message = await receive()
            self.body_bytes += len(message.get("body", b""))
            return dict(message)

        await self.app(scope, counted, send)


def request(
    body: bytes, session: bytes | None = None, accept: bytes = b"application/json"
) -> bytes:
    head = (
        b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"accept: %b\r\ncontent-length: %d\r\n" % (accept, len(body))
    )
    if session is not None:
        head += b"mcp-session-id: " + session + b"\r\n"
    return head + b"\r\n" + body


async def answer_of(stream: trio.SocketStream) -> tuple[bytes, bytes]:
    """A response's head and (Content-Length framed) body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    while len(body) < int(fields[b"content-length"]):
        body += await stream.receive_some(65536)
    return head, body


async def test_many_large_posts_to_a_lagging_session_hold_the_bound_on_sockets() -> None:
    sessions = Lagging()
    limit, queued, size, posts = 4 << 20, 4 << 20, 1 << 20, 24
    listener = HttpListener(lambda: Policy(), ["s"], limit, queued, sessions)
    counting = Counting(listener)
    body = notification(size)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.run)
            port = await nursery.start(HttpServer(counting).serve, "127.0.0.1", 0)

            async def initialize() -> tuple[trio.SocketStream, bytes]:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(request(initialize_body()))
                head, _ = await answer_of(stream)
                session = head.split(b"mcp-session-id: ")[1].split(b"\r\n")[0]
                return stream, session

            _, lagging = await initialize()
            statuses: list[bytes] = []

            async def post() -> None:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(request(body, lagging))
                head, _ = await answer_of(stream)
                statuses.append(head.split(b"\r\n")[0])

            before = counting.body_bytes
            for _ in range(posts):
                nursery.start_soon(post)
            # The bodies the listener took from the sockets while the session
            # lags: the bound's worth. (Items alone would have read them all.)
            while counting.body_bytes - before < queued or len(statuses) < queued // size:
                assert counting.body_bytes - before <= queued
                await trio.sleep(0.02)
            for _ in range(20):  # and no more, however long they wait
                await trio.sleep(0.05)
                assert counting.body_bytes - before == queued
            assert len(statuses) == queued // size

            # Meanwhile another client's session is served as ever.
            other, session = await initialize()
            ping = orjson.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"})
            await other.send_all(request(ping, session))
            head, answer = await answer_of(other)
            assert head.startswith(b"HTTP/1.1 200") and orjson.loads(answer)["id"] == 2

            sessions.go.set()
            while len(statuses) < posts or len(sessions.read) < posts:
                await trio.sleep(0.05)
            assert statuses == [b"HTTP/1.1 202 Accepted"] * posts
            assert sessions.read == [body] * posts
            assert listener.sessions[lagging.decode()].inbox_bytes == 0
            nursery.cancel_scope.cancel()
