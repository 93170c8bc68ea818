"""End to end: servers reached by HTTP (``"url": "http://..."``, issue #13).

The official SDK's server (tests/servers/http_server.py: the tools of
tests/servers/sdk_server.py) runs as a real process over Streamable HTTP or
HTTP+SSE on 127.0.0.1; the daemon runs in the test's Trio loop and the
clients are official SDK sessions through ``mcpbroker connect``. A URL
server is used as a stdio one is: shared, its ids and progress tokens
rewritten, its requests to clients routed to the caller (on Streamable HTTP
by the stream they came on, with no gate), its failures answered with errors
naming it, reconnected with backoff.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx2
import pytest
import trio
from mcp.shared.exceptions import MCPError

import actors.links.http
import actors.upstream
from actors.upstream import Upstream
from broker import jsonrpc
from broker.config import BrokerSettings, ServerConfig
from broker.states import ServerState
from cli.status import render
from tests.conftest import REPO, running_daemon, shim_client, text_of
from tests.test_server_requests_e2e import elicitor, sampler
from tests.test_websocket_upstream_e2e import fails, free_port

PATHS = {"streamable-http": "/mcp", "sse": "/sse"}
# tests/servers/http_server.py is the SDK test server's tools over HTTP: they
# ask and notify the legacy way, so it is opened so, as docs/eras.md says.
LEGACY = {"era": "legacy"}


@asynccontextmanager
async def listening_process(
    module_args: list[str], port: int, env: dict[str, str]
) -> AsyncIterator[trio.Process]:
    """``python -m MODULE ARGS`` in a process of its own, once it listens on
    ``port`` (at most 20 s); killed on exit."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", *module_args],
        cwd=str(REPO),
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(20):
            while True:
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                except OSError:
                    await trio.sleep(0.05)
                    continue
                await stream.aclose()
                break
        yield process
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


@asynccontextmanager
async def http_server(
    transport: str, port: int | None = None, **env: str
) -> AsyncIterator[tuple[str, trio.Process]]:
    """The SDK server over HTTP in a process of its own: its URL and process."""
    port = port or free_port()
    args = ["tests.servers.http_server", transport, str(port)]
    environ = {**os.environ, "SDK_SERVER_NAME": "http-test", **env}
    async with listening_process(args, port, environ) as process:
        yield f"http://127.0.0.1:{port}{PATHS[transport]}", process


@pytest.mark.parametrize(
    ("transport", "type_", "env"),
    [
        ("streamable-http", "http", {}),
        ("streamable-http", "streamable-http", {"JSON_RESPONSE": "1"}),
        ("sse", "sse", {}),
        ("streamable-http", None, {}),
        ("sse", None, {}),
    ],
)
async def test_several_clients_share_one_url_server(
    socket_path: str, transport: str, type_: str | None, env: dict[str, str]
) -> None:
    """Each kind, named by "type" or found by the spec's fallback (none);
    Streamable HTTP answering with streams and with JSON bodies."""
    with trio.fail_after(60):
        async with http_server(transport, **env) as (url, process):
            entry: dict[str, Any] = {"url": url, **LEGACY, **({"type": type_} if type_ else {})}
            async with running_daemon({"web": entry}, socket_path) as daemon:
                answers: list[tuple[int, str]] = []
                progress: list[float] = []

                async def client(i: int) -> None:
                    async with shim_client(socket_path, "web") as session:
                        pid = text_of(await session.call_tool("pid", {}))
                        echo = text_of(await session.call_tool("echo", {"text": f"c{i}"}))
                        answers.append((int(pid), echo))

                        async def note(done: float, total: float | None, message: Any) -> None:
                            progress.append(done)

                        slow = await session.call_tool(
                            "slow", {"seconds": 0.3}, progress_callback=note
                        )
                        assert text_of(slow) == "slept 0.3"

                async with trio.open_nursery() as nursery:
                    for i in range(4):
                        nursery.start_soon(client, i)
                statistics = daemon.upstreams["web"].statistics()
                assert statistics.url == url
                lines = render(attrs.asdict(daemon.statistics())).splitlines()
                assert any(row.startswith("web ") and url in row for row in lines)  # status
                assert statistics.restarts == 0
                assert daemon.upstreams["web"]._link is not None
                assert daemon.upstreams["web"]._link.info["url"] == url
            if transport == "streamable-http":  # the daemon stopped: its session was ended
                async with httpx2.AsyncClient() as http:
                    stats = (await http.get(url.replace("/mcp", "/stats"))).json()
                assert stats == {
                    "deleted": 1,
                    "versions": ["2025-11-25"],
                    "resumed": 0,
                    "sessions": 1,
                }
    assert sorted(answers) == [(process.pid, f"c{i}") for i in range(4)]
    if not env:  # (a server answering with JSON bodies has nowhere to send progress)
        assert len(progress) >= 4 * 3  # every client had its own progress


