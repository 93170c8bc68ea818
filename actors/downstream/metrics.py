"""The metrics listener (``mcpbroker serve --metrics HOST:PORT``): Prometheus
scrapes ``http://HOST:PORT/metrics``.

A small HTTP/1.1 responder on Trio's sockets, with h11 doing the protocol:
one request per connection (answered with ``Connection: close``, which
every scraper handles), its head bounded in size and the whole exchange in
time. Who may scrape is broker/wire/scrape.py's decision; the body is what
``render(accept)`` returns (actors/metrics.py, run at each scrape, so the
figures are those of that moment).

Any local user can reach a loopback port, token or not, so the listener is
bounded for the daemon's sake: at most :data:`MAX_CONNECTIONS` at once (more
are closed as they come: they held the daemon's file descriptors, and its
own socket could then take no host), a request head within
:data:`HEAD_TIMEOUT`, one render at a time and spaced so rendering takes at
most :data:`RENDER_SHARE` of the event loop (a scrape loop slowed every
session), refusals logged within a budget, and nothing a request does can
reach the daemon's nursery.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from http import HTTPStatus
from typing import Any

import h11
import trio

from actors.logs import get_logger
from actors.stderr import LineBudget
from broker.wire.scrape import check_scrape
from broker.wire.websocket import Policy, Reject

MAX_HEAD_BYTES = 16 * 1024  # a scrape's request line and header fields, at most
RECEIVE_BYTES = 4096
EXCHANGE_TIMEOUT = 10.0  # seconds a client has to send its request and read the answer
HEAD_TIMEOUT = 3.0  # seconds a client has to send its request's head
MAX_CONNECTIONS = 16  # at once; more are closed as they are accepted
RENDER_SHARE = 0.1  # of the event loop's time that rendering may take, at most
REFUSALS_BURST = 20  # refusals logged at once; then REFUSALS_RATE a second
REFUSALS_RATE = 1.0

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
    guard = _Guard(render, log)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            if guard.connections >= MAX_CONNECTIONS:
                guard.refused(503, f"more than {MAX_CONNECTIONS} connections at once")
                return
            guard.connections += 1
            try:
                with trio.move_on_after(EXCHANGE_TIMEOUT):
                    await _exchange(stream, policy(), guard)
            finally:
                guard.connections -= 1
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client left; nothing to answer
        except Exception:  # a bug of the broker's: this scrape, not the daemon
            log.exception("metrics.failed")
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, port, host=host))
        task_status.started(listeners[0].socket.getsockname()[1])


class _Guard:
    """What the listener's connections share: how many are open, the render
    (one at a time, spaced), the budget of refusals logged."""

    def __init__(self, render: Render, log: Any) -> None:
        self.connections = 0
        self._render = render
        self._log = log
        self._rendering = trio.Lock()
        self._next_render = -float("inf")
        self._budget = LineBudget(REFUSALS_BURST, REFUSALS_RATE, now=trio.current_time())
        self._unlogged = 0

    async def render(self, accept: str) -> tuple[bytes, str]:
        async with self._rendering:
            await trio.sleep_until(self._next_render)
            began = time.perf_counter()
            answer = self._render(accept)
            spent = time.perf_counter() - began
            self._next_render = trio.current_time() + spent * (1 / RENDER_SHARE - 1)
            return answer

    def refused(self, status: int, reason: str) -> None:
        if not self._budget.take(1, trio.current_time()):
            self._unlogged += 1
            return
        more = {"not_logged_before": self._unlogged} if self._unlogged else {}
        self._log.warning("metrics.refused", status=status, reason=reason, **more)
        self._unlogged = 0


async def _exchange(stream: trio.SocketStream, policy: Policy, guard: _Guard) -> None:
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    try:
        with trio.move_on_after(HEAD_TIMEOUT) as head:
            request = await _read_request(stream, connection)
        if head.cancelled_caught:
            return
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
        guard.refused(decision.status, decision.reason)
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
    body, content_type = await guard.render(accept)
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
