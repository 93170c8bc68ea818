"""``mcpbroker connect``: the stdio shim a host launches as its MCP server.

A host runs one of these per window and server entry, so it is built to cost
almost nothing: standard library only (no Trio, no JSON parsing, not even the
``socket`` module's Python layer), one thread copying bytes, a few MiB of
memory. It connects to the daemon's unix socket, starting the daemon first if
none is listening, optionally sends a one-line hello naming the servers its
session should see, and then relays bytes both ways until the daemon closes.
Its stdout carries nothing but what the daemon sends; every diagnostic goes
to stderr.
"""

from __future__ import annotations

import _socket
import contextlib
import errno
import os
import select
import stat
import sys

from actors.paths import default_socket_path
from cli.daemon_socket import DaemonUnavailable, connect, start_daemon
from cli.host_pipes import (
    BUFFER_LIMIT,
    CHUNK,
    STDIN,
    STDOUT,
    drain_to_daemon,
    drain_to_host,
    flush_to_host,
    send_to_daemon,
    write_to_host,
)

USAGE = """usage: mcpbroker connect [--socket PATH] [--config FILE] [NAME ...] [--server NAME ...]

Relay MCP between stdin/stdout and the mcpbroker daemon, starting the daemon
(with --config FILE, or the default config file) when none is running.

  NAME            see only this server (repeatable; default: every server); the
                  same as --server NAME, for hosts whose own options take --server
  --socket PATH   the daemon's socket (default: $MCPBROKER_SOCKET or a per-user path)
  --config FILE   config for a daemon this command starts (default: $MCPBROKER_CONFIG
                  or ~/.config/mcpbroker/config.json)
  --server NAME   see only this server (repeatable)
  --no-resume     exit when the daemon goes away (the host must then be restarted),
                  relaying with splice; by default the shim reconnects and restores
                  the host's session (docs/hosts.md, "When the daemon restarts")
  -h, --help      show this help
"""


class UsageError(Exception):
    pass


class ShowHelp(Exception):
    """``--help``: print the usage and exit 0."""


def parse_args(argv: list[str]) -> tuple[str, str | None, list[str]]:
    socket_path, config, servers = None, None, []
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            raise ShowHelp
        if arg == "--no-resume":
            continue  # (read by main)
        if not arg.startswith("-"):
            servers.append(arg)  # a server's name, as --server NAME
            continue
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
    except ShowHelp:
        print(USAGE, end="")
        return 0
    except UsageError as exc:
        if str(exc):
            print(f"mcpbroker connect: {exc}", file=sys.stderr)
        print(USAGE, file=sys.stderr, end="")
        return 2
    try:
        sock = connect(socket_path) or start_daemon(socket_path, config)
    except DaemonUnavailable as exc:
        print(f"mcpbroker connect: {exc}", file=sys.stderr)
        return 1
    hello = hello_line(servers) if servers else b""
    if hello:
        sock.sendall(hello)
    if "--no-resume" in argv:
        return relay(sock)
    from cli.reconnect import ResumingRelay
    from cli.resume import HostState

    return ResumingRelay(sock, HostState(), socket_path, config, hello).run()


def hello_line(servers: list[str]) -> bytes:
    """The hello naming the session's servers (see broker/hello.py)."""
    if any(ord(c) < 0x20 for name in servers for c in name):
        import json  # names this odd are rare enough to pay for the import

        names = ",".join(json.dumps(name) for name in servers)
    else:
        names = ",".join('"' + n.replace("\\", "\\\\").replace('"', '\\"') + '"' for n in servers)
    return ('{"mcpbroker":{"servers":[' + names + "]}}\n").encode()


