"""The kit of the fault-injection tests (docs/faults.md): the real daemon as a
process, raw socket clients, a bystander session, and the invariants.

The daemon runs as users run it (``mcpbroker serve --log-format json``), its
log written to a file the tests read. :class:`Client` speaks newline-delimited
JSON-RPC on the daemon's socket with nothing in between, so a test can send
what no SDK would (deep nesting, garbage, duplicate ids) or stop reading.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import orjson
import psutil
import trio

from cli.status import fetch_status
from tests.conftest import MCPBROKER, REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
PROTOCOL_VERSION = "2025-06-18"
MB = 1024 * 1024
BYSTANDER_CALLS = 5  # at least, per test


def misbehaving(mode: str = "normal", argument: int | None = None, **extra: Any) -> dict[str, Any]:
    """Config entry for tests/servers/misbehaving.py in ``mode``."""
    args = ["-m", "tests.servers.misbehaving", mode]
    if argument is not None:
        args.append(str(argument))
    return {"command": sys.executable, "args": args, "cwd": str(REPO), **extra}


def nested(depth: int, leaf: str = "1") -> str:
    """JSON text nesting ``depth`` objects (orjson refuses to encode past 254)."""
    return '{"a":' * depth + leaf + "}" * depth


# -- the daemon ---------------------------------------------------------------


@attrs.frozen
class Usage:
    rss: int
    fds: int

    def __str__(self) -> str:
        return f"RSS {self.rss / MB:.0f} MB, {self.fds} descriptors"


@attrs.define
class DaemonProcess:
    process: trio.Process
    socket_path: str
    log_path: str
    ps: psutil.Process

    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def config_path(self) -> str:
        """The config file it was started with (a test may rewrite it, and reload)."""
        return os.path.join(os.path.dirname(self.socket_path), "config.json")

    def write_config(self, servers: dict[str, Any], broker: dict[str, Any] | None = None) -> None:
        Path(self.config_path).write_text(
            json.dumps({"mcpServers": servers, "broker": broker or {}})
        )

    async def reload(self) -> subprocess.CompletedProcess[bytes]:
        """``mcpbroker reload`` on its socket, as a user runs it."""
        command = [MCPBROKER, "reload", "--socket", self.socket_path]
        return await trio.run_process(
            command, env=ENV, capture_stdout=True, capture_stderr=True, check=False
        )

    def usage(self) -> Usage:
        return Usage(rss=self.ps.memory_info().rss, fds=self.ps.num_fds())

    def log(self) -> list[dict[str, Any]]:
        """The daemon's log so far, one dict per JSON line (other lines as {"raw": line})."""
        entries = []
        for line in Path(self.log_path).read_bytes().splitlines():
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                entry = {"raw": line.decode(errors="replace")}
            entries.append(entry if isinstance(entry, dict) else {"raw": entry})
        return entries

    async def status(self) -> dict[str, Any]:
        return await trio.to_thread.run_sync(fetch_status, self.socket_path)

    async def server(self, name: str) -> dict[str, Any]:
        servers = (await self.status())["servers"]
        return next(server for server in servers if server["name"] == name)

    async def recovers(
        self, baseline: Usage, *, rss_margin: int = 100 * MB, fd_margin: int = 4, within: float = 10
    ) -> None:
        """The daemon lives, and its RSS and descriptors come back near ``baseline``."""
        now = self.usage()
        with trio.move_on_after(within):
            while now.rss > baseline.rss + rss_margin or now.fds > baseline.fds + fd_margin:
                assert self.alive(), "the daemon died"
                await trio.sleep(0.1)
                now = self.usage()
        assert self.alive(), "the daemon died"
        assert now.rss <= baseline.rss + rss_margin, (
            f"RSS: before {baseline}, {within}s after {now}"
        )
        assert now.fds <= baseline.fds + fd_margin, f"descriptors: before {baseline}, after {now}"


