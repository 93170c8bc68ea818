"""An echo server built on the official MCP Python SDK: a typical real server.

The harness uses it only to compare memory and start-up time with what hosts
launch today (an SDK server per client) against shims sharing one copy. Run
as ``python benchmarks/sdk_server.py`` (stdio).
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench-sdk-echo")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


if __name__ == "__main__":
    server.run()
