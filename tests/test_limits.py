"""What one peer sends cannot wedge or bloat the rest: the actors' limits.

Memory streams and pytest-trio's ``autojump_clock``: a server that stops
reading is a lockstep link whose far end stops calling ``receive_some``, so
the broker's writes block as they would on a full pipe, and "promptly" is
measured on the virtual clock. The same cases with real processes are in
tests/test_faults_e2e.py.
"""

from __future__ import annotations

import contextlib
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from actors.mailbox import SessionHandle, open_outbox
from actors.server_actor import ClientCancelled, ClientRequest
from actors.upstream import Upstream
from broker import jsonrpc
from broker.config import BrokerSettings, ServerConfig
from tests.scripted import ScriptedServer
from tests.test_actors import SETTINGS, Broker, call, open_client

LIMITS = BrokerSettings(max_message_bytes=64 * 1024, max_queued_bytes=128 * 1024, max_in_flight=3)


async def start(
    nursery: trio.Nursery,
    scripts: dict[str, ScriptedServer],
    settings: BrokerSettings = SETTINGS,
    server_timeout: float | None = None,
) -> Broker:
    config = ServerConfig(command="scripted", timeout=server_timeout)
    upstreams = {
        name: Upstream(name, config, settings, launch=s.launch) for name, s in scripts.items()
    }
    broker = Broker(upstreams)
    await nursery.start(broker.registry.run)
    for upstream in upstreams.values():
        await nursery.start(upstream.run)
    return broker


