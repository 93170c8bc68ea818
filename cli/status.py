"""``mcpbroker status``: ask a running daemon what it is doing.

Standard library only. Sends the control hello ``{"mcpbroker": {"command":
"status"}}`` and prints the one line of JSON the daemon answers with, as a
table or (``--json``) as it is.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any


def fetch_status(socket_path: str, timeout: float = 5.0) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(b'{"mcpbroker":{"command":"status"}}\n')
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status: dict[str, Any] = json.loads(data)
    return status


def main(socket_path: str, as_json: bool) -> int:
    try:
        status = fetch_status(socket_path)
    except (OSError, ValueError) as exc:
        print(f"mcpbroker status: no daemon answering on {socket_path}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(status, indent=2))
    else:
        print(render(status))
    return 0


def render(status: dict[str, Any]) -> str:
    lines = [
        f"mcpbroker daemon pid {status['pid']} on {status['socket']}, "
        f"up {_duration(status['uptime'])}, rules {status.get('rules', '?')}, "
        f"started {started_by(status)}",
        *([f"WebSocket: {status['websocket']}"] if status.get("websocket") else []),
        "",
    ]
    servers = [
        [
            s["name"],
            _status(s),
            s["pid"] or "-",
            s["restarts"],
            s["sessions"],
            s["in_flight"],
            s["requests"],
            s["timeouts"],
            s["last_error"] or "-",
        ]
        for s in status["servers"]
    ]
    header = [
        "SERVER",
        "STATUS",
        "PID",
        "RESTARTS",
        "SESSIONS",
        "IN-FLIGHT",
        "REQUESTS",
        "TIMEOUTS",
        "LAST ERROR",
    ]
    lines += _table(header, servers)
    sessions = [
        [
            s["id"],
            ",".join(s["view"]) or "-",
            s["protocol_version"] or "-",
            _client_name(s["client"]),
            s["in_flight"],
            _duration(s["age"]),
        ]
        for s in status["sessions"]
    ]
    lines += ["", *_table(["SESSION", "VIEW", "VERSION", "CLIENT", "IN-FLIGHT", "AGE"], sessions)]
    return "\n".join(lines)


STARTERS = {"shim": "by mcpbroker connect", "service": "by the service manager", "hand": "by hand"}


def started_by(status: dict[str, Any]) -> str:
    """How the daemon was started, in words ("by hand", "by the service manager
    (socket-activated)"); "by ?" for a daemon too old to say."""
    words = STARTERS.get(status.get("started_by", ""), "by ?")
    return words + (" (socket-activated)" if status.get("socket_activated") else "")


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


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    if not rows:
        return [header[0] + ": none"]
    cells = [header, *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]
