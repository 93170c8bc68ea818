"""The HTTP link's connections: httpx2's transport on a pool that costs the same
per request however many connections it keeps (docs/architecture.md, "The
HTTP link's connection pool").

httpcore2's ``AsyncConnectionPool`` looks over every connection it holds each
time a request starts or ends, and asks each idle one whether the server
closed it: a ``poll()`` system call per idle connection, twice per request.
A link holds as many connections as it has had requests in flight (HTTP/1.1
carries one request at a time, and a POST's SSE stream holds its connection
until the answer), up to 64; at that load the looking over cost more than the
rest of the request. :class:`ConnectionStack` keeps the idle connections of
each origin on a stack instead: a request takes the one used last (the one
most likely still open), asks only it, and gives it back when its response
is closed; the one idle longest is asked at the same time, so connections a
server closed are let go one by one.

The connections themselves are httpcore2's, made by the pool httpx2
configured (``create_connection``: TLS, keep-alive expiry, proxies and socket
options as given), and requests go through httpx2's transport unchanged
(its mapping of errors, its response streams). What the stack does not do:
wait for a connection (the link's tasks bound how many requests are open at
once: :data:`actors.links.http.MAX_STREAMS`) or share one connection among
requests (HTTP/2).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import httpcore2
import httpx2
import trio


class StackTransport(httpx2.AsyncHTTPTransport):
    """httpx2's transport (its options as ``httpx2.AsyncHTTPTransport``'s), its
    requests on a :class:`ConnectionStack` instead of httpcore2's pool."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        # (with a proxy, a subclass of it: its connections go through the proxy)
        assert isinstance(self._pool, httpcore2.AsyncConnectionPool)
        self.stack = ConnectionStack(self._pool)
        # The transport asks its pool for handle_async_request, aclose and the
        # async context manager's methods only.
        self._pool = self.stack  # type: ignore[assignment]


class ConnectionStack:
    """Idle connections per origin, the one used last on top; ``factory`` (a
    configured pool) makes new ones and is closed with the stack."""

    def __init__(self, factory: httpcore2.AsyncConnectionPool) -> None:
        self._factory = factory
        # (scheme, host, port) -> its idle connections, the one used last at the end
        self._idle: dict[tuple[bytes, bytes, int], deque[httpcore2.AsyncConnectionInterface]] = {}
        self._open: set[httpcore2.AsyncConnectionInterface] = set()

    @property
    def connections(self) -> list[httpcore2.AsyncConnectionInterface]:
        """Every open connection, idle or not (as httpcore2's pool shows them)."""
        return list(self._open)

    async def handle_async_request(self, request: httpcore2.Request) -> httpcore2.Response:
        origin = request.url.origin
        while True:
            connection = await self._take(origin)
            try:
                response = await connection.handle_async_request(request)
            except httpcore2.ConnectionNotAvailable:
                await self._release(origin, connection)  # (closed since it was asked)
                continue
            except BaseException:
                with trio.CancelScope(shield=True):
                    await self._release(origin, connection)
                raise
            assert isinstance(response.stream, AsyncIterable)
            return httpcore2.Response(
                status=response.status,
                headers=response.headers,
                content=_Released(response.stream, self, origin, connection),
                extensions=response.extensions,
            )

    async def __aenter__(self) -> ConnectionStack:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        closing, self._open = list(self._open), set()
        self._idle.clear()
        with trio.CancelScope(shield=True):
            for connection in closing:
                await connection.aclose()
            await self._factory.aclose()

    async def _take(self, origin: httpcore2.Origin) -> httpcore2.AsyncConnectionInterface:
        """The idle connection used last that the server has not closed, or a new one."""
        idle = self._idle.get((origin.scheme, origin.host, origin.port))
        while idle:
            connection = idle.pop()
            if not connection.has_expired():
                return connection
            await self._close(connection)
        connection = self._factory.create_connection(origin)
        self._open.add(connection)
        return connection

    async def _release(
        self, origin: httpcore2.Origin, connection: httpcore2.AsyncConnectionInterface
    ) -> None:
        """A request is done with ``connection``: on top of its stack if it can
        take another, else closed (a failed connect, an error, a server's close);
        then the one idle longest is let go if its time is up or the server
        closed it."""
        if connection.is_closed() or not connection.is_idle():
            await self._close(connection)
            return
        idle = self._idle.setdefault((origin.scheme, origin.host, origin.port), deque())
        idle.append(connection)
        if len(idle) > 1 and idle[0].has_expired():
            await self._close(idle.popleft())

    async def _close(self, connection: httpcore2.AsyncConnectionInterface) -> None:
        self._open.discard(connection)
        with trio.CancelScope(shield=True):
            await connection.aclose()


class _Released:
    """A response's body; closing it gives its connection back to the stack."""

    def __init__(
        self,
        stream: AsyncIterable[bytes],
        stack: ConnectionStack,
        origin: httpcore2.Origin,
        connection: httpcore2.AsyncConnectionInterface,
    ) -> None:
        self._stream = stream
        self._stack = stack
        self._origin = origin
        self._connection = connection
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            if (aclose := getattr(self._stream, "aclose", None)) is not None:
                await aclose()
            await self._stack._release(self._origin, self._connection)
