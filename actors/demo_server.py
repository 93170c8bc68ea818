"""A small, fast MCP server on stdio, for mcpbroker's demo config, tests and benchmarks.

Run it as ``python -m actors.demo_server``. It speaks newline-delimited JSON-RPC
2.0 (the MCP stdio transport, legacy era) and serves a handful of tools
(``echo``, ``add``, ``pid``, ``slow``, ``fail``, ``crash``, ``payload``), two
resources (``demo://readme`` and the template ``demo://greeting/{name}``), one
prompt (``greet``) and completions for the greeting name. Only the standard
library, trio, orjson and the broker's sans-I/O helpers are used, so it starts
quickly. Quick requests are answered inline by the reader task, the replies to
one chunk of input leave in one write; only ``slow`` gets a task of its own,
which ``notifications/cancelled`` can cancel. On stdin EOF the server lets
requests in flight finish, then exits with code 0. ``MCPBROKER_DEMO_NAME``
overrides the name in ``serverInfo``.
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
from broker.framing import LineFramer, Oversize
from broker.jsonrpc import JsonRpcError, Kind, Message, RequestId

Params = dict[str, Any]
Result = dict[str, Any]
# A method handler answers with a result, or with None when a task answers later.
Handler = Callable[[RequestId, Params], Result | None]

READ_SIZE = 64 * 1024
OUTPUT_QUEUE = 64
MAX_PAYLOAD = 64 * 1024 * 1024
LOG_LEVELS = frozenset(
    {"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"}
)
NAMES = ("Ada", "Alan", "Alice", "Barbara", "Bob", "Grace", "Linus", "Margaret")

README_URI = "demo://readme"
GREETING_PREFIX = "demo://greeting/"
GREETING_TEMPLATE = GREETING_PREFIX + "{name}"
README_TEXT = (
    "mcpbroker demo server: a small MCP server for trying out, testing and "
    "benchmarking the broker.\n"
)
INSTRUCTIONS = (
    "Demo server for mcpbroker: echo, add, pid, slow, fail, crash and payload tools, "
    "a readme and greeting resources, and a greet prompt."
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
TOOLS: dict[str, Params] = {
    tool["name"]: tool
    for tool in (
        _tool("echo", "Return the text unchanged.", {"text": {"type": "string"}}, "text"),
        _tool("add", "Add two numbers.", {"a": NUMBER, "b": NUMBER}, "a", "b")
        | {
            "outputSchema": {
                "type": "object",
                "properties": {"result": NUMBER},
                "required": ["result"],
            }
        },
        _tool("pid", "Return the server's process id.", {}),
        _tool(
            "slow",
            "Sleep for `seconds` in `steps` parts, reporting progress after each part.",
            {
                "seconds": {"type": "number", "minimum": 0, "default": 1},
                "steps": {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 5},
            },
        ),
        _tool(
            "fail",
            "Return a tool error with the given message.",
            {"message": {"type": "string", "default": "failure requested"}},
        ),
        _tool("crash", "Exit the server process at once, with code 3.", {}),
        _tool(
            "payload",
            "Return a text of exactly `size` 'x' characters.",
            {"size": {"type": "integer", "minimum": 0, "maximum": MAX_PAYLOAD}},
            "size",
        ),
    )
}
TOOL_LIST: Result = {"tools": list(TOOLS.values())}


class ArgumentError(Exception):
    """Arguments a tool cannot run with; reported as a tool result with isError."""


def _type_ok(kind: str, value: Any) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    if kind == "string":
        return isinstance(value, str)
    if kind == "number":
        return isinstance(value, int | float)
    return kind == "integer" and isinstance(value, int)


def _check(key: str, rules: Params, value: Any) -> Any:
    if isinstance(value, float) and rules["type"] == "integer" and value.is_integer():
        value = int(value)
    if not _type_ok(rules["type"], value):
        raise ArgumentError(f"argument {key!r} must be of type {rules['type']}")
    if "minimum" in rules and value < rules["minimum"]:
        raise ArgumentError(f"argument {key!r} must be at least {rules['minimum']}")
    if "maximum" in rules and value > rules["maximum"]:
        raise ArgumentError(f"argument {key!r} must be at most {rules['maximum']}")
    return value


def bind_arguments(schema: Params, arguments: Any) -> Params:
    """Check arguments against a tool's (simple) input schema and fill in defaults."""
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


