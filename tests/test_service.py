"""``mcpbroker service`` (#15.5): the unit files it writes, install and
uninstall against a fake ``systemctl`` (there is no systemd here), and a real
daemon started the way the unit starts it, socket handed over, saying so in
``mcpbroker status``."""

from __future__ import annotations

import json
import os
import plistlib
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.downstream.unix import StartError, take_inherited_listener
from actors.sdnotify import Notifier
from cli import service
from cli.service import (
    Environment,
    ServiceError,
    Write,
    daemon_command,
    install_plan,
    launchd_plist,
    reload_argv,
    serve_argv,
    systemd_service,
    systemd_socket,
)
from cli.status import fetch_status
from tests.conftest import MCPBROKER, REPO

CONFIG = "/home/me/.config/mcpbroker/config.json"
SOCKET = "/run/user/1000/mcpbroker/mcpbroker.sock"
ARGV = ["/home/me/.venv/bin/mcpbroker", "serve", "--config", CONFIG, "--socket", SOCKET]
RELOAD = ["/home/me/.venv/bin/mcpbroker", "reload", "--socket", SOCKET]
BASE_ENV = {
    key: value
    for key, value in os.environ.items()
    if key not in ("XDG_CONFIG_HOME", "MCPBROKER_CONFIG", "MCPBROKER_STARTED_BY")
}


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def unit_command_and_env(unit: str) -> tuple[list[str], dict[str, str]]:
    """ExecStart= and Environment= of a service unit, read as systemd reads them
    (for the words written here: shell-like double quotes, %% and $$ doubled)."""
    command: list[str] = []
    env: dict[str, str] = {}
    for line in unit.splitlines():
        key, _, value = line.partition("=")
        if key == "ExecStart":
            command = [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(value)]
        elif key == "Environment":
            name, _, setting = shlex.split(value)[0].replace("%%", "%").partition("=")
            env[name] = setting
    return command, env


# -- the files ------------------------------------------------------------------------------


def test_the_service_unit_runs_serve_with_the_config_and_restarts_on_failure() -> None:
    unit = systemd_service(ARGV, "/usr/local/bin:/usr/bin:/bin", RELOAD)
    assert lines_of(unit) == [
        "[Unit]",
        "Description=mcpbroker: MCP servers shared by every MCP host",
        "Requires=mcpbroker.socket",
        "After=mcpbroker.socket",
        "[Service]",
        "Type=notify",
        f"ExecStart=/home/me/.venv/bin/mcpbroker serve --config {CONFIG} --socket {SOCKET}",
        f"ExecReload=/home/me/.venv/bin/mcpbroker reload --socket {SOCKET}",
        "Environment=MCPBROKER_STARTED_BY=service",
        "Environment=PATH=/usr/local/bin:/usr/bin:/bin",
        "Restart=on-failure",
        "RestartSec=2",
        "RestartPreventExitStatus=2",
        "KillMode=mixed",
        "TimeoutStopSec=30",
        "[Install]",
        "WantedBy=default.target",
        "Also=mcpbroker.socket",
    ]


def test_the_socket_unit_holds_the_daemons_socket_for_the_user_alone() -> None:
    assert lines_of(systemd_socket(SOCKET)) == [
        "[Unit]",
        "Description=mcpbroker's socket: hosts reach the daemon here, even while it starts",
        "[Socket]",
        f"ListenStream={SOCKET}",
        "SocketMode=0600",
        "DirectoryMode=0700",
        "Backlog=512",
        "RemoveOnStop=yes",
        "[Install]",
        "WantedBy=sockets.target",
    ]
    assert "ListenStream=/tmp/100%%/s.sock" in systemd_socket("/tmp/100%/s.sock")


