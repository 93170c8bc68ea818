"""What the daemon executes per call, counted: figures that do not drift.

Time on this machine drifts by a third over minutes, so a change worth 5%
cannot be told from noise by timing it, even in alternating pairs. Counts
can: run a fixed number of calls and count what the daemon executed, minus
the same for fewer calls (which cancels start-up and shutdown).

``python -m benchmarks.count lines [--clients C --in-flight K]``
    Python lines and function calls executed per call (``sys.settrace`` in
    the daemon), with the functions that execute most. Standard library
    only; the daemon runs ~50x slower traced, so batches grow: compare
    changes at the same load, not with the untraced figures. Compiled code
    (``--compiled`` rules) is invisible to it.

``python -m benchmarks.count instructions [--clients C --in-flight K]``
    CPU instructions per call (valgrind's ``cachegrind``, which must be
    installed), the compiled rules included; about a minute per figure.

``python -m benchmarks.count misses [--clients C --in-flight K]``
    The same, with cachegrind's simulation of the caches (the first level's
    and the last's): instructions, and the misses per call. A model, not the
    processor, and the daemon runs 50x slower under it (so each read brings
    more messages): compare paths and trees with it, where the clock moves
    too much to (``benchmarks.symbols`` says where misses fall in time).

``python -m benchmarks.count cpu [--clients C --in-flight K] [--calls N]``
    The daemon's CPU time per call, user and system, read from
    ``/proc/PID/stat`` once the load is done (100 ticks a second: the
    default here is 200,000 calls, some 1.5 s of CPU). Time, so it moves
    with the machine, but a load at a time and nothing else alternating
    with it, so less than the harness's rounds; it includes the kernel's
    share, which the instruction count does not.

``--http json|sse`` drives the daemon through ``serve --http`` instead of
its socket (``benchmarks.http_load``'s clients, one call in flight each):
what the Streamable HTTP listener executes per call; with ``--era modern``
the HTTP clients speak 2026-07-28 (a POST per call, no session).

``--upstreams N`` puts N echo servers behind the daemon, the clients shared
out among them (the harness's "8 upstreams" load). Both print one line per
figure; ``--tree DIR`` counts another checkout or
the compiled copy (``python -m benchmarks.compiled``); ``--era modern`` has
the clients speak 2026-07-28 (no initialize, ``_meta`` on every request).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.procs import ECHO_SERVER, Daemon, daemon, loadgen, socket_target, workdir

TRACE_FILE = "MCPBROKER_COUNT_TRACE"  # where the traced daemon writes its counts


def traced_daemon(argv: list[str]) -> int:
    """``mcpbroker`` with every Python line and call counted (``python -m benchmarks.count
    serve ...``); the counts go to the file named by $MCPBROKER_COUNT_TRACE at exit."""
    from cli.main import main as cli

    counts: collections.Counter[tuple[str, str, str]] = collections.Counter()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event == "call":
            counts[(code.co_filename, code.co_name, "call")] += 1
        elif event == "line":
            counts[(code.co_filename, code.co_name, "line")] += 1
        return tracer

    sys.settrace(tracer)
    try:
        return cli(argv)
    finally:
        sys.settrace(None)
        rows = [[*key, value] for key, value in counts.items()]
        Path(os.environ[TRACE_FILE]).write_text(json.dumps(rows))


def _run(
    calls: int,
    args: argparse.Namespace,
    prefix: tuple[str, ...],
    module: str,
    after: Callable[[Daemon], None] | None = None,
) -> None:
    """``calls`` calls through a daemon run under ``prefix``; ``after`` sees
    the daemon once they are done, before it stops."""
    broker = json.loads(args.broker) if args.broker else None
    modern = getattr(args, "upstream", "legacy") == "modern"
    upstreams = getattr(args, "upstreams", 1)
    names = ["echo"] if upstreams == 1 else [f"echo{i}" for i in range(upstreams)]
    servers = {name: [*ECHO_SERVER, "--modern"] if modern else ECHO_SERVER for name in names}
    options = ("--http", "127.0.0.1:0") if args.http else ()
    with (
        workdir() as directory,
        daemon(directory, servers, prefix, module, options, broker=broker) as dm,
    ):
        if args.http:
            _drive_http(dm.socket, args.clients, calls, args.http == "sse", args.era)
        else:
            per = max(1, args.clients // len(names))
            targets = [socket_target(dm.socket, name, per, args.era) for name in names]
            arguments = {"text": "x"} | ({"pad": "x" * args.pad} if args.pad else {})
            load = {"in_flight": args.in_flight, "tool": "echo", "arguments": arguments}
            result = loadgen(
                {"kind": "load", "targets": targets, "load": load | {"requests": calls}}
            )
            errors = result["result"].get("errors")
            if errors:
                raise SystemExit(f"the load had errors: {errors}")
        if after is not None:
            after(dm)


def _drive_http(socket_path: str, clients: int, calls: int, sse: bool, era: str) -> None:
    """``calls`` tools/call round trips through the daemon's HTTP listener,
    ``clients`` keep-alive sessions at once (http_load's clients: the load
    engine's, tools/bench_http.py)."""
    from benchmarks.http_load import ARGUMENTS, VERSION
    from cli.status import fetch_status
    from tools.bench_engine import Engine, Load, Target
    from tools.bench_http import ACCEPT_BOTH

    url = fetch_status(socket_path)["http"].rstrip("/") + "/echo"
    accept = ACCEPT_BOTH if sse else "application/json"
    target = Target(url=url, accept=accept, version=VERSION, era=era)
    engine = Engine()
    try:
        engine.open([target] * clients, timeout=60.0)
        result = engine.run(Load(1, "echo", ARGUMENTS, requests=calls))
    finally:
        engine.close()
    if result.ok != calls:
        failed = calls - result.ok
        raise SystemExit(f"{failed} of {calls} calls did not succeed: {result.summary()}")


def count_lines(args: argparse.Namespace) -> str:
    totals = []
    for calls in (args.calls // 5, args.calls):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            os.environ[TRACE_FILE] = out.name
            _run(calls, args, (), "benchmarks.count")
            time.sleep(0.5)
            rows = json.loads(Path(out.name).read_text() or "[]")
        totals.append(collections.Counter({(f, fn, kind): n for f, fn, kind, n in rows}))
    per_call = {key: (totals[1][key] - totals[0][key]) / (args.calls * 4 / 5) for key in totals[1]}
    lines = sum(v for (_, _, kind), v in per_call.items() if kind == "line")
    calls = sum(v for (_, _, kind), v in per_call.items() if kind == "call")
    out = [f"{lines:.1f} Python lines and {calls:.1f} calls per call"]
    by_function = sorted(
        ((v, f, fn) for (f, fn, kind), v in per_call.items() if kind == "line"), reverse=True
    )
    for v, f, fn in by_function[: args.top]:
        name = f.split("site-packages/")[-1].removeprefix(str(Path.cwd()) + "/")
        out.append(f"  {v:6.2f} lines  {per_call.get((f, fn, 'call'), 0):5.2f} calls  {name}:{fn}")
    return "\n".join(out)


def count_instructions(args: argparse.Namespace) -> str:
    per_call = _cachegrind(args, cache_sim=False)
    return f"{per_call['Ir']:,.0f} instructions per call"


def count_misses(args: argparse.Namespace) -> str:
    per_call = _cachegrind(args, cache_sim=True)
    return (
        f"{per_call['Ir']:,.0f} instructions, {per_call['I1mr']:.1f} instruction-cache misses, "
        f"{per_call['D1mr']:.1f} data read misses, {per_call['D1mw']:.1f} data write misses, "
        f"{per_call['ILmr'] + per_call['DLmr'] + per_call['DLmw']:.1f} last-level misses per call"
    )


def _cachegrind(args: argparse.Namespace, cache_sim: bool) -> dict[str, float]:
    """cachegrind's events per call (Ir; with ``cache_sim``, the simulated
    caches' misses too), the daemon's whole run for a fifth of the calls
    subtracted from its run for all of them."""
    totals = []
    for calls in (args.calls // 5, args.calls):
        with tempfile.TemporaryDirectory() as directory:
            out = os.path.join(directory, "cachegrind.out")
            simulate = f"--cache-sim={'yes' if cache_sim else 'no'}"
            valgrind = ("valgrind", "--tool=cachegrind", simulate)
            _run(calls, args, (*valgrind, f"--cachegrind-out-file={out}"), "cli.main")
            for _ in range(100):  # valgrind writes it as the daemon exits
                if os.path.exists(out) and os.path.getsize(out):
                    break
                time.sleep(0.2)
            time.sleep(0.5)
            text = Path(out).read_text()
            events = re.search(r"^events:\s+(.+)$", text, re.MULTILINE)
            found = re.search(r"^summary:\s+(.+)$", text, re.MULTILINE)
            if events is None or found is None:
                raise SystemExit("cachegrind wrote no summary")
            totals.append(dict(zip(events[1].split(), map(int, found[1].split()), strict=True)))
    return {key: (totals[1][key] - totals[0][key]) / (args.calls * 4 / 5) for key in totals[1]}


def count_cpu(args: argparse.Namespace) -> str:
    seconds: list[tuple[float, float]] = []
    for calls in (args.calls // 5, args.calls):
        _run(calls, args, (), "cli.main", after=lambda dm: seconds.append(cpu_seconds(dm.pid)))
    per_call = args.calls * 4 / 5
    user = (seconds[1][0] - seconds[0][0]) / per_call * 1e6
    system = (seconds[1][1] - seconds[0][1]) / per_call * 1e6
    return f"{user + system:.2f} µs of CPU per call (user {user:.2f}, system {system:.2f})"


def cpu_seconds(pid: int) -> tuple[float, float]:
    """A process's user and system CPU time so far, in seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick  # (utime, stime: fields 14, 15)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return traced_daemon(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.count", description=__doc__)
    parser.add_argument("what", choices=["lines", "instructions", "misses", "cpu"])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--calls", type=int, help="(default: 20,000; cpu: 200,000)")
    parser.add_argument("--http", choices=["json", "sse"], help="through serve --http")
    parser.add_argument("--top", type=int, default=20, help="functions shown (lines)")
    parser.add_argument(
        "--era", choices=["legacy", "modern"], default="legacy", help="the clients' protocol era"
    )
    parser.add_argument(
        "--upstream",
        choices=["legacy", "modern"],
        default="legacy",
        help="the echo server's era (modern: 2026-07-28 only, benchmarks/echo_server.py --modern)",
    )
    parser.add_argument(
        "--pad",
        type=int,
        default=0,
        metavar="BYTES",
        help="a string this long added to each call's arguments (the echo server ignores it): "
        "--pad 182 makes a legacy call the bytes of a modern one, to tell the era's cost "
        "from its size",
    )
    parser.add_argument(
        "--upstreams",
        type=int,
        default=1,
        metavar="N",
        help="N echo servers behind the daemon, the clients shared out among them",
    )
    parser.add_argument("--tree", help="count the daemon of another tree (its benchmarks/)")
    parser.add_argument(
        "--broker",
        metavar="JSON",
        help='the config\'s broker section, e.g. \'{"metrics": "0"}\' (what metrics cost)',
    )
    args = parser.parse_args(argv)
    if args.calls is None:
        args.calls = 200_000 if args.what == "cpu" else 20_000
    if args.tree:
        os.chdir(args.tree)
        os.execv(sys.executable, [sys.executable, "-m", "benchmarks.count", *_without_tree(argv)])
    load = f"{args.clients} x {args.in_flight}, {args.calls:,} calls, {args.era}"
    if args.upstreams != 1:
        load = f"{args.upstreams} upstreams, {load}"
    if args.http:
        load = f"HTTP ({args.http}) {args.clients} x 1, {args.calls:,} calls, {args.era}"
    count = {
        "lines": count_lines,
        "instructions": count_instructions,
        "misses": count_misses,
        "cpu": count_cpu,
    }
    print(f"{load}: " + count[args.what](args))
    return 0


def _without_tree(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--tree":
            skip = True
        elif not arg.startswith("--tree="):
            out.append(arg)
    return out


if __name__ == "__main__":
    sys.exit(main())
