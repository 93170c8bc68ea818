"""A host survives a daemon restart: the official SDK client through the shim,
the daemon a real process killed (SIGKILL) or stopped for an upgrade (SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from tests.conftest import MCPBROKER, REPO, shim_parameters, text_of

SERVER = {"command": sys.executable, "args": ["-m", "tests.servers.subscribable"], "cwd": str(REPO)}
URI = "test://sub/thing"


@pytest.fixture
def config_file(socket_path: str) -> str:
    path = os.path.join(os.path.dirname(socket_path), "config.json")
    with open(path, "w") as f:
        json.dump({"mcpServers": {"sub": SERVER}}, f)
    return path


def daemon_pid(socket_path: str) -> int:
    with open(socket_path + ".lock") as f:
        return int(f.read().strip())


async def wait_gone(pid: int) -> None:
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await trio.sleep(0.02)


class Host:
    """What the host's SDK session was told: log messages, resources/updated."""

    def __init__(self) -> None:
        self.logs: list[str] = []
        self.updated = trio.Event()

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(str(params.level))

    async def on_message(self, message: object) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updated.set()


@asynccontextmanager
async def host_session(
    socket_path: str, host: Host, config: str | None
) -> AsyncIterator[ClientSession]:
    params = shim_parameters(socket_path, "sub", config=config)
    handlers: dict[str, Any] = {"logging_callback": host.on_log, "message_handler": host.on_message}
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, **handlers) as session,
    ):
        await session.initialize()
        yield session


async def set_up(session: ClientSession, host: Host) -> int:
    """Set the state a restart must keep; the server's pid."""
    await session.set_logging_level("error")
    await session.subscribe_resource(URI)
    await session.call_tool("log", {})
    await session.call_tool("touch", {})
    with trio.fail_after(5):
        await host.updated.wait()
    host.updated = trio.Event()
    return int(text_of(await session.call_tool("pid", {})))


async def call_in_flight(session: ClientSession, caught: list[MCPError]) -> None:
    """A call that is still running when the daemon goes: it must get an error."""
    with pytest.raises(MCPError) as info:
        await session.call_tool("slow", {"seconds": 20})
    caught.append(info.value)


async def check_state_survived(session: ClientSession, host: Host, old_pid: int) -> None:
    assert int(text_of(await session.call_tool("pid", {}))) != old_pid  # a new server
    host.logs.clear()
    await session.call_tool("log", {})
    await trio.sleep(0.2)
    assert host.logs == ["error"]  # the level "error" was replayed: "info" is filtered
    await session.call_tool("touch", {})
    with trio.fail_after(3):
        await host.updated.wait()  # the subscription was replayed


class DaemonsByHand:
    """Daemons started by hand (``mcpbroker serve``), as a user upgrading
    does; :func:`daemons_by_hand` stops any still running at the end."""

    def __init__(self, socket_path: str, config_file: str) -> None:
        self.socket_path = socket_path
        self.serve = [MCPBROKER, "serve", "--config", config_file, "--socket", socket_path]
        self.started: list[trio.Process] = []

    async def start(self, *, listening: bool = False) -> trio.Process:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        process = await trio.lowlevel.open_process(self.serve, env=env, stderr=subprocess.DEVNULL)
        self.started.append(process)
        while listening and not os.path.exists(self.socket_path):
            await trio.sleep(0.05)
        return process


@asynccontextmanager
async def daemons_by_hand(socket_path: str, config_file: str) -> AsyncIterator[DaemonsByHand]:
    daemons = DaemonsByHand(socket_path, config_file)
    try:
        yield daemons
    finally:
        with trio.move_on_after(10) as cleanup:
            cleanup.shield = True
            for process in daemons.started:
                if process.returncode is None:
                    process.terminate()
                    await process.wait()


async def test_sigkill_the_daemon_under_a_host_session(socket_path: str, config_file: str) -> None:
    host = Host()
    with trio.fail_after(60):
        async with host_session(socket_path, host, config_file) as session:
            old_pid = await set_up(session, host)
            daemon = daemon_pid(socket_path)
            caught: list[MCPError] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call_in_flight, session, caught)
                await trio.sleep(0.5)  # (the call reaches the server)
                os.kill(daemon, signal.SIGKILL)
            # The call in flight got its error (the nursery waited for it), at once:
            assert caught and "daemon went away" in str(caught[0])
            with trio.fail_after(3):
                result = await session.call_tool("pid", {})  # the next call, same session
            assert not result.is_error
            assert daemon_pid(socket_path) != daemon  # the shim started a new one
            await check_state_survived(session, host, old_pid)
            os.kill(daemon_pid(socket_path), signal.SIGTERM)


async def test_an_upgrade_by_hand_sigterm_then_a_new_daemon(
    socket_path: str, config_file: str
) -> None:
    host = Host()
    caught: list[MCPError] = []
    with trio.fail_after(60):
        async with daemons_by_hand(socket_path, config_file) as daemons:
            first = await daemons.start(listening=True)
            # (no --config: this shim cannot start a daemon, it waits for one)
            async with host_session(socket_path, host, None) as session:
                old_pid = await set_up(session, host)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call_in_flight, session, caught)
                    await trio.sleep(0.5)  # (the call reaches the server)
                    first.send_signal(signal.SIGTERM)
                    await first.wait()
                # The stopping daemon answers it (after broker.shutdownTimeout).
                assert caught and "the daemon is stopping" in str(caught[0])
                results: list[Any] = []

                async def call_during_the_gap() -> None:
                    results.append(await session.call_tool("pid", {}))

                async with trio.open_nursery() as nursery:
                    # A call made while no daemon runs waits in the shim's
                    # stdin; the new daemon serves it.
                    nursery.start_soon(call_during_the_gap)
                    await trio.sleep(0.5)
                    assert not results
                    second = await daemons.start()
                    with trio.fail_after(10):
                        while not results:
                            await trio.sleep(0.05)
                assert not results[0].is_error
                assert daemon_pid(socket_path) == second.pid
                await check_state_survived(session, host, old_pid)


