"""The benchmark harness and ``mcpbroker bench`` on tiny runs: they finish and count right.

No test here asserts a speed: the machine is small and shared. The load
engine is synchronous (selectors), so it runs in a worker thread while the
daemon under test runs in the test's Trio loop.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from cli import bench
from tests.conftest import MCPBROKER, REPO, demo_server, running_daemon
from tools.bench_engine import BenchError, Engine, Load, Target

ECHO_SERVER = [sys.executable, str(REPO / "benchmarks" / "echo_server.py")]


def echo_server() -> dict[str, Any]:
    return {"command": ECHO_SERVER[0], "args": ECHO_SERVER[1:]}


def bench_args(socket_path: str, *extra: str) -> Any:
    return bench.parse_args(["--socket", socket_path, *extra])


async def run_bench(socket_path: str, arguments: dict[str, Any], *argv: str) -> dict[str, Any]:
    args = bench_args(socket_path, *argv)
    report: dict[str, Any] = await trio.to_thread.run_sync(bench.run, args, arguments)
    return report


def engine_run(target: Target, load: Load) -> dict[str, Any]:
    engine = Engine()
    try:
        engine.open([target])
        return engine.run(load).summary()
    finally:
        engine.close()


async def test_engine_counts_calls_tool_errors_and_error_codes() -> None:
    target = Target(argv=tuple(ECHO_SERVER))
    with trio.fail_after(20):
        ok = await trio.to_thread.run_sync(
            engine_run, target, Load(4, "echo", {"text": "x"}, requests=101)
        )
        failing = await trio.to_thread.run_sync(engine_run, target, Load(3, "fail", requests=10))
        unknown = await trio.to_thread.run_sync(engine_run, target, Load(2, "nope", requests=7))
        flaky = await trio.to_thread.run_sync(
            engine_run, target, Load(1, "flaky", {"every": 3}, requests=30)
        )
        wordy = await trio.to_thread.run_sync(
            engine_run, target, Load(1, "fail", {"message": "x" * 500}, requests=2)
        )
    assert (ok["calls"], ok["ok"], ok["errors"], ok["lost"]) == (101, 101, {}, 0)
    assert len([v for v in ok["latency_us"].values() if v]) == 6
    assert (failing["calls"], failing["ok"], failing["tool_errors"]) == (10, 0, 10)
    assert (unknown["calls"], unknown["errors"]) == (7, {"-32602": 7})
    assert (flaky["calls"], flaky["ok"], flaky["errors"]) == (30, 20, {"-32603": 10})
    # What the first error said, kept (and nothing where there was none)
    assert ok["first_error"] is None
    assert failing["first_error"] == "tool error: failure requested"
    assert unknown["first_error"] == "error -32602: Unknown tool: nope"
    assert flaky["first_error"] == "error -32603: flaky: call 3 fails"
    assert wordy["first_error"] == "tool error: " + "x" * 185 + "..."  # (200 characters)


async def test_bench_through_the_daemon_counts_requests(socket_path: str) -> None:
    with trio.fail_after(30):
        async with running_daemon({"demo": demo_server()}, socket_path):
            report = await run_bench(
                socket_path,
                {"text": "hi"},
                *("--server", "demo", "--tool", "echo", "--clients", "3"),
                *("--in-flight", "4", "--requests", "50"),
            )
    broker = report["broker"]
    assert (broker["calls"], broker["ok"], broker["errors"], broker["lost"]) == (50, 50, {}, 0)
    assert broker["server"]["pid"] and broker["daemon"]["pid"] == os.getpid()
    assert broker["server"]["memory"]["rss"] > 0
    text = bench.render(report)
    assert "calls/s" in text and "50" in text


async def test_bench_watches_every_instance_of_a_pooled_server(socket_path: str) -> None:
    """A pool's calls spread over its instances: the server's CPU and memory
    are those of all of them, not of the one ``mcpbroker status`` names first."""
    pooled = {**echo_server(), "pool": 2}
    with trio.fail_after(30):
        async with running_daemon({"echo": pooled}, socket_path) as daemon:
            argv = ("--server", "echo", "--tool", "echo", "--clients", "4", "--requests", "400")
            report = await run_bench(socket_path, {"text": "hi"}, *argv)
            instances = {p.statistics().pid for p in daemon.upstreams["echo"].instances()}
    server = report["broker"]["server"]
    assert set(server["pids"]) == instances and len(instances) == 2
    assert server["pid"] in instances
    assert server["memory"]["rss"] > 0 and server["cpu_s"] is not None
    assert "2 processes" in bench.render(report)


async def test_bench_in_the_modern_era_through_the_daemon_and_direct(socket_path: str) -> None:
    """``--era modern``: the clients speak 2026-07-28 through the daemon (which
    bridges to the legacy demo server) and, with ``--direct``, straight to a
    modern echo server launched from the config."""
    config = os.path.join(os.path.dirname(socket_path), "config.json")
    modern_echo = {**echo_server(), "args": [*echo_server()["args"], "--modern"]}
    async with await trio.open_file(config, "wb") as f:
        await f.write(orjson.dumps({"mcpServers": {"echo": modern_echo}}))
    with trio.fail_after(60):
        async with running_daemon({"demo": demo_server(), "echo": modern_echo}, socket_path):
            legacy_server = await run_bench(
                socket_path, {"text": "hi"}, "--server", "demo", "--tool", "echo",
                "--era", "modern", "--clients", "2", "--requests", "30")  # fmt: skip
            modern_server = await run_bench(
                socket_path, {"text": "hi"}, "--server", "echo", "--tool", "echo",
                "--era", "modern", "--requests", "30", "--direct", "--config", config)  # fmt: skip
            # --direct at a legacy server: told why, with the way that works.
            args = bench_args(socket_path, "--server", "demo", "--tool", "echo", "--era",
                              "modern", "--requests", "5", "--direct", "--demo")  # fmt: skip
            with pytest.raises(BenchError, match="--direct speaks 2026-07-28 to the server itself"):
                await trio.to_thread.run_sync(bench.run, args, {"text": "hi"})
    for report in (legacy_server, modern_server):
        assert report["era"] == "modern" and report["broker"]["ok"] == 30
    assert (modern_server["direct"]["ok"], modern_server["direct"]["errors"]) == (30, {})
    assert "speaking 2026-07-28" in bench.render(modern_server)


async def test_bench_reports_errors_by_code_and_tool_errors(socket_path: str) -> None:
    with trio.fail_after(30):
        async with running_daemon({"echo": echo_server(), "demo": demo_server()}, socket_path):
            flaky = await run_bench(
                socket_path,
                {"every": 4},
                *("--server", "echo", "--tool", "flaky", "--requests", "40"),
            )
            failing = await run_bench(
                socket_path, {}, *("--server", "demo", "--tool", "fail", "--requests", "12")
            )
            unknown = await run_bench(
                socket_path, {}, *("--server", "demo", "--tool", "nope", "--requests", "5")
            )
    assert flaky["broker"]["ok"] == 30
    assert flaky["broker"]["errors"] == {"-32603": 10}
    assert (failing["broker"]["tool_errors"], failing["broker"]["ok"]) == (12, 0)
    assert unknown["broker"]["errors"] == {"-32602": 5}
    assert "-32602 invalid params: 5" in bench.render(unknown)
    shown = bench.render(failing)
    assert "first error (through the daemon): tool error: " in shown
    assert failing["broker"]["first_error"] in shown


async def test_bench_direct_and_json_from_the_command_line(socket_path: str) -> None:
    config = os.path.join(os.path.dirname(socket_path), "config.json")
    await trio.Path(config).write_text(json.dumps({"mcpServers": {"echo": echo_server()}}))
    argv = [MCPBROKER, "bench", "--socket", socket_path, "--config", config]
    argv += ["--server", "echo", "--tool", "echo", "--args", '{"text": "hi"}']
    argv += ["--clients", "2", "--in-flight", "2", "--requests", "30", "--direct", "--json"]
    with trio.fail_after(30):
        async with running_daemon({"echo": echo_server()}, socket_path):
            done = await trio.run_process(
                argv, capture_stdout=True, capture_stderr=True, check=False
            )
    assert done.returncode == 0, done.stderr.decode()
    report = orjson.loads(done.stdout)
    assert report["broker"]["calls"] == report["direct"]["calls"] == 30
    assert report["direct"]["server"]["pid"] not in (None, report["broker"]["server"]["pid"])


async def test_bench_direct_against_the_demo_daemon(socket_path: str) -> None:
    # The README's daemon (serve --demo) has no config file: --demo says where to launch from.
    argv = [MCPBROKER, "bench", "--socket", socket_path, "--server", "demo", "--tool", "echo"]
    argv += ["--args", '{"text": "hi"}', "--requests", "20", "--direct", "--json"]
    with trio.fail_after(30):
        async with running_daemon({"demo": demo_server()}, socket_path):
            missing = await trio.run_process(
                [*argv, "--config", socket_path + ".nope"], capture_stderr=True, check=False
            )
            done = await trio.run_process(
                [*argv, "--demo"], capture_stdout=True, capture_stderr=True, check=False
            )
    assert missing.returncode == 1 and b"--demo" in missing.stderr
    assert done.returncode == 0, done.stderr.decode()
    report = orjson.loads(done.stdout)
    assert report["broker"]["calls"] == report["direct"]["calls"] == 20


async def test_bench_names_an_unknown_server(socket_path: str) -> None:
    with trio.fail_after(30):
        async with running_daemon({"demo": demo_server()}, socket_path):
            args = bench_args(socket_path, "--server", "nope", "--tool", "echo")
            code = await trio.to_thread.run_sync(bench.main, args)
    assert code == 1


async def test_harness_tiny_run_completes_and_counts() -> None:
    json_path = os.path.join(tempfile.mkdtemp(prefix="mcpb-bench-test-"), "results.json")
    command = [sys.executable, "-m", "benchmarks", "--tiny"]
    command += ["--scenarios", "latency,idle", "--json", json_path]
    try:
        with trio.fail_after(60):
            done = await trio.run_process(
                command, cwd=str(REPO), capture_stdout=True, capture_stderr=True, check=False
            )
        assert done.returncode == 0, done.stderr.decode()
        results = orjson.loads(await trio.Path(json_path).read_bytes())["results"]
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(partial(_remove, json_path))
    for path in ("broker", "direct"):
        result = results["latency"][path]["result"]
        assert (result["calls"], result["ok"], result["errors"], result["lost"]) == (40, 40, {}, 0)
    assert results["latency"]["broker"]["cpu_s"]["daemon"] >= 0
    if os.path.exists("/proc/stat"):  # the host's share, to tell a slow host from a slow broker
        assert results["latency"]["broker"]["cpu_s"]["stolen"] >= 0
        assert "| other load | stolen |" in done.stdout.decode()
    assert results["idle"]["clients"] == 4
    assert results["idle"]["after"]["daemon"]["rss"] > 0
    assert "### Targets" in done.stdout.decode()


def _remove(path: str) -> None:
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


async def test_counting_per_call_cancels_start_up_and_sees_every_call() -> None:
    # Each call goes through the session's and the upstream's fast paths exactly
    # once: the difference of two runs must say 1.00, start-up and shutdown gone.
    command = [sys.executable, "-m", "benchmarks.count", "lines"]
    command += ["--clients", "2", "--in-flight", "2", "--calls", "500", "--top", "100"]
    with trio.fail_after(60):
        done = await trio.run_process(
            command, cwd=str(REPO), capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    found = re.search(r"([0-9.]+) Python lines and ([0-9.]+) calls per call", out)
    assert found is not None and float(found[1]) > float(found[2]) > 0, out
    for function in ("broker/session.py:forward_fast", "broker/upstream.py:answer_fast"):
        assert re.search(rf"1\.00 calls  {function}$", out, re.MULTILINE), out


def test_cpu_seconds_reads_a_process_s_own_clock() -> None:
    from benchmarks.count import cpu_seconds

    user, system = cpu_seconds(os.getpid())
    spin = time.process_time() + 0.05
    while time.process_time() < spin:
        pass
    later = cpu_seconds(os.getpid())
    assert later[0] + later[1] >= user + system + 0.03  # (10 ms ticks)


async def test_counting_cpu_per_call_reads_the_daemon_once_its_load_is_done() -> None:
    command = [sys.executable, "-m", "benchmarks.count", "cpu"]
    # (enough calls for several of the clock's 10 ms ticks, even on a fast machine)
    command += ["--clients", "2", "--in-flight", "2", "--calls", "10000"]
    with trio.fail_after(60):
        done = await trio.run_process(
            command, cwd=str(REPO), capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    found = re.search(r"10,000 calls, legacy: ([0-9.]+) µs of CPU per call \(user ([0-9.]+), "
                      r"system ([0-9.]+)\)", out)  # fmt: skip
    assert found is not None, out
    total, user, system = (float(found[n]) for n in (1, 2, 3))
    assert total > 0 and abs(total - user - system) < 0.02, out


def engine_answers(target: Target, load: Load) -> tuple[dict[str, Any], list[Any]]:
    """A run's summary, and the last answer a client read (its line, parsed)."""
    engine = Engine()
    seen: list[Any] = []
    receive = engine._receive

    def spy(client: Any, line: bytes, now: int) -> None:
        seen.append(orjson.loads(line))
        receive(client, line, now)

    engine._receive = spy  # type: ignore[method-assign]
    try:
        engine.open([target])
        return engine.run(load).summary(), seen
    finally:
        engine.close()


