"""End to end: requests a shared SDK server sends its clients reach the right one.

Sampling, elicitation and roots requests from one server process shared by
several official SDK clients (each through its own `mcpbroker connect`).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from mcp import types
from mcp.shared.exceptions import MCPError

from tests.conftest import running_daemon, sdk_server, shim_client, text_of


def sampler(name: str) -> Any:
    async def sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
        prompt = params.messages[0].content.text
        return types.CreateMessageResult(
            role="assistant",
            model=name,
            content=types.TextContent(type="text", text=f"{name} answers {prompt}"),
        )

    return sample


def elicitor(answer: str) -> Any:
    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"answer": answer})

    return elicit


def rooted(*uris: str) -> Any:
    async def list_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in uris])  # type: ignore[arg-type]

    return list_roots


async def test_each_request_reaches_the_only_client_that_can_answer_it(socket_path: str) -> None:
    """A can sample, B can elicit; both call at once, again and again (on a
    server configured to take one client at a time from the start)."""
    results: dict[str, list[str]] = {"a": [], "b": []}
    with trio.fail_after(60):
        async with (
            running_daemon({"s": {**sdk_server(), "serverRequests": "exclusive"}}, socket_path),
            shim_client(
                socket_path,
                "s",
                sampling_callback=sampler("a"),
                list_roots_callback=rooted("file:///a"),
            ) as a,
            shim_client(socket_path, "s", elicitation_callback=elicitor("b")) as b,
        ):

            async def ask_a(i: int) -> None:
                results["a"].append(text_of(await a.call_tool("ask_llm", {"prompt": f"q{i}"})))

            async def ask_b(i: int) -> None:
                answer = await b.call_tool("ask_user", {"question": f"q{i}"})
                results["b"].append(text_of(answer))

            async with trio.open_nursery() as nursery:
                for i in range(5):
                    nursery.start_soon(ask_a, i)
                    nursery.start_soon(ask_b, i)
            assert text_of(await a.call_tool("roots", {})) == "file:///a"
    assert sorted(results["a"]) == [f"a answers q{i}" for i in range(5)]
    assert results["b"] == ["accept: b"] * 5


async def test_a_request_no_client_can_answer_fails_cleanly(socket_path: str) -> None:
    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server()}, socket_path),
            shim_client(socket_path, "s") as plain,
        ):
            # The server's sampling request gets an error, which the SDK server
            # passes on as the error of the tool call.
            with pytest.raises(MCPError, match=r"did not declare the 'sampling' capability"):
                await plain.call_tool("ask_llm", {"prompt": "anyone?"})
            assert text_of(await plain.call_tool("echo", {"text": "fine"})) == "fine"


async def test_the_most_recent_caller_gets_it_when_only_it_is_in_flight(socket_path: str) -> None:
    """Two clients that both can sample; one calls at a time: no guessing needed."""
    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server()}, socket_path),
            shim_client(socket_path, "s", sampling_callback=sampler("first")) as first,
            shim_client(socket_path, "s", sampling_callback=sampler("second")) as second,
        ):
            for client, name in [(first, "first"), (second, "second"), (first, "first")]:
                answer = text_of(await client.call_tool("ask_llm", {"prompt": "who?"}))
                assert answer == f"{name} answers who?"


async def test_per_session_servers_never_have_to_guess(socket_path: str) -> None:
    """Both clients can sample and call at once: each has its own server process."""
    answers: dict[str, list[str]] = {"x": [], "y": []}
    servers = {"s": {**sdk_server(), "share": "per-session"}}
    with trio.fail_after(60):
        async with (
            running_daemon(servers, socket_path),
            shim_client(socket_path, "s", sampling_callback=sampler("x")) as x,
            shim_client(socket_path, "s", sampling_callback=sampler("y")) as y,
        ):

            async def ask(client: Any, name: str, i: int) -> None:
                answer = await client.call_tool("ask_llm", {"prompt": f"q{i}"})
                answers[name].append(text_of(answer))

            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(ask, x, "x", i)
                    nursery.start_soon(ask, y, "y", i)
    for name in ("x", "y"):
        assert sorted(answers[name]) == [f"{name} answers q{i}" for i in range(4)]
