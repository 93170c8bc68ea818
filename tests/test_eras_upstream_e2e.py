"""End to end: a modern (2026-07-28) SDK server behind the broker.

The SDK test server (``MCPServer.run()`` over stdio) serves both eras: the
client's first request decides. A server configured ``"era": "auto"`` or
``"modern"`` is opened with ``server/discover`` and is then spoken to in the
modern era (no ``initialize``; every request stamped); legacy and modern SDK
clients call it through ``mcpbroker connect``.
"""

from __future__ import annotations

import sys

import pytest
import trio
from mcp.shared.exceptions import MCPError

from tests.conftest import REPO, running_daemon, sdk_server, shim_client, text_of
from tests.test_eras_e2e import modern_client

MODERN = "2026-07-28"


@pytest.mark.parametrize("era", ["auto", "modern"])
async def test_a_legacy_client_calls_a_modern_server(socket_path: str, era: str) -> None:
    with trio.fail_after(60):
        async with (
            running_daemon({"m": {**sdk_server("up"), "era": era}}, socket_path) as daemon,
            shim_client(socket_path, "m") as client,
        ):
            assert daemon.upstreams["m"].identity.protocol_version == MODERN
            tools = await client.list_tools()
            assert "echo" in [tool.name for tool in tools.tools]
            result = await client.call_tool("echo", {"text": "hello"})
            assert text_of(result) == "hello"
            assert not result.is_error
            prompt = await client.get_prompt("review", {"code": "x = 1"})
            assert prompt.messages
            read = await client.read_resource("test://up/hello")
            assert read.contents


async def test_a_modern_client_calls_a_modern_server(socket_path: str) -> None:
    with trio.fail_after(60):
        async with (
            running_daemon({"m": {**sdk_server("up"), "era": "auto"}}, socket_path) as daemon,
            modern_client(socket_path, "m") as client,
        ):
            assert daemon.upstreams["m"].identity.protocol_version == MODERN
            assert client.protocol_version == MODERN
            result = await client.call_tool("echo", {"text": "hi"})
            assert text_of(result) == "hi"
            result = await client.call_tool("whoami", {})
            assert text_of(result) == "up"


async def test_a_legacy_server_is_still_opened_with_initialize(socket_path: str) -> None:
    """``"era": "legacy"`` (the default): never probed."""
    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server("old")}, socket_path) as daemon,
            shim_client(socket_path, "s") as client,
        ):
            assert daemon.upstreams["s"].identity.protocol_version != MODERN
            result = await client.call_tool("echo", {"text": "x"})
            assert text_of(result) == "x"


async def test_auto_falls_back_to_initialize_on_a_legacy_only_server(socket_path: str) -> None:
    """The demo server answers ``server/discover`` with an error: it is opened legacy."""
    demo = {
        "command": sys.executable,
        "args": ["-m", "tools.demo_server"],
        "cwd": str(REPO),
        "era": "auto",
    }
    with trio.fail_after(60):
        async with running_daemon({"d": demo}, socket_path) as daemon:
            assert daemon.upstreams["d"].identity.protocol_version != MODERN


async def test_a_legacy_only_server_forced_modern_fails_its_handshake(socket_path: str) -> None:
    """``"era": "modern"`` on the demo server (legacy only): never opened with
    initialize; the handshake fails, saying why, and a client is told."""
    demo = {
        "command": sys.executable,
        "args": ["-m", "tools.demo_server"],
        "cwd": str(REPO),
        "era": "modern",
    }
    with trio.fail_after(60):
        async with running_daemon({"d": demo}, socket_path, wait=()) as daemon:
            upstream = daemon.upstreams["d"]
            while "not modern" not in (upstream.statistics().last_error or ""):
                await trio.sleep(0.05)
            assert upstream.identity is None
            with pytest.RaisesGroup(
                pytest.RaisesExc(MCPError, match=r"not running \(it .*is not modern"),
                flatten_subgroups=True,
            ):
                async with shim_client(socket_path, "d"):
                    pass  # (initialize is refused: the view's one server is down)
