"""The broker as the client under test of the MCP conformance suite's client
scenarios (``conformance client --command "python -m tests.conformance_client"``).

The suite starts a mock server for the scenario, then this command with the
server's URL as its last argument, ``MCP_CONFORMANCE_SCENARIO`` (the
scenario), ``MCP_CONFORMANCE_PROTOCOL_VERSION`` (the revision it runs at) and
``MCP_CONFORMANCE_CONTEXT`` (what to call, for some) in the environment. A
daemon is started with that URL as its one server (``s``, the default era),
and the official SDK client drives it through ``mcpbroker connect --server
s`` (the transparent view): it lists the tools and calls what the scenario
asks for, as the suite's own example client does. What the suite checks is
the broker's side of the wire: its headers, its ``_meta``, its retries of
``input_required`` calls. The SDK client speaks 2026-07-28 at that revision
(``Client(mode="auto")``), unless ``MCP_CONFORMANCE_BRIDGE`` is set: then,
as at any other revision, a legacy ``ClientSession``, which the broker
bridges to the modern mock server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import anyio
from mcp import Client, ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

MCPBROKER = os.path.join(os.path.dirname(sys.executable), "mcpbroker")
# The tools sep-2322-client-request-state's mock server offers, in the order
# the suite's example client calls them.
MRTR_TOOLS = ("test_mrtr_echo_state", "test_mrtr_unrelated", "test_mrtr_no_state",
              "test_mrtr_no_result_type")  # fmt: skip


async def elicit(context: Any, params: Any) -> types.ElicitResult:
    """Accept, with each field's default where the schema gives one (as a
    host's form shows it), else a value of the field's type."""
    schema = getattr(params, "requested_schema", None) or {}
    content: dict[str, Any] = {}
    for key, field in (schema.get("properties") or {}).items():
        kind = field.get("type")
        content[key] = field.get("default", {"boolean": True, "integer": 1}.get(kind, "yes"))
    return types.ElicitResult(action="accept", content=content or {"confirmed": True})


async def sample(context: Any, params: Any) -> types.CreateMessageResult:
    text = types.TextContent(type="text", text="ok")
    return types.CreateMessageResult(role="assistant", model="m", content=text)


async def roots(context: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri="file:///tmp", name="tmp")])


def calls_of(scenario: str, tools: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """What to call: the context's ``toolCalls``, the MRTR tools, nothing
    (json-schema-ref-no-deref's mock serves tools/list only), or the first
    tool with ``{"a": 2, "b": 3}``."""
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    if context.get("toolCalls"):
        return [(call["name"], call.get("arguments") or {}) for call in context["toolCalls"]]
    if scenario == "sep-2322-client-request-state":
        return [(name, {}) for name in MRTR_TOOLS]
    if scenario == "json-schema-2020-12-preservation":  # (the schema seen, sent back)
        seen = next(t.input_schema for t in tools if t.name == "json_schema_2020_12_tool")
        return [("json_schema_echo", {"schema": seen})]
    if scenario == "json-schema-ref-no-deref" or not tools:
        return []
    return [(tools[0].name, {"a": 2, "b": 3})]


async def drive(socket: str, modern: bool, scenario: str) -> None:
    shim = ["connect", "--socket", socket, "--server", "s"]
    params = StdioServerParameters(command=MCPBROKER, args=shim)
    callbacks: dict[str, Any] = {
        "elicitation_callback": elicit,
        "sampling_callback": sample,
        "list_roots_callback": roots,
    }
    if modern:
        async with Client(params, mode="auto", **callbacks) as client:
            assert client.protocol_version == "2026-07-28", client.protocol_version
            tools = await client.list_tools()
            for name, arguments in calls_of(scenario, tools.tools):
                await client.call_tool(name, arguments)
        return
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, **callbacks) as session,
    ):
        await session.initialize()
        listed = await session.list_tools()
        for name, arguments in calls_of(scenario, listed.tools):
            await session.call_tool(name, arguments)


def authorize(config: str, env: dict[str, str]) -> None:
    """``mcpbroker auth s --no-browser``, with this process as the browser:
    the address it prints is fetched, redirects followed (the suite's
    authorization server grants at once, with no page to click), until the
    redirect reaches ``auth``'s listener; then ``auth`` stores the tokens."""
    import urllib.error
    import urllib.request

    argv = [MCPBROKER, "auth", "s", "--no-browser", "--config", config]
    auth = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert auth.stdout is not None
    said = []
    for raw in auth.stdout:
        line = raw.decode().strip()
        said.append(line)
        if line.startswith("http"):
            try:
                urllib.request.urlopen(line, timeout=10).read()  # (redirects followed)
            except (OSError, urllib.error.URLError) as exc:
                said.append(f"(the browser: {exc})")
            break
    out, _ = auth.communicate(timeout=30)
    said.append(out.decode())
    print("\n".join(said), file=sys.stderr)


def main() -> int:
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    modern = os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION") == "2026-07-28"
    modern = modern and not os.environ.get("MCP_CONFORMANCE_BRIDGE")
    with tempfile.TemporaryDirectory() as directory:
        config = os.path.join(directory, "config.json")
        socket = os.path.join(directory, "broker.sock")
        entry: dict[str, Any] = {"url": url, "type": "http"}
        context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
        if "client_id" in context:  # (auth/pre-registration: a client registered by hand)
            entry["oauth"] = {"clientId": context["client_id"]}
            if "client_secret" in context:
                entry["oauth"]["clientSecret"] = context["client_secret"]
        with open(config, "w") as f:
            json.dump({"mcpServers": {"s": entry}}, f)
        env = {**os.environ, "MCPBROKER_TOKENS": os.path.join(directory, "tokens.json")}
        if scenario.startswith("auth/"):
            authorize(config, env)
        serve = [MCPBROKER, "serve", "--config", config, "--socket", socket]
        daemon = subprocess.Popen(
            serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )
        try:
            deadline = time.monotonic() + 20
            while not os.path.exists(socket) and time.monotonic() < deadline:
                time.sleep(0.05)
            anyio.run(drive, socket, modern, scenario, backend="trio")
        finally:
            daemon.terminate()
            daemon.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
