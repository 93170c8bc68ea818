"""End to end: one daemon, three real SDK servers, one merged catalog.

The three servers offer the same tool and prompt names; every client sees each
of them once, under a valid qualified name, and each call lands on the server
that owns the name.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from mcp import types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from actors.daemon import Daemon
from broker import jsonrpc
from tests.conftest import demo_server, running_daemon, sdk_server, shim_client, text_of

SERVERS = ("alpha", "beta", "gamma")
VALID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@asynccontextmanager
async def three_servers(socket_path: str) -> AsyncIterator[Daemon]:
    servers = {name: sdk_server(name) for name in SERVERS}
    async with running_daemon(servers, socket_path) as daemon:
        yield daemon


class ListChanges:
    """Counts the tools/list_changed notifications a client receives."""

    def __init__(self) -> None:
        self.count = 0
        self.arrived = trio.Event()

    async def __call__(self, message: object) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.count += 1
            self.arrived.set()


async def tool_names(client: ClientSession) -> list[str]:
    return [tool.name for tool in (await client.list_tools()).tools]


async def test_one_catalog_from_three_servers(socket_path: str) -> None:
    with trio.fail_after(60):
        async with three_servers(socket_path), shim_client(socket_path) as client:
            init = client.initialize_result
            assert init is not None and init.server_info.name == "mcpbroker"
            assert all(
                f"## {name}\nTest server {name}." in (init.instructions or "") for name in SERVERS
            )
            names = await tool_names(client)
            assert len(names) == len(set(names)) and all(VALID.match(n) for n in names)
            assert [n for n in names if n.endswith("__whoami")] == [
                f"{server}__whoami" for server in SERVERS
            ]
            for server in SERVERS:
                assert text_of(await client.call_tool(f"{server}__whoami", {})) == server
                echoed = await client.call_tool(f"{server}__echo", {"text": server})
                assert text_of(echoed) == server
                prompt = await client.get_prompt(f"{server}__review", {"code": "x"})
                assert prompt.messages[0].content.text == f"{server}: please review x"
                hello = await client.read_resource(f"test://{server}/hello")
                assert hello.contents[0].text == f"hello from {server}"
                item = await client.read_resource(f"test://{server}/items/42")
                assert item.contents[0].text == f"item 42 from {server}"
            resources = (await client.list_resources()).resources
            assert sorted(str(r.uri) for r in resources) == sorted(
                f"test://{s}/hello" for s in SERVERS
            )
            templates = (await client.list_resource_templates()).resource_templates
            assert len(templates) == 3
            prompts = [p.name for p in (await client.list_prompts()).prompts]
            assert prompts == [f"{s}__review" for s in SERVERS]


async def test_a_new_tool_reaches_every_client_that_sees_its_server(socket_path: str) -> None:
    watchers = {name: ListChanges() for name in ("all", "beta-only", "gamma-only")}
    with trio.fail_after(60):
        async with (
            three_servers(socket_path),
            shim_client(socket_path, message_handler=watchers["all"]) as everything,
            shim_client(socket_path, "beta", message_handler=watchers["beta-only"]) as beta,
            shim_client(socket_path, "gamma", message_handler=watchers["gamma-only"]) as gamma,
        ):
            assert "gamma__newcomer" not in await tool_names(everything)
            assert text_of(await gamma.call_tool("grow", {"name": "newcomer"})) == "added newcomer"
            await watchers["all"].arrived.wait()
            await watchers["gamma-only"].arrived.wait()
            assert "gamma__newcomer" in await tool_names(everything)
            assert "newcomer" in await tool_names(gamma)
            answer = await everything.call_tool("gamma__newcomer", {})
            assert text_of(answer) == "newcomer from gamma"
            await trio.sleep(0.5)  # time for a duplicate, if one were sent
            assert beta is not None and watchers["beta-only"].count == 0
    assert watchers["all"].count == 1 and watchers["gamma-only"].count == 1


async def test_a_client_that_names_one_server_sees_it_as_it_is(socket_path: str) -> None:
    with trio.fail_after(60):
        async with three_servers(socket_path), shim_client(socket_path, "beta") as client:
            init = client.initialize_result
            assert init is not None and init.server_info.name == "beta"
            assert init.instructions == "Test server beta."
            names = await tool_names(client)
            assert "whoami" in names and not any("__" in name for name in names)
            assert text_of(await client.call_tool("whoami", {})) == "beta"
            prompt = await client.get_prompt("review", {"code": "y"})
            assert prompt.messages[0].content.text == "beta: please review y"


async def test_a_server_that_cannot_start_does_not_stop_the_others(socket_path: str) -> None:
    servers = {
        "good": sdk_server("good"),
        "broken": {"command": "/nonexistent/mcp-server", "args": []},
        "later": {**demo_server(), "startup": "lazy"},
    }
    with trio.fail_after(60):
        async with running_daemon(servers, socket_path, wait=("good",)) as daemon:
            assert daemon.upstreams["later"].statistics().status == "idle"
            async with shim_client(socket_path) as client:
                names = await tool_names(client)
                assert "good__whoami" in names and "later__echo" in names  # started on demand
                assert not any(name.startswith("broken__") for name in names)
                assert text_of(await client.call_tool("good__whoami", {})) == "good"
                with pytest.raises(MCPError) as failure:
                    await client.call_tool("broken__anything", {})
    assert failure.value.error.code == jsonrpc.CONNECTION_CLOSED
    assert "'broken' is not running" in failure.value.error.message
    assert "could not be started" in failure.value.error.message
