"""Links to upstream servers: child processes for stdio servers.

A :class:`ServerLink` is what an Upstream talks through: a stream to write
to, a stream to read from, optionally the server's stderr, and a way to stop
it. :func:`launch_stdio` makes one from a config entry by starting the
server as a child process; tests pass the Upstream links over memory
streams instead.

Stopping a process follows MCP's stdio shutdown: close the server's stdin,
wait for it to exit, then SIGTERM, then SIGKILL. Every wait is bounded, and
the whole of it runs shielded, so a daemon being cancelled still leaves no
process behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from broker.config import ServerConfig

STOP_GRACE_SECONDS = 2.0
PIPE_SIZE = 1024 * 1024


class ServerLink(Protocol):
    @property
    def send_stream(self) -> trio.abc.SendStream: ...
    @property
    def receive_stream(self) -> trio.abc.ReceiveStream: ...
    @property
    def stderr(self) -> trio.abc.ReceiveStream | None: ...
    @property
    def pid(self) -> int | None: ...

    async def wait(self) -> int | None:
        """Wait for the server to end; its exit code if it has one."""

    async def close(self) -> int | None:
        """Stop the server (shielded, bounded); its exit code if it has one."""


class LaunchError(Exception):
    """A server that cannot be started as configured, however often one tries."""


Launcher = Callable[[], Awaitable[ServerLink]]


@attrs.define
class ProcessLink:
    process: trio.Process

    @property
    def send_stream(self) -> trio.abc.SendStream:
        assert self.process.stdin is not None
        return self.process.stdin

    @property
    def receive_stream(self) -> trio.abc.ReceiveStream:
        assert self.process.stdout is not None
        return self.process.stdout

    @property
    def stderr(self) -> trio.abc.ReceiveStream | None:
        return self.process.stderr

    @property
    def pid(self) -> int:
        return self.process.pid

    async def wait(self) -> int:
        return await self.process.wait()

    async def close(self) -> int | None:
        return await stop(self.process)


async def launch_stdio(config: ServerConfig) -> ProcessLink:
    """Start a stdio server with piped stdio, in its own session (no terminal signals).

    The server gets the daemon's environment with the config's ``env`` on top.
    """
    if config.command is None:
        raise LaunchError("is a remote (url) server, which this version cannot reach yet")
    process = await trio.lowlevel.open_process(
        [config.command, *config.args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **config.env},
        cwd=config.cwd,
        start_new_session=True,
    )
    for pipe in (process.stdin, process.stdout):
        fileno = getattr(pipe, "fileno", None)
        if fileno is not None:
            _widen(fileno())
    return ProcessLink(process)


def _widen(fd: int) -> None:
    """Give a pipe room for a large message (Linux; 64 KiB otherwise), best effort.

    A 1 MiB result then crosses in one or two reads instead of sixteen.
    """
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if set_size is None:
        return
    with contextlib.suppress(OSError):  # EPERM above /proc/sys/fs/pipe-max-size
        fcntl.fcntl(fd, set_size, PIPE_SIZE)


async def stop(process: trio.Process, grace: float = STOP_GRACE_SECONDS) -> int | None:
    """Close stdin, wait; SIGTERM, wait; SIGKILL. Returns the exit code."""
    with trio.CancelScope(shield=True):
        if process.stdin is not None:
            with trio.move_on_after(grace):
                await process.stdin.aclose()
        for escalate in (process.terminate, process.kill):
            with trio.move_on_after(grace):
                await process.wait()
            if process.returncode is not None:
                break
            escalate()
        await process.wait()
    return process.returncode
