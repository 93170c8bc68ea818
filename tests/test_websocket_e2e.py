"""WebSocket clients (``serve --ws``), with real sockets, a real server process
and the shim's clients at the same time.

The official SDK has no WebSocket client in its 2.x line, so the WebSocket
clients here are trio-websocket's, speaking MCP by hand; the shim's client is
the SDK's.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
import trio
import trio_websocket

from tests.conftest import running_daemon, sdk_server, shim_client, text_of
from tests.servers.ws_server import WsServer

INITIALIZE = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "ws-test", "version": "1"},
}


class WsClient:
    """An MCP client over one WebSocket: requests by hand, answers matched by id."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws
        self.others: list[Any] = []  # notifications and requests that came meanwhile
        self._ids = 0

    async def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self._ids += 1
        id = f"r{self._ids}"
        message = {"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}}
        await self.ws.send_message(orjson.dumps(message).decode())
        while True:
            answer = orjson.loads(await self.ws.get_message())
            if answer.get("id") == id and "method" not in answer:
                return answer
            self.others.append(answer)

    async def initialize(self) -> Any:
        answer = await self.request("initialize", INITIALIZE)
        await self.ws.send_message('{"jsonrpc":"2.0","method":"notifications/initialized"}')
        return answer["result"]

    async def call(self, tool: str, **arguments: Any) -> Any:
        return await self.request("tools/call", {"name": tool, "arguments": arguments})


@asynccontextmanager
async def ws_client(
    url: str, headers: list[tuple[bytes, bytes]] | None = None
) -> AsyncIterator[WsClient]:
    async with trio_websocket.open_websocket_url(
        url, subprotocols=["mcp"], extra_headers=headers or []
    ) as ws:
        assert ws.subprotocol == "mcp"
        yield WsClient(ws)


def text(answer: Any) -> str:
    return "".join(block["text"] for block in answer["result"]["content"])


async def test_websocket_and_shim_clients_share_one_server(socket_path: str) -> None:
    servers = {"sdk": sdk_server()}
    with trio.fail_after(60):
        async with running_daemon(servers, socket_path, broker={"websocket": "127.0.0.1:0"}) as d:
            url = d.websocket_url
            assert url is not None and url.startswith("ws://127.0.0.1:")
            pids: set[str] = set()

            async def over_websocket(path: str, tool: str) -> None:
                async with ws_client(url + path) as client:
                    result = await client.initialize()
                    tools = await client.request("tools/list")
                    names = {tool["name"] for tool in tools["result"]["tools"]}
                    assert tool in names
                    if path:  # one server, as it is: its own identity, unprefixed names
                        assert result["serverInfo"]["name"] == "sdk-test-server"
                    for n in range(5):
                        answer = await client.call(tool.replace("pid", "echo"), text=f"ws{n}")
                        assert text(answer) == f"ws{n}"
                    pids.add(text(await client.call(tool)))

            async def over_the_shim() -> None:
                async with shim_client(socket_path, "sdk") as session:
                    for n in range(5):
                        assert (
                            text_of(await session.call_tool("echo", {"text": f"s{n}"})) == f"s{n}"
                        )
                    pids.add(text_of(await session.call_tool("pid", {})))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(over_websocket, "", "sdk__pid")
                nursery.start_soon(over_websocket, "/sdk", "pid")
                nursery.start_soon(over_the_shim)
            assert len(pids) == 1  # one process served the three clients
            assert d.upstreams["sdk"].statistics().restarts == 0


async def refused(url: str, headers: list[tuple[bytes, bytes]] | None = None) -> int:
    with pytest.raises(trio_websocket.HandshakeError) as caught:
        async with ws_client(url, headers):
            pass
    return int(caught.value.status_code)  # type: ignore[attr-defined]


async def test_foreign_origin_host_token_and_paths_are_refused_and_nobody_else_notices(
    socket_path: str, tmp_path: Any
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    os.chmod(token_file, 0o600)
    broker = {
        "websocket": "127.0.0.1:0",
        "tokenFile": str(token_file),
        "allowedOrigins": ["http://localhost:6274"],
    }
    good = [(b"Authorization", b"Bearer s3cret-token")]
    with trio.fail_after(60):
        async with running_daemon({"sdk": sdk_server()}, socket_path, broker=broker) as d:
            url = d.websocket_url
            assert url is not None
            async with ws_client(url, good) as client:  # a session open throughout
                await client.initialize()
                assert await refused(url) == 401
                assert await refused(url, [(b"Authorization", b"Bearer wrong")]) == 401
                assert await refused(url, [*good, (b"Origin", b"https://evil.example")]) == 403
                assert await refused(url, [*good, (b"Origin", b"null")]) == 403
                assert await refused(url.replace("/mcp", "/other"), good) == 404
                assert await refused(url + "/nope", good) == 404
                listed = [*good, (b"Origin", b"http://localhost:6274")]
                async with ws_client(url, listed) as browser:
                    await browser.initialize()
                # the open session was not disturbed
                assert text(await client.call("sdk__echo", text="still here")) == "still here"


async def test_a_foreign_host_name_is_refused(socket_path: str) -> None:
    """DNS rebinding: a page whose own name now points at 127.0.0.1 still sends it."""
    with trio.fail_after(60):
        async with running_daemon(
            {"sdk": sdk_server()}, socket_path, broker={"websocket": "127.0.0.1:0"}
        ) as d:
            assert d.websocket_url is not None
            port = d.websocket_url.split(":")[2].split("/")[0]
            stream = await trio.open_tcp_stream("127.0.0.1", int(port))
            async with stream:
                await stream.send_all(
                    b"GET /mcp HTTP/1.1\r\nHost: rebound.example:" + port.encode() + b"\r\n"
                    b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    b"Sec-WebSocket-Version: 13\r\n\r\n"
                )
                answer = b""
                while b"rebound.example" not in answer:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 403")
            assert b"rebound.example" in answer


@pytest.mark.parametrize(
    "big, small",
    [
        ("x" * 40_000, "fine"),
        # The limit counts bytes (UTF-8): 10,000 four-byte characters are
        # 40,000 bytes, over 32,768, though trio-websocket counts them as 10,000.
        ("\U0001f600" * 10_000, "\u00e9" * 1000),
    ],
    ids=["ascii", "four-byte characters"],
)
async def test_a_message_over_the_limit_in_bytes_closes_with_1009(
    socket_path: str, big: str, small: str
) -> None:
    broker = {"websocket": "127.0.0.1:0", "maxMessageBytes": 32768}
    with trio.fail_after(60):
        async with running_daemon({"sdk": sdk_server()}, socket_path, broker=broker) as d:
            assert d.websocket_url is not None
            async with ws_client(d.websocket_url) as over, ws_client(d.websocket_url) as other:
                await over.initialize()
                await other.initialize()
                with pytest.raises(trio_websocket.ConnectionClosed) as caught:
                    await over.call("sdk__echo", text=big)
                assert caught.value.reason.code == 1009
                assert caught.value.reason.reason == "Exceeded maximum message size: 32768 bytes"
                assert text(await other.call("sdk__echo", text=small)) == small


async def test_a_burst_of_notifications_reaches_reading_clients_whole(socket_path: str) -> None:
    """A ``ws://`` server's 3,000 progress notifications, sent at once, to two
    WebSocket clients that read: each is written as it comes (a batch per
    write), so neither is cut off as not reading, and the call is answered."""
    server = WsServer()
    count = 3000
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.run)
            entry = {"url": f"ws://127.0.0.1:{port}/"}
            broker = {"websocket": "127.0.0.1:0"}
            async with running_daemon({"ws": entry}, socket_path, broker=broker) as d:
                assert d.websocket_url is not None
                url = d.websocket_url + "/ws"
                async with ws_client(url) as caller, ws_client(url) as other:
                    await caller.initialize()
                    await other.initialize()
                    meta = {"progressToken": "tok"}
                    params = {"name": "burst", "arguments": {"count": count}, "_meta": meta}
                    answer = await caller.request("tools/call", params)
                    assert text(answer) == "burst"
                    progress = [
                        m for m in caller.others if m.get("method") == "notifications/progress"
                    ]
                    assert len(progress) == count
                    assert (await other.request("ping"))["result"] == {}
            server.stop()


async def test_connections_past_the_cap_are_refused_503_and_the_rest_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The listener holds at most MAX_CONNECTIONS at once (2 here): a third
    is refused 503 saying why; once one ends, a new one is taken. (Before,
    idle sessions by the thousand took every descriptor of the daemon's,
    and hosts on the unix socket were locked out.)"""
    from actors.downstream import websocket as listener
    from broker.wire.websocket import Policy

    monkeypatch.setattr(listener, "MAX_CONNECTIONS", 2)
    sessions = 0

    async def open_session(connection: Any, view: Any, transparent: bool) -> None:
        nonlocal sessions
        sessions += 1
        while (await connection.receive())[0]:
            pass  # (until the client closes)

    policy = Policy(frozenset(), frozenset(), None)
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            port = await _listen(nursery, policy, open_session)
            url = f"ws://127.0.0.1:{port}/mcp"
            async with (
                trio_websocket.open_websocket_url(url, subprotocols=["mcp"]),
                trio_websocket.open_websocket_url(url, subprotocols=["mcp"]),
            ):
                with pytest.raises(trio_websocket.ConnectionRejected) as refused:
                    async with trio_websocket.open_websocket_url(url, subprotocols=["mcp"]):
                        pass
                assert refused.value.status_code == 503
                assert b"more than 2 connections" in (refused.value.body or b"")
            async with trio_websocket.open_websocket_url(url, subprotocols=["mcp"]):
                while sessions < 3:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert sessions == 3


@pytest.mark.parametrize(
    "field",
    [
        b"Host: xn--zz-\r\n",  # (ASCII, but not a valid IDNA name)
        b"Host: l\xe9calhost\r\n",
        b"Host: localhost\r\nConnection: Upgrade, \xe9\r\n",
        b"Host: localhost\r\nSec-WebSocket-Protocol: mcp, \xe9\r\n",
        b"Host: localhost\r\nSec-WebSocket-Extensions: \xe9\r\n",
    ],
)
async def test_a_handshake_wsproto_cannot_decode_is_refused_400_and_the_listener_goes_on(
    field: bytes,
) -> None:
    """A header field wsproto cannot decode raised out of trio-websocket's
    reader and ended the daemon, before any check (token included): now that
    client alone gets 400 saying why, and the next client is served."""
    from broker.wire.websocket import Policy

    sessions = 0

    async def open_session(connection: Any, view: Any, transparent: bool) -> None:
        nonlocal sessions
        sessions += 1

    policy = Policy(frozenset(), frozenset(), "s3cret")
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            port = await _listen(nursery, policy, open_session)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(_upgrade(field))
            answer = b""
            while chunk := await stream.receive_some():
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 400 ")
            assert b"cannot be decoded" in answer
            url = f"ws://127.0.0.1:{port}/mcp"
            async with trio_websocket.open_websocket_url(
                url, subprotocols=["mcp"], extra_headers=[(b"authorization", b"Bearer s3cret")]
            ):
                pass
            nursery.cancel_scope.cancel()
    assert sessions == 1


async def _listen(nursery: trio.Nursery, policy: Any, open_session: Any) -> int:
    """The WebSocket listener alone (no daemon) on a free port, for server "s"."""
    from actors.downstream import websocket as listener

    port: int = await nursery.start(
        listener.serve_websocket, "127.0.0.1", 0, lambda: policy, ("s",), 1 << 20, open_session
    )
    return port


def _upgrade(fields: bytes) -> bytes:
    """A client's upgrade request for /mcp, written by hand, with ``fields``."""
    return (
        b"GET /mcp HTTP/1.1\r\n" + fields + b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )


def _frame(opcode: int, payload: bytes, *, mask: bool = True, rsv: int = 0) -> bytes:
    """One client frame, built by hand (short payloads only)."""
    head = bytes([0x80 | rsv << 4 | opcode, (0x80 if mask else 0) | len(payload)])
    if not mask:
        return head + payload
    key = b"\x01\x02\x03\x04"
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (_frame(1, b'{"x":"\xff"}'), 1007),  # a text that is not UTF-8
        (_frame(1, b"{}", mask=False), 1002),
        (_frame(1, b"{}", rsv=4), 1002),
        (_frame(0, b"{}"), 1002),  # a continuation with nothing to continue
    ],
)
async def test_a_client_breaking_the_protocol_gets_a_close_frame_saying_why(
    frame: bytes, code: int
) -> None:
    """RFC 6455 7.1.7: the endpoint failing the connection sends a Close frame
    with a status code (1007 for bad UTF-8, 1002 for a protocol error). Before,
    the TCP connection was cut with no Close frame, and nothing said why."""
    from broker.wire.websocket import Policy

    async def open_session(connection: Any, view: Any, transparent: bool) -> None:
        while (await connection.receive())[0]:
            pass

    policy = Policy(frozenset(), frozenset(), None)
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            port = await _listen(nursery, policy, open_session)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(_upgrade(b"Host: localhost\r\n"))
            received = b""
            while b"\r\n\r\n" not in received:
                received += await stream.receive_some()
            assert received.startswith(b"HTTP/1.1 101 ")
            await stream.send_all(frame)
            received = received.partition(b"\r\n\r\n")[2]
            while chunk := await stream.receive_some():
                received += chunk
            assert received[:1] == b"\x88", received  # a Close frame
            assert int.from_bytes(received[2:4], "big") == code
            assert received[4:]  # (with a reason)
            nursery.cancel_scope.cancel()


async def test_an_error_after_the_handshake_ends_that_connection_only() -> None:
    """The guard holds after the handshake too: an exception out of one
    connection's session closes it, and the listener serves the next."""
    from broker.wire.websocket import Policy

    sessions = 0

    async def open_session(connection: Any, view: Any, transparent: bool) -> None:
        nonlocal sessions
        sessions += 1
        if sessions == 1:
            raise RuntimeError("a bug")

    policy = Policy(frozenset(), frozenset(), None)
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            port = await _listen(nursery, policy, open_session)
            url = f"ws://127.0.0.1:{port}/mcp"
            for _ in range(2):
                async with trio_websocket.open_websocket_url(url, subprotocols=["mcp"]) as ws:
                    with pytest.raises(trio_websocket.ConnectionClosed):
                        await ws.get_message()
            nursery.cancel_scope.cancel()
    assert sessions == 2
