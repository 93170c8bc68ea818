"""Where things live by default, and the checks that keep them the user's own.

Standard library only: the ``connect`` shim imports this module.

The daemon's directory is derived from the uid alone, never from variables
that hosts drop (the official SDKs give a stdio server only HOME, PATH, USER,
SHELL, TERM and LOGNAME), so a host and a terminal reach the same daemon:
``/run/user/UID/mcpbroker`` when ``/run/user/UID`` is the user's (systemd
makes it), else ``~/.local/state/mcpbroker`` under the home directory of the
user database (not ``$HOME``). Never a predictable path in a shared
directory, which another user could create first (docs/security.md).

Before use the directory is created 0700 and checked (:func:`ensure_private_dir`):
a real directory, not a symlink, owned by the user, with no group or other
permissions; files in it are opened without following symlinks
(:func:`open_private`), and both ends of every connection check the other's
uid (:func:`peer_uid`).
"""

from __future__ import annotations

import _socket  # (not ``socket``: the shim avoids its import time)
import contextlib
import errno
import os
import pwd
import stat
import struct
from collections.abc import MutableMapping

SOCKET_ENV = "MCPBROKER_SOCKET"
CONFIG_ENV = "MCPBROKER_CONFIG"
# Who started the daemon: "shim" (set by ``mcpbroker connect``) or "service" (set
# by the unit ``mcpbroker service install`` writes); unset, by hand.
STARTED_BY_ENV = "MCPBROKER_STARTED_BY"
# Set by the shim on a daemon it starts with the listeners a daemon that went
# away recorded: "PID TIME", that daemon's pid (0: unknown) and when the shim
# found it gone (seconds since the epoch), for ``mcpbroker status``.
LISTENERS_FROM_ENV = "MCPBROKER_LISTENERS_FROM"
SOCKET_NAME = "mcpbroker.sock"
# AF_UNIX paths are at most 107 bytes on Linux (104 on macOS).
MAX_SOCKET_PATH = 104


class UnsafePath(Exception):
    """A path the daemon will not use: it is not the user's alone."""


def default_socket_path() -> str:
    """``$MCPBROKER_SOCKET``, else ``mcpbroker.sock`` in :func:`runtime_dir`."""
    explicit = os.environ.get(SOCKET_ENV)
    if explicit:
        return explicit
    return os.path.join(runtime_dir(), SOCKET_NAME)


def runtime_dir(uid: int | None = None, run_user: str = "/run/user") -> str:
    """The daemon's directory for ``uid`` (this process's): see the module's doc."""
    uid = os.getuid() if uid is None else uid
    base = os.path.join(run_user, str(uid))
    if _is_private_dir(base, uid):
        return os.path.join(base, "mcpbroker")
    home = pwd.getpwuid(uid).pw_dir
    return os.path.join(home, ".local", "state", "mcpbroker")


def default_config_path() -> str:
    """``$MCPBROKER_CONFIG``, else ``$XDG_CONFIG_HOME/mcpbroker/config.json``."""
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "mcpbroker", "config.json")


def log_path_for(socket_path: str) -> str:
    """Where a daemon started by the shim writes its log."""
    return socket_path + ".log"


def lock_path_for(socket_path: str) -> str:
    """The daemon lock beside ``socket_path``: held by the daemon serving it,
    which writes its pid there."""
    return socket_path + ".lock"


# The listeners a daemon was given on its command line, recorded beside its
# socket while it runs (docs/hosts.md, "When the daemon restarts"): a daemon a
# shim starts in place of one that died (its record left behind) serves them too.
LISTENER_FLAGS = ("--ws", "--http", "--token-file", "--metrics")


def listeners_path_for(socket_path: str) -> str:
    return socket_path + ".listeners"


def record_listeners(socket_path: str, flags: list[str]) -> None:
    """Record ``flags`` (pairs: a LISTENER_FLAGS flag, its value) for the
    daemon serving ``socket_path``, or remove the record if there are none.
    The caller holds the daemon lock."""
    path = listeners_path_for(socket_path)
    if not flags:
        forget_listeners(socket_path)
        return
    fd = open_private(path, os.O_WRONLY)
    with os.fdopen(fd, "w") as f:
        f.truncate()
        f.write("".join(flag + "\n" for flag in flags))