def _progress_token(params: Params) -> RequestId | None:
    meta = params.get("_meta")
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if jsonrpc.is_valid_id(token) else None


# --- resources, prompts, completions -----------------------------------------


def _read_resource(uri: str) -> str | None:
    if uri == README_URI:
        return README_TEXT
    if uri.startswith(GREETING_PREFIX) and (name := unquote(uri[len(GREETING_PREFIX) :])):
        return f"Hello, {name}!"
    return None


def read_resource(rid: RequestId, params: Params) -> Result:
    uri = params.get("uri")
    if not isinstance(uri, str):
        raise JsonRpcError(jsonrpc.INVALID_PARAMS, "resources/read needs params.uri (a string)")
    text = _read_resource(uri)
    if text is None:
        raise JsonRpcError(-32002, "Resource not found", data={"uri": uri})
    return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": text}]}


def get_prompt(rid: RequestId, params: Params) -> Result:
    if params.get("name") != "greet":
        raise JsonRpcError(jsonrpc.INVALID_PARAMS, f"Unknown prompt: {params.get('name')}")
    arguments = params.get("arguments")
    name = arguments.get("name") if isinstance(arguments, dict) else None
    if not isinstance(name, str):
        raise JsonRpcError(jsonrpc.INVALID_PARAMS, "Missing required argument: name")
    return {
        "description": "Ask the model to greet someone.",
        "messages": [
            {"role": "user", "content": {"type": "text", "text": f"Please greet {name} warmly."}}
        ],
    }


def complete(rid: RequestId, params: Params) -> Result:
    ref, argument = params.get("ref"), params.get("argument")
    if not isinstance(ref, dict) or not isinstance(argument, dict):
        raise JsonRpcError(jsonrpc.INVALID_PARAMS, "completion/complete needs ref and argument")
    value = argument.get("value")
    if not isinstance(value, str):
        raise JsonRpcError(jsonrpc.INVALID_PARAMS, "argument.value must be a string")
    names_ref = (ref.get("type"), ref.get("name", ref.get("uri"))) in {
        ("ref/prompt", "greet"),
        ("ref/resource", GREETING_TEMPLATE),
    }
    values = (
        [name for name in NAMES if name.startswith(value)]
        if names_ref and argument.get("name") == "name"
        else []
    )
    return {"completion": {"values": values, "total": len(values), "hasMore": False}}


def set_level(rid: RequestId, params: Params) -> Result:
    if params.get("level") not in LOG_LEVELS:
        raise JsonRpcError(jsonrpc.INVALID_PARAMS, "params.level must be a logging level")
    return {}


PROMPT_LIST: Result = {
    "prompts": [
        {
            "name": "greet",
            "description": "Ask the model to greet someone.",
            "arguments": [{"name": "name", "description": "Who to greet", "required": True}],
        }
    ]
}
RESOURCE_LIST: Result = {
    "resources": [{"uri": README_URI, "name": "readme", "mimeType": "text/plain"}]
}
TEMPLATE_LIST: Result = {
    "resourceTemplates": [
        {"uriTemplate": GREETING_TEMPLATE, "name": "greeting", "mimeType": "text/plain"}
    ]
}


