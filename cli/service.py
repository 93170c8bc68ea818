"""``mcpbroker service``: run the daemon under the user's service manager.

``install`` writes and enables a systemd user unit, ``mcpbroker.service``, and
its socket, ``mcpbroker.socket`` (on macOS a launchd agent), running
``mcpbroker serve --config FILE`` with restarts on failure; ``uninstall``
disables and removes them. docs/service.md says why the socket is handed to
the daemon by systemd (socket activation) and what that changes.

The unit files are made by pure functions (:func:`systemd_service`,
:func:`systemd_socket`, :func:`launchd_plist`), the steps by
:func:`install_plan` and :func:`uninstall_plan`; :func:`main` shows the steps
(``--dry-run``) or carries them out, running ``systemctl`` or ``launchctl``
as they are found on ``PATH``.
"""

from __future__ import annotations

import argparse
import os
import plistlib
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from actors.paths import STARTED_BY_ENV, default_config_path, default_socket_path
from cli.daemon_socket import CONFIG_ERROR_EXIT

UNIT = "mcpbroker"
LAUNCHD_LABEL = "org.mcpbroker.daemon"
HEADER = "# Written by `mcpbroker service install`; `mcpbroker service uninstall` removes it."
RESTART_DELAY = 2  # seconds between a failure and the next start
STOP_TIMEOUT = 30  # seconds the daemon has to stop its servers before it is killed
LAUNCHD_THROTTLE = 10  # seconds between two starts of the launchd agent


class ServiceError(Exception):
    """The service cannot be installed as asked; the message says why."""


# -- the files ------------------------------------------------------------------------------


def daemon_command() -> list[str]:
    """How the service starts this installation's ``mcpbroker``: the script
    beside this Python (a venv's ``bin/``), else ``python -P -m cli.main``
    (``-P``: the working directory, a host's project for the shim this
    command also is in a host's config, is not put first on ``sys.path``,
    where its ``cli/`` or ``logging.py`` would be imported instead)."""
    bindir = os.path.dirname(os.path.abspath(sys.executable))
    script = os.path.join(bindir, "mcpbroker")
    if os.access(script, os.X_OK):
        return [script]
    return [os.path.abspath(sys.executable), "-P", "-m", "cli.main"]


def serve_argv(command: list[str], config: str, socket_path: str, *extra: str) -> list[str]:
    return [*command, "serve", "--config", config, "--socket", socket_path, *extra]


def reload_argv(command: list[str], socket_path: str) -> list[str]:
    return [*command, "reload", "--socket", socket_path]


def systemd_service(argv: list[str], path_env: str, reload: list[str]) -> str:
    """The text of ``mcpbroker.service``: ``argv`` (from :func:`serve_argv`) run
    with ``PATH`` as it was at install, ready once it says so (``sd_notify``:
    actors/sdnotify.py), reloaded by ``reload`` (from :func:`reload_argv`:
    ``systemctl reload`` waits for its answer), restarted on failure."""
    return "\n".join(
        [
            HEADER,
            "[Unit]",
            "Description=mcpbroker: MCP servers shared by every MCP host",
            f"Requires={UNIT}.socket",
            f"After={UNIT}.socket",
            "",
            "[Service]",
            "# Started once it says READY=1 (on NOTIFY_SOCKET), when it serves its socket.",
            "Type=notify",
            "ExecStart=" + " ".join(_systemd_word(arg) for arg in argv),
            "ExecReload=" + " ".join(_systemd_word(arg) for arg in reload),
            f"Environment={STARTED_BY_ENV}=service",
            "# The servers' commands are looked up on the PATH of `mcpbroker service install`.",
            "Environment=" + _systemd_word(f"PATH={path_env}", dollars=False),
            "Restart=on-failure",
            f"RestartSec={RESTART_DELAY}",
            "# A bad config file: restarting would not mend it.",
            f"RestartPreventExitStatus={CONFIG_ERROR_EXIT}",
            "# SIGTERM to the daemon alone: it stops its servers itself.",
            "KillMode=mixed",
            f"TimeoutStopSec={STOP_TIMEOUT}",
            "",
            "[Install]",
            "WantedBy=default.target",
            f"Also={UNIT}.socket",
            "",
        ]
    )


def systemd_socket(socket_path: str) -> str:
    """The text of ``mcpbroker.socket``: the daemon's unix socket, held by systemd."""
    _check_line(socket_path)
    return "\n".join(
        [
            HEADER,
            "[Unit]",
            "Description=mcpbroker's socket: hosts reach the daemon here, even while it starts",
            "",
            "[Socket]",
            "ListenStream=" + socket_path.replace("%", "%%"),
            "SocketMode=0600",
            "DirectoryMode=0700",
            "Backlog=512",
            "RemoveOnStop=yes",
            "",
            "[Install]",
            "WantedBy=sockets.target",
            "",
        ]
    )


