"""The copying relay of ``mcpbroker connect``: stdin to the daemon's socket
and the socket to stdout, through buffers, one thread woken by ``poll``.

cli/shim.py runs it with ``--no-resume`` where stdin or stdout is not a pipe
(where both are, it splices); cli/reconnect.py's relay, the default, is this
one with lines tracked and a new daemon at each gap. Standard library only.
"""

from __future__ import annotations

import _socket
import os
import select
import sys

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


def exit_code(stdin_open: bool) -> int:
    """Once the daemon has closed: 0 if the host had finished too, else 1 (and why)."""
    if stdin_open:
        print("mcpbroker connect: the daemon closed the connection", file=sys.stderr)
        return 1
    return 0


class HostGone(Exception):
    """The host closed its end of stdout: the shim has nothing left to do."""


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
        # stdin is not read while this is set (cli/reconnect.py: what it holds is full)
        self.paused = False
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
        try:
            code = self._poll()
        except HostGone:
            return 0  # the host stopped reading: it is going away
        assert code is not None  # (here the daemon's close is the end: no gap)
        return code

    def _poll(self) -> int | None:
        """Relay until the end (an exit code), or what :meth:`_daemon_closed` says."""
        poller = select.poll()
        while True:
            timeout = self._poll_timeout()
            self._register(poller)
            for fd, events in poller.poll(timeout):
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
        reading = self.stdin_open and not self.paused
        stdin = select.POLLIN if reading and to_daemon < BUFFER_LIMIT else 0
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

    def _poll_timeout(self) -> float | None:
        """Milliseconds poll may wait for (None: until something happens); a
        hook, for a relay with a deadline of its own."""
        return None

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
        """Take what the daemon sent; False once it has closed (:class:`HostGone`
        if the host has)."""
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
        """Bytes the daemon sent, for the host (:class:`HostGone` if it is
        gone: not to be taken for the daemon's close)."""
        if not write_to_host(self.to_host, data):
            raise HostGone
        return True

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
        return exit_code(self.stdin_open)
