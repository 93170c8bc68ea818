"""The HTTP listener's actor side (actors/downstream/http.py), its ASGI app
called directly, a scripted session behind it, under trio's autojump clock."""

from __future__ import annotations

from typing import Any

import orjson
import trio

from actors.downstream.http import IDLE_SECONDS, HttpConnection, HttpListener
from broker.wire import sse
from broker.wire.websocket import Policy

HEADERS = [(b"host", b"127.0.0.1"), (b"accept", b"application/json, text/event-stream")]


async def answering(connection: HttpConnection, view: Any, transparent: bool) -> None:
    """A session that answers every request with the version it was asked for."""
    try:
        while True:
            frames, _ = await connection.receive()
            if not frames:
                return
            message = orjson.loads(frames[0])
            if "id" in message and "method" in message:
                version = message.get("params", {}).get("protocolVersion", "2025-06-18")
                result = {"protocolVersion": version, "echo": message["method"]}
                await connection.send([{"jsonrpc": "2.0", "id": message["id"], "result": result}])
    finally:
        await connection.aclose()


async def call(
    app: HttpListener, method: str, body: Any = None, session: str | None = None
) -> tuple[int, dict[bytes, bytes], bytes]:
    headers = list(HEADERS)
    if session is not None:
        headers.append((b"mcp-session-id", session.encode()))
    incoming = [{"type": "http.request", "body": orjson.dumps(body) if body else b""}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await trio.sleep_forever()
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": "/mcp", "headers": headers}
    await app(scope, receive, send)
    start, *bodies = sent
    return start["status"], dict(start["headers"]), b"".join(b.get("body", b"") for b in bodies)


def initialize(id: int = 1) -> dict[str, Any]:
    params = {"protocolVersion": "2025-06-18", "capabilities": {}}
    return {"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params}


async def test_a_session_nobody_uses_expires(autojump_clock: Any) -> None:
    app = HttpListener(lambda: Policy(), ["s"], 1 << 20, 1 << 20, answering)
    async with trio.open_nursery() as nursery:
        await nursery.start(app.run)
        status, headers, body = await call(app, "POST", initialize())
        assert status == 200 and orjson.loads(body)["result"]["echo"] == "initialize"
        session = headers[b"mcp-session-id"].decode()
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        await trio.sleep(IDLE_SECONDS / 2)
        assert (await call(app, "POST", ping, session))[0] == 200  # used: the clock restarts
        await trio.sleep(IDLE_SECONDS / 2 + 1)
        assert (await call(app, "POST", ping, session))[0] == 200
        await trio.sleep(IDLE_SECONDS + 60)
        assert (await call(app, "POST", ping, session))[0] == 404
        assert app.sessions == {}
        nursery.cancel_scope.cancel()


async def test_a_failed_initialize_leaves_no_session(autojump_clock: Any) -> None:
    async def refusing(connection: HttpConnection, view: Any, transparent: bool) -> None:
        try:
            await connection.receive()
            error = {"code": -32602, "message": "no"}
            await connection.send([{"jsonrpc": "2.0", "id": 1, "error": error}])
            await trio.sleep_forever()
        finally:
            await connection.aclose()

    app = HttpListener(lambda: Policy(), ["s"], 1 << 20, 1 << 20, refusing)
    async with trio.open_nursery() as nursery:
        await nursery.start(app.run)
        status, headers, body = await call(app, "POST", initialize())
        assert status == 200 and "error" in orjson.loads(body)
        assert b"mcp-session-id" not in headers
        await trio.sleep(1)
        assert app.sessions == {}
        nursery.cancel_scope.cancel()


async def test_a_quiet_stream_writes_its_keepalive_comment(autojump_clock: Any) -> None:
    app = HttpListener(lambda: Policy(), ["s"], 1 << 20, 1 << 20, answering)
    async with trio.open_nursery() as nursery:
        await nursery.start(app.run)
        _, headers, _ = await call(app, "POST", initialize())
        session = headers[b"mcp-session-id"]
        sent: list[tuple[float, bytes]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append((trio.current_time(), message.get("body", b"")))

        async def receive() -> dict[str, Any]:
            await trio.sleep_forever()
            raise AssertionError

        fields = [*HEADERS, (b"mcp-session-id", session)]
        scope = {"type": "http", "method": "GET", "path": "/mcp", "headers": fields}
        start = trio.current_time()
        nursery.start_soon(app, scope, receive, send)
        await trio.sleep(50)
        comments = [at - start for at, body in sent if body == sse.KEEPALIVE]
        assert len(comments) == 3, sent  # one after every 15 to 20 s of quiet
        gaps = [b - a for a, b in zip([0.0, *comments], comments, strict=False)]
        assert all(15 <= gap <= 20 for gap in gaps), comments
        nursery.cancel_scope.cancel()


async def scripted(connection: HttpConnection, view: Any, transparent: bool) -> None:
    """Answers at once; a call with a progress token reports progress first;
    ``slow`` is answered after 40 s."""
    try:
        while True:
            frames, _ = await connection.receive()
            if not frames:
                return
            message = orjson.loads(frames[0])
            if "id" not in message:
                continue
            params = message.get("params", {})
            token = params.get("_meta", {}).get("progressToken")
            if token is not None:
                progress = {"progressToken": token, "progress": 1}
                notification = {"jsonrpc": "2.0", "method": "notifications/progress"}
                await connection.send([{**notification, "params": progress}])
            if message["method"] == "slow":
                await trio.sleep(40)
            result = {"protocolVersion": "2025-11-25", "echo": message["method"]}
            await connection.send([{"jsonrpc": "2.0", "id": message["id"], "result": result}])
    finally:
        await connection.aclose()


def sse_events(body: bytes) -> list[bytes]:
    """The data of an SSE body's events, and a comment as itself."""
    found = []
    for block in body.split(b"\n\n"):
        if block.startswith(b":"):
            found.append(block)
        found += [line[6:] for line in block.split(b"\n") if line.startswith(b"data: ")]
    return found


async def test_a_post_is_answered_in_json_unless_something_goes_first(
    autojump_clock: Any,
) -> None:
    app = HttpListener(lambda: Policy(), ["s"], 1 << 20, 1 << 20, scripted)
    async with trio.open_nursery() as nursery:
        await nursery.start(app.run)
        _, headers, _ = await call(app, "POST", initialize())
        session = headers[b"mcp-session-id"].decode()

        # the answer first: JSON, though the client accepts SSE too
        status, headers, body = await call(
            app, "POST", {**initialize(2), "method": "quick"}, session
        )
        assert status == 200 and headers[b"content-type"] == b"application/json"
        assert orjson.loads(body)["result"]["echo"] == "quick"

        # progress first: an SSE stream, the progress, then the answer
        meta = {"_meta": {"progressToken": "p"}}
        progress_call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": meta}
        status, headers, body = await call(app, "POST", progress_call, session)
        assert status == 200 and headers[b"content-type"] == sse.CONTENT_TYPE.encode()
        events = [orjson.loads(e) for e in sse_events(body) if e]  # (the priming event: empty)
        assert [e.get("method") for e in events] == ["notifications/progress", None]
        assert events[0]["params"]["progressToken"] == "p" and events[1]["id"] == 3
        nursery.cancel_scope.cancel()


async def test_a_post_quiet_for_long_turns_sse_for_its_keepalive(autojump_clock: Any) -> None:
    app = HttpListener(lambda: Policy(), ["s"], 1 << 20, 1 << 20, scripted)
    async with trio.open_nursery() as nursery:
        await nursery.start(app.run)
        _, headers, _ = await call(app, "POST", initialize())
        session = headers[b"mcp-session-id"]
        sent: list[tuple[float, dict[str, Any]]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append((trio.current_time(), message))

        incoming = [
            {"type": "http.request", "body": orjson.dumps({**initialize(2), "method": "slow"})}
        ]

        async def receive() -> dict[str, Any]:
            if incoming:
                return incoming.pop(0)
            await trio.sleep_forever()
            raise AssertionError

        fields = [*HEADERS, (b"mcp-session-id", session)]
        scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": fields}
        start = trio.current_time()
        await app(scope, receive, send)
        (at, head), *bodies = sent
        assert dict(head["headers"])[b"content-type"] == sse.CONTENT_TYPE.encode()
        assert 15 <= at - start <= 20  # the head goes once the stream owes its client a word
        # its first write: the priming event (a 2025-11-25 session), the comment
        first = bodies[0][1]["body"]
        assert first.startswith(b"id: ") and first.endswith(b"\ndata: \n\n" + sse.KEEPALIVE)
        body = b"".join(message["body"] for _, message in bodies)
        events = [e for e in sse_events(body) if e]
        assert events == [sse.KEEPALIVE.strip()] * (len(events) - 1) + [events[-1]]
        assert orjson.loads(events[-1])["result"]["echo"] == "slow"
        assert bodies[-1][0] - start >= 40
        nursery.cancel_scope.cancel()


async def test_a_post_whose_request_is_cancelled_ends_and_its_id_is_free(
    autojump_clock: Any,
) -> None:
    """A request the client cancels gets no answer (MCP's cancellation): its
    POST is answered 202, and its id may be used again. It stayed in flight
    on its stream for the whole session (a JSON batch never answered; an
    SSE stream never ended; the id refused as in use)."""
    app = HttpListener(lambda: Policy(), ["s"], 1 << 20, 1 << 20, scripted)
    async with trio.open_nursery() as nursery:
        await nursery.start(app.run)
        _, headers, _ = await call(app, "POST", initialize())
        session = headers[b"mcp-session-id"].decode()
        answered: list[tuple[float, int]] = []

        async def slow() -> None:
            request = {"jsonrpc": "2.0", "id": 7, "method": "slow"}
            status, _, _ = await call(app, "POST", request, session)
            answered.append((trio.current_time(), status))

        nursery.start_soon(slow)
        await trio.sleep(1)
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled"}
        status, _, _ = await call(app, "POST", {**cancel, "params": {"requestId": 7}}, session)
        assert status == 202
        await trio.sleep(1)
        assert answered and answered[0][1] == 202 and answered[0][0] < 5
        again = {"jsonrpc": "2.0", "id": 7, "method": "quick"}
        status, _, body = await call(app, "POST", again, session)  # (after slow's 40 s)
        assert status == 200 and orjson.loads(body)["result"]["echo"] == "quick"
        nursery.cancel_scope.cancel()
