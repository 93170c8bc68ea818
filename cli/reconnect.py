"""The shim's relay that outlives the daemon (``mcpbroker connect`` by default).

It copies whole lines both ways, showing each to :class:`cli.resume.HostState`
(byte searches, no JSON parsing), so that when the daemon goes away it knows
which of the host's requests were in flight and what the host had set up.
Then (:meth:`ResumingRelay._gap`): an error for each request in flight,
a new connection (to a daemon someone else restarted, or to one it starts,
with backoff, bounded), the host's ``initialize`` replayed and its answer
dropped, then ``notifications/initialized``, the log level and the resource
subscriptions; then the relay goes on, on the same stdin and stdout, and the
host need not notice. docs/hosts.md ("When the daemon restarts") says what
the host sees.

Why lines and not ``splice`` (cli/shim.py's relay with ``--no-resume``): a
request the daemon had not yet read when it died is lost with it, and only
what passed through this process says which ids those were, and which answers
came back (docs/hosts.md records the measurements and the choice).
"""

from __future__ import annotations

import _socket
import contextlib
import os
import time
from collections.abc import Callable

from cli.copy_relay import CopyRelay, HostGone
from cli.daemon_socket import DaemonUnavailable, connect, say, start_daemon
from cli.host_pipes import (
    BUFFER_LIMIT,
    CHUNK,
    STDIN,
    STDOUT,
    flush_to_host,
    send_to_daemon,
)
from cli.resume import STOPPING_NOTICE, HostState, cancelled_id, scan

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
STABLE = 10.0  # a session restored this long ago counts as restored for good
# Once the daemon says it is stopping, the host's new requests wait for the
# next daemon, for at most this long (then they go to the stopping one, which
# still serves this session: broker/hello.py's notices).
HOLD_TIMEOUT = 60.0
MAX_QUICK_GAPS = 5


class SessionRefused(DaemonUnavailable):
    """The new daemon refused the replayed session for good: its answer to
    ``initialize`` is an error with ``data.retryable`` false (a hello naming
    a server that is not configured, broker/hello.py: a reload removed it,
    and closed the session). The shim ends, so that the host sees its server
    end, as docs/configuration.md says, and may start it again once it is
    configured; it does not sit on a session that refuses every request."""


class NotTakenBack(OSError):
    """The new daemon answered the replayed ``initialize`` with an error that
    may pass (the server is still starting, or restarting): the replay is
    tried again, as for a daemon not up yet, until RECONNECT_TIMEOUT. (A
    session whose ``initialize`` failed is not initialized: relaying it would
    leave every request of the host refused.)"""


class _Lines:
    """Cuts one direction's bytes into whole lines for ``note`` (True: send it on).

    A line longer than :data:`LONG_LINE` is sent on in pieces, unseen
    (unless ``hold_long``: then it stays in ``partial``, and the caller stops
    reading until it may go)."""

    def __init__(self, note: Callable[[bytes], bool]) -> None:
        self.note = note
        self.partial = bytearray()
        self.long = False  # inside a line too long to hold: pass it through
        self.skipping = False  # inside a line to drop (skip_rest)
        self.hold_long = False

    def feed(self, data: bytes) -> bytes:
        if self.skipping:
            first = data.find(b"\n")
            if first == -1:
                return b""
            self.skipping = False
            data = data[first + 1 :]
        end = data.rfind(b"\n")
        if end == -1:
            if self.long:
                return data
            self.partial += data
            if len(self.partial) > LONG_LINE and not self.hold_long:
                self.long = True
                out = bytes(self.partial)
                self.partial.clear()
                return out
            return b""
        if self.long:
            head, data = data[: data.find(b"\n") + 1], data[data.find(b"\n") + 1 :]
            self.long = False
            return head + self.feed(data)
        if not self.partial and end == len(data) - 1 and data.find(b"\n") == end:
            return data if self.note(data) else b""  # (the usual: one line)
        if self.partial:
            chunk = bytes(self.partial) + data[: end + 1]
            self.partial[:] = data[end + 1 :]
        else:
            chunk = data[: end + 1] if end + 1 < len(data) else data
            self.partial += data[end + 1 :]
        note = self.note
        lines = chunk.split(b"\n")
        lines.pop()  # (after the last newline)
        if len(lines) == 1:
            return chunk if note(chunk) else b""
        kept = [line + b"\n" for line in lines if note(line + b"\n")]
        return b"".join(kept)

    def skip_rest(self) -> None:
        """If a long line is passing through, drop the rest of it."""
        if self.long:
            self.long, self.skipping = False, True

    def reset(self) -> None:
        """The connection this direction went to (or came from) is gone: a
        line half-written to it, or half-read from it, is dropped."""
        self.partial.clear()
        self.long = self.skipping = False


