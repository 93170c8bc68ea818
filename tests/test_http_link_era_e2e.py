"""The HTTP link speaks the era the Upstream tells it (``HttpLink.speak``),
never the one a request's ``_meta`` seems to name (docs/eras.md, "A modern
server by URL").

The link alone (actors/links/http.py) against real servers in processes of
their own: the official SDK's server over Streamable HTTP, legacy
(tests/servers/http_server.py) and modern only (tests/servers/era_server.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import structlog
import trio

from actors.links.http import HARD_LIMIT_FACTOR, HttpLink, launch_http
from actors.links.link import LinkContext
from broker.config import ServerConfig
from broker.eras.probe import discover_request
from broker.eras.versions import LATEST_MODERN_VERSION, PROTOCOL_VERSION_KEY
from broker.lifecycle import initialize_request
from broker.wire.frames import Failed
from tests.test_eras_http_upstream_e2e import era_http_server, stats
from tests.test_http_upstream_e2e import http_server


@asynccontextmanager
async def open_link(url: str) -> AsyncIterator[tuple[HttpLink, dict[Any, Any]]]:
    """A link to ``url``, and the answers it hands up, by id (as they come)."""
    answers: dict[Any, Any] = {}

    async def read(link: HttpLink) -> None:
        while frames := await link.receive():
            for frame in frames:
                assert isinstance(frame, bytes), frame
                message = orjson.loads(frame)
                if "method" not in message:
                    answers[message.get("id")] = message

    async with trio.open_nursery() as nursery:
        context = LinkContext(nursery, 4 << 20, structlog.get_logger())
        link = await launch_http(ServerConfig(url=url), context)
        nursery.start_soon(read, link)
        try:
            yield link, answers
        finally:
            await link.close()
            nursery.cancel_scope.cancel()


async def answer_to(answers: dict[Any, Any], id: Any) -> Any:
    while id not in answers:
        await trio.sleep(0.02)
    return answers.pop(id)


def call(id: int, name: str, arguments: dict[str, Any], **params: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, **params},
    }


async def test_a_request_with_modern_keys_leaves_a_legacy_connection_legacy(
    tmp_path: Path,
) -> None:
    """A request that carries a modern version in its ``_meta`` (whoever put
    it there) goes on the legacy session like any other, and the requests
    and notifications after it too: the cancellation of a later call reaches
    the server. (Sniffing each request, the link took it for a modern one:
    it went without the session, and from then on every notification was
    dropped.)"""
    marker = tmp_path / "cancelled"
    with trio.fail_after(60):
        async with (
            http_server("streamable-http") as (url, _),
            open_link(url) as (link, answers),
        ):
            link.speak(None)  # what the Upstream says of a legacy server
            initialize = initialize_request("init")
            await link.send(link.encode([initialize]))
            assert "result" in await answer_to(answers, "init")
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            await link.send(link.encode([initialized]))

            modern_meta = {"_meta": {PROTOCOL_VERSION_KEY: LATEST_MODERN_VERSION}}
            await link.send(link.encode([call(1, "echo", {"text": "hi"}, **modern_meta)]))
            echoed = await answer_to(answers, 1)
            assert echoed["result"]["content"][0]["text"] == "hi"

            await link.send(link.encode([call(2, "wait_for_cancel", {"marker": str(marker)})]))
            cancelled = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 2, "reason": "the test"},
            }
            for _ in range(5):  # (until its handler runs: a cancellation before is ignored)
                await trio.sleep(0.5)
                await link.send(link.encode([cancelled]))
                with trio.move_on_after(2):
                    while not marker.exists():
                        await trio.sleep(0.05)
                if marker.exists():
                    break
            assert marker.exists() and marker.read_text() == "cancelled"
            seen = await stats(url)
    assert LATEST_MODERN_VERSION not in seen["versions"]  # no request went modern
    assert seen["sessions"] == 1


async def test_a_link_told_modern_posts_each_request_at_once_without_initialize() -> None:
    """Told the server is modern, the link sends each request as its own
    POST with the told version in ``MCP-Protocol-Version``, even one whose
    ``_meta`` names none (the server says what is wrong with it), and never
    waits for an ``initialize``."""
    with trio.fail_after(60):
        async with era_http_server("modern") as url, open_link(url) as (link, answers):
            link.speak(LATEST_MODERN_VERSION)
            await link.send(link.encode([discover_request("probe")]))
            discovered = await answer_to(answers, "probe")
            assert LATEST_MODERN_VERSION in discovered["result"]["supportedVersions"]
            bare = {"jsonrpc": "2.0", "id": "bare", "method": "tools/list", "params": {}}
            await link.send(link.encode([bare]))
            with trio.fail_after(10):  # (as a legacy request it would wait for initialize)
                answered = await answer_to(answers, "bare")
            # (the modern handler's words: its own POST, at the told version)
            assert answered["error"]["code"] == -32602 and "_meta" in answered["error"]["message"]


async def serve_modern_posts(listener: trio.SocketListener, limit: int) -> None:
    """A 2026-07-28 server by hand, one POST per connection: the request whose
    id is "big" is answered with an SSE event past the link's hard limit (an
    ``httpx2.SSEError`` to read), "cut" with a JSON body that ends early, any
    other with a JSON answer."""

    async def serve(stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += await stream.receive_some(65536)
            id = orjson.loads(body)["id"]
            answer = orjson.dumps(
                {"jsonrpc": "2.0", "id": id, "result": {"resultType": "complete"}}
            )
            if id == "big":
                event = b"data: " + b"x" * (limit * HARD_LIMIT_FACTOR + 1) + b"\n\n"
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"connection: close\r\n\r\n" + event
                )
            elif id == "cut":
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n" % (len(answer) + 50) + answer
                )
            else:
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\nconnection: close\r\n\r\n" % len(answer) + answer
                )

    await trio.serve_listeners(serve, [listener])


async def test_one_modern_answer_that_breaks_fails_its_request_not_the_link() -> None:
    """A modern POST has no session: an answer that cannot be read (an SSE
    event past the hard limit, a body cut short) is that request's failure;
    the link goes on, and the next request is answered."""
    limit = 4096
    with trio.fail_after(30):
        async with trio.open_nursery() as servers:
            (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
            servers.start_soon(serve_modern_posts, listener, limit)
            port = listener.socket.getsockname()[1]
            answers: dict[Any, Any] = {}
            async with trio.open_nursery() as nursery:
                context = LinkContext(nursery, limit, structlog.get_logger())
                link = await launch_http(ServerConfig(url=f"http://127.0.0.1:{port}/mcp"), context)

                async def read() -> None:
                    while frames := await link.receive():
                        for frame in frames:
                            if isinstance(frame, bytes):
                                message = orjson.loads(frame)
                                answers[message.get("id")] = message
                            else:  # (a request the link failed: Failed(id, why))
                                answers[frame.request] = frame

                nursery.start_soon(read)
                link.speak(LATEST_MODERN_VERSION)
                meta = {PROTOCOL_VERSION_KEY: LATEST_MODERN_VERSION}
                for id in ("big", "cut", "after"):
                    request = {"jsonrpc": "2.0", "id": id, "method": "tools/list",
                               "params": {"_meta": meta}}  # fmt: skip
                    await link.send(link.encode([request]))
                big, cut = await answer_to(answers, "big"), await answer_to(answers, "cut")
                assert isinstance(big, Failed) and "an SSE event of over" in big.detail, big
                assert isinstance(cut, Failed) and "broke off" in cut.detail
                after = await answer_to(answers, "after")
                assert after["result"] == {"resultType": "complete"}
                await link.close()
                nursery.cancel_scope.cancel()
            servers.cancel_scope.cancel()