def launchd_plist(argv: list[str], path_env: str, log_dir: str) -> bytes:
    """The launchd agent: ``argv`` started at login, started again after a
    failure; anything said before the daemon's own log opens goes to
    ``log_dir/stderr.log``."""
    agent: dict[str, Any] = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": argv,
        "EnvironmentVariables": {STARTED_BY_ENV: "service", "PATH": path_env},
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": LAUNCHD_THROTTLE,
        "ExitTimeOut": STOP_TIMEOUT,
        "StandardErrorPath": os.path.join(log_dir, "stderr.log"),
    }
    return plistlib.dumps(agent)


def _systemd_word(word: str, dollars: bool = True) -> str:
    """``word`` as one word of a systemd unit's command line (or Environment=)."""
    _check_line(word)
    word = word.replace("%", "%%")
    if dollars:
        word = word.replace("$", "$$")
    if word and not any(c in word for c in " \t\"'\\;"):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _check_line(text: str) -> None:
    if "\n" in text or "\r" in text:
        raise ServiceError(f"{text!r} holds a line break, which a unit file cannot hold")


# -- where they go, and the steps -----------------------------------------------------------


def systemd_dir(home: str, xdg_config_home: str | None = None) -> str:
    return os.path.join(xdg_config_home or os.path.join(home, ".config"), "systemd", "user")


def launchd_path(home: str) -> str:
    return os.path.join(home, "Library", "LaunchAgents", f"{LAUNCHD_LABEL}.plist")


def launchd_log_dir(home: str) -> str:
    return os.path.join(home, "Library", "Logs", "mcpbroker")


@dataclass(frozen=True)
class Write:
    path: str
    content: bytes


@dataclass(frozen=True)
class MakeDir:
    path: str


@dataclass(frozen=True)
class Remove:
    path: str


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]
    may_fail: bool = False  # (launchctl bootout of an agent that is not loaded)


Step = Write | MakeDir | Remove | Run


@dataclass(frozen=True)
class Environment:
    """What the plans depend on, read once from the process (tests make their own)."""

    system: str  # "systemd" or "launchd"
    home: str
    xdg_config_home: str | None
    uid: int
    path_env: str

    @classmethod
    def current(cls, system: str | None = None) -> Environment:
        return cls(
            system=system or ("launchd" if sys.platform == "darwin" else "systemd"),
            home=os.path.expanduser("~"),
            xdg_config_home=os.environ.get("XDG_CONFIG_HOME") or None,
            uid=os.getuid(),
            path_env=os.environ.get("PATH", os.defpath),
        )


def install_plan(env: Environment, command: list[str], config: str, socket_path: str) -> list[Step]:
    if env.system == "launchd":
        log_dir = launchd_log_dir(env.home)
        argv = serve_argv(
            command, config, socket_path, "--log-file", os.path.join(log_dir, "mcpbroker.log")
        )
        plist = launchd_path(env.home)
        return [
            MakeDir(log_dir),
            Write(plist, launchd_plist(argv, env.path_env, log_dir)),
            Run(("launchctl", "bootout", f"gui/{env.uid}/{LAUNCHD_LABEL}"), may_fail=True),
            Run(("launchctl", "enable", f"gui/{env.uid}/{LAUNCHD_LABEL}")),
            Run(("launchctl", "bootstrap", f"gui/{env.uid}", plist)),
        ]
    directory = systemd_dir(env.home, env.xdg_config_home)
    # (The journal has its own timestamps and fields; lines read better than JSON there.)
    argv = serve_argv(command, config, socket_path, "--log-format", "console")
    service = systemd_service(argv, env.path_env, reload_argv(command, socket_path))
    units = (f"{UNIT}.socket", f"{UNIT}.service")
    return [
        Write(os.path.join(directory, units[0]), systemd_socket(socket_path).encode()),
        Write(os.path.join(directory, units[1]), service.encode()),
        Run(("systemctl", "--user", "daemon-reload")),
        Run(("systemctl", "--user", "enable", *units)),
        Run(("systemctl", "--user", "restart", *units)),
    ]


def uninstall_plan(env: Environment) -> list[Step]:
    """The steps that undo :func:`install_plan`; none if nothing is installed."""
    if env.system == "launchd":
        plist = launchd_path(env.home)
        if not os.path.lexists(plist):
            return []
        return [
            Run(("launchctl", "bootout", f"gui/{env.uid}/{LAUNCHD_LABEL}"), may_fail=True),
            Remove(plist),
        ]
    directory = systemd_dir(env.home, env.xdg_config_home)
    units = (f"{UNIT}.service", f"{UNIT}.socket")
    paths = [os.path.join(directory, unit) for unit in units]
    if not any(os.path.lexists(path) for path in paths):
        return []
    return [
        Run(("systemctl", "--user", "disable", "--now", *units)),
        *(Remove(path) for path in paths if os.path.lexists(path)),
        Run(("systemctl", "--user", "daemon-reload")),
    ]


# -- carrying them out ----------------------------------------------------------------------