class ResumingRelay(CopyRelay):
    """The shim's relay: poll, whole lines both ways, a new daemon at each gap."""

    def __init__(
        self,
        sock: _socket.socket,
        state: HostState,
        socket_path: str,
        config: str | None,
        hello: bytes,
    ) -> None:
        self.state = state
        self.socket_path, self.config, self.hello = socket_path, config, hello
        self.up = _Lines(self._up_line)
        self.down = _Lines(state.down)
        # While the daemon stops (until then: time.monotonic()), the host's new
        # lines wait here for the next daemon (_up_line), and the host's pipe
        # is not read while they fill BUFFER_LIMIT or once it has closed.
        self.held_until: float | None = None
        self.held: list[bytes] = []
        self._held_size = 0
        self._held_eof = False  # the host closed stdin after lines still held
        self._reconnected = -STABLE  # when the last gap ended
        self._quick_gaps = 0  # gaps in a row, each soon after the one before
        super().__init__(sock)

    def run(self) -> int:
        was_blocking = os.get_blocking(STDOUT)
        os.set_blocking(STDOUT, False)
        try:
            while True:
                code = self._relay()
                if code is not None:
                    return code
                try:
                    self._gap()
                except DaemonUnavailable as exc:
                    say(str(exc))
                    self._flush_to_host()
                    return 1
        finally:
            os.set_blocking(STDOUT, was_blocking)

    # -- the relay (cli/shim.py's, with lines tracked) -------------------------

    def _relay(self) -> int | None:
        """Relay until the end (an exit code) or a gap (None)."""
        try:
            return self._poll()
        except HostGone:
            return 0  # the host stopped reading: it is going away

    def _daemon_closed(self) -> int | None:
        return None if self.stdin_open else self._finish()  # (None: a gap)

    def _read_stdin(self) -> None:
        data = os.read(STDIN, CHUNK)
        if not data and self.held_until is not None and (self.held or self.up.partial):
            if self.up.partial:  # (a last line without newline: it waits with the rest)
                self._hold(bytes(self.up.partial))
                self.up.reset()
            self._held_eof = self.paused = True  # (closed once they are sent)
            self._steady = False
            return
        if not data:
            self._stdin_closed()
            self.to_daemon += bytes(self.up.partial)  # (a last line without newline)
            self.up.reset()
        else:
            send_to_daemon(self.sock, self.to_daemon, self.up.feed(data))
            if self.up.hold_long and len(self.up.partial) > LONG_LINE:
                # (a line too long to hold, begun during a drain: it waits in
                # the host's pipe, behind the lines held, for the next daemon)
                self.paused, self._steady = True, False
        self._write_socket()

    # (_write_socket: if the daemon is gone, what it wrote before may still be
    # there to read, and reading says when it ends, then the gap; what was not
    # sent is in flight and gets its error then.)

    def _from_daemon(self, data: bytes) -> bool:
        going_on = super()._from_daemon(self.down.feed(data))
        if self.state.stopping and self.held_until is None:
            self._hold_stdin()
        return going_on

    def _hold_stdin(self) -> None:
        """The daemon has begun to stop: the host's requests from now on wait
        for the next daemon (what it wrote before is still served), as they
        do during a gap; its answers still go to this one (:meth:`_up_line`)."""
        self.held_until, self._steady = time.monotonic() + HOLD_TIMEOUT, False
        self.up.hold_long = True

    def _up_line(self, line: bytes) -> bool:
        """A whole line from the host: noted and sent on (True), or, while
        the daemon stops, held for the next one. What belongs to the calls
        the stopping daemon is finishing still goes to it: the host's answers
        to its requests (sampling, elicitation, roots) and cancellations of
        requests in flight; the rest is held, in order."""
        if self.held_until is None or self._for_stopping_daemon(line):
            return self.state.up(line)
        self._hold(line)
        return False

    def _for_stopping_daemon(self, line: bytes) -> bool:
        if line[:1] == b"[":
            return False  # (a batch: held whole)
        method, id = scan(line)
        if method is None:
            return id is not None  # an answer (one to a daemon gone is dropped: state.up)
        if method != b"notifications/cancelled" or not self.state.pending:
            return False
        return cancelled_id(line) in self.state.pending

    def _hold(self, line: bytes) -> None:
        self.held.append(line)
        self._held_size += len(line)
        if self._held_size >= BUFFER_LIMIT:
            self.paused, self._steady = True, False  # (the rest waits in the host's pipe)

    def _send_held(self) -> None:
        """Send the lines held (to the next daemon, or to the stopping one at
        HOLD_TIMEOUT), noted as if they came now; then a close of stdin they
        were waiting before."""
        held, self.held, self._held_size = self.held, [], 0
        for line in held:
            if not line.endswith(b"\n") or self.state.up(line):
                self.to_daemon += line
        self.paused, self._steady = False, False
        if self._held_eof:
            self._held_eof = False
            self._stdin_closed()
        self._write_socket()

    def _poll_timeout(self) -> float | None:
        if self.held_until is None:
            return None
        left = self.held_until - time.monotonic()
        if left > 0:
            return left * 1000
        self._release_stdin()  # (a daemon that takes this long: it still serves the session)
        self._send_held()
        return None

    def _release_stdin(self) -> None:
        self.state.stopping = False
        self.held_until, self._steady = None, False
        self.up.hold_long = False

    def _lost(self, exc: OSError) -> None:
        """(Said by the gap that follows.)"""

    def _flush_to_host(self) -> None:
        flush_to_host(self.to_host)

    def _finish(self) -> int:
        """The daemon closed after the host did: hand the host the rest, then
        leave. Requests still in flight get their errors, as at a gap (the
        host closed its stdin, not its stdout: a daemon that died before it
        answered them left them with nothing), and the exit is 1."""
        lost = self.state.gap_errors() if self.state.pending else b""
        if lost:
            self.to_host += lost
            say("the daemon went away with requests in flight")
        self._flush_to_host()
        return 1 if lost else 0

    # -- the gap --------------------------------------------------------------

    def _gap(self) -> None:
        """The daemon is gone: answer what was in flight, then reconnect and
        replay; raises DaemonUnavailable if no daemon comes back in time."""
        with contextlib.suppress(OSError):
            self.sock.close()
        self._release_stdin()  # (what is held goes to the next daemon, once it has the session)
        if self.down.long:
            self.to_host += b"\n"  # (ends the piece of a long answer the host has)
        self.down.reset()  # (an answer cut short never reaches the host)
        self.up.skip_rest()  # (the rest of a long line half sent is no use to a new daemon)
        self.to_daemon.clear()  # (its requests are in flight: they get errors)
        self.to_host += self.state.gap_errors()
        self._flush_to_host()
        say("the daemon went away; reconnecting")
        # A daemon that closes the session again soon after each reconnect (a
        # session it cannot serve) is not reconnected to in a tight loop.
        if time.monotonic() - self._reconnected < STABLE:
            self._quick_gaps += 1
            if self._quick_gaps > MAX_QUICK_GAPS:
                raise DaemonUnavailable(
                    f"the daemon closed this session {self._quick_gaps} times in a row "
                    "right after it was restored; giving up"
                )
            time.sleep(min(RETRY_MIN * 2**self._quick_gaps, RETRY_MAX))
        else:
            self._quick_gaps = 0
        deadline = time.monotonic() + RECONNECT_TIMEOUT
        delay, started = RETRY_MIN, time.monotonic()
        reported: str | None = None
        failed: str | None = None  # (why the last daemon that answered did not take it)
        while True:
            sock = connect(self.socket_path)
            if sock is None and time.monotonic() - started >= WAIT_BEFORE_START:
                try:
                    sock = start_daemon(self.socket_path, self.config)
                except DaemonUnavailable as exc:
                    if str(exc) != reported:
                        say(f"{exc}; waiting for a daemon")
                        reported = str(exc)
            if sock is not None:
                try:
                    self._resume(sock)
                except SessionRefused:
                    with contextlib.suppress(OSError):
                        sock.close()
                    raise
                except (OSError, TimeoutError) as exc:
                    failed = str(exc)
                    said = f"the new daemon did not take the session back ({exc}); retrying"
                    if said != reported:  # (once while it says the same: a stopping one)
                        say(said)
                        reported = said
                    with contextlib.suppress(OSError):
                        sock.close()
                    self.to_host += self.state.gap_errors()
                else:
                    say("reconnected")
                    self._reconnected = time.monotonic()
                    if self.held_until is None:  # (else the new one is stopping already)
                        self._send_held()
                    return
            if time.monotonic() >= deadline:
                raise DaemonUnavailable(
                    f"no daemon came back on {self.socket_path} within {RECONNECT_TIMEOUT:g} s"
                    if failed is None
                    else f"the daemon did not take the session back within "
                    f"{RECONNECT_TIMEOUT:g} s ({failed}); giving up"
                )
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    def _resume(self, sock: _socket.socket) -> None:
        """Say hello again and replay the host's session on ``sock``."""
        sock.settimeout(RESUME_TIMEOUT)
        first, rest = self.state.replay()
        if self.hello or first:
            sock.sendall(self.hello + (first or b""))
        carry = b""
        if first is not None:
            _method, want = scan(first)
            answer, carry = _read_answer(sock, want)  # (and what came after it)
            self.state.replayed.discard(want or b"")
            self.to_host += list_changed(answer)
        if rest:
            sock.sendall(rest)
        self._attach(sock)
        if carry:
            self.to_host += self.down.feed(carry)
            if self.state.stopping:
                self._hold_stdin()


