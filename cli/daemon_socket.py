"""Reaching the daemon from a shim: its socket, and starting it if none listens.

Both relays of ``mcpbroker connect`` (cli/shim.py, cli/reconnect.py) come
here for a connection: :func:`connect` to a daemon already listening (and
run by this user: its peer uid is checked), else :func:`start_daemon`, which
starts one in the background with the shim's config, logging to the file
beside its socket, and waits for it to listen. Standard library only, as
everything on the shim's path.
"""

from __future__ import annotations

import _socket
import os
import sys
import time
from collections.abc import Mapping

from actors.paths import (
    LISTENERS_FROM_ENV,
    MAX_SOCKET_PATH,
    STARTED_BY_ENV,
    UnsafePath,
    default_config_path,
    lock_path_for,
    log_path_for,
    open_private,
    peer_uid,
    prepare_socket_dir,
    recorded_listeners,
)

TYPE_CHECKING = False  # (not typing's: the shim does without it, cli/main.py)
if TYPE_CHECKING:
    import subprocess

# What a service manager gave the host (systemd's sd_notify and sd_listen_fds):
# the daemon a shim starts outlives the host and is not that manager's service.
SERVICE_MANAGER_ENV = frozenset(
    {"NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "WATCHDOG_PID", "WATCHDOG_USEC"}
)
DAEMON_START_TIMEOUT = 15.0
POLL_INTERVAL = 0.01
LOST_RACE_GRACE = 2.0
MAX_STARTS = 4  # daemons started in one wait (each after the lock's holder went)
CONFIG_ERROR_EXIT = 2  # `mcpbroker serve`'s exit code for a bad config: never restarted


class DaemonUnavailable(Exception):
    """No daemon to relay to, and why (the shim prints it and exits 1)."""


def connect(socket_path: str) -> _socket.socket | None:
    """A connection to the daemon listening on ``socket_path``; None if none
    listens there (no socket, or a stale one)."""
    if len(socket_path.encode()) > MAX_SOCKET_PATH:  # (connect's OSError says None)
        raise DaemonUnavailable(
            f"the socket path {socket_path} is longer than a unix socket allows "
            f"({MAX_SOCKET_PATH} bytes): set MCPBROKER_SOCKET to a shorter one"
        )
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(socket_path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError as exc:
        sock.close()
        raise DaemonUnavailable(f"cannot connect to {socket_path}: {exc.strerror or exc}") from None
    other = peer_uid(sock.fileno())
    if other is not None and other != os.getuid():
        sock.close()
        raise DaemonUnavailable(
            f"the process listening on {socket_path} runs as uid {other}, not as this user "
            f"({os.getuid()}); refusing to talk to it"
        )
    return sock


def start_daemon(socket_path: str, config: str | None) -> _socket.socket:
    """Start a daemon on ``socket_path`` and return a connection to it. One
    that exits because another holds the lock is waited for: that one either
    listens (a race between shims) or goes away (a daemon still stopping its
    servers after its socket was removed), and then one is started again."""
    config = config or default_config_path()
    if not os.path.exists(config):
        raise DaemonUnavailable(
            f"no daemon is listening on {socket_path} and there is no config file at "
            f"{config} to start one with (pass --config FILE, or run 'mcpbroker serve')"
        )
    log_path = log_path_for(socket_path)
    try:
        prepare_socket_dir(socket_path)
    except (UnsafePath, OSError) as exc:
        raise DaemonUnavailable(str(exc)) from None
    start = _size(log_path)  # (the failure message shows only what this daemon logs)
    # A daemon that died (no clean stop) left the listeners it was started
    # with: this one serves them too, for the hosts that use it by URL.
    listeners = recorded_listeners(socket_path)
    if listeners:
        say(
            f"starting a daemon with the listeners of the one that went away: {' '.join(listeners)}"
        )
    # Whose they were, for its status (the lock names its last holder).
    origin = f"{_lock_state(socket_path)[0] or 0} {time.time():.0f}" if listeners else ""
    child = _spawn(socket_path, config, log_path, listeners, origin)
    deadline = time.monotonic() + DAEMON_START_TIMEOUT
    exited_at: float | None = None
    starts = 1
    holder: int | None = None  # a live daemon that holds the lock, not this shim's
    while time.monotonic() < deadline:
        sock = connect(socket_path)
        if sock is not None:
            return sock
        if exited_at is None and child.poll() is not None:
            exited_at = time.monotonic()
        if exited_at is not None and child.returncode != CONFIG_ERROR_EXIT:
            # It may have found the lock held: by another shim's daemon, about
            # to listen, or by one still stopping its servers with its socket
            # gone (SIGTERM): wait for that one to listen or to go, then start.
            other, held = _lock_state(socket_path, child.pid)
            if other != child.pid and held:
                holder = other or 0  # (0: its pid not written yet)
            elif other != child.pid and starts < MAX_STARTS:  # (it did not take the lock)
                holder, exited_at, starts = None, None, starts + 1
                start = _size(log_path)
                child = _spawn(socket_path, config, log_path, listeners, origin)
            elif listeners and starts < MAX_STARTS:  # (one of them cannot be served now)
                say(f"that failed:\n{_tail(log_path, start)}starting one without them")
                listeners, holder, exited_at, starts = [], None, None, starts + 1
                start = _size(log_path)
                child = _spawn(socket_path, config, log_path, listeners)
            else:
                holder = None
        if (
            holder is None
            and exited_at is not None
            and time.monotonic() - exited_at > LOST_RACE_GRACE
        ):
            tail = _tail(log_path, start) or (
                f"(it exited with status {child.returncode} and logged nothing)"
            )
            raise DaemonUnavailable(f"the daemon failed to start:\n{tail}")
        time.sleep(POLL_INTERVAL)
    if holder is not None:
        lock = lock_path_for(socket_path)
        raise DaemonUnavailable(
            f"another mcpbroker daemon (pid {holder or '?'}) holds {lock} without "
            f"listening, and did not go away within {DAEMON_START_TIMEOUT:g} s"
        )
    raise DaemonUnavailable(
        f"the daemon did not start listening within {DAEMON_START_TIMEOUT:g} s; see {log_path}"
    )


def _spawn(
    socket_path: str, config: str, log_path: str, listeners: list[str], origin: str = ""
) -> subprocess.Popen[bytes]:
    """Start a daemon; ``listeners``: flags a daemon that went away recorded,
    ``origin`` ("PID TIME") saying whose (``$MCPBROKER_LISTENERS_FROM``)."""
    import subprocess  # only on this path: most shims find the daemon running

    env = daemon_environ(os.environ)
    env.pop(LISTENERS_FROM_ENV, None)
    if listeners and origin:
        env[LISTENERS_FROM_ENV] = origin
    try:
        log = os.fdopen(open_private(log_path, os.O_WRONLY | os.O_APPEND), "ab")
    except (UnsafePath, OSError) as exc:
        raise DaemonUnavailable(str(exc)) from None
    with log:
        return subprocess.Popen(
            [
                sys.executable,
                # -P: not the working directory (the host's project) first on
                # sys.path, where its cli/ or logging.py would be imported instead
                "-P",
                "-m",
                "cli.main",
                "serve",
                "--config",
                config,
                "--socket",
                socket_path,
                "--log-file",
                log_path,
                *listeners,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            env=env,
        )


def _lock_state(socket_path: str, mine: int | None = None) -> tuple[int | None, bool]:
    """The pid the daemon lock beside ``socket_path`` names (its last holder's;
    None if none), and whether a daemon holds the lock now (the lock, not its
    pid: a daemon that exited may be its parent's zombie for a while), tried
    only if it names another pid than ``mine`` (the daemon this shim started;
    None: never tried, False): trying it holds it for an instant, when a
    daemon starting would find it held."""
    try:
        fd = os.open(lock_path_for(socket_path), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None, False
    try:
        named = _pid_in(fd)
        return named, mine is not None and named != mine and _held(fd)
    finally:
        os.close(fd)


def _pid_in(fd: int) -> int | None:
    try:
        return int(os.read(fd, 32).strip() or b"0") or None
    except (OSError, ValueError):
        return None


def _held(fd: int) -> bool:
    """Whether another process holds the lock open as ``fd`` (tried, and let
    go when ``fd`` is closed)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def say(text: str) -> None:
    """A line for the host's log (the shim's stderr)."""
    print(f"mcpbroker connect: {text}", file=sys.stderr, flush=True)


def _tail(path: str, start: int = 0, lines: int = 10) -> str:
    """The last lines of the log from byte ``start`` on (what this daemon wrote)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return b"".join(f.readlines()[-lines:]).decode(errors="replace")
    except OSError:
        return f"(no log at {path})"


def daemon_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a daemon a shim starts: the shim's, less what the
    host's service manager gave it, and saying who started it (for
    ``mcpbroker status``)."""
    env = {key: value for key, value in environ.items() if key not in SERVICE_MANAGER_ENV}
    env[STARTED_BY_ENV] = "shim"
    return env
