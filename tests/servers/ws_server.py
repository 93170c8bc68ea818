"""A WebSocket MCP server, for the tests of WebSocket links (trio-websocket).

One JSON-RPC message per text frame, subprotocol ``mcp``; each connection is
its own MCP session. Run it as ``python -m tests.servers.ws_server --port 0
--port-file F`` (it writes the port it bound to F), or in a test's nursery:
``port = await nursery.start(server.run)``, then look at what it saw
(:attr:`WsServer.connections`, :attr:`WsServer.calls`, ...).

Tools: ``echo`` (its arguments back, as JSON text, with the number of the
connection that answered); ``slow {seconds}`` (sleeps, with
``notifications/progress`` every 0.1 s when the call has a progress token;
a cancelled call is recorded and never answered); ``whoami`` (the
``Authorization`` header of the connection's handshake); ``payload {size}``
(a text of ``size`` x's, or of ``char``'s); ``burst {count}`` (``count``
progress notifications at once, then the answer); ``crash`` (drops the TCP connection at once, no
close frame, as a dying server would).

With ``token`` set, a handshake without ``Authorization: Bearer TOKEN`` is
refused (HTTP 401).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
from typing import Any

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket
from wsproto.events import TextMessage

# As the SDKs write JSON (the broker reads the id of an answer too large to
# take from its ends only in this shape: broker/wire/envelope.py).
COMPACT = (",", ":")
VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
TOOLS = [
    {"name": name, "description": f"The {name} tool.", "inputSchema": {"type": "object"}}
    for name in ("echo", "slow", "whoami", "payload", "burst", "crash")
]


class WsServer:
    def __init__(self, name: str = "ws-test-server", token: str | None = None) -> None:
        self.name = name
        self.token = token
        self.connections = 0  # accepted so far
        self.open = 0  # open now
        self.authorization: list[str | None] = []  # each connection's Authorization header
        self.calls: list[tuple[int, Any, str]] = []  # (connection, request id, tool)
        self.progress_tokens: list[Any] = []  # of the calls that had one
        self.cancelled: list[Any] = []  # request ids of cancelled calls that were running
        self._scope = trio.CancelScope()

    async def run(self, port: int = 0, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on 127.0.0.1:``port`` until stopped; started with the port bound."""
        with self._scope:
            async with trio.open_nursery() as nursery:
                serve = functools.partial(serve_websocket, self.handle, "127.0.0.1", port, None)
                server = await nursery.start(serve)
                task_status.started(server.port)

    def stop(self) -> None:
        """Stop listening and drop every connection, as a server that dies."""
        self._scope.cancel()

    async def handle(self, request: WebSocketRequest) -> None:
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        authorization = headers.get("authorization")
        if self.token is not None and authorization != f"Bearer {self.token}":
            await request.reject(401, body=b"a bearer token is required")
            return
        if "mcp" not in request.proposed_subprotocols:
            await request.reject(400, body=b"subprotocol mcp is required")
            return
        ws = await request.accept(subprotocol="mcp")
        self.connections += 1
        self.authorization.append(authorization)
        self.open += 1
        try:
            await Connection(self, ws, self.connections, authorization).serve()
        finally:
            self.open -= 1


