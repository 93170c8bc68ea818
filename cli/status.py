"""``mcpbroker status``: ask a running daemon what it is doing.

Sends the control hello ``{"mcpbroker": {"command": "status"}}`` and prints
the one line of JSON the daemon answers with, as tables (rich) or
(``--json``) as it is; ``--watch`` repeats it. :func:`fetch_status` is
standard library only (``mcpbroker bench`` uses it too).
"""

from __future__ import annotations

import io
import json
import sys
import time
from typing import Any

from cli.control import ask


def fetch_status(socket_path: str, timeout: float = 5.0) -> dict[str, Any]:
    return ask(socket_path, "status", timeout)


def main(socket_path: str, as_json: bool, watch: float | None = None) -> int:
    """Print the daemon's status once, or (``watch``: every so many seconds)
    until interrupted."""
    while True:
        try:
            status = fetch_status(socket_path)
        except (OSError, ValueError) as exc:
            print(f"mcpbroker status: no daemon answering on {socket_path}: {exc}", file=sys.stderr)
            return 1
        if as_json:
            print(json.dumps(status, indent=2), flush=True)
        elif watch is not None and sys.stdout.isatty():
            print("\x1b[H\x1b[2J" + render(status), flush=True)  # (home, clear)
        else:
            print(render(status), flush=True)
        if watch is None:
            return 0
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            return 0


def _pid(server: dict[str, Any]) -> str:
    """The catalog instance's process, and how many other instances run
    (``4242 +2``); a remote server's URL."""
    if server["pid"] is None:
        return str(server.get("url") or "-")
    others = len(server.get("pids") or ()) - 1
    return f"{server['pid']} +{others}" if others > 0 else str(server["pid"])


STOPPING = (
    "stopping: the requests in flight get broker.shutdownTimeout to finish, "
    "new ones are refused; then it exits"
)


def render(status: dict[str, Any], width: int | None = None) -> str:
    """The status as text: a line about the daemon, its totals, a table of
    servers and one of sessions (rich tables, without borders)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    servers, sessions = status["servers"], status["sessions"]
    # (the old processes a reload removed or restarted, still answering)
    draining = status.get("draining") or []
    waiting = sum(s.get("waiting", 0) for s in servers)  # (held by the turns gate: unsent)
    lines = [
        f"mcpbroker daemon pid {status['pid']} on {status['socket']}, "
        f"up {_duration(status['uptime'])}, rules {status.get('rules', '?')}, "
        f"started {started_by(status)}",
        *([carried_over(status["listeners_from"])] if status.get("listeners_from") else []),
        *([STOPPING] if status.get("stopping") else []),
        *([f"WebSocket: {status['websocket']}"] if status.get("websocket") else []),
        *([f"HTTP: {status['http']}"] if status.get("http") else []),
        *([f"Metrics: {status['metrics']}"] if status.get("metrics") else []),
        f"{len(servers)} servers"
        f"{f' (+{len(draining)} draining after a reload)' if draining else ''}, "
        f"{len(sessions)} sessions, "
        f"{sum(s['in_flight'] for s in (*servers, *draining))} requests in flight, "
        f"{f'{waiting} waiting for their turn, ' if waiting else ''}"
        f"{sum(s['requests'] for s in servers)} sent, "
        f"{sum(s.get('errors', 0) for s in servers)} errors",
        "",
    ]
    server_table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in SERVER_COLUMNS:
        server_table.add_column(column, no_wrap=True)
    for s in (*servers, *draining):
        server_table.add_row(
            s["name"],
            _status(s),
            _share(s),
            _pid(s),
            _duration(s["uptime"]) if s.get("uptime") is not None else "-",
            str(s["restarts"]),
            str(s["sessions"]),
            _in_flight(s["in_flight"], s.get("waiting", 0)),
            str(s["requests"]),
            str(s.get("errors", s["timeouts"])),
            f"{s['cpu']:.1f}s" if s.get("cpu") is not None else "-",
            _bytes(s.get("rss")),
            s["last_error"] or "-",
        )
    session_table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in SESSION_COLUMNS:
        session_table.add_column(column, no_wrap=True)
    for s in sessions:
        session_table.add_row(
            str(s["id"]),
            _client_name(s["client"]),
            s.get("transport", "-"),
            ",".join(s["view"]) or "-",
            s["protocol_version"] or "-",
            str(s["in_flight"]),
            f"{s['outbox']} ({_bytes(s.get('queued_bytes'))})",
            _duration(s["age"]),
        )
    console = Console(width=width or 400, record=True, file=io.StringIO(), color_system=None)
    for table, what in ((server_table, "servers"), (session_table, "sessions")):
        if table.row_count:
            console.print(table)
        else:
            console.print(f"no {what}")
    text = console.export_text(styles=False)
    return "\n".join(lines) + "\n" + "\n".join(line.rstrip() for line in text.splitlines())


SERVER_COLUMNS = (
    "SERVER",
    "STATUS",
    "SHARE",
    "PID",
    "UP",
    "RESTARTS",
    "SESSIONS",
    "IN-FLIGHT",
    "REQUESTS",
    "ERRORS",
    "CPU",
    "RSS",
    "LAST ERROR",
)
SESSION_COLUMNS = (
    "SESSION",
    "CLIENT",
    "TRANSPORT",
    "VIEW",
    "VERSION",
    "IN-FLIGHT",
    "QUEUED",
    "AGE",
)


def _share(server: dict[str, Any]) -> str:
    share = server.get("share", "shared")
    instances = server.get("instances", 1)
    return share if share == "shared" else f"{share} x{instances}"


def _bytes(count: int | None) -> str:
    if count is None:
        return "-"
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return f"{count:.1f} GiB"


STARTERS = {"shim": "by mcpbroker connect", "service": "by the service manager", "hand": "by hand"}


def started_by(status: dict[str, Any]) -> str:
    """How the daemon was started, in words ("by hand", "by the service manager
    (socket-activated)"); "by ?" for a daemon too old to say."""
    words = STARTERS.get(status.get("started_by", ""), "by ?")
    return words + (" (socket-activated)" if status.get("socket_activated") else "")


def carried_over(origin: dict[str, Any]) -> str:
    """The line saying that the daemon's command-line listeners are those of
    a daemon that went away, which the shim that started it carried over
    (docs/hosts.md, "Listeners after a restart")."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(origin["gone_by"]))
    pid = origin.get("pid")
    return (
        f"listeners carried over from the daemon that stopped by {when}"
        + (f" (pid {pid})" if pid else "")
        + ": it did not stop cleanly"
    )


def _in_flight(sent: int, waiting: int) -> str:
    """Requests at a server, and those held for their turn (``serverRequests``:
    not sent yet), if any: ``3`` or ``3 (+2 waiting)``."""
    return f"{sent} (+{waiting} waiting)" if waiting else str(sent)


def _status(server: dict[str, Any]) -> str:
    """The status word, and the state behind it where that says more
    (``down (restarting)``, ``starting (initializing)``)."""
    status, state = server["status"], server.get("state")
    return status if state in (None, status) else f"{status} ({state})"


def _client_name(info: Any) -> str:
    if isinstance(info, dict) and info.get("name"):
        return f"{info['name']} {info.get('version', '')}".strip()
    return "-"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
