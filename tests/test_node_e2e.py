"""End to end with real Node.js peers: the MCP Inspector's CLI as a host
(the command line docs/hosts.md gives) and the reference
``@modelcontextprotocol/server-everything`` as a shared third-party server,
used by the Inspector and by official Python SDK clients at once.
(tests/nodejs.py installs them on first use.)"""

from __future__ import annotations

import json
from typing import Any

import trio

from tests.conftest import MCPBROKER, demo_server, running_daemon, shim_client, text_of
from tests.nodejs import node_tools
from tests.test_server_requests_e2e import sampler


async def inspector(socket_path: str, server: str, *method: str) -> Any:
    """``mcp-inspector --cli mcpbroker connect SERVER --method ...``: its JSON answer."""
    tools = node_tools()
    command = [tools.node, tools.inspector, "--cli", MCPBROKER, "connect", server]
    done = await trio.run_process(
        [*command, "--socket", socket_path, "--method", *method],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return json.loads(done.stdout)


def everything() -> dict[str, Any]:
    tools = node_tools()
    return {"command": tools.node, "args": [tools.everything, "stdio"]}


async def test_the_inspector_lists_and_calls_through_the_shim(socket_path: str) -> None:
    node_tools()  # (installed before the clock starts)
    with trio.fail_after(60):
        async with running_daemon({"demo": demo_server()}, socket_path):
            listed = await inspector(socket_path, "demo", "tools/list")
            assert {"add", "pid"} <= {tool["name"] for tool in listed["tools"]}
            called = await inspector(
                socket_path, "demo", "tools/call", "--tool-name", "add", "--tool-arg", "a=2", "b=40"
            )
            assert "42" in json.dumps(called["content"])


async def test_server_everything_shared_by_the_inspector_and_sdk_clients(
    socket_path: str,
) -> None:
    node_tools()
    with trio.fail_after(90):
        async with (
            running_daemon({"everything": everything()}, socket_path) as daemon,
            shim_client(socket_path, "everything", sampling_callback=sampler("a")) as a,
            shim_client(socket_path) as b,
        ):
            names = {tool.name for tool in (await a.list_tools()).tools}
            # Registered by the server only after notifications/initialized.
            assert {"echo", "get-sum", "trigger-sampling-request"} <= names
            aggregated = {tool.name for tool in (await b.list_tools()).tools}
            assert "everything__get-sum" in aggregated
            summed = await b.call_tool("everything__get-sum", {"a": 20, "b": 22})
            assert "42" in text_of(summed)
            sampled = await a.call_tool("trigger-sampling-request", {"prompt": "hi"})
            assert "a answers" in json.dumps(sampled.model_dump(mode="json"))
            called = await inspector(
                socket_path,
                "everything",
                "tools/call",
                "--tool-name",
                "echo",
                "--tool-arg",
                "message=shared",
            )
            assert "shared" in json.dumps(called["content"])
            # One server process for all three clients.
            stats = daemon.upstreams["everything"].statistics()
            assert stats.restarts == 0 and stats.pid is not None
