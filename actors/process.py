"""Child processes for stdio servers: spawn, and stop them the way the spec says.

MCP's stdio shutdown: close the server's stdin, wait for it to exit, then
SIGTERM, then SIGKILL. Every wait is bounded, and the whole of it runs
shielded, so a daemon being cancelled still leaves no process behind.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

import trio

STOP_GRACE_SECONDS = 2.0


async def spawn(
    command: str, args: Sequence[str], env: Mapping[str, str], cwd: str | None
) -> trio.Process:
    """Start a server with piped stdio, in its own session (no terminal signals)."""
    return await trio.lowlevel.open_process(
        [command, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
        cwd=cwd,
        start_new_session=True,
    )


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