def test_odd_paths_are_quoted_so_systemd_reads_them_back_as_written() -> None:
    argv = ["/opt/my tools/mcpbroker", "serve", "--config", '/a "b"/100%$HOME\\x.json']
    unit = systemd_service(argv, "/odd dir/bin:/100%", RELOAD)
    command, env = unit_command_and_env(unit)
    assert command == argv
    assert env == {"MCPBROKER_STARTED_BY": "service", "PATH": "/odd dir/bin:/100%"}
    with pytest.raises(ServiceError, match="line break"):
        systemd_service(["/a\nb", "serve"], "/bin", RELOAD)


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_systemd_finds_nothing_wrong_with_the_units(tmp_path: Path) -> None:
    sock = str(tmp_path / "s.sock")
    argv = serve_argv(daemon_command(), str(tmp_path / "config.json"), sock)
    reload = reload_argv(daemon_command(), sock)
    (tmp_path / "mcpbroker.service").write_text(systemd_service(argv, os.defpath, reload))
    (tmp_path / "mcpbroker.socket").write_text(systemd_socket(str(tmp_path / "s.sock")))
    done = subprocess.run(
        ["systemd-analyze", "verify", *(str(p) for p in sorted(tmp_path.glob("mcpbroker.*")))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    complaints = [line for line in done.stderr.splitlines() if "mcpbroker" in line]
    assert done.returncode == 0 and not complaints, done.stderr


def test_the_launchd_agent_runs_serve_at_login_and_again_after_a_failure() -> None:
    log_dir = "/Users/me/Library/Logs/mcpbroker"
    assert plistlib.loads(launchd_plist(ARGV, "/opt/homebrew/bin:/usr/bin", log_dir)) == {
        "Label": "org.mcpbroker.daemon",
        "ProgramArguments": ARGV,
        "EnvironmentVariables": {
            "MCPBROKER_STARTED_BY": "service",
            "PATH": "/opt/homebrew/bin:/usr/bin",
        },
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 10,
        "ExitTimeOut": 30,
        "StandardErrorPath": f"{log_dir}/stderr.log",
    }


def test_the_plans_put_the_files_where_the_service_managers_look() -> None:
    linux = Environment("systemd", "/home/me", None, 1000, "/usr/bin")
    written = [step.path for step in install_plan(linux, ["mcpbroker"], CONFIG, SOCKET)[:2]]
    assert written == [
        "/home/me/.config/systemd/user/mcpbroker.socket",
        "/home/me/.config/systemd/user/mcpbroker.service",
    ]
    mac = Environment("launchd", "/Users/me", None, 501, "/usr/bin")
    steps = install_plan(mac, ["mcpbroker"], CONFIG, SOCKET)
    plist = "/Users/me/Library/LaunchAgents/org.mcpbroker.daemon.plist"
    assert [getattr(step, "argv", None) for step in steps[2:]] == [
        ("launchctl", "bootout", "gui/501/org.mcpbroker.daemon"),
        ("launchctl", "enable", "gui/501/org.mcpbroker.daemon"),
        ("launchctl", "bootstrap", "gui/501", plist),
    ]
    assert isinstance(steps[1], Write)
    agent = plistlib.loads(steps[1].content)
    assert agent["ProgramArguments"][-2:] == [
        "--log-file",
        f"{service.launchd_log_dir('/Users/me')}/mcpbroker.log",
    ]


# -- install and uninstall ------------------------------------------------------------------


class Home:
    """A temporary HOME with fake ``systemctl`` and ``launchctl`` on PATH that
    record their arguments (and fail, saying so, if told to)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        self.bin = root / "bin"
        self.bin.mkdir()
        self.calls = root / "calls"
        self.config = self.home / ".config" / "mcpbroker" / "config.json"
        self.units = self.home / ".config" / "systemd" / "user"
        os.chmod(root, 0o700)
        self.socket = str(root / "s.sock")
        for tool in ("systemctl", "launchctl"):
            script = self.bin / tool
            script.write_text(
                "#!/bin/sh\n"
                f'echo "$(basename "$0") $*" >> {self.calls}\n'
                f'if [ -e {root}/fail ]; then echo "Failed to connect to bus" >&2; exit 1; fi\n'
            )
            script.chmod(0o755)
        self.env = {
            **BASE_ENV,
            "HOME": str(self.home),
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(REPO),
            "MCPBROKER_SOCKET": self.socket,
        }

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [MCPBROKER, "service", *args], env=self.env, capture_output=True, text=True, timeout=60
        )

    def take_calls(self) -> list[str]:
        if not self.calls.exists():
            return []
        calls = self.calls.read_text().splitlines()
        self.calls.unlink()
        return calls

    def write_config(self, servers: dict[str, Any] | None = None) -> None:
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(json.dumps({"mcpServers": servers or {}}))


@pytest.fixture
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    # (Short: the socket path must fit AF_UNIX.)
    root = Path(tmp_path_factory.mktemp("svc", numbered=True))
    yield Home(root)


def test_install_writes_and_enables_the_units_and_uninstall_removes_them(home: Home) -> None:
    home.write_config()
    done = home.run("install")
    assert done.returncode == 0, done.stderr
    service_unit = (home.units / "mcpbroker.service").read_text()
    command, env = unit_command_and_env(service_unit)
    assert command == [
        *daemon_command(),
        *("serve", "--config", str(home.config), "--socket", home.socket),
        *("--log-format", "console"),
    ]
    assert env["MCPBROKER_STARTED_BY"] == "service" and env["PATH"] == home.env["PATH"]
    assert f"ListenStream={home.socket}" in (home.units / "mcpbroker.socket").read_text()
    assert home.take_calls() == [
        "systemctl --user daemon-reload",
        "systemctl --user enable mcpbroker.socket mcpbroker.service",
        "systemctl --user restart mcpbroker.socket mcpbroker.service",
    ]
    assert "journalctl --user -u mcpbroker" in done.stdout

    done = home.run("uninstall")
    assert done.returncode == 0, done.stderr
    assert not list(home.units.iterdir())
    assert home.take_calls() == [
        "systemctl --user disable --now mcpbroker.service mcpbroker.socket",
        "systemctl --user daemon-reload",
    ]
    done = home.run("uninstall")
    assert done.returncode == 0 and "not installed" in done.stdout
    assert home.take_calls() == []


def test_dry_run_shows_the_files_and_commands_and_changes_nothing(home: Home) -> None:
    home.write_config()
    done = home.run("install", "--dry-run", "--config", str(home.config))
    assert done.returncode == 0, done.stderr
    assert f"would write {home.units}/mcpbroker.service:" in done.stdout
    assert "    ExecStart=" in done.stdout and f"--config {home.config}" in done.stdout
    assert "would run: systemctl --user enable mcpbroker.socket mcpbroker.service" in done.stdout
    assert not home.units.exists() and home.take_calls() == []


def test_install_refuses_without_a_config_or_with_a_bad_one(home: Home) -> None:
    done = home.run("install")
    assert done.returncode == 1 and f"no config file at {home.config}" in done.stderr
    home.config.parent.mkdir(parents=True)
    home.config.write_text('{"mcpServers": {"x": {"command": 5}}}')
    done = home.run("install")
    assert done.returncode == 1 and "mcpServers.x.command" in done.stderr
    assert not home.units.exists() and home.take_calls() == []


def test_a_dry_run_says_the_install_would_be_refused(home: Home) -> None:
    # (it showed the units and commands and exited 0; the real run refused)
    done = home.run("install", "--dry-run", "--config", "/nonexistent/config.json")
    assert done.returncode == 1 and done.stdout == ""
    assert "the install would be refused: there is no config file" in done.stderr
    assert not home.units.exists() and home.take_calls() == []


def test_a_failing_systemctl_is_reported(home: Home) -> None:
    home.write_config()
    (home.root / "fail").touch()
    done = home.run("install")
    assert done.returncode == 1
    assert "systemctl --user daemon-reload failed (exit 1): Failed to connect to bus" in done.stderr
    assert home.take_calls() == ["systemctl --user daemon-reload"]  # (and no further)


def test_install_and_uninstall_a_launchd_agent(
    home: Home, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in home.env.items():
        monkeypatch.setenv(key, value)
    home.write_config()
    assert service.main(["install"], system="launchd") == 0, capsys.readouterr().err
    plist = home.home / "Library" / "LaunchAgents" / "org.mcpbroker.daemon.plist"
    agent = plistlib.loads(plist.read_bytes())
    log = home.home / "Library" / "Logs" / "mcpbroker"
    assert agent["ProgramArguments"] == [
        *daemon_command(),
        *("serve", "--config", str(home.config), "--socket", home.socket),
        *("--log-file", f"{log}/mcpbroker.log"),
    ]
    assert log.is_dir() and (log.stat().st_mode & 0o777) == 0o700
    uid = os.getuid()
    assert home.take_calls() == [
        f"launchctl bootout gui/{uid}/org.mcpbroker.daemon",
        f"launchctl enable gui/{uid}/org.mcpbroker.daemon",
        f"launchctl bootstrap gui/{uid} {plist}",
    ]
    assert service.main(["uninstall"], system="launchd") == 0
    assert not plist.exists()
    assert home.take_calls() == [f"launchctl bootout gui/{uid}/org.mcpbroker.daemon"]


# -- the daemon, started as the unit starts it ----------------------------------------------


def test_the_daemon_takes_only_a_listening_unix_socket_meant_for_it(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    mine = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "x"}
    with listening_socket(str(tmp_path / "s.sock")) as sock:
        environ = {**mine, "LISTEN_PID": "1", "OTHER": "kept"}
        assert take_inherited_listener(environ, os.dup(sock.fileno())) is None
        assert environ == {"OTHER": "kept"}  # (the servers it starts never see them)
        environ = dict(mine)
        taken = take_inherited_listener(environ, os.dup(sock.fileno()))
        assert taken is not None and environ == {}
        with taken:
            assert taken.getsockname() == str(tmp_path / "s.sock")
            assert not taken.get_inheritable()
        with pytest.raises(StartError, match="one socket"):
            take_inherited_listener({**mine, "LISTEN_FDS": "2"}, sock.fileno())
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):  # (the stream one: not listening)
        with (
            socket.socket(socket.AF_UNIX, kind) as other,
            pytest.raises(StartError, match="not a listening unix stream socket"),
        ):
            take_inherited_listener(dict(mine), os.dup(other.fileno()))


# What systemd does with a socket unit: bind and listen, then start the service
# with the socket as descriptor 3 and LISTEN_PID, LISTEN_FDS set (sd_listen_fds).
ACTIVATE = """
import os, sys
fd = int(sys.argv[1])
os.dup2(fd, 3)
if fd != 3:
    os.close(fd)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execv(sys.argv[2], sys.argv[2:])
"""


def listening_socket(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(16)
    return sock


async def wait_for_status(socket_path: str) -> dict[str, Any]:
    """The status of the daemon that is starting on ``socket_path``, once it answers."""
    while True:
        try:
            return await trio.to_thread.run_sync(fetch_status, socket_path)
        except OSError:
            await trio.sleep(0.02)


async def status_text(socket_path: str) -> str:
    done = await trio.run_process(
        [MCPBROKER, "status", "--socket", socket_path], capture_stdout=True, env=BASE_ENV
    )
    return done.stdout.decode()


async def test_a_daemon_started_as_the_unit_starts_it_says_so_in_status(home: Home) -> None:
    home.write_config()
    linux = Environment("systemd", str(home.home), None, os.getuid(), os.environ["PATH"])
    written = install_plan(linux, daemon_command(), str(home.config), home.socket)[1]
    assert isinstance(written, Write) and written.path.endswith("mcpbroker.service")
    unit = written.content.decode()
    command, unit_env = unit_command_and_env(unit)
    held = listening_socket(home.socket)  # (as systemd holds it, across restarts too)
    with held, trio.fail_after(30):
        # A host that connects before the daemon runs waits, and is served once it does.
        early = await trio.open_unix_socket(home.socket)
        await early.send_all(b'{"mcpbroker":{"command":"status"}}\n')
        daemon = await trio.lowlevel.open_process(
            [sys.executable, "-c", ACTIVATE, str(held.fileno()), *command],
            env={**BASE_ENV, **unit_env, "PYTHONPATH": str(REPO), "HOME": str(home.home)},
            pass_fds=(held.fileno(),),
            stderr=subprocess.DEVNULL,
        )
        try:
            answer = b""
            while not answer.endswith(b"\n"):
                answer += await early.receive_some()
            status = json.loads(answer)
            assert status["started_by"] == "service" and status["socket_activated"] is True
            assert status["socket"] == home.socket and status["pid"] == daemon.pid
            assert "started by the service manager (socket-activated)" in await status_text(
                home.socket
            )
        finally:
            await early.aclose()
            daemon.send_signal(signal.SIGTERM)
            assert await daemon.wait() == 0
        assert os.path.exists(home.socket)  # (systemd's to remove, not the daemon's)


async def test_status_tells_a_daemon_started_by_the_shim_from_one_started_by_hand(
    home: Home,
) -> None:
    home.write_config()
    env = {**BASE_ENV, "PYTHONPATH": str(REPO)}
    with trio.fail_after(30):
        shim = await trio.run_process(
            [MCPBROKER, "connect", "--socket", home.socket, "--config", str(home.config)],
            stdin=b'{"mcpbroker":{"command":"status"}}\n',
            capture_stdout=True,
            env=env,
        )
        status = json.loads(shim.stdout)
        assert status["started_by"] == "shim" and status["socket_activated"] is False
        assert "started by mcpbroker connect" in await status_text(home.socket)
        os.kill(status["pid"], signal.SIGTERM)
        while os.path.exists(home.socket):
            await trio.sleep(0.02)

        by_hand = await trio.lowlevel.open_process(
            [MCPBROKER, "serve", "--config", str(home.config), "--socket", home.socket],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert (await wait_for_status(home.socket))["pid"] == by_hand.pid
            text = await status_text(home.socket)
            assert "started by hand" in text
            # ... and installing the service now would fight it for the socket: refused.
            done = await trio.to_thread.run_sync(home.run, "install")
            assert done.returncode == 1, done.stdout
            assert f"pid {by_hand.pid}, started by hand" in done.stderr
            assert f"kill {by_hand.pid}" in done.stderr
            assert home.take_calls() == []
        finally:
            by_hand.send_signal(signal.SIGTERM)
            assert await by_hand.wait() == 0


# -- readiness (sd_notify) ------------------------------------------------------------------


def notified(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


def test_a_notifier_speaks_to_a_path_or_an_abstract_name_and_never_raises(tmp_path: Path) -> None:
    environ = {"NOTIFY_SOCKET": f"@mcpbroker-test-{os.getpid()}", "OTHER": "1"}
    notifier = Notifier.take_from(environ)
    assert environ == {"OTHER": "1"}  # (the servers it starts must not inherit it)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(f"\0mcpbroker-test-{os.getpid()}")
        notifier.ready("serving")
        assert notified(manager.recv(4096)) == {"READY": "1", "STATUS": "serving"}
    nobody = Notifier(str(tmp_path / "nobody-listens"))
    nobody.stopping()  # (logged once, not raised)
    assert Notifier.take_from({}).address is None
    assert Notifier("relative/path").address is None  # (not an address systemd gives)


async def test_a_daemon_run_by_the_unit_tells_systemd_it_is_ready_reloading_and_stopping(
    home: Home,
) -> None:
    """``Type=notify``: READY=1 once the socket serves (a status is answered
    then), RELOADING=1 with MONOTONIC_USEC and READY=1 again around the unit's
    ``ExecReload``, STOPPING=1 on SIGTERM; the servers it starts do not see
    ``NOTIFY_SOCKET``."""
    seen = home.root / "server-saw"
    script = 'printf %s "${NOTIFY_SOCKET-unset}" > "$0"; exec "$1" -m tools.demo_server'
    home.write_config(
        {
            "demo": {
                "command": "sh",
                "args": ["-c", script, str(seen), sys.executable],
                "cwd": str(REPO),
            }
        }
    )
    linux = Environment("systemd", str(home.home), None, os.getuid(), os.environ["PATH"])
    unit = install_plan(linux, daemon_command(), str(home.config), home.socket)[1]
    assert isinstance(unit, Write)
    command, unit_env = unit_command_and_env(unit.content.decode())
    (reload_line,) = [line for line in unit.content.decode().splitlines() if "ExecReload=" in line]
    reload = shlex.split(reload_line.partition("=")[2])
    path = str(home.root / "notify")
    with trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager, trio.fail_after(30):
        await manager.bind(path)
        env = {**BASE_ENV, **unit_env, "PYTHONPATH": str(REPO), "HOME": str(home.home)}
        daemon = await trio.lowlevel.open_process(
            command, env={**env, "NOTIFY_SOCKET": path}, stderr=subprocess.DEVNULL
        )
        try:
            ready = notified(await manager.recv(4096))
            assert ready == {"READY": "1", "STATUS": f"serving 1 MCP server on {home.socket}"}
            assert (await trio.to_thread.run_sync(fetch_status, home.socket))["pid"] == daemon.pid
            done = await trio.run_process(reload, env=env, capture_stdout=True)
            assert done.returncode == 0
            reloading = notified(await manager.recv(4096))
            assert reloading["RELOADING"] == "1"
            now = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            assert 0 <= now - int(reloading["MONOTONIC_USEC"]) < 30_000_000
            assert notified(await manager.recv(4096))["READY"] == "1"
            while not seen.exists() or not seen.read_text():
                await trio.sleep(0.05)
            assert seen.read_text() == "unset"
        finally:
            daemon.send_signal(signal.SIGTERM)
        assert notified(await manager.recv(4096)) == {"STOPPING": "1", "STATUS": "stopping"}
        assert await daemon.wait() == 0
