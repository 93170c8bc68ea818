"""The load engine over Streamable HTTP (tools/bench_http.py): its response reader,
``mcpbroker bench`` against a ``url`` server (through the daemon and ``--direct``),
and the harness's ``http`` scenario on a tiny run.

The servers are real: the official SDK's Streamable HTTP server
(tests/servers/http_server.py, under uvicorn) and the daemon's own ``--http``
listener. No test asserts a speed.
"""

from __future__ import annotations

import json
import os
import selectors
import sys
import tempfile
from functools import partial
from typing import Any

import orjson
import pytest
import trio
import trustme

from broker.wire.http_modern import decode_header_value
from tests.conftest import MCPBROKER, REPO, running_daemon
from tests.test_bench import _remove, echo_server, engine_run
from tests.test_http_upstream_e2e import http_server
from tools.bench_engine import Engine, Load, Target
from tools.bench_http import HttpClient, Response, modern_fields

# -- the response reader, fed as the network may cut it --------------------------


def trickled(data: bytes, step: int) -> tuple[Response, list[bytes]]:
    response, messages = Response(), []
    for start in range(0, len(data), step):
        messages += response.feed(data[start : start + step])
    return response, messages


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


SSE_CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\nmcp-session-id: abc\r\n\r\n"
) + chunked(
    b"event: message\r\n\r\n",  # an event with no data: nothing to hand up
    b'event: message\r\ndata: {"id":1,"result":{}}\r\n\r\n',
    b'data: {"id":2,\r\ndata: "x":3}\n\n',  # two data lines; LF line ends
)


