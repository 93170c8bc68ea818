"""An official-SDK MCP server that offers its main tool only some time after
``notifications/initialized``, as some real servers do (they register tools
once they know their client). For the readiness test of per-session servers.

Run as ``python -m tests.servers.late_server``; ``LATE_DELAY`` (seconds,
default 0.3) is how long after ``notifications/initialized`` the tool
``late`` appears (announced with ``notifications/tools/list_changed``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp import types
from mcp.server.mcpserver import MCPServer

DELAY = float(os.environ.get("LATE_DELAY", "0.3"))


@asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[Any]:
    async with anyio.create_task_group() as tasks:
        yield tasks
        tasks.cancel_scope.cancel()


server = MCPServer("late", lifespan=lifespan)


@server.tool()
def pid() -> int:
    """The process id of the server (offered from the start)."""
    return os.getpid()


async def register_later(session: Any) -> None:
    await anyio.sleep(DELAY)

    def late() -> int:
        """Offered only after notifications/initialized (and a delay)."""
        return os.getpid()

    server.add_tool(late, name="late")
    await session.send_tool_list_changed()


async def on_initialized(ctx: Any, params: Any) -> None:
    ctx.lifespan_context.start_soon(register_later, ctx.session)


server._lowlevel_server.add_notification_handler(  # the SDK's way to hook it
    "notifications/initialized", types.NotificationParams, on_initialized
)

if __name__ == "__main__":
    server.run()
