"""``mcpbroker bench``: load-test a configured MCP server through the daemon.

Drives ``tools/call TOOL`` on server NAME from N clients with K requests in
flight each, through the running daemon's socket (each client a session of
its own, as hosts have), for a duration or a number of requests, and reports
throughput, latency percentiles, errors by code, and the CPU time and memory
of the server (and of the daemon). With ``--direct`` it then launches the
server itself, as the config describes it, and runs the same load straight
against it for comparison: one server process, all N x K requests in flight
on its stdio, which is what the daemon's shared instance sees too. A server
reached by ``url`` is not launched: ``--direct`` opens one Streamable HTTP
session to it (with the config's ``headers``, ``${VAR}`` replaced from this
environment as the daemon does, and the token ``mcpbroker auth`` stored, if
any) and keeps the N x K requests in flight there, each on a keep-alive
connection of its own. Legacy HTTP+SSE (``"type": "sse"``, or no type and an
initialize refused as the spec's fallback says) and WebSocket servers are
refused with a message: measure them through the daemon.

What counts: a JSON-RPC error response is an error, counted by its code; a
tool result with ``isError: true`` is a tool error, counted apart (the call
worked, the tool said no); requests never answered are lost. Latency covers
every answered call. The load runs in this process (see
:mod:`tools.bench_engine`), so run it on a machine with a core to spare or
read the CPU figures with that in mind.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
import orjson

from actors.paths import default_config_path, default_socket_path
from cli.limits import WANTED_DESCRIPTORS, raise_fd_limit
from tools import bench_proc
from tools.bench_engine import BenchError, Engine, Load, Progress, Result, Target

CODE_NAMES = {
    "-32700": "parse error",
    "-32600": "invalid request",
    "-32601": "method not found",
    "-32602": "invalid params",
    "-32603": "internal error",
    "-32000": "server gone",
    "-32001": "timeout",
}
MIB = 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", required=True, metavar="NAME", help="a configured server")
    parser.add_argument("--tool", required=True, help="the tool to call")
    parser.add_argument(
        "--args", default="{}", metavar="JSON", help="the tool's arguments (default: {})"
    )
    parser.add_argument("--clients", type=int, default=1, metavar="N", help="sessions (default 1)")
    parser.add_argument(
        "--in-flight", type=int, default=1, metavar="K", help="requests in flight per client"
    )
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument("--duration", type=float, metavar="S", help="seconds to measure (10)")
    amount.add_argument("--requests", type=int, metavar="R", help="calls in all, then stop")
    parser.add_argument(
        "--warmup", type=float, default=1.0, metavar="S", help="with --duration: unmeasured start"
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="also run the load straight against the server: launched from the config, "
        "or over Streamable HTTP for a url server",
    )
    parser.add_argument(
        "--era",
        choices=["legacy", "modern"],
        default="legacy",
        help="the clients' protocol era: modern speaks 2026-07-28 (no initialize, "
        "_meta on every call; the broker bridges to a legacy server), as does --direct",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--socket", metavar="PATH", default=None, help="the daemon's socket")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--config", metavar="FILE", default=None, help="with --direct: the config to launch from"
    )
    source.add_argument(
        "--demo",
        action="store_true",
        help="with --direct: launch from the built-in demo configuration (serve --demo)",
    )


def cli(argv: list[str]) -> int:
    return main(parse_args(argv))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mcpbroker bench",
        description="Load-test a configured MCP server through the mcpbroker daemon.",
        epilog="Errors: JSON-RPC error responses are counted by code; tool results with "
        "isError are counted apart as tool errors; unanswered requests are lost.",
    )
    add_arguments(parser)
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> int:
    try:
        arguments = orjson.loads(args.args)
        if not isinstance(arguments, dict):
            raise ValueError("--args must be a JSON object")
        if (
            args.clients < 1
            or args.in_flight < 1
            or (args.requests is not None and args.requests < 1)
        ):
            raise ValueError("--clients, --in-flight and --requests must be at least 1")
        if (args.duration is not None and not args.duration > 0) or not args.warmup >= 0:
            raise ValueError("--duration must be more than 0, and --warmup 0 or more")
        report = run(args, arguments, _progress_printer() if sys.stderr.isatty() else None)
    except (ValueError, BenchError, OSError) as exc:
        print(f"mcpbroker bench: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render(report))
    return 0


def load_of(args: argparse.Namespace, arguments: dict[str, Any], in_flight: int) -> Load:
    if args.requests is not None:
        return Load(in_flight, args.tool, arguments, requests=args.requests)
    duration = 10.0 if args.duration is None else args.duration
    return Load(in_flight, args.tool, arguments, duration=duration, warmup=args.warmup)


def run(
    args: argparse.Namespace,
    arguments: dict[str, Any],
    progress: Any = None,
) -> dict[str, Any]:
    """Run the load (through the daemon, then directly with --direct); the report."""
    from cli.status import fetch_status

    raise_fd_limit(max(WANTED_DESCRIPTORS, 4 * args.clients + 64))
    socket_path = args.socket or default_socket_path()
    try:
        status = fetch_status(socket_path)
    except (OSError, ValueError) as exc:
        raise BenchError(f"no daemon answering on {socket_path}: {exc}") from None
    server = next((s for s in status["servers"] if s["name"] == args.server), None)
    if server is None:
        names = ", ".join(s["name"] for s in status["servers"]) or "none"
        raise ValueError(f"the daemon has no server {args.server!r} (it has: {names})")
    report: dict[str, Any] = {
        "server": args.server,
        "tool": args.tool,
        "arguments": arguments,
        "clients": args.clients,
        "in_flight": args.in_flight,
        "era": args.era,
    }
    direct = _direct_target(args) if args.direct else None  # a bad config fails before the run
    target = Target(socket=socket_path, servers=(args.server,), era=args.era)
    watch: Watch = {
        "daemon": lambda: [status["pid"]],
        "server": partial(_server_pids, socket_path, args.server),
    }
    load = load_of(args, arguments, args.in_flight)
    report["broker"] = _measure([target] * args.clients, load, watch, progress)
    if direct is not None:
        load = load_of(args, arguments, args.in_flight * args.clients)
        watch_client = None if direct.url else "server"  # a server by URL is no child of ours
        try:
            report["direct"] = _measure([direct], load, {}, progress, watch_client=watch_client)
        except BenchError as exc:
            raise BenchError(f"--direct: {exc}{_legacy_hint(direct, str(exc))}") from None
        if direct.url:
            report["direct_url"] = direct.url
    return report


def _direct_target(args: argparse.Namespace) -> Target:
    from broker.config import ConfigError, load_config, parse_config
    from tools.demo import demo_config

    path = "the demo configuration" if args.demo else args.config or default_config_path()
    try:
        config = parse_config(demo_config()) if args.demo else load_config(path)
    except ConfigError as exc:
        raise ValueError(
            f"--direct launches the server itself, from the config the daemon runs: {exc} "
            "(pass --config FILE, or --demo for a daemon started with serve --demo)"
        ) from None
    server = config.enabled_servers.get(args.server)
    if server is not None and server.url is not None:
        return attrs.evolve(_url_target(args.server, server), era=args.era)
    if server is None or not server.command:
        raise ValueError(f"{path} has no server {args.server!r} to launch directly")
    argv = (server.command, *server.args)
    return Target(argv=argv, env=dict(server.env) or None, cwd=server.cwd, era=args.era)


def _url_target(name: str, server: Any) -> Target:
    """A server reached by URL, straight over Streamable HTTP: the config's
    headers with ``${VAR}`` replaced as the daemon does, and the stored OAuth
    token (``mcpbroker auth NAME``) unless the headers carry an Authorization."""
    from broker.wire import http_upstream as rules

    url: str = server.url
    refuse = f"--direct speaks Streamable HTTP only, and server {name!r} is "
    if url.startswith(("ws://", "wss://")):
        raise ValueError(refuse + f"a WebSocket server ({url}): measure it through the daemon")
    try:
        mode = rules.mode_of(server.type)
    except ValueError as exc:
        raise ValueError(f"server {name!r}: {exc}") from None
    if mode == rules.SSE:
        raise ValueError(refuse + 'legacy HTTP+SSE ("type": "sse"): measure it through the daemon')
    try:
        headers = {key: rules.expand(value, os.environ) for key, value in server.headers.items()}
    except rules.MissingVariable as exc:
        raise ValueError(
            f"server {name!r} has headers that use ${{{exc.name}}}, and the environment "
            f"variable {exc.name} is not set here"
        ) from None
    if not any(key.lower() == "authorization" for key in headers):
        token = _stored_token(name)
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
    return Target(url=url, headers=headers or None)


def _legacy_hint(target: Target, error: str) -> str:
    """What a refused initialize may mean when the config names no ``type``: the
    daemon would fall back to HTTP+SSE there (as the spec says), ``--direct`` does not."""
    from broker.wire.http_upstream import FALLBACK_STATUSES

    if target.era == "modern":
        return (
            " (with --era modern, --direct speaks 2026-07-28 to the server itself: if it "
            "does not, measure it through the daemon, which bridges to it)"
        )
    if target.url and any(f"HTTP {status} " in error for status in FALLBACK_STATUSES):
        return (
            " (a legacy HTTP+SSE server answers Streamable HTTP's initialize so; "
            "--direct speaks Streamable HTTP only: measure it through the daemon)"
        )
    return ""


def _stored_token(name: str) -> str | None:
    """The access token ``mcpbroker auth NAME`` stored, if any (used as it is: the
    daemon refreshes it, this command does not)."""
    from actors.oauth import TokenStore
    from broker.oauth import OAuthError

    try:
        grant = TokenStore().load(name)
    except OAuthError as exc:
        raise ValueError(str(exc)) from None
    return None if grant is None else grant.tokens.access_token


def _server_pids(socket_path: str, name: str) -> list[int]:
    """Every process of server ``name`` now (the status's ``pids``): a pool's
    instances, a per-session server's, a per-era server's second one; none
    for a server by URL."""
    from cli.status import fetch_status

    try:
        status = fetch_status(socket_path)
    except (OSError, ValueError):
        return []
    server: dict[str, Any] = next((s for s in status["servers"] if s["name"] == name), {})
    return [pid for pid in server.get("pids") or [server.get("pid")] if pid is not None]


# Who to watch, and how to find their processes when the measured window
# opens and closes: a server's instances may start with the load (a
# per-session server's, a per-era server's for the first modern client).
Watch = dict[str, Callable[[], list[int]]]


def _measure(
    targets: list[Target],
    load: Load,
    watch: Watch,
    progress: Any,
    watch_client: str | None = None,
) -> dict[str, Any]:
    engine = Engine()
    try:
        clients = engine.open(targets)
        if watch_client is not None:
            client = clients[0].pid
            watch = {**watch, watch_client: lambda: [] if client is None else [client]}
        # CPU seconds of each process at each edge of the window, by who it is
        edges: dict[str, dict[str, dict[int, float | None]]] = {}

        def on_window(edge: str) -> None:
            # At the end, the processes read at the start are read first (the
            # daemon's answer to the status that finds the others is not
            # counted), then those that started since, counted from nothing.
            cpu = bench_proc.cpu_seconds
            known = edges.get("start", {}) if edge == "stop" else {}
            read = {name: {pid: cpu(pid) for pid in pids} for name, pids in known.items()}
            for name, find in watch.items():
                seen = read.setdefault(name, {})
                seen.update((pid, cpu(pid)) for pid in find() if pid not in seen)
            edges[edge] = read

        result = engine.run(load, progress=progress, on_window=on_window)
        if progress is not None:
            progress(None)
        pids = {name: list(cpu) for name, cpu in edges.get("stop", {}).items()}
        memory = {name: [bench_proc.memory(pid) for pid in each] for name, each in pids.items()}
    finally:
        engine.close()
    out = result.summary()
    for name, each in pids.items():
        if each:
            out[name] = _processes(each, edges, name, result, memory[name])
    return out


def _processes(
    pids: list[int],
    edges: dict[str, dict[str, dict[int, float | None]]],
    name: str,
    result: Result,
    memory: list[bench_proc.Memory],
) -> dict[str, Any]:
    """What ``name``'s processes used in the window: CPU summed over those
    read at its end (one that started within it from nothing; None if none
    could be read), memory summed over those still there after it."""
    start, stop = edges.get("start", {}).get(name, {}), edges.get("stop", {}).get(name, {})
    used = [after - (start.get(pid) or 0.0) for pid, after in stop.items() if after is not None]
    cpu = sum(used) if used else None
    return {
        "pid": pids[0],
        "pids": pids,
        "cpu_s": cpu,
        "cpu_use": None if cpu is None or not result.elapsed else cpu / result.elapsed,
        "cpu_us_per_call": None if cpu is None or not result.calls else cpu / result.calls * 1e6,
        "memory": _sum_memory(memory).as_dict(),
    }


def _sum_memory(memories: list[bench_proc.Memory]) -> bench_proc.Memory:
    def total(values: list[int | None]) -> int | None:
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    return bench_proc.Memory(
        rss=total([m.rss for m in memories]),
        uss=total([m.uss for m in memories]),
        pss=total([m.pss for m in memories]),
        peak_rss=total([m.peak_rss for m in memories]),
    )


def _progress_printer() -> Any:
    def show(progress: Progress | None) -> None:
        if progress is None:
            sys.stderr.write("\r\033[K")
        else:
            rate = progress.done / progress.elapsed if progress.elapsed > 0 else 0.0
            phase = "" if progress.measuring else " (warming up)"
            sys.stderr.write(
                f"\r\033[K{progress.done:,} calls  {rate:,.0f}/s  {progress.errors:,} errors  "
                f"{progress.elapsed:.1f} s{phase}"
            )
        sys.stderr.flush()

    return show


# -- the table -----------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    paths = [p for p in ("broker", "direct") if p in report]
    head = (
        f"server {report['server']}, tool {report['tool']}: {report['clients']} clients x "
        f"{report['in_flight']} in flight"
    )
    if report.get("era") == "modern":
        head += ", speaking 2026-07-28"
    rows: list[list[str]] = [["", *("through the daemon" if p == "broker" else p for p in paths)]]
    rows.append(["calls", *(f"{report[p]['calls']:,}" for p in paths)])
    rows.append(["calls/s", *(f"{report[p]['throughput']:,.0f}" for p in paths)])
    for key in ("p50", "p90", "p99", "p99.9", "max"):
        rows.append([f"latency {key}", *(_ms(report[p]["latency_us"][key]) for p in paths)])
    rows.append(["ok", *(f"{report[p]['ok']:,}" for p in paths)])
    rows.append(["errors by code", *(_codes(report[p]["errors"]) for p in paths)])
    rows.append(["tool errors (isError)", *(f"{report[p]['tool_errors']:,}" for p in paths)])
    rows.append(["lost", *(f"{report[p]['lost']:,}" for p in paths)])
    for who in ("server", "daemon"):
        rows.append([f"{who} CPU", *(_cpu(report[p].get(who)) for p in paths)])
        rows.append([f"{who} memory", *(_memory(report[p].get(who)) for p in paths)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [head, ""]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    for path in paths:
        first = report[path].get("first_error")
        if first:
            where = "through the daemon" if path == "broker" else path
            lines += ["", f"first error ({where}): {first}"]
    if "direct" in report:
        how = (
            f"one Streamable HTTP session to {report['direct_url']}, every request on a "
            "keep-alive connection of its own"
            if "direct_url" in report
            else "one server process launched by this command, every request on its stdio"
        )
        lines += ["", f"direct: {how}"]
    return "\n".join(lines)


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1000:.3f} ms"


def _codes(errors: dict[str, int]) -> str:
    if not errors:
        return "0"
    return ", ".join(
        f"{code} {CODE_NAMES.get(code, '')}".rstrip() + f": {n:,}" for code, n in errors.items()
    )


def _cpu(process: dict[str, Any] | None) -> str:
    if not process or process["cpu_s"] is None:
        return "-"
    return (
        f"{process['cpu_s']:.2f} s ({process['cpu_use']:.0%} of a core, "
        f"{process['cpu_us_per_call']:.0f} µs/call)"
        if process["cpu_us_per_call"] is not None
        else f"{process['cpu_s']:.2f} s"
    )


def _memory(process: dict[str, Any] | None) -> str:
    if not process or process["memory"]["rss"] is None:
        return "-"
    memory = process["memory"]
    text = f"RSS {memory['rss'] / MIB:.1f} MiB"
    if memory["peak_rss"]:
        text += f" (peak {memory['peak_rss'] / MIB:.1f})"
    if memory["uss"]:
        text += f", USS {memory['uss'] / MIB:.1f} MiB"
    if len(process.get("pids") or ()) > 1:
        text += f", {len(process['pids'])} processes"
    return text
