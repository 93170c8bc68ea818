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
import time

from actors.paths import (
    STARTED_BY_ENV,
    UnsafePath,
    default_config_path,
    default_socket_path,
    log_path_for,
    open_private,
    peer_uid,
    prepare_socket_dir,
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
CHUNK = 256 * 1024
BUFFER_LIMIT = 1024 * 1024  # per direction; past it, the source is not read
STDIN, STDOUT = 0, 1
DAEMON_START_TIMEOUT = 15.0
POLL_INTERVAL = 0.01
LOST_RACE_GRACE = 2.0
# Reconnecting after the daemon went away: wait this long for a daemon someone
# else restarts (a service manager, an upgrade by hand) before starting one,
# retry with backoff up to RETRY_MAX between attempts, give up after
# RECONNECT_TIMEOUT; a new daemon has RESUME_TIMEOUT to answer the replayed
# initialize (it waits for the session's servers to come up).
WAIT_BEFORE_START = 0.3
RETRY_MIN, RETRY_MAX = 0.05, 1.0
RECONNECT_TIMEOUT = 60.0
RESUME_TIMEOUT = 30.0
LONG_LINE = 16 * 1024 * 1024  # past this a line is sent on in pieces, untracked


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
        sock = _connect(socket_path) or _start_daemon(socket_path, config)
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


class DaemonUnavailable(Exception):
    pass


def _connect(socket_path: str) -> _socket.socket | None:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(socket_path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError as exc:
        sock.close()
        raise DaemonUnavailable(f"cannot connect to {socket_path}: {exc.strerror}") from None
    other = peer_uid(sock)
    if other is not None and other != os.getuid():
        sock.close()
        raise DaemonUnavailable(
            f"the process listening on {socket_path} runs as uid {other}, not as this user "
            f"({os.getuid()}); refusing to talk to it"
        )
    return sock


def _start_daemon(socket_path: str, config: str | None) -> _socket.socket:
    import subprocess  # only on this path: most shims find the daemon running

    config = config or default_config_path()
    if not os.path.exists(config):
        raise DaemonUnavailable(
            f"no daemon is listening on {socket_path} and there is no config file at "
            f"{config} to start one with (pass --config FILE, or run 'mcpbroker serve')"
        )
    log_path = log_path_for(socket_path)
    try:
        prepare_socket_dir(socket_path)
        log_fd = open_private(log_path, os.O_WRONLY | os.O_APPEND)
    except (UnsafePath, OSError) as exc:
        raise DaemonUnavailable(str(exc)) from None
    start = os.fstat(log_fd).st_size  # (the failure message shows only what follows)
    with os.fdopen(log_fd, "ab") as log:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli.main",
                "serve",
                "--config",
                config,
                "--socket",
                socket_path,
                "--log-file",
                log_path,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            env={**os.environ, STARTED_BY_ENV: "shim"},  # (for `mcpbroker status`)
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
            raise DaemonUnavailable(f"the daemon failed to start:\n{_tail(log_path, start)}")
        time.sleep(POLL_INTERVAL)
    raise DaemonUnavailable(
        f"the daemon did not start listening within {DAEMON_START_TIMEOUT:g} s; see {log_path}"
    )


def _tail(path: str, start: int = 0, lines: int = 10) -> str:
    """The last lines of the log from byte ``start`` on (what this daemon wrote)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return b"".join(f.readlines()[-lines:]).decode(errors="replace")
    except OSError:
        return f"(no log at {path})"


def relay(sock: _socket.socket) -> int:
    """Copy stdin to the socket and the socket to stdout until the daemon closes.

    One thread woken by ``poll``, splicing when stdin and stdout are pipes
    (:class:`_SpliceRelay`), copying otherwise (:class:`_Relay`).
    """
    sock.setblocking(False)
    was_blocking = os.get_blocking(STDOUT)
    os.set_blocking(STDOUT, False)
    try:
        if _is_pipe(STDIN) and _is_pipe(STDOUT):
            with contextlib.suppress(_SpliceUnsupported):  # then nothing is held here
                return _SpliceRelay(sock).run()
        return _Relay(sock).run()
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
    source is not polled: each direction stalls alone, as in :class:`_Relay`.
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


def write_to_host(pending: bytearray, data: bytes | bytearray) -> bool:
    """Write ``data`` to stdout after what is ``pending``, without blocking:
    now if nothing is pending (the usual case), keeping what stdout did not
    take in ``pending``. False if the host closed its end."""
    if pending:
        pending += data
        return drain_to_host(pending)
    try:
        written = os.write(STDOUT, data) if data else 0
    except (BlockingIOError, InterruptedError):
        written = 0
    except BrokenPipeError:
        return False
    if written < len(data):
        pending += memoryview(data)[written:]
    return True


def drain_to_host(pending: bytearray) -> bool:
    """Write what of ``pending`` stdout takes now; False if the host closed its end."""
    try:
        del pending[: os.write(STDOUT, pending)]
    except (BlockingIOError, InterruptedError):
        pass
    except BrokenPipeError:
        return False
    return True


def flush_to_host(pending: bytearray) -> None:
    """Write all of ``pending``, waiting for the host (at the end of a relay)."""
    os.set_blocking(STDOUT, True)
    with contextlib.suppress(BrokenPipeError):
        while pending:
            del pending[: os.write(STDOUT, pending)]
    os.set_blocking(STDOUT, False)


def send_to_daemon(sock: _socket.socket, pending: bytearray, data: bytes | bytearray) -> None:
    """Send ``data`` after what is ``pending``, without blocking, keeping the rest.

    A socket error means the daemon is gone: what it wrote before may still
    be there to read, and reading says when it ends, so the data is dropped
    here (it was in flight; whoever reads the end answers for it)."""
    if pending:
        pending += data
        return
    try:
        sent = sock.send(data) if data else 0
    except (BlockingIOError, InterruptedError):
        sent = 0
    except OSError:
        return
    if sent < len(data):
        pending += memoryview(data)[sent:]


def drain_to_daemon(sock: _socket.socket, pending: bytearray, stdin_open: bool) -> None:
    """Send what of ``pending`` the daemon takes now; once stdin has ended
    and nothing is pending, shut the socket's writing side (the daemon's
    end of input)."""
    if pending:
        try:
            del pending[: sock.send(pending)]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pending.clear()  # the daemon is gone; reading says so
    if not stdin_open and not pending:
        with contextlib.suppress(OSError):
            sock.shutdown(_socket.SHUT_WR)


class _Relay:
    """The relay for any stdin and stdout (a file, a terminal, a socket).

    Writes never block: each direction has a buffer, and while one is full
    (:data:`BUFFER_LIMIT`) its source is not read, so a host that stops
    reading stalls only its own direction.
    """

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.sock_fd = sock.fileno()
        self.to_daemon = bytearray()
        self.to_host = bytearray()
        self.stdin_open = True
        self._events = {STDIN: 0, STDOUT: 0, self.sock_fd: 0}  # what poll waits for
        # Whether poll waits for what it waits for while both buffers are empty
        # (the steady state: then nothing needs looking at between two polls).
        self._steady = False

    def run(self) -> int:
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
                        return self._finish()

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
            self.stdin_open = False
            self._steady = False  # stop polling stdin
        else:
            send_to_daemon(self.sock, self.to_daemon, data)
        self._write_socket()

    def _write_socket(self) -> None:
        drain_to_daemon(self.sock, self.to_daemon, self.stdin_open)

    def _read_socket(self) -> bool:
        try:
            data = self.sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:
            print(f"mcpbroker connect: connection to the daemon lost: {exc}", file=sys.stderr)
            data = b""
        if not data:
            return False
        return write_to_host(self.to_host, data)

    def _write_stdout(self) -> bool:
        return drain_to_host(self.to_host)

    def _finish(self) -> int:
        """The daemon closed the connection: hand the host the rest, then leave."""
        flush_to_host(self.to_host)
        return _exit_code(self.stdin_open)
