"""Control commands to a running daemon (``mcpbroker status``, ``reload``).

Standard library only. A control connection sends one hello line,
``{"mcpbroker": {"command": NAME}}`` (broker/hello.py), and reads the one
line of JSON the daemon answers before it closes the connection.
"""

from __future__ import annotations

import json
import socket
from typing import Any


def ask(
    socket_path: str, command: str, timeout: float, servers: list[str] | None = None
) -> dict[str, Any]:
    """The daemon's answer to a control command (about ``servers``, if
    given); OSError or ValueError if none."""
    hello: dict[str, Any] = {"command": command}
    if servers is not None:
        hello["servers"] = servers
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(json.dumps({"mcpbroker": hello}).encode() + b"\n")
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    answer: dict[str, Any] = json.loads(data)
    return answer