@contextlib.asynccontextmanager
async def running_daemon(
    servers: dict[str, Any], broker: dict[str, Any] | None = None, ready: set[str] | None = None
) -> AsyncIterator[DaemonProcess]:
    """The real daemon on a fresh socket, every server (or those in ``ready``)
    ready; stopped (killed if need be)."""
    directory = tempfile.mkdtemp(prefix="mcpf-")
    config = os.path.join(directory, "config.json")
    Path(config).write_text(json.dumps({"mcpServers": servers, "broker": broker or {}}))
    socket_path = os.path.join(directory, "broker.sock")
    log_path = os.path.join(directory, "daemon.log")
    command = [MCPBROKER, "serve", "--config", config, "--socket", socket_path]
    with open(log_path, "wb") as log:
        process = await trio.lowlevel.open_process(
            [*command, "--log-format", "json"],
            env=ENV,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    daemon = DaemonProcess(process, socket_path, log_path, psutil.Process(process.pid))
    try:
        await _wait_ready(daemon, set(servers) if ready is None else ready)
        yield daemon
    finally:
        with trio.CancelScope(shield=True):
            await _stop(daemon)
        if os.environ.get("FAULTS_KEEP"):  # to read the daemon's log after a failure
            print(f"daemon's log: {log_path}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


async def _wait_ready(daemon: DaemonProcess, names: set[str]) -> None:
    with trio.fail_after(20):
        while not os.path.exists(daemon.socket_path):
            assert daemon.alive(), f"the daemon exited while starting: {daemon.log()}"
            await trio.sleep(0.02)
        while True:
            with contextlib.suppress(OSError, ValueError):
                status = await daemon.status()
                ready = {s["name"] for s in status["servers"] if "ready" in str(s["status"])}
                if ready >= names:
                    return
            assert daemon.alive(), f"the daemon exited while starting: {daemon.log()}"
            await trio.sleep(0.05)


async def _stop(daemon: DaemonProcess) -> None:
    """SIGTERM, then SIGKILL for the daemon and what it started if it does not go in 5 s."""
    children = []
    with contextlib.suppress(psutil.Error):
        children = daemon.ps.children(recursive=True)
    if daemon.alive():
        daemon.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(5):
            await daemon.process.wait()
        if daemon.alive():
            daemon.process.kill()
            await daemon.process.wait()
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()


# -- raw clients --------------------------------------------------------------


def id_key(id: Any) -> str:
    """A response id as a dict key that keeps 7 and "7" apart."""
    return orjson.dumps(id).decode()


class Client:
    """One connection to the daemon's socket, newline-delimited JSON-RPC.

    Everything received is kept in ``messages`` (in order) and, for responses,
    in ``responses[id_key(id)]`` (a list: a second answer to an id shows up).
    Reading happens in a background task, or, for a client opened with
    ``read=False``, only while it waits for an answer.
    """

    def __init__(self, stream: trio.SocketStream, *, reads: bool) -> None:
        self.stream = stream
        self.reads = reads
        self.messages: list[Any] = []
        self.responses: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        self.eof = False
        self._buffer = bytearray()
        self._arrived = trio.Event()
        self._next_id = 0
        self._sending = trio.StrictFIFOLock()  # (several tasks may send: tests/test_reload_e2e.py)

    async def send(self, *messages: dict[str, Any] | bytes | str) -> None:
        """Send each message as one line (bytes and str go as they are)."""
        lines = []
        for message in messages:
            if isinstance(message, str):
                message = message.encode()
            lines.append(message if isinstance(message, bytes) else orjson.dumps(message))
        async with self._sending:
            await self.stream.send_all(b"".join(line + b"\n" for line in lines))

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def request(
        self, method: str, params: Any = None, *, id: Any = None, within: float = 5
    ) -> dict[str, Any]:
        """Send a request and return its response (whatever it is)."""
        id = self.new_id() if id is None else id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return await self.response(id, within=within)

    async def call(self, tool: str, arguments: Any = None, **kwargs: Any) -> str:
        """A tools/call that must succeed; the text of its result."""
        response = await self.request(
            "tools/call", {"name": tool, "arguments": arguments or {}}, **kwargs
        )
        assert "result" in response, f"{tool} failed: {response}"
        return "".join(block.get("text", "") for block in response["result"]["content"])

    async def initialize(self) -> dict[str, Any]:
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "faults", "version": "0"},
        }
        response = await self.request("initialize", params)
        assert "result" in response, response
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return response

    async def response(self, id: Any, *, within: float = 5) -> dict[str, Any]:
        key = id_key(id)
        await self.wait_until(lambda: bool(self.responses[key]), within, f"no answer to id {key}")
        return self.responses[key][0]

    async def wait_until(
        self, condition: Callable[[], bool], within: float, what: str | Callable[[], str]
    ) -> None:
        """Wait (reading, if no reader task does) until ``condition()``; fail with ``what``."""
        with trio.move_on_after(within):
            while not condition():
                assert not self.eof, f"{_say(what)}: the daemon closed the connection"
                if self.reads:
                    await self._arrived.wait()
                else:
                    await self.read_some()
            return
        raise AssertionError(f"{_say(what)} within {within} s")

    async def read_forever(self) -> None:
        while not self.eof:
            await self.read_some()

    async def read_some(self) -> None:
        try:
            data = await self.stream.receive_some(1024 * 1024)
        except trio.BrokenResourceError:
            data = b""  # reset by the daemon: as good as EOF here
        if not data:
            self.eof = True
        self._buffer += data
        *lines, rest = self._buffer.split(b"\n")
        self._buffer = bytearray(rest)
        for line in lines:
            try:
                self._received(orjson.loads(line))
            except orjson.JSONDecodeError:
                self._received({"unparsed": bytes(line)})
        self._arrived.set()
        self._arrived = trio.Event()

    def _received(self, message: Any) -> None:
        self.messages.append(message)
        if isinstance(message, dict) and "id" in message and "method" not in message:
            self.responses[id_key(message["id"])].append(message)

    def notifications(self, method: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if isinstance(m, dict) and m.get("method") == method]

    def errors_without_id(self) -> list[dict[str, Any]]:
        return self.responses[id_key(None)]


