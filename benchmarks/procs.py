"""The processes a benchmark scenario needs: the daemon, servers, the load generator.

Each is started fresh for each scenario (so a daemon's peak RSS belongs to
one scenario), from this clone (``cwd`` is the repository, so nothing needs
installing but the venv), and stopped the way a user would stop it.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import orjson

from cli.status import fetch_status

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
ECHO_SERVER = [PYTHON, str(REPO / "benchmarks" / "echo_server.py")]
SDK_SERVER = [PYTHON, str(REPO / "benchmarks" / "sdk_server.py")]
READY_TIMEOUT = 60.0


def raise_fd_limit() -> None:
    """1,000 clients need 1,000 descriptors in the daemon too (children inherit this)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def shim_command(socket_path: str, server: str) -> list[str]:
    """What a host runs: the installed ``mcpbroker`` script, else the module.

    ``MCPBROKER_BENCH_SHIM=prototype`` (or ``prototype-S``: without ``site``)
    runs benchmarks/prototype_shim.py instead, to measure that proposal;
    ``no-resume`` runs the shim with ``--no-resume`` (the splice relay, which
    does not outlive the daemon), to compare it with the default.
    """
    variant = os.environ.get("MCPBROKER_BENCH_SHIM", "")
    if variant.startswith("prototype"):
        flags = ["-S"] if variant == "prototype-S" else []
        prototype = str(REPO / "benchmarks" / "prototype_shim.py")
        return [PYTHON, *flags, prototype, socket_path, server]
    script = Path(PYTHON).parent / "mcpbroker"
    start = [str(script)] if script.exists() else [PYTHON, "-m", "cli.main"]
    extra = ["--no-resume"] if variant == "no-resume" else []
    return [*start, "connect", "--socket", socket_path, "--server", server, *extra]


@attrs.frozen
class Daemon:
    pid: int
    socket: str
    server_pids: dict[str, int]


@contextlib.contextmanager
def workdir() -> Iterator[str]:
    """A short directory for sockets (AF_UNIX paths are limited to ~100 bytes)."""
    path = tempfile.mkdtemp(prefix="mcpb-bench-")
    try:
        yield path
    finally:
        for name in os.listdir(path):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(path, name))
        with contextlib.suppress(OSError):
            os.rmdir(path)


@contextlib.contextmanager
def daemon(
    directory: str,
    servers: dict[str, list[str]],
    prefix: tuple[str, ...] = (),
    module: str = "cli.main",
    options: tuple[str, ...] = (),
    broker: dict[str, Any] | None = None,
    urls: dict[str, str] | None = None,
) -> Iterator[Daemon]:
    """``mcpbroker serve`` with these servers, once every server is ready.

    ``prefix`` runs the daemon under another command (a profiler); the pid
    yielded is still the daemon's own, from its status. With
    ``$MCPBROKER_PATCHES`` set, the daemon runs with those prototype patches
    (benchmarks/prototype.py). ``options`` go on ``serve``'s command line;
    ``broker`` is the config's broker section (``count --broker '{"metrics":
    "0"}'`` measures what metrics cost). ``urls`` adds servers reached by URL
    (``{"url": ...}``; their pid in ``server_pids`` is None).
    """
    if os.environ.get("MCPBROKER_PATCHES") and module == "cli.main":
        module = "benchmarks.prototype"
    config = {
        "mcpServers": {
            name: {"command": argv[0], "args": argv[1:], "cwd": str(REPO)}
            for name, argv in servers.items()
        }
        | {name: {"url": url} for name, url in (urls or {}).items()},
        "broker": broker or {},
    }
    config_path = os.path.join(directory, "config.json")
    socket_path = os.path.join(directory, "daemon.sock")
    Path(config_path).write_bytes(orjson.dumps(config))
    command = [*prefix, PYTHON, "-m", module, "serve", "--config", config_path]
    command += ["--socket", socket_path, "--log-level", "warning", *options]
    with open(os.path.join(directory, "daemon.log"), "ab") as log:
        process = subprocess.Popen(
            command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        pids = _wait_ready(process, socket_path, set(servers) | set(urls or {}))
        pid = fetch_status(socket_path)["pid"]
        yield Daemon(pid, socket_path, pids)
        if pid != process.pid:  # stop the daemon itself, let the wrapper finish
            os.kill(pid, signal.SIGTERM)
            process.wait(60)
    finally:
        _stop(process)


def _wait_ready(
    process: subprocess.Popen[bytes], socket_path: str, names: set[str]
) -> dict[str, int]:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the daemon exited with code {process.returncode}")
        try:
            status = fetch_status(socket_path, timeout=2.0)
        except (OSError, ValueError):
            time.sleep(0.05)
            continue
        ready = {s["name"]: s["pid"] for s in status["servers"] if s["status"] == "ready"}
        if set(ready) >= names:
            return ready
        time.sleep(0.05)
    raise RuntimeError(f"the daemon's servers were not ready within {READY_TIMEOUT:g} s")


@contextlib.contextmanager
def echo_sockets(directory: str, count: int) -> Iterator[list[tuple[int, str]]]:
    """``count`` echo servers each listening on a unix socket: (pid, path) each."""
    processes = []
    try:
        for i in range(count):
            path = os.path.join(directory, f"echo{i}.sock")
            process = subprocess.Popen([*ECHO_SERVER, "--socket", path], stdin=subprocess.DEVNULL)
            processes.append((process, path))
        for process, path in processes:
            _wait_connectable(process, path)
        yield [(process.pid, path) for process, path in processes]
    finally:
        for process, _ in processes:
            _stop(process)


@contextlib.contextmanager
def sdk_http_server() -> Iterator[tuple[int, str]]:
    """The SDK echo server over Streamable HTTP (``sdk_server.py --http``): (pid, URL)."""
    process = subprocess.Popen(
        [*SDK_SERVER, "--http"], cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        readable, _, _ = select.select([process.stdout], [], [], READY_TIMEOUT)
        url = process.stdout.readline().decode().strip() if readable else ""
        if not url.startswith("http://"):
            raise RuntimeError(f"the SDK server did not listen (exit code {process.poll()})")
        yield process.pid, url
    finally:
        _stop(process)


def _wait_connectable(process: subprocess.Popen[bytes], path: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the echo server exited with code {process.returncode}")
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(path)
                return
            except OSError:
                time.sleep(0.02)
    raise RuntimeError(f"the echo server did not listen on {path}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def loadgen(spec: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    """Run the load generator (a process of its own) with ``spec``; its JSON answer."""
    done = subprocess.run(
        [PYTHON, "-m", "benchmarks.loadgen"],
        input=orjson.dumps(spec),
        capture_output=True,
        cwd=REPO,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the load generator failed:\n{done.stderr.decode(errors='replace')}")
    answer: dict[str, Any] = orjson.loads(done.stdout)
    return answer


def socket_target(
    path: str, server: str | None = None, count: int = 1, era: str = "legacy"
) -> dict[str, Any]:
    """``count`` clients on a unix socket; ``era="modern"``: speaking 2026-07-28."""
    target: dict[str, Any] = {"socket": path, "era": era}
    if server is not None:
        target["servers"] = [server]
    return {"target": target, "count": count}


def http_target(url: str, count: int = 1) -> dict[str, Any]:
    """``count`` sessions over Streamable HTTP, accepting JSON or SSE as SDK clients do."""
    return {"target": {"url": url}, "count": count}


def command_target(argv: list[str], count: int = 1) -> dict[str, Any]:
    return {"target": {"argv": argv, "cwd": str(REPO)}, "count": count}
