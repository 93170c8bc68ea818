"""The Listener actor: the daemon's unix socket.

One daemon per socket. A lock file beside the socket (``SOCKET.lock``, held
with ``flock`` for the daemon's life) decides it: a daemon that cannot take
the lock exits with :class:`AlreadyRunning`, and one that can knows any socket
file already there is a stale leftover of a dead daemon and replaces it. The
socket is created mode 0600 in a directory of mode 0700.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket as stdlib_socket
from collections.abc import Awaitable, Callable, Iterator

import trio

BACKLOG = 512


class AlreadyRunning(Exception):
    """Another daemon serves this socket."""


@contextlib.contextmanager
def hold_socket_lock(socket_path: str) -> Iterator[None]:
    """Hold the daemon lock for ``socket_path``, or raise :class:`AlreadyRunning`."""
    lock_path = socket_path + ".lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise AlreadyRunning(
                f"another mcpbroker daemon (pid {pid}) is already serving {socket_path}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _socket_is_live(socket_path: str) -> bool:
    probe = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    try:
        probe.connect(socket_path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _remove_stale_socket(socket_path: str) -> None:
    if not os.path.exists(socket_path):
        return
    if _socket_is_live(socket_path):
        raise AlreadyRunning(f"a daemon is already listening on {socket_path}")
    os.unlink(socket_path)


async def open_unix_listener(socket_path: str) -> trio.SocketListener:
    """Bind ``socket_path`` (mode 0600), replacing a stale socket file.

    The caller must hold :func:`hold_socket_lock`.
    """
    _remove_stale_socket(socket_path)
    sock = trio.socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        await sock.bind(socket_path)
    finally:
        os.umask(old_umask)
    sock.listen(BACKLOG)
    return trio.SocketListener(sock)


async def serve_unix(
    socket_path: str,
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept clients on ``socket_path`` until cancelled, then remove the socket file."""
    listener = await open_unix_listener(socket_path)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, handler, [listener])
            task_status.started()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