def _say(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


@contextlib.asynccontextmanager
async def connect(
    daemon: DaemonProcess,
    servers: list[str] | None = None,
    *,
    initialize: bool = True,
    reads: bool = True,
) -> AsyncIterator[Client]:
    """A client on the daemon's socket: hello (if ``servers``), initialize; closed on exit."""
    stream = await trio.open_unix_socket(daemon.socket_path)
    client = Client(stream, reads=reads)
    try:
        async with trio.open_nursery() as nursery:
            if reads:
                nursery.start_soon(client.read_forever)
            if servers is not None:
                await client.send({"mcpbroker": {"servers": servers}})
            if initialize:
                await client.initialize()
            yield client
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


# -- the bystander ------------------------------------------------------------


@attrs.define
class Bystander:
    """A session calling a healthy server's ``echo`` over and over, noting what it saw."""

    latencies: list[float] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)

    async def run(self, client: Client, tool: str) -> None:
        while True:
            text = f"bystander {len(self.latencies)}"
            started = trio.current_time()
            try:
                answer = await client.call(tool, {"text": text}, within=5)
            except AssertionError as exc:
                self.errors.append(str(exc))
                return
            self.latencies.append(trio.current_time() - started)
            if answer != text:
                self.errors.append(f"echo said {answer!r} to {text!r}")
            await trio.sleep(0.01)

    def check(self, *, max_latency: float = 1.0, p50: float | None = None, since: int = 0) -> None:
        """No error, no call over ``max_latency``; from call ``since`` on, a p50 under ``p50``."""
        assert not self.errors, f"the bystander saw errors: {self.errors}"
        made = len(self.latencies)
        assert made >= BYSTANDER_CALLS, f"the bystander made only {made} calls in 5 s"
        slowest = max(self.latencies)
        assert slowest < max_latency, f"a bystander call took {slowest:.2f} s"
        if p50 is not None:
            median = statistics.median(self.latencies[since:])
            assert median < p50, f"the bystander's p50 latency was {median * 1000:.0f} ms"


@contextlib.asynccontextmanager
async def bystander(daemon: DaemonProcess, server: str = "demo") -> AsyncIterator[Bystander]:
    """A bystander on ``server`` (transparent view) while the block runs, and for at
    least ``BYSTANDER_CALLS`` calls in all, however short the block."""
    watcher = Bystander()
    async with connect(daemon, [server]) as client, trio.open_nursery() as nursery:
        nursery.start_soon(watcher.run, client, "echo")
        yield watcher
        with trio.move_on_after(5):
            while len(watcher.latencies) < BYSTANDER_CALLS and not watcher.errors:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


class PeakRss:
    """The daemon's highest RSS, sampled every 20 ms while the block runs."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon
        self.peak = 0

    async def run(self) -> None:
        while True:
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.daemon.ps.memory_info().rss)
            await trio.sleep(0.02)
