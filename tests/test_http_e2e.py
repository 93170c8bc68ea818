"""Streamable HTTP clients (``serve --http``), with real sockets, a real server
process and the shim's clients at the same time.

The clients are the official SDK's (``streamable_http_client``) where it
speaks for itself, and raw ``httpx2`` requests where a test needs to see the
statuses and headers.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import orjson
import trio
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import running_daemon, sdk_server, shim_client, text_of
from tests.test_server_requests_e2e import elicitor, sampler

LATEST = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


@asynccontextmanager
async def http_session(
    url: str, headers: dict[str, str] | None = None, **kwargs: Any
) -> AsyncIterator[ClientSession]:
    """An official SDK client over Streamable HTTP, initialized."""
    async with (
        httpx2.AsyncClient(headers=headers or {}, timeout=httpx2.Timeout(30, read=60)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, **kwargs) as session,
    ):
        await session.initialize()
        yield session


async def test_http_and_shim_clients_share_one_server(socket_path: str) -> None:
    servers = {"sdk": sdk_server()}
    with trio.fail_after(60):
        async with running_daemon(servers, socket_path, broker={"http": "127.0.0.1:0"}) as d:
            url = d.http_url
            assert url is not None and url.startswith("http://127.0.0.1:")
            pids: set[str] = set()
            transports: list[set[str]] = []

            async def over_http(path: str, prefix: str) -> None:
                async with http_session(url + path) as session:
                    tools = await session.list_tools()
                    assert f"{prefix}echo" in {tool.name for tool in tools.tools}
                    if path:  # one server, as it is: its own identity
                        result = session.initialize_result
                        assert result is not None
                        assert result.server_info.name == "sdk-test-server"
                    for n in range(5):
                        answer = await session.call_tool(f"{prefix}echo", {"text": f"h{n}"})
                        assert text_of(answer) == f"h{n}"
                    pids.add(text_of(await session.call_tool(f"{prefix}pid", {})))
                    status = d.statistics()
                    transports.append({s.transport for s in status.sessions})

            async def over_the_shim() -> None:
                async with shim_client(socket_path, "sdk") as session:
                    for n in range(5):
                        assert (
                            text_of(await session.call_tool("echo", {"text": f"s{n}"})) == f"s{n}"
                        )
                    pids.add(text_of(await session.call_tool("pid", {})))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(over_http, "", "sdk__")
                nursery.start_soon(over_http, "/sdk", "")
                nursery.start_soon(over_the_shim)
            assert len(pids) == 1  # one process served the three clients
            assert any("http" in seen for seen in transports)
            assert d.statistics().http == url
            assert d.upstreams["sdk"].statistics().restarts == 0
