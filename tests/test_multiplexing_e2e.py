"""End to end: progress, cancellation and isolation through one shared SDK server."""

from __future__ import annotations

import os

import trio
from mcp import types

from actors.mailbox import OUTBOX_SIZE
from tests.conftest import running_daemon, sdk_server, shim_client, text_of


async def test_two_clients_with_the_same_progress_token_each_see_only_their_own(
    socket_path: str,
) -> None:
    seen: dict[str, list[float]] = {"a": [], "b": []}

    def recorder(name: str) -> types.ProgressFnT:
        async def record(progress: float, total: float | None, message: str | None) -> None:
            seen[name].append(progress)

        return record

    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server()}, socket_path),
            shim_client(socket_path, "s") as a,
            shim_client(socket_path, "s") as b,
        ):
            async with trio.open_nursery() as nursery:
                for name, client in (("a", a), ("b", b)):
                    nursery.start_soon(
                        lambda c=client, n=name: c.call_tool(
                            "slow", {"seconds": 1.0}, progress_callback=recorder(n)
                        )
                    )
            # The SDK delivers progress callbacks in tasks of its own: let them land.
            while min(len(steps) for steps in seen.values()) < 10:
                await trio.sleep(0.02)
    for name in ("a", "b"):
        assert sorted(seen[name]) == [float(step) for step in range(1, 11)], name


async def test_a_cancelled_call_is_cancelled_inside_the_server(socket_path: str) -> None:
    marker = os.path.join(os.path.dirname(socket_path), "cancelled.txt")
    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server()}, socket_path),
            shim_client(socket_path, "s") as client,
        ):
            with trio.move_on_after(1):
                await client.call_tool("wait_for_cancel", {"marker": marker})
                raise AssertionError("the call should still be running")
            while not os.path.exists(marker):
                await trio.sleep(0.05)
            # The session goes on; no late result turns up in its place.
            assert text_of(await client.call_tool("echo", {"text": "next"})) == "next"
    with open(marker) as f:
        assert f.read() == "cancelled"


async def test_a_client_that_stops_reading_is_cut_off_without_slowing_others(
    socket_path: str,
) -> None:
    with trio.fail_after(60):
        async with (
            running_daemon({"s": sdk_server()}, socket_path) as daemon,
            shim_client(socket_path, "s") as healthy,
        ):
            stuck = await trio.open_unix_socket(socket_path)
            await stuck.send_all(b'{"mcpbroker":{"servers":["s"]}}\n' + _initialize())
            call = (
                b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo",'
                b'"arguments":{"text":"' + b"x" * 2000 + b'"}}}\n'
            )

            async def flood() -> None:
                try:
                    for i in range(OUTBOX_SIZE * 4):
                        await stuck.send_all(call % i)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # cut off

            async with trio.open_nursery() as nursery:
                nursery.start_soon(flood)
                for i in range(30):
                    assert text_of(await healthy.call_tool("echo", {"text": str(i)})) == str(i)
            while len(daemon.statistics().sessions) > 1:
                await trio.sleep(0.05)
            await stuck.aclose()
            assert text_of(await healthy.call_tool("echo", {"text": "still"})) == "still"


def _initialize() -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":'
        b'"2025-11-25","capabilities":{},"clientInfo":{"name":"stuck","version":"0"}}}\n'
    )
