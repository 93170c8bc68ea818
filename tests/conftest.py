"""Fixtures shared by the end-to-end tests: a daemon, SDK clients through the shim."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from actors.daemon import RULES, Daemon
from broker.config import parse_config

REPO = Path(__file__).resolve().parent.parent
MCPBROKER = shutil.which("mcpbroker", path=os.path.dirname(sys.executable)) or "mcpbroker"


def pytest_report_header() -> str:
    return f"mcpbroker rules (broker/): {RULES}"


@pytest.fixture
def socket_path() -> Iterator[str]:
    """A socket path short enough for AF_UNIX (pytest's tmp_path can be too long)."""
    directory = tempfile.mkdtemp(prefix="mcpb-")
    path = os.path.join(directory, "broker.sock")
    yield path
    stop_leftover_daemon(path)
    shutil.rmtree(directory, ignore_errors=True)


def stop_leftover_daemon(path: str) -> None:
    """Stop a daemon process still serving ``path`` at a test's end (a shim
    the test ran started it, and nothing stopped it): it would serve a deleted
    directory for ever, and load the machine the benchmarks measure on. (The
    lock file names it; a daemon in the test's own process is left alone.)"""
    import psutil

    try:
        with open(path + ".lock") as lock:
            pid = int(lock.read().strip())
        process = psutil.Process(pid)
        if pid == os.getpid() or path not in process.cmdline():
            return
        process.terminate()
        try:
            process.wait(5)
        except psutil.TimeoutExpired:
            process.kill()
    except (OSError, ValueError, psutil.Error):
        return


def sdk_server(name: str = "sdk-test-server") -> dict[str, Any]:
    """Config entry for the official-SDK test server (tests/servers/sdk_server.py).

    ``"era": "legacy"``, as docs/eras.md tells users of such a server: the SDK
    serves both eras, but its tools ask and notify the legacy way
    (``ctx.elicit``, ``send_tool_list_changed``), which the 2026-07-28 era the
    default would open it in does not have. Tests of the default era use
    tests/servers/era_server.py, whose tools work in both."""
    return {
        "command": sys.executable,
        "args": ["-m", "tests.servers.sdk_server"],
        "cwd": str(REPO),
        "env": {"SDK_SERVER_NAME": name},
        "era": "legacy",
    }


def demo_server() -> dict[str, Any]:
    return {"command": sys.executable, "args": ["-m", "tools.demo_server"], "cwd": str(REPO)}


@asynccontextmanager
async def running_daemon(
    servers: dict[str, Any],
    socket_path: str,
    wait: tuple[str, ...] | None = None,
    broker: dict[str, Any] | None = None,
) -> AsyncIterator[Daemon]:
    """A daemon in this process, its servers (or those in ``wait``) up, cancelled on exit."""
    daemon = Daemon(parse_config({"mcpServers": servers, "broker": broker or {}}), socket_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        with trio.fail_after(30):
            for name in daemon.upstreams if wait is None else wait:
                await daemon.upstreams[name].wait_ready()
        yield daemon
        nursery.cancel_scope.cancel()


def shim_parameters(
    socket_path: str, *servers: str, config: str | None = None
) -> StdioServerParameters:
    args = ["connect", "--socket", socket_path]
    for server in servers:
        args += ["--server", server]
    if config:
        args += ["--config", config]
    return StdioServerParameters(command=MCPBROKER, args=args, env={"PYTHONPATH": str(REPO)})


@asynccontextmanager
async def shim_client(
    socket_path: str, *servers: str, **kwargs: Any
) -> AsyncIterator[ClientSession]:
    """An official SDK client that reaches the daemon through `mcpbroker connect`."""
    params = shim_parameters(socket_path, *servers, config=kwargs.pop("config", None))
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, **kwargs) as session,
    ):
        await session.initialize()
        yield session


def text_of(result: Any) -> str:
    return "".join(block.text for block in result.content if getattr(block, "text", None))
