"""End-to-end tests of tools.demo_server: the real process, driven by the official MCP SDK
client and, for what the SDK would never send, by raw bytes on its stdin."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp.types import PromptReference, ResourceTemplateReference, TextContent

from broker.wire.ndjson import LineFramer

REPO = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, "-m", "tools.demo_server"]
TIMEOUT = 20


@asynccontextmanager
async def connect(**env: str) -> AsyncIterator[ClientSession]:
    """An initialized SDK session with a fresh demo server process."""
    params = StdioServerParameters(
        command=COMMAND[0], args=COMMAND[1:], cwd=REPO, env={"PYTHONPATH": str(REPO), **env}
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def text_of(result: Any) -> str:
    [block] = result.content
    assert isinstance(block, TextContent)
    return block.text


class RawServer:
    """The demo server as a bare subprocess: bytes in, decoded lines out."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._framer = LineFramer()
        self._ready: list[Any] = []

    async def send(self, *lines: bytes) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(b"".join(line + b"\n" for line in lines))

    async def close_stdin(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()

    async def receive(self) -> Any:
        """The next message; None at end of output."""
        assert self.process.stdout is not None
        while not self._ready:
            chunk = await self.process.stdout.receive_some()
            if not chunk:
                return None
            for line in self._framer.feed(bytes(chunk)):
                assert isinstance(line, bytes), line
                self._ready.append(orjson.loads(line))
        return self._ready.pop(0)

    async def receive_all(self) -> list[Any]:
        """Every message up to the end of output."""
        messages = []
        while (message := await self.receive()) is not None:
            messages.append(message)
        return messages


@asynccontextmanager
async def raw_server() -> AsyncIterator[RawServer]:
    process = await trio.lowlevel.open_process(
        COMMAND,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        yield RawServer(process)
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


def request(id: Any, method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        message["params"] = params
    return orjson.dumps(message)


def cancel(id: Any) -> bytes:
    params = {"requestId": id, "reason": "test"}
    return orjson.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})


# --- through the official SDK ----------------------------------------------------


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_initialize_and_listings() -> None:
    with trio.fail_after(TIMEOUT):
        async with connect() as session:
            init = session.initialize_result
            assert init is not None
            assert init.protocol_version == "2025-11-25"
            assert init.server_info.name == "mcpbroker-demo"
            assert init.server_info.version == "0.1.0"
            assert init.instructions
            caps = init.capabilities
            assert caps.tools and caps.tools.list_changed
            assert caps.resources and caps.resources.list_changed and not caps.resources.subscribe
            assert caps.prompts and caps.prompts.list_changed
            assert caps.completions is not None and caps.logging is not None

            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert set(tools) == {"echo", "add", "pid", "slow", "fail", "crash", "payload"}
            assert tools["echo"].input_schema == {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            }
            assert tools["add"].input_schema["required"] == ["a", "b"]
            assert tools["add"].output_schema is not None
            slow = tools["slow"].input_schema["properties"]
            assert slow["seconds"]["default"] == 1 and slow["steps"]["default"] == 5
            assert tools["payload"].input_schema["properties"]["size"]["type"] == "integer"
            assert tools["pid"].input_schema == {"type": "object", "properties": {}}

            await session.send_ping()
            await session.set_logging_level("debug")


async def test_quick_tools() -> None:
    with trio.fail_after(TIMEOUT):
        async with connect() as session:
            echoed = await session.call_tool("echo", {"text": "hi ✓ \n there"})
            assert text_of(echoed) == "hi ✓ \n there" and not echoed.is_error

            added = await session.call_tool("add", {"a": 2, "b": 3})
            assert text_of(added) == "5"
            assert added.structured_content == {"result": 5}
            assert text_of(await session.call_tool("add", {"a": 1.5, "b": 2})) == "3.5"

            pid = int(text_of(await session.call_tool("pid", {})))
            assert pid != os.getpid()
            assert text_of(await session.call_tool("pid")) == str(pid)

            failed = await session.call_tool("fail", {})
            assert failed.is_error and text_of(failed) == "failure requested"
            failed = await session.call_tool("fail", {"message": "boom"})
            assert failed.is_error and text_of(failed) == "boom"

            assert text_of(await session.call_tool("payload", {"size": 100_000})) == "x" * 100_000
            assert text_of(await session.call_tool("payload", {"size": 0})) == ""


async def test_tool_errors() -> None:
    with trio.fail_after(TIMEOUT):
        async with connect() as session:
            with pytest.raises(MCPError) as caught:
                await session.call_tool("nope", {})
            assert caught.value.code == -32602
            assert caught.value.message == "Unknown tool: nope"

            bad: list[tuple[str, dict[str, Any]]] = [
                ("echo", {}),
                ("echo", {"text": 5}),
                ("add", {"a": 1, "b": "2"}),
                ("add", {"a": True, "b": 2}),
                ("payload", {"size": -1}),
                ("payload", {"size": 1.5}),
                ("slow", {"steps": 0}),
                ("add", {"a": 2**70, "b": 1}),  # a number, but past 64 bits
            ]
            for name, arguments in bad:
                result = await session.call_tool(name, arguments)
                assert result.is_error, (name, arguments)
                assert "argument" in text_of(result)
            big = await session.call_tool("add", {"a": 2**70, "b": 1})
            assert "past what this server computes with" in text_of(big)  # not "not a number"
            # The server is still fine.
            assert text_of(await session.call_tool("echo", {"text": "ok"})) == "ok"


async def test_slow_reports_progress() -> None:
    with trio.fail_after(TIMEOUT):
        async with connect() as session:
            updates: list[tuple[float, float | None, str | None]] = []
            all_three = trio.Event()

            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                updates.append((progress, total, message))
                if len(updates) == 3:
                    all_three.set()

            result = await session.call_tool(
                "slow", {"seconds": 0.15, "steps": 3}, progress_callback=on_progress
            )
            assert text_of(result) == "done after 3 steps" and not result.is_error
            # The SDK runs progress callbacks in tasks of their own; let them finish.
            await all_three.wait()
            assert updates == [(i, 3, f"step {i} of 3") for i in (1, 2, 3)]

            # Without a progress token there are no notifications, and defaults apply.
            result = await session.call_tool("slow", {"seconds": 0})
            assert text_of(result) == "done after 5 steps"


async def test_cancelling_slow() -> None:
    with trio.fail_after(TIMEOUT):
        async with connect() as session:
            started = trio.Event()
            finished = False

            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                started.set()

            async def call() -> None:
                nonlocal finished
                await session.call_tool(
                    "slow", {"seconds": 30, "steps": 300}, progress_callback=on_progress
                )
                finished = True

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                await started.wait()
                nursery.cancel_scope.cancel()
            assert not finished
            # The server got the SDK's notifications/cancelled and still answers.
            assert text_of(await session.call_tool("echo", {"text": "still here"})) == "still here"
            closing = trio.current_time()
        # The SDK closes stdin and allows 2s before it signals; the server exits at
        # once only if the cancelled call is no longer running.
        assert trio.current_time() - closing < 1.5


async def test_resources() -> None:
    with trio.fail_after(TIMEOUT):
        async with connect() as session:
            [resource] = (await session.list_resources()).resources
            assert (str(resource.uri), resource.name) == ("demo://readme", "readme")
            assert resource.mime_type == "text/plain"
            [template] = (await session.list_resource_templates()).resource_templates
            assert template.uri_template == "demo://greeting/{name}"
            assert (template.name, template.mime_type) == ("greeting", "text/plain")

            [readme] = (await session.read_resource("demo://readme")).contents
            assert str(readme.uri) == "demo://readme" and readme.mime_type == "text/plain"
            assert "mcpbroker" in getattr(readme, "text", "")

            [greeting] = (await session.read_resource("demo://greeting/Ada")).contents
            assert getattr(greeting, "text", None) == "Hello, Ada!"

            with pytest.raises(MCPError) as caught:
                await session.read_resource("demo://nowhere")
            assert caught.value.code == -32002
            assert caught.value.message == "Resource not found"
            assert caught.value.data == {"uri": "demo://nowhere"}


async def test_prompts() -> None:
    with trio.fail_after(TIMEOUT):
        async with connect() as session:
            [prompt] = (await session.list_prompts()).prompts
            assert prompt.name == "greet"
            assert prompt.arguments is not None
            [argument] = prompt.arguments
            assert (argument.name, argument.required) == ("name", True)

            got = await session.get_prompt("greet", {"name": "Grace"})
            assert got.description
            [message] = got.messages
            assert message.role == "user"
            assert isinstance(message.content, TextContent)
            assert message.content.text == "Please greet Grace warmly."

            for name, arguments in [("greet", {}), ("greet", None), ("nope", {"name": "x"})]:
                with pytest.raises(MCPError) as caught:
                    await session.get_prompt(name, arguments)
                assert caught.value.code == -32602


async def test_completion() -> None:
    with trio.fail_after(TIMEOUT):
        async with connect() as session:
            greet = PromptReference(type="ref/prompt", name="greet")
            done = await session.complete(greet, {"name": "name", "value": "Al"})
            assert done.completion.values == ["Alan", "Alice"]
            assert done.completion.total == 2 and done.completion.has_more is False

            template = ResourceTemplateReference(type="ref/resource", uri="demo://greeting/{name}")
            done = await session.complete(template, {"name": "name", "value": "G"})
            assert done.completion.values == ["Grace"]
            everyone = await session.complete(template, {"name": "name", "value": ""})
            assert len(everyone.completion.values) > 2

            other = PromptReference(type="ref/prompt", name="other")
            assert (
                await session.complete(other, {"name": "name", "value": "A"})
            ).completion.values == []
            wrong = await session.complete(greet, {"name": "mood", "value": "A"})
            assert wrong.completion.values == []


async def test_server_name_from_environment() -> None:
    with trio.fail_after(TIMEOUT):
        async with connect(MCPBROKER_DEMO_NAME="second-demo") as session:
            assert session.initialize_result is not None
            assert session.initialize_result.server_info.name == "second-demo"


async def test_crash_through_the_sdk() -> None:
    with trio.fail_after(TIMEOUT):
        async with connect() as session:
            with pytest.raises(MCPError) as caught:
                await session.call_tool("crash", {})
            assert caught.value.code == -32000  # connection closed


# --- raw bytes -----------------------------------------------------------------


async def test_garbage_input() -> None:
    with trio.fail_after(TIMEOUT):
        async with raw_server() as server:
            await server.send(
                b"this is not json",
                b"\xff\xfe{",
                b'"a string"',
                b"[1, 2]",
                b'{"jsonrpc": "2.0", "id": 1}',
                b'{"jsonrpc": "1.0", "id": 2, "method": "ping"}',
                b'{"jsonrpc": "2.0", "id": 3, "method": "ping", "params": [1]}',
                request(4, "no/such/method"),
                request(5, "tools/call", {"name": 7}),
                request(6, "tools/call", {"name": "add", "arguments": {"a": "x", "b": 1}}),
                request(7, "tools/call", {"name": "echo", "arguments": ["x"]}),
                request(8, "initialize"),
                request(9, "resources/read", {}),
                request(10, "logging/setLevel", {"level": "loud"}),
                request(11, "completion/complete", {"ref": "greet"}),
                b'{"jsonrpc": "2.0", "method": "notifications/whatever"}',
                b'{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}',
                b'{"jsonrpc": "2.0", "id": 99, "result": {}}',
                b"",
                b"   ",
            )
            # A request split across writes, and one with a CRLF ending.
            assert server.process.stdin is not None
            await server.process.stdin.send_all(request(12, "ping")[:10])
            await trio.sleep(0.05)
            await server.process.stdin.send_all(request(12, "ping")[10:] + b"\r\n")
            await server.send(
                request(13, "initialize", {"protocolVersion": "1999-01-01", "capabilities": {}}),
                request(14, "initialize", {"protocolVersion": "2024-11-05"}),
                request("s", "ping"),
            )
            await server.close_stdin()
            messages = await server.receive_all()
            assert await server.process.wait() == 0

    anonymous = [m["error"]["code"] for m in messages if m.get("id") is None]
    assert anonymous == [-32700, -32700, -32600, -32600]
    by_id = {m["id"]: m for m in messages if m.get("id") is not None}
    assert len(by_id) == len(messages) - 4  # nothing for notifications or responses
    codes = {id: m["error"]["code"] for id, m in by_id.items() if "error" in m}
    assert codes == {
        1: -32600,
        2: -32600,
        3: -32600,
        4: -32601,
        5: -32602,
        8: -32602,
        9: -32602,
        10: -32602,
        11: -32602,
    }
    assert by_id[6]["result"]["isError"] is True
    assert by_id[7]["result"]["isError"] is True
    assert by_id[12]["result"] == {} and by_id["s"]["result"] == {}
    assert by_id[13]["result"]["protocolVersion"] == "2025-11-25"
    assert by_id[14]["result"]["protocolVersion"] == "2024-11-05"


async def test_cancel_pid_and_eof() -> None:
    with trio.fail_after(TIMEOUT):
        async with raw_server() as server:
            token = {"_meta": {"progressToken": "tok"}}
            long = {"name": "slow", "arguments": {"seconds": 30, "steps": 3000}} | token
            await server.send(
                request("long", "tools/call", long),
                request(
                    2, "tools/call", {"name": "slow", "arguments": {"seconds": 0.3, "steps": 3}}
                ),
            )
            progress = await server.receive()
            assert progress["method"] == "notifications/progress"
            assert progress["params"]["progressToken"] == "tok"
            assert progress["params"]["total"] == 3000

            await server.send(
                cancel("long"),
                request(3, "tools/call", {"name": "pid"}),
                # Cancelled before its task has even started.
                request(4, "tools/call", {"name": "slow", "arguments": {"seconds": 30}}),
                cancel(4),
                cancel("never-sent"),
            )
            started = trio.current_time()
            # stdin EOF: the server finishes request 2, then exits; "long" is gone.
            await server.close_stdin()
            messages = await server.receive_all()
            assert await server.process.wait() == 0
            assert trio.current_time() - started < 5

    responses = {m["id"]: m["result"] for m in messages if "id" in m}
    assert set(responses) == {2, 3}
    assert responses[3]["content"][0]["text"] == str(server.process.pid)
    assert responses[2]["content"][0]["text"] == "done after 3 steps"


async def test_crash_exits_with_code_3() -> None:
    with trio.fail_after(TIMEOUT):
        async with raw_server() as server:
            await server.send(
                request(1, "tools/call", {"name": "slow", "arguments": {"seconds": 30}}),
                request(2, "tools/call", {"name": "crash", "arguments": {}}),
            )
            assert await server.process.wait() == 3
            assert await server.receive_all() == []
