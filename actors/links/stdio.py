"""A stdio server: a child process, newline-delimited JSON on its pipes.

:func:`launch_stdio` starts the server as configured and returns a
:class:`ProcessLink`: a :class:`~actors.links.stream.StreamLink` over the
child's stdin and stdout, plus what only a process has: its pid (in
``info``), its exit code (:meth:`ProcessLink.ended`) and its stderr, which a
task of the link's own copies into the daemon's log (actors/stderr.py).

Stopping a process follows MCP's stdio shutdown: close the server's stdin,
wait for it to exit, then SIGTERM, then SIGKILL; then the same for what it
left in its process group. Every wait is bounded, and the whole of it runs
shielded, so a daemon being cancelled still leaves no process behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess

import trio

from actors.links.link import LaunchError, LinkContext
from actors.links.stream import StreamLink
from actors.stderr import pump_stderr
from broker.config import ServerConfig

STOP_GRACE_SECONDS = 2.0
PIPE_SIZE = 1024 * 1024
EXIT_CODE_WAIT = 0.5  # after stdout closes, how long to wait for the exit code


class ProcessLink(StreamLink):
    def __init__(self, process: trio.Process, max_message_bytes: int) -> None:
        assert process.stdin is not None and process.stdout is not None
        super().__init__(
            process.stdin, process.stdout, max_message_bytes, info={"pid": process.pid}
        )
        self.process = process

    async def ended(self) -> str:
        with trio.move_on_after(EXIT_CODE_WAIT):
            return f" with code {await self.process.wait()}"
        return ""

    async def close(self) -> None:
        await stop(self.process)


async def launch_stdio(config: ServerConfig, context: LinkContext) -> ProcessLink:
    """Start a stdio server with piped stdio, in its own session (no terminal
    signals); its stderr goes to the server's log from a task of the link's.

    The server gets the daemon's environment with the config's ``env`` on top.
    """
    if config.command is None:
        raise LaunchError("has no command to start")
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
    if process.stderr is not None:
        context.nursery.start_soon(pump_stderr, process.stderr, context.log, context.stderr_tail)
    return ProcessLink(process, context.max_message_bytes)


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
    """Close stdin, wait; SIGTERM, wait; SIGKILL. Then what the server left
    behind in its process group (it leads one: ``start_new_session``) gets
    SIGTERM, and SIGKILL if it is still there after ``grace``: a server's
    child that ignored SIGTERM and read no stdin outlived the daemon.
    Returns the exit code."""
    group = process.pid
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
        # (at once: while a member of the group lives, its id is no new process's)
        if _signal_group(group, signal.SIGTERM):
            with trio.move_on_after(grace):
                while _signal_group(group, 0):  # noqa: ASYNC110 (no event tells)
                    await trio.sleep(0.05)
                return process.returncode
            _signal_group(group, signal.SIGKILL)
    return process.returncode


def _signal_group(group: int, signum: int) -> bool:
    """Send ``signum`` to process group ``group``; whether it has members."""
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True
