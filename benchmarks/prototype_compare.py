"""``python -m benchmarks.prototype compare``: the harness's loads with each patch set.

Runs the daemon as ``python -m benchmarks.prototype serve`` with
``$MCPBROKER_PATCHES`` set to each cumulative set of prototype patches (see
:mod:`benchmarks.prototype`) and prints, per set, the figures the proposals
are meant to move: 1 x 1 p50 and daemon CPU per call, 64 x 16 calls/s and
daemon CPU per call, and the 1 MiB result's p50.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from benchmarks.procs import ECHO_SERVER, daemon, loadgen, socket_target, workdir

SETS = ["", "writethrough"]
LOADS = {  # name: clients, in flight, tool, arguments
    "1x1": (1, 1, "echo", {"text": "hello, broker"}),
    "64x16": (64, 16, "echo", {"text": "hello, broker"}),
    "1MiB": (1, 1, "payload", {"size": 1024 * 1024}),
    "64KiB-8x4": (8, 4, "payload", {"size": 64 * 1024}),
}


def measure(patches: str, load: str, seconds: float) -> dict[str, Any]:
    clients, in_flight, tool, arguments = LOADS[load]
    os.environ["MCPBROKER_PATCHES"] = patches
    with (
        workdir() as directory,
        daemon(directory, {"echo": ECHO_SERVER}, module="benchmarks.prototype") as dm,
    ):
        spec = {
            "kind": "load",
            "targets": [socket_target(dm.socket, "echo", clients)],
            "load": {
                "in_flight": in_flight,
                "tool": tool,
                "arguments": arguments,
                "duration": seconds,
                "warmup": 1.0,
            },
            "watch": {"daemon": dm.pid},
        }
        out = loadgen(spec)
    result = out["result"]
    return {
        "calls/s": result["throughput"],
        "p50 µs": result["latency_us"]["p50"],
        "p99 µs": result["latency_us"]["p99"],
        "daemon µs/call": out["cpu_s"]["daemon"] / max(1, result["calls"]) * 1e6,
        "errors": sum(result["errors"].values()) + result["lost"],
    }


def compare(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prototype compare")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--sets", default=";".join(SETS), help="';'-separated patch sets")
    parser.add_argument("--loads", default=",".join(LOADS))
    args = parser.parse_args(argv)
    print("| patches | load | calls/s | p50 µs | p99 µs | daemon CPU µs/call | errors |")
    print("|---|---|---|---|---|---|---|")
    for patches in args.sets.split(";"):
        for load in args.loads.split(","):
            m = measure(patches, load, args.seconds)
            print(
                f"| {patches or 'none'} | {load} | {m['calls/s']:,.0f} | {m['p50 µs']:,.0f} | "
                f"{m['p99 µs']:,.0f} | {m['daemon µs/call']:,.1f} | {m['errors']} |",
                flush=True,
            )
    return 0
