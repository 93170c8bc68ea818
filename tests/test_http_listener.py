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
