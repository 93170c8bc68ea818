"""The daemon and the shim as the user runs them: real processes, real signals."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from tests.conftest import MCPBROKER, REPO, demo_server, shim_client, text_of

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
INITIALIZE = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
    b'"capabilities":{},"clientInfo":{"name":"test","version":"1"}}}\n'
)


def write_config(directory: str, servers: dict[str, Any]) -> str:
    path = os.path.join(directory, "config.json")
    Path(path).write_text(json.dumps({"mcpServers": servers}))
    return path


async def start_daemon(config: str, socket_path: str) -> trio.Process:
    process = await trio.lowlevel.open_process(
        [MCPBROKER, "serve", "--config", config, "--socket", socket_path, "--log-format", "json"],
        env=ENV,
        stderr=subprocess.PIPE,
    )
    while not await accepts_connections(socket_path):
        assert process.poll() is None, "the daemon exited while starting"
        await trio.sleep(0.02)
    return process


async def accepts_connections(socket_path: str) -> bool:
    try:
        stream = await trio.open_unix_socket(socket_path)
    except OSError:
        return False
    await stream.aclose()
    return True


def children_of(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


async def test_sigterm_stops_everything_and_removes_the_socket(socket_path: str) -> None:
    config = write_config(os.path.dirname(socket_path), {"demo": demo_server()})
    with trio.fail_after(30):
        daemon = await start_daemon(config, socket_path)
        async with shim_client(socket_path, "demo") as client:
            server_pid = int(text_of(await client.call_tool("pid", {})))
        assert server_pid in [child.pid for child in children_of(daemon.pid)]
        daemon.send_signal(signal.SIGTERM)
        assert await daemon.wait() == 0
    assert not os.path.exists(socket_path)
    assert not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == "zombie"


async def test_a_second_daemon_on_a_live_socket_exits_with_a_clear_message(
    socket_path: str,
) -> None:
    config = write_config(os.path.dirname(socket_path), {"demo": demo_server()})
    with trio.fail_after(30):
        first = await start_daemon(config, socket_path)
        try:
            second = await trio.run_process(
                [MCPBROKER, "serve", "--config", config, "--socket", socket_path],
                env=ENV,
                capture_stderr=True,
                check=False,
            )
            assert second.returncode == 1
            assert b"already" in second.stderr and socket_path.encode() in second.stderr
            async with shim_client(socket_path, "demo") as client:  # the first one is unharmed
                assert text_of(await client.call_tool("echo", {"text": "hi"})) == "hi"
        finally:
            first.send_signal(signal.SIGINT)
            assert await first.wait() == 0


async def test_a_stale_socket_file_is_replaced(socket_path: str) -> None:
    os.makedirs(os.path.dirname(socket_path), exist_ok=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(socket_path)  # a socket file nobody listens on: a dead daemon's leftover
    stale.close()
    config = write_config(os.path.dirname(socket_path), {"demo": demo_server()})
    with trio.fail_after(30):
        daemon = await start_daemon(config, socket_path)
        try:
            assert os.stat(socket_path).st_mode & 0o777 == 0o600
            async with shim_client(socket_path, "demo") as client:
                assert text_of(await client.call_tool("add", {"a": 2, "b": 3})) == "5"
        finally:
            daemon.send_signal(signal.SIGTERM)
            await daemon.wait()


async def test_connect_starts_the_daemon_when_none_is_running(socket_path: str) -> None:
    config = write_config(os.path.dirname(socket_path), {"demo": demo_server()})
    with trio.fail_after(30):
        async with shim_client(socket_path, "demo", config=config) as client:
            assert text_of(await client.call_tool("echo", {"text": "auto"})) == "auto"
        async with shim_client(socket_path, "demo") as again:  # the same daemon, still running
            assert text_of(await again.call_tool("echo", {"text": "again"})) == "again"
    daemon_pid = int(Path(socket_path + ".lock").read_text())
    os.kill(daemon_pid, signal.SIGTERM)
    with trio.fail_after(10):
        while psutil.pid_exists(daemon_pid) and psutil.Process(daemon_pid).status() != "zombie":
            await trio.sleep(0.05)


async def test_a_daemon_the_shim_starts_in_a_project_imports_none_of_its_modules(
    socket_path: str,
) -> None:
    # Hosts start the shim in the project's folder; a project's cli/, tools/ or
    # logging.py replaced mcpbroker's (or the standard library's) in the daemon
    # and the demo server it runs there.
    directory = os.path.dirname(socket_path)
    project = Path(directory, "project")
    marker = Path(directory, "ran")
    for package in ("cli", "tools"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text("")
        for module in ("main", "demo_server"):
            (project / package / f"{module}.py").write_text(f"open({str(marker)!r}, 'a')\n")
    (project / "logging.py").write_text("raise SystemExit('the project logging.py')\n")
    from tools.demo import demo_config

    config = Path(directory, "demo.json")
    config.write_text(json.dumps(demo_config()))  # (no cwd: the daemon's, the project)
    call = b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo",'
    call += b'"arguments":{"text":"hi"}}}\n'
    with trio.fail_after(30):
        result = await trio.run_process(
            [
                MCPBROKER,
                "connect",
                "--no-resume",
                "--socket",
                socket_path,
                "--config",
                str(config),
                "demo",
            ],
            cwd=project,
            env=ENV,
            stdin=INITIALIZE + b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n' + call,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    try:
        assert not marker.exists(), "the project's module ran"
        answers = [json.loads(line) for line in result.stdout.splitlines()]
        assert [answer.get("id") for answer in answers if "result" in answer] == [1, 2], (
            result.stderr
        )
        assert answers[1]["result"]["content"][0]["text"] == "hi"
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(Path(socket_path + ".lock").read_text()), signal.SIGTERM)


async def test_a_shim_that_finds_a_daemon_still_stopping_waits_for_it_then_starts_one(
    socket_path: str,
) -> None:
    """A daemon stopping its servers after SIGTERM has removed its socket but
    still holds the lock (here a stand-in, for 3 s): the daemon the shim
    started exited 'already serving', and the shim gave up 2 s later."""
    config = write_config(os.path.dirname(socket_path), {"demo": demo_server()})
    hold = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.ftruncate(fd, 0); os.write(fd, b'%d\\n' % os.getpid())\n"
        "print('held', flush=True); time.sleep(3)\n"
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            stopping = await nursery.start(
                functools.partial(
                    trio.run_process,
                    [sys.executable, "-c", hold, socket_path + ".lock"],
                    stdout=subprocess.PIPE,
                )
            )
            assert stopping.stdout is not None
            assert (await stopping.stdout.receive_some()).startswith(b"held")
            result = await trio.run_process(
                [MCPBROKER, "connect", "--no-resume", "--socket", socket_path, "--config", config],
                env=ENV,
                stdin=INITIALIZE,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    try:
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["result"]["serverInfo"]
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(Path(socket_path + ".lock").read_text()), signal.SIGTERM)


async def test_a_daemon_that_died_is_replaced_with_its_listeners(socket_path: str) -> None:
    """A daemon run by hand with --http (as docs/hosts.md shows) that dies:
    the daemon a shim starts in its place served no HTTP, and every host
    using the broker by URL stayed cut off. Its status says so. A clean stop
    leaves no record."""
    config = write_config(os.path.dirname(socket_path), {"demo": demo_server()})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    http = ["--http", f"127.0.0.1:{port}"]
    with trio.fail_after(30):
        by_hand = await trio.lowlevel.open_process(
            [MCPBROKER, "serve", "--config", config, "--socket", socket_path, *http],
            env=ENV,
            stderr=subprocess.DEVNULL,
        )
        # (it records its listeners once it listens, in a file it creates, then
        # writes: killed before, it has none)
        record = Path(socket_path + ".listeners")
        while not await accepts_connections(socket_path) or not (
            record.exists() and record.stat().st_size
        ):
            await trio.sleep(0.02)
        by_hand.kill()  # (a crash, the OOM killer)
        await by_hand.wait()
        result = await trio.run_process(
            [MCPBROKER, "connect", "--no-resume", "--socket", socket_path, "--config", config],
            env=ENV,
            stdin=INITIALIZE,
            capture_stdout=True,
            capture_stderr=True,
        )
        assert json.loads(result.stdout)["result"]["serverInfo"]
        assert f"--http 127.0.0.1:{port}".encode() in result.stderr
        replacement = int(Path(socket_path + ".lock").read_text())
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.aclose()
            assert Path(socket_path + ".listeners").read_text().split() == http
            # ... and its status says whose they were (it said nothing of it).
            status = await trio.run_process(
                [MCPBROKER, "status", "--socket", socket_path], env=ENV, capture_stdout=True
            )
            said = status.stdout.decode()
            assert "listeners carried over from the daemon that stopped by " in said
            assert f"(pid {by_hand.pid}): it did not stop cleanly" in said
        finally:
            os.kill(replacement, signal.SIGTERM)
        while psutil.pid_exists(replacement) and psutil.Process(replacement).status() != "zombie":
            await trio.sleep(0.05)
    assert not os.path.exists(socket_path + ".listeners")


async def test_connect_without_daemon_or_config_says_what_to_do(socket_path: str) -> None:
    missing = os.path.join(os.path.dirname(socket_path), "nope.json")
    result = await trio.run_process(
        [MCPBROKER, "connect", "--socket", socket_path, "--config", missing],
        env=ENV,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        stdin=b"",
    )
    assert result.returncode == 1 and result.stdout == b""
    assert b"no config file" in result.stderr and missing.encode() in result.stderr


async def test_the_shim_loads_neither_trio_nor_any_other_dependency(socket_path: str) -> None:
    config = write_config(os.path.dirname(socket_path), {"demo": demo_server()})
    ping = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
    with trio.fail_after(30):
        daemon = await start_daemon(config, socket_path)
        try:
            result = await trio.run_process(
                [
                    sys.executable,
                    "-X",
                    "importtime",
                    "-m",
                    "cli.main",
                    "connect",
                    "--socket",
                    socket_path,
                ],
                env=ENV,
                stdin=ping,
                capture_stdout=True,
                capture_stderr=True,
            )
        finally:
            daemon.send_signal(signal.SIGTERM)
            await daemon.wait()
    assert json.loads(result.stdout) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    imported = {
        line.split("|")[-1].strip().split(".")[0]
        for line in result.stderr.decode().splitlines()
        if line.startswith("import time:")
    }
    assert "actors" in imported
    assert not imported & {"trio", "structlog", "orjson", "attrs", "cattrs", "broker"}
    assert "typing" not in imported  # (3 ms of every start: cli/main.py, actors/paths.py)


async def test_a_bad_config_file_is_reported_with_the_key_at_fault(tmp_path: Path) -> None:
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"mcpServers": {"x": {"command": "y", "args": "not-a-list"}}}))
    result = await trio.run_process(
        [MCPBROKER, "serve", "--config", str(config), "--socket", str(tmp_path / "s")],
        env=ENV,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 2
    assert b"mcpServers.x.args" in result.stderr and b"list of strings" in result.stderr


async def test_a_config_that_cannot_be_served_exits_2_and_a_taken_port_says_so_in_a_line(
    tmp_path: Path,
) -> None:
    # (both exited 1, with RestartPreventExitStatus=2 systemd restarted in vain;
    # a taken port was a 68-line traceback)
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    cases = [
        ({"metrics": "0.0.0.0:0"}, 2, "off loopback, needs a token"),
        ({"websocket": "127.0.0.1:0", "tokenFile": str(tmp_path / "no")}, 2, "cannot read the"),
        ({"auditLog": str(tmp_path / "no" / "a.jsonl")}, 2, "cannot write the audit log"),
        ({"metrics": f"127.0.0.1:{port}"}, 1, f"cannot listen for metrics on 127.0.0.1:{port}"),
        ({"websocket": f"127.0.0.1:{port}"}, 1, "cannot listen for WebSocket on"),
    ]
    with taken, trio.fail_after(60):
        for broker, code, message in cases:
            config = tmp_path / "c.json"
            config.write_text(json.dumps({"mcpServers": {}, "broker": broker}))
            result = await trio.run_process(
                [MCPBROKER, "serve", "--config", str(config), "--socket", str(tmp_path / "s")],
                env=ENV,
                capture_stderr=True,
                check=False,
            )
            lines = result.stderr.decode().strip().splitlines()
            assert (result.returncode, len(lines)) == (code, 1), (broker, lines)
            assert message in lines[0], lines


class SocketStdio:
    """A shim's stdin and stdout as one end of a socket pair (not pipes: the
    shim then copies instead of splicing)."""

    def __init__(self) -> None:
        ours, self.theirs = socket.socketpair()
        self.stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
        self.stdin = self.stdout = self

    async def send_all(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive_some(self) -> bytes:
        return bytes(await self.stream.receive_some())

    async def aclose(self) -> None:
        self.stream.socket.shutdown(socket.SHUT_WR)


@pytest.mark.parametrize("stdio", ["pipes", "socket"])
async def test_the_shim_relays_large_traffic_both_ways_at_once(
    socket_path: str, stdio: str
) -> None:
    """Many big requests written while big answers come back: no direction blocks the other."""
    config = write_config(os.path.dirname(socket_path), {"demo": demo_server()})
    count, size = 200, 50_000
    with trio.fail_after(60):
        daemon = await start_daemon(config, socket_path)
        try:
            command = [MCPBROKER, "connect", "--socket", socket_path, "--server", "demo"]
            pair = SocketStdio() if stdio == "socket" else None
            if pair is None:
                shim: Any = await trio.lowlevel.open_process(
                    command, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE
                )
                ends: Any = shim
            else:
                shim = await trio.lowlevel.open_process(
                    command, env=ENV, stdin=pair.theirs.fileno(), stdout=pair.theirs.fileno()
                )
                pair.theirs.close()
                ends = pair
            assert ends.stdin is not None and ends.stdout is not None
            init = {
                "jsonrpc": "2.0",
                "id": "init",
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "t"},
                },
            }
            lines = [json.dumps(init)] + [
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": i,
                        "method": "tools/call",
                        "params": {
                            "name": "echo",
                            "arguments": {"text": str(i) * (size // len(str(i)))},
                        },
                    }
                )
                for i in range(count)
            ]
            received: list[Any] = []

            async def write() -> None:
                for line in lines:
                    await ends.stdin.send_all(line.encode() + b"\n")

            async def read() -> None:
                buffer = b""
                while len(received) < count + 1:
                    data = await ends.stdout.receive_some()
                    assert data, "the shim closed its stdout"
                    buffer += data
                    *complete, buffer = buffer.split(b"\n")
                    received.extend(json.loads(line) for line in complete)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(write)
                nursery.start_soon(read)
            await ends.stdin.aclose()
            assert await shim.wait() == 0
        finally:
            daemon.send_signal(signal.SIGTERM)
            await daemon.wait()
    answers = {m["id"]: m["result"]["content"][0]["text"] for m in received if m["id"] != "init"}
    assert sorted(answers) == list(range(count))
    assert all(len(text) >= size - 10 for text in answers.values())


async def _fake_daemon(socket_path: str) -> trio.socket.SocketType:
    """A listening unix socket where a daemon would be: the test plays the daemon."""
    listener = trio.socket.socket(socket.AF_UNIX)
    await listener.bind(socket_path)
    listener.listen()
    return listener


async def _open_shim(socket_path: str, stdio: str, *options: str) -> tuple[trio.Process, Any]:
    """A shim on ``socket_path`` (no hello), with pipes or a socket pair as its stdio."""
    command = [MCPBROKER, "connect", "--socket", socket_path, *options]
    if stdio == "pipes":
        shim = await trio.lowlevel.open_process(
            command, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        return shim, shim
    pair = SocketStdio()
    shim = await trio.lowlevel.open_process(
        command,
        env=ENV,
        stdin=pair.theirs.fileno(),
        stdout=pair.theirs.fileno(),
        stderr=subprocess.PIPE,
    )
    pair.theirs.close()
    return shim, pair


@pytest.mark.parametrize("stdio", ["pipes", "socket"])
async def test_the_shim_hands_over_the_last_words_when_the_daemon_leaves(
    socket_path: str, stdio: str
) -> None:
    listener = await _fake_daemon(socket_path)
    with trio.fail_after(20):
        # (by default the shim would reconnect: tests/test_reconnect_e2e.py)
        shim, ends = await _open_shim(socket_path, stdio, "--no-resume")
        conn, _ = await listener.accept()
        await conn.send(b'{"last":"words"}\n')
        conn.close()
        assert await ends.stdout.receive_some() == b'{"last":"words"}\n'
        assert await shim.wait() == 1  # the host still had its stdin open
        stderr = await shim.stderr.receive_some()
    assert b"the daemon closed the connection" in stderr
    listener.close()


async def _receive_lines(conn: Any, count: int) -> bytes:
    received = b""
    while received.count(b"\n") < count:
        data = await conn.recv(4096)
        assert data, received
        received += data
    return received


@pytest.mark.parametrize("stdio", ["pipes", "socket"])
async def test_by_default_the_shim_hands_over_the_last_words_and_comes_back(
    socket_path: str, stdio: str
) -> None:
    listener = await _fake_daemon(socket_path)
    with trio.fail_after(20):
        shim, ends = await _open_shim(socket_path, stdio)
        conn, _ = await listener.accept()
        await ends.stdin.send_all(b'{"jsonrpc":"2.0","id":7,"method":"tools/call"}\n')
        hello = b'{"mcpbroker":{"notices":["stopping"]}}\n'  # (it asks to be told of a stop)
        request = b'{"jsonrpc":"2.0","id":7,"method":"tools/call"}\n'
        assert await _receive_lines(conn, 2) == hello + request
        await conn.send(b'{"last":"words"}\n')
        conn.close()
        answer = b""
        while answer.count(b"\n") < 2:
            answer += await ends.stdout.receive_some()
        first, error = answer.splitlines()
        assert first == b'{"last":"words"}'  # then the request in flight gets its error:
        assert json.loads(error)["id"] == 7 and json.loads(error)["error"]["code"] == -32000
        again, _ = await listener.accept()  # the shim came back (the host never initialized)
        await ends.stdin.send_all(b'{"jsonrpc":"2.0","id":8,"method":"ping"}\n')
        ping = b'{"jsonrpc":"2.0","id":8,"method":"ping"}\n'
        assert await _receive_lines(again, 2) == hello + ping  # (the hello, at each connection)
        shim.kill()
        await shim.wait()
        again.close()
    listener.close()


@pytest.mark.parametrize("resume", [True, False])
@pytest.mark.parametrize("stdio", ["pipes", "socket"])
async def test_the_shim_leaves_when_the_host_stops_reading(
    socket_path: str, stdio: str, resume: bool
) -> None:
    listener = await _fake_daemon(socket_path)
    with trio.fail_after(20):
        shim, ends = await _open_shim(socket_path, stdio, *([] if resume else ["--no-resume"]))
        conn, _ = await listener.accept()
        if stdio == "pipes":
            await shim.stdout.aclose()
        else:
            ends.stream.socket.shutdown(socket.SHUT_RD)
            ends.stream.socket.close()
        with contextlib.suppress(OSError):
            for _ in range(64):  # more than any pipe or socket buffer holds
                await conn.send(b"x" * 65536 + b"\n")
        assert await shim.wait() == 0
        said = b""
        while chunk := await shim.stderr.receive_some():
            said += chunk
        assert b"the daemon closed" not in said  # (the host left, not the daemon)
        conn.close()
    listener.close()


FLOODER = """
import json, sys, time
request = json.loads(sys.stdin.buffer.readline())
out = sys.stdout.buffer
result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "flood"}}
out.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode() + b"\\n")
for i in range(200_000):  # pings, and never another read: the answers pile up
    out.write(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\\n' % i)
out.flush()
time.sleep(60)
"""


async def test_a_server_that_floods_without_reading_is_stopped_not_fed_forever() -> None:
    from actors.upstream import CONTROL_SLACK, READ_CHUNK, Upstream
    from broker.config import BrokerSettings, ServerConfig

    config = ServerConfig(command=sys.executable, args=["-c", FLOODER])
    mib = 1024 * 1024  # (200,000 answers to pings are ~7 MiB: past what these limits allow)
    settings = BrokerSettings(max_message_bytes=mib, max_queued_bytes=mib)
    upstream = Upstream("flood", config, settings)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(upstream.run)
            while upstream.statistics().last_error is None:
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    assert "stopped reading its input" in str(upstream.statistics().last_error)
    assert upstream._backlog_bytes <= 2 * mib + READ_CHUNK + CONTROL_SLACK + 4096


async def test_a_daemon_that_keeps_closing_the_session_is_given_up_on(socket_path: str) -> None:
    listener = await _fake_daemon(socket_path)
    accepted = 0

    async def close_each() -> None:
        nonlocal accepted
        while True:
            conn, _ = await listener.accept()
            accepted += 1
            conn.close()  # (at once: before the shim's hello, if any)

    with trio.fail_after(30):
        shim, _ = await _open_shim(socket_path, "pipes")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(close_each)
            assert await shim.wait() == 1
            nursery.cancel_scope.cancel()
        stderr = b""
        while chunk := await shim.stderr.receive_some():
            stderr += chunk
    assert b"giving up" in stderr, stderr
    # (the first connection, then a reconnect per gap, backing off; a
    # connection that fails while being restored is retried on the same clock,
    # how often depends on when the close is seen: a loaded machine saw 21.
    # A tight loop would be thousands.)
    assert 7 <= accepted <= 40, stderr  # the first connection, then six reconnects, backing off
    listener.close()


async def test_the_daemon_raises_its_descriptor_limit(socket_path: str) -> None:
    """Started with the common soft limit of a desktop session's processes
    (here 256; 1024 is usual), the daemon takes up to 65,536 of the hard
    limit: a few hundred idle connections locked every host out."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
    if wanted <= 256:
        pytest.skip("the hard limit leaves nothing to raise")
    config = write_config(os.path.dirname(socket_path), {"demo": demo_server()})

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    with trio.fail_after(30):
        process = await trio.lowlevel.open_process(
            [MCPBROKER, "serve", "--config", config, "--socket", socket_path],
            env=ENV,
            stderr=subprocess.DEVNULL,
            preexec_fn=low_limit,
        )
        try:
            while not await accepts_connections(socket_path):
                assert process.poll() is None, "the daemon exited while starting"
                await trio.sleep(0.02)
            assert psutil.Process(process.pid).rlimit(psutil.RLIMIT_NOFILE)[0] == wanted
        finally:
            process.send_signal(signal.SIGTERM)
            await process.wait()