class Connection:
    """One MCP session: each request answered in a task of its own."""

    def __init__(
        self, server: WsServer, ws: WebSocketConnection, number: int, authorization: str | None
    ) -> None:
        self.server = server
        self.ws = ws
        self.number = number
        self.authorization = authorization
        self.running: dict[Any, trio.CancelScope] = {}  # request id -> its task's scope

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    message = json.loads(await self.ws.get_message())
                except ConnectionClosed:
                    break
                if "method" not in message:
                    continue  # a response (none expected)
                if "id" in message:
                    nursery.start_soon(self.answer, message)
                elif message["method"] == "notifications/cancelled":
                    scope = self.running.get(message["params"]["requestId"])
                    if scope is not None:
                        scope.cancel()
            nursery.cancel_scope.cancel()

    async def send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(ConnectionClosed):  # (the answer's caller is gone)
            await self.ws.send_message(
                json.dumps({"jsonrpc": "2.0", **message}, separators=COMPACT, ensure_ascii=False)
            )

    async def answer(self, request: dict[str, Any]) -> None:
        id, method, params = request["id"], request["method"], request.get("params") or {}
        with trio.CancelScope() as scope:
            self.running[id] = scope
            try:
                reply = await self.reply(id, method, params)
            finally:
                del self.running[id]
            if reply is not None:
                await self.send({"id": id, **reply})
        if scope.cancelled_caught:
            self.server.cancelled.append(id)

    async def reply(self, id: Any, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        if method == "initialize":
            version = params.get("protocolVersion")
            return result(
                {
                    "protocolVersion": version if version in VERSIONS else VERSIONS[-1],
                    "capabilities": {"tools": {"listChanged": True}},
                    "serverInfo": {"name": self.server.name, "version": "1.0"},
                }
            )
        if method == "ping":
            return result({})
        if method == "tools/list":
            return result({"tools": TOOLS})
        if method != "tools/call":
            return {"error": {"code": -32601, "message": f"Method not found: {method}"}}
        name, arguments = params.get("name"), params.get("arguments") or {}
        self.server.calls.append((self.number, id, str(name)))
        if name == "echo":
            return text(json.dumps({"echo": arguments, "connection": self.number}))
        if name == "whoami":
            return text(self.authorization or "")
        if name == "payload":
            return text(arguments.get("char", "x") * int(arguments["size"]))
        if name == "burst":
            await self.burst(int(arguments["count"]), params.get("_meta", {}).get("progressToken"))
            return text("burst")
        if name == "slow":
            await self.slow(float(arguments["seconds"]), params.get("_meta", {}))
            return text(f"slept {arguments['seconds']}")
        if name == "crash":
            await self.ws._stream.aclose()  # (no close frame: the peer sees the TCP end)
            return None
        return {"error": {"code": -32602, "message": f"Unknown tool: {name}"}}

    async def burst(self, count: int, token: Any) -> None:
        """``count`` progress notifications written at once (one ``send_all``, as
        a server in another process writes them: faster than frame by frame)."""
        frames = b"".join(
            self.ws._wsproto.send(
                TextMessage(
                    json.dumps(
                        {
                            "jsonrpc": "2.0",
                            "method": "notifications/progress",
                            "params": {"progressToken": token, "progress": step},
                        },
                        separators=COMPACT,
                    )
                )
            )
            for step in range(1, count + 1)
        )
        async with self.ws._stream_lock:
            await self.ws._stream.send_all(frames)

    async def slow(self, seconds: float, meta: dict[str, Any]) -> None:
        if "progressToken" in meta:
            self.server.progress_tokens.append(meta["progressToken"])
        steps = max(1, int(seconds * 10))
        for step in range(1, steps + 1):
            await trio.sleep(seconds / steps)
            if "progressToken" in meta:
                progress = {"progressToken": meta["progressToken"], "progress": step}
                await self.send(
                    {"method": "notifications/progress", "params": {**progress, "total": steps}}
                )


def result(value: Any) -> dict[str, Any]:
    return {"result": value}


def text(value: str) -> dict[str, Any]:
    return result({"content": [{"type": "text", "text": value}]})


async def main(port: int, port_file: str | None, token: str | None) -> None:
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(WsServer(token=token).run, port)
        if port_file:
            with open(port_file + ".tmp", "w") as f:
                f.write(str(bound))
            os.replace(port_file + ".tmp", port_file)  # (a reader never sees half of it)
        print(f"ws_server: listening on ws://127.0.0.1:{bound}/", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file")
    parser.add_argument("--token")
    options = parser.parse_args()
    trio.run(main, options.port, options.port_file, options.token)