def _read_answer(sock: _socket.socket, id: bytes | None) -> tuple[bytes, bytes]:
    """Read up to the answer with ``id``: that answer, and what followed it."""
    buffer = b""
    while True:
        data = sock.recv(CHUNK)
        if not data:
            raise OSError("closed before answering initialize")
        buffer += data
        while b"\n" in buffer:
            line, _, buffer = buffer.partition(b"\n")
            if line.startswith(STOPPING_NOTICE):  # (a daemon about to go: the next one)
                raise OSError("it is stopping")
            method, got = scan(line + b"\n")
            if method is None and got == id:
                if b'"error"' in line and b'"result"' not in line:
                    message, for_good = _error_of(line)
                    if for_good:
                        raise SessionRefused(
                            f"the daemon refused the session ({message}); "
                            "ending it: the host sees this server end"
                        )
                    raise NotTakenBack(f"it answered initialize: {message}")
                return line, buffer


def _error_of(line: bytes) -> tuple[str, bool]:
    """An error answer's message (the line itself if it has none), and
    whether the daemon says it is for good (``data.retryable`` false)."""
    import json

    try:
        error = json.loads(line)["error"]
        message, data = error.get("message"), error.get("data")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        message = data = None
    for_good = isinstance(data, dict) and data.get("retryable") is False
    return message if isinstance(message, str) else line.decode(errors="replace"), for_good


def list_changed(answer: bytes) -> bytes:
    """The ``list_changed`` notifications a host should act on after a
    reconnect, from the new daemon's answer to the replayed ``initialize``:
    one per list whose capability says it can change (an upgrade may have
    brought other tools; a host that refetches an unchanged list loses nothing)."""
    import json

    try:
        capabilities = json.loads(answer)["result"]["capabilities"]
    except (ValueError, KeyError, TypeError):
        return b""
    notices = []
    for kind in ("tools", "resources", "prompts"):
        declared = capabilities.get(kind)
        if isinstance(declared, dict) and declared.get("listChanged") is True:
            method = f"notifications/{kind}/list_changed"
            notices.append(b'{"jsonrpc":"2.0","method":"%s"}\n' % method.encode())
    return b"".join(notices)
