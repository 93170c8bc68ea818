"""The harness's scenarios: what runs, through the broker and directly, for each figure.

Every scenario starts its own processes (a fresh daemon, so its peak RSS is
that scenario's) and returns a plain dict that :mod:`benchmarks.report`
prints. "Direct" means the same load generator talking to the same echo
server with the broker taken out:

- for the daemon's socket scenarios, the echo server listens on a unix socket
  itself (``echo_server.py --socket``) and every client connects to it, so the
  client side (one unix socket per client, the same generator code) is
  identical and the only difference is the broker hop; with several
  upstreams, one echo server per upstream, clients spread evenly;
- for the host path (shims), what hosts do today: one copy of the server per
  client, launched on stdio;
- for Streamable HTTP (``http``), what hosts that connect by URL get from a
  server built on the official SDK serving HTTP itself (benchmarks/sdk_server.py
  ``--http``), beside the daemon's ``--http`` listener with the echo server
  and beside the daemon with that same SDK server as a ``url`` server.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import attrs

from benchmarks import procs
from benchmarks.procs import (
    ECHO_SERVER,
    SDK_SERVER,
    command_target,
    daemon,
    echo_sockets,
    fetch_status,
    http_target,
    loadgen,
    sdk_http_server,
    shim_command,
    socket_target,
)
from tools import bench_proc

ECHO_ARGS = {"text": "hello, broker"}
MIB = 1024 * 1024


@attrs.frozen
class Settings:
    duration: float = 8.0  # seconds measured per run
    warmup: float = 2.0  # seconds driven before the window opens
    requests: int | None = None  # instead of a duration: this many calls in all (tests)
    idle_clients: int = 1000
    spawn_repeat: int = 10
    memory_clients: int = 20
    sdk: bool = True  # also compare memory with a server built on the official SDK
    rounds: int = 5  # turns each path takes in the modern scenario (windows of a third of a run)


QUICK = Settings(
    duration=1.5,
    warmup=0.5,
    idle_clients=200,
    spawn_repeat=3,
    memory_clients=5,
    sdk=False,
    rounds=2,
)
TINY = Settings(
    duration=0.0,
    warmup=0.0,
    requests=40,
    idle_clients=4,
    spawn_repeat=1,
    memory_clients=2,
    sdk=False,
    rounds=2,
)


def _load(
    s: Settings,
    targets: list[dict[str, Any]],
    in_flight: int,
    watch: dict[str, int],
    tool: str = "echo",
    arguments: dict[str, Any] | None = None,
    children: str = "clients",
) -> dict[str, Any]:
    load: dict[str, Any] = {
        "in_flight": in_flight,
        "tool": tool,
        "arguments": ECHO_ARGS if arguments is None else arguments,
    }
    if s.requests is not None:
        load["requests"] = s.requests
    else:
        load.update(duration=s.duration, warmup=s.warmup)
    spec = {"kind": "load", "targets": targets, "load": load, "watch": watch}
    out = loadgen(spec)
    if children != "clients" and "clients" in out["cpu_s"]:
        out["cpu_s"][children] = out["cpu_s"].pop("clients")
    return out


def _compare(
    s: Settings,
    directory: str,
    *,
    clients: int,
    in_flight: int,
    upstreams: int = 1,
    tool: str = "echo",
    arguments: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The same load through the daemon's socket and straight to the echo server(s)."""
    names = ["echo"] if upstreams == 1 else [f"echo{i}" for i in range(upstreams)]
    per = max(1, clients // len(names))
    with daemon(directory, dict.fromkeys(names, ECHO_SERVER)) as dm:
        targets = [socket_target(dm.socket, name, per) for name in names]
        watch = {"daemon": dm.pid} | {f"server:{n}": dm.server_pids[n] for n in names}
        broker = _load(s, targets, in_flight, watch, tool, arguments)
        broker["daemon_memory"] = bench_proc.memory(dm.pid).as_dict()
    with echo_sockets(directory, len(names)) as servers:
        targets = [socket_target(path, None, per) for _, path in servers]
        watch = {f"server:{i}": pid for i, (pid, _) in enumerate(servers)}
        direct = _load(s, targets, in_flight, watch, tool, arguments)
    return {"clients": per * len(names), "in_flight": in_flight, "broker": broker, "direct": direct}


def latency(s: Settings, directory: str) -> dict[str, Any]:
    return _compare(s, directory, clients=1, in_flight=1)


def throughput(s: Settings, directory: str) -> dict[str, Any]:
    return _compare(s, directory, clients=64, in_flight=16)


def upstreams(s: Settings, directory: str) -> dict[str, Any]:
    return _compare(s, directory, clients=64, in_flight=16, upstreams=8)


def payload(s: Settings, directory: str) -> dict[str, Any]:
    return _compare(s, directory, clients=1, in_flight=1, tool="payload", arguments={"size": MIB})


# The paths of the modern scenario: (name, clients' era, echo server's era).
# "modern" against "legacy" is the era's own cost (each side speaking its
# era end to end); "legacy, modern's bytes" is a legacy call padded to the
# size of a modern one (the 191 bytes of its _meta), which tells what of
# that cost is the bigger request; the other two are the bridge's
# (docs/eras.md).
ERA_PATHS = (
    ("legacy", "legacy", "legacy"),
    ("legacy, modern's bytes", "legacy", "legacy"),
    ("modern at legacy", "modern", "legacy"),
    ("modern", "modern", "modern"),
    ("legacy at modern", "legacy", "modern"),
)
# The order the paths take their turns in (reversed every other round):
# modern between the two paths it is read against, so that each of its
# per-round ratios compares neighbouring windows. The machine's speed
# drifts by a third within a round; until 2026-11-27 the order was
# ERA_PATHS', which put three windows between legacy and modern.
TURNS = ("modern at legacy", "legacy, modern's bytes", "modern", "legacy", "legacy at modern")
# What pads a legacy call to a modern one's bytes ("pad": the echo server ignores it).
MODERN_SIZED_ARGS = {**ECHO_ARGS, "pad": "x" * 182}


def _eras(
    s: Settings, directory: str, *, clients: int, in_flight: int, upstreams: int = 1
) -> dict[str, Any]:
    """The same load through one daemon's socket by legacy clients and by modern
    ones (2026-07-28: no initialize, ``_meta`` on every request), at legacy
    echo servers and at modern ones (benchmarks/echo_server.py ``--modern``),
    both kinds behind the daemon. The paths take turns (:data:`TURNS`),
    ``s.rounds`` times (the order reversed every other round), each window a
    third of a run's: what the machine does meanwhile falls on every path
    alike, and the ratios are read per round (:func:`merge_rounds`; their
    medians are the targets')."""
    legacy = ["echo"] if upstreams == 1 else [f"echo{i}" for i in range(upstreams)]
    modern = [f"{name}-modern" for name in legacy]
    per = max(1, clients // len(legacy))
    servers = {name: ECHO_SERVER for name in legacy}
    servers |= {name: [*ECHO_SERVER, "--modern"] for name in modern}
    window = attrs.evolve(s, duration=s.duration / 3, warmup=s.warmup / 2)
    paths = {path: (era, at) for path, era, at in ERA_PATHS}
    turns = [(path, *paths[path]) for path in TURNS]
    runs: dict[str, list[dict[str, Any]]] = {path: [] for path, _, _ in ERA_PATHS}
    with daemon(directory, servers) as dm:
        watch = {"daemon": dm.pid} | {f"server:{n}": pid for n, pid in dm.server_pids.items()}
        for round in range(s.rounds):
            for path, era, at in turns if round % 2 == 0 else turns[::-1]:
                names = legacy if at == "legacy" else modern
                targets = [socket_target(dm.socket, name, per, era) for name in names]
                padded = MODERN_SIZED_ARGS if "bytes" in path else None
                runs[path].append(_load(window, targets, in_flight, watch, arguments=padded))
    out: dict[str, Any] = {"clients": per * len(legacy), "in_flight": in_flight}
    return out | {path: merge_rounds(outs) for path, outs in runs.items()}


def merge_rounds(outs: list[dict[str, Any]]) -> dict[str, Any]:
    """One path's rounds as one load generator's answer: calls, errors and CPU
    summed (so CPU per call and calls/s are over every window), each latency
    percentile the median of the rounds'; the rounds themselves kept under
    ``rounds`` (the report's per-round ratios)."""
    results = [out["result"] for out in outs]
    errors: dict[str, int] = {}
    for result in results:
        for kind, count in result["errors"].items():
            errors[kind] = errors.get(kind, 0) + count
    summed = {k: sum(r[k] for r in results) for k in ("calls", "ok", "tool_errors", "lost")}
    elapsed = sum(r["elapsed_s"] for r in results)
    latency = {
        p: statistics.median(
            [r["latency_us"][p] for r in results if r["latency_us"][p] is not None]
        )
        if any(r["latency_us"][p] is not None for r in results)
        else None
        for p in results[0]["latency_us"]
    }
    cpu: dict[str, float] = {}
    for out in outs:
        for name, seconds in out["cpu_s"].items():
            if seconds is not None:
                cpu[name] = cpu.get(name, 0.0) + seconds
    result = summed | {
        "errors": errors,
        "elapsed_s": elapsed,
        "throughput": summed["calls"] / elapsed if elapsed else 0.0,
        "latency_us": latency,
    }
    return {"result": result, "cpu_s": cpu, "rounds": outs}


def modern(s: Settings, directory: str) -> dict[str, Any]:
    """Modern-era calls beside legacy ones, at the loads of the socket scenarios."""
    return {
        "latency": _eras(s, directory, clients=1, in_flight=1),
        "throughput": _eras(s, directory, clients=64, in_flight=16),
        "upstreams": _eras(s, directory, clients=64, in_flight=16, upstreams=8),
    }


def idle(s: Settings, directory: str) -> dict[str, Any]:
    """Memory per session: the daemon's RSS before and after N idle clients connect."""
    with daemon(directory, {"echo": ECHO_SERVER}) as dm:
        spec = {
            "kind": "idle",
            "warm": [socket_target(dm.socket, "echo", 10)],
            "targets": [socket_target(dm.socket, "echo", s.idle_clients)],
            "watch": {"daemon": dm.pid},
            "settle": 1.0 if s.requests is None else 0.2,
        }
        out = loadgen(spec)
    out["clients"] = s.idle_clients
    return out


def shims(s: Settings, directory: str) -> dict[str, Any]:
    """The host path: N clients each speaking stdio to its own ``mcpbroker connect``."""
    out: dict[str, Any] = {}
    with daemon(directory, {"echo": ECHO_SERVER}) as dm:
        shim = shim_command(dm.socket, "echo")
        watch = {"daemon": dm.pid, "server:echo": dm.server_pids["echo"]}
        out["throughput"] = {
            "broker": _load(s, [command_target(shim, 8)], 4, watch, children="shims"),
        }
        out["latency"] = {"broker": _load(s, [command_target(shim, 1)], 1, watch, children="shims")}
        out["spawn"] = {"broker": _spawn(s, shim)}
        out["memory"] = {"echo": {"broker": _idle_memory(s, shim, dm)}}
    out["throughput"]["direct"] = _load(
        s, [command_target(ECHO_SERVER, 8)], 4, {}, children="server"
    )
    out["latency"]["direct"] = _load(s, [command_target(ECHO_SERVER, 1)], 1, {}, children="server")
    out["spawn"]["direct"] = _spawn(s, ECHO_SERVER)
    out["memory"]["echo"]["direct"] = _idle_memory(s, ECHO_SERVER, None)
    if s.sdk:
        out["spawn"]["direct_sdk"] = _spawn(s, SDK_SERVER)
        with daemon(directory, {"sdk": SDK_SERVER}) as dm:
            sdk_shim = shim_command(dm.socket, "sdk")
            out["memory"]["sdk"] = {"broker": _idle_memory(s, sdk_shim, dm)}
        out["memory"]["sdk"]["direct"] = _idle_memory(s, SDK_SERVER, None)
    out["clients"] = {"throughput": 8, "in_flight": 4, "memory": s.memory_clients}
    return out


def _spawn(s: Settings, argv: list[str]) -> dict[str, Any]:
    spec = {"kind": "spawn", "targets": [command_target(argv)], "repeat": s.spawn_repeat}
    return loadgen(spec)


def _idle_memory(s: Settings, argv: list[str], dm: procs.Daemon | None) -> dict[str, Any]:
    """N idle clients on ``argv`` (shims or servers); with the daemon and its server."""
    watch = (
        {}
        if dm is None
        else {"daemon": dm.pid} | {f"server:{n}": pid for n, pid in dm.server_pids.items()}
    )
    spec = {
        "kind": "idle",
        "targets": [command_target(argv, s.memory_clients)],
        "watch": watch,
        "settle": 1.0 if s.requests is None else 0.2,
    }
    return loadgen(spec)


HTTP_LOADS = {"throughput": 64, "latency": 1}  # keep-alive clients, one call in flight each


def http(s: Settings, directory: str) -> dict[str, Any]:
    """Hosts that connect by URL, each client an MCP session on a keep-alive HTTP/1.1
    connection with one call in flight (HTTP/1.1 carries one request at a time):

    - ``broker``: the daemon's ``--http`` listener, the echo server behind it on stdio;
    - ``direct``: the SDK's own Streamable HTTP server (an echo tool), no broker;
    - ``url``: the daemon's ``--http`` with that SDK server as its ``url`` server.
    """
    out: dict[str, Any] = {key: {} for key in HTTP_LOADS}
    listen = ("--http", "127.0.0.1:0")
    with daemon(directory, {"echo": ECHO_SERVER}, options=listen) as dm:
        url = fetch_status(dm.socket)["http"].rstrip("/") + "/echo"
        watch = {"daemon": dm.pid, "server:echo": dm.server_pids["echo"]}
        for key, clients in HTTP_LOADS.items():
            out[key]["broker"] = _load(s, [http_target(url, clients)], 1, watch)
        out["daemon_memory"] = {"broker": bench_proc.memory(dm.pid).as_dict()}
    with sdk_http_server() as (pid, sdk_url):
        for key, clients in HTTP_LOADS.items():
            out[key]["direct"] = _load(s, [http_target(sdk_url, clients)], 1, {"server:sdk": pid})
        with daemon(directory, {}, options=listen, urls={"sdk": sdk_url}) as dm:
            url = fetch_status(dm.socket)["http"].rstrip("/") + "/sdk"
            watch = {"daemon": dm.pid, "server:sdk": pid}
            for key, clients in HTTP_LOADS.items():
                out[key]["url"] = _load(s, [http_target(url, clients)], 1, watch)
            out["daemon_memory"]["url"] = bench_proc.memory(dm.pid).as_dict()
        out["sdk_memory"] = bench_proc.memory(pid).as_dict()
    out["clients"] = dict(HTTP_LOADS)
    return out


SCENARIOS: dict[str, Callable[[Settings, str], dict[str, Any]]] = {
    "latency": latency,
    "throughput": throughput,
    "upstreams": upstreams,
    "idle": idle,
    "payload": payload,
    "shims": shims,
    "http": http,
    "modern": modern,
}
