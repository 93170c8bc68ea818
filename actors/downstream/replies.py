"""Writing an HTTP response through the server's ASGI-shaped ``send``: the two
calls every listener makes (actors/downstream/http.py for legacy sessions,
http_modern.py for 2026-07-28 requests), so that neither writes them again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

# The listener's side of one HTTP exchange (actors/downstream/http_server.py).
Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


async def respond(
    send: Send, status: int, body: bytes = b"", fields: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    """A whole response: ``body`` (JSON, if any) with its length, and ``fields``."""
    headers = [(b"content-length", str(len(body)).encode()), *fields]
    if body:
        headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def write(send: Send, data: bytes, more: bool = True) -> None:
    """More of a streamed body (an SSE event, a keep-alive); the last if not ``more``."""
    await send({"type": "http.response.body", "body": data, "more_body": more})
