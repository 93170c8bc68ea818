"""An official-SDK server that speaks the legacy era, the modern one, or both.

Run as ``python -m tests.servers.era_server MODE`` (``legacy``, ``modern``
or ``dual``). ``dual`` is ``MCPServer.run()``: the client's first request
decides the era. ``legacy`` serves only the initialize handshake (the SDK's
``serve_loop``), ``modern`` only 2026-07-28 (the SDK's modern stream loop:
``server/discover``, ``subscriptions/listen``, no server-to-client requests).

Its tools ask for input the way that works in both eras, through the SDK's
resolvers: ``ask_user`` (an elicitation), ``ask_llm`` (sampling) and
``roots`` (the client's roots) become
``input_required`` in the modern era and requests to the client in the
legacy one. ``grow`` adds a tool and announces it, ``touch`` announces a
change of a resource (in the era the call came in); ``log`` logs at info
and at warning; ``era`` says which era the call came in.
"""

from __future__ import annotations

import sys
from typing import Annotated

import anyio
from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, ListRoots, Resolve, Sample
from mcp.server.runner import _serve_modern_stream, serve_loop
from mcp.server.stdio import stdio_server
from pydantic import BaseModel

MODERN = "2026-07-28"
server = MCPServer("era-server", instructions="Speaks one era, or both.")


class Answer(BaseModel):
    answer: str


def ask_for_answer(question: str) -> Elicit[Answer]:
    return Elicit(question, Answer)


def ask_the_model(prompt: str) -> Sample:
    text = types.TextContent(type="text", text=prompt)
    return Sample([types.SamplingMessage(role="user", content=text)], max_tokens=50)


@server.tool()
def ask_user(question: str, answer: Annotated[Answer, Resolve(ask_for_answer)]) -> str:
    """Ask the client's user (elicitation) and return what they said."""
    return f"accept: {answer.answer}"


@server.tool()
def ask_llm(
    prompt: str, sampled: Annotated[types.CreateMessageResult, Resolve(ask_the_model)]
) -> str:
    """Ask the client's model (sampling) and return its answer."""
    content = sampled.content
    return content.text if isinstance(content, types.TextContent) else str(content)


def the_roots() -> ListRoots:
    return ListRoots()


@server.tool()
def roots(listed: Annotated[types.ListRootsResult, Resolve(the_roots)]) -> str:
    """The client's roots (roots/list), comma-separated."""
    return ",".join(str(root.uri) for root in listed.roots)


def _modern(ctx: Context) -> bool:
    return ctx.protocol_version == MODERN


@server.tool()
def era(ctx: Context) -> str:
    """The era this call came in."""
    return "modern" if _modern(ctx) else "legacy"


@server.tool()
def echo(text: str) -> str:
    return text


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Add a tool called NAME and announce it."""
    server.add_tool(lambda: name, name=name, description="added at run time")
    if _modern(ctx):
        await ctx.notify_tools_changed()
    else:
        await ctx.session.send_tool_list_changed()
    return f"added {name}"


@server.tool()
async def touch(uri: str, ctx: Context) -> str:
    """Announce that the resource URI changed."""
    if _modern(ctx):
        await ctx.notify_resource_updated(uri)
    else:
        await ctx.session.send_resource_updated(uri)
    return f"touched {uri}"


@server.tool()
async def log(ctx: Context) -> str:
    """Log one message at info and one at warning."""
    await ctx.info("at info")
    await ctx.warning("at warning")
    return "logged"


@server.resource("test://era/doc")
def doc() -> str:
    return "a document"


async def serve(mode: str) -> None:
    lowlevel = server._lowlevel_server
    options = lowlevel.create_initialization_options()
    async with stdio_server() as (read, write):
        if mode == "dual":
            await lowlevel.run(read, write, options)
            return
        async with lowlevel.lifespan(lowlevel) as state:
            if mode == "legacy":
                await serve_loop(lowlevel, read, write, lifespan_state=state, init_options=options)
            else:
                await _serve_modern_stream(
                    lowlevel, read, write, lifespan_state=state, raise_exceptions=False
                )


if __name__ == "__main__":
    anyio.run(serve, sys.argv[1] if len(sys.argv) > 1 else "dual")
