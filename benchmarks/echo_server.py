"""A minimal, fast MCP echo server for the benchmark harness (stdlib + orjson).

Written for the benchmark, not with the SDK, so that the server is never the
bottleneck: it reads its input in big chunks, answers every complete line of a
chunk, and writes all the answers to that chunk in one ``write``. It speaks
newline-delimited JSON-RPC (legacy-era MCP: ``initialize``, ``ping``,
``tools/list``, ``tools/call``) and has three tools:

- ``echo {text}``: the text back as one text block;
- ``payload {size}``: a text of ``size`` 'x' characters (encoded once, cached);
- ``fail {message}``: a tool result with ``isError: true``;
- ``flaky {every}``: every ``every``-th call of it (counted by this process)
  is a JSON-RPC ``-32603`` error, the others echo ``ok``.

An unknown tool is a JSON-RPC ``-32602`` error, an unknown method ``-32601``.

``--modern`` makes it a 2026-07-28-only server (the modern era, docs/eras.md):
it answers ``server/discover``, refuses ``initialize`` with ``-32022`` naming
``2026-07-28`` (which is how the broker tells it is modern), and every result
carries ``resultType``. It reads nothing of a request's ``_meta``, as a server
that checks nothing would: the broker's cost is what the figures are for.

Run it on stdio (``python benchmarks/echo_server.py``, as the daemon or a host
launches a server) or, for the "direct" figures, on a unix socket that serves
many connections at once (``--socket PATH``): the same code answers both.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import sys
from typing import Any

import orjson

READ_SIZE = 1024 * 1024
VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
TOOLS = [
    {
        "name": name,
        "description": description,
        "inputSchema": {"type": "object", "properties": properties},
    }
    for name, description, properties in (
        ("echo", "Return the text unchanged.", {"text": {"type": "string"}}),
        ("payload", "Return `size` 'x' characters.", {"size": {"type": "integer"}}),
        ("fail", "Return a tool error.", {"message": {"type": "string"}}),
        ("flaky", "Fail every `every`-th call.", {"every": {"type": "integer"}}),
    )
]
MODERN = "2026-07-28"
SERVER_INFO = "io.modelcontextprotocol/serverInfo"
_payloads: dict[int, bytes] = {}
_flaky_calls = 0
_modern = False


def _payload_tail(size: int) -> bytes:
    """The encoded ``,"result":...}`` of a payload answer (cached: never the bottleneck)."""
    tail = _payloads.get(size)
    if tail is None:
        result = {"content": [{"type": "text", "text": "x" * size}]}
        if _modern:
            result = {"resultType": "complete", **result}
        tail = b',"result":' + orjson.dumps(result) + b"}\n"
        _payloads[size] = tail
    return tail


def _result(id: Any, result: Any) -> bytes:
    if _modern:
        result = {"resultType": "complete", **result}
    return orjson.dumps({"jsonrpc": "2.0", "id": id, "result": result}) + b"\n"


def _error(id: Any, code: int, message: str) -> bytes:
    error = {"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}
    return orjson.dumps(error) + b"\n"


def _call(id: Any, params: Any) -> bytes:
    name = params.get("name")
    args = params.get("arguments") or {}
    if name == "echo":
        return _result(id, {"content": [{"type": "text", "text": str(args.get("text", ""))}]})
    if name == "payload":
        return b'{"jsonrpc":"2.0","id":' + orjson.dumps(id) + _payload_tail(int(args["size"]))
    if name == "fail":
        text = str(args.get("message", "failure requested"))
        return _result(id, {"content": [{"type": "text", "text": text}], "isError": True})
    if name == "flaky":
        global _flaky_calls
        _flaky_calls += 1
        if _flaky_calls % max(1, int(args.get("every", 2))) == 0:
            return _error(id, -32603, f"flaky: call {_flaky_calls} fails")
        return _result(id, {"content": [{"type": "text", "text": "ok"}]})
    return _error(id, -32602, f"Unknown tool: {name}")


def answer(line: bytes) -> bytes:
    """The answer to one line (b"" for notifications, responses and junk)."""
    try:
        message = orjson.loads(line)
        method = message.get("method")
        id = message.get("id")
    except (orjson.JSONDecodeError, AttributeError):
        return _error(None, -32700, "Parse error")
    if method is None or id is None:
        return b""
    if method == "tools/call":
        return _call(id, message.get("params") or {})
    if _modern:
        if method == "initialize":
            data = {
                "supported": [MODERN],
                "requested": (message.get("params") or {}).get("protocolVersion"),
            }
            error = {"code": -32022, "message": "Unsupported protocol version", "data": data}
            return orjson.dumps({"jsonrpc": "2.0", "id": id, "error": error}) + b"\n"
        if method == "server/discover":
            return _result(
                id,
                {
                    "supportedVersions": [MODERN],
                    "capabilities": {"tools": {}},
                    "_meta": {SERVER_INFO: {"name": "bench-echo", "version": "1.0"}},
                },
            )
    if method == "initialize":
        requested = (message.get("params") or {}).get("protocolVersion")
        return _result(
            id,
            {
                "protocolVersion": requested if requested in VERSIONS else VERSIONS[-1],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bench-echo", "version": "1.0"},
            },
        )
    if method == "tools/list":
        return _result(id, {"tools": TOOLS})
    if method == "ping":
        return _result(id, {})
    return _error(id, -32601, f"Method not found: {method}")


class Lines:
    """Splits chunks into lines and answers each complete one."""

    def __init__(self) -> None:
        self.rest = b""

    def feed(self, data: bytes) -> bytes:
        if self.rest:
            data = self.rest + data
        lines = data.split(b"\n")
        self.rest = lines.pop()
        return b"".join([answer(line) for line in lines if line.strip()])


def serve_stdio() -> None:
    lines = Lines()
    while data := os.read(0, READ_SIZE):
        out = memoryview(lines.feed(data))
        while out:
            out = out[os.write(1, out) :]


def serve_socket(path: str) -> None:
    """Serve many connections on a unix socket (for the harness's direct figures)."""
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1024)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    while True:
        for key, _ in selector.select():
            if key.data is None:
                conn, _ = listener.accept()
                selector.register(conn, selectors.EVENT_READ, Lines())
                continue
            client = key.fileobj
            assert isinstance(client, socket.socket)
            data = client.recv(READ_SIZE)
            if not data:
                selector.unregister(client)
                client.close()
                continue
            out = key.data.feed(data)
            if out:
                client.sendall(out)  # blocking: the load generator always reads


def main(argv: list[str]) -> int:
    global _modern
    if argv[:1] == ["--modern"]:
        _modern, argv = True, argv[1:]
    if argv[:1] == ["--socket"] and len(argv) == 2:
        with contextlib.suppress(KeyboardInterrupt):
            serve_socket(argv[1])
        return 0
    if argv:
        print("usage: echo_server.py [--modern] [--socket PATH]", file=sys.stderr)
        return 2
    serve_stdio()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