def relay(sock: _socket.socket) -> int:
    """Copy stdin to the socket and the socket to stdout until the daemon closes.

    One thread woken by ``poll``, splicing when stdin and stdout are pipes
    (:class:`_SpliceRelay`), copying otherwise (:class:`CopyRelay`).
    """
    sock.setblocking(False)
    was_blocking = os.get_blocking(STDOUT)
    os.set_blocking(STDOUT, False)
    try:
        if _is_pipe(STDIN) and _is_pipe(STDOUT):
            with contextlib.suppress(_SpliceUnsupported):  # then nothing is held here
                return _SpliceRelay(sock).run()
        return CopyRelay(sock).run()
    finally:
        os.set_blocking(STDOUT, was_blocking)


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def _exit_code(stdin_open: bool) -> int:
    """Once the daemon has closed: 0 if the host had finished too, else 1 (and why)."""
    if stdin_open:
        print("mcpbroker connect: the daemon closed the connection", file=sys.stderr)
        return 1
    return 0


class _SpliceUnsupported(Exception):
    """This kernel cannot splice between these descriptors (nothing was moved)."""


class _SpliceRelay:
    """The relay when stdin and stdout are both pipes (as hosts launch servers).

    ``splice`` moves bytes between a pipe and the socket inside the kernel:
    one system call per direction and wake-up instead of a read and a write,
    and no buffer in this process. What a destination cannot take yet stays
    in its source (the host's pipe, or the socket), and while it does, that
    source is not polled: each direction stalls alone, as in :class:`CopyRelay`.
    """

    FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.sock_fd = sock.fileno()
        self.stdin_open = True
        self.up_blocked = False  # the socket took no more: wait until it can
        self.down_blocked = False  # stdout took no more: wait until it can
        self.hung_up = False  # the daemon closed the connection

    def run(self) -> int:
        poller = select.poll()
        flags = self.FLAGS
        waiting = None
        while True:
            wanted = (self.stdin_open, self.up_blocked, self.down_blocked, self.hung_up)
            if wanted != waiting:
                self._register(poller)
                waiting = wanted
            for fd, events in poller.poll():
                if fd == STDOUT:
                    if events & (select.POLLERR | select.POLLHUP):
                        return 0  # the host stopped reading: it is going away
                    self.down_blocked = False
                    continue
                if fd == STDIN:
                    self._up(flags)
                    continue
                if events & (select.POLLHUP | select.POLLERR):
                    self.hung_up = True  # the daemon is gone: nothing more goes up
                elif events & select.POLLOUT:
                    self.up_blocked = False
                    self._up(flags)
                if events & ~select.POLLOUT and not self.down_blocked:
                    done = self._down(flags)
                    if done is not None:
                        return done

    def _register(self, poller: select.poll) -> None:
        up = self.stdin_open and not self.hung_up
        stdin = select.POLLIN if up and not self.up_blocked else 0
        stdout = select.POLLOUT if self.down_blocked else 0
        sock = (select.POLLOUT if up and self.up_blocked else 0) | (
            0 if self.down_blocked else select.POLLIN
        )
        for fd, events in ((STDIN, stdin), (STDOUT, stdout), (self.sock_fd, sock)):
            if events:
                poller.register(fd, events)  # (or modify: poll objects take either)
            else:
                with contextlib.suppress(KeyError):
                    poller.unregister(fd)

    def _up(self, flags: int) -> None:
        if not self.stdin_open:
            return
        try:
            moved = os.splice(STDIN, self.sock_fd, CHUNK, flags=flags)
        except (BlockingIOError, InterruptedError):
            self.up_blocked = True  # or a spurious wake-up: the socket is writable then
            return
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise _SpliceUnsupported from None
            self.hung_up = True  # the daemon is gone; reading the socket says so
            return
        if not moved:
            self.stdin_open = False
            with contextlib.suppress(OSError):
                self.sock.shutdown(_socket.SHUT_WR)

    def _down(self, flags: int) -> int | None:
        """Move what the daemon sent to stdout; the exit code once there is no more."""
        try:
            if os.splice(self.sock_fd, STDOUT, CHUNK, flags=flags):
                return None
        except (BlockingIOError, InterruptedError):
            self.down_blocked = True  # or a spurious wake-up: stdout is writable then
            return None
        except BrokenPipeError:
            return 0  # the host stopped reading: it is going away
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise _SpliceUnsupported from None
            print(f"mcpbroker connect: connection to the daemon lost: {exc}", file=sys.stderr)
        return _exit_code(self.stdin_open)


