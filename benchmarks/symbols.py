"""Where the clock goes, by symbol, path against path: ``python -m benchmarks.symbols``.

``benchmarks.hotpath`` and ``benchmarks.count`` count instructions, which
do not see what a cache miss costs; ``benchmarks.profile`` samples Python
frames, which a compiled build has few of. This samples the whole daemon
with ``perf record -e cpu-clock`` (a timer, so it works on machines whose
hardware counters perf cannot read, as this VM's), under the loads of
:mod:`benchmarks.turns` (one daemon, the paths in the order given), and
prints, for each function of the daemon's process (compiled rules,
libpython, orjson, libc, the kernel), its own time per call on each path
and the difference: the time a path's extra work really takes, misses
included. ``perf annotate -i OUT/N.PATH.data -s SYMBOL`` then shows the
instruction it falls on (a load that missed takes the samples of the one
after it).

``python -m benchmarks.symbols [--order M,L,...] [--seconds S] [--top N]
[--out DIR] [--tree DIR]``; ``--tree build/compiled`` profiles the compiled
rules (``python -m benchmarks.compiled``). A function's time per call is its
share of the samples times the path's daemon CPU per call, and the paths'
figures are the means of their loads. Needs perf (Debian's linux-perf).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import turns
from benchmarks.procs import REPO, daemon, loadgen, workdir
from benchmarks.turns import PATHS

# A line of `perf report --sort dso,sym --stdio -q`: share, object, kind, symbol.
LINE = re.compile(r"\s*(?P<share>[\d.]+)%\s+(?P<dso>\S+)\s+\[.\]\s+(?P<sym>.*)")
# A function's figure, by (object, symbol): a share of the samples, or µs per call.
Shares = dict[tuple[str, str], float]


def run(
    order: list[str], seconds: float, out: Path, clients: int = 64, in_flight: int = 16
) -> list[tuple[str, float, Path]]:
    """Each load of ``order`` in one daemon, perf recording the daemon through
    the load's window: the path, its daemon CPU µs per call, its perf data."""
    loads = []
    warmup = 1.0
    with workdir() as directory, daemon(directory, turns.SERVERS) as dm:
        for n, path in enumerate(order):
            spec = turns.load_spec(dm, path, seconds, warmup, clients, in_flight)
            answer: dict[str, Any] = {}
            driver = threading.Thread(target=lambda: answer.update(loadgen(spec)))  # noqa: B023 (joined below)
            driver.start()
            time.sleep(warmup + 0.5)  # (the load generator starts its clients first)
            data = out / f"{n}.{path}.data"
            record = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "4000"]
            record += ["-p", str(dm.pid), "-o", str(data), "--", "sleep", str(seconds - 1)]
            subprocess.run(record, check=True, stderr=subprocess.DEVNULL)
            driver.join()
            cpu = turns.cpu_per_call(path, answer)
            print(f"{n + 1} {PATHS[path][0]}: {cpu:.2f} µs of daemon CPU per call", flush=True)
            loads.append((path, cpu, data))
    return loads


def shares(data: Path) -> Shares:
    """Each function's share of the samples (0-1), by (object, symbol)."""
    report = ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym"]
    return parse(
        subprocess.run(
            [*report, "--stdio", "-q"], capture_output=True, text=True, check=True
        ).stdout
    )


def parse(report: str) -> Shares:
    """:func:`shares` of perf's report (``--sort dso,sym --stdio -q``)."""
    found: Shares = {}
    for line in report.splitlines():
        match = LINE.match(line)
        if match:
            key = (match["dso"], match["sym"].strip())
            found[key] = found.get(key, 0.0) + float(match["share"]) / 100
    return found


def per_call(
    loads: list[tuple[str, float, Path]], read: Callable[[Path], Shares] = shares
) -> dict[str, Shares]:
    """Each path's µs per call in each function: the mean over its loads."""
    by_path: dict[str, list[Shares]] = {}
    for path, cpu, data in loads:
        by_path.setdefault(path, []).append({k: s * cpu for k, s in read(data).items()})
    out = {}
    for path, tables in by_path.items():
        keys = set().union(*tables)
        out[path] = {k: statistics.mean(t.get(k, 0.0) for t in tables) for k in keys}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.symbols", description=__doc__)
    parser.add_argument("--order", default="M,L,L,M", help=f"{', '.join(PATHS)}, comma-separated")
    parser.add_argument("--seconds", type=float, default=6.0, help="each load's window")
    parser.add_argument("--top", type=int, default=25, help="functions shown each way")
    parser.add_argument("--out", default=str(REPO / "build" / "symbols"), help="perf's data")
    parser.add_argument("--tree", help="run another checkout (or the compiled copy)")
    args = parser.parse_args(argv)
    order = args.order.split(",")
    if len(set(order)) != 2 or any(path not in PATHS for path in order):
        parser.error(f"--order takes two of {', '.join(PATHS)}")
    if args.tree:  # (the daemon is started from the tree this runs in)
        command = [sys.executable, "-m", "benchmarks.symbols", "--order", args.order]
        command += ["--seconds", str(args.seconds), "--top", str(args.top)]
        command += ["--out", str(Path(args.out).resolve())]
        tree = Path(args.tree).resolve()
        env = {**os.environ, "PYTHONPATH": str(tree)}
        return subprocess.run(command, cwd=tree, env=env, check=False).returncode
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = per_call(run(order, args.seconds, out))
    one, two = dict.fromkeys(order)  # (the difference: the first path named, less the other)
    a, b = table[one], table[two]
    print(f"\nµs per call: {PATHS[one][0]} ({one}), {PATHS[two][0]} ({two}), the difference")
    print(f"all: {sum(a.values()):.3f} {sum(b.values()):.3f}")
    rows = sorted(set(a) | set(b), key=lambda k: a.get(k, 0.0) - b.get(k, 0.0))
    shown = [*rows[-args.top :][::-1], None, *rows[: args.top][::-1]]
    for key in shown:
        if key is None:
            print("...")
            continue
        x, y = a.get(key, 0.0), b.get(key, 0.0)
        print(f"{x:7.3f} {y:7.3f} {x - y:+7.3f}  {key[1][:70]}  [{Path(key[0]).name[:32]}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
