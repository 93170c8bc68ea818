"""An official-SDK server that speaks the legacy era, the modern one, or both.

Run as ``python -m tests.servers.era_server MODE [--http PORT]`` (``legacy``,
``modern`` or ``dual``; with ``--http``, served over Streamable HTTP at
``http://127.0.0.1:PORT/mcp`` instead of stdio). ``dual`` is
``MCPServer.run()``: the client's first request decides the era.
``legacy`` serves only the initialize handshake (the SDK's ``serve_loop``),
``modern`` only 2026-07-28 (the SDK's modern stream loop: ``server/discover``,
``subscriptions/listen``, no server-to-client requests).

Its tools ask for input the way that works in both eras, through the SDK's
resolvers: ``ask_user`` (an elicitation), ``ask_llm`` (sampling) and
``roots`` (the client's roots) become
``input_required`` in the modern era and requests to the client in the
legacy one. Over HTTP the SDK's app always serves both revisions (it routes on
the ``MCP-Protocol-Version`` header), so ``modern`` sends every request to
its 2026-07-28 handler (an ``initialize`` is then refused as such a server
refuses it) and ``legacy`` hides a modern version header from it (a
``server/discover`` POST then meets the legacy handler, which wants a
session). ``modern-only`` (HTTP only) sends every request to the SDK's
modern handler as it is, as a server built on that handler alone does: an
``initialize`` (no modern ``_meta``) is refused 400 with -32602, not -32022.
``grow`` adds a tool and announces it, ``touch`` announces a
change of a resource (in the era the call came in); ``log`` logs at info
and at warning; ``era`` says which era the call came in.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import anyio
from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, ListRoots, Resolve, Sample
from mcp.server.runner import _serve_modern_stream, serve_loop
from mcp.server.stdio import stdio_server
from pydantic import BaseModel, Field

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
def client_name(ctx: Context) -> str:
    """The name of the client this call came from, as the server knows it
    (in the modern era, from the call's ``_meta``: the SDK knows none without
    its clientInfo)."""
    params = ctx.session.client_params
    return params.client_info.name if params is not None else "(none)"


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


def http_app(mode: str) -> Any:
    """The SDK's Streamable HTTP app, narrowed to ``mode``'s era."""
    from mcp.server._streamable_http_modern import handle_modern_request
    from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER

    app = server.streamable_http_app(host="127.0.0.1")
    manager = server.session_manager
    header = MCP_PROTOCOL_VERSION_HEADER.encode()

    async def narrowed(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if scope["path"] == "/stats":
            import json

            body = json.dumps(STATS).encode()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        version = dict(scope["headers"]).get(header)
        if mode == "modern-only":  # (every request to the modern handler, as it is)
            await handle_modern_request(
                manager.app, manager.security_settings, manager.json_response,
                manager._lifespan_state, scope, receive, send,
            )  # fmt: skip
            return
        if mode == "modern" and version != MODERN.encode() and scope["method"] == "POST":
            await refuse_legacy(receive, send)
            return
        if mode == "modern" and version != MODERN.encode():
            await handle_modern_request(
                manager.app, manager.security_settings, manager.json_response,
                manager._lifespan_state, scope, receive, send,
            )  # fmt: skip
            return
        if mode == "legacy" and version == MODERN.encode():
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != header]}
        await app(scope, receive, send)

    return narrowed


async def refuse_legacy(receive: Any, send: Any) -> None:
    """A legacy POST (an ``initialize``, any request without the modern
    version header) at a modern-only server: 400 and -32022 naming the
    versions it serves (``basic/transports/streamable-http``, "Protocol
    Version Header"; what the SDK's modern stdio loop answers an initialize)."""
    import json

    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    try:
        request = json.loads(body)
        id = request.get("id") if isinstance(request, dict) else None
        requested = request["params"]["protocolVersion"]
    except (ValueError, KeyError, TypeError):
        id, requested = None, None
    data = {"supported": [MODERN], **({"requested": requested} if requested else {})}
    error = {"code": -32022, "message": "Unsupported protocol version", "data": data}
    payload = json.dumps({"jsonrpc": "2.0", "id": id, "error": error}).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def add_http_extras() -> None:
    """What only the HTTP tests use: a tool whose argument goes in a header
    (``x-mcp-header``), one whose mark is invalid, one that gets a mark
    later (``mark_shout``), a resource whose URI is not plain ASCII, a slow
    tool that tells whether it was cancelled (``GET /stats``)."""

    @server.tool()
    def region(
        where: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], size: int = 0
    ) -> str:
        """Its argument ``where`` is mirrored in ``Mcp-Param-Region``."""
        return f"region {where}"

    @server.tool()
    def bad_mark(tags: list[str]) -> str:
        """Marks an array argument: an invalid mark (clients over HTTP drop the tool)."""
        return ",".join(tags)

    # (put on after the SDK's checks, which refuse to define such a tool)
    marked = server._tool_manager.get_tool("bad_mark")
    assert marked is not None
    marked.parameters["properties"]["tags"]["x-mcp-header"] = "Tags"

    @server.tool()
    def shout(text: str) -> str:
        return text.upper()

    @server.tool()
    def mark_shout() -> str:
        """Marks ``shout``'s argument ``x-mcp-header: Text``, telling no one."""
        tool = server._tool_manager.get_tool("shout")
        assert tool is not None
        tool.parameters["properties"]["text"]["x-mcp-header"] = "Text"
        return "marked"

    @server.resource("test://era/café")
    def cafe() -> str:
        return "un café"

    @server.tool()
    async def slow() -> str:
        """Waits a minute; a cancelled call is counted in /stats."""
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            STATS["cancelled"] += 1
            raise
        return "slow"


STATS = {"cancelled": 0}


async def serve_http(mode: str, port: int) -> None:
    import uvicorn

    add_http_extras()

    config = uvicorn.Config(http_app(mode), host="127.0.0.1", port=port, log_level="warning")
    await uvicorn.Server(config).serve()


if __name__ == "__main__":
    kind = sys.argv[1] if len(sys.argv) > 1 else "dual"
    if len(sys.argv) > 3 and sys.argv[2] == "--http":
        anyio.run(serve_http, kind, int(sys.argv[3]))
    else:
        anyio.run(serve, kind)
