"""A small, fast MCP server on stdio, for mcpbroker's demo config, tests and benchmarks.

Run as ``python -m tools.demo_server``: newline-delimited JSON-RPC 2.0 on
stdin/stdout (legacy-era MCP), with tools ``echo``, ``add``, ``pid``, ``slow``,
``fail``, ``crash`` and ``payload``, resources ``demo://readme`` and
``demo://greeting/{name}``, the prompt ``greet`` and completions for names.
Quick requests are answered inline by the reader, all replies to one chunk of
input in one write; only ``slow`` runs in a task, which ``notifications/cancelled``
cancels. On stdin EOF it lets running requests finish and exits with code 0.
``MCPBROKER_DEMO_NAME`` overrides ``serverInfo.name``.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import orjson
import trio

from broker import jsonrpc, lifecycle
from broker.jsonrpc import INVALID_PARAMS, JsonRpcError, Kind, Message, RequestId
from broker.wire import ndjson
from broker.wire.frames import Oversize
from broker.wire.ndjson import LineFramer

Params = dict[str, Any]
Result = dict[str, Any]
# A method handler returns its result, or None when a task will answer later.
Handler = Callable[[RequestId, Params], Result | None]

READ_SIZE = 64 * 1024
OUTPUT_QUEUE = 64
MAX_PAYLOAD = 64 * 1024 * 1024
RESOURCE_NOT_FOUND = -32002
LOG_LEVELS = frozenset(
    {"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"}
)
NAMES = ("Ada", "Alan", "Alice", "Barbara", "Bob", "Grace", "Linus", "Margaret")
README_URI = "demo://readme"
GREETING_PREFIX = "demo://greeting/"
GREETING_TEMPLATE = GREETING_PREFIX + "{name}"
README_TEXT = "mcpbroker demo server: a small MCP server to try, test and benchmark the broker.\n"
INSTRUCTIONS = (
    "Demo server for mcpbroker: echo, add, pid, slow, fail, crash and payload tools, "
    "readme and greeting resources, and a greet prompt."
)
CAPABILITIES: Params = {
    "tools": {"listChanged": True},
    "resources": {"subscribe": False, "listChanged": True},
    "prompts": {"listChanged": True},
    "completions": {},
    "logging": {},
}

# --- tools -------------------------------------------------------------------


def _tool(name: str, description: str, properties: Params, *required: str) -> Params:
    schema: Params = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return {"name": name, "description": description, "inputSchema": schema}


NUMBER: Params = {"type": "number"}
ADD_OUTPUT: Params = {"type": "object", "properties": {"result": NUMBER}, "required": ["result"]}
SLOW_ARGS: Params = {
    "seconds": {"type": "number", "minimum": 0, "default": 1},
    "steps": {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 5},
}
FAIL_ARGS: Params = {"message": {"type": "string", "default": "failure requested"}}
PAYLOAD_ARGS: Params = {"size": {"type": "integer", "minimum": 0, "maximum": MAX_PAYLOAD}}
TOOLS: dict[str, Params] = {
    tool["name"]: tool
    for tool in (
        _tool("echo", "Return the text unchanged.", {"text": {"type": "string"}}, "text"),
        _tool("add", "Add two numbers.", {"a": NUMBER, "b": NUMBER}, "a", "b")
        | {"outputSchema": ADD_OUTPUT},
        _tool("pid", "Return the server's process id.", {}),
        _tool("slow", "Sleep `seconds` in `steps` parts, reporting progress.", SLOW_ARGS),
        _tool("fail", "Return a tool error with the given message.", FAIL_ARGS),
        _tool("crash", "Exit the server process at once, with code 3.", {}),
        _tool("payload", "Return a text of exactly `size` 'x' characters.", PAYLOAD_ARGS, "size"),
    )
}


class ArgumentError(Exception):
    """Arguments a tool cannot run with; reported as a tool result with isError."""


def _check(key: str, rules: Params, value: Any) -> Any:
    kind = rules["type"]
    if kind != "string" and isinstance(value, orjson.Fragment):  # kept as written (jsonrpc.decode)
        raise ArgumentError(
            f"argument {key!r} is past what this server computes with "
            "(64-bit integers and finite floats)"
        )
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        value = int(value)
    python_type = {"string": str, "number": int | float, "integer": int}[kind]
    if isinstance(value, bool) or not isinstance(value, python_type):
        raise ArgumentError(f"argument {key!r} must be of type {kind}")
    if value < rules.get("minimum", value) or value > rules.get("maximum", value):
        raise ArgumentError(f"argument {key!r} is out of range")
    return value


def bind_arguments(schema: Params, arguments: Any) -> Params:
    """Check arguments against a tool's (simple) input schema; fill in defaults."""
    if arguments is None:
        arguments = {}
    elif not isinstance(arguments, dict):
        raise ArgumentError("arguments must be an object")
    bound: Params = {}
    for key, rules in schema["properties"].items():
        if key in arguments:
            bound[key] = _check(key, rules, arguments[key])
        elif "default" in rules:
            bound[key] = rules["default"]
        elif key in schema.get("required", ()):
            raise ArgumentError(f"missing required argument {key!r}")
    return bound


