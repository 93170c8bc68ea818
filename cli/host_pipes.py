"""Moving bytes between the host's stdio and the daemon's socket, never blocking.

The helpers both relays of ``mcpbroker connect`` write with: what a
destination does not take now waits in a buffer of the relay's (``pending``),
and the relay polls for the moment it can take more. Standard library only.
"""

from __future__ import annotations

import _socket
import contextlib
import os

CHUNK = 256 * 1024
BUFFER_LIMIT = 1024 * 1024  # per direction; past it, the source is not read
STDIN, STDOUT = 0, 1


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
