"""Profile the daemon's hot path under load: ``python -m benchmarks.profile``.

Starts the daemon under py-spy (``pip install py-spy`` into the venv; only
this script needs it), drives it with one of the harness's loads from the
load generator process, stops it, and prints where the daemon's CPU went:
functions by self time (the frame on top of the stack: the C calls a Python
line makes, such as ``orjson.dumps`` or ``socket.send``, are counted on that
line's function) and by inclusive time, and the share of each area of the
code. py-spy's raw stacks and a flame graph (SVG) are kept in ``--out``.

Options: ``--load throughput|latency|payload|shims``, ``--seconds S``,
``--rate HZ``, ``--out DIR`` (default ``build/profile``), ``--top N``,
``--patches SET`` (profile the prototypes of the proposed changes), ``--gil``
(count only samples where the daemon runs Python: on VMs where py-spy cannot
tell a thread blocked in a system call from a running one).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.procs import (
    ECHO_SERVER,
    PYTHON,
    REPO,
    command_target,
    daemon,
    loadgen,
    shim_command,
    socket_target,
    workdir,
)

LOADS = {  # clients, in flight, tool, arguments
    "throughput": (64, 16, "echo", {"text": "hello, broker"}),
    "latency": (1, 1, "echo", {"text": "hello, broker"}),
    "payload": (1, 1, "payload", {"size": 1024 * 1024}),
    "shims": (8, 4, "echo", {"text": "hello, broker"}),
}
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
# Frames where a thread waits (py-spy's idle detection misses them here): not CPU.
IDLE = {
    ("WorkerThread._work", "trio/_core/_thread_cache.py"),  # trio's idle worker thread
    ("EpollIOManager.get_events", "trio/_core/_io_epoll.py"),  # epoll_wait
}
AREAS = (  # first match wins, on the frame's file path
    ("benchmarks/prototype", "prototype patches (their I/O)"),
    ("broker/", "broker (sans-I/O rules)"),
    ("actors/", "actors (the daemon's tasks)"),
    ("trio/_core/_io_epoll", "trio: epoll and fd waiting"),
    ("trio/_core/_run", "trio: scheduler"),
    ("trio/_core", "trio: core (other)"),
    ("trio/_channel", "trio: memory channels"),
    ("trio/_highlevel", "trio: streams"),
    ("trio/_unix_pipes", "trio: pipe streams"),
    ("trio/_socket", "trio: sockets"),
    ("trio/", "trio: other"),
    ("attr", "attrs"),
    ("structlog", "structlog"),
    ("selectors", "selectors"),
)


def py_spy() -> str:
    found = shutil.which("py-spy", path=os.path.dirname(PYTHON)) or shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy is needed: .venv/bin/pip install py-spy")
    return found


def record(
    load: str, seconds: float, rate: int, out: Path, patches: str = "", gil: bool = False
) -> Path:
    """Run ``load`` against a daemon, attach py-spy once it is warm; the raw stacks file."""
    clients, in_flight, tool, arguments = LOADS[load]
    raw = out / f"{load}.txt"
    warmup = 1.5
    module = "cli.main"
    if patches:  # the prototypes of the proposed changes (benchmarks/prototype.py)
        os.environ["MCPBROKER_PATCHES"] = patches
        module = "benchmarks.prototype"
    with workdir() as directory, daemon(directory, {"echo": ECHO_SERVER}, module=module) as dm:
        if load == "shims":
            targets = [command_target(shim_command(dm.socket, "echo"), clients)]
        else:
            targets = [socket_target(dm.socket, "echo", clients)]
        load_spec = {"in_flight": in_flight, "tool": tool, "arguments": arguments}
        load_spec |= {"duration": seconds + 1.0, "warmup": warmup}
        spec = {"kind": "load", "targets": targets, "load": load_spec, "watch": {"daemon": dm.pid}}
        results: list[dict[str, Any]] = []
        generator = threading.Thread(target=lambda: results.append(loadgen(spec)))
        generator.start()
        time.sleep(warmup + 0.5)  # clients connected and warm: sample the steady state only
        command = [py_spy(), "record", "--pid", str(dm.pid), "--duration", str(int(seconds))]
        command += ["--rate", str(rate), "--format", "raw", "-o", str(raw), "--nonblocking"]
        if gil:  # only samples holding the GIL: Python's own CPU, not time in syscalls
            command.append("--gil")
        subprocess.run(command, check=True, capture_output=True)
        generator.join()
    result = results[0]
    calls = result["result"]["calls"]
    cpu = result["cpu_s"].get("daemon", 0.0)
    print(
        f"{load}: {calls:,} calls, {result['result']['throughput']:,.0f}/s, daemon CPU "
        f"{cpu / max(calls, 1) * 1e6:.1f} µs/call ({cpu / seconds:.0%} of a core, sampled)"
    )
    _flamegraph(raw, out / f"{load}.svg")
    return raw


def _flamegraph(raw: Path, svg: Path) -> None:
    """An SVG too, when a flame graph tool (inferno or flamegraph.pl) is installed."""
    tool = shutil.which("inferno-flamegraph") or shutil.which("flamegraph.pl")
    if tool:
        with open(raw, "rb") as source, open(svg, "wb") as target:
            subprocess.run([tool], stdin=source, stdout=target, check=False)


def parse(raw: Path) -> list[tuple[list[tuple[str, str]], int]]:
    """Collapsed stacks: ([(function, file) outermost first], samples)."""
    stacks = []
    for line in raw.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if not frames or not count.isdigit():
            continue
        parsed = []
        for frame in frames.split(";"):
            match = FRAME.match(frame.strip())
            if match:
                parsed.append((match["func"], match["file"]))
            else:
                parsed.append((frame.strip(), ""))
        stacks.append((parsed, int(count)))
    return stacks


def _short(file: str) -> str:
    for marker in ("site-packages/", "/work/main/", str(REPO) + "/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file.rsplit("/lib/python3", 1)[-1].lstrip("0123456789./")


def area(file: str) -> str:
    short = _short(file)
    for needle, name in AREAS:
        if needle in short:
            return name
    return "python stdlib/other" if short else "other"


def summarize(raw: Path, top: int) -> dict[str, Any]:
    stacks = parse(raw)
    total = sum(count for _, count in stacks) or 1
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    areas: collections.Counter[str] = collections.Counter()
    idle = 0
    for frames, count in stacks:
        if not frames:
            continue
        func, file = frames[-1]
        if (func, _short(file)) in IDLE:
            idle += count
            continue
        own[f"{func} ({_short(file)})"] += count
        areas[area(file)] += count
        for name in {f"{f} ({_short(p)})" for f, p in frames}:
            inclusive[name] += count
    busy = max(1, total - idle)
    return {
        "samples": total,
        "idle": idle / total,
        "self": [(name, n / busy) for name, n in own.most_common(top)],
        "inclusive": [(name, n / busy) for name, n in inclusive.most_common(top)],
        "areas": [(name, n / busy) for name, n in areas.most_common()],
    }


def render(load: str, summary: dict[str, Any]) -> str:
    lines = [
        f"#### {load}: {summary['samples']:,} samples, {summary['idle']:.0%} idle "
        "(waiting in epoll or an idle worker thread); shares below are of the busy samples",
        "",
    ]
    for key, title in (
        ("areas", "area (self time)"),
        ("self", "function, self time"),
        ("inclusive", "function, inclusive time"),
    ):
        lines += [f"| {title} | share |", "|---|---|"]
        lines += [f"| `{name}` | {share:.1%} |" for name, share in summary[key]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--load", choices=LOADS, action="append")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default=str(REPO / "build" / "profile"))
    parser.add_argument("--raw", metavar="FILE", help="only summarize an existing raw file")
    parser.add_argument(
        "--gil",
        action="store_true",
        help="sample only while the daemon holds the GIL (py-spy misses idle time on some VMs)",
    )
    parser.add_argument(
        "--patches", default="", help="apply prototype patches (benchmarks/prototype.py), or 'all'"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.raw:
        print(render(Path(args.raw).stem, summarize(Path(args.raw), args.top)))
        return 0
    for load in args.load or ["throughput", "latency"]:
        raw = record(load, args.seconds, args.rate, out, args.patches, args.gil)
        print(render(load, summarize(raw, args.top)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