class CopyRelay:
    """The relay for any stdin and stdout (a file, a terminal, a socket).

    Writes never block: each direction has a buffer, and while one is full
    (:data:`BUFFER_LIMIT`) its source is not read, so a host that stops
    reading stalls only its own direction. cli/reconnect.py's relay is this
    one, with lines tracked and a new daemon at each gap (its hooks:
    :meth:`_from_daemon`, :meth:`_lost`, :meth:`_daemon_closed`).
    """

    def __init__(self, sock: _socket.socket) -> None:
        self.to_daemon = bytearray()
        self.to_host = bytearray()
        self.stdin_open = True
        self._attach(sock)

    def _attach(self, sock: _socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.sock_fd = sock.fileno()
        self._events = {STDIN: 0, STDOUT: 0, self.sock_fd: 0}  # what poll waits for
        # Whether poll waits for what it waits for while both buffers are empty
        # (the steady state: then nothing needs looking at between two polls).
        self._steady = False

    def run(self) -> int:
        code = self._poll()
        assert code is not None  # (here the daemon's close is the end: no gap)
        return code

    def _poll(self) -> int | None:
        """Relay until the end (an exit code), or what :meth:`_daemon_closed` says."""
        poller = select.poll()
        while True:
            self._register(poller)
            for fd, events in poller.poll():
                if fd == STDIN:
                    self._read_stdin()
                elif fd == STDOUT:
                    if not self._write_stdout():
                        return 0  # the host stopped reading: it is going away
                else:
                    if events & select.POLLOUT:
                        self._write_socket()
                    if events & ~select.POLLOUT and not self._read_socket():
                        return self._daemon_closed()

    def _register(self, poller: select.poll) -> None:
        """Tell poll what to wait for, touching only what changed since last time."""
        to_daemon, to_host = len(self.to_daemon), len(self.to_host)
        if self._steady and not to_daemon and not to_host:
            return
        self._steady = not to_daemon and not to_host
        stdin = select.POLLIN if self.stdin_open and to_daemon < BUFFER_LIMIT else 0
        stdout = select.POLLOUT if to_host else 0
        sock = (select.POLLIN if to_host < BUFFER_LIMIT else 0) | (
            select.POLLOUT if to_daemon else 0
        )
        for fd, events in ((STDIN, stdin), (STDOUT, stdout), (self.sock_fd, sock)):
            before = self._events[fd]
            if before == events:
                continue
            if not events:
                poller.unregister(fd)
            elif before:
                poller.modify(fd, events)
            else:
                poller.register(fd, events)
            self._events[fd] = events

    def _read_stdin(self) -> None:
        data = os.read(STDIN, CHUNK)
        if not data:
            self._stdin_closed()
        else:
            send_to_daemon(self.sock, self.to_daemon, data)
        self._write_socket()

    def _stdin_closed(self) -> None:
        self.stdin_open = False
        self._steady = False  # stop polling stdin

    def _write_socket(self) -> None:
        """Send what the daemon can take now."""
        drain_to_daemon(self.sock, self.to_daemon, self.stdin_open)

    def _read_socket(self) -> bool:
        """Take what the daemon sent; False once it has closed."""
        try:
            data = self.sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:
            self._lost(exc)
            data = b""
        if not data:
            return False
        return self._from_daemon(data)

    def _from_daemon(self, data: bytes) -> bool:
        """Bytes the daemon sent, for the host; False if the host is gone."""
        return write_to_host(self.to_host, data)

    def _lost(self, exc: OSError) -> None:
        print(f"mcpbroker connect: connection to the daemon lost: {exc}", file=sys.stderr)

    def _write_stdout(self) -> bool:
        """Write what the host can take now; False if it closed its end."""
        return drain_to_host(self.to_host)

    def _daemon_closed(self) -> int | None:
        return self._finish()

    def _finish(self) -> int:
        """The daemon closed the connection: hand the host the rest, then leave."""
        flush_to_host(self.to_host)
        return _exit_code(self.stdin_open)
