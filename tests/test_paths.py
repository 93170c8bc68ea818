"""The daemon's place is the user's alone (#10.2): derived from the uid, checked,
never followed through a symlink, and every connection's peer uid is checked.

Tests that play another user need root (to chown, or to run a process under
another uid); they are skipped, saying so, elsewhere.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from actors.downstream.unix import StartError, hold_socket_lock
from actors.paths import UnsafePath, ensure_private_dir, prepare_socket_dir, runtime_dir
from tests.conftest import MCPBROKER, REPO, demo_server, running_daemon

ROOT = os.getuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="playing another user needs root")
OTHER_UID = 12345
# A Python the other user can run (the venv's may sit under a home only root can enter).
SYSTEM_PYTHON = next(
    (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)),
    sys.executable,
)
TRIMMED_ENV = {  # what the official SDKs give a stdio server
    key: os.environ[key]
    for key in ("HOME", "PATH", "USER", "SHELL", "TERM", "LOGNAME")
    if key in os.environ
}


@pytest.fixture
def scratch() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="mcpb-"))
    yield directory
    subprocess.run(["rm", "-rf", str(directory)], check=False)


def socket_path_in(env: dict[str, str]) -> str:
    code = "from actors.paths import default_socket_path; print(default_socket_path())"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_a_host_with_the_trimmed_environment_finds_the_same_daemon(scratch: Path) -> None:
    full = {**os.environ, "XDG_RUNTIME_DIR": str(scratch), "TMPDIR": str(scratch)}
    full.pop("MCPBROKER_SOCKET", None)
    assert socket_path_in(TRIMMED_ENV) == socket_path_in(full)
    assert not socket_path_in(TRIMMED_ENV).startswith(("/tmp", str(scratch)))


def test_run_user_is_used_when_it_is_the_users_own(scratch: Path) -> None:
    uid = os.getuid()
    (scratch / str(uid)).mkdir(mode=0o700)
    assert runtime_dir(uid, str(scratch)) == str(scratch / str(uid) / "mcpbroker")


@needs_root
def test_run_user_of_another_owner_or_a_symlink_is_not_used(scratch: Path) -> None:
    uid = os.getuid()
    elsewhere = scratch / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (scratch / str(uid)).symlink_to(elsewhere)
    assert not runtime_dir(uid, str(scratch)).startswith(str(scratch))
    (scratch / str(uid)).unlink()
    (scratch / str(uid)).mkdir(mode=0o700)
    os.chown(scratch / str(uid), OTHER_UID, OTHER_UID)
    assert not runtime_dir(uid, str(scratch)).startswith(str(scratch))


@needs_root
def test_a_directory_another_user_made_first_is_refused(scratch: Path) -> None:
    planted = scratch / "mcpbroker"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePath, match="belongs to uid 12345"):
        ensure_private_dir(str(planted))


def test_a_directory_open_to_others_or_a_symlink_is_refused(scratch: Path) -> None:
    open_dir = scratch / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(UnsafePath, match="open to other users"):
        ensure_private_dir(str(open_dir))
    (scratch / "link").symlink_to(scratch / "private")
    (scratch / "private").mkdir(mode=0o700)
    with pytest.raises(UnsafePath, match="not a directory"):
        ensure_private_dir(str(scratch / "link"))


def test_a_socket_in_a_directory_others_can_change_is_refused(scratch: Path) -> None:
    shared = scratch / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # writable by all, and not sticky
    with pytest.raises(UnsafePath, match="can be changed by other users"):
        prepare_socket_dir(str(shared / "s.sock"))


def test_a_planted_lock_symlink_is_not_followed(scratch: Path) -> None:
    target = scratch / "victim"
    target.write_text("precious")
    (scratch / "s.sock.lock").symlink_to(target)
    with pytest.raises(StartError, match="lock file"), hold_socket_lock(str(scratch / "s.sock")):
        pass
    assert target.read_text() == "precious"


def test_a_planted_log_symlink_is_not_followed_by_the_shim(scratch: Path) -> None:
    os.chmod(scratch, 0o700)
    target = scratch / "victim"
    target.write_text("precious")
    (scratch / "s.sock.log").symlink_to(target)
    config = scratch / "config.json"
    config.write_text('{"mcpServers": {}}')
    shim = subprocess.run(
        [MCPBROKER, "connect", "--socket", str(scratch / "s.sock"), "--config", str(config)],
        env={**TRIMMED_ENV, "PYTHONPATH": str(REPO)},
        input=b"",
        capture_output=True,
        timeout=30,
    )
    assert shim.returncode == 1 and b"s.sock.log" in shim.stderr
    assert target.read_text() == "precious"


def test_a_regular_file_at_the_socket_path_is_never_deleted(scratch: Path) -> None:
    path = scratch / "not-a-socket"
    path.write_text("keep me")
    serve = subprocess.run(
        [MCPBROKER, "serve", "--demo", "--socket", str(path)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert serve.returncode == 1
    assert serve.stderr.strip().splitlines()[-1] == (
        f"mcpbroker: {path} exists and is not a socket; refusing to replace it"
    )
    assert path.read_text() == "keep me"


PEER = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(10)
try:
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\\n')
    print(repr(s.recv(1000)))
except OSError:
    print(repr(b""))  # closed before it could even ask
"""