def describe(step: Step) -> str:
    """One step as ``--dry-run`` shows it."""
    if isinstance(step, Write):
        text = step.content.decode(errors="replace").rstrip("\n")
        return f"write {step.path}:\n" + "\n".join(
            ("    " + line).rstrip() for line in text.split("\n")
        )
    if isinstance(step, MakeDir):
        return f"mkdir -p -m 700 {step.path}"
    if isinstance(step, Remove):
        return f"rm {step.path}"
    return "run: " + " ".join(step.argv) + (" (may fail)" if step.may_fail else "")


def carry_out(step: Step) -> None:
    """Do one step, or raise :class:`ServiceError` saying what failed."""
    try:
        if isinstance(step, Write):
            os.makedirs(os.path.dirname(step.path), exist_ok=True)
            partial = step.path + ".new"
            with open(partial, "wb") as f:
                f.write(step.content)
            os.replace(partial, step.path)
        elif isinstance(step, MakeDir):
            os.makedirs(step.path, mode=0o700, exist_ok=True)
        elif isinstance(step, Remove):
            os.unlink(step.path)
        else:
            _run(step)
    except OSError as exc:
        raise ServiceError(str(exc)) from None


def _run(step: Run) -> None:
    try:
        done = subprocess.run(step.argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ServiceError(f"{step.argv[0]} is not on PATH") from None
    except subprocess.TimeoutExpired:
        raise ServiceError(f"{' '.join(step.argv)} did not finish within 60 s") from None
    if done.returncode != 0 and not step.may_fail:
        said = (done.stderr or done.stdout).strip()
        raise ServiceError(f"{' '.join(step.argv)} failed (exit {done.returncode}): {said}")


def running_daemon(socket_path: str) -> dict[str, Any] | None:
    """The status of a daemon serving ``socket_path``, or None if none answers."""
    from cli.status import fetch_status

    try:
        return fetch_status(socket_path, timeout=2.0)
    except (OSError, ValueError):
        return None


def check_install(config: str, socket_path: str) -> None:
    """Refuse to install a service that could not start: no config, a bad one,
    or another daemon (not the service's) holding the socket."""
    from broker.config import ConfigError, load_config

    if not os.path.exists(config):
        raise ServiceError(
            f"there is no config file at {config}: write one first "
            "(docs/getting-started.md), or pass --config FILE"
        )
    try:
        load_config(config)
    except ConfigError as exc:
        raise ServiceError(str(exc)) from None
    status = running_daemon(socket_path)
    if status is not None and status.get("started_by") != "service":
        pid = status.get("pid")
        raise ServiceError(
            f"a daemon (pid {pid}, started {_starter(status)}) is serving {socket_path}; "
            f"stop it first (kill {pid}: the hosts' sessions through it end), then run this again"
        )


def _starter(status: dict[str, Any]) -> str:
    from cli.status import started_by

    return started_by(status)


# -- the command line -----------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcpbroker service",
        description="Run the daemon under the user's service manager "
        "(a systemd user unit; a launchd agent on macOS).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    install = commands.add_parser(
        "install", help="write, enable and start the service (again, to update it)"
    )
    install.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help=f"the daemon's config file (default: {default_config_path()})",
    )
    install.add_argument(
        "--socket",
        metavar="PATH",
        default=None,
        help=f"the daemon's socket (default: {default_socket_path()})",
    )
    uninstall = commands.add_parser("uninstall", help="stop, disable and remove the service")
    for command in (install, uninstall):
        command.add_argument(
            "--dry-run", action="store_true", help="show the files and commands, change nothing"
        )
    return parser


def main(argv: list[str], system: str | None = None) -> int:
    args = parser().parse_args(argv)
    env = Environment.current(system)
    try:
        if args.command == "install":
            config = os.path.abspath(args.config or default_config_path())
            socket_path = os.path.abspath(args.socket or default_socket_path())
            try:  # (a dry run says what the real one would do: refuse too)
                check_install(config, socket_path)
            except ServiceError as exc:
                if args.dry_run:
                    raise ServiceError(f"the install would be refused: {exc}") from None
                raise
            steps = install_plan(env, daemon_command(), config, socket_path)
        else:
            steps = uninstall_plan(env)
            if not steps:
                print("mcpbroker service: not installed; nothing to do")
                return 0
        for step in steps:
            print(("would " if args.dry_run else "") + describe(step), flush=True)
            if not args.dry_run:
                carry_out(step)
    except ServiceError as exc:
        print(f"mcpbroker service: {exc}", file=sys.stderr)
        return 1
    if not args.dry_run:
        print(_done(args.command, env.system))
    return 0


def _done(command: str, system: str) -> str:
    if command == "uninstall":
        return "mcpbroker service: removed; hosts' shims start a daemon of their own again"
    logs = (
        f"journalctl --user -u {UNIT}"
        if system == "systemd"
        else os.path.join(launchd_log_dir("~"), "mcpbroker.log")
    )
    return f"mcpbroker service: installed; `mcpbroker status` shows the daemon, its log: {logs}"
