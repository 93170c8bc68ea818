"""Where things live by default: the daemon's socket and the config file.

Standard library only: the ``connect`` shim imports this module.
"""

from __future__ import annotations

import os

SOCKET_ENV = "MCPBROKER_SOCKET"
CONFIG_ENV = "MCPBROKER_CONFIG"
SOCKET_NAME = "mcpbroker.sock"


def default_socket_path() -> str:
    """``$MCPBROKER_SOCKET``, else ``$XDG_RUNTIME_DIR/mcpbroker/``, else a per-user temp dir."""
    explicit = os.environ.get(SOCKET_ENV)
    if explicit:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "mcpbroker", SOCKET_NAME)
    temp = os.environ.get("TMPDIR") or "/tmp"
    return os.path.join(temp, f"mcpbroker-{os.getuid()}", SOCKET_NAME)


def default_config_path() -> str:
    """``$MCPBROKER_CONFIG``, else ``$XDG_CONFIG_HOME/mcpbroker/config.json``."""
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "mcpbroker", "config.json")


def log_path_for(socket_path: str) -> str:
    """Where a daemon started by the shim writes its log."""
    return socket_path + ".log"


def ensure_private_dir(path: str) -> None:
    """Create the socket's directory, readable by this user alone."""
    os.makedirs(path, mode=0o700, exist_ok=True)
