"""Streamable HTTP throughput: calls/s through ``serve --http`` at many keep-alive clients.

``python -m benchmarks.http_load [--clients 64] [--duration 8] [--sse]``
starts a daemon with the echo server and its HTTP listener, opens CLIENTS
HTTP/1.1 connections (each its own MCP session, keep-alive, one call in
flight: HTTP/1.1 carries one request at a time per connection), and counts
``tools/call`` round trips in the measured window, with the CPU the daemon
and the echo server used. The clients are plain sockets multiplexed with
``selectors`` in this process, so that they cost as little as they can.
``--sse`` asks for answers as SSE streams (what SDK clients get, since they
accept both) instead of JSON bodies.
"""

from __future__ import annotations

import argparse
import selectors
import socket
import tempfile
import time
from typing import Any

import orjson

from benchmarks.procs import ECHO_SERVER, daemon, fetch_status
from tools import bench_proc

TARGET = 5000.0  # calls/s at 64 clients (issue #13)


class Client:
    """One keep-alive connection and MCP session, one call at a time."""

    def __init__(self, host: str, port: int, path: str, sse: bool) -> None:
        self.address = (host, port)
        self.sock = self.connect()
        self.head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\n"
            f"Accept: {'application/json, text/event-stream' if sse else 'application/json'}\r\n"
        ).encode()
        self.buffer = b""
        self.session = b""
        self.calls = 0
        self._id = 0

    def connect(self) -> socket.socket:
        sock = socket.create_connection(self.address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def send(self, message: dict[str, Any]) -> None:
        body = orjson.dumps(message)
        session = b"Mcp-Session-Id: " + self.session + b"\r\n" if self.session else b""
        length = b"Content-Length: %d\r\n\r\n" % len(body)
        self.last = self.head + session + length + body
        self.sock.sendall(self.last)

    def receive(self) -> bool:
        """Read what came; whether a whole response has. A connection the
        server closed (an idle one, or hypercorn's after 1000 requests, when
        it served --http) is opened again and the request sent again."""
        data = self.sock.recv(65536)
        if data:
            return self.feed(data)
        self.sock.close()
        self.sock = self.connect()
        self.buffer = b""
        self.sock.sendall(self.last)
        return False

    def call(self) -> None:
        self._id += 1
        params = {"name": "echo", "arguments": {"text": "hello, broker"}}
        self.send({"jsonrpc": "2.0", "id": self._id, "method": "tools/call", "params": params})

    def feed(self, data: bytes) -> bool:
        """Whether a whole response has come (it is consumed)."""
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = self.buffer[:end].lower()
        if b"transfer-encoding: chunked" in head:
            close = self.buffer.find(b"\r\n0\r\n\r\n", end)
            if close < 0:
                return False
            size = close + 7
        else:
            start = head.find(b"content-length: ") + 16
            size = (
                end
                + 4
                + int(head[start : head.find(b"\r\n", start) if b"\r\n" in head[start:] else None])
            )
            if len(self.buffer) < size:
                return False
        if not self.session and b"mcp-session-id: " in head:
            start = head.find(b"mcp-session-id: ") + 16
            stop = head.find(b"\r\n", start)
            self.session = self.buffer[start : stop if stop >= 0 else end].strip()
        self.buffer = self.buffer[size:]
        return True


def run(clients: int, duration: float, warmup: float, sse: bool) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="mcpb-http-") as directory,
        daemon(directory, {"echo": ECHO_SERVER}, options=("--http", "127.0.0.1:0")) as dm,
    ):
        url = fetch_status(dm.socket)["http"]
        host, _, rest = url.removeprefix("http://").partition(":")
        port = int(rest.split("/")[0])
        pool = [Client(host, port, "/mcp/echo", sse) for _ in range(clients)]
        for client in pool:  # initialize, one by one
            params = {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "b"},
            }
            client.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
            while not client.receive():
                pass
            client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            while not client.receive():
                pass
        selector = selectors.DefaultSelector()
        for client in pool:
            selector.register(client.sock, selectors.EVENT_READ, client)
            client.call()
        watch = {"daemon": dm.pid, "server": dm.server_pids["echo"]}
        start = time.monotonic()
        window = (start + warmup, start + warmup + duration)
        counted, before = 0, None
        while True:
            now = time.monotonic()
            if before is None and now >= window[0]:
                before = {name: bench_proc.cpu_seconds(pid) or 0.0 for name, pid in watch.items()}
                counted = 0
            if now >= window[1]:
                break
            for key, _ in selector.select(0.5):
                client = key.data
                sock = client.sock
                if client.receive():
                    counted += 1
                    client.call()
                if client.sock is not sock:
                    selector.unregister(sock)
                    selector.register(client.sock, selectors.EVENT_READ, client)
        after = {name: bench_proc.cpu_seconds(pid) or 0.0 for name, pid in watch.items()}
        for client in pool:
            client.sock.close()
    assert before is not None
    cpu = {name: round(after[name] - before[name], 2) for name in watch}
    return {
        "clients": clients,
        "mode": "sse" if sse else "json",
        "calls_per_s": round(counted / duration),
        "cpu_s": cpu,
        "daemon_us_per_call": round(cpu["daemon"] / max(counted, 1) * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--sse", action="store_true")
    args = parser.parse_args()
    result = run(args.clients, args.duration, args.warmup, args.sse)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    met = "met" if result["calls_per_s"] >= TARGET else "missed"
    print(f"target >= {TARGET:.0f} calls/s at 64 clients: {met}")


if __name__ == "__main__":
    main()
