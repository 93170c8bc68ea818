"""``mcpbroker connect``: the stdio shim a host launches as its MCP server.

A host runs one of these per window and server entry, so it is built to cost
almost nothing: standard library only (no Trio, no JSON parsing), two threads
copying bytes, a few MiB of memory. It connects to the daemon's unix socket,
starting the daemon first if none is listening, optionally sends a one-line
hello naming the servers its session should see, and then relays bytes both
ways until either side closes. Its stdout carries nothing but what the daemon
sends; every diagnostic goes to stderr.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time

from actors.paths import default_config_path, default_socket_path, ensure_private_dir, log_path_for

USAGE = """usage: mcpbroker connect [--socket PATH] [--config FILE] [--server NAME ...]

Relay MCP between stdin/stdout and the mcpbroker daemon, starting the daemon
(with --config FILE, or the default config file) when none is running.

  --socket PATH   the daemon's socket (default: $MCPBROKER_SOCKET or a per-user path)
  --config FILE   config for a daemon this command starts (default: $MCPBROKER_CONFIG
                  or ~/.config/mcpbroker/config.json)
  --server NAME   see only this server (repeatable; default: every server)
"""
CHUNK = 256 * 1024
DAEMON_START_TIMEOUT = 15.0
POLL_INTERVAL = 0.01
LOST_RACE_GRACE = 2.0


class UsageError(Exception):
    pass


def parse_args(argv: list[str]) -> tuple[str, str | None, list[str]]:
    socket_path, config, servers = None, None, []
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            raise UsageError("")
        name, eq, value = arg.partition("=")
        if name not in ("--socket", "--config", "--server"):
            raise UsageError(f"unknown argument {arg!r}")
        if not eq:
            value = next(args, "")
        if not value:
            raise UsageError(f"{name} needs a value")
        if name == "--socket":
            socket_path = value
        elif name == "--config":
            config = value
        else:
            servers.append(value)
    return socket_path or default_socket_path(), config, servers


def main(argv: list[str]) -> int:
    try:
        socket_path, config, servers = parse_args(argv)
    except UsageError as exc:
        if str(exc):
            print(f"mcpbroker connect: {exc}", file=sys.stderr)
        print(USAGE, file=sys.stderr, end="")
        return 2
    try:
        sock = _connect(socket_path) or _start_daemon(socket_path, config)
    except DaemonUnavailable as exc:
        print(f"mcpbroker connect: {exc}", file=sys.stderr)
        return 1
    if servers:
        sock.sendall(hello_line(servers))
    return relay(sock)


def hello_line(servers: list[str]) -> bytes:
    """The hello naming the session's servers (see broker/hello.py)."""
    if any(ord(c) < 0x20 for name in servers for c in name):
        import json  # names this odd are rare enough to pay for the import

        names = ",".join(json.dumps(name) for name in servers)
    else:
        names = ",".join('"' + n.replace("\\", "\\\\").replace('"', '\\"') + '"' for n in servers)
    return ('{"mcpbroker":{"servers":[' + names + "]}}\n").encode()


class DaemonUnavailable(Exception):
    pass


def _connect(socket_path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(socket_path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError as exc:
        sock.close()
        raise DaemonUnavailable(f"cannot connect to {socket_path}: {exc.strerror}") from None
    return sock


def _start_daemon(socket_path: str, config: str | None) -> socket.socket:
    import subprocess  # only on this path: most shims find the daemon running

    config = config or default_config_path()
    if not os.path.exists(config):
        raise DaemonUnavailable(
            f"no daemon is listening on {socket_path} and there is no config file at "
            f"{config} to start one with (pass --config FILE, or run 'mcpbroker serve')"
        )
    ensure_private_dir(os.path.dirname(socket_path))
    log_path = log_path_for(socket_path)
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "actors.cli",
                "serve",
                "--config",
                config,
                "--socket",
                socket_path,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
    deadline = time.monotonic() + DAEMON_START_TIMEOUT
    exited_at: float | None = None
    while time.monotonic() < deadline:
        sock = _connect(socket_path)
        if sock is not None:
            return sock
        if exited_at is None and child.poll() is not None:
            exited_at = time.monotonic()
        # A daemon that exited may only have lost a race with another shim's
        # daemon: give that one a moment before reporting what this one logged.
        if exited_at is not None and time.monotonic() - exited_at > LOST_RACE_GRACE:
            raise DaemonUnavailable(f"the daemon failed to start:\n{_tail(log_path)}")
        time.sleep(POLL_INTERVAL)
    raise DaemonUnavailable(
        f"the daemon did not start listening within {DAEMON_START_TIMEOUT:g} s; see {log_path}"
    )


def _tail(path: str, lines: int = 10) -> str:
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-lines:]).decode(errors="replace")
    except OSError:
        return f"(no log at {path})"


def relay(sock: socket.socket) -> int:
    """Copy stdin to the socket (a thread) and the socket to stdout (this thread)."""
    stdin_closed = threading.Event()
    threading.Thread(target=_stdin_to_socket, args=(sock, stdin_closed), daemon=True).start()
    stdout = sys.stdout.fileno()
    try:
        while data := sock.recv(CHUNK):
            view = memoryview(data)
            while view:
                view = view[os.write(stdout, view) :]
    except BrokenPipeError:
        return 0  # the host stopped reading: it is going away
    except OSError as exc:
        print(f"mcpbroker connect: connection to the daemon lost: {exc}", file=sys.stderr)
        return 1
    if not stdin_closed.is_set():
        print("mcpbroker connect: the daemon closed the connection", file=sys.stderr)
        return 1
    return 0


def _stdin_to_socket(sock: socket.socket, stdin_closed: threading.Event) -> None:
    stdin = sys.stdin.fileno()
    try:
        while data := os.read(stdin, CHUNK):
            sock.sendall(data)
    except OSError:
        pass  # the daemon went away; the other direction reports it
    stdin_closed.set()
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