async def test_the_engine_speaks_the_modern_era(socket_path: str) -> None:
    """A modern client opens with server/discover (no initialize) and puts _meta on
    every call: the daemon answers each as 2026-07-28 (resultType)."""
    target = Target(socket=socket_path, servers=("echo",), era="modern")
    load = Load(3, "echo", {"text": "hi"}, requests=30)
    with trio.fail_after(30):
        async with running_daemon({"echo": echo_server()}, socket_path) as daemon:
            summary, seen = await trio.to_thread.run_sync(engine_answers, target, load)
            status = daemon.statistics()
    assert (summary["calls"], summary["ok"], summary["errors"], summary["lost"]) == (30, 30, {}, 0)
    discover, *calls = seen
    assert (
        discover["id"] == "bench-init" and "2026-07-28" in discover["result"]["supportedVersions"]
    )
    assert len(calls) == 30
    assert all(c["result"] == {"resultType": "complete", **ECHOED} for c in calls), calls[:2]
    assert all(s.protocol_version == "2026-07-28" for s in status.sessions)


ECHOED = {"content": [{"type": "text", "text": "hi"}]}


async def test_harness_modern_scenario_counts_both_eras() -> None:
    json_path = os.path.join(tempfile.mkdtemp(prefix="mcpb-bench-test-"), "results.json")
    command = [sys.executable, "-m", "benchmarks", "--tiny"]
    command += ["--scenarios", "modern", "--json", json_path]
    try:
        with trio.fail_after(90):
            done = await trio.run_process(
                command, cwd=str(REPO), capture_stdout=True, capture_stderr=True, check=False
            )
        assert done.returncode == 0, done.stderr.decode()
        results = orjson.loads(await trio.Path(json_path).read_bytes())["results"]
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(partial(_remove, json_path))
    assert set(results["modern"]) == {"latency", "throughput", "upstreams"}
    paths = ("legacy", "legacy, modern's bytes", "modern at legacy", "modern", "legacy at modern")
    for load in results["modern"].values():
        for era in paths:
            result = load[era]["result"]
            assert (result["calls"], result["ok"], result["errors"], result["lost"]) == (
                80,
                80,
                {},
                0,
            )  # fmt: skip (two rounds of 40)
            assert [r["result"]["calls"] for r in load[era]["rounds"]] == [40, 40]
            assert load[era]["cpu_s"]["daemon"] >= 0
    out = done.stdout.decode()
    assert all(out.count(f"| {path} |") == 3 for path in paths), out
    assert "modern 64 x 16: >= 0.9 x calls/s of legacy calls of its bytes" in out