@pytest.mark.parametrize("step", [1, 2, 7, 1000])
def test_a_chunked_sse_answer_read_in_any_cuts(step: int) -> None:
    response, messages = trickled(SSE_CHUNKED, step)
    assert response.done and response.status == 200
    assert response.headers[b"mcp-session-id"] == b"abc"
    assert messages == [b'{"id":1,"result":{}}', b'{"id":2,\n"x":3}']


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_a_json_body_by_length_and_an_empty_202(step: int) -> None:
    body = b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    data = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    response, messages = trickled(data, step)
    assert (response.done, messages) == (True, [body])
    accepted, nothing = trickled(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n", step)
    assert (accepted.done, accepted.status, nothing) == (True, 202, [])


def test_an_error_status_and_a_body_up_to_the_close() -> None:
    failed, messages = trickled(b"HTTP/1.1 500 Internal\r\ncontent-length: 4\r\n\r\nboom", 3)
    assert (failed.done, failed.status, messages) == (True, 500, [])
    open_ended = Response()
    assert open_ended.feed(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"id"') == []
    assert open_ended.feed(b":1}") == [] and not open_ended.done
    assert open_ended.eof() == [b'{"id":1}'] and open_ended.done


def test_a_bad_url_or_header_is_refused_before_connecting() -> None:
    with selectors.DefaultSelector() as selector:
        for url, headers in (
            ("ftp://example.com/mcp", {}),
            ("http://127.0.0.1:1/mcp", {"X-Bad": "a\r\nInjected: yes"}),
        ):
            with pytest.raises(Exception, match=r"not an http|not a valid HTTP header"):
                HttpClient(url, headers, "application/json", selector, 0)


def test_modern_fields_name_the_method_and_the_tool_as_the_broker_reads_them() -> None:
    assert modern_fields("server/discover") == b"Mcp-Method: server/discover\r\n"
    plain = modern_fields("tools/call", "echo")
    assert plain == b"Mcp-Method: tools/call\r\nMcp-Name: echo\r\n"
    for name in ("écho", "=?base64?eA==?=", "a\tb", " echo", "echo "):  # not sent as they are
        field = modern_fields("tools/call", name).split(b"\r\n")[1]
        value = field.removeprefix(b"Mcp-Name: ").decode("ascii")
        assert value.startswith("=?base64?") and decode_header_value(value) == name


# -- the engine over HTTP ------------------------------------------------------------


async def test_engine_over_http_counts_answers_errors_and_http_statuses() -> None:
    # The SDK's server: SSE answers; a POST holding "fail_with_500" gets HTTP 500.
    with trio.fail_after(40):
        async with http_server("streamable-http") as (url, _process):
            target = Target(url=url)
            ok = await trio.to_thread.run_sync(
                engine_run, target, Load(3, "echo", {"text": "hi"}, requests=31)
            )
            failing = await trio.to_thread.run_sync(
                engine_run, target, Load(2, "echo", {"text": "fail_with_500"}, requests=6)
            )
            unknown = await trio.to_thread.run_sync(engine_run, target, Load(1, "nope", requests=4))
    assert (ok["calls"], ok["ok"], ok["errors"], ok["lost"]) == (31, 31, {}, 0)
    assert ok["latency_us"]["p50"] > 0
    assert (failing["calls"], failing["ok"], failing["errors"]) == (6, 0, {"HTTP 500": 6})
    assert (unknown["calls"], unknown["ok"], unknown["tool_errors"]) == (4, 0, 4)  # isError


async def test_engine_over_https_checks_the_certificate(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    tls = {"TLS_CERT": str(tmp_path / "cert.pem"), "TLS_KEY": str(tmp_path / "key.pem")}

    def opening(url: str) -> str:
        try:
            engine_run(Target(url=url), Load(1, "echo", requests=1))
        except Exception as exc:
            return str(exc)
        return "opened"

    with trio.fail_after(40):
        async with http_server("streamable-http", **tls) as (url, _process):
            url = url.replace("http://", "https://")
            untrusted = await trio.to_thread.run_sync(opening, url)
            monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))  # OpenSSL reads it
            load = Load(4, "echo", {"text": "hi"}, requests=60)
            out = await trio.to_thread.run_sync(engine_run, Target(url=url), load)
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted and url in untrusted
    assert (out["calls"], out["ok"], out["errors"], out["lost"]) == (60, 60, {}, 0)


async def test_engine_through_the_daemons_listener_json_and_sse(socket_path: str) -> None:
    config = {"echo": echo_server()}
    broker = {"http": "127.0.0.1:0"}
    with trio.fail_after(40):
        async with running_daemon(config, socket_path, broker=broker) as daemon:
            url = daemon.http_url.rstrip("/") + "/echo"
            for accept in ("application/json", "application/json, text/event-stream"):
                load = Load(2, "echo", {"text": "hi"}, requests=50)
                out = await trio.to_thread.run_sync(
                    engine_run, Target(url=url, accept=accept), load
                )
                assert (out["calls"], out["ok"], out["errors"], out["lost"]) == (50, 50, {}, 0)
            load = Load(1, "flaky", {"every": 2}, requests=10)
            flaky = await trio.to_thread.run_sync(engine_run, Target(url=url), load)
    assert (flaky["ok"], flaky["errors"]) == (5, {"-32603": 5})


async def test_engine_in_the_modern_era_through_the_daemons_listener(socket_path: str) -> None:
    # No initialize and no session: a legacy POST so would be refused (400),
    # and headers that disagree with the body too (-32020), so every call
    # answered means the client spoke 2026-07-28 as the listener checks it.
    config = {"echo": echo_server()}
    broker = {"http": "127.0.0.1:0"}
    with trio.fail_after(40):
        async with running_daemon(config, socket_path, broker=broker) as daemon:
            url = daemon.http_url.rstrip("/") + "/echo"
            for accept in ("application/json", "application/json, text/event-stream"):
                target = Target(url=url, accept=accept, era="modern")
                load = Load(2, "echo", {"text": "hi"}, requests=50)
                out = await trio.to_thread.run_sync(engine_run, target, load)
                assert (out["calls"], out["ok"], out["errors"], out["lost"]) == (50, 50, {}, 0)
            target = Target(url=url, era="modern")
            flaky = await trio.to_thread.run_sync(
                engine_run, target, Load(1, "flaky", {"every": 2}, requests=10)
            )
            missing = await trio.to_thread.run_sync(engine_run, target, Load(1, "nope", requests=3))
    assert (flaky["ok"], flaky["errors"]) == (5, {"-32603": 5})
    # (an unknown tool is -32602, whose HTTP status, 400, is what the engine counts)
    assert (missing["ok"], missing["errors"]) == (0, {"HTTP 400": 3})


async def test_engine_over_http_ends_when_the_server_dies_mid_run() -> None:
    # What was in flight is lost, the client ends (its server cannot be reached
    # again), and the run stops instead of waiting out its duration or raising.
    with trio.fail_after(40):
        async with http_server("streamable-http") as (url, process):
            load = Load(3, "echo", {"text": "hi"}, duration=30.0)
            outs: list[dict[str, Any]] = []

            async def drive() -> None:
                outs.append(await trio.to_thread.run_sync(engine_run, Target(url=url), load))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(drive)
                await trio.sleep(1.5)
                started = trio.current_time()
                process.kill()
            stopped = trio.current_time() - started
    (out,) = outs
    assert stopped < 15 and out["elapsed_s"] < 15
    # Lost: at most one request per connection (3 in flight, and 3 more sent on
    # connections the dying server had not closed yet); none counted unsent.
    assert out["ok"] > 0 and out["errors"] == {} and 0 < out["lost"] <= 6


async def test_engine_names_a_server_that_refuses_the_session() -> None:
    def opening(url: str) -> str:
        engine = Engine()
        try:
            engine.open([Target(url=url)], timeout=10)
        except Exception as exc:  # BenchError, with what the server said
            return str(exc)
        finally:
            engine.close()
        return "opened"

    with trio.fail_after(40):
        async with http_server("streamable-http", REQUIRE_TOKEN="t0ken") as (url, _process):
            refused = await trio.to_thread.run_sync(opening, url)
    assert "HTTP 401" in refused and url in refused


# -- mcpbroker bench against a url server ------------------------------------------


async def bench_process(argv: list[str], env: dict[str, str]) -> tuple[int, dict[str, Any], str]:
    done = await trio.run_process(
        [MCPBROKER, "bench", *argv], capture_stdout=True, capture_stderr=True, check=False, env=env
    )
    report = orjson.loads(done.stdout) if done.returncode == 0 else {}
    return done.returncode, report, done.stderr.decode()


async def test_bench_through_the_daemon_and_direct_against_a_url_server(
    socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server wants a bearer token; the config passes it as ${BENCH_TOKEN}, which
    # the daemon and `bench --direct` each read from their own environment.
    monkeypatch.setenv("BENCH_TOKEN", "s3cret")
    unset = {k: v for k, v in os.environ.items() if k != "BENCH_TOKEN"}
    config_path = os.path.join(os.path.dirname(socket_path), "config.json")
    argv = ["--socket", socket_path, "--config", config_path, "--server", "remote"]
    argv += ["--tool", "echo", "--args", '{"text": "hi"}', "--clients", "2"]
    argv += ["--in-flight", "3", "--requests", "40", "--direct", "--json"]
    with trio.fail_after(60):
        async with http_server("streamable-http", REQUIRE_TOKEN="s3cret") as (url, _process):
            entry = {"url": url, "headers": {"Authorization": "Bearer ${BENCH_TOKEN}"}}
            sse = {"url": url, "type": "sse"}
            raw = {"mcpServers": {"remote": entry, "legacy": sse}}
            await trio.Path(config_path).write_text(json.dumps(raw))
            async with running_daemon({"remote": entry}, socket_path):
                code, report, err = await bench_process(argv, dict(os.environ))
                missing, _, missing_err = await bench_process(argv, unset)
                wrong, _, wrong_err = await bench_process(argv, {**unset, "BENCH_TOKEN": "no"})
            legacy_argv = [*argv[:5], "legacy", *argv[6:]]
            async with running_daemon({"legacy": sse}, socket_path, wait=()):  # never up
                legacy, _, legacy_err = await bench_process(legacy_argv, dict(os.environ))
    assert code == 0, err
    for path in ("broker", "direct"):
        figures = report[path]
        counts = (figures["calls"], figures["ok"], figures["errors"], figures["lost"])
        assert counts == (40, 40, {}, 0), path
    assert report["direct_url"] == url
    assert "server" not in report["direct"]  # a server by URL is no process of ours
    assert report["broker"]["daemon"]["pid"] == os.getpid()
    assert missing == 1 and "BENCH_TOKEN is not set" in missing_err, missing_err
    assert wrong == 1 and "HTTP 401" in wrong_err and url in wrong_err, wrong_err
    assert legacy == 1 and 'legacy HTTP+SSE ("type": "sse")' in legacy_err, legacy_err


async def test_bench_direct_explains_a_legacy_server_with_no_type(socket_path: str) -> None:
    # With no "type" the daemon falls back to HTTP+SSE; --direct tells why it cannot.
    config_path = os.path.join(os.path.dirname(socket_path), "config.json")
    argv = ["--socket", socket_path, "--config", config_path, "--server", "old"]
    argv += ["--tool", "echo", "--args", '{"text": "hi"}', "--requests", "5", "--direct"]
    with trio.fail_after(60):
        async with http_server("sse") as (url, _process):
            entry = {"url": url}
            await trio.Path(config_path).write_text(json.dumps({"mcpServers": {"old": entry}}))
            async with running_daemon({"old": entry}, socket_path):
                code, _, err = await bench_process(argv, dict(os.environ))
    assert code == 1, err
    assert "--direct: initialize failed: HTTP 405" in err and "legacy HTTP+SSE" in err, err


# -- the harness --------------------------------------------------------------------


async def test_harness_http_scenario_tiny_run() -> None:
    json_path = os.path.join(tempfile.mkdtemp(prefix="mcpb-bench-test-"), "results.json")
    command = [sys.executable, "-m", "benchmarks", "--tiny", "--scenarios", "http"]
    command += ["--json", json_path]
    try:
        with trio.fail_after(90):
            done = await trio.run_process(
                command, cwd=str(REPO), capture_stdout=True, capture_stderr=True, check=False
            )
        assert done.returncode == 0, done.stderr.decode()
        results = orjson.loads(await trio.Path(json_path).read_bytes())["results"]["http"]
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(partial(_remove, json_path))
    assert results["clients"] == {"throughput": 64, "latency": 1}
    for load in ("throughput", "latency"):
        for path in ("broker", "direct", "url"):
            result = results[load][path]["result"]
            counts = (result["calls"], result["ok"], result["errors"], result["lost"])
            assert counts == (40, 40, {}, 0), (load, path)
            assert result["latency_us"]["p99"] >= result["latency_us"]["p50"] > 0
        assert results[load]["broker"]["cpu_s"]["daemon"] >= 0
        assert results[load]["url"]["cpu_s"]["daemon"] >= 0
        assert results[load]["direct"]["cpu_s"]["server:sdk"] >= 0
        assert "daemon" not in results[load]["direct"]["cpu_s"]
    assert results["daemon_memory"]["url"]["peak_rss"] > 0
    assert results["sdk_memory"]["peak_rss"] > 0
    out = done.stdout.decode()
    assert "| broker → url (SDK server) | 40 |" in out
    assert "64 keep-alive clients" in out and "http 64 clients" in out
