"""The load engine behind ``mcpbroker bench`` and the benchmark harness.

Many MCP clients multiplexed in one process with ``selectors`` (epoll) and
orjson, and deliberately no Trio: a load generator must spend as little CPU
per call as it can, because on a small machine it shares the cores with the
daemon and the server it measures. Each client is a unix socket to the daemon
(or to a server listening on one), a child process on stdio (a server
launched directly, or ``mcpbroker connect``), or a session over Streamable
HTTP (:mod:`tools.bench_http`: the daemon's ``--http`` listener, or a server
reached by URL). A client opens with the hello
(sockets only), ``initialize`` and ``notifications/initialized``, then keeps
``in_flight`` ``tools/call`` requests outstanding: every answer is followed
at once by a new request, and everything a client has to send is written in
one ``write`` (over HTTP, each request is a POST on a keep-alive connection of
its own, and the calls wait until the server has taken the
``notifications/initialized``). A client of the modern era (2026-07-28,
``Target.era``) opens with ``server/discover`` instead, and every request it
sends carries the ``_meta`` that era requires (its version, capabilities and
clientInfo), over HTTP with the era's headers.

What counts (documented in ``mcpbroker bench --help`` and benchmarks/README.md):
a JSON-RPC error response is an error, counted by its code; a result with
``isError: true`` is a *tool error*, counted apart; every other result is ok.
Latency is measured for every answered call, from the write of its request to
the read of the chunk that completed its response. Requests never answered
(the connection closed, or the drain timed out) are *lost*. Over HTTP, a POST
answered with an error status is an error counted as ``HTTP <status>``.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import orjson

from tools.bench_http import (
    ACCEPT_BOTH,
    CLIENT_INFO,
    MODERN_META,
    HttpClient,
    HttpFailure,
    discover_body,
    modern_fields,
)

READ_SIZE = 1024 * 1024
INIT_ID = "bench-init"
PROTOCOL_VERSION = "2025-11-25"
PROGRESS_EVERY = 0.25
_now = time.perf_counter_ns


class BenchError(Exception):
    """The run could not be carried out (a client could not connect or initialize)."""


@attrs.frozen
class Target:
    """Where one client connects: a unix socket (with a hello), a command on
    stdio, or a Streamable HTTP endpoint (``url``)."""

    socket: str | None = None
    servers: tuple[str, ...] = ()  # the hello's view; sockets only
    argv: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = None  # HTTP only: sent with every POST
    accept: str = ACCEPT_BOTH  # HTTP only: "application/json" asks for JSON bodies, not SSE
    version: str = PROTOCOL_VERSION  # the initialize's protocolVersion
    era: str = "legacy"  # or "modern": no initialize, _meta (over HTTP, headers) on every request


@attrs.frozen
class Load:
    in_flight: int = 1  # per client
    tool: str = "echo"
    arguments: dict[str, Any] = attrs.field(factory=dict)
    duration: float | None = None  # measure this long ...
    requests: int | None = None  # ... or until this many calls (in all) are answered
    warmup: float = 0.0  # duration mode only: calls answered before the window do not count
    drain_timeout: float = 10.0


@attrs.frozen
class Progress:
    done: int
    errors: int
    elapsed: float
    measuring: bool


@attrs.define
class Result:
    calls: int = 0
    ok: int = 0
    errors: Counter[int | str] = attrs.field(factory=Counter)  # JSON-RPC errors by code
    tool_errors: int = 0  # results with isError: true
    # What the first error or tool error said (its message, or the tool's text):
    # a load of nothing but errors is a mistake to see at once (a missing argument).
    first_error: str | None = None
    lost: int = 0
    elapsed: float = 0.0
    latencies_ns: list[int] = attrs.field(factory=list, repr=False)

    @property
    def throughput(self) -> float:
        return self.calls / self.elapsed if self.elapsed > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "ok": self.ok,
            "errors": {str(code): n for code, n in sorted(self.errors.items(), key=str)},
            "tool_errors": self.tool_errors,
            "first_error": self.first_error,
            "lost": self.lost,
            "elapsed_s": self.elapsed,
            "throughput": self.throughput,
            "latency_us": percentiles(self.latencies_ns),
        }


def percentiles(samples_ns: Sequence[int]) -> dict[str, float | None]:
    keys = ("p50", "p90", "p99", "p99.9", "max", "mean")
    if not samples_ns:
        return dict.fromkeys(keys)
    ordered = sorted(samples_ns)
    n = len(ordered)

    def at(q: float) -> float:
        return ordered[min(n - 1, int(q * n))] / 1000

    return {
        "p50": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "p99.9": at(0.999),
        "max": ordered[-1] / 1000,
        "mean": sum(ordered) / n / 1000,
    }


class Client:
    """One MCP client connection and what it has in flight."""

    def __init__(self, target: Target, stderr: Any) -> None:
        self.opened = _now()
        self.ready_ns: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        out = b""
        if target.socket is not None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(target.socket)
            self.sock.setblocking(False)
            self.rfd = self.wfd = self.sock.fileno()
            if target.servers:
                out = orjson.dumps({"mcpbroker": {"servers": list(target.servers)}}) + b"\n"
        else:
            self.process = subprocess.Popen(
                target.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=None if target.env is None else {**os.environ, **target.env},
                cwd=target.cwd,
                bufsize=0,
            )
            assert self.process.stdin is not None and self.process.stdout is not None
            self.rfd, self.wfd = self.process.stdout.fileno(), self.process.stdin.fileno()
            os.set_blocking(self.rfd, False)
            os.set_blocking(self.wfd, False)
        self.modern = target.era == "modern"
        self.out = bytearray(out + (_discover() if self.modern else _initialize(target.version)))
        self.suffix = b""  # the end of each tools/call it sends (set by Engine.run)
        self.rest: list[bytes] = []
        self.pending: dict[int, int] = {}  # request id -> when it was written (ns)
        self.next_id = 1
        self.closed = False
        self.init_error: Any = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def lines(self, data: bytes) -> list[bytes]:
        """The complete lines this chunk finished."""
        newline = data.rfind(b"\n")
        if newline < 0:
            self.rest.append(data)
            return []
        if self.rest:
            self.rest.append(data[:newline])
            block = b"".join(self.rest)
            self.rest = []
        else:
            block = data[:newline]
        if newline + 1 < len(data):
            self.rest.append(data[newline + 1 :])
        return block.split(b"\n")


def _initialize(version: str) -> bytes:
    params = {
        "protocolVersion": version,
        "capabilities": {},
        "clientInfo": CLIENT_INFO,
    }
    request = {"jsonrpc": "2.0", "id": INIT_ID, "method": "initialize", "params": params}
    return orjson.dumps(request, option=orjson.OPT_APPEND_NEWLINE)


def _discover() -> bytes:
    """A modern client's opening: ``server/discover`` (it has no handshake)."""
    params = {"_meta": MODERN_META}
    request = {"jsonrpc": "2.0", "id": INIT_ID, "method": "server/discover", "params": params}
    return orjson.dumps(request, option=orjson.OPT_APPEND_NEWLINE)


INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
AnyClient = Client | HttpClient


class Engine:
    """Clients multiplexed on one selector. ``open`` them, ``run`` loads, ``close``."""

    def __init__(self, stderr: Any = subprocess.DEVNULL) -> None:
        self.clients: list[AnyClient] = []
        self._selector = selectors.DefaultSelector()
        self._stderr = stderr
        self._writing: set[Client] = set()
        self._load = Load()
        self._prefix = b""
        self._budget: int | None = None  # requests still to issue (requests mode)
        self._issuing = False
        self._measuring = False
        self._result = Result()

    # -- connections ----------------------------------------------------------

    def open(self, targets: Sequence[Target], timeout: float = 30.0) -> list[AnyClient]:
        """Connect and initialize one client per target; returns when all are ready."""
        new: list[AnyClient] = []
        for target in targets:
            if target.url is not None:
                new.append(self._open_http(target))
            else:
                client = Client(target, self._stderr)
                self._selector.register(client.rfd, selectors.EVENT_READ, client)
                self._flush(client)
                new.append(client)
            self.clients.append(new[-1])  # closed by close(), whatever happens next
        deadline = time.monotonic() + timeout
        while any(c.ready_ns is None for c in new):
            if any(c.closed for c in new):
                raise BenchError(self._init_failure(new))
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"clients did not initialize within {timeout:g} s")
            self._poll(min(left, 0.5))
        return new

    def _open_http(self, target: Target) -> HttpClient:
        assert target.url is not None
        try:
            modern = target.era == "modern"
            client = HttpClient(
                target.url, target.headers, target.accept, self._selector, _now(), modern
            )
            if modern:
                client.post(discover_body(INIT_ID), INIT_ID, modern_fields("server/discover"))
            else:
                client.post(_initialize(target.version), INIT_ID)
        except HttpFailure as exc:
            raise BenchError(str(exc)) from None
        return client

    def _init_failure(self, clients: list[AnyClient]) -> str:
        for client in clients:
            if client.init_error is not None:
                return f"initialize failed: {client.init_error}"
        code = next((c.process.poll() for c in clients if c.process is not None), None)
        return "a client's connection closed during initialize" + (
            f" (its process exited with code {code})" if code is not None else ""
        )

    def close(self, timeout: float = 5.0) -> None:
        """Close every client; child processes get EOF, then SIGTERM, then SIGKILL."""
        for client in self.clients:
            self._drop(client)
        deadline = time.monotonic() + timeout
        for client in self.clients:
            process = client.process
            if process is None:
                continue
            try:
                process.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.terminate()
                try:
                    process.wait(1.0)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.clients = []

    def _drop(self, client: AnyClient) -> None:
        if client.closed:
            return
        self._result.lost += len(client.pending)
        client.pending.clear()
        if isinstance(client, HttpClient):
            client.close()
            return
        client.closed = True
        for fd in {client.rfd, client.wfd}:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(fd)
        self._writing.discard(client)
        if client.sock is not None:
            client.sock.close()
        elif client.process is not None:
            for pipe in (client.process.stdin, client.process.stdout):
                if pipe is not None:
                    pipe.close()

    # -- the load -------------------------------------------------------------

    def run(
        self,
        load: Load,
        progress: Callable[[Progress], None] | None = None,
        on_window: Callable[[str], None] | None = None,
    ) -> Result:
        """Drive every open client with ``load``; the figures of the measured window."""
        if (load.duration is None) == (load.requests is None):
            raise ValueError("give exactly one of duration and requests")
        self._load, self._result = load, Result()
        call = {"name": load.tool, "arguments": load.arguments}
        suffixes = {
            era: b',"method":"tools/call","params":' + orjson.dumps(params) + b"}\n"
            for era, params in ((False, call), (True, {**call, "_meta": MODERN_META}))
        }
        for client in self.clients:
            client.suffix = suffixes[client.modern]
        self._prefix = b'{"jsonrpc":"2.0","id":'
        for client in self.clients:
            if isinstance(client, HttpClient) and client.modern:
                client.call_fields = modern_fields("tools/call", load.tool)
        self._budget = load.requests
        self._issuing = True
        start = _now()
        window_start = start + int(load.warmup * 1e9 if load.duration is not None else 0)
        window_end = None if load.duration is None else window_start + int(load.duration * 1e9)
        self._measuring = window_start == start
        warming = not self._measuring
        if self._measuring and on_window:
            on_window("start")
        next_tick = start
        for client in self.clients:
            self._top_up(client)
        drain_deadline: int | None = None
        while True:
            now = _now()
            if warming and now >= window_start:
                warming, self._measuring, self._result = False, True, Result()
                if on_window:
                    on_window("start")
            if self._measuring and window_end is not None and now >= window_end:
                self._stop(now - window_start, on_window)
                window_end = None
                drain_deadline = now + int(load.drain_timeout * 1e9)
            if progress is not None and now >= next_tick:
                next_tick = now + int(PROGRESS_EVERY * 1e9)
                progress(self._progress(now - (window_start if self._measuring else start)))
            # Done issuing (all requests sent, the window over, or every connection
            # closed under us) and nothing left in flight. Looked at in that order:
            # counting what is in flight walks every client.
            issued = (load.requests is not None and self._budget == 0) or not self._issuing
            if (issued or all(c.closed for c in self.clients)) and not any(
                c.pending for c in self.clients if not c.closed
            ):
                if self._measuring:
                    self._stop(now - window_start, on_window)
                break
            if drain_deadline is not None and now >= drain_deadline:
                for client in self.clients:
                    self._result.lost += len(client.pending)
                    client.pending.clear()
                break
            self._poll(0.05)
        return self._result

    def _stop(self, elapsed_ns: int, on_window: Callable[[str], None] | None) -> None:
        self._result.elapsed = elapsed_ns / 1e9
        self._measuring = False
        self._issuing = False
        if on_window:
            on_window("stop")

    def _progress(self, elapsed_ns: int) -> Progress:
        r = self._result
        errors = sum(r.errors.values()) + r.tool_errors
        return Progress(r.calls, errors, elapsed_ns / 1e9, self._measuring)

    def _top_up(self, client: AnyClient) -> None:
        if not self._issuing or client.closed or client.ready_ns is None:
            return
        need = self._load.in_flight - len(client.pending)
        if self._budget is not None:
            need = min(need, self._budget)
            self._budget -= max(need, 0)
        if need <= 0:
            return
        sent = _now()
        first = client.next_id
        client.next_id += need
        prefix, suffix, pending = self._prefix, client.suffix, client.pending
        if isinstance(client, HttpClient):
            fields = client.call_fields
            for id in range(first, first + need):  # pending once sent: none is lost unsent
                if not self._post(client, prefix + str(id).encode() + suffix, id, fields):
                    return
                pending[id] = sent
            return
        parts = []
        for id in range(first, first + need):
            pending[id] = sent
            parts.append(prefix + str(id).encode() + suffix)
        client.out += b"".join(parts)
        self._flush(client)

    # -- I/O --------------------------------------------------------------------

    def _poll(self, timeout: float) -> None:
        for key, mask in self._selector.select(timeout):
            client: AnyClient = key.data
            if client.closed:
                continue
            if isinstance(client, HttpClient):
                self._ready_http(client, key.fd, mask)
                continue
            if mask & selectors.EVENT_WRITE:
                self._flush(client)
            if mask & selectors.EVENT_READ and key.fd == client.rfd:
                self._read(client)

    def _read(self, client: Client) -> None:
        try:
            data = os.read(client.rfd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        now = _now()
        for line in client.lines(data):
            if line:
                self._receive(client, line, now)
        self._top_up(client)

    def _ready_http(self, client: HttpClient, fd: int, mask: int) -> None:
        messages, failed = client.ready(fd, mask)
        now = _now()
        for message in messages:
            self._receive(client, message, now)
        for id, error in failed:
            self._failed(client, id, error, now)
        self._top_up(client)

    def _post(self, client: HttpClient, body: bytes, id: Any = None, fields: bytes = b"") -> bool:
        """POST a message; a server that can no longer be reached ends the client
        (what it has in flight is lost), as a closed socket ends a stream client."""
        try:
            client.post(body, id, fields)
        except HttpFailure as exc:
            client.init_error = client.init_error or str(exc)
            self._drop(client)
            return False
        return True

    def _failed(self, client: HttpClient, id: Any, error: str | None, now: int) -> None:
        """A POST ended without its answer: with an error status, or lost (``None``)."""
        if id == INIT_ID or id is client.initialized_id:
            client.init_error = f"{error or 'no answer'} from {client.url}"
            self._drop(client)
            return
        sent = client.pending.pop(id, None) if type(id) is int else None
        if sent is None or not self._measuring:
            return
        if error is None:
            self._result.lost += 1
            return
        self._result.calls += 1
        self._result.latencies_ns.append(now - sent)
        self._result.errors[error] += 1

    def _receive(self, client: AnyClient, line: bytes, now: int) -> None:
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            return
        if not isinstance(message, dict):
            return
        id = message.get("id")
        if "method" in message:
            if id is not None:  # a server's request: only ping gets an answer
                self._answer(client, message)
            return
        sent = client.pending.pop(id, None) if type(id) is int else None
        if sent is None:
            if id == INIT_ID:
                self._initialized(client, message)
            return
        if not self._measuring:
            return
        result = self._result
        result.calls += 1
        result.latencies_ns.append(now - sent)
        error = message.get("error")
        if error is not None:
            code = error.get("code") if isinstance(error, dict) else None
            result.errors[code if isinstance(code, int) else "invalid"] += 1
            if result.first_error is None:
                said = error.get("message") if isinstance(error, dict) else None
                result.first_error = _cut(f"error {code}: {said}" if said else f"error: {error!r}")
            return
        body = message.get("result")
        if isinstance(body, dict) and body.get("isError"):
            result.tool_errors += 1
            if result.first_error is None:
                result.first_error = _cut(f"tool error: {_text_of(body)}")
        else:
            result.ok += 1

    def _initialized(self, client: AnyClient, message: dict[str, Any]) -> None:
        if "error" in message:
            client.init_error = message["error"].get("message", message["error"])
            self._drop(client)
            return
        if isinstance(client, HttpClient) and client.modern:  # (server/discover: no handshake)
            client.ready_ns = _now()
            return
        if isinstance(client, HttpClient):  # ready once the server has taken the notification
            result = message.get("result")
            version = result.get("protocolVersion") if isinstance(result, dict) else None
            client.agreed(version)
            self._post(client, INITIALIZED, client.initialized_id)
            return
        client.ready_ns = _now()
        if not client.modern:
            client.out += INITIALIZED
            self._flush(client)

    def _answer(self, client: AnyClient, request: dict[str, Any]) -> None:
        if request["method"] == "ping":
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"], "result": {}}
        else:
            error = {"code": -32601, "message": "Method not found"}
            reply = {"jsonrpc": "2.0", "id": request["id"], "error": error}
        if isinstance(client, HttpClient):
            self._post(client, orjson.dumps(reply))
            return
        client.out += orjson.dumps(reply) + b"\n"
        self._flush(client)

    def _flush(self, client: Client) -> None:
        out = client.out
        while out:
            try:
                written = os.write(client.wfd, out)
            except BlockingIOError:
                break
            except OSError:
                self._drop(client)
                return
            del out[:written]
        if out and client not in self._writing:
            self._writing.add(client)
            self._want_write(client, True)
        elif not out and client in self._writing:
            self._writing.discard(client)
            self._want_write(client, False)

    def _want_write(self, client: Client, on: bool) -> None:
        if client.wfd == client.rfd:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if on else 0)
            self._selector.modify(client.rfd, events, client)
        elif on:
            self._selector.register(client.wfd, selectors.EVENT_WRITE, client)
        else:
            self._selector.unregister(client.wfd)


def _text_of(result: dict[str, Any]) -> str:
    """A tool result's text content (or its JSON)."""
    content = result.get("content")
    texts = [
        item["text"]
        for item in (content if isinstance(content, list) else [])
        if isinstance(item, dict) and isinstance(item.get("text"), str)
    ]
    return " ".join(texts) if texts else orjson.dumps(result).decode()


def _cut(text: str, limit: int = 200) -> str:
    """``text``, cut to ``limit`` characters (what a server said may be a page)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
