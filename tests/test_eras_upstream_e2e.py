"""End to end: a modern (2026-07-28) SDK server behind the broker.

The SDK test server (``MCPServer.run()`` over stdio) serves both eras: the
client's first request decides. A server configured ``"era": "auto"`` or
``"modern"`` is opened with ``server/discover`` and is then spoken to in the
modern era (no ``initialize``; every request stamped); legacy and modern SDK
clients call it through ``mcpbroker connect``.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import structlog
import trio
from mcp import types
from mcp.shared.exceptions import MCPError

from actors.upstream import WARM_UP_TIMEOUT
from broker.lifecycle import LEGACY_VERSIONS
from tests.conftest import REPO, running_daemon, sdk_server, shim_client, text_of
from tests.faultkit import misbehaving
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
    """``"era": "legacy"`` (as ``sdk_server()`` sets it): never probed."""
    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server("old")}, socket_path) as daemon,
            shim_client(socket_path, "s") as client,
        ):
            assert daemon.upstreams["s"].identity.protocol_version != MODERN
            result = await client.call_tool("echo", {"text": "x"})
            assert text_of(result) == "x"


async def test_auto_falls_back_to_initialize_on_a_legacy_only_server(socket_path: str) -> None:
    """The demo server answers ``server/discover`` with an error: with the
    default ``era`` (auto) it is opened legacy."""
    demo = {"command": sys.executable, "args": ["-m", "tools.demo_server"], "cwd": str(REPO)}
    with trio.fail_after(60):
        async with running_daemon({"d": demo}, socket_path) as daemon:
            assert daemon.upstreams["d"].identity.protocol_version != MODERN


def default_era(entry: dict[str, Any]) -> dict[str, Any]:
    """A config entry without its ``era``: the default."""
    return {key: value for key, value in entry.items() if key != "era"}


async def test_by_default_a_dual_era_server_is_used_in_the_modern_era(socket_path: str) -> None:
    """The SDK's ``MCPServer.run()`` speaks both eras: the default probe finds
    2026-07-28, and a legacy client's calls reach it stamped for that era."""
    with trio.fail_after(60):
        async with (
            running_daemon({"m": default_era(sdk_server("up"))}, socket_path) as daemon,
            shim_client(socket_path, "m") as client,
        ):
            assert daemon.upstreams["m"].identity.protocol_version == MODERN
            result = await client.call_tool("echo", {"text": "hello"})
            assert (text_of(result), result.is_error) == ("hello", False)


async def test_a_tool_that_asks_the_legacy_way_names_the_setting_in_the_log(
    socket_path: str,
) -> None:
    """The SDK server's ``ask_user`` calls ``ctx.elicit``, which its modern era
    refuses (no back-channel): the legacy client gets the server's refusal, as
    a modern host would, and the operator is told, once, to set ``"era":
    "legacy"``, with which the same call completes."""

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"answer": "blue"})

    with structlog.testing.capture_logs() as captured, trio.fail_after(60):
        async with (
            running_daemon({"m": default_era(sdk_server("up"))}, socket_path),
            shim_client(socket_path, "m", elicitation_callback=elicit) as client,
        ):
            for _ in range(2):
                with pytest.raises(MCPError, match="back-channel"):
                    await client.call_tool("ask_user", {"question": "Colour?"})
    warned = [r for r in captured if r["event"] == "server.needs_legacy_era"]
    assert len(warned) == 1 and '"era": "legacy"' in warned[0]["detail"]
    with trio.fail_after(60):
        async with (
            running_daemon({"m": sdk_server("up")}, socket_path),  # ("era": "legacy")
            shim_client(socket_path, "m", elicitation_callback=elicit) as client,
        ):
            result = await client.call_tool("ask_user", {"question": "Colour?"})
            assert (text_of(result), result.is_error) == ("accept: blue", False)


