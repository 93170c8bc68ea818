"""docs/getting-started.md, followed word for word (#15).

The shell blocks of its steps 2 and 3 run as they are written, in bash, from
a fresh directory standing in for the clone (its ``.venv`` is the
environment under test: step 1, the install, is what made it), with HOME a
throwaway directory. Then an official-SDK host launches the command
``mcpbroker install`` wrote into the pretend host's file, calls a tool, and
``mcpbroker status --json`` shows its session. The daemon the first
``connect`` started is stopped at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import Implementation

from tests.conftest import MCPBROKER, REPO, text_of

GUIDE = REPO / "docs" / "getting-started.md"


def shell_blocks(markdown: str, *sections: str) -> list[str]:
    """The ```sh blocks under the ``## N.`` headings named, in order."""
    blocks = []
    for part in re.split(r"^## ", markdown, flags=re.MULTILINE):
        if part.split(".", 1)[0] in sections:
            blocks += re.findall(r"^```sh\n(.*?)^```", part, flags=re.MULTILINE | re.DOTALL)
    return blocks


def guide_env(home: Path, socket_path: str) -> dict[str, str]:
    """A terminal's environment with HOME elsewhere and the daemon's socket
    the test's own (so a daemon of the user's is never reached)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("MCPBROKER_") and key not in ("XDG_CONFIG_HOME", "PYTHONPATH")
    }
    env.update(HOME=str(home), MCPBROKER_SOCKET=socket_path)
    return env


async def test_the_getting_started_guide_ends_with_a_host_in_status(
    tmp_path: Path, socket_path: str
) -> None:
    clone, home = tmp_path / "clone", tmp_path / "home"
    clone.mkdir()
    home.mkdir()
    (clone / ".venv").symlink_to(sys.prefix)
    env = guide_env(home, socket_path)
    blocks = shell_blocks(GUIDE.read_text(), "2", "3")
    assert len(blocks) == 3, "the guide's steps 2 and 3 changed: update this test"
    daemon_pid = None
    try:
        with trio.fail_after(60):
            outputs = []
            for block in blocks:
                result = await trio.run_process(
                    ["bash", "-euo", "pipefail", "-c", block],
                    cwd=clone,
                    env=env,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
                assert result.returncode == 0, result.stderr.decode()
                outputs.append(result.stdout.decode())
            assert "moved 'demo' (mcpServers)" in outputs[1]
            host_file = json.loads((clone / "demo-host.json").read_text())
            answers = [json.loads(line) for line in outputs[2].splitlines()]
            assert [answer["id"] for answer in answers] == [1, 2]
            pid_by_hand = int(answers[1]["result"]["content"][0]["text"])

            entry = host_file["mcpServers"]["demo"]
            assert entry == {"command": MCPBROKER, "args": ["connect", "demo"]}
            host = StdioServerParameters(
                command=entry["command"],
                args=entry["args"],
                env={"HOME": str(home), "MCPBROKER_SOCKET": socket_path},
            )
            async with (
                stdio_client(host) as (read, write),
                ClientSession(
                    read, write, client_info=Implementation(name="guide-host", version="7")
                ) as session,
            ):
                init = await session.initialize()
                assert init.server_info.name == "mcpbroker-demo"
                pid = int(text_of(await session.call_tool("pid", {})))
                assert pid == pid_by_hand  # the same server process, shared
                status = await _status(env)
                daemon_pid = status["pid"]
                sessions = [s for s in status["sessions"] if s["client"]["name"] == "guide-host"]
                assert len(sessions) == 1
                assert sessions[0]["view"] == ["demo"] and sessions[0]["transport"] == "unix"
                (demo,) = status["servers"]
                assert demo["name"] == "demo" and demo["pid"] == pid
    finally:
        if daemon_pid is None:
            daemon_pid = await _daemon_pid(env)
        if daemon_pid is not None:
            os.kill(daemon_pid, signal.SIGTERM)
            with trio.fail_after(30):
                while _alive(daemon_pid):
                    await trio.sleep(0.05)


async def _status(env: dict[str, str]) -> Any:
    result = await trio.run_process(
        [MCPBROKER, "status", "--json"], env=env, capture_stdout=True, capture_stderr=True
    )
    return json.loads(result.stdout)


async def _daemon_pid(env: dict[str, str]) -> int | None:
    try:
        with trio.fail_after(10):
            status = await _status(env)
    except (subprocess.CalledProcessError, trio.TooSlowError):
        return None
    return int(status["pid"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (the daemon's parent, the first shim, has gone) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