async def test_with_no_resume_the_shim_exits_as_before(socket_path: str, config_file: str) -> None:
    params = shim_parameters(socket_path, "sub", config=config_file)
    params.args.append("--no-resume")
    with trio.fail_after(60):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await session.call_tool("pid", {})
            daemon = daemon_pid(socket_path)
            os.kill(daemon, signal.SIGKILL)
            with pytest.raises(Exception):  # noqa: B017 (the session is gone: any error)
                with trio.fail_after(5):
                    await session.call_tool("pid", {})
        await wait_gone(daemon)


async def test_a_host_that_closed_its_stdin_hears_of_a_call_the_daemon_took_with_it(
    socket_path: str, config_file: str
) -> None:
    """``printf ... | mcpbroker connect``: the host's input ends after its
    last request, and the daemon dies while that call runs. The call gets
    its error, and the shim exits 1, saying so. (It wrote nothing for the
    call and exited 0.)"""
    params = shim_parameters(socket_path, "sub", config=config_file)
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "slow", "arguments": {"seconds": 20}}},
    ]  # fmt: skip
    with trio.fail_after(60):
        shim = await trio.lowlevel.open_process(
            [params.command, *params.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **(params.env or {})},
        )
        assert shim.stdin is not None and shim.stdout is not None
        await shim.stdin.send_all(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
        await shim.stdin.aclose()
        out = b""
        while b'"id":1' not in out.replace(b" ", b""):
            out += await shim.stdout.receive_some()
        await trio.sleep(0.5)  # (the call is running)
        daemon = daemon_pid(socket_path)
        os.kill(daemon, signal.SIGKILL)
        while chunk := await shim.stdout.receive_some():
            out += chunk
        assert await shim.wait() == 1
        answers = [json.loads(line) for line in out.splitlines()]
        (lost,) = [a for a in answers if a.get("id") == 2]
        assert lost["error"]["code"] == -32000
        await wait_gone(daemon)


async def test_a_call_made_while_the_daemon_drains_is_served_by_the_next_one(
    socket_path: str, config_file: str
) -> None:
    """SIGTERM drains: calls in flight finish. A call the host makes meanwhile
    was refused ("the daemon is stopping"); now the daemon tells the shim it
    is stopping, and the shim holds the host's new requests for the next
    daemon, as during a gap (broker/hello.py's notices)."""
    host = Host()
    with trio.fail_after(60):
        async with daemons_by_hand(socket_path, config_file) as daemons:
            first = await daemons.start(listening=True)
            async with host_session(socket_path, host, None) as session:
                old_pid = await set_up(session, host)
                results: dict[str, Any] = {}

                async def call(name: str, tool: str, arguments: dict[str, Any]) -> None:
                    results[name] = await session.call_tool(tool, arguments)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call, "slow", "slow", {"seconds": 2})
                    await trio.sleep(0.5)  # (the call reaches the server)
                    first.send_signal(signal.SIGTERM)
                    await trio.sleep(0.5)  # (the drain has begun)
                    nursery.start_soon(call, "during", "pid", {})
                    await first.wait()
                    assert not results["slow"].is_error  # (finished within the drain)
                    assert "during" not in results  # held: not refused
                    second = await daemons.start()
                assert not results["during"].is_error, results["during"]
                assert int(text_of(results["during"])) != old_pid  # the next daemon's server
                assert daemon_pid(socket_path) == second.pid


async def test_a_server_that_fails_its_first_start_at_the_new_daemon_does_not_end_the_host(
    socket_path: str,
) -> None:
    """At the next daemon the session's server crashed on its first start
    (it is restarting): the daemon answered the replayed initialize with
    -32000 "... is not running", and the shim took that for "no longer
    configured" and ended: the host lost its server for good at a plain
    restart. Now the shim tries the replay again, and the session goes on
    once the server is up. (Found by review.)"""
    marker = os.path.join(os.path.dirname(socket_path), "up-once")
    script = (
        f'if [ -e "{marker}" ]; then exec "{sys.executable}" -m tests.servers.subscribable; fi; '
        f'touch "{marker}"; exit 1'
    )
    config = os.path.join(os.path.dirname(socket_path), "flaky.json")
    with open(config, "w") as f:
        server = {"command": "sh", "args": ["-c", script], "cwd": str(REPO), "restartDelay": 3}
        json.dump({"mcpServers": {"sub": server}}, f)
    open(marker, "w").close()  # (the first daemon's server starts at once)
    with trio.fail_after(60):
        async with daemons_by_hand(socket_path, config) as daemons:
            first = await daemons.start(listening=True)
            async with host_session(socket_path, Host(), None) as session:
                old_pid = int(text_of(await session.call_tool("pid", {})))
                first.send_signal(signal.SIGTERM)
                await first.wait()
                os.unlink(marker)  # (the next one's fails once, then starts 1.5 to 3 s later)
                await daemons.start()
                with trio.fail_after(30):
                    result = await session.call_tool("pid", {})
                assert not result.is_error, result
                assert int(text_of(result)) != old_pid
