"""End to end: the official SDK client in 2026-07-28 mode through the broker.

The client (``Client(mode="auto")``, which probes ``server/discover`` and
stays modern if the answer names 2026-07-28) reaches the daemon through
``mcpbroker connect``; the server behind is the SDK test server, which the
broker opens with ``initialize`` (a legacy server to it).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from mcp import Client, types
from mcp.shared.exceptions import MCPError

from tests.conftest import running_daemon, sdk_server, shim_client, shim_parameters, text_of


def modern_client(socket_path: str, *servers: str, **kwargs: Any) -> Client:
    return Client(shim_parameters(socket_path, *servers), mode="auto", **kwargs)


async def test_a_modern_client_calls_a_legacy_server_through_the_broker(socket_path: str) -> None:
    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server("first")}, socket_path),
            modern_client(socket_path) as client,
        ):
            assert client.protocol_version == "2026-07-28"
            assert client.server_info is not None and client.server_info.name == "mcpbroker"
            tools = await client.list_tools()
            assert "s__echo" in [tool.name for tool in tools.tools]
            result = await client.call_tool("s__echo", {"text": "hello"})
            assert text_of(result) == "hello"
            prompt = await client.get_prompt("s__review", {"code": "x = 1"})
            assert prompt.messages
            read = await client.read_resource("test://first/hello")
            assert read.contents


async def test_a_legacy_servers_question_reaches_the_modern_client_as_input_required(
    socket_path: str,
) -> None:
    """The server elicits during the call; the SDK client's input_required
    driver answers it and retries; the server's answer comes back."""
    asked: list[str] = []

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"answer": "blue"})

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
        return types.CreateMessageResult(
            role="assistant",
            model="m",
            content=types.TextContent(type="text", text="Paris"),
        )

    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server()}, socket_path),
            modern_client(
                socket_path, "s", elicitation_callback=elicit, sampling_callback=sample
            ) as client,
        ):
            assert client.protocol_version == "2026-07-28"
            result = await client.call_tool("ask_user", {"question": "Favourite colour?"})
            assert text_of(result) == "accept: blue"
            assert asked == ["Favourite colour?"]
            result = await client.call_tool("ask_llm", {"prompt": "Capital of France?"})
            assert text_of(result) == "Paris"


async def test_a_modern_client_that_cannot_answer_gets_an_error_and_the_server_goes_on(
    socket_path: str,
) -> None:
    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server()}, socket_path),
            modern_client(socket_path, "s") as client,
        ):
            # The broker answers the server's question with an error (the call
            # did not declare elicitation); the SDK server fails the call with it.
            with pytest.raises(MCPError, match="did not declare the 'elicitation' capability"):
                await client.call_tool("ask_user", {"question": "?"})
            assert text_of(await client.call_tool("echo", {"text": "still here"})) == "still here"


async def test_legacy_and_modern_clients_share_one_server(socket_path: str) -> None:
    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server()}, socket_path),
            modern_client(socket_path) as modern,
            shim_client(socket_path) as legacy,
        ):
            pids = {
                text_of(await modern.call_tool("s__pid", {})),
                text_of(await legacy.call_tool("s__pid", {})),
            }
            assert len(pids) == 1


async def test_a_modern_client_hears_list_changed_on_its_listen_stream(socket_path: str) -> None:
    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server()}, socket_path),
            modern_client(socket_path) as client,
            client.listen(tools_list_changed=True, resource_subscriptions=["x://y"]) as stream,
        ):
            assert stream.honored.tools_list_changed
            assert not stream.honored.resource_subscriptions  # no server has x://y: not granted
            assert text_of(await client.call_tool("s__grow", {"name": "late"})) == "added late"
            event = await stream.__anext__()
            assert type(event).__name__ == "ToolsListChanged"
            # The broker tells sessions once its catalog has the new list.
            assert "s__late" in [tool.name for tool in (await client.list_tools()).tools]
