"""A stdio MCP server that misbehaves on purpose, for the fault-injection tests.

Standard library and orjson only, one blocking loop, so that what it sends is
exactly what the test asked for. Run as ``python -m tests.servers.misbehaving
MODE [ARG]``; the mode is the misbehaviour (docs/faults.md lists the tests
that use each):

- ``normal``: none; the tools below only.
- ``deep-notification DEPTH``: calling ``misbehave`` writes a
  ``notifications/message`` whose ``data`` nests DEPTH levels deep, then a
  shallow one (``data`` "after"), then the answer.
- ``deep-schema DEPTH``: ``tools/list`` has a tool ``deep`` whose
  ``inputSchema`` nests DEPTH levels deep, beside the normal tools.
- ``deaf``: stops reading its stdin at the first ``tools/call`` (after the
  handshake and ``tools/list``), and never answers again.
- ``list-changed-burst COUNT``: calling ``misbehave`` adds a tool ``extra`` and
  writes COUNT ``notifications/tools/list_changed`` in one write, then answers.
- ``stderr-flood BYTES``: calling ``misbehave`` writes BYTES to stderr, in
  lines of 100 bytes, as fast as the pipe takes them, then answers.

- ``strict-opening``: exits (code 1, a line on stderr) if its first request
  is not ``initialize``, as some legacy servers do when probed with
  ``server/discover``; otherwise ``normal``.
- ``crash-at-start CODE``: writes a line to stderr and exits with CODE at once
  (a crash loop, once the broker restarts it).
- ``recoverable``: a server worth restarting (tests/test_recovery_e2e.py): it
  offers resources with subscriptions, and tools ``sleep {seconds}`` (answers
  after that long), ``touch {uri}`` (writes ``notifications/resources/updated``
  for the URI if it is subscribed to it), ``state`` (what it was told: its
  subscriptions and log level); if the file named by ``$MISBEHAVING_EXTRA``
  exists when it starts, it also offers a tool ``extra``.
- ``era-downgrade``: its first process (no file at ``$MISBEHAVING_EXTRA``,
  which it creates) answers ``server/discover`` as a 2026-07-28 server, then
  refuses every call -32022 naming the legacy versions, as a server replaced
  by a legacy-only one behind the broker's back does; later processes (the
  file exists) are legacy only (``server/discover``: -32601).

Tools in every mode: ``echo {text}``; ``pid``; ``depth`` (the nesting depth of
its arguments, counted without recursion); ``payload {size}`` (a text of
``size`` 'x', so the answer's line is ``size`` plus about 80 bytes);
``misbehave`` (the mode's misbehaviour, or nothing).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import orjson

VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
STDERR_LINE = b"e" * 99 + b"\n"


def _tool(name: str, properties: dict[str, Any] | None = None) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties or {}}
    return {"name": name, "description": f"The {name} tool.", "inputSchema": schema}


TOOLS = [
    _tool("echo", {"text": {"type": "string"}}),
    _tool("pid"),
    _tool("depth"),
    _tool("payload", {"size": {"type": "integer"}}),
    _tool("misbehave"),
]


def nested(depth: int, leaf: bytes = b"1") -> bytes:
    """JSON nesting ``depth`` objects: {"a":{"a":...1...}} (orjson would refuse to encode it)."""
    return b'{"a":' * depth + leaf + b"}" * depth


def depth_of(value: Any) -> int:
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            level += 1
            deepest = max(deepest, level)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level) for child in children)
    return deepest


RECOVERABLE_TOOLS = [
    _tool("sleep", {"seconds": {"type": "number"}}),
    _tool("touch", {"uri": {"type": "string"}}),
    _tool("state"),
]
RESOURCES = [{"uri": "mem://recoverable/a", "name": "a"}]


class Server:
    def __init__(self, mode: str, argument: int) -> None:
        self.mode = mode
        self.argument = argument
        # list-changed-burst: the tool it adds; recoverable: it offers it from the start
        self.extra = mode == "recoverable" and os.path.exists(
            os.environ.get("MISBEHAVING_EXTRA", "\0")
        )
        if mode == "era-downgrade":  # (its first process is modern, then it is legacy)
            marker = os.environ["MISBEHAVING_EXTRA"]
            self.mode = "normal" if os.path.exists(marker) else mode
            open(marker, "a").close()
        self.subscribed: set[str] = set()  # recoverable: the URIs it was subscribed to
        self.level: str | None = None  # ... and the log level it was asked for
        self.out = sys.stdout.buffer

    def write(self, *lines: bytes) -> None:
        self.out.write(b"".join(line + b"\n" for line in lines))
        self.out.flush()

    def serve(self) -> None:
        for line in sys.stdin.buffer:
            if not line.strip():
                continue
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                print(f"misbehaving: not JSON: {line[:80]!r}", file=sys.stderr, flush=True)
                continue
            if not isinstance(message, dict) or "method" not in message or "id" not in message:
                continue  # notifications and responses
            if self.mode == "strict-opening" and message["method"] != "initialize":
                print(f"misbehaving: {message['method']} before initialize", file=sys.stderr)
                sys.exit(1)
            self.mode = "normal" if self.mode == "strict-opening" else self.mode
            if message["method"] == "tools/call" and self.mode == "deaf":
                return wait_for_parent_to_die()
            params = message.get("params") or {}
            if message["method"] == "tools/call" and params.get("name") == "sleep":
                time.sleep(float(params.get("arguments", {}).get("seconds", 1)))
            self.write(self.answer(message["id"], message["method"], message.get("params")))

    def answer(self, id: Any, method: str, params: Any) -> bytes:
        params = params if isinstance(params, dict) else {}
        if method == "initialize":
            return result(id, self.initialize(params))
        if method == "logging/setLevel":
            self.level = params.get("level")
        if method in ("ping", "logging/setLevel"):
            return result(id, {})
        if self.mode == "era-downgrade":
            if method == "server/discover":
                info = {
                    "io.modelcontextprotocol/serverInfo": {"name": "downgraded", "version": "1"}
                }
                found = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
                return result(id, {"resultType": "complete", **found, "_meta": info})
            if method == "tools/list":
                return result(id, {"resultType": "complete", "tools": TOOLS})
            refused = {"code": -32022, "message": "Unsupported protocol version",
                       "data": {"supported": VERSIONS, "requested": "2026-07-28"}}  # fmt: skip
            return orjson.dumps({"jsonrpc": "2.0", "id": id, "error": refused})
        if self.mode == "recoverable":
            if method in ("resources/subscribe", "resources/unsubscribe"):
                uri = str(params.get("uri"))
                (self.subscribed.add if method.endswith("/subscribe") else self.subscribed.discard)(
                    uri
                )
                return result(id, {})
            if method == "resources/list":
                return result(id, {"resources": RESOURCES})
            if method == "resources/templates/list":
                return result(id, {"resourceTemplates": []})
        if method == "tools/list":
            return self.tools_list(id)
        if method == "tools/call":
            return self.call(id, params.get("name"), params.get("arguments") or {})
        return error(id, -32601, f"Method not found: {method}")

    def initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        version = params.get("protocolVersion")
        return {
            "protocolVersion": version if version in VERSIONS else VERSIONS[-1],
            "capabilities": {
                "tools": {"listChanged": True},
                "logging": {},
                **({"resources": {"subscribe": True}} if self.mode == "recoverable" else {}),
            },
            "serverInfo": {"name": f"misbehaving-{self.mode}", "version": "1.0"},
        }

    def tools_list(self, id: Any) -> bytes:
        tools = [*TOOLS, *RECOVERABLE_TOOLS] if self.mode == "recoverable" else TOOLS
        tools = [*tools, _tool("extra")] if self.extra else tools
        if self.mode != "deep-schema":
            return result(id, {"tools": tools})
        schema = b'{"type":"object","properties":' + nested(self.argument - 1, b"{}") + b"}"
        deep = b'{"name":"deep","description":"Nests deep.","inputSchema":' + schema + b"}"
        listed = b",".join([*[orjson.dumps(tool) for tool in tools], deep])
        return raw_result(id, b'{"tools":[' + listed + b"]}")

    def call(self, id: Any, name: Any, arguments: Any) -> bytes:
        if name == "echo":
            return text(id, str(arguments.get("text", "")))
        if name == "pid":
            return text(id, str(os.getpid()))
        if name == "depth":
            return text(id, str(depth_of(arguments)))
        if name == "payload":
            body = b'{"content":[{"type":"text","text":"' + b"x" * int(arguments["size"]) + b'"}]}'
            return raw_result(id, body)
        if name == "extra":
            return text(id, "extra")
        if name == "sleep":
            return text(id, f"slept {arguments.get('seconds', 1)}")
        if name == "touch":
            uri = str(arguments.get("uri"))
            if uri in self.subscribed:
                self.write(
                    orjson.dumps(notification("notifications/resources/updated", {"uri": uri}))
                )
            return text(id, "touched")
        if name == "state":
            return text(
                id,
                orjson.dumps({"subscribed": sorted(self.subscribed), "level": self.level}).decode(),
            )
        if name == "misbehave":
            self.misbehave()
            return text(id, "done")
        return error(id, -32602, f"Unknown tool: {name}")

    def misbehave(self) -> None:
        if self.mode == "deep-notification":
            params = b'{"level":"error","logger":"deep","data":' + nested(self.argument) + b"}"
            deep = b'{"jsonrpc":"2.0","method":"notifications/message","params":' + params + b"}"
            after = {"level": "error", "logger": "deep", "data": "after"}
            self.write(deep, orjson.dumps(notification("notifications/message", after)))
        elif self.mode == "list-changed-burst":
            self.extra = True
            changed = orjson.dumps(notification("notifications/tools/list_changed", None))
            self.write(*[changed] * self.argument)
        elif self.mode == "stderr-flood":
            chunk = STDERR_LINE * 655  # 65,500 bytes
            for _ in range(self.argument // len(chunk)):
                sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()


def notification(method: str, params: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return message


def result(id: Any, value: Any) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": id, "result": value})


def raw_result(id: Any, value: bytes) -> bytes:
    """A result already encoded (deeper than orjson would encode, or big)."""
    return b'{"jsonrpc":"2.0","id":' + orjson.dumps(id) + b',"result":' + value + b"}"


def text(id: Any, value: str) -> bytes:
    return result(id, {"content": [{"type": "text", "text": value}]})


def error(id: Any, code: int, message: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})


def wait_for_parent_to_die() -> None:
    """Deaf from now on: the pipe from the broker fills up; leave with the broker."""
    parent = os.getppid()
    deadline = time.monotonic() + 600
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.2)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "normal"
    argument = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    if mode == "crash-at-start":
        print(f"misbehaving: crashing at start (pid {os.getpid()})", file=sys.stderr, flush=True)
        sys.exit(argument)
    Server(mode, argument).serve()


if __name__ == "__main__":
    main()
