"""End to end with real Node.js peers: the MCP Inspector's CLI (2.x) as a host,
in both protocol eras, through the shim (the command line docs/hosts.md gives)
and by URL; and the reference ``@modelcontextprotocol/server-everything`` as a
shared third-party server, used by the Inspector and by official Python SDK
clients at once. (tests/nodejs.py installs them on first use.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import structlog
import trio
from mcp import types

from tests.conftest import MCPBROKER, demo_server, running_daemon, shim_client, text_of
from tests.nodejs import node_tools
from tests.test_eras_e2e import modern_client
from tests.test_server_requests_e2e import sampler

ERA_VERSIONS = {"legacy": "2025-11-25", "modern": "2026-07-28", "auto": "2026-07-28"}


async def inspector_cli(*arguments: str) -> Any:
    """``mcp-inspector --cli ARGUMENTS --format json``: the result it printed."""
    tools = node_tools()
    done = await trio.run_process(
        [tools.node, tools.inspector, "--cli", *arguments, "--format", "json"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr).decode()[-2000:]
    return json.loads(done.stdout)["result"]


async def inspector(socket_path: str, server: str, *method: str, era: str = "legacy") -> Any:
    """``mcp-inspector --cli --protocol-era ERA mcpbroker connect SERVER --method ...``"""
    shim = [MCPBROKER, "connect", server, "--socket", socket_path]
    return await inspector_cli("--protocol-era", era, *shim, "--method", *method)


@contextmanager
def sessions_opened() -> Iterator[list[dict[str, Any]]]:
    """The daemon's ``session.initialized`` records while the block runs: which
    protocol version each client spoke, on which transport."""
    with structlog.testing.capture_logs() as captured:
        opened: list[dict[str, Any]] = []
        yield opened
    opened += [record for record in captured if record["event"] == "session.initialized"]


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
            assert called["structuredContent"] == {"result": 42}


@pytest.mark.parametrize("era", ["legacy", "modern", "auto"])
async def test_the_inspector_in_each_era_through_the_shim(socket_path: str, era: str) -> None:
    """``--protocol-era modern`` speaks 2026-07-28 (no initialize, ``_meta`` on every
    request) to the broker, which bridges it to the legacy demo server; ``auto``
    probes ``server/discover`` and must find the broker modern."""
    node_tools()
    with trio.fail_after(60):
        async with running_daemon({"demo": demo_server()}, socket_path):
            with sessions_opened() as opened:
                listed = await inspector(socket_path, "demo", "tools/list", era=era)
                called = await inspector(
                    socket_path,
                    "demo",
                    *("tools/call", "--tool-name", "add", "--tool-arg", "a=2", "b=40"),
                    era=era,
                )
            assert {"echo", "add"} <= {tool["name"] for tool in listed["tools"]}
            assert called["structuredContent"] == {"result": 42}
            assert called["content"] == [{"type": "text", "text": "42"}]
            assert [(s["protocol_version"], s["transport"]) for s in opened] == [
                (ERA_VERSIONS[era], "unix")
            ] * 2


async def by_url(era: str, socket_path: str) -> None:
    """The Inspector at ``serve --http``'s ``/mcp`` (every server, merged) and
    ``/mcp/demo`` (one server as it is) in ERA."""
    node_tools()
    with trio.fail_after(60):
        async with running_daemon(
            {"demo": demo_server()}, socket_path, broker={"http": "127.0.0.1:0"}
        ) as daemon:
            assert daemon.http_url is not None
            with sessions_opened() as opened:
                for path, prefix in (("", "demo__"), ("/demo", "")):
                    # (The Inspector guesses the transport only from a URL ending in /mcp.)
                    url = ["--transport", "http", daemon.http_url + path]
                    target = ["--protocol-era", era, *url]
                    listed = await inspector_cli(*target, "--method", "tools/list")
                    assert f"{prefix}add" in {tool["name"] for tool in listed["tools"]}
                    called = await inspector_cli(
                        *target,
                        *("--method", "tools/call", "--tool-name", f"{prefix}echo"),
                        *("--tool-arg", f"text=by url {path}"),
                    )
                    assert called["content"] == [{"type": "text", "text": f"by url {path}"}]
            spoken = [(s["protocol_version"], s["transport"]) for s in opened]
            if era == "modern":
                # A context per POST (docs/eras.md), logged at debug level; the
                # Inspector's modern era does not fall back, so no legacy session.
                assert set(spoken) <= {(ERA_VERSIONS[era], "http")}
            else:
                assert spoken == [(ERA_VERSIONS[era], "http")] * 4


async def test_the_inspector_by_url_legacy(socket_path: str) -> None:
    await by_url("legacy", socket_path)


async def test_the_inspector_by_url_modern(socket_path: str) -> None:
    await by_url("modern", socket_path)


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
            for era in ("legacy", "modern"):
                called = await inspector(
                    socket_path,
                    "everything",
                    *("tools/call", "--tool-name", "echo", "--tool-arg", f"message={era}"),
                    era=era,
                )
                assert f"Echo: {era}" in json.dumps(called["content"])
            # One server process for all four clients.
            stats = daemon.upstreams["everything"].statistics()
            assert stats.restarts == 0 and stats.pid is not None


async def test_a_modern_sdk_client_answers_server_everythings_questions_through_the_bridge(
    socket_path: str,
) -> None:
    """A real legacy server that asks mid-call: server-everything's
    ``trigger-sampling-request`` and ``trigger-elicitation-request`` send
    ``sampling/createMessage`` and ``elicitation/create`` while the call is
    open; the broker answers the 2026-07-28 client ``input_required``, the
    SDK's driver asks its callbacks and retries, and each call completes
    with the answer in it."""

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"name": "Ada", "check": True})

    node_tools()
    callbacks = {"sampling_callback": sampler("m"), "elicitation_callback": elicit}
    with trio.fail_after(90):
        async with (
            running_daemon({"everything": everything()}, socket_path),
            modern_client(socket_path, "everything", **callbacks) as client,
        ):
            assert client.protocol_version == ERA_VERSIONS["modern"]
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"trigger-sampling-request", "trigger-elicitation-request"} <= names
            sampled = await client.call_tool("trigger-sampling-request", {"prompt": "hi"})
            assert not sampled.is_error
            assert "m answers" in json.dumps(sampled.model_dump(mode="json"))
            elicited = await client.call_tool("trigger-elicitation-request", {})
            assert not elicited.is_error
            assert "Name: Ada" in text_of(elicited)
