"""End to end: a server's requests reach the client that caused them, every time.

Real processes: the official-SDK test server shared through the daemon, and
two or three official-SDK clients (each through its own `mcpbroker connect`)
with different sampling and elicitation callbacks, calling at once. And the
first call of fresh per-session servers that register a tool late.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import trio
from mcp import types
from mcp.shared.exceptions import MCPError

from tests.conftest import REPO, running_daemon, sdk_server, shim_client, text_of
from tests.test_server_requests_e2e import elicitor, sampler

CALLS = 30


def recording_sampler(name: str, seen: list[str]) -> Any:
    inner = sampler(name)

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
        seen.append(params.messages[0].content.text)
        return await inner(context, params)

    return sample


async def test_every_answer_comes_from_the_callers_own_callback(socket_path: str) -> None:
    """Three clients, 30 calls each at once: two sample, one elicits."""
    results: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    seen: dict[str, list[str]] = {"a": [], "b": []}
    server = {**sdk_server(), "serverRequests": "exclusive"}
    with trio.fail_after(90):
        async with (
            running_daemon({"s": server}, socket_path),
            shim_client(socket_path, "s", sampling_callback=recording_sampler("a", seen["a"])) as a,
            shim_client(socket_path, "s", sampling_callback=recording_sampler("b", seen["b"])) as b,
            shim_client(socket_path, "s", elicitation_callback=elicitor("c")) as c,
        ):

            async def sample(client: Any, name: str, i: int) -> None:
                answer = await client.call_tool("ask_llm", {"prompt": f"{name}{i}"})
                results[name].append(text_of(answer))

            async def elicit(i: int) -> None:
                results["c"].append(text_of(await c.call_tool("ask_user", {"question": f"{i}"})))

            async with trio.open_nursery() as nursery:
                for i in range(CALLS):
                    nursery.start_soon(sample, a, "a", i)
                    nursery.start_soon(sample, b, "b", i)
                    nursery.start_soon(elicit, i)
    for name in ("a", "b"):
        assert sorted(results[name]) == sorted(f"{name} answers {name}{i}" for i in range(CALLS))
        assert sorted(seen[name]) == sorted(f"{name}{i}" for i in range(CALLS))
    assert results["c"] == ["accept: c"] * CALLS


async def test_auto_refuses_what_it_cannot_attribute_then_takes_turns(socket_path: str) -> None:
    """The default: concurrent until the server first asks; a request it asks
    while several clients are in flight is refused (never guessed), and from
    then on every one reaches its caller."""
    outcomes: dict[str, list[str]] = {"a": [], "b": []}
    with trio.fail_after(90):
        async with (
            running_daemon({"s": sdk_server()}, socket_path),
            shim_client(socket_path, "s", sampling_callback=sampler("a")) as a,
            shim_client(socket_path, "s", sampling_callback=sampler("b")) as b,
        ):

            async def sample(client: Any, name: str, i: int) -> None:
                try:
                    answer = text_of(await client.call_tool("ask_llm", {"prompt": f"{i}"}))
                except MCPError as exc:
                    assert "not guessed" in str(exc)
                    answer = "refused"
                outcomes[name].append(answer)

            for _ in range(2):  # the first round may see refusals, the second may not
                for name in outcomes:
                    outcomes[name].clear()
                async with trio.open_nursery() as nursery:
                    for i in range(CALLS):
                        nursery.start_soon(sample, a, "a", i)
                        nursery.start_soon(sample, b, "b", i)
                for name in outcomes:
                    answered = {x for x in outcomes[name] if x != "refused"}
                    assert answered <= {f"{name} answers {i}" for i in range(CALLS)}
    for name in outcomes:
        assert sorted(outcomes[name]) == sorted(f"{name} answers {i}" for i in range(CALLS))


async def test_a_client_without_the_capability_gets_an_error_and_no_one_else_is_asked(
    socket_path: str,
) -> None:
    asked: list[str] = []
    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server()}, socket_path),
            shim_client(socket_path, "s", sampling_callback=recording_sampler("a", asked)) as a,
            shim_client(socket_path, "s") as plain,
        ):

            async def plain_asks(i: int) -> None:
                with pytest.raises(MCPError, match="did not declare the 'sampling' capability"):
                    await plain.call_tool("ask_llm", {"prompt": f"secret{i}"})

            async def a_asks(i: int) -> None:
                await a.call_tool("ask_llm", {"prompt": f"mine{i}"})

            await plain_asks(-1)  # alone: its own, refused
            async with trio.open_nursery() as nursery:
                for i in range(10):
                    nursery.start_soon(plain_asks, i)
                    nursery.start_soon(a_asks, i)
    assert not [prompt for prompt in asked if "secret" in prompt]


async def test_url_elicitation_and_its_completion_reach_the_caller(socket_path: str) -> None:
    notes: dict[str, list[str]] = {"a": [], "b": []}

    def noting(name: str) -> Any:
        async def handle(message: Any) -> None:
            if isinstance(message, types.ElicitCompleteNotification):
                notes[name].append(message.params.elicitation_id)

        return handle

    async def url_elicitor(context: Any, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="accept")

    capable = {"elicitation_callback": url_elicitor}
    server = {**sdk_server(), "serverRequests": "exclusive"}
    with trio.fail_after(60):
        async with (
            running_daemon({"s": server}, socket_path),
            shim_client(socket_path, "s", message_handler=noting("a"), **capable) as a,
            shim_client(socket_path, "s", message_handler=noting("b"), **capable) as b,
        ):
            async with trio.open_nursery() as nursery:
                for i in range(5):
                    nursery.start_soon(a.call_tool, "ask_url", {"elicitation_id": f"a{i}"})
                    nursery.start_soon(b.call_tool, "ask_url", {"elicitation_id": f"b{i}"})
            await trio.sleep(0.2)  # the last completions
    assert sorted(notes["a"]) == [f"a{i}" for i in range(5)]
    assert sorted(notes["b"]) == [f"b{i}" for i in range(5)]


def late_server() -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": ["-m", "tests.servers.late_server"],
        "cwd": str(REPO),
        "env": {"LATE_DELAY": "0.3"},
        "share": "per-session",
        # (it registers its tool on notifications/initialized, which the
        # 2026-07-28 era has not: a legacy-era server, opened so)
        "era": "legacy",
    }


async def test_a_fresh_per_session_server_serves_its_first_call(socket_path: str) -> None:
    """The server offers ``late`` only 0.3 s after notifications/initialized:
    each fresh session's instance is ready for its first call all the same."""
    failures: list[str] = []
    with trio.fail_after(120):
        async with running_daemon({"late": late_server()}, socket_path):
            async with shim_client(socket_path, "late") as first:  # the catalog shows it
                with trio.fail_after(10):
                    while "late" not in {t.name for t in (await first.list_tools()).tools}:
                        await trio.sleep(0.1)

            async def fresh() -> None:
                async with shim_client(socket_path, "late") as client:
                    await client.list_tools()
                    result = await client.call_tool("late", {})
                    if result.is_error:
                        failures.append(text_of(result))

            for _ in range(4):
                async with trio.open_nursery() as nursery:
                    for _ in range(5):
                        nursery.start_soon(fresh)
    assert failures == []


