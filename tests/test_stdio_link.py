"""A stdio server's process (actors/links/stdio.py), stopped as MCP says, and
what it left behind with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import trio

from actors.links.stdio import stop

# A server that starts a child which ignores SIGTERM and reads no stdin (a
# helper it forgot, a language server), says its pid, and ends at EOF.
LEAVES_A_CHILD = """
import subprocess, sys
child = subprocess.Popen(
    [sys.executable, "-c",
     "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"],
    stdin=subprocess.DEVNULL,
)
print(child.pid, flush=True)
sys.stdin.read()
"""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_what_a_server_left_in_its_group_is_stopped_with_it(tmp_path: Path) -> None:
    """(The child outlived the server and the daemon.)"""
    with trio.fail_after(20):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", LEAVES_A_CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert process.stdout is not None
        child = int((await process.stdout.receive_some()).decode())
        assert not gone(child)
        await stop(process, grace=0.3)
        assert process.returncode == 0  # (it ended at EOF: only its child needed more)
        while not gone(child):  # (SIGKILL sent: the kernel takes a moment)
            await trio.sleep(0.01)