def _constant(result: Result) -> Handler:
    return lambda rid, params: result


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
            "tools/list": _constant(TOOL_LIST),
            "tools/call": self._call_tool,
            "resources/list": _constant(RESOURCE_LIST),
            "resources/templates/list": _constant(TEMPLATE_LIST),
            "resources/read": read_resource,
            "prompts/list": _constant(PROMPT_LIST),
            "prompts/get": get_prompt,
            "completion/complete": complete,
        }

    async def read_loop(self, stdin: trio.abc.ReceiveStream) -> None:
        """Serve until stdin ends; requests still running are left to the nursery."""
        framer = LineFramer()
        async with trio.open_nursery() as self._nursery:
            while True:
                try:
                    chunk = await stdin.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not chunk:
                    break
                replies = [reply for line in framer.feed(chunk) if (reply := self.on_line(line))]
                if replies:
                    await self._send.send(b"".join(replies))

    def on_line(self, line: bytes | Oversize) -> bytes | None:
        """The reply to one line of input, if it gets one right away."""
        if isinstance(line, Oversize):
            return _encode(
                jsonrpc.error_response(
                    None, jsonrpc.INVALID_REQUEST, f"Message too large ({line.size} bytes)"
                )
            )
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
        handler = self._handlers.get(message["method"])
        try:
            if handler is None:
                raise JsonRpcError(
                    jsonrpc.METHOD_NOT_FOUND, f"Method not found: {message['method']}"
                )
            result = handler(rid, message.get("params") or {})
        except JsonRpcError as exc:
            return _encode(jsonrpc.error_response(rid, exc.code, exc.message, exc.data))
        except Exception as exc:  # a bug here must not take the server down
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
        tool = TOOLS.get(name) if isinstance(name, str) else None
        if tool is None:
            raise JsonRpcError(jsonrpc.INVALID_PARAMS, f"Unknown tool: {name}")
        try:
            args = bind_arguments(tool["inputSchema"], params.get("arguments"))
        except ArgumentError as exc:
            return text_result(f"Invalid arguments for {name}: {exc}", error=True)
        if name != "slow":
            return QUICK_TOOLS[name](args)
        assert self._nursery is not None
        self._nursery.start_soon(self._slow, rid, args, _progress_token(params))
        return None

    async def _slow(self, rid: RequestId, args: Params, token: RequestId | None) -> None:
        """Run one ``slow`` call; a cancelled call sends no response."""
        key = jsonrpc.id_key(rid)
        with trio.CancelScope() as scope:
            self._in_flight[key] = scope
            try:
                steps: int = args["steps"]
                for step in range(1, steps + 1):
                    await trio.sleep(args["seconds"] / steps)
                    if token is not None:
                        await self._send.send(_encode(_progress(token, step, steps)))
                reply = jsonrpc.result_response(rid, text_result(f"done after {steps} steps"))
                await self._send.send(_encode(reply))
            finally:
                if self._in_flight.get(key) is scope:
                    del self._in_flight[key]

    def _cancel(self, params: Params) -> None:
        rid = params.get("requestId")
        if jsonrpc.is_valid_id(rid) and (scope := self._in_flight.get(jsonrpc.id_key(rid))):
            scope.cancel()


def _progress(token: RequestId, step: int, steps: int) -> Message:
    return jsonrpc.notification(
        "notifications/progress",
        {
            "progressToken": token,
            "progress": step,
            "total": steps,
            "message": f"step {step} of {steps}",
        },
    )


def _encode(message: Message) -> bytes:
    try:
        return jsonrpc.encode(message)
    except orjson.JSONEncodeError as exc:  # e.g. an integer beyond 64 bits
        error = jsonrpc.error_response(
            message.get("id"), jsonrpc.INTERNAL_ERROR, f"Cannot encode reply: {exc}"
        )
        return jsonrpc.encode(error) if "id" in message else b""


async def write_loop(
    stdout: trio.abc.SendStream, receive: trio.MemoryReceiveChannel[bytes]
) -> None:
    """The only writer of stdout: whatever is queued when it wakes goes out in one write."""
    async with receive:
        async for data in receive:
            batch = [data]
            while True:
                try:
                    batch.append(receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            await stdout.send_all(b"".join(batch) if len(batch) > 1 else data)


async def serve(stdin: trio.abc.ReceiveStream, stdout: trio.abc.SendStream) -> None:
    """Serve one client on a pair of streams until its input ends (or output breaks)."""
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