async def test_a_pool_serves_every_call_while_an_instance_restarts(socket_path: str) -> None:
    """A pool of three servers that offer ``late`` only 0.3 s after initialized:
    no call goes to an instance that is down, restarting or does not offer it yet,
    so killing one under load costs no call (issue #11: pooled instances are ready
    before their first call)."""
    import os
    import signal

    pooled = {**late_server(), "share": "shared", "pool": 3}
    failures: list[str] = []
    with trio.fail_after(120):
        async with running_daemon({"late": pooled}, socket_path) as daemon:
            group: Any = daemon.upstreams["late"]
            async with shim_client(socket_path, "late") as client:
                with trio.fail_after(10):  # the catalog instance shows it, then the others
                    while "late" not in {t.name for t in (await client.list_tools()).tools}:
                        await trio.sleep(0.1)
                    while sum(u.status.value == "ready" for u in group.instances()) < 3:
                        await trio.sleep(0.1)
                victim = next(u for u in group.instances() if u is not group._catalog)
                os.kill(victim.statistics().pid, signal.SIGKILL)
                while victim.status.value == "ready":  # (a call already on it would fail)
                    await trio.sleep(0.01)

                async def call() -> None:
                    result = await client.call_tool("late", {})
                    if result.is_error:
                        failures.append(text_of(result))

                calls = 0
                with trio.move_on_after(3):  # through the restart and the warm-up
                    while True:
                        async with trio.open_nursery() as nursery:
                            for _ in range(4):
                                nursery.start_soon(call)
                        calls += 4
                assert victim.statistics().restarts >= 1 and calls > 20
    assert failures == []
