"""End to end: servers reached by WebSocket (``"url": "ws://..."``, issue #12).

The WebSocket server (tests/servers/ws_server.py) and the daemon run in the
test's own Trio loop on real sockets, so a test can see what the server saw
(its connections, headers, calls, cancellations) and stop it; the clients are
official SDK sessions through ``mcpbroker connect``. A WebSocket server is used
as a stdio one is: shared, its ids, progress tokens and cancellations
rewritten, its failures answered with errors naming it, reconnected with
backoff.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
import trio
from mcp import types
from mcp.shared.exceptions import MCPError

from actors.upstream import Upstream
from broker import jsonrpc
from broker.config import BrokerSettings, ServerConfig
from broker.states import ServerState
from tests.conftest import running_daemon, shim_client, text_of
from tests.servers.ws_server import WsServer

BEARER = "Bearer x"


def ws_entry(port: int, **extra: Any) -> dict[str, Any]:
    return {"url": f"ws://127.0.0.1:{port}/", "headers": {"Authorization": BEARER}, **extra}


def echoed(result: Any) -> dict[str, Any]:
    """What the echo tool answered: {"echo": arguments, "connection": number}."""
    answer: dict[str, Any] = json.loads(text_of(result))
    return answer


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_clients_share_one_connection_and_the_headers_reach_the_server(
    socket_path: str,
) -> None:
    server = WsServer()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.run)
            async with (
                running_daemon({"ws": ws_entry(port)}, socket_path),
                shim_client(socket_path, "ws") as a,
                shim_client(socket_path, "ws") as b,
                shim_client(socket_path) as c,  # aggregated: the tool is ws__echo
            ):
                answers: dict[str, Any] = {}

                async def call(name: str, client: Any, tool: str) -> None:
                    answers[name] = echoed(await client.call_tool(tool, {"who": name}))

                async with trio.open_nursery() as calls:
                    for _ in range(3):  # (several rounds, so the calls overlap)
                        calls.start_soon(call, "a", a, "echo")
                        calls.start_soon(call, "b", b, "echo")
                        calls.start_soon(call, "c", c, "ws__echo")
                assert answers == {n: {"echo": {"who": n}, "connection": 1} for n in "abc"}
                assert text_of(await b.call_tool("whoami", {})) == BEARER
            server.stop()
    assert server.connections == 1, "one connection, shared by every client"
    assert server.authorization == [BEARER]


async def test_progress_and_cancellation_are_rewritten_over_the_websocket(
    socket_path: str,
) -> None:
    server = WsServer()
    seen: dict[str, list[float]] = {"a": [], "b": []}

    def recorder(name: str) -> types.ProgressFnT:
        async def record(progress: float, total: float | None, message: str | None) -> None:
            seen[name].append(progress)

        return record

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.run)
            async with (
                running_daemon({"ws": ws_entry(port)}, socket_path),
                shim_client(socket_path, "ws") as a,
                shim_client(socket_path, "ws") as b,
            ):
                # Both SDK clients number their requests alike (their progress
                # tokens are their request ids): the server must see two tokens.
                async with trio.open_nursery() as calls:
                    for name, client in (("a", a), ("b", b)):
                        calls.start_soon(
                            lambda c=client, n=name: c.call_tool(
                                "slow", {"seconds": 0.5}, progress_callback=recorder(n)
                            )
                        )
                while min(len(steps) for steps in seen.values()) < 5:
                    await trio.sleep(0.02)  # (the SDK runs callbacks in tasks of its own)
                assert all(sorted(seen[n]) == [1.0, 2.0, 3.0, 4.0, 5.0] for n in seen), seen
                assert len(set(server.progress_tokens)) == 2, server.progress_tokens

                with trio.move_on_after(0.3):
                    await a.call_tool("slow", {"seconds": 30})
                    raise AssertionError("the call should still be running")
                while not server.cancelled:
                    await trio.sleep(0.02)
                slow_ids = [id for _, id, tool in server.calls if tool == "slow"]
                assert server.cancelled == [slow_ids[-1]], (server.cancelled, slow_ids)
                assert echoed(await a.call_tool("echo", {"after": 1}))["echo"] == {"after": 1}
            server.stop()


async def fails(into: list[Any], client: Any, tool: str, arguments: dict[str, Any]) -> None:
    """Call a tool that must fail; its error goes ``into`` the list."""
    with pytest.raises(MCPError) as failure:
        await client.call_tool(tool, arguments)
    into.append(failure.value.error)


async def test_a_dropped_connection_fails_the_calls_in_flight_and_is_reopened(
    socket_path: str,
) -> None:
    server = WsServer()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.run)
            async with (
                running_daemon({"ws": ws_entry(port)}, socket_path) as daemon,
                shim_client(socket_path, "ws") as a,
                shim_client(socket_path, "ws") as b,
            ):
                errors: list[Any] = []
                async with trio.open_nursery() as calls:
                    calls.start_soon(fails, errors, a, "slow", {"seconds": 30})
                    while not server.calls:
                        await trio.sleep(0.01)
                    calls.start_soon(fails, errors, b, "crash", {})
                assert len(errors) == 2
                for error in errors:
                    assert error.code == jsonrpc.CONNECTION_CLOSED, error
                    assert "'ws'" in error.message and "WebSocket closed" in error.message, error
                    assert error.data == {"server": "ws", "retryable": True}, error
                await daemon.upstreams["ws"].wait_ready()
                assert echoed(await a.call_tool("echo", {}))["connection"] == 2
                assert echoed(await b.call_tool("echo", {}))["connection"] == 2
            server.stop()


async def test_a_server_that_goes_away_is_reconnected_with_backoff(socket_path: str) -> None:
    first = WsServer()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(first.run)
            async with (
                running_daemon({"ws": ws_entry(port, restartDelay=0.05)}, socket_path) as daemon,
                shim_client(socket_path, "ws") as client,
            ):
                upstream = daemon.upstreams["ws"]
                errors: list[Any] = []
                async with trio.open_nursery() as calls:
                    calls.start_soon(fails, errors, client, "slow", {"seconds": 30})
                    while not first.calls:
                        await trio.sleep(0.01)
                    first.stop()
                assert "'ws'" in errors[0].message, errors[0]
                stopped = trio.current_time()
                # Down, and refusing connections: answered at once, retried ever later.
                with pytest.raises(MCPError) as down:
                    await client.call_tool("echo", {})
                assert down.value.error.code == jsonrpc.CONNECTION_CLOSED
                assert "'ws'" in down.value.error.message, down.value.error
                while upstream.statistics().restarts < 3:
                    await trio.sleep(0.01)
                # The backoff doubles; each delay is at least half of it (jitter).
                assert trio.current_time() - stopped >= (0.05 + 0.1 + 0.2) / 2
                assert "could not be started" in (upstream.statistics().last_error or "")

                second = WsServer()
                await nursery.start(second.run, port)  # the same port, a new server
                await upstream.wait_ready()
                assert echoed(await client.call_tool("echo", {"again": True})) == {
                    "echo": {"again": True},
                    "connection": 1,
                }
            second.stop()
    assert second.authorization == [BEARER]


async def test_unreachable_and_refusing_servers_are_clear_errors(socket_path: str) -> None:
    good, locked = WsServer(), WsServer(token="other")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            good_port = await nursery.start(good.run)
            servers = {
                "good": ws_entry(good_port),
                "gone": ws_entry(free_port()),  # nothing listens: connection refused
                "locked": ws_entry(await nursery.start(locked.run)),  # HTTP 401
                "tls": {"url": f"wss://127.0.0.1:{good_port}/"},  # a server without TLS
            }
            async with (
                running_daemon(servers, socket_path, wait=("good",)) as daemon,
                shim_client(socket_path) as client,
            ):
                for name, why in (
                    ("gone", "could not be started"),
                    ("locked", "WebSocket handshake failed (HTTP 401)"),
                    ("tls", "TLS handshake failed"),
                ):
                    with pytest.raises(MCPError) as failure:
                        await client.call_tool(f"{name}__echo", {})
                    error = failure.value.error
                    assert error.code == jsonrpc.CONNECTION_CLOSED, error
                    assert f"'{name}'" in error.message and why in error.message, error
                assert echoed(await client.call_tool("good__echo", {}))["connection"] == 1
                assert daemon.upstreams["locked"].statistics().status == "down"
                assert daemon.statistics().servers  # (the daemon is alive and answers)
            good.stop()
            locked.stop()
    assert locked.connections == 0


async def test_an_answer_over_max_message_bytes_is_an_error_and_the_connection_stays(
    socket_path: str,
) -> None:
    limit = 64 * 1024
    server = WsServer()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.run)
            async with (
                running_daemon(
                    {"ws": ws_entry(port)}, socket_path, broker={"maxMessageBytes": limit}
                ) as daemon,
                shim_client(socket_path, "ws") as client,
            ):
                with pytest.raises(MCPError) as failure:
                    await client.call_tool("payload", {"size": 2 * limit})
                error = failure.value.error
                assert error.code == jsonrpc.INTERNAL_ERROR, error
                assert "'ws'" in error.message and "maxMessageBytes" in error.message, error
                assert echoed(await client.call_tool("echo", {}))["connection"] == 1

                # Far over it (past trio-websocket's own limit): the connection is
                # closed (1009), the call fails, and the broker reconnects.
                with pytest.raises(MCPError) as failure:
                    await client.call_tool("payload", {"size": 5 * limit})
                assert "'ws'" in failure.value.error.message, failure.value.error
                await daemon.upstreams["ws"].wait_ready()
                assert echoed(await client.call_tool("echo", {}))["connection"] == 2

                # Four-byte characters, as many as the limit: within trio-websocket's
                # hard limit in characters (four times it), past it in bytes: closed
                # (1009) and reconnected the same way.
                with pytest.raises(MCPError) as failure:
                    await client.call_tool("payload", {"size": limit, "char": "\U0001f600"})
                assert "'ws'" in failure.value.error.message, failure.value.error
                assert "1009" in failure.value.error.message, failure.value.error
                await daemon.upstreams["ws"].wait_ready()
                assert echoed(await client.call_tool("echo", {}))["connection"] == 3
            server.stop()


# -- the Upstream alone, without a daemon ---------------------------------------


async def test_a_stopped_upstream_closes_its_websocket_at_once() -> None:
    """Cancelled (the daemon stops), it waits for no close handshake."""
    server = WsServer()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.run)
            config = ServerConfig(url=f"ws://127.0.0.1:{port}/")
            upstream = Upstream("ws", config, BrokerSettings())
            async with trio.open_nursery() as running:
                await running.start(upstream.run)
                await upstream.wait_ready()
                assert server.open == 1
                stopping = trio.current_time()
                running.cancel_scope.cancel()
            assert trio.current_time() - stopping < 0.5
            while server.open:  # the server saw the connection end
                await trio.sleep(0.01)
            server.stop()


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ws://127.0.0.1:port/", "has a url that is not valid"),
        ("ws:///mcp", "has a url without a host"),
        ("ftp://127.0.0.1/", "cannot reach yet"),
    ],
)
async def test_a_url_that_leads_nowhere_is_said_once_and_not_retried(url: str, why: str) -> None:
    upstream = Upstream("bad", ServerConfig(url=url), BrokerSettings(restart_delay=0.01))
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(upstream.run)
            while upstream.status is not ServerState.FAILED:
                await trio.sleep(0.01)
            await trio.sleep(0.05)  # (several backoffs)
            statistics = upstream.statistics()
            assert why in (statistics.last_error or ""), statistics
            assert statistics.restarts == 0
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"Sec-WebSocket-Accept: AAAA\r\nSec-WebSocket-Protocol: mcp\r\n", "Bad accept token"),
        (b"Sec-WebSocket-Accept: ACCEPT\r\nSec-WebSocket-Protocol: graphql-ws\r\n", "subprotocol"),
        (
            b"Sec-WebSocket-Accept: ACCEPT\r\nSec-WebSocket-Extensions: \xe9\r\n",
            "cannot be decoded",
        ),
    ],
)
async def test_a_bad_handshake_answer_is_said_for_what_it_is(answer: bytes, why: str) -> None:
    """A 101 with a wrong accept token, a subprotocol not asked for, or a field
    that is not ASCII was said as h11's internal complaint ("can't handle
    event type Response when role=CLIENT ...") or a codec error."""
    import base64
    import functools
    import hashlib

    from actors.links.link import LinkContext
    from actors.links.websocket import launch_websocket
    from actors.logs import get_logger

    async def serve(stream: trio.SocketStream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            request += await stream.receive_some()
        key = request.split(b"Sec-WebSocket-Key: ", 1)[1].split(b"\r\n", 1)[0]
        digest = hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()
        await stream.send_all(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + answer.replace(b"ACCEPT", base64.b64encode(digest))
            + b"\r\n"
        )
        await trio.sleep(1)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            context = LinkContext(nursery, 1 << 20, get_logger())
            with pytest.raises(OSError) as failure:
                await launch_websocket(ServerConfig(url=f"ws://127.0.0.1:{port}/"), context)
            message = str(failure.value)
            assert why in message, message
            assert "role=CLIENT" not in message and "codec" not in message
            nursery.cancel_scope.cancel()
