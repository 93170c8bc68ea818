"""The official-SDK test server (tests/servers/sdk_server.py) over HTTP.

Run as ``python -m tests.servers.http_server TRANSPORT PORT`` with TRANSPORT
``streamable-http`` (endpoint ``/mcp``) or ``sse`` (``/sse``), on 127.0.0.1.
Environment: ``SDK_SERVER_NAME`` as for the stdio server; ``REQUIRE_TOKEN``:
every request must carry ``Authorization: Bearer <it>`` (401 otherwise);
``JSON_RESPONSE=1``: Streamable HTTP answers come as JSON bodies, not streams;
``EVENT_STORE=1``: streams are resumable (event ids, ``retry`` 100 ms), and the
tool ``polled`` closes its call's stream, then asks the client (sampling),
so that its question and its answer reach the client on the stream polled
again (GET with ``Last-Event-ID``).

``POST /forget`` makes the server forget every session it has given out so
far: requests carrying one of their ids get 404 from then on, as from a
server whose sessions expired. A POST whose body holds ``fail_with_500``
gets ``500 boom``; one whose body holds ``answer_as_lines`` gets a 200
``application/json`` body of two JSON lines (a notification, then the
answer), which is no JSON document; ``answer_nothing``, a 200 JSON body of
a notification alone; ``answer_html``, a 200 JSON body that is HTML.
``TLS_CERT`` and ``TLS_KEY`` (PEM files): serve https:// instead.
``GET /stats`` tells what clients sent:
``{"deleted": DELETEs of a session, "versions": the MCP-Protocol-Version
headers seen, "resumed": GETs with Last-Event-ID, "sessions": how many it
gave out}``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
import uvicorn
from mcp import types
from mcp.server.mcpserver import Context
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore

from tests.servers.sdk_server import server

TOKEN = os.environ.get("REQUIRE_TOKEN")


class Gate:
    """ASGI middleware: the bearer check, and forgotten sessions."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.given: set[str] = set()  # session ids handed out
        self.forgotten: set[str] = set()
        self.deleted = 0
        self.resumed = 0  # GETs with Last-Event-ID
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
            stats = {
                "deleted": self.deleted,
                "versions": sorted(self.versions),
                "resumed": self.resumed,
                "sessions": len(self.given),
            }
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
        if scope["method"] == "GET" and "last-event-id" in headers:
            self.resumed += 1

        if scope["method"] == "POST":
            body, receive = await _peek(receive)
            if b"fail_with_500" in body:
                await _answer(send, 500, b"boom")
                return
            log = {"level": "info", "data": "x"}
            note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": log})
            if b"answer_as_lines" in body:  # (as a server that streams NDJSON might)
                result = {"content": [{"type": "text", "text": "from lines"}]}
                answer = {"jsonrpc": "2.0", "id": json.loads(body)["id"], "result": result}
                lines = f"{note}\n{json.dumps(answer)}".encode()
                await _answer(send, 200, lines, b"application/json")
                return
            if b"answer_nothing" in body:
                await _answer(send, 200, note.encode(), b"application/json")
                return
            if b"answer_html" in body:
                await _answer(send, 200, b"<html>oops</html>", b"application/json")
                return

        async def remember(message: Any) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers", []):
                    if key.decode().lower() == "mcp-session-id":
                        self.given.add(value.decode())
            await send(message)

        await self.app(scope, receive, remember)


class MemoryEventStore(EventStore):
    """Every event kept, ids ``STREAM:N``: enough to replay a stream after an id."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []  # (event id, stream id, message)

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = f"{stream_id}:{len(self.events)}"
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> Any:
        ids = [event[0] for event in self.events]
        if last_event_id not in ids:
            return None
        stream = self.events[ids.index(last_event_id)][1]
        for event_id, stream_id, message in self.events[ids.index(last_event_id) + 1 :]:
            if stream_id == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream


@server.tool()
async def polled(ctx: Context) -> str:
    """Close this call's stream, then ask the client's model (sampling)."""
    await anyio.sleep(0.2)  # (the stream's priming event, its first id, has gone out)
    await ctx.close_sse_stream()
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="p"))
    result = await ctx.session.create_message(
        [message], max_tokens=5, related_request_id=ctx.request_id
    )
    return f"polled: {result.content.text}"


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


async def _answer(send: Any, status: int, body: bytes, media: bytes | None = None) -> None:
    headers = [] if media is None else [(b"content-type", media)]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def main(transport: str, port: int) -> None:
    if transport == "sse":
        app = server.sse_app(host="127.0.0.1")
    else:
        json = os.environ.get("JSON_RESPONSE") == "1"  # answers as JSON bodies, not streams
        resumable = os.environ.get("EVENT_STORE") == "1"
        app = server.streamable_http_app(
            host="127.0.0.1",
            json_response=json,
            event_store=MemoryEventStore() if resumable else None,
            retry_interval=100 if resumable else None,
        )
    config = uvicorn.Config(
        Gate(app),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        ssl_certfile=os.environ.get("TLS_CERT"),  # https://, with this certificate
        ssl_keyfile=os.environ.get("TLS_KEY"),
    )
    await uvicorn.Server(config).serve()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
