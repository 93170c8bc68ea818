"""``python -m benchmarks.http_link`` (the HTTP link alone, its CPU per call)
runs its calls against the SDK's own Streamable HTTP server and says what
they cost."""

from __future__ import annotations

import re
import sys

import trio

from tests.conftest import REPO
from tests.test_http_upstream_e2e import http_server


async def test_the_link_alone_is_measured_against_a_real_server() -> None:
    with trio.fail_after(60):
        async with http_server("streamable-http") as (url, _process):
            command = [sys.executable, "-m", "benchmarks.http_link", url]
            command += ["--clients", "4", "--calls", "20", "--warmup", "4"]
            done = await trio.run_process(
                command, cwd=str(REPO), capture_stdout=True, capture_stderr=True, check=False
            )
    assert done.returncode == 0, done.stderr.decode()
    line = done.stdout.decode().strip()
    assert re.fullmatch(
        r"4 in flight, 20 calls: [\d,]+ calls/s, [\d,]+ µs CPU per call "
        r"\(user [\d,]+, system [\d,]+\), load average [\d.]+",
        line,
    ), line