async def test_per_client_eras_serve_each_client_in_its_own(socket_path: str) -> None:
    """``"era": "per-client"``: the same SDK server, whose ``ask_user`` asks
    and whose ``grow`` notifies the legacy way, completes the one and is heard
    for the other by a legacy client (its instance is opened legacy: no
    bridge), while a modern client is served by a second process, started
    when it came, that speaks 2026-07-28; each client stays with its own."""

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"answer": "blue"})

    servers = {"m": {**sdk_server("up"), "era": "per-client"}}
    with trio.fail_after(60):
        async with (
            running_daemon(servers, socket_path) as daemon,
            shim_client(socket_path, "m", elicitation_callback=elicit) as legacy,
        ):
            group = daemon.upstreams["m"]
            result = await legacy.call_tool("ask_user", {"question": "Colour?"})
            assert (text_of(result), result.is_error) == ("accept: blue", False)
            # ... and its legacy notification (send_tool_list_changed) reaches the catalog
            assert text_of(await legacy.call_tool("grow", {"name": "late"})) == "added late"
            with trio.fail_after(10):
                while "late" not in {t.name for t in (await legacy.list_tools()).tools}:
                    await trio.sleep(0.05)
            legacy_pid = text_of(await legacy.call_tool("pid", {}))
            assert len(group.instances()) == 1  # no modern client yet: one process
            # The modern instance is not held to the catalog's tools ("late"
            # is the legacy process's alone): no wait for the warm-up's time-out.
            with trio.fail_after(WARM_UP_TIMEOUT / 2):
                async with modern_client(socket_path, "m") as modern:
                    result = await modern.call_tool("echo", {"text": "hello"})
            async with modern_client(socket_path, "m") as modern:
                assert modern.protocol_version == MODERN
                result = await modern.call_tool("echo", {"text": "hello"})
                assert (text_of(result), result.is_error) == ("hello", False)
                modern_pid = text_of(await modern.call_tool("pid", {}))
                assert modern_pid != legacy_pid
                versions = sorted(i.identity.protocol_version for i in group.instances())
                assert versions[1] == MODERN and versions[0] in LEGACY_VERSIONS
                assert text_of(await legacy.call_tool("pid", {})) == legacy_pid
                assert text_of(await modern.call_tool("pid", {})) == modern_pid
                stats = group.statistics()
                assert (stats.share, stats.instances) == ("per-era", 2)
                assert sorted(stats.pids) == sorted([int(legacy_pid), int(modern_pid)])


async def test_a_server_that_exits_when_probed_is_opened_with_initialize(
    socket_path: str,
) -> None:
    """A legacy server that exits on any first request but ``initialize``: the
    probe costs it one process, and from then on it is opened with
    ``initialize`` (not probed into a crash loop), said once in the log."""
    with structlog.testing.capture_logs() as captured, trio.fail_after(60):
        async with (
            running_daemon({"s": misbehaving("strict-opening")}, socket_path) as daemon,
            shim_client(socket_path, "s") as client,
        ):
            assert daemon.upstreams["s"].identity.protocol_version != MODERN
            result = await client.call_tool("echo", {"text": "x"})
            assert text_of(result) == "x"
            assert daemon.upstreams["s"].statistics().restarts == 1
    skipped = [r for r in captured if r["event"] == "server.probe_skipped"]
    assert len(skipped) == 1 and "server/discover" in skipped[0]["reason"]


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


async def test_a_server_that_refuses_the_era_it_was_found_in_is_found_out_again(
    socket_path: str, tmp_path: Any
) -> None:
    """A server found modern whose later process is legacy only (replaced
    behind the broker's back) refuses a call -32022: the client is told to
    call again, the server is opened again, probed, and found legacy, and
    the next call is served. (Every call failed until its "era" was set.)"""
    server = misbehaving("era-downgrade", env={"MISBEHAVING_EXTRA": str(tmp_path / "marker")})
    with trio.fail_after(60):
        async with (
            running_daemon({"d": server}, socket_path) as daemon,
            shim_client(socket_path, "d") as client,
        ):
            upstream = daemon.upstreams["d"]
            assert upstream.identity.protocol_version == MODERN
            with pytest.raises(MCPError) as refused:
                await client.call_tool("echo", {"text": "hello"})
            assert refused.value.error.code == -32603
            assert "find out its era; call again" in refused.value.error.message
            while upstream.identity is None or upstream.identity.protocol_version == MODERN:
                await trio.sleep(0.05)
            result = await client.call_tool("echo", {"text": "hello"})
            assert (text_of(result), result.is_error) == ("hello", False)