def text_result(text: str, *, error: bool = False) -> Result:
    return {"content": [{"type": "text", "text": text}], "isError": error}


def _add(args: Params) -> Result:
    total = args["a"] + args["b"]
    if isinstance(total, float) and not math.isfinite(total):
        return text_result("the sum is not a finite number", error=True)
    return text_result(str(total)) | {"structuredContent": {"result": total}}


def _crash(args: Params) -> Result:
    os._exit(3)


QUICK_TOOLS: dict[str, Callable[[Params], Result]] = {
    "echo": lambda args: text_result(args["text"]),
    "add": _add,
    "pid": lambda args: text_result(str(os.getpid())),
    "fail": lambda args: text_result(args["message"], error=True),
    "crash": _crash,
    "payload": lambda args: text_result("x" * args["size"]),
}

# --- resources, prompts, completions, logging ---------------------------------


def read_resource(rid: RequestId, params: Params) -> Result:
    uri = params.get("uri")
    if not isinstance(uri, str):
        raise JsonRpcError(INVALID_PARAMS, "resources/read needs params.uri (a string)")
    name = unquote(uri.removeprefix(GREETING_PREFIX)) if uri.startswith(GREETING_PREFIX) else ""
    if uri == README_URI:
        text = README_TEXT
    elif name:
        text = f"Hello, {name}!"
    else:
        raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", data={"uri": uri})
    return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": text}]}


def get_prompt(rid: RequestId, params: Params) -> Result:
    if params.get("name") != "greet":
        raise JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {params.get('name')}")
    arguments = params.get("arguments")
    name = arguments.get("name") if isinstance(arguments, dict) else None
    if not isinstance(name, str):
        raise JsonRpcError(INVALID_PARAMS, "Missing required argument: name")
    text = f"Please greet {name} warmly."
    return {
        "description": "Ask the model to greet someone.",
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}],
    }


def complete(rid: RequestId, params: Params) -> Result:
    ref, argument = params.get("ref"), params.get("argument")
    if not isinstance(ref, dict) or not isinstance(argument, dict):
        raise JsonRpcError(INVALID_PARAMS, "completion/complete needs params.ref and .argument")
    value = argument.get("value")
    if not isinstance(value, str):
        raise JsonRpcError(INVALID_PARAMS, "params.argument.value must be a string")
    target = (ref.get("type"), ref.get("name", ref.get("uri")), argument.get("name"))
    names = target in {("ref/prompt", "greet", "name"), ("ref/resource", GREETING_TEMPLATE, "name")}
    values = [name for name in NAMES if name.startswith(value)] if names else []
    return {"completion": {"values": values, "total": len(values), "hasMore": False}}


def set_level(rid: RequestId, params: Params) -> Result:
    if params.get("level") not in LOG_LEVELS:
        raise JsonRpcError(INVALID_PARAMS, "params.level must be a logging level")
    return {}


def _constant(result: Result) -> Handler:
    return lambda rid, params: result


README = {"uri": README_URI, "name": "readme", "mimeType": "text/plain"}
GREETING = {"uriTemplate": GREETING_TEMPLATE, "name": "greeting", "mimeType": "text/plain"}
GREET_ARGUMENT = {"name": "name", "description": "Who to greet", "required": True}
GREET = {"name": "greet", "description": "Greet someone.", "arguments": [GREET_ARGUMENT]}
LISTINGS: dict[str, Result] = {
    "tools/list": {"tools": list(TOOLS.values())},
    "resources/list": {"resources": [README]},
    "resources/templates/list": {"resourceTemplates": [GREETING]},
    "prompts/list": {"prompts": [GREET]},
}

# --- the server ----------------------------------------------------------------


