"""A real MCP server built with the official Python SDK, for end-to-end tests.

Run as ``python -m tests.servers.sdk_server`` with ``SDK_SERVER_NAME`` naming
it. Every copy offers the same tool and prompt names (so aggregation has
clashes to resolve) and resources under ``test://NAME/``. ``pid`` proves which
process served a call; ``whoami`` which server; ``slow`` sleeps (reporting
progress) so a test can kill the server mid-request; ``grow`` adds a tool at
run time and announces it with ``notifications/tools/list_changed``;
``ask_llm``, ``ask_user``, ``ask_url`` and ``roots`` send the client a
request (sampling, a form or URL elicitation, roots) and return its answer.
"""

from __future__ import annotations

import os

import anyio
from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

NAME = os.environ.get("SDK_SERVER_NAME", "sdk-test-server")
server = MCPServer(NAME, instructions=f"Test server {NAME}.")


@server.tool()
def pid() -> int:
    """The process id of the server."""
    return os.getpid()


@server.tool()
def whoami() -> str:
    """The name of the server."""
    return NAME


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def digits(n: int) -> str:
    """The integer's digits, as the server received it."""
    return str(n)


@server.tool()
async def slow(seconds: float, ctx: Context) -> str:
    """Sleep, reporting progress every 0.1 s."""
    steps = max(1, int(seconds * 10))
    for step in range(1, steps + 1):
        await anyio.sleep(seconds / steps)
        await ctx.report_progress(step, steps)
    return f"slept {seconds}"


@server.tool()
async def slow_pid(seconds: float) -> int:
    """Sleep, then say which process did."""
    await anyio.sleep(seconds)
    return os.getpid()


@server.tool()
async def wait_for_cancel(marker: str) -> str:
    """Wait a minute; if cancelled first, write "cancelled" to the file MARKER."""
    try:
        await anyio.sleep(60)
    except anyio.get_cancelled_exc_class():
        with open(marker, "w") as f:
            f.write("cancelled")
        raise
    return "not cancelled"


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Add a tool called NAME (it answers with this server's name) and announce it."""

    def added() -> str:
        return f"{name} from {NAME}"

    server.add_tool(added, name=name, description=f"added at run time to {NAME}")
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


@server.tool()
async def ask_llm(prompt: str, ctx: Context) -> str:
    """Ask the client's model (sampling) and return its answer."""
    message = types.SamplingMessage(
        role="user", content=types.TextContent(type="text", text=prompt)
    )
    # (related: over Streamable HTTP it rides the call's own stream)
    result = await ctx.session.create_message(
        [message], max_tokens=50, related_request_id=ctx.request_id
    )
    return result.content.text


class Answer(BaseModel):
    answer: str


@server.tool()
async def ask_user(question: str, ctx: Context) -> str:
    """Ask the client's user (elicitation) and return what they said."""
    result = await ctx.elicit(question, Answer)
    return f"{result.action}: {result.data.answer if result.data else ''}"


@server.tool()
async def ask_url(elicitation_id: str, ctx: Context) -> str:
    """Ask the client's user to visit a URL (URL-mode elicitation), then say it is done."""
    result = await ctx.elicit_url("Sign in, please", "https://example.com/in", elicitation_id)
    await ctx.session.send_elicit_complete(elicitation_id)
    return result.action


@server.tool()
async def roots(ctx: Context) -> str:
    """The client's roots, comma-separated."""
    result = await ctx.session.list_roots()
    return ",".join(str(root.uri) for root in result.roots)


@server.resource(f"test://{NAME}/hello")
def hello() -> str:
    return f"hello from {NAME}"


@server.resource(f"test://{NAME}/items/{{item}}")
def item(item: str) -> str:
    return f"item {item} from {NAME}"


@server.prompt()
def review(code: str) -> str:
    return f"{NAME}: please review {code}"


if __name__ == "__main__":
    server.run()
