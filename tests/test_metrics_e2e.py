"""``/metrics`` of a live daemon, scraped while SDK clients make known calls:
the counts are what the clients did, the CPU and memory what psutil sees,
and every metric the Grafana dashboard shows is there."""

from __future__ import annotations

import itertools
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest
import structlog
import trio
from mcp.shared.exceptions import MCPError
from prometheus_client.parser import text_string_to_metric_families

from actors.daemon import Daemon
from actors.downstream.metrics import (
    MAX_CONNECTIONS,
    REFUSALS_BURST,
    RENDER_SHARE,
    serve_metrics,
)
from actors.downstream.unix import StartError
from broker.config import ConfigError, parse_config, with_metrics
from broker.wire.websocket import Policy
from cli.status import render
from tests.conftest import REPO, running_daemon, sdk_server, shim_client

DASHBOARD = REPO / "docs" / "grafana-dashboard.json"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def get(
    url: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode(), lower(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), lower(exc.headers)


def lower(headers: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


async def scrape(url: str) -> Samples:
    status, text, headers = await trio.to_thread.run_sync(get, url)
    assert status == 200, text
    assert headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def server_entry(timeout: float) -> dict[str, Any]:
    return {**sdk_server("alpha"), "timeout": timeout}


async def test_a_scrape_counts_what_the_clients_did(socket_path: str) -> None:
    with trio.fail_after(60):
        broker = {"metrics": "127.0.0.1:0"}
        async with (
            running_daemon({"alpha": server_entry(1.0)}, socket_path, broker=broker) as daemon,
            shim_client(socket_path) as client,
        ):
            assert daemon.metrics_url is not None
            for n in range(2):
                await client.call_tool("alpha__echo", {"text": str(n)})
            async with shim_client(socket_path, "alpha") as alone:  # (its hello opens it)
                await alone.call_tool("echo", {"text": "2"})
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("alpha__nope", {})
            assert unknown.value.error.code == -32602
            with pytest.raises(MCPError) as late:
                await client.call_tool("alpha__slow_pid", {"seconds": 3})  # no progress: times out
            assert late.value.error.code == -32001

            # A call in flight while we look.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.call_tool, "alpha__slow_pid", {"seconds": 0.8})
                await trio.sleep(0.3)
                during = await scrape(daemon.metrics_url)
            assert value(during, "mcpbroker_server_requests_in_flight", server="alpha") == 1
            [(_, labels)] = [
                key for key in during if key[0] == "mcpbroker_session_requests_in_flight"
            ]
            assert during[("mcpbroker_session_requests_in_flight", labels)] == 1
            assert dict(labels)["client"] == "mcp"  # the SDK's clientInfo.name

            pid = daemon.upstreams["alpha"].statistics().pid
            assert pid is not None
            process = psutil.Process(pid)
            cpu_before = sum(process.cpu_times()[:2])
            samples = await scrape(daemon.metrics_url)
            cpu_after = sum(process.cpu_times()[:2])
            rss = process.memory_info().rss

            def requests(outcome: str, server: str = "alpha") -> float:
                return value(
                    samples,
                    "mcpbroker_requests_total",
                    server=server,
                    method="tools/call",
                    outcome=outcome,
                )

            assert requests("ok") == 4  # three echoes, one slow_pid
            assert requests("error") == 1  # the timeout
            assert requests("error", server="") == 1  # the unknown tool, refused by the broker
            assert value(
                samples, "mcpbroker_request_errors_total", server="alpha", method="tools/call",
                code="-32001",
            ) == 1  # fmt: skip
            assert value(
                samples, "mcpbroker_request_errors_total", server="", method="tools/call",
                code="-32602",
            ) == 1  # fmt: skip
            assert value(samples, "mcpbroker_request_duration_seconds_count", server="alpha") == 5
            total = value(samples, "mcpbroker_request_duration_seconds_sum", server="alpha")
            assert 1.0 + 0.8 <= total < 10  # the timeout's second and the slow call's 0.8 s
            below_half = value(
                samples, "mcpbroker_request_duration_seconds_bucket", server="alpha", le="0.5"
            )
            assert below_half == 3  # the echoes (timed from the read, a hello's too)
            assert value(samples, "mcpbroker_server_timeouts_total", server="alpha") == 1
            assert value(samples, "mcpbroker_server_up", server="alpha") == 1
            assert value(samples, "mcpbroker_server_state", server="alpha", state="ready") == 1
            assert value(samples, "mcpbroker_server_restarts_total", server="alpha") == 0
            assert value(samples, "mcpbroker_server_requests_in_flight", server="alpha") == 0
            assert value(samples, "mcpbroker_sessions", transport="unix") == 1

            # The server's process, as psutil sees it around the scrape.
            cpu = value(samples, "mcpbroker_server_cpu_seconds_total", server="alpha")
            assert cpu_before <= cpu <= cpu_after
            scraped_rss = value(samples, "mcpbroker_server_resident_memory_bytes", server="alpha")
            assert abs(scraped_rss - rss) <= 0.05 * rss
            assert value(samples, "process_resident_memory_bytes") > 0  # the daemon's own

            # Every metric the dashboard shows is in the scrape.
            shown = dashboard_metrics()
            assert shown, "the dashboard shows no metric"
            scraped = {name for name, _ in samples}
            missing = sorted(name for name in shown if name not in scraped)
            assert not missing, f"the dashboard uses metrics no scrape has: {missing}"


def dashboard_metrics() -> set[str]:
    """The metric names the dashboard's queries use."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
        if "expr" in target
    ]
    return {name for expr in exprs for name in re.findall(r"\b(?:mcpbroker|process)_\w+", expr)}


async def test_the_metrics_listener_refuses_other_hosts_origins_paths_and_methods(
    socket_path: str,
) -> None:
    with trio.fail_after(30):
        broker = {"metrics": "127.0.0.1:0", "allowedHosts": ["broker.local"]}
        async with running_daemon({}, socket_path, broker=broker) as daemon:
            url = daemon.metrics_url
            assert url is not None
            base = url.removesuffix("/metrics")
            assert f"Metrics: {url}" in render(attrs.asdict(daemon.statistics()))

            async def status(path: str, **headers: str) -> tuple[int, str]:
                code, text, _ = await trio.to_thread.run_sync(get, base + path, headers)
                return code, text

            code, text = await status("/metrics", Host="attacker.example")
            assert code == 403 and "attacker.example" in text
            assert (await status("/metrics", Host="broker.local:9"))[0] == 200
            code, text = await status("/metrics", Origin="http://evil.example")
            assert code == 403 and "Origin" in text
            assert (await status("/other"))[0] == 404
            assert (await status("/metrics", Host="localhost"))[0] == 200
            code, text, headers = await trio.to_thread.run_sync(get, url, {}, "POST")
            assert code == 405 and headers["allow"] == "GET, HEAD"
            code, text, headers = await trio.to_thread.run_sync(get, url, {}, "HEAD")
            assert code == 200 and text == "" and int(headers["content-length"]) > 0
            # Not HTTP at all: a 400, and the listener goes on.
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(b"NOT HTTP\r\n\r\n")
                answer = b""
                while chunk := await stream.receive_some(4096):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 400 ")
            assert (await status("/metrics"))[0] == 200


async def test_a_token_guards_the_metrics_when_one_is_configured(
    socket_path: str, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with trio.fail_after(30):
        broker = {"metrics": "127.0.0.1:0", "tokenFile": str(token)}
        async with running_daemon({}, socket_path, broker=broker) as daemon:
            url = daemon.metrics_url
            assert url is not None
            code, _, headers = await trio.to_thread.run_sync(get, url)
            assert code == 401 and headers["www-authenticate"].startswith("Bearer")
            auth = {"Authorization": "Bearer s3cret"}
            code, text, _ = await trio.to_thread.run_sync(get, url, auth)
            assert code == 200 and "mcpbroker_uptime_seconds" in text


async def test_requests_read_with_a_hello_are_timed_from_that_read(socket_path: str) -> None:
    lines = [
        {"mcpbroker": {"servers": ["alpha"]}},
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "echo", "arguments": {"text": "x"}}},
    ]  # fmt: skip
    with trio.fail_after(30):
        broker = {"metrics": "127.0.0.1:0"}
        async with (
            running_daemon({"alpha": sdk_server("alpha")}, socket_path, broker=broker) as daemon,
            await trio.open_unix_socket(socket_path) as stream,
        ):
            assert daemon.metrics_url is not None
            await stream.send_all(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
            received = b""
            while b'"id":2' not in received.replace(b" ", b""):
                received += await stream.receive_some(65536)
            samples = await scrape(daemon.metrics_url)
    fast = value(samples, "mcpbroker_request_duration_seconds_bucket", server="alpha", le="0.5")
    assert fast == 1
    assert value(samples, "mcpbroker_request_duration_seconds_count", server="") == 1  # initialize


def test_bad_metrics_and_audit_settings_are_refused_with_their_key() -> None:
    with pytest.raises(ConfigError, match=r'"broker.metrics": expected HOST:PORT'):
        parse_config({"broker": {"metrics": "nope"}})
    with pytest.raises(ConfigError, match=r"auditArguments"):
        parse_config({"broker": {"auditArguments": "yes"}})
    with pytest.raises(ConfigError, match="--metrics"):
        with_metrics(parse_config({}), "host:port")


async def test_the_daemon_will_not_start_what_it_cannot_serve_safely(
    socket_path: str, tmp_path: Path
) -> None:
    refusals = [
        ({"metrics": "0.0.0.0:0"}, "metrics listener on 0.0.0.0, off loopback, needs a token"),
        ({"auditLog": str(tmp_path / "missing" / "a.jsonl")}, "cannot write the audit log"),
    ]
    for broker, message in refusals:
        daemon = Daemon(parse_config({"mcpServers": {}, "broker": broker}), socket_path)
        with trio.fail_after(10), pytest.raises(StartError, match=message):
            await daemon.run()


# -- the listener, bounded: nothing a local user sends costs the daemon much ----


@asynccontextmanager
async def listener(render: Any) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_metrics, "127.0.0.1", 0, Policy, render)
        yield port
        nursery.cancel_scope.cancel()


async def ask(port: int, head: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head)
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
    return answer


SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"


async def test_a_malformed_accept_gets_the_text_format_and_a_failing_render_one_scrape() -> None:
    # (choose_encoder raised TypeError on "version=x": it reached the daemon's nursery)
    from prometheus_client import CollectorRegistry

    from actors.metrics import render

    renders = 0

    def flaky(accept: str) -> tuple[bytes, str]:
        nonlocal renders
        renders += 1
        if renders == 1:
            raise RuntimeError("a bug")
        return render(CollectorRegistry(), accept)

    with trio.fail_after(10):
        async with listener(flaky) as port:
            assert await ask(port, SCRAPE + b"\r\n") == b""  # (closed: the listener lives)
            for accept in (b"text/plain; version=x", b"application/openmetrics-text; version=a"):
                answer = await ask(port, SCRAPE + b"Accept: " + accept + b"\r\n\r\n")
                assert answer.startswith(b"HTTP/1.1 200 ") and b"text/plain" in answer


async def test_connections_are_capped_and_an_idle_one_is_closed_soon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (1,100 idle connections used up the daemon's descriptors: no host got in)
    import actors.downstream.metrics as listener_module

    monkeypatch.setattr(listener_module, "HEAD_TIMEOUT", 0.5)
    with trio.fail_after(10):
        async with listener(lambda accept: (b"m 1\n", "text/plain")) as port:
            idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(MAX_CONNECTIONS)]
            await trio.sleep(0.1)
            with trio.fail_after(0.4):  # (over the cap: closed as it comes)
                assert await ask(port, SCRAPE + b"\r\n") == b""
            with trio.fail_after(1):  # (idle past HEAD_TIMEOUT: closed)
                assert await idle[0].receive_some(100) == b""
            for stream in idle:
                await stream.aclose()
            assert (await ask(port, SCRAPE + b"\r\n")).startswith(b"HTTP/1.1 200 ")


async def test_a_scrape_loop_gets_renders_spaced_out() -> None:
    # (34 scrapes a second of 30 ms each slowed every session's calls to 100 ms)
    rendered: list[float] = []

    def slow(accept: str) -> tuple[bytes, str]:
        rendered.append(trio.current_time())
        time.sleep(0.01)  # (the collector's psutil work)
        return b"m 1\n", "text/plain"

    with trio.fail_after(10):
        async with listener(slow) as port, trio.open_nursery() as scrapers:
            for _ in range(5):
                scrapers.start_soon(ask, port, SCRAPE + b"\r\n")
    gaps = [b - a for a, b in itertools.pairwise(rendered)]
    assert len(rendered) == 5 and min(gaps) >= 0.09 * (1 - RENDER_SHARE), gaps


async def test_refused_scrapes_are_logged_within_a_budget() -> None:
    with structlog.testing.capture_logs() as captured, trio.fail_after(20):
        async with listener(lambda accept: (b"", "text/plain")) as port:
            for _ in range(60):
                await ask(port, b"GET /metrics HTTP/1.1\r\nHost: evil.example\r\n\r\n")
    refused = [entry for entry in captured if entry["event"] == "metrics.refused"]
    assert REFUSALS_BURST <= len(refused) < REFUSALS_BURST + 10, len(refused)