class DemoServer:
    """Reads requests, answers quick ones inline, runs ``slow`` calls in tasks."""

    def __init__(self, name: str, send: trio.MemorySendChannel[bytes]) -> None:
        self._send = send
        self._server_info = {"name": name, "version": "0.1.0"}
        self._in_flight: dict[tuple[type, RequestId], trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self._handlers: dict[str, Handler] = {
            "initialize": self._initialize,
            "ping": _constant({}),
            "logging/setLevel": set_level,
            "tools/call": self._call_tool,
            "resources/read": read_resource,
            "prompts/get": get_prompt,
            "completion/complete": complete,
        }
        self._handlers.update((method, _constant(r)) for method, r in LISTINGS.items())

    async def read_loop(self, stdin: trio.abc.ReceiveStream) -> None:
        """Serve until stdin ends, then wait for the requests still running."""
        framer = LineFramer()
        async with trio.open_nursery() as self._nursery:
            while True:
                try:
                    chunk = await stdin.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not chunk:
                    break
                lines = framer.feed(bytes(chunk))  # no copy: FdStream gives bytes
                replies = [reply for line in lines if (reply := self.on_line(line))]
                if replies:
                    await self._send.send(b"".join(replies))

    def on_line(self, line: bytes | Oversize) -> bytes | None:
        """The reply to one line of input, if it gets one right away."""
        if isinstance(line, Oversize):
            error = f"Invalid Request: message too large ({line.size} bytes)"
            return _encode(jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, error))
        try:
            message = jsonrpc.decode(line)
            kind = jsonrpc.classify(message)
        except JsonRpcError as exc:
            return _encode(exc.to_response())
        if kind is Kind.REQUEST:
            return self._on_request(message)
        if kind is Kind.NOTIFICATION and message["method"] == "notifications/cancelled":
            self._cancel(message.get("params") or {})
        return None  # other notifications, and responses, need no answer

    def _on_request(self, message: Message) -> bytes | None:
        rid: RequestId = message["id"]
        method = message["method"]
        try:
            handler = self._handlers.get(method)
            if handler is None:
                raise JsonRpcError(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}")
            result = handler(rid, message.get("params") or {})
        except JsonRpcError as exc:
            return _encode(jsonrpc.error_response(rid, exc.code, exc.message, exc.data))
        except Exception as exc:  # a bug must cost one request, not the server
            return _encode(jsonrpc.error_response(rid, jsonrpc.INTERNAL_ERROR, repr(exc)))
        return None if result is None else _encode(jsonrpc.result_response(rid, result))

    def _initialize(self, rid: RequestId, params: Params) -> Result:
        requested, _, _ = lifecycle.read_client_initialize(params)
        return {
            "protocolVersion": lifecycle.negotiate_version(requested),
            "capabilities": CAPABILITIES,
            "serverInfo": self._server_info,
            "instructions": INSTRUCTIONS,
        }

    def _call_tool(self, rid: RequestId, params: Params) -> Result | None:
        name = params.get("name")
        if not isinstance(name, str) or name not in TOOLS:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown tool: {name}")
        try:
            args = bind_arguments(TOOLS[name]["inputSchema"], params.get("arguments"))
        except ArgumentError as exc:
            return text_result(f"Invalid arguments for tool {name}: {exc}", error=True)
        if name != "slow":
            return QUICK_TOOLS[name](args)
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        # Registered now, not when the task starts: a cancel may be on the next line.
        scope = self._in_flight[jsonrpc.id_key(rid)] = trio.CancelScope()
        assert self._nursery is not None
        self._nursery.start_soon(self._slow, rid, args, token, scope)
        return None

    async def _slow(
        self, rid: RequestId, args: Params, token: Any, scope: trio.CancelScope
    ) -> None:
        """Run one ``slow`` call; once cancelled it sends nothing more."""
        steps: int = args["steps"]
        try:
            with scope:
                for step in range(1, steps + 1):
                    await trio.sleep(args["seconds"] / steps)
                    if jsonrpc.is_valid_id(token):  # a progress token has an id's type
                        progress = {"progressToken": token, "progress": step, "total": steps}
                        progress["message"] = f"step {step} of {steps}"
                        notification = jsonrpc.notification("notifications/progress", progress)
                        await self._send.send(_encode(notification))
                result = text_result(f"done after {steps} steps")
                await self._send.send(_encode(jsonrpc.result_response(rid, result)))
        finally:
            if self._in_flight.get(key := jsonrpc.id_key(rid)) is scope:
                del self._in_flight[key]

    def _cancel(self, params: Params) -> None:
        rid = params.get("requestId")
        if isinstance(rid, str | int) and (scope := self._in_flight.get(jsonrpc.id_key(rid))):
            scope.cancel()


def _encode(message: Message) -> bytes:
    try:
        return ndjson.encode(message)
    except orjson.JSONEncodeError as exc:  # e.g. an integer beyond 64 bits in a result
        if "id" not in message:
            return b""
        error = f"Internal error: cannot encode the result ({exc})"
        return ndjson.encode(jsonrpc.error_response(message["id"], jsonrpc.INTERNAL_ERROR, error))


async def write_loop(stdout: trio.abc.SendStream, queue: trio.MemoryReceiveChannel[bytes]) -> None:
    """The one writer of stdout: whatever is queued when it wakes leaves in one write."""
    async with queue:
        async for data in queue:
            batch = [data]
            with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel):
                while len(batch) < OUTPUT_QUEUE:
                    batch.append(queue.receive_nowait())
            await stdout.send_all(b"".join(batch) if len(batch) > 1 else data)


async def serve(stdin: trio.abc.ReceiveStream, stdout: trio.abc.SendStream) -> None:
    """Serve one client on a pair of streams until its input ends (or its output breaks)."""
    send, receive = trio.open_memory_channel[bytes](OUTPUT_QUEUE)
    server = DemoServer(os.environ.get("MCPBROKER_DEMO_NAME") or "mcpbroker-demo", send)
    async with trio.open_nursery() as nursery:

        async def write() -> None:
            try:
                await write_loop(stdout, receive)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                nursery.cancel_scope.cancel()  # nobody is listening any more

        nursery.start_soon(write)
        async with send:
            await server.read_loop(stdin)


async def _main() -> None:
    await serve(trio.lowlevel.FdStream(0), trio.lowlevel.FdStream(1))


def main() -> None:
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(_main)


if __name__ == "__main__":
    main()
