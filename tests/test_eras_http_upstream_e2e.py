"""End to end: a 2026-07-28 server reached by URL (``"url": "http://..."``).

The official SDK's server (tests/servers/era_server.py ``--http``) runs over
Streamable HTTP on 127.0.0.1, modern only, dual-era (the SDK's app: it
routes on ``MCP-Protocol-Version``) or legacy only, behind the broker as a
``url`` server with the default ``"era"`` (``auto``) and with ``"legacy"``. The HTTP link
speaks the 2026-07-28 revision to a modern one (actors/links/http.py,
broker/wire/http_upstream_modern.py): its own POST per request with the
headers mirroring the body, which the SDK's server checks (a missing or
wrong ``Mcp-Name`` or ``Mcp-Param-*`` is refused with -32020), no session,
the listen as a long POST. The official SDK client reaches the broker
through ``mcpbroker connect``, in legacy mode and in ``mode="auto"``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
import trio
from mcp import types

from tests.conftest import running_daemon, text_of
from tests.test_eras_matrix_e2e import MODERN, User, client
from tests.test_http_upstream_e2e import listening_process
from tests.test_websocket_upstream_e2e import free_port

pytestmark = [
    pytest.mark.filterwarnings("ignore:resources/.*subscribe is removed"),
    pytest.mark.filterwarnings("ignore:The logging capability is deprecated"),
]


@asynccontextmanager
async def era_http_server(kind: str) -> AsyncIterator[str]:
    """tests/servers/era_server.py KIND over Streamable HTTP: its URL."""
    port = free_port()
    args = ["tests.servers.era_server", kind, "--http", str(port)]
    async with listening_process(args, port, dict(os.environ)):
        yield f"http://127.0.0.1:{port}/mcp"


def url_server(url: str, era: str | None) -> dict[str, Any]:
    return {"url": url} if era is None else {"url": url, "era": era}


async def stats(url: str) -> dict[str, Any]:
    async with httpx2.AsyncClient() as http:
        response = await http.get(url.removesuffix("/mcp") + "/stats")
    result: dict[str, Any] = response.json()
    return result


# (the server's kind, its "era" in the config: None for the default; whether it is modern)
SERVERS = [
    ("modern", None, True),  # the default ("auto"): the probe says modern
    ("dual", None, True),  # speaks both: used in the modern era
    ("legacy", None, False),  # the probe meets its 400 (no session): legacy
    ("modern", "legacy", True),  # refuses initialize (-32022): opened modern
    ("modern-only", "legacy", True),  # refuses it with -32602: server/discover says modern
    ("dual", "legacy", False),
]


@pytest.mark.parametrize(("kind", "era", "modern"), SERVERS)
async def test_every_client_mode_calls_a_url_server_of_every_era(
    socket_path: str, kind: str, era: str | None, modern: bool
) -> None:
    with trio.fail_after(90):
        async with (
            era_http_server(kind) as url,
            running_daemon({"s": url_server(url, era)}, socket_path) as daemon,
        ):
            identity = daemon.upstreams["s"].identity
            assert identity is not None
            assert (identity.protocol_version == MODERN) is modern
            for mode in ("legacy", "auto"):
                user = User()
                async with client(socket_path, mode, user) as session:
                    assert (session.protocol_version == MODERN) is (mode == "auto")
                    result = await session.call_tool("era", {})
                    assert text_of(result) == ("modern" if modern else "legacy")
                    result = await session.call_tool("echo", {"text": "héllo"})
                    assert (text_of(result), result.is_error) == ("héllo", False)
                    result = await session.call_tool("ask_user", {"question": "Colour?"})
                    assert (text_of(result), result.is_error) == ("accept: blue", False)
                    result = await session.call_tool("ask_llm", {"prompt": "Capital?"})
                    assert (text_of(result), result.is_error) == ("Paris", False)
                    assert user.asked == ["Colour?", "Capital?"]  # each asked once


# (the server's kind; the era each client mode is served in; the instances then)
PER_CLIENT = [
    ("dual", {"legacy": "legacy", "auto": "modern"}, 2),  # each client in its own
    ("modern", {"legacy": "modern", "auto": "modern"}, 1),  # opened modern: shared
    ("legacy", {"legacy": "legacy", "auto": "legacy"}, 2),  # the second probes legacy too
]


@pytest.mark.parametrize(("kind", "served", "instances"), PER_CLIENT)
async def test_per_client_eras_serve_each_client_of_a_url_server_in_its_own(
    socket_path: str, kind: str, served: dict[str, str], instances: int
) -> None:
    """``"era": "per-client"``: a dual-era server by URL serves a legacy
    client legacy and a modern one modern (two connections, neither bridged);
    a modern-only server is opened modern for both (one connection), a
    legacy-only one legacy for both (the modern client's own connection,
    probed, is legacy too: bridged as under ``auto``). The questions complete
    in every case."""
    with trio.fail_after(90):
        async with (
            era_http_server(kind) as url,
            running_daemon({"s": url_server(url, "per-client")}, socket_path) as daemon,
        ):
            for mode in ("legacy", "auto"):
                user = User()
                async with client(socket_path, mode, user) as session:
                    assert text_of(await session.call_tool("era", {})) == served[mode]
                    result = await session.call_tool("ask_user", {"question": "Colour?"})
                    assert (text_of(result), result.is_error) == ("accept: blue", False)
                    result = await session.call_tool("ask_llm", {"prompt": "Capital?"})
                    assert (text_of(result), result.is_error) == ("Paris", False)
                    assert user.asked == ["Colour?", "Capital?"]
            assert len(daemon.upstreams["s"].instances()) == instances


@pytest.mark.parametrize(("kind", "era"), [("modern", None), ("dual", None)])
async def test_a_legacy_client_hears_a_url_servers_changes_through_the_listen(
    socket_path: str, kind: str, era: str | None
) -> None:
    """The broker's subscriptions/listen at the server is a long POST whose
    SSE stream brings the list changes and resource updates."""
    user = User()
    with trio.fail_after(60):
        async with (
            era_http_server(kind) as url,
            running_daemon({"s": url_server(url, era)}, socket_path),
            client(socket_path, "legacy", user) as session,
        ):
            await session.subscribe_resource("test://era/doc")
            assert text_of(await session.call_tool("grow", {"name": "late"})) == "added late"
            await user.wait_for(types.ToolListChangedNotification)
            assert "late" in [tool.name for tool in (await session.list_tools()).tools]
            assert text_of(await session.call_tool("touch", {"uri": "test://era/doc"}))
            updated = await user.wait_for(types.ResourceUpdatedNotification)
            assert str(updated.params.uri) == "test://era/doc"


async def test_headers_mirror_the_body_as_the_server_checks_them(socket_path: str) -> None:
    """The SDK's server refuses a tools/call without the Mcp-Param-Region its
    tool's schema marks, and an Mcp-Name that does not decode to the body's
    URI: the calls complete, so the link sent them right (a non-ASCII value
    in the base64 form). A tool whose mark is invalid is not listed, as the
    spec asks of a client over Streamable HTTP."""
    with trio.fail_after(60):
        async with (
            era_http_server("modern") as url,
            running_daemon({"s": url_server(url, "auto")}, socket_path),
        ):
            for mode in ("legacy", "auto"):
                async with client(socket_path, mode, User()) as session:
                    names = [tool.name for tool in (await session.list_tools()).tools]
                    assert "region" in names and "bad_mark" not in names  # (its mark is invalid)
                    for where in ("us-west1", "Zürich", " padded "):
                        result = await session.call_tool("region", {"where": where, "size": 2})
                        assert (text_of(result), result.is_error) == (f"region {where}", False)
                    read = await session.read_resource("test://era/café")
                    assert read.contents[0].text == "un café"  # type: ignore[union-attr]


async def test_a_call_refused_for_its_headers_is_tried_again_after_a_fresh_list(
    socket_path: str,
) -> None:
    """The server marks a tool's argument without telling anyone: the next
    call meets HeaderMismatch, the link lists the tools again (the spec's
    advice) and the call goes once more with the header."""
    with trio.fail_after(60):
        async with (
            era_http_server("modern") as url,
            running_daemon({"s": url_server(url, None)}, socket_path),
            client(socket_path, "legacy", User()) as session,
        ):
            assert text_of(await session.call_tool("shout", {"text": "a"})) == "A"
            assert text_of(await session.call_tool("mark_shout", {})) == "marked"
            result = await session.call_tool("shout", {"text": "b"})
            assert (text_of(result), result.is_error) == ("B", False)


async def test_cancelling_a_call_closes_its_stream_at_a_modern_server(socket_path: str) -> None:
    """A client's cancellation reaches a modern server over HTTP as the spec
    has it: the POST's stream is closed, and the server's handler is cancelled."""
    with trio.fail_after(60):
        async with (
            era_http_server("modern") as url,
            running_daemon({"s": url_server(url, None)}, socket_path),
            client(socket_path, "legacy", User()) as session,
        ):
            with trio.move_on_after(1):
                await session.call_tool("slow", {})
            while (await stats(url))["cancelled"] != 1:
                await trio.sleep(0.05)
            result = await session.call_tool("echo", {"text": "after"})
            assert text_of(result) == "after"