async def test_a_servers_requests_reach_the_caller_among_concurrent_ones(
    socket_path: str,
) -> None:
    """On Streamable HTTP a sampling or elicitation request comes on the
    stream of the call that caused it: routed to that caller while several
    call at once, and the server is never gated."""
    with trio.fail_after(60):
        async with (
            http_server("streamable-http") as (url, _),
            running_daemon({"web": {"url": url, **LEGACY}}, socket_path) as daemon,
            shim_client(socket_path, "web", sampling_callback=sampler("a")) as a,
            shim_client(socket_path, "web", sampling_callback=sampler("b")) as b,
            shim_client(socket_path, "web", elicitation_callback=elicitor("c")) as c,
        ):
            results: dict[str, list[str]] = {"a": [], "b": [], "c": []}

            async def ask(name: str, session: Any, tool: str, i: int) -> None:
                key = "prompt" if tool == "ask_llm" else "question"
                result = await session.call_tool(tool, {key: f"q{i}"})
                results[name].append(text_of(result))

            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(ask, "a", a, "ask_llm", i)
                    nursery.start_soon(ask, "b", b, "ask_llm", i)
                    nursery.start_soon(ask, "c", c, "ask_user", i)
            protocol = daemon.upstreams["web"]._protocol
            assert not protocol.turns.on  # (nothing was gated, nothing refused)
            # A client without the capability is refused, never another asked.
            with pytest.raises(MCPError, match="did not declare the 'sampling' capability"):
                await c.call_tool("ask_llm", {"prompt": "x"})
    assert sorted(results["a"]) == sorted(f"a answers q{i}" for i in range(6))
    assert sorted(results["b"]) == sorted(f"b answers q{i}" for i in range(6))
    assert results["c"] == ["accept: c"] * 6


