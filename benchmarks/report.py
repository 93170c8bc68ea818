"""Tables and target checks for the harness's results (Markdown, so README.md can hold them)."""

from __future__ import annotations

import math
import os
import platform
import statistics
from typing import Any

import attrs

TITLES = {
    "latency": "1 client x 1 in flight: latency added per hop",
    "throughput": "64 clients x 16 in flight over one shared upstream: throughput",
    "upstreams": "8 upstreams behind one daemon (8 clients each x 16 in flight)",
    "idle": "idle sessions: daemon memory per session",
    "payload": "large payloads: a 1 MiB tools/call result, 1 x 1",
    "shims": "the host path: clients on stdio through `mcpbroker connect`",
    "modern": "the modern era (2026-07-28) beside the legacy one, through the daemon's socket",
    "http": "Streamable HTTP: hosts that connect by URL, through `serve --http` and to an "
    "SDK server",
}
HTTP_PATHS = {
    "broker": "broker (`--http`, echo server)",
    "direct": "direct (SDK server)",
    "url": "broker → url (SDK server)",
}
KIB, MIB = 1024, 1024 * 1024


@attrs.frozen
class Check:
    target: str
    measured: str
    met: bool


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs ({cpu}), "
        f"Python {platform.python_version()}"
    )


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / MIB:.1f} MiB"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _cpu(out: dict[str, Any], name: str) -> float | None:
    values = [v for k, v in out["cpu_s"].items() if k == name or k.startswith(name + ":")]
    return sum(values) if values else None


def _per_call_us(out: dict[str, Any], name: str) -> str:
    cpu, calls = _cpu(out, name), out["result"]["calls"]
    return "-" if cpu is None or not calls else _num(cpu / calls * 1e6, 1)


def _use(out: dict[str, Any], name: str) -> str:
    cpu, elapsed = _cpu(out, name), out["result"]["elapsed_s"]
    return "-" if cpu is None or not elapsed else f"{cpu / elapsed:.0%}"


def others(out: dict[str, Any]) -> float | None:
    """Share of a core that processes outside the benchmark used during its window."""
    cpu, elapsed = out["cpu_s"], out["result"]["elapsed_s"]
    if "machine" not in cpu or elapsed < 1.0:  # /proc/stat counts 10 ms ticks
        return None
    ours = sum(v for k, v in cpu.items() if k not in MACHINE)
    return float(max(0.0, cpu["machine"] - ours) / elapsed)


def stolen(out: dict[str, Any]) -> float | None:
    """Share of a core the hypervisor gave to other machines during the window."""
    cpu, elapsed = out["cpu_s"], out["result"]["elapsed_s"]
    if cpu.get("stolen") is None or elapsed < 1.0:
        return None
    return float(cpu["stolen"] / elapsed)


# What the load generator samples of the whole machine, beside the processes.
MACHINE = ("machine", "stolen")


def _errors(result: dict[str, Any]) -> str:
    parts = [f"{code}: {n}" for code, n in result["errors"].items()]
    if result["tool_errors"]:
        parts.append(f"isError: {result['tool_errors']}")
    if result["lost"]:
        parts.append(f"lost: {result['lost']}")
    return ", ".join(parts) or "0"


def load_rows(
    paths: dict[str, dict[str, Any]],
    cpu_names: list[str],
    ratio_of: tuple[str, str] | None = None,
) -> list[str]:
    """One row per path (broker, direct) and a ratio row: of the two paths, or of
    the two ``ratio_of`` names."""
    header = ["path", "calls", "calls/s", "p50 µs", "p99 µs", "p99.9 µs", "errors"]
    header += [f"{n} CPU µs/call (use)" for n in cpu_names]
    header += ["other load", "stolen"]
    rows = []
    for label, out in paths.items():
        r, lat = out["result"], out["result"]["latency_us"]
        row = [label, _num(r["calls"]), _num(r["throughput"]), _num(lat["p50"])]
        row += [_num(lat["p99"]), _num(lat["p99.9"]), _errors(r)]
        row += [f"{_per_call_us(out, n)} ({_use(out, n)})" for n in cpu_names]
        row += [_share(others(out)), _share(stolen(out))]
        rows.append(row)
    if ratio_of is None and len(paths) == 2:
        first, second = paths
        ratio_of = (first, second)
    if ratio_of is not None:
        ra, rb = paths[ratio_of[0]]["result"], paths[ratio_of[1]]["result"]
        label = "ratio" if len(paths) == 2 else f"ratio {ratio_of[0]} / {ratio_of[1]}"
        ratio = [label, "", _ratio(ra["throughput"], rb["throughput"], 2)]
        ratio += [
            _ratio(ra["latency_us"][p], rb["latency_us"][p], 1) for p in ("p50", "p99", "p99.9")
        ]
        rows.append(ratio + [""] * (len(header) - len(ratio)))
    return _table(header, rows)


