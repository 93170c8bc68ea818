"""The command line as a user meets it: versions, help, and one-line failures."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import MCPBROKER, REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MCPBROKER, *args],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,  # type: ignore[call-overload]
    )


def test_version() -> None:
    for flag in ("--version", "-V"):
        done = run(flag)
        assert done.returncode == 0 and done.stdout.startswith("mcpbroker 0.")


@pytest.mark.parametrize(
    "command",
    [[], ["serve"], ["connect"], ["status"], ["bench"], ["demo-config"], ["service"]],
)
def test_every_help_exits_0(command: list[str]) -> None:
    done = run(*command, "--help")
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr


def test_the_shims_failure_shows_only_the_failing_daemons_lines(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    socket_path = tmp_path / "s.sock"
    Path(str(socket_path) + ".log").write_text("a stale line from an earlier daemon\n" * 20)
    config = tmp_path / "bad.json"
    config.write_text('{"mcpServers": {"x": {"command": 5}}}')
    done = run("connect", "--socket", str(socket_path), "--config", str(config), input="")
    assert done.returncode == 1
    assert "mcpServers.x.command" in done.stderr
    assert "stale line" not in done.stderr


@pytest.mark.parametrize("seconds", ["-1", "nan", "inf", "0", "abc"])
def test_a_bad_watch_interval_is_a_usage_error(seconds: str, tmp_path: Path) -> None:
    # (-1 and nan printed the status, then a traceback; 0 polled without a pause)
    done = run("status", "--socket", str(tmp_path / "none.sock"), "--watch", seconds)
    assert done.returncode == 2 and "--watch: must be a number of seconds" in done.stderr
    assert "Traceback" not in done.stderr
