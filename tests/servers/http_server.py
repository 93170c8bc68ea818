"""The official-SDK test server (tests/servers/sdk_server.py) over HTTP.

Run as ``python -m tests.servers.http_server TRANSPORT PORT`` with TRANSPORT
``streamable-http`` (endpoint ``/mcp``) or ``sse`` (``/sse``), on 127.0.0.1.
Environment: ``SDK_SERVER_NAME`` as for the stdio server; ``REQUIRE_TOKEN``:
every request must carry ``Authorization: Bearer <it>`` (401 otherwise);
``JSON_RESPONSE=1``: Streamable HTTP answers come as JSON bodies, not streams.

``POST /forget`` makes the server forget every session it has given out so
far: requests carrying one of their ids get 404 from then on, as from a
server whose sessions expired. A POST whose body holds ``fail_with_500``
gets ``500 boom``. ``GET /stats`` tells what clients sent:
``{"deleted": DELETEs of a session, "versions": the MCP-Protocol-Version
headers seen}``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
import uvicorn

from tests.servers.sdk_server import server

TOKEN = os.environ.get("REQUIRE_TOKEN")


class Gate:
    """ASGI middleware: the bearer check, and forgotten sessions."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.given: set[str] = set()  # session ids handed out
        self.forgotten: set[str] = set()
        self.deleted = 0
        self.versions: set[str] = set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if scope["path"] == "/forget":
            self.forgotten |= self.given
            await _answer(send, 200, b"forgotten")
            return
        if scope["path"] == "/stats":
            stats = {"deleted": self.deleted, "versions": sorted(self.versions)}
            await _answer(send, 200, json.dumps(stats).encode())
            return
        if TOKEN is not None and headers.get("authorization") != f"Bearer {TOKEN}":
            await _answer(send, 401, b"unauthorized")
            return
        if headers.get("mcp-session-id") in self.forgotten:
            await _answer(send, 404, b"session not found")
            return
        if "mcp-protocol-version" in headers:
            self.versions.add(headers["mcp-protocol-version"])
        if scope["method"] == "DELETE" and "mcp-session-id" in headers:
            self.deleted += 1

        if scope["method"] == "POST":
            body, receive = await _peek(receive)
            if b"fail_with_500" in body:
                await _answer(send, 500, b"boom")
                return

        async def remember(message: Any) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers", []):
                    if key.decode().lower() == "mcp-session-id":
                        self.given.add(value.decode())
            await send(message)

        await self.app(scope, receive, remember)


async def _peek(receive: Any) -> tuple[bytes, Any]:
    """A request's body, and a ``receive`` that gives it again to the app."""
    messages, body = [], b""
    while True:
        message = await receive()
        messages.append(message)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break

    async def again() -> Any:
        return messages.pop(0) if messages else await receive()

    return body, again


async def _answer(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})


async def main(transport: str, port: int) -> None:
    if transport == "sse":
        app = server.sse_app(host="127.0.0.1")
    else:
        json = os.environ.get("JSON_RESPONSE") == "1"  # answers as JSON bodies, not streams
        app = server.streamable_http_app(host="127.0.0.1", json_response=json)
    config = uvicorn.Config(Gate(app), host="127.0.0.1", port=port, log_level="warning")
    await uvicorn.Server(config).serve()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
