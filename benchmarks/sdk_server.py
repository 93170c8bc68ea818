"""An echo server built on the official MCP Python SDK: a typical real server.

The harness uses it to compare memory and start-up time with what hosts
launch today (an SDK server per client) against shims sharing one copy, and,
over Streamable HTTP, as the server hosts reach by URL (the ``http``
scenario). Run as ``python benchmarks/sdk_server.py`` (stdio) or
``python benchmarks/sdk_server.py --http`` (Streamable HTTP at
``http://127.0.0.1:PORT/mcp``, the SDK's ASGI app under uvicorn with the
SDK's defaults, as ``MCPServer.run(transport="streamable-http")`` serves it:
answers as SSE streams, sessions kept). With ``--http`` it binds a free port
itself and prints the URL as its first line on stdout once it listens.
It logs warnings only (the SDK's default would log every request).
"""

from __future__ import annotations

import logging
import socket
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench-sdk-echo")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


def serve_http() -> None:
    import anyio
    import uvicorn

    logging.getLogger("mcp").setLevel(logging.WARNING)  # not a line per session

    # IPPROTO_TCP, as uvicorn's own bind gets it from getaddrinfo: asyncio sets
    # TCP_NODELAY only on sockets that say so (else every SSE event waits ~40 ms
    # for the client's delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    port = sock.getsockname()[1]
    app = server.streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning", backlog=2048)
    # Connections made before uvicorn serves wait in the listening socket's backlog.
    print(f"http://127.0.0.1:{port}/mcp", flush=True)
    anyio.run(uvicorn.Server(config).serve, [sock])


if __name__ == "__main__":
    if sys.argv[1:] == ["--http"]:
        serve_http()
    else:
        server.run()