def _share(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.0%}"


def _ratio(a: float | None, b: float | None, digits: int) -> str:
    return "n/a" if not a or not b else f"{a / b:.{digits}f}x"


def added_p50(result: dict[str, Any]) -> float | None:
    a = result["broker"]["result"]["latency_us"]["p50"]
    b = result["direct"]["result"]["latency_us"]["p50"]
    return None if a is None or b is None else a - b


def render_compare(name: str, result: dict[str, Any]) -> list[str]:
    lines = [f"### {TITLES[name]}", ""]
    paths = {"broker": result["broker"], "direct": result["direct"]}
    lines += load_rows(paths, ["daemon", "server", "loadgen"])
    peak = result["broker"]["daemon_memory"]["peak_rss"]
    lines += ["", f"Broker adds {_num(added_p50(result))} µs to p50; daemon peak RSS {_mib(peak)}."]
    return lines


def per_session(result: dict[str, Any], key: str = "rss") -> float | None:
    before, after = result["before"]["daemon"][key], result["after"]["daemon"][key]
    return None if before is None or after is None else (after - before) / result["clients"]


def render_idle(result: dict[str, Any]) -> list[str]:
    before, after = result["before"]["daemon"], result["after"]["daemon"]
    rows = [
        [
            _num(result["clients"]),
            f"{_mib(before['rss'])} / {_mib(before['uss'])}",
            f"{_mib(after['rss'])} / {_mib(after['uss'])}",
            f"{_num((per_session(result) or 0) / KIB, 1)} KiB",
            f"{_num((per_session(result, 'uss') or 0) / KIB, 1)} KiB",
            f"{result['open_s']:.2f} s",
        ]
    ]
    header = ["idle sessions", "daemon RSS / USS before", "after", "RSS per session"]
    header += ["USS per session", "time to open them all"]
    return [f"### {TITLES['idle']}", "", *_table(header, rows)]


