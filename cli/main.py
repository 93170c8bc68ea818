"""The ``mcpbroker`` command line.

``mcpbroker connect`` is dispatched before anything else is imported: it is
the shim hosts launch once per window and must stay standard-library only.
Everything else (the daemon) imports Trio and friends lazily.
"""

from __future__ import annotations

import sys

from actors.paths import default_socket_path

# (typing's import is 3 ms of every shim's start: the type checkers read
# this flag by its name, PEP 781's idiom, and Python never runs the import)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--version"], ["-V"]):
        from importlib.metadata import version

        print(f"mcpbroker {version('mcpbroker')}")
        return 0
    if argv[:1] == ["connect"]:
        from cli import shim

        return shim.main(argv[1:])
    if argv[:1] == ["bench"]:
        from cli import bench

        return bench.cli(argv[1:])
    if argv[:1] == ["service"]:
        from cli import service

        return service.main(argv[1:])
    if argv[:1] == ["auth"]:
        from cli import auth

        return auth.main(argv[1:])
    if argv[:1] in (["install"], ["uninstall"], ["import"]):
        from cli import install

        return install.main(argv[0], argv[1:])
    if argv[:1] == ["logs"]:
        from cli import logs

        return logs.main(argv[1:])
    return _main(argv)


def _status(args: Any) -> int:
    from cli import status

    return status.main(args.socket or default_socket_path(), args.json, args.watch)


def _reload(args: Any) -> int:
    from cli import reload

    return reload.main(args.socket or default_socket_path(), args.json)


def _main(argv: list[str]) -> int:
    import argparse

    from actors.logs import LEVELS

    parser = argparse.ArgumentParser(
        prog="mcpbroker", description="Share MCP servers among many MCP clients."
    )
    parser.add_argument("-V", "--version", action="store_true", help="print the version")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the daemon")
    source = serve.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", metavar="FILE", help="mcpServers JSON config file")
    source.add_argument(
        "--demo",
        action="store_true",
        help="serve the built-in demo configuration (one demo server)",
    )
    serve.add_argument(
        "--socket",
        metavar="PATH",
        default=None,
        help=f"unix socket to listen on (default: {default_socket_path()})",
    )
    serve.add_argument(
        "--ws",
        metavar="HOST:PORT",
        default=None,
        help="also serve WebSocket at ws://HOST:PORT/mcp and /mcp/NAME "
        "(overrides broker.websocket; HOST defaults to 127.0.0.1)",
    )
    serve.add_argument(
        "--http",
        metavar="HOST:PORT",
        default=None,
        help="also serve Streamable HTTP at http://HOST:PORT/mcp and /mcp/NAME "
        "(overrides broker.http; HOST defaults to 127.0.0.1)",
    )
    serve.add_argument(
        "--token-file",
        metavar="FILE",
        default=None,
        help="a file holding the bearer token WebSocket and HTTP clients must send "
        "(overrides broker.tokenFile; required off loopback)",
    )
    serve.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        default=None,
        help="serve Prometheus metrics at http://HOST:PORT/metrics "
        "(overrides broker.metrics; HOST defaults to 127.0.0.1)",
    )
    serve.add_argument("--log-level", choices=LEVELS, default="info")
    serve.add_argument(
        "--log-format",
        choices=("auto", "console", "json"),
        default="auto",
        help="auto: human-readable on a terminal, JSON otherwise",
    )
    serve.add_argument(
        "--log-file",
        metavar="PATH",
        default=None,
        help="write JSON lines to PATH instead of stderr; it rotates at 10 MiB, keeping 3",
    )
    commands.add_parser("connect", help="stdio shim for MCP hosts (see 'mcpbroker connect --help')")
    commands.add_parser("demo-config", help="print the built-in demo configuration")
    commands.add_parser("bench", help="load-test a server (see 'mcpbroker bench --help')")
    commands.add_parser(
        "service", help="run the daemon as a systemd or launchd service (install, uninstall)"
    )
    commands.add_parser(
        "auth", help="authorize the broker at a remote server that asks for OAuth (auth NAME)"
    )
    commands.add_parser(
        "install", help="move an MCP host's servers here and point the host at mcpbroker"
    )
    commands.add_parser("uninstall", help="put an MCP host's config back as it was")
    commands.add_parser("import", help="add the servers of a host's config file to mcpbroker's")
    commands.add_parser(
        "logs", help="print the daemon's log, filtered (see 'mcpbroker logs --help')"
    )
    status = commands.add_parser("status", help="show a running daemon's servers and sessions")
    status.add_argument("--socket", metavar="PATH", default=None)
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.add_argument(
        "--watch",
        metavar="SECONDS",
        type=_watch_seconds,
        nargs="?",
        const=2.0,
        default=None,
        help="print it again every SECONDS (default 2, at least 0.1) until interrupted",
    )
    reload = commands.add_parser(
        "reload", help="make a running daemon read its configuration again (as SIGHUP does)"
    )
    reload.add_argument("--socket", metavar="PATH", default=None)
    reload.add_argument("--json", action="store_true", help="print the raw JSON answer")
    args = parser.parse_args(argv)
    if args.command == "status":
        return _status(args)
    if args.command == "reload":
        return _reload(args)
    if args.command == "demo-config":
        import json

        from tools.demo import demo_config

        print(json.dumps(demo_config(), indent=2))
        return 0
    return _serve(args)


WATCH_MIN = 0.1  # seconds: `--watch 0` polled the daemon as fast as it could


