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
from cli.copy_relay import CopyRelay, exit_code
from cli.daemon_socket import DaemonUnavailable, connect, start_daemon
from cli.host_pipes import (
    CHUNK,
    STDIN,
    STDOUT,
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
    resumes = "--no-resume" not in argv
    hello = hello_line(servers, notices=resumes) if servers or resumes else b""
    if hello:
        try:
            sock.sendall(hello)
        except OSError as exc:  # (a daemon that closed at once: the resuming relay's gap)
            if not resumes:
                print(f"mcpbroker connect: connection to the daemon lost: {exc}", file=sys.stderr)
                return 1
    if not resumes:
        return relay(sock)
    from cli.reconnect import ResumingRelay
    from cli.resume import HostState

    return ResumingRelay(sock, HostState(), socket_path, config, hello).run()


def hello_line(servers: list[str], notices: bool = False) -> bytes:
    """The hello naming the session's servers (none: every one), and with
    ``notices`` asking to be told when the daemon begins to stop (the
    resuming relay holds its host's requests then): see broker/hello.py."""
    if any(ord(c) < 0x20 for name in servers for c in name):
        import json  # names this odd are rare enough to pay for the import

        names = ",".join(json.dumps(name) for name in servers)
    else:
        names = ",".join('"' + n.replace("\\", "\\\\").replace('"', '\\"') + '"' for n in servers)
    keys = ['"servers":[' + names + "]"] if servers else []
    if notices:
        keys.append('"notices":["stopping"]')
    return ('{"mcpbroker":{' + ",".join(keys) + "}}\n").encode()


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
        return exit_code(self.stdin_open)
