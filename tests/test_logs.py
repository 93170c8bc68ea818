"""The daemon's log file rotates, and is never opened through a symlink."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from actors.logs import RotatingLog
from actors.paths import UnsafePath
from tests.conftest import MCPBROKER, REPO


def test_the_log_rotates_and_stays_bounded(tmp_path: Path) -> None:
    log = RotatingLog(str(tmp_path / "d.log"), max_bytes=10_000, backups=2)
    for n in range(2_000):  # ~100 KB through a 10 KB file
        log.write(json.dumps({"event": "x", "n": n}) + "\n")
    log.flush()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["d.log", "d.log.1", "d.log.2"]
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 3 * 10_000
    last = (tmp_path / "d.log").read_text().splitlines()[-1]
    assert json.loads(last)["n"] == 1_999
    assert oct((tmp_path / "d.log").stat().st_mode & 0o777) == "0o600"


def test_a_log_symlink_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("precious")
    (tmp_path / "d.log").symlink_to(target)
    with pytest.raises(UnsafePath):
        RotatingLog(str(tmp_path / "d.log"))
    assert target.read_text() == "precious"


def test_serve_writes_json_lines_to_its_log_file(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    serve = subprocess.Popen(
        [
            MCPBROKER,
            "serve",
            "--demo",
            "--socket",
            str(tmp_path / "s.sock"),
            "--log-file",
            str(tmp_path / "s.log"),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(200):
            text = (tmp_path / "s.log").read_text() if (tmp_path / "s.log").exists() else ""
            if "daemon.listening" in text:
                break
            subprocess.run(["sleep", "0.05"], check=True)
    finally:
        serve.terminate()
        _, stderr = serve.communicate(timeout=20)
    events = [json.loads(line)["event"] for line in (tmp_path / "s.log").read_text().splitlines()]
    assert "daemon.listening" in events and "daemon.stopped" in events
    assert stderr == b""


class Gone:
    """A stderr whose reader went away (``serve | tee`` after tee ended)."""

    def write(self, text: str) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise OSError(5, "Input/output error")  # (a closed terminal)

    def isatty(self) -> bool:
        return False


def test_a_log_stream_that_fails_costs_lines_not_the_caller() -> None:
    # (the BrokenPipeError came out of the next log.info(): the daemon died)
    import structlog

    from actors.logs import configure_logging, get_logger

    try:
        configure_logging("info", stream=Gone())  # type: ignore[arg-type]
        get_logger(session=1).info("session.opened")
        get_logger().error("server.down", reason="x")
    finally:
        structlog.reset_defaults()


def test_the_console_format_escapes_control_characters() -> None:
    import io

    import structlog

    from actors.logs import configure_logging, get_logger

    out = io.StringIO()
    try:
        configure_logging("info", stream=out, json=False)
        get_logger(server="s").info("server.stderr", line="\x1b]0;PWNED\x07\x1b[2J")
    finally:
        structlog.reset_defaults()
    assert "\x1b" not in out.getvalue() and "\\u001b]0;PWNED" in out.getvalue()
