"""Control commands to a running daemon (``mcpbroker status``, ``reload``).

Standard library only. A control connection sends one hello line,
``{"mcpbroker": {"command": NAME}}`` (broker/hello.py), and reads the one
line of JSON the daemon answers before it closes the connection.
"""

from __future__ import annotations

import json
import socket
from typing import Any


def ask(socket_path: str, command: str, timeout: float) -> dict[str, Any]:
    """The daemon's answer to a control command; OSError or ValueError if none."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(json.dumps({"mcpbroker": {"command": command}}).encode() + b"\n")
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    answer: dict[str, Any] = json.loads(data)
    return answer
