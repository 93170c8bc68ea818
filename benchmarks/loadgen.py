"""The harness's load generator: a process of its own, driven by a JSON spec on stdin.

``python -m benchmarks.loadgen < spec.json`` opens the clients the spec
lists (unix sockets, child processes on stdio or Streamable HTTP sessions, see
:class:`tools.bench_engine.Target`), runs one kind of measurement, and prints
one JSON object on stdout. Kinds:

- ``load``: drive every client with ``load``; the result, and the CPU time
  each watched process (and this one, and the child processes it spawned)
  used during the measured window;
- ``idle``: open ``warm`` clients, sample the watched processes' memory,
  open ``clients`` more, let them sit ``settle`` seconds, sample again (and
  the memory of every child process: shims or servers);
- ``spawn``: ``repeat`` times in a row, start one client and time how long
  it takes from spawning it to the answer to its ``initialize``.

It runs in a process apart from the daemon (and the harness), so that its
own CPU is counted apart and it never steals the daemon's event loop.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from typing import Any

import orjson

from tools import bench_proc
from tools.bench_engine import Engine, Load, Target
from tools.bench_http import ACCEPT_BOTH


def _targets(spec: dict[str, Any], key: str = "targets") -> list[Target]:
    targets = []
    for entry in spec.get(key, []):
        target = entry["target"]
        target = Target(
            socket=target.get("socket"),
            servers=tuple(target.get("servers", ())),
            argv=tuple(target.get("argv", ())),
            env=target.get("env"),
            cwd=target.get("cwd"),
            url=target.get("url"),
            headers=target.get("headers"),
            accept=target.get("accept", ACCEPT_BOTH),
            era=target.get("era", "legacy"),
        )
        targets += [target] * int(entry.get("count", 1))
    return targets


def _cpu(watch: dict[str, int], engine: Engine) -> dict[str, float | None]:
    sample = {name: bench_proc.cpu_seconds(pid) for name, pid in watch.items()}
    usage = resource.getrusage(resource.RUSAGE_SELF)  # microseconds, not clock ticks
    sample["loadgen"] = usage.ru_utime + usage.ru_stime
    sample["machine"] = bench_proc.machine_busy_seconds()
    sample["stolen"] = bench_proc.machine_stolen_seconds()
    children = [c.pid for c in engine.clients if c.pid is not None]
    if children:
        sample["clients"] = sum(bench_proc.cpu_seconds(pid) or 0.0 for pid in children)
    return sample


def _memory(watch: dict[str, int]) -> dict[str, Any]:
    return {name: bench_proc.memory(pid).as_dict() for name, pid in watch.items()}


def _children_memory(engine: Engine) -> list[dict[str, Any]]:
    return [bench_proc.memory(c.pid).as_dict() for c in engine.clients if c.pid is not None]


def run_load(spec: dict[str, Any], engine: Engine) -> dict[str, Any]:
    clients = engine.open(_targets(spec), timeout=spec.get("open_timeout", 60.0))
    watch = spec.get("watch", {})
    samples: dict[str, dict[str, float | None]] = {}

    def on_window(edge: str) -> None:
        samples[edge] = _cpu(watch, engine)

    result = engine.run(Load(**spec["load"]), on_window=on_window)
    cpu = {
        name: (samples["stop"][name] or 0.0) - (samples["start"][name] or 0.0)
        for name in samples.get("stop", {})
        if samples["stop"][name] is not None and samples["start"].get(name) is not None
    }
    return {
        "result": result.summary(),
        "cpu_s": cpu,
        "connect_ms": [((c.ready_ns or c.opened) - c.opened) / 1e6 for c in clients],
        "memory": _memory(watch),
    }


def run_idle(spec: dict[str, Any], engine: Engine) -> dict[str, Any]:
    watch = spec.get("watch", {})
    engine.open(_targets(spec, "warm"), timeout=spec.get("open_timeout", 60.0))
    time.sleep(spec.get("settle", 1.0))
    before = _memory(watch)
    started = time.perf_counter()
    clients = engine.open(_targets(spec), timeout=spec.get("open_timeout", 120.0))
    opened = time.perf_counter() - started
    time.sleep(spec.get("settle", 1.0))
    return {
        "clients": len(clients),
        "open_s": opened,
        "before": before,
        "after": _memory(watch),
        "children": _children_memory(engine),
    }


def run_spawn(spec: dict[str, Any], engine: Engine) -> dict[str, Any]:
    times = []
    memory = []
    for _ in range(int(spec.get("repeat", 5))):
        (client,) = engine.open(_targets(spec)[:1], timeout=spec.get("open_timeout", 30.0))
        times.append(((client.ready_ns or client.opened) - client.opened) / 1e6)
        time.sleep(spec.get("settle", 0.2))
        memory += _children_memory(engine)
        engine.close()
    return {"first_answer_ms": times, "children": memory}


KINDS = {"load": run_load, "idle": run_idle, "spawn": run_spawn}


def main() -> int:
    spec = orjson.loads(sys.stdin.buffer.read())
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    stderr = open(spec["stderr"], "ab") if spec.get("stderr") else None  # noqa: SIM115
    engine = Engine(stderr=stderr if stderr is not None else subprocess.DEVNULL)
    try:
        out = KINDS[spec.get("kind", "load")](spec, engine)
    finally:
        engine.close()
        if stderr is not None:
            stderr.close()
    sys.stdout.buffer.write(orjson.dumps(out) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