def forget_listeners(socket_path: str) -> None:
    """A daemon stopping cleanly: its listeners are not to be brought back."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(listeners_path_for(socket_path))


def recorded_listeners(socket_path: str) -> list[str]:
    """The listener flags a daemon that did not stop cleanly recorded (none
    if there is no record, or it is not one)."""
    try:
        fd = open_private(listeners_path_for(socket_path), os.O_RDONLY, create=False)
    except (UnsafePath, OSError):
        return []
    with os.fdopen(fd) as f:
        lines = f.read(1 << 16).split("\n")[:-1]
    pairs = list(zip(lines[::2], lines[1::2], strict=False))
    if len(lines) % 2 or not all(flag in LISTENER_FLAGS and value for flag, value in pairs):
        return []
    return lines


def take_listeners_origin(
    environ: MutableMapping[str, str],
) -> dict[str, float | int | None] | None:
    """Whose listeners this daemon serves, from ``$MCPBROKER_LISTENERS_FROM``
    (removed, so that the servers it starts do not inherit it): ``{"pid":
    PID or None, "gone_by": TIME}`` of the daemon that went away, or None (its
    listeners are its own, or the value is not one)."""
    value = environ.pop(LISTENERS_FROM_ENV, "")
    try:
        pid, gone_by = value.split(" ")
        return {"pid": int(pid) or None, "gone_by": float(gone_by)}
    except ValueError:
        return None


def ensure_private_dir(path: str) -> None:
    """Create ``path`` (mode 0700) if need be, then check that it is this user's
    alone; raise :class:`UnsafePath` saying why not."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    uid = os.getuid()
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafePath(f"{path} is not a directory (a symlink?); refusing to use it")
    if info.st_uid != uid:
        raise UnsafePath(
            f"{path} belongs to uid {info.st_uid}, not to this user ({uid}); refusing to "
            "use it (another user may have made it: remove it, or set MCPBROKER_SOCKET)"
        )
    if info.st_mode & 0o077:
        raise UnsafePath(
            f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}); "
            f"refusing to use it (chmod 700 {path})"
        )


def prepare_socket_dir(socket_path: str) -> None:
    """Make ready the directory of the daemon's socket, or raise :class:`UnsafePath`:
    created 0700 and checked if it is the default one or does not exist yet,
    else checked as a directory the user chose (:func:`check_socket_dir`)."""
    directory = os.path.dirname(os.path.abspath(socket_path))
    if directory == runtime_dir() or not os.path.lexists(directory):
        ensure_private_dir(directory)
    check_socket_dir(socket_path)


def check_socket_dir(socket_path: str) -> None:
    """Check the directory of a socket path given by the user (``--socket``,
    ``$MCPBROKER_SOCKET``): private to this user, or a sticky directory such as
    /tmp (where nobody else can remove or rename what we make in it; what they
    might make there first is refused by :func:`open_private` and the uid checks)."""
    directory = os.path.dirname(os.path.abspath(socket_path))
    if len(socket_path.encode()) > MAX_SOCKET_PATH:
        raise UnsafePath(
            f"the socket path {socket_path} is longer than a unix socket allows "
            f"({MAX_SOCKET_PATH} bytes): set MCPBROKER_SOCKET to a shorter one"
        )
    info = os.stat(directory)
    open_to_others = info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX
    if open_to_others or (info.st_uid not in (os.getuid(), 0)):
        raise UnsafePath(
            f"{directory} can be changed by other users; refusing to put the daemon's socket there"
        )


def open_private(path: str, flags: int = os.O_RDWR, *, create: bool = True) -> int:
    """Open (or create, mode 0600, unless ``create`` is False) a file of the
    daemon's without following a symlink, and check that it is a regular
    file of this user's; a descriptor."""
    creating = os.O_CREAT if create else 0
    try:
        fd = os.open(path, flags | creating | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{path} is a symlink; refusing to follow it") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        raise UnsafePath(f"{path} is not a regular file of this user's; refusing to use it")
    return fd


def peer_uid(fd: int) -> int | None:
    """The uid of the process at the other end of the unix socket ``fd`` (None
    where the platform cannot tell: only Linux's SO_PEERCRED is read). A
    descriptor, not a socket object: the shim's and Trio's are not one type,
    and naming both would cost the shim the ``typing`` import (3 ms)."""
    option = getattr(_socket, "SO_PEERCRED", None)
    if option is None:
        return None
    sock = _socket.socket(fileno=fd)
    try:
        credentials = sock.getsockopt(_socket.SOL_SOCKET, option, struct.calcsize("3i"))
    finally:
        sock.detach()  # (the descriptor stays its owner's)
    return int(struct.unpack("3i", credentials)[1])


def _is_private_dir(path: str, uid: int) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == uid and not info.st_mode & 0o022
