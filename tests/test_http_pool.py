"""The HTTP link's connections (actors/links/http_pool.py): httpx2 on a stack of
idle connections, against a small HTTP/1.1 server on a real loopback socket
that numbers its connections (each answer says which one carried it) and can
hold an answer or close its idle connections, as servers do."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import h11
import httpcore2
import httpx2
import pytest
import trio

from actors.links.http_pool import StackTransport

TIMEOUT = 10


class Server:
    """``GET /`` answers the connection's number; ``GET /held`` sends its head,
    then its body once ``release`` is set. :meth:`close_idle` closes every
    connection that waits for a request, as a server's keep-alive timeout does."""

    def __init__(self) -> None:
        self.accepted = 0
        self.closed = 0  # connections ended (by either side)
        self.release = trio.Event()
        self._idle: dict[int, trio.SocketStream] = {}

    async def handle(self, stream: trio.SocketStream) -> None:
        self.accepted += 1
        number = self.accepted
        connection = h11.Connection(h11.SERVER)
        try:
            while True:
                event = await self._next(connection, stream, number)
                if not isinstance(event, h11.Request):
                    return
                while not isinstance(await self._next(connection, stream), h11.EndOfMessage):
                    pass
                if event.target.endswith(b"/held"):
                    await self._send(connection, stream, h11.Response(status_code=200, headers=[]))
                    await self.release.wait()
                    await self._send(connection, stream, h11.Data(data=str(number).encode()))
                else:
                    body = str(number).encode()
                    head = [("content-length", str(len(body)))]
                    await self._send(
                        connection, stream, h11.Response(status_code=200, headers=head)
                    )
                    await self._send(connection, stream, h11.Data(data=body))
                await self._send(connection, stream, h11.EndOfMessage())
                connection.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            self._idle.pop(number, None)
            self.closed += 1
            await stream.aclose()

    async def close_idle(self) -> None:
        for stream in list(self._idle.values()):
            await stream.aclose()
        await wait_until(lambda: not self._idle)

    async def _next(
        self, connection: h11.Connection, stream: trio.SocketStream, idle: int | None = None
    ) -> Any:
        while (event := connection.next_event()) is h11.NEED_DATA:
            if idle is not None:
                self._idle[idle] = stream
            data = await stream.receive_some()
            self._idle.pop(idle or 0, None)
            connection.receive_data(data)
        return event

    async def _send(
        self, connection: h11.Connection, stream: trio.SocketStream, event: Any
    ) -> None:
        await stream.send_all(connection.send(event) or b"")


async def wait_until(condition: Any) -> None:
    while not condition():
        await trio.sleep(0.005)


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[Server, httpx2.AsyncClient, StackTransport]]:
    server = Server()
    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(
            partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1")
        )
        port = listener.socket.getsockname()[1]
        transport = StackTransport(limits=httpx2.Limits(keepalive_expiry=30))
        base = f"http://127.0.0.1:{port}"
        async with httpx2.AsyncClient(transport=transport, base_url=base) as client:
            yield server, client, transport
        nursery.cancel_scope.cancel()


async def number(client: httpx2.AsyncClient, url: str = "/") -> int:
    """Which of the server's connections answered a ``GET /``."""
    response = await client.get(url)
    assert response.status_code == 200
    return int(response.text)


async def test_requests_one_after_another_share_one_connection() -> None:
    with trio.fail_after(TIMEOUT):
        async with serving() as (server, client, transport):
            assert [await number(client) for _ in range(5)] == [1] * 5
            assert server.accepted == 1 and len(transport.stack.connections) == 1


async def test_requests_at_once_each_take_a_connection_and_the_last_one_back_goes_first() -> None:
    with trio.fail_after(TIMEOUT):
        async with serving() as (server, client, transport):
            order: list[int] = []

            async def held() -> None:
                async with client.stream("GET", "/held") as response:
                    order.append(int(await response.aread()))

            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(held)
                await wait_until(lambda: server.accepted == 3)
                server.release.set()
            assert sorted(order) == [1, 2, 3] and len(transport.stack.connections) == 3
            # The connection given back last is used first; the others wait idle.
            assert await number(client) == order[-1]
            assert await number(client) == order[-1]
            assert server.accepted == 3