def _spawn_row(label: str, out: dict[str, Any]) -> list[str]:
    times = sorted(out["first_answer_ms"])
    mem = out["children"]
    rss = max((m["rss"] or 0) for m in mem) if mem else None
    uss = max((m["uss"] or 0) for m in mem) if mem else None
    return [label, _num(times[len(times) // 2], 1), _num(times[-1], 1), _mib(rss), _mib(uss)]


def memory_totals(out: dict[str, Any]) -> dict[str, float]:
    """Sum over every process involved: the clients' children plus what is watched."""
    processes = list(out["children"]) + list(out["after"].values())
    return {key: float(sum(m[key] or 0 for m in processes)) for key in ("rss", "pss", "uss")} | {
        "count": float(len(processes))
    }


def render_shims(result: dict[str, Any]) -> list[str]:
    lines = [f"### {TITLES['shims']}", ""]
    n = result["clients"]
    paths = {"shims": result["throughput"]["broker"], "direct": result["throughput"]["direct"]}
    lines += [
        f"{n['throughput']} clients x {n['in_flight']} in flight, each client on stdio "
        "to its own shim, vs to its own copy of the server:",
        "",
    ]
    lines += load_rows(paths, ["daemon", "server", "shims", "loadgen"])
    paths = {"shims": result["latency"]["broker"], "direct": result["latency"]["direct"]}
    lines += ["", "1 client x 1 in flight:", ""]
    lines += load_rows(paths, ["daemon", "server", "shims", "loadgen"])
    rows = [_spawn_row("shim (`mcpbroker connect`)", result["spawn"]["broker"])]
    rows.append(_spawn_row("echo server, launched directly", result["spawn"]["direct"]))
    if "direct_sdk" in result["spawn"]:
        rows.append(_spawn_row("SDK server, launched directly", result["spawn"]["direct_sdk"]))
    lines += ["", "From spawning a process to the answer to its `initialize`, one at a time:", ""]
    lines += _table(["process", "p50 ms", "max ms", "its RSS", "its USS"], rows)
    rows = []
    for server, pair in result["memory"].items():
        for label, out in (
            ("shims + daemon + 1 server", pair["broker"]),
            ("servers", pair["direct"]),
        ):
            t = memory_totals(out)
            rows.append(
                [server, label, _num(t["count"]), _mib(t["rss"]), _mib(t["pss"]), _mib(t["uss"])]
            )
    lines += [
        "",
        f"{n['memory']} idle clients, everything involved (PSS splits shared pages "
        "between processes, so it adds up):",
        "",
    ]
    lines += _table(["server", "processes", "count", "total RSS", "total PSS", "total USS"], rows)
    return lines


def render_http(result: dict[str, Any]) -> list[str]:
    """Two tables (64 clients, 1 x 1), three paths each: the broker's listener with the
    echo server, the SDK server by itself, the SDK server behind the broker."""
    lines = [f"### {TITLES['http']}", ""]
    for key, text in (
        ("throughput", "{n} keep-alive clients, one call in flight each:"),
        ("latency", "{n} client x 1 in flight:"),
    ):
        paths = {HTTP_PATHS[p]: out for p, out in result[key].items()}
        ratio_of = (HTTP_PATHS["url"], HTTP_PATHS["direct"]) if len(paths) == 3 else None
        lines += [text.format(n=result["clients"][key]), ""]
        lines += [*load_rows(paths, ["daemon", "server", "loadgen"], ratio_of), ""]
    added = _p50(result["latency"], "url") - _p50(result["latency"], "direct")
    peaks = result["daemon_memory"]
    lines.append(
        f"The broker adds {_num(added)} µs to the SDK server's p50 at 1 x 1 "
        f"(ratio row: broker → url / direct); daemon peak RSS "
        f"{_mib(peaks['broker']['peak_rss'])} (echo), {_mib(peaks['url']['peak_rss'])} (url); "
        f"SDK server peak RSS {_mib(result['sdk_memory']['peak_rss'])}."
    )
    return lines


def _p50(paths: dict[str, Any], path: str) -> float:
    return float(paths[path]["result"]["latency_us"]["p50"] or math.nan)


SAME_BYTES = "legacy, modern's bytes"  # (benchmarks/scenarios.py ERA_PATHS)


def render_modern(result: dict[str, Any]) -> list[str]:
    """Per load: each path (clients' era at the server's, benchmarks/scenarios.py
    ERA_PATHS; its rounds merged), the ratio of modern to legacy end to end,
    and the medians of the per-round ratios (what the targets read)."""
    lines = [f"### {TITLES['modern']}", ""]
    for name, paths in result.items():
        lines += [f"{TITLES[name].split(':')[0]}, {paths['clients']} clients in all:", ""]
        loads = {k: v for k, v in paths.items() if k not in ("clients", "in_flight")}
        lines += load_rows(loads, ["daemon", "server", "loadgen"], ("modern", "legacy"))
        lines.append("")
        for base in ("legacy", SAME_BYTES):
            rounds = round_ratios(paths, "modern", base)
            if rounds is not None:
                (rate, rates), (cpu, cpus) = rounds
                lines.append(
                    f"- modern / {base}, per round ({len(rates)}): calls/s {rate:.2f}x "
                    f"(median; {min(rates):.2f}-{max(rates):.2f}), daemon CPU per call "
                    f"{cpu:.2f}x ({min(cpus):.2f}-{max(cpus):.2f})"
                )
        lines.append("")
    return lines


Ratios = tuple[float, list[float]]


def round_ratios(paths: dict[str, Any], path: str, base: str) -> tuple[Ratios, Ratios] | None:
    """``path`` against ``base`` round by round (benchmarks/scenarios.py
    ``merge_rounds``): the median and each round's ratio of calls/s, and of
    the daemon's CPU per call. None: not measured (no rounds, no CPU)."""
    rates, cpus = [], []
    pairs = zip(paths[path].get("rounds", []), paths[base].get("rounds", []), strict=True)
    for ours, theirs in pairs:
        cpu, base_cpu = _cpu_per_call(ours), _cpu_per_call(theirs)
        rate, base_rate = ours["result"]["throughput"], theirs["result"]["throughput"]
        if cpu is None or base_cpu is None or not cpu or not base_cpu or not base_rate:
            return None
        rates.append(rate / base_rate)
        cpus.append(cpu / base_cpu)
    if not rates:
        return None
    return (statistics.median(rates), rates), (statistics.median(cpus), cpus)


def render_scenario(name: str, result: dict[str, Any]) -> list[str]:
    if name == "modern":
        return render_modern(result)
    if name == "idle":
        return render_idle(result)
    if name == "shims":
        return render_shims(result)
    if name == "http":
        return render_http(result)
    return render_compare(name, result)


def render(results: dict[str, Any]) -> str:
    lines = [f"Machine: {machine()}", ""]
    for name, result in results.items():
        lines += [*render_scenario(name, result), ""]
    checks = check_targets(results)
    if checks:
        lines += ["### Targets", ""]
        rows = [["met" if c.met else "**missed**", c.target, c.measured] for c in checks]
        lines += _table(["", "target", "measured"], rows)
    return "\n".join(lines) + "\n"


def check_targets(results: dict[str, Any]) -> list[Check]:
    checks: list[Check] = []
    if "throughput" in results:
        b = results["throughput"]["broker"]["result"]["throughput"]
        d = results["throughput"]["direct"]["result"]["throughput"]
        checks.append(Check("64 x 16: broker >= 40,000 calls/s", _num(b), b >= 40_000))
        checks.append(Check("64 x 16: broker >= 0.3 x direct", _ratio(b, d, 2), b >= 0.3 * d))
    if "latency" in results:
        added = added_p50(results["latency"])
        checks.append(
            Check(
                "1 x 1: broker adds <= 300 µs to p50",
                f"{_num(added)} µs",
                added is not None and added <= 300,
            )
        )
    if "idle" in results:
        each = per_session(results["idle"])
        checks.append(
            Check(
                "idle sessions: <= 64 KiB each (daemon RSS)",
                f"{_num((each or 0) / KIB, 1)} KiB",
                each is not None and each <= 64 * KIB,
            )
        )
    if "payload" in results:
        added = added_p50(results["payload"])
        checks.append(
            Check(
                "1 MiB result crosses the broker in < 5 ms (p50 added)",
                f"{_num(added)} µs",
                added is not None and added < 5000,
            )
        )
    if "shims" in results:
        checks += _shim_checks(results["shims"])
    if "http" in results:
        rate = results["http"]["throughput"]["broker"]["result"]["throughput"]
        checks.append(
            Check("http 64 clients: broker (`--http`) >= 5,000 calls/s", _num(rate), rate >= 5000)
        )
    if "modern" in results:
        checks += _modern_checks(results["modern"])
    return checks


def _modern_checks(result: dict[str, Any]) -> list[Check]:
    """Modern calls at the figures of legacy ones (#16), read against legacy
    calls of the same bytes (a 2026-07-28 request carries its ``_meta``:
    benchmarks/README.md, "session 22", says why): calls/s and the daemon's
    CPU per call at 64 x 16, as the medians of the per-round ratios. The
    figures against plain legacy calls are in the scenario's table."""
    rounds = round_ratios(result["throughput"], "modern", SAME_BYTES)
    (rate, _), (cpu, _) = rounds or ((math.nan, []), (math.nan, []))
    measured = "not measured (no CPU counted)" if rounds is None else None
    return [
        Check(
            "modern 64 x 16: >= 0.9 x calls/s of legacy calls of its bytes (median of rounds)",
            measured or f"{rate:.2f}x",
            rate >= 0.9,
        ),
        Check(
            "modern 64 x 16: daemon CPU per call <= 1.1 x legacy calls of its bytes "
            "(median of rounds)",
            measured or f"{cpu:.2f}x",
            cpu <= 1.1,
        ),
    ]


def _cpu_per_call(out: dict[str, Any]) -> float | None:
    """The daemon's CPU µs per call of a load (None: not measured)."""
    cpu, calls = _cpu(out, "daemon"), out["result"]["calls"]
    return None if cpu is None or not calls else cpu / calls * 1e6


def _shim_checks(result: dict[str, Any]) -> list[Check]:
    rate = result["throughput"]["broker"]["result"]["throughput"]
    p50 = result["latency"]["broker"]["result"]["latency_us"]["p50"]
    spawn = sorted(result["spawn"]["broker"]["first_answer_ms"])
    rss = max((m["rss"] or 0) for m in result["memory"]["echo"]["broker"]["children"])
    checks = [
        Check("shims 8 x 4: >= 20,000 calls/s", _num(rate), rate >= 20_000),
        Check("shims 1 x 1: p50 < 0.5 ms", f"{_num(p50)} µs", p50 is not None and p50 < 500),
        Check(
            "a shim answers within 150 ms of spawning (p50; max)",
            f"{spawn[len(spawn) // 2]:.0f} ms; {spawn[-1]:.0f} ms",
            spawn[len(spawn) // 2] <= 150,
        ),
        Check("a shim holds <= 12 MiB RSS", _mib(rss), rss <= 12 * MIB),
    ]
    n = result["clients"]["memory"]
    for server, pair in result["memory"].items():
        ours, theirs = memory_totals(pair["broker"]), memory_totals(pair["direct"])
        checks.append(
            Check(
                f"{n} idle clients: shims + daemon + 1 {server} server "
                f"< {n} {server} servers (PSS)",
                f"{_mib(ours['pss'])} vs {_mib(theirs['pss'])}",
                ours["pss"] < theirs["pss"],
            )
        )
    return checks