@pytest.mark.parametrize("upstream", ["legacy", "modern"])
async def test_counting_a_modern_call_sees_the_fast_paths(upstream: str) -> None:
    # A modern call goes through the modern session's fast paths, in and out,
    # exactly once: nothing parsed again, nothing one request at a time. Its
    # _meta is read from the bytes the session remembered (broker/eras/metacache.py),
    # not decoded and checked again (forward_fast: each session's first call
    # only). At a modern server the answer is passed on as written.
    command = [sys.executable, "-m", "benchmarks.count", "lines", "--era", "modern"]
    command += ["--upstream", upstream]
    command += ["--clients", "2", "--in-flight", "2", "--calls", "500", "--top", "100"]
    if upstream == "modern":  # (and two of them, a client each: the same per call)
        command += ["--upstreams", "2"]
    with trio.fail_after(60):
        done = await trio.run_process(
            command, cwd=str(REPO), capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    assert "500 calls, modern:" in out
    assert ("2 upstreams, 2 x 2," in out) == (upstream == "modern"), out
    calls = {
        found[2]: float(found[1])
        for found in re.finditer(r"^ +[0-9.]+ lines +([0-9.]+) calls  (\S+)$", out, re.MULTILINE)
    }
    for function in (
        "broker/eras/metacache.py:decode",
        "broker/session.py:route_fast",  # (the checks in line on the remembered path)
        "broker/eras/session.py:_answer_fast",
        "broker/upstream.py:answer_fast",
    ):
        assert calls.get(function) == 1.0, out
    stamped = calls.get("broker/eras/modern.py:complete_answer", 0.0)
    assert stamped == (1.0 if upstream == "legacy" else 0.0), out
    slow_ones = ("_request", "_outgoing_modern", "forward_fast")
    for slow in (f"broker/eras/session.py:{name}" for name in slow_ones):
        assert calls.get(slow, 0.0) < 0.01, out
    assert calls.get("broker/session.py:forward_fast", 0.0) < 0.01, out  # (each first call)


def _window(calls: int, elapsed: float, daemon_s: float, p50: float) -> dict[str, Any]:
    """A load generator's answer, as much of it as the modern scenario reads."""
    latency = {"p50": p50, "p99": 2 * p50}
    result = {"calls": calls, "ok": calls, "errors": {"timeout": 1}, "tool_errors": 0}
    result |= {"lost": 0, "elapsed_s": elapsed, "throughput": calls / elapsed}
    return {"result": result | {"latency_us": latency}, "cpu_s": {"daemon": daemon_s}}


def test_the_modern_scenario_reads_its_ratios_round_by_round() -> None:
    # The rounds of a path merge into one answer (calls and CPU summed,
    # percentiles the median round's); the targets read each round's ratio.
    from benchmarks.report import _modern_checks, round_ratios
    from benchmarks.scenarios import merge_rounds

    legacy = merge_rounds([_window(100, 1.0, 1e-3, 10), _window(300, 1.0, 2e-3, 30),
                           _window(200, 1.0, 2e-3, 20)])  # fmt: skip
    modern = merge_rounds([_window(90, 1.0, 1e-3, 11), _window(150, 1.0, 2e-3, 40),
                           _window(200, 1.0, 2e-3, 25)])  # fmt: skip
    assert legacy["result"] | {"latency_us": None} == {
        "calls": 600, "ok": 600, "errors": {"timeout": 3}, "tool_errors": 0, "lost": 0,
        "elapsed_s": 3.0, "throughput": 200.0, "latency_us": None}  # fmt: skip
    assert legacy["result"]["latency_us"] == {"p50": 20, "p99": 40}
    assert legacy["cpu_s"] == {"daemon": 5e-3} and len(legacy["rounds"]) == 3
    ratios = round_ratios({"modern": modern, "legacy": legacy}, "modern", "legacy")
    assert ratios is not None
    (rate, rates), (cpu, cpus) = ratios
    assert rates == pytest.approx([0.9, 0.5, 1.0]) and rate == pytest.approx(0.9)
    # CPU per call: 1e-3/90 against 1e-3/100, 2e-3/150 against 2e-3/300, equal
    assert cpus == pytest.approx([100 / 90, 2.0, 1.0]) and cpu == pytest.approx(100 / 90)
    # (the targets read modern against legacy calls of its bytes: #16's decision)
    checks = _modern_checks({"throughput": {"modern": modern, "legacy, modern's bytes": legacy}})
    assert [(c.measured, c.met) for c in checks] == [("0.90x", True), ("1.11x", False)]


def test_modern_takes_its_turn_between_the_paths_it_is_read_against() -> None:
    """Each per-round ratio compares neighbouring windows, in either direction
    of a round (the machine's speed drifts within one)."""
    from benchmarks.scenarios import ERA_PATHS, TURNS

    assert sorted(TURNS) == sorted(path for path, _, _ in ERA_PATHS)
    at = TURNS.index("modern")
    assert {TURNS[at - 1], TURNS[at + 1]} == {"legacy", "legacy, modern's bytes"}


@pytest.mark.parametrize(
    "path", ["legacy", "legacy-padded", "modern", "legacy-at-modern", "modern-at-legacy"]
)
def test_the_hot_path_counter_carries_calls_as_each_path_does(path: str) -> None:
    """``benchmarks.hotpath``'s calls take the fast paths the daemon's do, in
    each era's terms: the server reads ``_meta`` only if it is modern (the
    client's own, or the stamp for a legacy one), the client reads
    ``resultType`` only if an end is modern (a modern server's result goes to
    a legacy client as written: docs/eras.md), and every id comes back."""
    from benchmarks import hotpath

    to_server, to_client = hotpath.run(path, 32)
    requests = [orjson.loads(line) for line in to_server.splitlines()]
    answers = [orjson.loads(line) for line in to_client.splitlines()]
    server_modern = path in ("modern", "legacy-at-modern")
    client_modern = path in ("modern", "modern-at-legacy")
    assert len(requests) == len(answers) == hotpath.BATCH
    assert all(("_meta" in r["params"]) == server_modern for r in requests)
    if server_modern:
        names = {
            r["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]["name"] for r in requests
        }
        assert names == {"mcpbroker-bench"}  # (the client's: its own, or its initialize's)
    stamped = client_modern or server_modern
    assert all(("resultType" in a["result"]) == stamped for a in answers)
    assert [a["id"] for a in answers] == list(range(16, 32))
    if path == "legacy-padded":  # (a modern call's bytes, on the legacy path)
        modern = hotpath.run("modern", 32)[0]
        assert len(to_server) == len(modern) and "pad" in requests[0]["params"]["arguments"]


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="counts with valgrind")
def test_the_hot_path_counter_prints_a_count_per_path() -> None:
    command = [sys.executable, "-m", "benchmarks.hotpath", "--path", "legacy"]
    command += ["--path", "legacy-padded", "--path", "modern", "--calls", "160"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    assert re.search(r"^legacy: [0-9,]+ instructions per call$", out, re.MULTILINE), out
    ratios = r"\([0-9.]+x legacy, [0-9.]+x legacy-padded\)"
    assert re.search(rf"^modern: [0-9,]+ instructions per call {ratios}$", out, re.M), out


def test_loads_in_turn_give_each_its_figure_and_each_group_its_ratio() -> None:
    """benchmarks.turns: every path of the harness's modern scenario through
    one daemon, each load answered in full and given its own daemon CPU per
    call; a group of four is read as modern over legacy, and only a group
    with two of each; a path's figures are averaged wherever they fall."""
    from benchmarks import turns

    order = ["L", "P", "B", "M", "A"]
    figures = turns.run(order, seconds=0.5, clients=2, in_flight=2)
    assert len(figures) == len(order) and all(figure > 0 for figure in figures)
    assert turns.groups(["L", "M", "M", "L"], [1.0, 3.0, 5.0, 3.0]) == [2.0]
    assert turns.groups(["L", "L", "M", "L", "M"], [1.0] * 5) == []
    assert turns.means(["L", "M", "B", "L"], [1.0, 2.0, 4.0, 3.0]) == {"L": 2.0, "M": 2.0, "B": 4.0}


def test_functions_are_read_off_perf_and_given_per_call_by_path(tmp_path: Path) -> None:
    """benchmarks.symbols: perf's report read into each function's share
    (the kernel's too; a symbol seen twice adds up), turned into
    µs per call with the load's daemon CPU and averaged over a path's loads;
    then, where perf can record here, a real run of two paths."""
    from benchmarks import symbols

    report = (
        "    12.50%  libc.so.6   [.] __memmove_avx512_unaligned_erms\n"
        "     2.50%  mcpbroker_rules.so  [.] CPyDef_eras___session___take_forwards\n"
        "     1.25%  libc.so.6   [.] __memmove_avx512_unaligned_erms\n"
        "#\n"
        "     0.50%  [kernel.kallsyms]  [k] finish_task_switch.isra.0\n"
    )
    parsed = symbols.parse(report)
    assert parsed == {
        ("libc.so.6", "__memmove_avx512_unaligned_erms"): 0.1375,
        ("mcpbroker_rules.so", "CPyDef_eras___session___take_forwards"): 0.025,
        ("[kernel.kallsyms]", "finish_task_switch.isra.0"): 0.005,
    }
    memmove = ("libc.so.6", "__memmove_avx512_unaligned_erms")
    loads = [("M", 10.0, tmp_path / "0"), ("L", 8.0, tmp_path / "1"), ("M", 12.0, tmp_path / "2")]
    table = symbols.per_call(loads, read=lambda data: {memmove: 0.5 if data.name == "0" else 0.25})
    assert table == {"M": {memmove: (5.0 + 3.0) / 2}, "L": {memmove: 2.0}}
    if shutil.which("perf") is None:
        return
    recorded = symbols.run(["M", "L"], seconds=1.5, out=tmp_path, clients=2, in_flight=2)
    assert [path for path, _, _ in recorded] == ["M", "L"]
    for _, cpu, data in recorded:
        assert cpu > 0 and data.exists()
        functions = symbols.shares(data)
        assert functions and 0.9 < sum(functions.values()) < 1.05  # (perf rounds each share)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--requests", "0"], "--requests must be at least 1"),
        (["--duration", "-1"], "--duration must be more than 0"),
        (["--duration", "0"], "--duration must be more than 0"),
        (["--warmup", "-1"], "--warmup 0 or more"),
    ],
)
def test_an_amount_of_nothing_is_refused(
    extra: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """(``--requests 0`` and ``--duration -1`` ran, and reported 0 calls.)"""
    args = bench.parse_args(
        ["--socket", "/nonexistent.sock", "--server", "s", "--tool", "t", *extra]
    )
    assert bench.main(args) == 1
    assert says in capsys.readouterr().err
