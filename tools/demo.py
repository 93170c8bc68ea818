"""The built-in demo configuration: one demo server (tools/demo_server.py).

``mcpbroker serve --demo`` and ``mcpbroker bench --demo`` use it; standard
library only.
"""

from __future__ import annotations

import sys
from typing import Any

DEMO_SERVER_NAME = "demo"


def demo_config() -> dict[str, Any]:
    return {
        "mcpServers": {
            DEMO_SERVER_NAME: {"command": sys.executable, "args": ["-P", "-m", "tools.demo_server"]}
        }
    }