async def test_a_request_asks_one_idle_connection_if_it_was_closed_not_every_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the stack is for: httpcore2's pool asks each idle connection (a
    ``poll()``) at each request's start and end."""
    asked: list[object] = []
    has_expired = httpcore2.AsyncHTTPConnection.has_expired

    def counting(self: httpcore2.AsyncHTTPConnection) -> bool:
        asked.append(self)
        return has_expired(self)

    monkeypatch.setattr(httpcore2.AsyncHTTPConnection, "has_expired", counting)
    with trio.fail_after(TIMEOUT):
        async with serving() as (server, client, transport):

            async def held() -> None:
                async with client.stream("GET", "/held") as response:
                    await response.aread()

            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(held)
                await wait_until(lambda: server.accepted == 20)
                server.release.set()
            asked.clear()
            for _ in range(10):
                await number(client)
            # Each request: the connection it takes, and the one idle longest.
            assert len(asked) <= 2 * 10
            assert len(transport.stack.connections) == 20


async def test_connections_the_server_closed_are_let_go_and_a_new_one_is_opened() -> None:
    with trio.fail_after(TIMEOUT):
        async with serving() as (server, client, transport):
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(client.get, "/held")
                await wait_until(lambda: server.accepted == 2)
                server.release.set()
            await server.close_idle()  # (the server's keep-alive timeout)
            assert await number(client) == 3  # not an error: a new connection
            assert len(transport.stack.connections) == 1


async def test_an_idle_connection_past_its_keep_alive_expiry_is_not_used() -> None:
    with trio.fail_after(TIMEOUT):
        server = Server()
        async with trio.open_nursery() as nursery:
            [listener] = await nursery.start(
                partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1")
            )
            port = listener.socket.getsockname()[1]
            transport = StackTransport(limits=httpx2.Limits(keepalive_expiry=0.05))
            async with httpx2.AsyncClient(
                transport=transport, base_url=f"http://127.0.0.1:{port}"
            ) as client:
                assert await number(client) == 1
                assert await number(client) == 1
                await trio.sleep(0.1)
                assert await number(client) == 2
                await wait_until(lambda: server.closed == 1)  # the expired one was closed
            nursery.cancel_scope.cancel()


async def test_a_response_closed_before_its_end_closes_its_connection() -> None:
    with trio.fail_after(TIMEOUT):
        async with serving() as (server, client, transport):
            async with client.stream("GET", "/held") as response:
                assert response.status_code == 200  # (its body is still to come)
            assert not transport.stack.connections
            assert await number(client) == 2
            server.release.set()  # (the server then finds the first one closed)
            await wait_until(lambda: server.closed == 1)


async def test_a_cancelled_request_leaves_no_connection_behind() -> None:
    with trio.fail_after(TIMEOUT):
        async with serving() as (server, client, transport):
            with trio.move_on_after(0.2) as waited:
                async with client.stream("GET", "/held") as response:
                    await response.aread()  # (held by the server: cancelled here)
            assert waited.cancelled_caught
            assert not transport.stack.connections
            assert await number(client) == 2
            server.release.set()
            await wait_until(lambda: server.closed == 1)


async def test_a_refused_connection_is_an_httpx2_error_and_is_not_kept() -> None:
    with trio.fail_after(TIMEOUT):
        with trio.socket.socket() as probe:  # a port nobody listens on
            await probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        transport = StackTransport()
        async with httpx2.AsyncClient(transport=transport) as client:
            with pytest.raises(httpx2.ConnectError):
                await client.get(f"http://127.0.0.1:{port}/")
            assert not transport.stack.connections


async def test_closing_the_client_closes_every_connection_idle_or_not() -> None:
    with trio.fail_after(TIMEOUT):
        async with serving() as (server, client, transport):
            cut: list[str] = []

            async def held() -> None:
                with pytest.raises(httpx2.ReadError) as error:
                    await client.get("/held")
                cut.append(str(error.value))

            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(held)
                await wait_until(lambda: server.accepted == 2)
                assert await number(client) == 3  # (then idle, the other two busy)
                assert len(transport.stack.connections) == 3
                await client.aclose()
            assert len(cut) == 2  # (the requests in flight end with their connections)
            assert not transport.stack.connections
            server.release.set()
            await wait_until(lambda: server.closed == 3)


async def test_through_a_proxy_the_connections_are_the_proxys() -> None:
    """The stack's connections are made as httpx2 configured them: here, through
    an HTTP proxy (the server, which takes the absolute URLs a proxy gets)."""
    with trio.fail_after(TIMEOUT):
        server = Server()
        async with trio.open_nursery() as nursery:
            [listener] = await nursery.start(
                partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1")
            )
            proxy = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
            async with httpx2.AsyncClient(transport=StackTransport(proxy=proxy)) as client:
                assert [await number(client, "http://mcp.invalid/") for _ in range(3)] == [1] * 3
            nursery.cancel_scope.cancel()
