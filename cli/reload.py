"""``mcpbroker reload``: make a running daemon read its configuration again.

Sends the control hello ``{"mcpbroker": {"command": "reload"}}`` (SIGHUP to
the daemon does the same) and prints the daemon's answer: the servers it
added, removed, restarted or updated, the settings it applied and those that
wait for a restart of the daemon, and the new file's warnings; or why it
refused the new configuration (exit code 1; the old one goes on serving).
Standard library only, like ``mcpbroker status``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from cli.control import ask

# A reload answers at once (the servers start and stop in the background).
TIMEOUT = 30.0


def request_reload(socket_path: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    return ask(socket_path, "reload", timeout)


def main(socket_path: str, as_json: bool = False) -> int:
    try:
        answer = request_reload(socket_path)
    except (OSError, ValueError) as exc:
        print(f"mcpbroker reload: no daemon answering on {socket_path}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(answer, indent=2))
        return 0 if "reloaded" in answer else 1
    if "reloaded" not in answer:
        error = answer.get("error", answer)
        print(
            f"mcpbroker reload: refused, the configuration in use is unchanged: {error}",
            file=sys.stderr,
        )
        return 1
    print(render(answer["reloaded"]))
    for warning in answer["reloaded"].get("warnings", ()):
        print(f"mcpbroker reload: warning: {warning}", file=sys.stderr)
    return 0


def render(report: dict[str, Any]) -> str:
    """The report in lines: what changed, and what did not take effect."""
    lines = []
    for key, words in (
        ("added", "started"),
        ("removed", "stopped (after their requests in flight)"),
        ("restarted", "restarted (after their requests in flight)"),
        ("updated", "updated in place"),
    ):
        if report.get(key):
            lines.append(f"servers {words}: {', '.join(report[key])}")
    if report.get("applied"):
        lines.append(f"settings applied: {', '.join(report['applied'])}")
    if report.get("not_applied"):
        lines.append(
            f"not applied, they need a restart of the daemon: {', '.join(report['not_applied'])}"
        )
    return "\n".join(lines) or "no change"