@needs_root
async def test_another_users_connection_is_refused(socket_path: str) -> None:
    os.chmod(os.path.dirname(socket_path), 0o755)  # let the other user reach the socket
    os.chmod(socket_path.rsplit("/", 1)[0], 0o755)
    async with running_daemon({"demo": demo_server()}, socket_path):
        os.chmod(socket_path, 0o666)  # (past the file mode: only the uid check stands)
        foreign = await trio.run_process(
            [SYSTEM_PYTHON, "-c", PEER, socket_path],
            user=OTHER_UID,
            capture_stdout=True,
            check=False,
        )
        assert foreign.stdout.strip() == b"b''"  # closed, and not a byte of MCP
        own = await trio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, "-c", PEER, socket_path], capture_output=True, check=True
            )
        )
        assert b'"result":{}' in own.stdout


LISTENER = """
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(4)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(30)
"""


@needs_root
def test_the_shim_refuses_a_daemon_of_another_user(scratch: Path) -> None:
    os.chmod(scratch, 0o777)
    path = str(scratch / "s.sock")
    impostor = subprocess.Popen([SYSTEM_PYTHON, "-c", LISTENER, path], user=OTHER_UID)
    try:
        deadline = 100
        while not os.path.exists(path + ".ready") and deadline:
            deadline -= 1
            trio.run(trio.sleep, 0.05)
        shim = subprocess.run(
            [MCPBROKER, "connect", "--socket", path],
            env={**TRIMMED_ENV, "PYTHONPATH": str(REPO)},
            input=b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n',
            capture_output=True,
            timeout=30,
        )
    finally:
        impostor.kill()
    assert shim.returncode == 1 and b"runs as uid 12345" in shim.stderr
    assert shim.stdout == b""


def test_the_peer_uid_is_read(scratch: Path) -> None:
    from actors.paths import peer_uid

    ours, theirs = socket.socketpair(socket.AF_UNIX)
    with ours, theirs:
        assert peer_uid(ours.fileno()) in (os.getuid(), None)


async def test_running_out_of_descriptors_neither_floods_the_log_nor_kills_the_daemon(
    scratch: Path,
) -> None:
    import resource

    from tests.test_daemon_process import accepts_connections, write_config

    config = write_config(str(scratch), {"demo": demo_server()})
    path, log = str(scratch / "s.sock"), scratch / "daemon.log"

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))

    with log.open("wb") as log_file, trio.fail_after(60):
        daemon = await trio.lowlevel.open_process(
            [MCPBROKER, "serve", "--config", config, "--socket", path, "--log-format", "json"],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stderr=log_file,
            preexec_fn=few_descriptors,
        )
        try:
            while not await accepts_connections(path):
                await trio.sleep(0.05)
            clients = []
            for _ in range(60):  # more than the daemon may hold open
                clients.append(await trio.open_unix_socket(path))
            await trio.sleep(3)  # accept keeps failing meanwhile
            assert daemon.poll() is None
            for client in clients:
                await client.aclose()
            await trio.sleep(0.5)
            stream = await trio.open_unix_socket(path)  # and it serves again
            await stream.send_all(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
            assert b'"result":{}' in await stream.receive_some()
            await stream.aclose()
        finally:
            daemon.terminate()
            await daemon.wait()
    lines = log.read_text().splitlines()
    failures = [line for line in lines if "accept_failed" in line or "EMFILE" in line]
    assert 1 <= len(failures) <= 2, failures
    assert not any("Traceback" in line for line in lines)
