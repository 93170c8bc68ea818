"""A real MCP server built with the official Python SDK, for end-to-end tests.

Run as ``python -m tests.servers.sdk_server``. Its ``pid`` tool proves which
process served a call; ``slow`` sleeps (reporting progress) so a test can kill
the server mid-request.
"""

from __future__ import annotations

import os

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer(os.environ.get("SDK_SERVER_NAME", "sdk-test-server"))


@server.tool()
def pid() -> int:
    """The process id of the server."""
    return os.getpid()


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
async def slow(seconds: float, ctx: Context) -> str:
    """Sleep, reporting progress every 0.1 s."""
    steps = max(1, int(seconds * 10))
    for step in range(1, steps + 1):
        await anyio.sleep(seconds / steps)
        await ctx.report_progress(step, steps)
    return f"slept {seconds}"


@server.resource("test://hello")
def hello() -> str:
    return "hello from the sdk server"


@server.prompt()
def review(code: str) -> str:
    return f"Please review: {code}"


if __name__ == "__main__":
    server.run()