def tool_call(id: Any, name: str, **arguments: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": call(name, **arguments)}


async def answers(client: Any, count: int) -> dict[Any, Any]:
    got: dict[Any, Any] = {}
    while len(got) < count:
        message = await client.receive()
        if "method" not in message:
            assert message["id"] not in got, f"two answers for {message['id']!r}"
            got[message["id"]] = message
    return got


async def test_a_server_that_stops_reading_holds_up_nothing_else(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    stuck = ScriptedServer(nursery, label="stuck", stop_reading=True)
    broker = await start(nursery, {"stuck": stuck, "ok": ScriptedServer(nursery)}, server_timeout=3)
    client = await open_client(nursery, broker, servers=("stuck", "ok"))
    await client.initialize()
    payload = "x" * 10_000
    for n in range(40):  # far more than the stuck link takes
        await client.send(tool_call(n, "stuck__echo", data=payload))
    started = trio.current_time()
    answer = await client.request("tools/call", call("ok__echo"), id="bystander")
    assert "result" in answer and trio.current_time() - started < 0.1
    # A new session that sees both servers starts and lists at once, too.
    other = await open_client(nursery, broker, servers=("stuck", "ok"))
    await other.initialize()
    assert len((await other.request("tools/list"))["result"]["tools"]) == 12
    assert trio.current_time() - started < 0.1
    # Every request to the stuck server is answered by its timeout, once (but the
    # one it read before it stopped, which it answered).
    (first,) = client.others
    assert first["id"] == 0 and "result" in first
    got = await answers(client, 39)
    assert sorted(got) == list(range(1, 40))
    assert {m["error"]["code"] for m in got.values()} == {jsonrpc.REQUEST_TIMEOUT}
    assert 3 <= trio.current_time() - started < 4


async def test_a_full_backlog_answers_at_once(nursery: trio.Nursery, autojump_clock: Any) -> None:
    stuck = ScriptedServer(nursery, label="stuck", stop_reading=True)
    broker = await start(nursery, {"stuck": stuck}, LIMITS, server_timeout=60)
    client = await open_client(nursery, broker)
    await client.initialize()
    for n in range(30):  # 300 KB against a 128 KiB backlog
        await client.send(tool_call(n, "echo", data="x" * 10_000))
        await trio.testing.wait_all_tasks_blocked()
    got: dict[Any, Any] = {}
    with trio.move_on_after(0.1):  # what is answered at once
        while True:
            message = await client.receive()
            got[message["id"]] = message
    assert "result" in got.pop(0)  # the one the server read before it stopped
    # The next ones fill the backlog (and wait for their timeout); the rest are refused.
    assert 10 <= min(got) <= 16 and sorted(got) == list(range(min(got), 30))
    for message in got.values():
        assert message["error"]["code"] == jsonrpc.LIMIT_REACHED
        assert "is not reading its input" in message["error"]["message"]


async def test_notifications_to_a_server_that_stops_reading_do_not_pile_up(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    stuck = ScriptedServer(nursery, label="stuck", stop_reading=True)
    broker = await start(nursery, {"stuck": stuck}, LIMITS, server_timeout=60)
    upstream = broker.upstreams["stuck"]
    client = await open_client(nursery, broker)
    await client.initialize()
    await client.send(tool_call(0, "echo"))  # after this one it reads nothing
    for n in range(100):  # 1 MB of roots/list_changed against a 128 KiB backlog
        note = jsonrpc.notification(
            "notifications/roots/list_changed", {"_meta": {"n": n, "pad": "x" * 10_000}}
        )
        await client.send(note)
        await trio.testing.wait_all_tasks_blocked()
    assert upstream._backlog_bytes < 2 * LIMITS.max_queued_bytes
    # The latest is kept, to be written when the server reads again.
    held = upstream._held_notification
    assert held is not None and held["params"]["_meta"]["n"] == 99
    assert upstream.statistics().last_error is None  # (a client's notes stop no server)


async def test_answers_a_server_asks_for_while_it_reads_nothing_stop_it(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    # The server asks for roots again and again, reading nothing (the answers
    # pile up): as for pings, past the backlog and CONTROL_SLACK it is stuck.
    stuck = ScriptedServer(nursery, label="stuck", stop_reading=True)
    broker = await start(nursery, {"stuck": stuck}, LIMITS, server_timeout=60)
    upstream = broker.upstreams["stuck"]
    client = await open_client(nursery, broker)
    capabilities = {"roots": {"listChanged": True}}
    params = {"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {}}
    await client.request("initialize", params)
    await client.send(jsonrpc.notification("notifications/initialized"))
    asks = "\n".join(f'{{"jsonrpc":"2.0","id":"q{n}","method":"roots/list"}}' for n in range(400))
    await client.send(tool_call(0, "raw", line=asks))
    roots = [{"uri": "file:///" + "x" * 10_000}]
    with trio.fail_after(10):
        while upstream.statistics().last_error is None:
            ask = await client.receive()
            if ask.get("method") == "roots/list":  # 4 MB of answers in all
                await client.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": roots}})
    assert "stopped reading its input" in str(upstream.statistics().last_error)


def _malloc_in_use() -> int:
    """Bytes the C allocator has handed out (glibc's ``mallinfo2``): what
    Python's own allocator does not keep (objects over 512 bytes)."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
            )
        ]  # fmt: skip

    mallinfo2 = getattr(ctypes.CDLL(None), "mallinfo2", None)
    if mallinfo2 is None:
        pytest.skip("needs glibc 2.33 or later (mallinfo2)")
    mallinfo2.restype = Info
    return int(mallinfo2().uordblks)


async def test_what_waits_for_a_server_holds_its_size(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    # 5,000 pings from a server that reads nothing: the broker's answers (45
    # bytes each) wait in its backlog. Each held the 4 KiB buffer orjson wrote
    # it in (20 MB).
    settings = attrs.evolve(SETTINGS, max_message_bytes=1 << 20)  # (the call carries them)
    stuck = ScriptedServer(nursery, label="stuck", stop_reading=True)
    broker = await start(nursery, {"stuck": stuck}, settings, server_timeout=60)
    upstream = broker.upstreams["stuck"]
    client = await open_client(nursery, broker, settings=settings)
    await client.initialize()
    pings = "\n".join(f'{{"jsonrpc":"2.0","id":"p{n}","method":"ping"}}' for n in range(5000))
    before = _malloc_in_use()
    await client.send(tool_call(0, "raw", line=pings))
    with trio.fail_after(5):
        while upstream._backlog_bytes < 5000 * 40:
            await trio.sleep(0.01)
    assert _malloc_in_use() - before < 5_000_000  # (about 2 MB; 22 MB without the copies)


async def test_a_client_that_never_reads_is_cut_off_at_the_byte_limit(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    settings = attrs.evolve(LIMITS, max_in_flight=100)
    broker = await start(nursery, {"s": ScriptedServer(nursery)}, settings)
    client = await open_client(nursery, broker, lockstep=True, settings=settings)
    await client.initialize()
    with contextlib.suppress(trio.BrokenResourceError):  # (once it is cut off)
        for n in range(30):  # answers of ~20 KB each, and the client reads none of them
            await client.send(tool_call(n, "echo", data="x" * 10_000))
    with trio.fail_after(5):
        while client.session.handle.close_reason is None:
            await trio.sleep(0.01)
    assert "broker.maxQueuedBytes" in client.session.handle.close_reason


async def test_small_notifications_count_what_they_hold_not_their_bytes(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    # 600 progress notifications of ~80 bytes to a session that reads nothing:
    # 48 KB on the wire, each call's, but decoded some 300 KB. Two calls pass
    # a 128 KiB bound (the first delivery is always taken).
    script = ScriptedServer(nursery)
    upstream = Upstream("s", ServerConfig(command="scripted"), LIMITS, launch=script.launch)
    await nursery.start(upstream.run)
    await upstream.wait_ready()
    send, _outbox = open_outbox()  # (never read)
    session = SessionHandle(send, trio.CancelScope(), max_bytes=LIMITS.max_queued_bytes)
    note = (
        '{"jsonrpc":"2.0","method":"notifications/progress",'
        '"params":{"progressToken":ID,"progress":1}}'
    )
    line = "\n".join([note] * 600 + ['{"jsonrpc":"2.0","id":ID,"result":{}}'])
    for n in range(2):
        request = tool_call(n, "raw", line=line)
        request["params"]["_meta"] = {"progressToken": n}
        await upstream.send(ClientRequest(session, [request], 100))
        await trio.sleep(0.1)
    assert session.close_reason is not None, session.queued_bytes
    assert "broker.maxQueuedBytes" in session.close_reason


async def test_an_oversize_answer_fails_its_call_at_once(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    broker = await start(nursery, {"s": ScriptedServer(nursery)}, LIMITS, server_timeout=60)
    client = await open_client(nursery, broker)
    await client.initialize()
    for shape in (
        '{"jsonrpc":"2.0","id":ID,"result":"PAD"}',
        '{"result":"PAD","jsonrpc":"2.0","id":ID}',
    ):
        started = trio.current_time()
        answer = await client.request("tools/call", call("raw", line=shape, pad=100_000))
        assert trio.current_time() - started < 0.1
        error = answer["error"]
        assert error["code"] == jsonrpc.INTERNAL_ERROR
        assert "broker.maxMessageBytes" in error["message"]
        assert error["data"]["server"] == "s" and error["data"]["limit"] == 64 * 1024
        assert error["data"]["size"] > 100_000
    assert "result" in await client.request("tools/call", call("echo"))


async def test_an_invalid_answer_fails_its_call_at_once(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    broker = await start(nursery, {"s": ScriptedServer(nursery)}, LIMITS, server_timeout=60)
    client = await open_client(nursery, broker)
    await client.initialize()
    # (written with spaces: a compact answer is passed on unparsed, broker/wire/envelope.py)
    for shape, why in (
        ('{"jsonrpc": "2.0", "id": ID, "result": {}, "error": {"code": 1, "message": ""}}', "both"),
        ('{"id": ID, "result": {}}', '"jsonrpc" must be "2.0"'),
    ):
        started = trio.current_time()
        answer = await client.request("tools/call", call("raw", line=shape))
        assert trio.current_time() - started < 0.1, shape
        error = answer["error"]
        assert error["code"] == jsonrpc.INTERNAL_ERROR
        assert error["message"].startswith("MCP server 's' answered with an invalid answer")
        assert why in error["message"] and error["data"] == {"server": "s"}
    assert "result" in await client.request("tools/call", call("echo"))


async def test_an_id_in_flight_on_another_server_is_refused_with_id_null(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    broker = await start(nursery, {"a": ScriptedServer(nursery), "b": ScriptedServer(nursery)})
    client = await open_client(nursery, broker)
    await client.initialize()
    await client.send(tool_call(7, "a__sleep", seconds=1))
    await client.send(tool_call(7, "b__echo"))
    refused = await client.receive()
    assert refused["id"] is None and refused["error"]["code"] == jsonrpc.INVALID_REQUEST
    assert refused["error"]["data"] == {"id": 7}
    answer = await client.receive()
    assert answer["id"] == 7 and answer["result"]["server"] == "scripted"
    assert answer["result"]["name"] == "sleep"


async def test_a_session_past_its_in_flight_limit_is_answered_at_once(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    broker = await start(nursery, {"s": ScriptedServer(nursery)}, LIMITS)
    client = await open_client(nursery, broker, settings=LIMITS)
    await client.initialize()
    for n in range(4):
        await client.send(tool_call(n, "sleep", seconds=1))
    refused = await client.receive()
    assert refused["id"] == 3 and refused["error"]["code"] == jsonrpc.LIMIT_REACHED
    assert "broker.maxInFlight" in refused["error"]["message"]
    assert sorted(await answers(client, 3)) == [0, 1, 2]


async def test_requests_park_while_the_server_starts(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery, initialize_delay=5)
    upstream = Upstream("s", ServerConfig(command="scripted"), SETTINGS, launch=script.launch)
    await nursery.start(upstream.run)
    send, outbox = open_outbox()
    session = SessionHandle(send, trio.CancelScope())
    for n in range(3):
        await upstream.send(ClientRequest(session, [tool_call(n, "echo", n=n)], 100))
    await upstream.send(ClientCancelled(session, {"requestId": 1}))  # never reaches the server
    with trio.fail_after(6):
        delivered = [(await outbox.receive())[0][0], (await outbox.receive())[0][0]]
    assert sorted(jsonrpc.decode(answer.encode())["id"] for answer in delivered) == [0, 2]
    calls = script.requests("tools/call")
    assert [c["params"]["arguments"]["n"] for c in calls] == [0, 2]


async def test_parked_requests_are_answered_when_the_server_fails_to_start(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery, answer_initialize=False)
    upstream = Upstream("s", ServerConfig(command="scripted"), SETTINGS, launch=script.launch)
    await nursery.start(upstream.run)
    send, outbox = open_outbox()
    session = SessionHandle(send, trio.CancelScope())
    await upstream.send(ClientRequest(session, [tool_call("p", "echo")], 100))
    with trio.fail_after(31):  # the startup timeout is 30 s
        (error,), _ = await outbox.receive()
    assert error["id"] == "p" and error["error"]["code"] == jsonrpc.CONNECTION_CLOSED
    assert not script.requests("tools/call")


async def test_a_request_the_encoder_refuses_fails_alone(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    # (jsonrpc.decode refuses such nesting; this is the defence behind it.)
    script = ScriptedServer(nursery)
    upstream = Upstream("s", ServerConfig(command="scripted"), SETTINGS, launch=script.launch)
    await nursery.start(upstream.run)
    await upstream.wait_ready()
    send, outbox = open_outbox()
    session = SessionHandle(send, trio.CancelScope())
    deep: Any = []
    for _ in range(300):  # past what orjson writes
        deep = [deep]
    batch = [tool_call("deep", "echo", deep=deep), tool_call("fine", "echo")]
    await upstream.send(ClientRequest(session, batch, 100))
    with trio.fail_after(1):
        got = {}
        while len(got) < 2:
            for message in (await outbox.receive())[0]:
                message = message if isinstance(message, dict) else message.read()
                got[message["id"]] = message
    assert got["deep"]["error"]["code"] == jsonrpc.INTERNAL_ERROR
    assert "result" in got["fine"]
    assert [c["params"]["name"] for c in script.requests("tools/call")] == ["echo"]