def _watch_seconds(text: str) -> float:
    """``status --watch``'s SECONDS: a usage error (exit 2) unless a finite
    number of at least WATCH_MIN (-1 and nan were a traceback)."""
    import argparse
    import math

    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= WATCH_MIN):
        raise argparse.ArgumentTypeError(f"must be a number of seconds, at least {WATCH_MIN:g}")
    return seconds


def _serve(args: Any) -> int:
    import trio

    from actors.downstream.unix import ConfigRefused, StartError
    from actors.logs import RotatingLog, configure_logging, get_logger
    from actors.paths import UnsafePath, default_socket_path
    from broker.config import (
        ConfigError,
        load_config,
        parse_config,
        with_listeners,
        with_metrics,
    )
    from cli.limits import raise_fd_limit

    json_logs = {"auto": None, "console": False, "json": True}[args.log_format]
    try:
        stream = RotatingLog(args.log_file) if args.log_file else None
    except (UnsafePath, OSError) as exc:
        print(f"mcpbroker: cannot write the log file {args.log_file}: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level, stream=stream, json=json_logs)
    log = get_logger()

    first_read = True

    def load() -> Any:
        """The configuration (read again by a reload: then a regular file
        only), with the command line's options."""
        from tools.demo import demo_config

        nonlocal first_read
        again, first_read = not first_read, False
        if args.demo:
            config = parse_config(demo_config())
        else:
            config = load_config(args.config, regular_only=again)
        config = with_listeners(config, args.ws, args.token_file, args.http)
        return with_metrics(config, args.metrics)

    try:
        config = load()
    except ConfigError as exc:
        print(f"mcpbroker: {exc}", file=sys.stderr)
        return 2
    for warning in config.warnings:  # (where the user sees them; the log has them too)
        print(f"mcpbroker: warning: {warning}", file=sys.stderr)
    socket_path = args.socket or default_socket_path()
    _tune_gc()
    raise_fd_limit()  # (a connection each client, pipes each server: 1024 is few)
    try:
        trio.run(_run_daemon, config, socket_path, load, _listener_flags(args))
    except BaseExceptionGroup as group:  # (from the nursery the daemon runs in)
        refused, rest = group.split((StartError, UnsafePath))
        if refused is None or rest is not None:
            raise
        first = _first_leaf(refused)
        print(f"mcpbroker: {first}", file=sys.stderr)
        return 2 if isinstance(first, ConfigRefused) else 1
    except (StartError, UnsafePath) as exc:
        print(f"mcpbroker: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigRefused) else 1  # (a restart would not mend it)
    log.info("daemon.stopped")
    return 0


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first exception in a (nested) exception group."""
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


# Container allocations between two young-generation collections (CPython's
# default is 700). Every message the daemon relays is a few dicts freed by
# reference counting, never part of a cycle, yet each counts towards the next
# collection: at the default, collections that found nothing took a busy
# daemon 10-20% of its CPU (benchmarks/README.md). Cycles (from exceptions,
# mostly) are still collected, just less often.
GC_YOUNG_THRESHOLD = 50_000


def _tune_gc() -> None:
    """Collect less often, and never look at what start-up left (modules, config)."""
    import gc

    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def _listener_flags(args: Any) -> list[str]:
    """``serve``'s listener options as given (pairs), recorded beside the
    socket for a daemon a shim starts in its place (actors/paths.py)."""
    import os

    given = [
        ("--ws", args.ws),
        ("--http", args.http),
        ("--token-file", args.token_file and os.path.abspath(args.token_file)),
        ("--metrics", args.metrics),
    ]
    if any("\n" in value for _flag, value in given if value):
        return []  # (not recordable as lines: such a value serves no listener anyway)
    return [item for flag, value in given if value for item in (flag, value)]


async def _run_daemon(
    config: Any, socket_path: str, load: Any = None, listeners: list[str] | None = None
) -> None:
    """Serve until SIGTERM or SIGINT: the first drains (Daemon.shut_down), a
    second stops at once. SIGHUP reloads the configuration. ``listeners``
    (its command line's) are recorded beside the socket while it serves,
    and forgotten when it stops cleanly."""
    import signal

    import trio

    from actors.daemon import Daemon
    from actors.logs import get_logger
    from actors.paths import forget_listeners, record_listeners

    daemon = Daemon(config, socket_path, load)
    log = get_logger()

    async def drain_and_stop(nursery: trio.Nursery) -> None:
        await daemon.shut_down()
        forget_listeners(daemon.socket_path)  # (a clean stop; a crash leaves the record)
        nursery.cancel_scope.cancel()

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            try:
                record_listeners(daemon.socket_path, listeners or [])
            except OSError as exc:  # (and UnsafePath)
                log.warning("daemon.listeners_not_recorded", detail=str(exc))
            stopping = False
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum == signal.SIGHUP:
                    log.info("daemon.reload_requested", signal=name)
                    # (a task: the signals are still heard while it reads the file;
                    # it logs what it did, or why it refused)
                    nursery.start_soon(daemon.reload_file)
                elif not stopping:
                    log.info("daemon.stopping", signal=name)
                    stopping = True
                    nursery.start_soon(drain_and_stop, nursery)
                else:
                    log.info("daemon.stopping_now", signal=name)
                    forget_listeners(daemon.socket_path)
                    nursery.cancel_scope.cancel()
                    break


if __name__ == "__main__":
    sys.exit(main())
