"""End to end: the official MCP SDK as client (through `mcpbroker connect`) and server.

The daemon runs in the test's own Trio loop; the shims, the SDK servers and the
demo server are real subprocesses speaking over real pipes and a real socket.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
import trio
from mcp.shared.exceptions import MCPError

from broker import jsonrpc
from tests.conftest import MCPBROKER, running_daemon, sdk_server, shim_client, text_of


async def test_sdk_client_lists_and_calls_tools_of_an_sdk_server(socket_path: str) -> None:
    with trio.fail_after(30):
        async with (
            running_daemon({"sdk": sdk_server()}, socket_path),
            shim_client(socket_path, "sdk") as client,
        ):
            tools = await client.list_tools()
            assert {"pid", "echo", "slow"} <= {tool.name for tool in tools.tools}
            assert text_of(await client.call_tool("echo", {"text": "héllo"})) == "héllo"
            for n in (2**70 + 1, -(2**63) - 1):  # past 64 bits: as a float, the digits change
                assert text_of(await client.call_tool("digits", {"n": n})) == str(n)
            resource = await client.read_resource("test://sdk-test-server/hello")
            assert resource.contents[0].text == "hello from sdk-test-server"
            prompt = await client.get_prompt("review", {"code": "x = 1"})
            assert "x = 1" in prompt.messages[0].content.text


@pytest.mark.parametrize("clients", [2, 20])
async def test_many_clients_share_one_server_process(socket_path: str, clients: int) -> None:
    answers: dict[int, tuple[str, list[str]]] = {}

    async def one_client(n: int) -> None:
        async with shim_client(socket_path, "sdk") as client:
            pids, echoes = set(), []
            for i in range(5):
                async with trio.open_nursery() as calls:  # two calls in flight at once

                    async def get_pid() -> None:
                        pids.add(text_of(await client.call_tool("pid", {})))

                    calls.start_soon(get_pid)
                    echoes.append(text_of(await client.call_tool("echo", {"text": f"{n}:{i}"})))
            (pid,) = pids
            answers[n] = (pid, echoes)

    with trio.fail_after(60):
        async with running_daemon({"sdk": sdk_server()}, socket_path) as daemon:
            async with trio.open_nursery() as nursery:
                for n in range(clients):
                    nursery.start_soon(one_client, n)
            server_pid = daemon.upstreams["sdk"].statistics().pid
    assert {pid for pid, _ in answers.values()} == {str(server_pid)}
    for n, (_, echoes) in answers.items():
        assert echoes == [f"{n}:{i}" for i in range(5)]


async def test_server_killed_mid_request(socket_path: str) -> None:
    with trio.fail_after(40):
        async with (
            running_daemon({"victim": sdk_server()}, socket_path) as daemon,
            shim_client(socket_path, "victim") as caller,
            shim_client(socket_path, "victim") as bystander,
        ):
            pid = int(text_of(await caller.call_tool("pid", {})))

            async def kill_soon() -> None:
                await trio.sleep(0.5)
                os.kill(pid, signal.SIGKILL)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(kill_soon)
                with pytest.raises(MCPError) as failure:
                    await caller.call_tool("slow", {"seconds": 20})
            assert failure.value.error.code == jsonrpc.CONNECTION_CLOSED
            assert "'victim'" in failure.value.error.message
            # The daemon restarts the server; both clients carry on.
            await daemon.upstreams["victim"].wait_ready()
            new_pid = int(text_of(await bystander.call_tool("pid", {})))
            assert new_pid != pid
            assert text_of(await caller.call_tool("echo", {"text": "still here"})) == "still here"


class RawClient:
    """Newline-delimited JSON over the daemon's socket, no SDK: what socat does."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def send_line(self, line: bytes) -> None:
        await self.stream.send_all(line + b"\n")

    async def receive(self) -> Any:
        while b"\n" not in self.buffer:
            data = await self.stream.receive_some()
            assert data, "daemon closed the connection"
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        return jsonrpc.decode(line)


async def test_garbage_on_one_socket_does_not_disturb_another_client(socket_path: str) -> None:
    initialize = (
        b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":'
        b'"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}'
    )
    with trio.fail_after(30):
        async with running_daemon({"sdk": sdk_server()}, socket_path) as daemon:
            async with shim_client(socket_path, "sdk") as good:
                raw = RawClient(await trio.open_unix_socket(socket_path))
                await raw.send_line(initialize)
                assert (await raw.receive())["result"]["protocolVersion"] == "2025-06-18"
                cases = [
                    (b"this is not json", jsonrpc.PARSE_ERROR),
                    (b'{"jsonrpc":"2.0","id":1,"method":"tools/call"', jsonrpc.PARSE_ERROR),
                    (b'"just a string"', jsonrpc.INVALID_REQUEST),
                    (b'{"jsonrpc":"1.0","id":2,"method":"ping"}', jsonrpc.INVALID_REQUEST),
                    (b'{"jsonrpc":"2.0","id":{"no":1},"method":"ping"}', jsonrpc.INVALID_REQUEST),
                    (
                        b'{"jsonrpc":"2.0","id":3,"method":"tools/delete_everything"}',
                        jsonrpc.METHOD_NOT_FOUND,
                    ),
                    (
                        b'{"jsonrpc":"2.0","id":4,"method":"x","pad":"' + b"y" * (17 << 20) + b'"}',
                        jsonrpc.INVALID_REQUEST,
                    ),
                ]
                for line, code in cases:
                    await raw.send_line(line)
                    assert (await raw.receive())["error"]["code"] == code, line[:60]
                    assert text_of(await good.call_tool("echo", {"text": "ok"})) == "ok"
                await raw.send_line(
                    b'{"jsonrpc":"2.0","id":5,"method":"tools/call",'
                    b'"params":{"name":"sdk__echo","arguments":{"text":"raw"}}}'
                )
                answer = await raw.receive()
                assert "result" in answer, answer
                assert answer["result"]["content"][0]["text"] == "raw"
                await raw.stream.aclose()
            assert daemon.upstreams["sdk"].statistics().status == "ready"


async def test_status_shows_servers_and_sessions(socket_path: str) -> None:
    with trio.fail_after(30):
        async with (
            running_daemon({"sdk": sdk_server()}, socket_path) as daemon,
            shim_client(socket_path, "sdk") as client,
        ):
            await client.call_tool("echo", {"text": "x"})
            result = await trio.run_process(
                [MCPBROKER, "status", "--socket", socket_path, "--json"], capture_stdout=True
            )
            table = await trio.run_process(
                [MCPBROKER, "status", "--socket", socket_path], capture_stdout=True
            )
            server_pid = daemon.upstreams["sdk"].statistics().pid
    status = json.loads(result.stdout)
    (server,) = status["servers"]
    assert server["name"] == "sdk" and server["status"] == "ready"
    assert server["pid"] == server_pid and server["sessions"] == 1
    assert server["requests"] >= 1 and server["timeouts"] == 0
    (session,) = status["sessions"]
    assert session["view"] == ["sdk"] and session["protocol_version"] == "2025-11-25"
    assert session["client"]["name"] == "mcp"
    assert b"SERVER" in table.stdout and b"sdk" in table.stdout
    assert status["rules"] in ("compiled", "Python")  # how broker/ was installed
    assert f"rules {status['rules']}".encode() in table.stdout
