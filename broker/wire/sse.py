"""Server-Sent Events: how messages go out on a Streamable HTTP stream.

One JSON-RPC message per event (``data:``), each with an ``id:`` a client can
resume after (``Last-Event-ID``). The text/event-stream format
(https://html.spec.whatwg.org/multipage/server-sent-events.html) joins the
``data:`` lines of one event with newlines, so a message that holds a raw
newline (JSON allows one between tokens) is written as several ``data:``
lines and reaches the client unchanged. A comment line (``:``) keeps an idle
connection alive and is ignored by clients.
"""

from __future__ import annotations

CONTENT_TYPE = "text/event-stream"
KEEPALIVE = b": keep-alive\n\n"
# A stream (or a waiting answer) with nothing to say writes KEEPALIVE after
# KEEPALIVE_SECONDS to KEEPALIVE_SECONDS * (1 + 1/KEEPALIVE_TICKS) of silence:
# the listener looks every TICK_SECONDS, not per stream.
KEEPALIVE_SECONDS = 15.0
KEEPALIVE_TICKS = 3
TICK_SECONDS = KEEPALIVE_SECONDS / KEEPALIVE_TICKS


def event(data: bytes, id: str | None = None) -> bytes:
    """One ``message`` event carrying ``data`` (one message's bytes)."""
    head = b"id: " + id.encode() + b"\n" if id is not None else b""
    if data.find(b"\n") >= 0 or data.find(b"\r") >= 0:  # (see broker/jsonrpc.py LONG)
        lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        return head + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
    return head + b"data: " + data + b"\n\n"


def priming(id: str, retry_ms: int | None = None) -> bytes:
    """The event that opens a resumable stream: an id and empty data (MCP
    2025-11-25), so that a client can reconnect with ``Last-Event-ID`` before
    any message came; ``retry`` says how long it should wait before it does."""
    retry = b"retry: %d\n" % retry_ms if retry_ms is not None else b""
    return b"id: " + id.encode() + b"\n" + retry + b"data: \n\n"
