"""The metrics listener (``mcpbroker serve --metrics HOST:PORT``): Prometheus
scrapes ``http://HOST:PORT/metrics``.

A small HTTP/1.1 responder on Trio's sockets, with h11 doing the protocol:
one request per connection (answered with ``Connection: close``, which
every scraper handles), its head bounded in size and the whole exchange in
time. Who may scrape is broker/wire/scrape.py's decision; the body is what
``render(accept)`` returns (actors/metrics.py, run at each scrape, so the
figures are those of that moment).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from http import HTTPStatus
from typing import Any

import h11
import trio

from actors.logs import get_logger
from broker.wire.scrape import check_scrape
from broker.wire.websocket import Policy, Reject

MAX_HEAD_BYTES = 16 * 1024  # a scrape's request line and header fields, at most
RECEIVE_BYTES = 4096
EXCHANGE_TIMEOUT = 10.0  # seconds a client has to send its request and read the answer

_STATUSES = frozenset(HTTPStatus)

Render = Callable[[str], tuple[bytes, str]]  # Accept field -> (body, content type)


async def serve_metrics(
    host: str,
    port: int,
    policy: Callable[[], Policy],
    render: Render,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/metrics`` on ``host:port`` until cancelled; reports the port bound.
    ``policy()`` is asked at each request (a reload may change it)."""
    log = get_logger(listener="metrics")

    async def handle(stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(EXCHANGE_TIMEOUT):
                await _exchange(stream, policy(), render, log)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client left; nothing to answer
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, port, host=host))
        task_status.started(listeners[0].socket.getsockname()[1])


async def _exchange(stream: trio.SocketStream, policy: Policy, render: Render, log: Any) -> None:
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    try:
        request = await _read_request(stream, connection)
    except h11.RemoteProtocolError as exc:
        if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # (h11 allows an answer)
            await _send(stream, connection, exc.error_status_hint, f"Bad request: {exc}\n".encode())
        return
    if request is None:
        return  # closed before a whole request came
    method = request.method.decode("ascii", "replace")
    fields = [(bytes(name), bytes(value)) for name, value in request.headers]
    host = next((value for name, value in fields if name == b"host"), b"").decode("latin-1")
    decision = check_scrape(method, request.target.decode("latin-1"), host, fields, policy)
    if isinstance(decision, Reject):
        log.warning("metrics.refused", status=decision.status, reason=decision.reason)
        reason = decision.reason.encode() + b"\n"
        await _send(
            stream,
            connection,
            decision.status,
            b"" if method == "HEAD" else reason,
            [(k.encode(), v.encode()) for k, v in decision.headers],
            length=len(reason),
        )
        return
    accept = next((value for name, value in fields if name == b"accept"), b"").decode("latin-1")
    body, content_type = render(accept)
    await _send(
        stream,
        connection,
        200,
        b"" if method == "HEAD" else body,
        [(b"content-type", content_type.encode())],
        length=len(body),
    )


async def _read_request(
    stream: trio.SocketStream, connection: h11.Connection
) -> h11.Request | None:
    """The request's head (its body, if any, is not read: a scrape has none)."""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await stream.receive_some(RECEIVE_BYTES))
            continue
        return event if isinstance(event, h11.Request) else None


async def _send(
    stream: trio.SocketStream,
    connection: h11.Connection,
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    length: int | None = None,
) -> None:
    if not any(name == b"content-type" for name, _ in headers or ()):
        headers = [*(headers or ()), (b"content-type", b"text/plain; charset=utf-8")]
    fields = [
        *(headers or ()),
        (b"content-length", str(len(body) if length is None else length).encode()),
        (b"connection", b"close"),
    ]
    reason = HTTPStatus(status).phrase.encode() if status in _STATUSES else b""
    data = connection.send(h11.Response(status_code=status, headers=fields, reason=reason))
    if body:
        data += connection.send(h11.Data(data=body))
    data += connection.send(h11.EndOfMessage())
    await stream.send_all(data)
