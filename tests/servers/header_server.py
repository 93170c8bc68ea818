"""An SDK server with a tool whose parameter is mirrored into an HTTP header.

Run as ``python -m tests.servers.header_server``. ``where(region, query)``
marks ``region`` with ``x-mcp-header: Region``, so a 2026-07-28 client over
Streamable HTTP sends it as ``Mcp-Param-Region`` too (broker/wire/param_headers.py).
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field

server = MCPServer("header-server")


@server.tool()
def where(
    region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], query: str
) -> str:
    """Say where a query ran."""
    return f"{query} in {region}"


if __name__ == "__main__":
    server.run()
