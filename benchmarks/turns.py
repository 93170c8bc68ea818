"""Loads in a given order through one daemon: ``python -m benchmarks.turns``.

The harness's modern scenario reads the median of three rounds, and the
machine's speed drifts by a third within a minute, so a ratio of 1.1 is
not told from noise by it. This runs the loads one after another in one
daemon, in the order given, and prints each load's daemon CPU per call;
then, for the order ``legacy, modern, modern, legacy`` repeated (the
default), the ratio of each group of four: a drift that is steady over a
group falls on both paths alike.

``python -m benchmarks.turns [--order L,M,M,L,...] [--seconds S] [--tree DIR]``

``L`` is a legacy client at the legacy echo server, ``M`` a modern client
at the modern one (benchmarks/echo_server.py ``--modern``), 64 clients x
16 in flight; ``--tree build/compiled`` runs the compiled rules
(``python -m benchmarks.compiled``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.procs import ECHO_SERVER, daemon, loadgen, socket_target, workdir
from benchmarks.scenarios import ECHO_ARGS

ABBA = "L,M,M,L,L,M,M,L"
PATHS = {"L": ("legacy", "echo"), "M": ("modern", "echo-modern")}


def run(order: list[str], seconds: float, clients: int = 64, in_flight: int = 16) -> list[float]:
    """Each load's daemon CPU µs per call, in ``order`` (``L`` or ``M``), in one daemon."""
    servers = {"echo": ECHO_SERVER, "echo-modern": [*ECHO_SERVER, "--modern"]}
    figures = []
    with workdir() as directory, daemon(directory, servers) as dm:
        for path in order:
            era, server = PATHS[path]
            load: dict[str, Any] = {"in_flight": in_flight, "tool": "echo"}
            load |= {"arguments": ECHO_ARGS, "duration": seconds, "warmup": seconds / 4}
            spec = {
                "kind": "load",
                "targets": [socket_target(dm.socket, server, clients, era)],
                "load": load,
                "watch": {"daemon": dm.pid},
            }
            out = loadgen(spec)
            calls = out["result"]["calls"]
            if not calls:
                raise SystemExit(f"a {era} load made no calls")
            figures.append(1e6 * out["cpu_s"]["daemon"] / calls)
    return figures


def groups(order: list[str], figures: list[float]) -> list[float]:
    """Modern over legacy, CPU per call, in each group of four of an L,M,M,L order."""
    ratios = []
    for start in range(0, len(order) - 3, 4):
        paths, cpu = order[start : start + 4], figures[start : start + 4]
        if sorted(paths) != ["L", "L", "M", "M"]:
            continue
        legacy = sum(f for p, f in zip(paths, cpu, strict=True) if p == "L")
        modern = sum(f for p, f in zip(paths, cpu, strict=True) if p == "M")
        ratios.append(modern / legacy)
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.turns", description=__doc__)
    parser.add_argument("--order", default=ABBA, help=f"L and M, comma-separated ({ABBA})")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured per load")
    parser.add_argument("--tree", help="run another checkout (or the compiled copy)")
    args = parser.parse_args(argv)
    order = args.order.split(",")
    if not order or any(path not in PATHS for path in order):
        parser.error("--order takes L and M only")
    if args.tree:  # (the daemon is started from the tree this runs in)
        command = [sys.executable, "-m", "benchmarks.turns", "--order", args.order]
        command += ["--seconds", str(args.seconds)]
        tree = Path(args.tree).resolve()
        env = {**os.environ, "PYTHONPATH": str(tree)}
        return subprocess.run(command, cwd=tree, env=env, check=False).returncode
    figures = run(order, args.seconds)
    for n, (path, figure) in enumerate(zip(order, figures, strict=True), 1):
        print(f"{n} {PATHS[path][0]}: {figure:.2f} µs of daemon CPU per call", flush=True)
    for ratio in groups(order, figures):
        print(f"modern / legacy, a group of four: {ratio:.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
