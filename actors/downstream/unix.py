"""The Listener actor: the daemon's unix socket.

One daemon per socket. A lock file beside the socket (``SOCKET.lock``, held
with ``flock`` for the daemon's life) decides it: a daemon that cannot take
the lock exits with :class:`AlreadyRunning`, and one that can knows any socket
file already there is a stale leftover of a dead daemon and replaces it;
anything else at that path (a regular file, a directory) is never removed:
the daemon refuses to start. The socket is created mode 0600 in a directory
of mode 0700 (actors/paths.py), the lock file is opened without following
symlinks, and each connection's peer uid is checked: another user's is
refused and logged.

Socket activation: a service manager (systemd's ``mcpbroker.socket``, which
``mcpbroker service install`` writes) may hand the daemon its listening socket
already bound (``LISTEN_PID``, ``LISTEN_FDS``: :func:`take_inherited_listener`).
The daemon then serves that socket as it is: it takes the lock as always, but
neither replaces the file nor removes it when it stops, since the manager owns
it and keeps it listening while the daemon restarts (docs/service.md).

Running out of descriptors (EMFILE and friends) while accepting does not
flood the log: the loop backs off and reports at most once every
:data:`REPORT_EVERY` seconds, with a count.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket as stdlib_socket
import stat
from collections.abc import Awaitable, Callable, Iterator, MutableMapping

import trio

from actors.logs import get_logger
from actors.paths import UnsafePath, lock_path_for, open_private, peer_uid

BACKLOG = 512
ACCEPT_RETRY = 0.1  # seconds to wait after an accept that failed for want of resources
REPORT_EVERY = 10.0  # seconds between two log lines about such failures
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
LISTEN_FDS_START = 3  # the first descriptor a service manager passes (sd_listen_fds)


class StartError(Exception):
    """The daemon cannot serve this socket; the message says why, in one line."""


class ConfigRefused(StartError):
    """The configuration cannot be served as it is (a token file that cannot be
    read, a listener off loopback without a token, an audit log that cannot be
    opened): ``serve`` exits 2, as for a bad file, since a restart would not
    mend it (docs/service.md, ``RestartPreventExitStatus=2``)."""


class AlreadyRunning(StartError):
    """Another daemon serves this socket."""


@contextlib.contextmanager
def hold_socket_lock(socket_path: str) -> Iterator[None]:
    """Hold the daemon lock for ``socket_path``, or raise :class:`AlreadyRunning`."""
    lock_path = lock_path_for(socket_path)
    try:
        fd = open_private(lock_path)
    except (UnsafePath, OSError) as exc:
        raise StartError(f"cannot use the lock file {lock_path}: {exc}") from None
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


def claim_socket_path(socket_path: str) -> None:
    """Make ``socket_path`` free to bind, or raise :class:`StartError`: a stale
    socket is removed; a live one, or anything that is not a socket, is left
    alone. The caller must hold :func:`hold_socket_lock`."""
    _remove_stale_socket(socket_path)


def _remove_stale_socket(socket_path: str) -> None:
    try:
        info = os.lstat(socket_path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise StartError(f"{socket_path} exists and is not a socket; refusing to replace it")
    if _socket_is_live(socket_path):
        raise AlreadyRunning(f"a daemon is already listening on {socket_path}")
    os.unlink(socket_path)


def take_inherited_listener(
    environ: MutableMapping[str, str] = os.environ, fd: int = LISTEN_FDS_START
) -> stdlib_socket.socket | None:
    """The listening unix socket a service manager handed this process, or None.

    The protocol of systemd's ``sd_listen_fds``: ``LISTEN_PID`` is this
    process's pid and ``LISTEN_FDS`` the number of descriptors from ``fd`` (3)
    on. The variables are removed either way, so that the servers the daemon
    starts do not inherit them, and the socket is not inherited by them either. Raises
    :class:`StartError` if what was handed over is not one listening unix
    stream socket on a path.
    """
    pid = environ.pop("LISTEN_PID", None)
    count = environ.pop("LISTEN_FDS", None)
    environ.pop("LISTEN_FDNAMES", None)
    if pid != str(os.getpid()) or count is None:
        return None
    if count != "1":
        raise StartError(f"expected one socket from the service manager, got LISTEN_FDS={count}")
    try:
        sock = stdlib_socket.socket(fileno=fd)
    except OSError as exc:
        raise StartError(f"the socket handed over (descriptor {fd}) is unusable: {exc}") from None
    sock.set_inheritable(False)
    listening = sock.getsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_ACCEPTCONN)
    kind = (sock.family, sock.type)
    if kind != (stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM) or not listening:
        sock.close()
        raise StartError("the socket handed over is not a listening unix stream socket")
    name = sock.getsockname()
    if not isinstance(name, str) or not name.startswith("/"):
        sock.close()
        raise StartError(f"the socket handed over is not on a path ({name!r})")
    return sock


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
    inherited: stdlib_socket.socket | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept clients on ``socket_path`` until cancelled, then remove the socket
    file if it is still the one this daemon bound. With ``inherited`` (from
    :func:`take_inherited_listener`), serve that socket and leave its file alone."""
    if inherited is not None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(inherited))
    else:
        listener = await open_unix_listener(socket_path)
    bound = None if inherited is not None else _identity(socket_path)
    try:
        async with trio.open_nursery() as nursery:
            task_status.started()
            await _accept_loop(listener, handler, nursery)
    finally:
        # (Another may have taken the path over meanwhile: a service manager's
        # socket, bound where this daemon's was; that one is not ours to remove.)
        if bound is not None and _identity(socket_path) == bound:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(socket_path)


def _identity(path: str) -> tuple[int, int] | None:
    """The file at ``path`` (device, inode), or None if there is none."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return info.st_dev, info.st_ino


async def _accept_loop(
    listener: trio.SocketListener,
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    nursery: trio.Nursery,
) -> None:
    log = get_logger()
    uid = os.getuid()
    failures, reported = 0, -REPORT_EVERY
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in _OUT_OF_RESOURCES:
                raise
            failures += 1
            if trio.current_time() - reported >= REPORT_EVERY:
                log.error("listener.accept_failed", error=os.strerror(exc.errno), count=failures)
                failures, reported = 0, trio.current_time()
            await trio.sleep(ACCEPT_RETRY)
            continue
        other = peer_uid(stream.socket.fileno())
        if other is not None and other != uid:
            log.warning("listener.foreign_peer_refused", peer_uid=other)
            await stream.aclose()
            continue
        nursery.start_soon(handler, stream)