async def test_headers_take_a_token_from_the_environment(
    socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_TEST_TOKEN", "s3cret")
    monkeypatch.delenv("HTTP_TEST_MISSING", raising=False)
    with trio.fail_after(60):
        async with http_server("streamable-http", REQUIRE_TOKEN="s3cret") as (url, _):
            servers = {
                "good": {"url": url, "headers": {"Authorization": "Bearer ${HTTP_TEST_TOKEN}"}},
                "unset": {"url": url, "headers": {"Authorization": "Bearer ${HTTP_TEST_MISSING}"}},
                "wrong": {"url": url, "headers": {"Authorization": "Bearer nope"}},
            }
            async with (
                running_daemon(servers, socket_path, wait=("good",)) as daemon,
                shim_client(socket_path) as client,
            ):
                assert text_of(await client.call_tool("good__whoami", {})) == "http-test"
                for name, why in (
                    ("unset", "HTTP_TEST_MISSING is not set"),
                    ("wrong", "HTTP 401"),
                ):
                    with pytest.raises(MCPError) as failure:
                        await client.call_tool(f"{name}__whoami", {})
                    error = failure.value.error
                    assert error.code == jsonrpc.CONNECTION_CLOSED, error
                    assert f"'{name}'" in error.message and why in error.message, error
                assert daemon.upstreams["unset"].statistics().state == "failed"
                assert "s3cret" not in str(daemon.statistics())


def test_a_header_whose_variable_holds_non_ascii_is_a_launch_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (httpx raised UnicodeEncodeError out of the link, and the daemon died)
    from actors.links.link import LaunchError, configured_headers

    monkeypatch.setenv("HTTP_TEST_TOKEN", "s3cr\u00e9t")
    with pytest.raises(LaunchError, match="the header Authorization") as info:
        configured_headers({"Authorization": "Bearer ${HTTP_TEST_TOKEN}"})
    assert "s3cr" not in str(info.value)


async def test_a_killed_server_fails_the_calls_in_flight_and_is_reached_again(
    socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    with trio.fail_after(60):
        async with (
            http_server("streamable-http", port) as (url, first),
            running_daemon({"web": {"url": url, "restartDelay": 0.05}}, socket_path) as daemon,
            shim_client(socket_path, "web") as a,
            shim_client(socket_path, "web") as b,
        ):
            upstream = daemon.upstreams["web"]
            errors: list[Any] = []
            async with trio.open_nursery() as calls:
                calls.start_soon(fails, errors, a, "slow", {"seconds": 30})
                calls.start_soon(fails, errors, b, "slow_pid", {"seconds": 30})
                while len(upstream._protocol.requests) < 2:
                    await trio.sleep(0.01)
                await trio.sleep(0.2)  # (the POSTs reached the server)
                first.kill()
            assert len(errors) == 2
            for error in errors:
                assert error.code == jsonrpc.CONNECTION_CLOSED, error
                assert "'web'" in error.message, error
                assert error.data == {"server": "web", "retryable": True}, error
            with pytest.raises(MCPError) as down:  # down: answered at once
                await a.call_tool("pid", {})
            assert "'web'" in down.value.error.message
            async with http_server("streamable-http", port) as (_, second):
                await upstream.wait_ready()
                assert text_of(await a.call_tool("pid", {})) == str(second.pid)
                assert text_of(await b.call_tool("pid", {})) == str(second.pid)
            assert upstream.statistics().restarts >= 1


async def test_an_expired_session_is_opened_again_and_the_call_goes_through(
    socket_path: str,
) -> None:
    """The server forgets the session (404 to its id): the link opens a new
    one (initialize again, the new Mcp-Session-Id) and POSTs the call again;
    the client sees nothing of it, and the connection is not restarted."""
    with trio.fail_after(60):
        async with (
            http_server("streamable-http") as (url, process),
            running_daemon({"web": {"url": url, **LEGACY}}, socket_path) as daemon,
            shim_client(socket_path, "web") as a,
            shim_client(socket_path, "web") as b,
        ):
            upstream = daemon.upstreams["web"]
            first = upstream._link
            assert text_of(await a.call_tool("whoami", {})) == "http-test"
            async with httpx2.AsyncClient() as http:
                forgot = await http.post(url.replace("/mcp", "/forget"))
                assert forgot.status_code == 200
                async with trio.open_nursery() as nursery:  # both meet the 404
                    for client in (a, b):
                        nursery.start_soon(client.call_tool, "whoami", {})
                assert text_of(await a.call_tool("pid", {})) == str(process.pid)
                stats = (await http.get(url.replace("/mcp", "/stats"))).json()
            assert stats["sessions"] == 2  # one renewal for both
            assert upstream._link is first and upstream.statistics().restarts == 0


async def test_an_http_error_fails_that_call_only_and_a_cancelled_call_is_cancelled(
    socket_path: str, tmp_path: Any
) -> None:
    marker = tmp_path / "marker"
    with trio.fail_after(60):
        async with (
            http_server("streamable-http") as (url, process),
            running_daemon({"web": {"url": url, **LEGACY}}, socket_path) as daemon,
            shim_client(socket_path, "web") as client,
        ):
            upstream = daemon.upstreams["web"]
            with pytest.raises(MCPError) as failure:
                await client.call_tool("fail_with_500", {})
            error = failure.value.error
            assert error.code == jsonrpc.INTERNAL_ERROR, error
            assert error.message == (
                "MCP server 'web' answered with HTTP 500 Internal Server Error: boom"
            )
            assert error.data == {"server": "web"}
            # A call the client gives up on: the server hears the cancellation,
            # and the link lets go of its stream.
            with trio.move_on_after(0.5):
                await client.call_tool("wait_for_cancel", {"marker": str(marker)})
            while not marker.exists() or len(upstream._protocol.requests):
                await trio.sleep(0.05)
            assert marker.read_text() == "cancelled"
            link = upstream._link
            assert link is not None and not link._streams  # type: ignore[attr-defined]
            assert text_of(await client.call_tool("pid", {})) == str(process.pid)
            assert upstream.statistics().restarts == 0


async def test_a_json_body_that_is_not_the_answer_fails_that_call_at_once(
    socket_path: str,
) -> None:
    """A POST answered 200 ``application/json`` with what is not its answer
    (HTML, or a notification alone): nothing more will come for the call, so
    its caller is told at once, naming what came, not left to wait out the
    timeout (60 s here); the server goes on serving. A body of JSON lines (a
    notification, then the answer) is read as its lines."""
    with trio.fail_after(30):
        async with (
            http_server("streamable-http") as (url, process),
            running_daemon({"web": {"url": url, "timeout": 60, **LEGACY}}, socket_path) as d,
            shim_client(socket_path, "web") as client,
        ):
            for tool, why in [
                ("answer_html", "a JSON body that is not JSON (unexpected character"),
                ("answer_nothing", "a JSON body that holds no answer"),
            ]:
                with trio.fail_after(10), pytest.raises(MCPError) as failure:
                    await client.call_tool(tool, {})
                error = failure.value.error
                assert error.code == jsonrpc.INTERNAL_ERROR, error
                assert error.message.startswith(f"MCP server 'web' answered with {why}"), error
            with trio.fail_after(10):
                assert text_of(await client.call_tool("answer_as_lines", {})) == "from lines"
            assert text_of(await client.call_tool("pid", {})) == str(process.pid)
            assert d.upstreams["web"].statistics().restarts == 0


async def test_a_bug_in_the_link_restarts_that_server_only(
    socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = actors.links.http.HttpLink._listen
    bugs = [RuntimeError("a bug")]

    async def buggy(self: Any) -> None:
        if bugs:
            raise bugs.pop()
        await real(self)

    monkeypatch.setattr(actors.links.http.HttpLink, "_listen", buggy)
    with trio.fail_after(60):
        async with (
            http_server("streamable-http") as (url, process),
            running_daemon(
                {"web": {"url": url, **LEGACY, "restartDelay": 0.05}}, socket_path, wait=()
            ) as daemon,
        ):
            upstream = daemon.upstreams["web"]
            while upstream.statistics().restarts == 0:
                await trio.sleep(0.01)
            error = upstream.statistics().last_error or ""
            assert "internal error of the broker (RuntimeError)" in error
            await upstream.wait_ready()
            async with shim_client(socket_path, "web") as client:
                assert text_of(await client.call_tool("pid", {})) == str(process.pid)


async def test_a_stream_closed_before_its_answer_is_polled_again(socket_path: str) -> None:
    """The server closes a call's stream and goes on (the spec's polling): the
    link GETs it again with Last-Event-ID, and what comes then (a sampling
    request, the answer) is still that call's, among concurrent callers."""
    with trio.fail_after(60):
        async with (
            http_server("streamable-http", EVENT_STORE="1") as (url, _),
            running_daemon({"web": {"url": url, **LEGACY}}, socket_path) as daemon,
            shim_client(socket_path, "web", sampling_callback=sampler("a")) as a,
            shim_client(socket_path, "web", sampling_callback=sampler("b")) as b,
        ):
            results: dict[str, list[str]] = {"a": [], "b": []}

            async def call(name: str, session: Any) -> None:
                results[name].append(text_of(await session.call_tool("polled", {})))

            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(call, "a", a)
                    nursery.start_soon(call, "b", b)
            assert daemon.upstreams["web"].statistics().restarts == 0
            async with httpx2.AsyncClient() as http:
                stats = (await http.get(url.replace("/mcp", "/stats"))).json()
            assert stats["resumed"] >= 6  # (each call's stream, polled again)
    assert results == {"a": ["polled: a answers p"] * 3, "b": ["polled: b answers p"] * 3}


@pytest.mark.parametrize(
    ("url", "type_", "why"),
    [
        ("http:///mcp", None, "has a url that is not a valid http(s):// URL"),
        ("http://127.0.0.1:1/mcp", "ws", "has \"type\": 'ws' does not go with an http(s):// url"),
        ("https://127.0.0.1:1/mcp", "stdio", "'stdio' does not go with"),
    ],
)
async def test_an_http_url_that_cannot_work_is_said_once_and_not_retried(
    url: str, type_: str | None, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = BrokerSettings(restart_delay=0.01)
    upstream = Upstream("bad", ServerConfig(url=url, type=type_), settings)
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
