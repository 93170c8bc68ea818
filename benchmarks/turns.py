"""Loads in a given order through one daemon: ``python -m benchmarks.turns``.

The harness's modern scenario reads the median of five rounds, and the
machine's speed drifts by a third within a minute, so a ratio of 1.1 is
not told from noise by it. This runs the loads one after another in one
daemon, in the order given, and prints each load's daemon CPU per call;
then, for the order ``legacy, modern, modern, legacy`` repeated (the
default), the ratio of each group of four: a drift that is steady over a
group falls on both paths alike.

``python -m benchmarks.turns [--order L,M,M,L,...] [--seconds S] [--tree DIR]``

``L`` is a legacy client at the legacy echo server, ``M`` a modern client
at the modern one (benchmarks/echo_server.py ``--modern``); the harness's
other paths are ``P`` (legacy, padded to a modern call's bytes), ``B``
(modern at legacy) and ``A`` (legacy at modern), so its order can be
replayed. 64 clients x 16 in flight; ``--tree build/compiled`` runs the compiled rules
(``python -m benchmarks.compiled``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.procs import ECHO_SERVER, Daemon, daemon, loadgen, socket_target, workdir
from benchmarks.scenarios import ECHO_ARGS, MODERN_SIZED_ARGS

ABBA = "L,M,M,L,L,M,M,L"
# A path: its name, the clients' era, the server, the tool's arguments.
PATHS = {
    "L": ("legacy", "legacy", "echo", ECHO_ARGS),
    "M": ("modern", "modern", "echo-modern", ECHO_ARGS),
    "P": ("legacy, modern's bytes", "legacy", "echo", MODERN_SIZED_ARGS),
    "B": ("modern at legacy", "modern", "echo", ECHO_ARGS),
    "A": ("legacy at modern", "legacy", "echo-modern", ECHO_ARGS),
}


# The servers every path's load goes to, behind one daemon.
SERVERS = {"echo": ECHO_SERVER, "echo-modern": [*ECHO_SERVER, "--modern"]}


def run(order: list[str], seconds: float, clients: int = 64, in_flight: int = 16) -> list[float]:
    """Each load's daemon CPU µs per call, in ``order`` (keys of ``PATHS``), in one daemon."""
    figures = []
    with workdir() as directory, daemon(directory, SERVERS) as dm:
        for path in order:
            out = loadgen(load_spec(dm, path, seconds, seconds / 4, clients, in_flight))
            figures.append(cpu_per_call(path, out))
    return figures


def load_spec(
    dm: Daemon, path: str, seconds: float, warmup: float, clients: int, in_flight: int
) -> dict[str, Any]:
    """The load generator's spec for ``path``'s load through ``dm``."""
    _, era, server, arguments = PATHS[path]
    load: dict[str, Any] = {"in_flight": in_flight, "tool": "echo", "arguments": arguments}
    load |= {"duration": seconds, "warmup": warmup}
    return {
        "kind": "load",
        "targets": [socket_target(dm.socket, server, clients, era)],
        "load": load,
        "watch": {"daemon": dm.pid},
    }


def cpu_per_call(path: str, out: dict[str, Any]) -> float:
    """The daemon's CPU µs per call of a load of ``path``, answered in full."""
    calls = out["result"]["calls"]
    if not calls or out["result"]["ok"] != calls:
        raise SystemExit(f"a {PATHS[path][0]} load failed: {out['result']}")
    return 1e6 * out["cpu_s"]["daemon"] / calls


def groups(order: list[str], figures: list[float]) -> list[float]:
    """Modern over legacy, CPU per call, in each group of four of an L,M,M,L order
    (a group of four with other paths in it is passed over)."""
    ratios = []
    for start in range(0, len(order) - 3, 4):
        paths, cpu = order[start : start + 4], figures[start : start + 4]
        if sorted(paths) != ["L", "L", "M", "M"]:
            continue
        legacy = sum(f for p, f in zip(paths, cpu, strict=True) if p == "L")
        modern = sum(f for p, f in zip(paths, cpu, strict=True) if p == "M")
        ratios.append(modern / legacy)
    return ratios


def means(order: list[str], figures: list[float]) -> dict[str, float]:
    """Each path's mean figure (a path's loads fall at other places in the
    order: the harness's, replayed, puts legacy first in a fresh daemon)."""
    return {
        path: statistics.mean(f for p, f in zip(order, figures, strict=True) if p == path)
        for path in dict.fromkeys(order)
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.turns", description=__doc__)
    parser.add_argument(
        "--order", default=ABBA, help=f"{', '.join(PATHS)}, comma-separated ({ABBA})"
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="measured per load")
    parser.add_argument("--tree", help="run another checkout (or the compiled copy)")
    args = parser.parse_args(argv)
    order = args.order.split(",")
    if not order or any(path not in PATHS for path in order):
        parser.error(f"--order takes {', '.join(PATHS)} only")
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
    averages = means(order, figures)
    for path, mean in sorted(averages.items(), key=lambda item: item[1]):
        print(f"{PATHS[path][0]}: {mean:.2f} µs per call (mean of {order.count(path)})")
    if "L" in averages and "M" in averages:
        print(f"modern / legacy, the means: {averages['M'] / averages['L']:.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
