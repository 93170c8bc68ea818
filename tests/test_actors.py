"""Session and Upstream actors on memory streams, with a scripted server.

Timeouts and restart backoff run on pytest-trio's ``autojump_clock``, so a
30-second startup timeout takes no time.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from actors.daemon import RULES
from actors.downstream.stream import StreamConnection
from actors.internal import InternalClient
from actors.mailbox import OUTBOX_SIZE, SessionHandle
from actors.registry import Registry
from actors.server_actor import Attach, ClientCancelled, ClientRequest, Detach
from actors.session import Session
from actors.upstream import INBOX_SIZE, Upstream
from broker import jsonrpc
from broker.config import BrokerSettings, ServerConfig
from broker.upstream import UpstreamProtocol
from broker.wire import ndjson
from broker.wire.frames import Failed
from broker.wire.ndjson import LineFramer
from tests.scripted import LISTS, ListError, ScriptedServer

SETTINGS = BrokerSettings(max_message_bytes=64 * 1024)


class Broker:
    """Upstreams over scripted servers, and their Registry: a daemon without sockets."""

    def __init__(self, upstreams: dict[str, Upstream]) -> None:
        self.upstreams = upstreams
        self.registry = Registry(upstreams, SETTINGS)


async def start_broker(
    nursery: trio.Nursery,
    scripts: dict[str, ScriptedServer],
    *,
    run: bool = True,
    settings: BrokerSettings = SETTINGS,
) -> Broker:
    upstreams = {
        name: Upstream(name, ServerConfig(command="scripted"), settings, launch=script.launch)
        for name, script in scripts.items()
    }
    broker = Broker(upstreams)
    await nursery.start(broker.registry.run)
    if run:
        for upstream in upstreams.values():
            await nursery.start(upstream.run)
    return broker


async def start_upstream(nursery: trio.Nursery, script: ScriptedServer, name: str = "s") -> Broker:
    return await start_broker(nursery, {name: script})


class Client:
    """The test's end of a Session: sends lines, reads messages."""

    def __init__(self, stream: trio.abc.Stream, session: Session) -> None:
        self.stream = stream
        self.session = session
        self._framer = LineFramer(1 << 30)
        self._pending: list[Any] = []
        self._ids = 0
        self.others: list[Any] = []

    async def send(self, message: Any) -> None:
        await self.stream.send_all(ndjson.encode(message))

    async def receive(self) -> Any:
        while not self._pending:
            data = await self.stream.receive_some()
            assert data, "session closed the connection"
            self._pending.extend(jsonrpc.decode(line) for line in self._framer.feed(data))
        return self._pending.pop(0)

    async def request(
        self, method: str, params: dict[str, Any] | None = None, id: Any = None
    ) -> Any:
        """Send a request and return its response (other messages go to ``self.others``)."""
        if id is None:
            self._ids += 1
            id = f"r{self._ids}"
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        while True:
            answer = await self.receive()
            if isinstance(answer, dict) and answer.get("id") == id and "method" not in answer:
                return answer
            self.others.append(answer)

    async def initialize(self, version: str = "2025-11-25") -> Any:
        params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t"}}
        response = await self.request("initialize", params)
        await self.send(jsonrpc.notification("notifications/initialized"))
        return response


async def open_client(
    nursery: trio.Nursery,
    broker: Broker,
    *,
    lockstep: bool = False,
    servers: tuple[str, ...] | None = None,
    settings: BrokerSettings = SETTINGS,
) -> Client:
    """A session; by default it names every server (one: transparent, as the shim does)."""
    pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
    ours, theirs = pair()
    connection = StreamConnection(theirs, settings.max_message_bytes)
    session = Session(connection, broker.upstreams, broker.registry, settings)
    nursery.start_soon(session.run)
    client = Client(ours, session)
    servers = tuple(broker.upstreams) if servers is None else servers
    if servers:
        await client.send({"mcpbroker": {"servers": list(servers)}})
    return client


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


async def test_two_sessions_with_the_same_id_each_get_their_own_answer(
    nursery: trio.Nursery,
) -> None:
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script)
    a, b = await open_client(nursery, broker), await open_client(nursery, broker)
    await a.initialize()
    await b.initialize()
    await a.send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": call("sleep", seconds=0.05, who="a"),
        }
    )
    await b.send(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call("echo", who="b")}
    )
    answer_b, answer_a = await b.receive(), await a.receive()
    assert answer_a["id"] == 1 and answer_a["result"]["echo"]["who"] == "a"
    assert answer_b["id"] == 1 and answer_b["result"]["echo"]["who"] == "b"
    upstream_ids = [m["id"] for m in script.requests("tools/call")]
    assert len(set(upstream_ids)) == 2


async def test_ids_come_back_exactly_as_sent(nursery: trio.Nursery) -> None:
    script = ScriptedServer(nursery)
    client = await open_client(nursery, await start_upstream(nursery, script))
    await client.initialize()
    for id in ("1", 1, "a-string", 2**53, -7, ""):
        response = await client.request("tools/call", call("echo"), id=id)
        assert response["id"] == id and type(response["id"]) is type(id)


async def test_an_answer_reaches_the_client_as_the_server_wrote_it(
    nursery: trio.Nursery,
) -> None:
    # Parsed and encoded again, the number would become a float and the escape
    # would change; the TypeScript SDK's key order would be lost.
    script = ScriptedServer(nursery)
    client = await open_client(nursery, await start_upstream(nursery, script))
    await client.initialize()
    body = '"result":{"n":123456789012345678901234567890,"s":"\\u00e9"}'
    for server_line, client_line in (
        ('{"jsonrpc":"2.0","id":ID,' + body + "}", '{"jsonrpc":"2.0","id":"c",' + body + "}"),
        ("{" + body + ',"jsonrpc":"2.0","id":ID}', "{" + body + ',"jsonrpc":"2.0","id":"c"}'),
    ):
        await client.send(
            {
                "jsonrpc": "2.0",
                "id": "c",
                "method": "tools/call",
                "params": call("raw", line=server_line),
            }
        )
        data = b""
        while not data.endswith(b"\n"):
            data += await client.stream.receive_some()
        assert data == client_line.encode() + b"\n"


# Integers orjson cannot hold (past 64 bits: it would make them floats), and a
# number past a double's range (orjson refuses it), as JSON allows them.
BIG_INTEGERS = b'{"big":1180591620717411303425,"low":-9223372036854775809}'
BIG_NUMBERS = b'{"big":1180591620717411303425,"low":-9223372036854775809,"huge":1e400}'


@pytest.mark.parametrize(
    ("arguments", "step"), [(BIG_INTEGERS, None), (BIG_INTEGERS, 7), (BIG_NUMBERS, None)]
)
async def test_a_clients_numbers_reach_the_server_as_written(
    nursery: trio.Nursery, arguments: bytes, step: int | None
) -> None:
    # ``step``: the line arrives in pieces, each number cut by one.
    script = ScriptedServer(nursery)
    client = await open_client(nursery, await start_upstream(nursery, script))
    await client.initialize()
    line = b'{"jsonrpc":"2.0","id":"n","method":"tools/call","params":{"name":"echo",'
    line += b'"arguments":' + arguments + b"}}\n"
    pieces = [line] if step is None else [line[i : i + step] for i in range(0, len(line), step)]
    for piece in pieces:
        await client.stream.send_all(piece)
        await trio.testing.wait_all_tasks_blocked()  # each piece read on its own
    response = await client.receive()
    assert response["id"] == "n" and "result" in response
    (sent,) = [raw for raw in script.lines if b'"echo"' in raw]
    assert b'"arguments":' + arguments in sent


async def test_an_id_past_64_bits_is_refused_and_the_session_goes_on(
    nursery: trio.Nursery,
) -> None:
    script = ScriptedServer(nursery)
    client = await open_client(nursery, await start_upstream(nursery, script))
    await client.initialize()
    await client.stream.send_all(b'{"jsonrpc":"2.0","id":123456789012345678901,"method":"ping"}\n')
    refused = await client.receive()
    assert refused["id"] is None and refused["error"]["code"] == jsonrpc.INVALID_REQUEST
    assert "result" in await client.request("tools/call", call("echo"))


async def test_a_servers_numbers_reach_the_client_as_written(nursery: trio.Nursery) -> None:
    # Lines the broker parses (not an answer in a compact shape): a
    # notification, and an answer written with spaces.
    script = ScriptedServer(nursery)
    client = await open_client(nursery, await start_upstream(nursery, script))
    await client.initialize()
    spaced = '{"jsonrpc": "2.0", "id": ID, "result": ' + BIG_NUMBERS.decode() + "}"
    notice = '{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info",'
    notice += '"data":' + BIG_NUMBERS.decode() + "}}"
    for id, server_line in (("s1", notice), ("s2", spaced)):
        await client.send(
            {
                "jsonrpc": "2.0",
                "id": id,
                "method": "tools/call",
                "params": call("raw", line=server_line),
            }
        )
    data = b""
    while data.count(b"\n") < 2:
        data += await client.stream.receive_some()
    assert data.count(BIG_NUMBERS) == 2, data


async def test_bytes_trickled_one_at_a_time(nursery: trio.Nursery) -> None:
    script = ScriptedServer(nursery)
    client = await open_client(nursery, await start_upstream(nursery, script))
    await client.initialize()
    line = ndjson.encode(
        {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": call("echo", x="é")}
    )
    for i in range(len(line)):
        await client.stream.send_all(line[i : i + 1])
    response = await client.receive()
    assert response["id"] == 9 and response["result"]["echo"] == {"x": "é"}


async def test_requests_wait_for_the_handshake(nursery: trio.Nursery, autojump_clock: Any) -> None:
    script = ScriptedServer(nursery)
    broker = await start_broker(nursery, {"s": script}, run=False)
    client = await open_client(nursery, broker)
    await client.initialize()
    await client.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": call("echo")})
    await trio.sleep(1)  # the upstream has not even been started yet
    await nursery.start(broker.upstreams["s"].run)
    assert (await client.receive())["id"] == 5


async def test_server_death_fails_requests_in_flight_then_restarts(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script, name="flaky")
    upstream = broker.upstreams["flaky"]
    client = await open_client(nursery, broker)
    await client.initialize()
    await client.send(
        {
            "jsonrpc": "2.0",
            "id": "long",
            "method": "tools/call",
            "params": call("sleep", seconds=60),
        }
    )
    await client.send(
        {"jsonrpc": "2.0", "id": "kill", "method": "tools/call", "params": call("die")}
    )
    received = [await client.receive() for _ in range(2)]
    errors = {m["id"]: m["error"] for m in received if "id" in m}
    assert set(errors) == {"long", "kill"}
    for error in errors.values():
        assert error["code"] == jsonrpc.CONNECTION_CLOSED
        assert "'flaky'" in error["message"] and "exited" in error["message"]
        assert error["data"] == {"server": "flaky", "retryable": True}
    # While it is down, requests are answered at once, not queued.
    response = await client.request("tools/call", call("echo"))
    assert response["error"]["code"] == jsonrpc.CONNECTION_CLOSED
    await upstream.wait_ready()
    assert script.launches == 2
    assert (await client.request("tools/call", call("echo", again=True)))["result"]["echo"] == {
        "again": True
    }
    # It came back with the same lists: the session was never told they changed.
    assert not [m for m in client.others if m.get("method", "").endswith("list_changed")]


async def test_server_that_never_answers_initialize(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery, answer_initialize=False)
    broker = await start_upstream(nursery, script, name="mute")
    transparent = await open_client(nursery, broker)
    error = (await transparent.initialize())["error"]
    assert error["code"] == jsonrpc.CONNECTION_CLOSED and "still starting" in error["message"]
    await trio.sleep(30)
    aggregated = await open_client(nursery, broker, servers=())
    assert "result" in await aggregated.initialize()
    response = await aggregated.request("tools/call", call("mute__anything"))
    assert "did not answer initialize within 30 s" in response["error"]["message"]
    assert broker.upstreams["mute"].statistics().restarts >= 1


async def test_client_cancellation_reaches_the_server_and_late_answer_is_dropped(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery)
    client = await open_client(nursery, await start_upstream(nursery, script))
    await client.initialize()
    await client.send(
        {"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": call("sleep", seconds=5)}
    )
    await trio.sleep(1)
    await client.send(
        jsonrpc.notification("notifications/cancelled", {"requestId": "c", "reason": "bored"})
    )
    await trio.sleep(10)  # the server answers at t=5 anyway
    upstream_id = script.requests("tools/call")[0]["id"]
    assert script.requests("notifications/cancelled")[0]["params"] == {
        "requestId": upstream_id,
        "reason": "bored",
    }
    assert (await client.request("ping", id="p")) == {"jsonrpc": "2.0", "id": "p", "result": {}}


async def test_disconnect_cancels_what_the_session_had_in_flight(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script)
    upstream = broker.upstreams["s"]
    client = await open_client(nursery, broker)
    await client.initialize()
    await client.send(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call("sleep", seconds=600)}
    )
    await trio.sleep(1)
    await client.stream.aclose()
    await trio.sleep(30)  # past the session's linger
    upstream_id = script.requests("tools/call")[0]["id"]
    cancelled = script.requests("notifications/cancelled")
    assert [m["params"]["requestId"] for m in cancelled] == [upstream_id]
    assert upstream.statistics().in_flight == 0 and upstream.statistics().sessions == 0


async def test_a_request_left_unfinished_after_the_client_closed_its_input_gets_an_error(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """(``socat``, a shim with ``--no-resume``: the input ends, the output is
    still read.) What finishes within the linger is answered; what does not
    gets an error, not silence, and is cancelled upstream."""
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script)
    client = await open_client(nursery, broker)
    await client.initialize()
    for id, seconds in ((1, 2), (2, 600)):
        params = call("sleep", seconds=seconds)
        await client.send({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    await trio.sleep(1)
    await client.stream.send_eof()  # type: ignore[attr-defined]
    with trio.fail_after(30):
        first, second = await client.receive(), await client.receive()
    assert first["id"] == 1 and "result" in first
    assert second["id"] == 2 and second["error"]["code"] == jsonrpc.CONNECTION_CLOSED
    assert "closed its input" in second["error"]["message"]
    await trio.sleep(1)
    cancelled = script.requests("notifications/cancelled")
    assert [m["params"]["requestId"] for m in cancelled] == [script.requests("tools/call")[1]["id"]]


async def test_progress_tokens_are_rewritten_per_session(nursery: trio.Nursery) -> None:
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script)
    a, b = await open_client(nursery, broker), await open_client(nursery, broker)
    await a.initialize()
    await b.initialize()
    for client in (a, b):
        params = {**call("progress"), "_meta": {"progressToken": "tok"}}
        await client.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    for client in (a, b):
        seen = [await client.receive() for _ in range(3)]
        progress = [m["params"] for m in seen if m.get("method") == "notifications/progress"]
        assert progress == [
            {"progressToken": "tok", "progress": 1, "total": 2},
            {"progressToken": "tok", "progress": 2, "total": 2},
        ]
        assert seen[-1]["id"] == 1
    upstream_tokens = {m["params"]["_meta"]["progressToken"] for m in script.requests("tools/call")}
    assert len(upstream_tokens) == 2 and "tok" not in upstream_tokens


async def test_list_changed_refreshes_the_cache_then_tells_each_session_once(
    nursery: trio.Nursery,
) -> None:
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script)
    clients = [await open_client(nursery, broker) for _ in range(2)]
    clients.append(await open_client(nursery, broker, servers=()))  # aggregated
    for client in clients:
        await client.initialize()
        await client.request("ping")  # subscribed once the session has handled this
    await trio.testing.wait_all_tasks_blocked()
    script.tools.append({"name": "new_tool", "inputSchema": {"type": "object"}})
    await script.links[0].send(jsonrpc.notification("notifications/tools/list_changed"))
    for client in clients:
        assert (await client.receive())["method"] == "notifications/tools/list_changed"
    names = [t["name"] for t in (await clients[0].request("tools/list"))["result"]["tools"]]
    assert names[-1] == "new_tool"
    names = [t["name"] for t in (await clients[2].request("tools/list"))["result"]["tools"]]
    assert names[-1] == "s__new_tool"
    # An unchanged list is not news: no notification this time.
    await script.links[0].send(jsonrpc.notification("notifications/tools/list_changed"))
    await trio.testing.wait_all_tasks_blocked()
    assert (await clients[0].request("ping", id="after"))["id"] == "after"
    assert len(script.requests("tools/list")) == 3


async def test_a_client_that_stops_reading_is_cut_off_and_others_carry_on(
    nursery: trio.Nursery,
) -> None:
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script)
    stuck = await open_client(nursery, broker, lockstep=True)
    healthy = await open_client(nursery, broker)
    await stuck.initialize()
    await healthy.initialize()
    request = ndjson.encode(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call("echo")}
    )
    with trio.fail_after(10):
        async with trio.open_nursery() as flood:

            async def flood_stuck() -> None:
                with pytest.raises((trio.BrokenResourceError, trio.ClosedResourceError)):
                    for i in range(OUTBOX_SIZE * 3):
                        await stuck.stream.send_all(
                            request.replace(b'"id":1', f'"id":{i}'.encode())
                        )

            flood.start_soon(flood_stuck)
            for i in range(200):
                assert (await healthy.request("tools/call", call("echo", i=i)))["result"][
                    "echo"
                ] == {"i": i}
    assert "outbound queue full" in (stuck.session.handle.close_reason or "")


async def test_bad_input_gets_errors_and_the_session_goes_on(nursery: trio.Nursery) -> None:
    script = ScriptedServer(nursery)
    client = await open_client(nursery, await start_upstream(nursery, script))
    await client.initialize()
    await client.stream.send_all(b"{not json\n")
    assert (await client.receive())["error"]["code"] == jsonrpc.PARSE_ERROR
    await client.stream.send_all(b"[1, 2]\n")  # a batch, but 2025-11-25 has none
    assert (await client.receive())["error"]["code"] == jsonrpc.INVALID_REQUEST
    await client.send({"jsonrpc": "2.0", "id": 3, "method": "no/such"})
    assert (await client.receive())["error"]["code"] == jsonrpc.METHOD_NOT_FOUND
    await client.stream.send_all(b'{"jsonrpc": "2.0", "id": 4, "pad": "' + b"x" * 70_000 + b'"}\n')
    answer = await client.receive()  # (in its id: it was null, and a host waited for it)
    assert answer["id"] == 4 and answer["error"]["code"] == jsonrpc.INVALID_REQUEST
    assert "too large" in answer["error"]["message"]
    await client.stream.send_all(b'{"jsonrpc": "2.0", "pad": "' + b"x" * 70_000 + b'"}\n')
    assert (await client.receive())["id"] is None  # (its ends show no id)
    assert (await client.request("tools/call", call("echo", ok=1)))["result"]["echo"] == {"ok": 1}


async def test_batches_from_2025_03_26_clients(nursery: trio.Nursery) -> None:
    script = ScriptedServer(nursery)
    client = await open_client(nursery, await start_upstream(nursery, script))
    await client.initialize("2025-03-26")
    await client.send(
        [
            {
                "jsonrpc": "2.0",
                "id": "slow",
                "method": "tools/call",
                "params": call("sleep", seconds=0.05),
            },
            {"jsonrpc": "2.0", "id": "ping", "method": "ping"},
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}},
        ]
    )
    batch = await client.receive()
    assert isinstance(batch, list)
    assert sorted(m["id"] for m in batch) == ["ping", "slow"]


TIMEOUTS = BrokerSettings(request_timeout=10, max_request_timeout=25)


async def test_a_request_that_outlives_its_timeout_is_cancelled_and_answered(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery)
    client = await open_client(
        nursery, await start_broker(nursery, {"s": script}, settings=TIMEOUTS)
    )
    await client.initialize()
    started = trio.current_time()
    response = await client.request("tools/call", call("sleep", seconds=600), id="slow")
    assert trio.current_time() - started == pytest.approx(10)
    assert response["error"]["code"] == jsonrpc.REQUEST_TIMEOUT
    assert "'s' timed out" in response["error"]["message"]
    upstream_id = script.requests("tools/call")[0]["id"]
    await trio.testing.wait_all_tasks_blocked()
    cancelled = script.requests("notifications/cancelled")
    assert cancelled[0]["params"] == {"requestId": upstream_id, "reason": "timed out"}


@pytest.mark.parametrize(("count", "outcome"), [(4, "result"), (10, "error")])
async def test_progress_restarts_the_clock_up_to_the_maximum(
    nursery: trio.Nursery, autojump_clock: Any, count: int, outcome: str
) -> None:
    script = ScriptedServer(nursery)
    client = await open_client(
        nursery, await start_broker(nursery, {"s": script}, settings=TIMEOUTS)
    )
    await client.initialize()
    params = {**call("ticks", count=count, every=5), "_meta": {"progressToken": 1}}
    started = trio.current_time()
    response = await client.request("tools/call", params, id="ticking")
    assert outcome in response  # 4 ticks 5 s apart finish at 20 s; 10 would take 50 s
    if outcome == "error":
        assert trio.current_time() - started == pytest.approx(25)  # the maximum
    assert len([m for m in client.others if m.get("method") == "notifications/progress"]) >= 4


async def test_a_flood_of_server_pings_is_answered_in_order(nursery: trio.Nursery) -> None:
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script)
    await broker.upstreams["s"].wait_ready()
    link = script.links[0]
    for i in range(500):
        await link.send({"jsonrpc": "2.0", "id": f"ping-{i}", "method": "ping"})
    with trio.fail_after(10):
        while len([m for m in script.received if str(m.get("id", "")).startswith("ping-")]) < 500:
            await trio.sleep(0.01)
    answers = [m for m in script.received if str(m.get("id", "")).startswith("ping-")]
    assert [m["id"] for m in answers] == [f"ping-{i}" for i in range(500)]
    assert all(m["result"] == {} for m in answers)


async def test_a_flood_of_list_changed_costs_few_fetches_and_one_notification(
    nursery: trio.Nursery,
) -> None:
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script)
    client = await open_client(nursery, broker)
    await client.initialize()
    await client.request("ping")
    await trio.testing.wait_all_tasks_blocked()
    fetches_before = len(script.requests("tools/list"))
    script.tools.append({"name": "late", "inputSchema": {"type": "object"}})
    note = ndjson.encode(jsonrpc.notification("notifications/tools/list_changed"))
    await script.links[0]._theirs.send_all(note * 50)  # all at once, as a flooding server
    await trio.testing.wait_all_tasks_blocked()
    # One refresh at a time, each taking in every notice that came meanwhile
    # (without coalescing this was 50 overlapping fetches).
    assert 1 <= len(script.requests("tools/list")) - fetches_before <= 25
    assert (await client.request("ping", id="after"))["id"] == "after"
    changed = [m for m in client.others if m.get("method") == "notifications/tools/list_changed"]
    assert len(changed) == 1


CANCELLED = "notifications/cancelled"


async def test_one_chunk_of_calls_and_a_cancel_reaches_the_server_in_order(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    # The session sends the calls of one read as one inbox item; a cancel in
    # the same read must still reach the server after the call it cancels.
    script = ScriptedServer(nursery)
    client = await open_client(nursery, await start_upstream(nursery, script))
    await client.initialize()
    calls = [
        {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": call("sleep", seconds=i)}
        for i in range(1, 6)
    ]
    cancel = jsonrpc.notification(CANCELLED, {"requestId": 3})
    await client.stream.send_all(b"".join(map(ndjson.encode, [*calls[:3], cancel, *calls[3:]])))
    answers = {(await client.receive())["id"] for _ in range(4)}
    assert answers == {1, 2, 4, 5}
    sent = [m for m in script.received if m.get("method") in ("tools/call", CANCELLED)]
    upstream_ids = [m["id"] for m in sent if m["method"] == "tools/call"]
    assert [m["method"] for m in sent] == ["tools/call"] * 3 + [CANCELLED] + ["tools/call"] * 2
    assert sent[3]["params"]["requestId"] == upstream_ids[2]


@pytest.mark.skipif(
    RULES == "compiled",
    reason="the compiled rules call forward_fast directly: a patch of the class cannot reach it "
    "(what is tested, the actor's containment, is the same Python in both builds)",
)
async def test_a_broker_bug_on_a_request_answers_it_and_spares_the_rest(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stand-in for a bug in the rules: forwarding one particular call raises.
    real = UpstreamProtocol.forward_fast

    def buggy(self: UpstreamProtocol, session: Any, request: Any, now: float = 0.0) -> bool:
        if (request.get("params") or {}).get("name") == "bug":
            raise RuntimeError("a bug")
        return real(self, session, request, now)

    monkeypatch.setattr(UpstreamProtocol, "forward_fast", buggy)
    client = await open_client(nursery, await start_upstream(nursery, ScriptedServer(nursery)))
    await client.initialize()
    answer = await client.request("tools/call", call("bug"), id="b")
    assert answer["error"]["code"] == jsonrpc.INTERNAL_ERROR
    assert (await client.request("tools/call", call("echo", ok=1)))["result"]["echo"] == {"ok": 1}


async def test_a_broker_bug_on_a_server_message_restarts_that_server_only(
    nursery: trio.Nursery, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = UpstreamProtocol.server_message

    def buggy(self: UpstreamProtocol, message: Any, now: float = 0.0, related: Any = None) -> Any:
        if isinstance(message, dict) and message.get("method") == "notifications/boom":
            raise RuntimeError("a bug")
        return real(self, message, now, related)

    monkeypatch.setattr(UpstreamProtocol, "server_message", buggy)
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script, name="s")
    upstream = broker.upstreams["s"]
    client = await open_client(nursery, broker)
    await client.initialize()
    await script.links[0].send(jsonrpc.notification("notifications/boom"))
    while upstream.statistics().restarts == 0:
        await trio.sleep(0.1)
    assert "internal error of the broker" in str(upstream.statistics().last_error)
    await upstream.wait_ready()
    assert script.launches == 2
    assert (await client.request("tools/call", call("echo", ok=2)))["result"]["echo"] == {"ok": 2}


async def test_a_broker_bug_while_fetching_a_catalog_settles_it_and_the_rest_goes_on(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    real = Registry._fetch

    async def buggy(self: Registry, upstream: Any, kind: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first fetch only: stand-in for a bug in reading a list
            raise RuntimeError("a bug")
        return await real(self, upstream, kind)

    monkeypatch.setattr(Registry, "_fetch", buggy)
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script)
    client = await open_client(nursery, broker)
    with trio.fail_after(5):  # nothing waits for a catalog that never settles
        assert "result" in await client.initialize()
        assert (await client.request("ping", id="p"))["id"] == "p"
        await trio.testing.wait_all_tasks_blocked()  # subscribed to list changes
        script.tools.append({"name": "new_tool", "inputSchema": {"type": "object"}})
        await script.links[0].send(jsonrpc.notification("notifications/tools/list_changed"))
        assert (await client.receive())["method"] == "notifications/tools/list_changed"
        tools = (await client.request("tools/list"))["result"]["tools"]
    assert "new_tool" in [t["name"] for t in tools]


async def test_a_catalog_fetch_answered_with_an_error_that_is_no_object_raises_a_jsonrpc_error(
    nursery: trio.Nursery,
) -> None:
    internal = InternalClient()
    await nursery.start(internal.run)

    class Server:  # answers every request with an error that is a list, not an object
        async def send(self, request: ClientRequest) -> None:
            (message,) = request.messages
            internal.handle.deliver({"jsonrpc": "2.0", "id": message["id"], "error": ["x"]})

    with trio.fail_after(5), pytest.raises(jsonrpc.JsonRpcError):
        await internal.call(Server(), "tools/list", {})  # type: ignore[arg-type]


async def test_a_request_the_servers_rules_refuse_is_answered_in_its_own_id(
    nursery: trio.Nursery,
) -> None:
    """A task of no session's, a subscribe with no uri: refused by the
    server's rules (broker/tasks.py, broker/upstream.py), which name no id;
    the actor answers in the request's. (They went out with id null: the
    client never had its answer.)"""
    script = ScriptedServer(nursery)
    script.capabilities["tasks"] = {"requests": {"tools": {"call": {}}}, "cancel": {}}
    script.capabilities["resources"] = {"subscribe": True}
    client = await open_client(nursery, await start_upstream(nursery, script), servers=("s",))
    await client.initialize()
    for id, method, params in (
        (11, "tasks/get", {"taskId": "nobodys"}),
        (12, "tasks/cancel", {"taskId": "nobodys"}),
        (13, "resources/subscribe", {}),
    ):
        with trio.fail_after(5):
            answer = await client.request(method, params, id=id)
        assert answer["id"] == id and answer["error"]["code"] == jsonrpc.INVALID_PARAMS, answer
    assert client.others == []


async def test_a_server_that_gives_the_same_cursor_again_is_listed_once(
    nursery: trio.Nursery,
) -> None:
    """Its page was stored 1000 times (every tools/list carried each tool
    1000 times); the list now ends at the cursor given before."""
    script = ScriptedServer(nursery)
    page = [{"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(100)]

    def same_cursor_again(method: str, params: dict[str, Any]) -> Any:
        if method == "tools/list":
            return {"tools": page, "nextCursor": "again"}
        return {LISTS[method][0]: []}

    script.list_answer = same_cursor_again
    client = await open_client(nursery, await start_upstream(nursery, script))
    with trio.fail_after(5):
        await client.initialize()
        tools = (await client.request("tools/list"))["result"]["tools"]
    assert [t["name"] for t in tools] == [f"t{i}" for i in range(100)]
    assert len(script.requests("tools/list")) == 2


async def test_a_refresh_that_fails_keeps_the_list_and_is_tried_again(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """One failed or malformed tools/list after a list_changed emptied the
    server's tools (every session told, every call "Unknown tool"), and
    nothing tried again. Now the last list stays, and the fetch is retried."""
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script)
    client = await open_client(nursery, broker, servers=())  # aggregated
    await client.initialize()
    await client.request("ping")
    await trio.testing.wait_all_tasks_blocked()
    before = (await client.request("tools/list"))["result"]["tools"]
    answers = [ListError("busy"), "junk"]

    def failing_twice(method: str, params: dict[str, Any]) -> Any:
        if method == "tools/list" and answers:
            return answers.pop(0)
        return {LISTS[method][0]: getattr(script, LISTS[method][1])}

    script.list_answer = failing_twice
    script.tools.append({"name": "late", "inputSchema": {"type": "object"}})
    await script.links[0].send(jsonrpc.notification("notifications/tools/list_changed"))
    while len(script.requests("tools/list")) < 2:
        await trio.sleep(0.1)
    await trio.testing.wait_all_tasks_blocked()
    assert (await client.request("tools/list"))["result"]["tools"] == before
    error = (await client.request("tools/call", call("s__late")))["error"]
    assert "could not read the tools" in error["message"]
    with trio.fail_after(60):  # (retried after 5 s, then 10 s)
        assert (await client.receive())["method"] == "notifications/tools/list_changed"
    tools = (await client.request("tools/list"))["result"]["tools"]
    assert tools == [*before, {**script.tools[-1], "name": "s__late"}]
    assert len(script.requests("tools/list")) == 4
    notes = [m for m in client.others if m.get("method") == "notifications/tools/list_changed"]
    assert notes == []  # (nothing was announced while the list could not be read)


async def test_a_list_changed_while_the_lists_are_read_is_read_after_them(
    nursery: trio.Nursery,
) -> None:
    """A server that adds a tool just after its first tools/list, while the
    broker still reads its other lists: the notification was dropped, and the
    tool never listed ("Unknown tool") until the server's next change."""
    script = ScriptedServer(nursery)
    late = {"name": "late", "inputSchema": {"type": "object"}}

    def adds_a_tool_during_the_load(method: str, params: dict[str, Any]) -> Any:
        if method == "prompts/list" and late not in script.tools:
            script.tools.append(late)
            note = jsonrpc.notification("notifications/tools/list_changed")
            nursery.start_soon(script.links[0].send, note)
        return {LISTS[method][0]: getattr(script, LISTS[method][1])}

    script.list_answer = adds_a_tool_during_the_load
    client = await open_client(nursery, await start_upstream(nursery, script))
    with trio.fail_after(5):
        await client.initialize()
        await trio.testing.wait_all_tasks_blocked()
        tools = (await client.request("tools/list"))["result"]["tools"]
    assert tools[-1] == late
    assert len(script.requests("tools/list")) == 2


async def test_a_server_back_without_a_capability_has_no_such_list_left(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """A server that restarted without prompts and resources kept its old
    ones in the catalog: listed, and routed to it."""
    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script)
    client = await open_client(nursery, broker, servers=())  # aggregated
    await client.initialize()
    assert (await client.request("prompts/list"))["result"]["prompts"] != []
    del script.capabilities["prompts"], script.capabilities["resources"]
    await client.request("tools/call", call("s__die"))
    await broker.upstreams["s"].wait_ready()
    await trio.testing.wait_all_tasks_blocked()
    assert (await client.request("prompts/list"))["result"]["prompts"] == []
    assert (await client.request("resources/list"))["result"]["resources"] == []
    assert (await client.request("resources/templates/list"))["result"]["resourceTemplates"] == []
    assert len((await client.request("tools/list"))["result"]["tools"]) == len(script.tools)
    error = (await client.request("prompts/get", {"name": "s__greet"}))["error"]
    assert error["message"] == "Unknown prompt: s__greet"
    notes = {m.get("method") for m in client.others}
    assert {"notifications/prompts/list_changed", "notifications/resources/list_changed"} <= notes


async def test_a_server_outside_a_view_that_renames_a_tool_inside_it_tells_the_session(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """Names are given over the whole catalog: server a's b__c, in its first
    lists (it came up after a__b), clashes with a__b's c, which a session
    seeing [a__b, x] listed as a__b__c; a is senior (config order at start),
    so c is renamed. It was renamed under the session without a list_changed
    (its calls to a__b__c: "Unknown tool")."""
    a, a_b, x = (
        ScriptedServer(nursery, initialize_delay=5),
        ScriptedServer(nursery),
        ScriptedServer(nursery),
    )
    a.tools = [{"name": "b__c", "inputSchema": {"type": "object"}}]
    a_b.tools = [{"name": "c", "inputSchema": {"type": "object"}}]
    broker = await start_broker(nursery, {"a": a, "a__b": a_b, "x": x})
    client = await open_client(nursery, broker, servers=("a__b", "x"))
    await client.initialize()
    names = [t["name"] for t in (await client.request("tools/list"))["result"]["tools"]]
    assert "a__b__c" in names
    with trio.fail_after(30):
        assert (await client.receive())["method"] == "notifications/tools/list_changed"
    names = [t["name"] for t in (await client.request("tools/list"))["result"]["tools"]]
    assert "a__b__c" not in names and "a__b__c-3a400f" in names


async def test_a_tool_a_server_lists_later_takes_no_name_in_use(
    nursery: trio.Nursery,
) -> None:
    """Server a (senior) registers b__c at run time (tools/list_changed):
    a__b__c, which a client calls and which reaches a__b's c, still does; a's
    new tool is the one with the suffix. It took the name: the client's next
    call ran a's tool with arguments meant for a__b's."""
    a, a_b = ScriptedServer(nursery, label="a"), ScriptedServer(nursery, label="a__b")
    a_b.tools = [{"name": "c", "inputSchema": {"type": "object"}}]
    broker = await start_broker(nursery, {"a": a, "a__b": a_b})
    client = await open_client(nursery, broker)
    await client.initialize()
    call = {"name": "a__b__c", "arguments": {}}
    assert (await client.request("tools/call", call))["result"]["server"] == "a__b"
    a.tools.append({"name": "b__c", "inputSchema": {"type": "object"}})
    await a.links[0].send(jsonrpc.notification("notifications/tools/list_changed"))
    with trio.fail_after(5):
        assert (await client.receive())["method"] == "notifications/tools/list_changed"
    tools = (await client.request("tools/list"))["result"]["tools"]
    names = [t["name"] for t in tools if t["name"].startswith("a__b__c")]
    [newcomer] = [name for name in names if name.startswith("a__b__c-")]
    assert names == [newcomer, "a__b__c"]
    assert (await client.request("tools/call", call))["result"]["server"] == "a__b"
    called = {"name": newcomer, "arguments": {}}
    assert (await client.request("tools/call", called))["result"]["server"] == "a"


async def test_a_401_the_tokens_cannot_cure_shows_in_status_and_the_log() -> None:
    """A server that answers 401 mid-session (a revoked token, a failed
    refresh): its status's last error and one log line say to run
    `mcpbroker auth NAME`, as the caller's error does; it showed "ready" alone."""
    events: list[str] = []

    class Log:
        def warning(self, event: str, **fields: Any) -> None:
            events.append(event)

        info = debug = error = warning

    async with trio.open_nursery() as nursery:
        broker = await start_upstream(nursery, ScriptedServer(nursery))
        upstream = broker.upstreams["s"]
        upstream._log = Log()
        detail = "HTTP 401 Unauthorized (it asks for authorization: run `mcpbroker auth` ...)"
        for request in (98, 99):
            upstream._failed(Failed(request, detail))
        assert "mcpbroker auth s" in (upstream.statistics().last_error or "")
        assert events.count("server.unauthorized") == 1
        nursery.cancel_scope.cancel()


async def test_a_client_the_transport_gave_up_on_is_closed_with_the_transports_reason(
    nursery: trio.Nursery,
) -> None:
    # (a Streamable HTTP session whose events pile up: actors/downstream/http.py)
    from actors.errors import NotReading

    class NotReadingConnection(StreamConnection):
        async def send(self, messages: Any) -> None:
            raise NotReading("outbound queue full: 1025 events wait: client not reading")

    broker = await start_upstream(nursery, ScriptedServer(nursery))
    ours, theirs = trio.testing.memory_stream_pair()
    connection = NotReadingConnection(theirs, SETTINGS.max_message_bytes)
    session = Session(connection, broker.upstreams, broker.registry, SETTINGS)
    nursery.start_soon(session.run)
    client = Client(ours, session)
    await client.send({"mcpbroker": {"servers": ["s"]}})
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}}
    await client.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
    with trio.fail_after(5):
        while session.handle.close_reason is None:
            await trio.sleep(0.01)
    assert session.handle.close_reason.startswith("outbound queue full")
    assert "client not reading" in session.handle.close_reason


async def test_a_flood_of_lines_that_are_not_json_rpc_is_logged_within_a_budget(
    nursery: trio.Nursery,
) -> None:
    # (100,000 debug prints on stdout were 100,000 warnings: 27 MB of log, and
    # every session stalled)
    import structlog

    from actors.stderr import BURST

    script = ScriptedServer(nursery)
    client = await open_client(nursery, await start_upstream(nursery, script))
    await client.initialize()
    garbage = "\n".join(["debug: not json"] * 3000 + ['{"jsonrpc":"2.0","id":ID,"result":{}}'])
    with structlog.testing.capture_logs() as captured:
        response = await client.request("tools/call", call("raw", line=garbage))
    assert response["result"] == {}
    logged = [entry for entry in captured if entry["event"] == "server.invalid_message"]
    assert BURST <= len(logged) < BURST + 50, len(logged)


async def test_a_server_flooding_its_stdout_with_junk_is_read_more_slowly(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """Decoding a flood of lines that are not JSON-RPC held up every other
    session (a bystander's call took 837 ms): past a budget (1 MiB at once,
    1 MiB a second after), the flooding server's reader waits, so its pipe
    fills and it waits too. A few debug prints never slow a server down."""
    from actors.upstream import JUNK_BURST, JUNK_RATE

    script = ScriptedServer(nursery)
    broker = await start_upstream(nursery, script)
    client = await open_client(nursery, broker)
    await client.initialize()
    before = trio.current_time()
    prints = "\n".join(["debug: not json"] * 100 + ['{"jsonrpc":"2.0","id":ID,"result":{}}'])
    assert (await client.request("tools/call", call("raw", line=prints)))["result"] == {}
    assert (await client.request("tools/call", call("echo", n=1)))["result"]["echo"] == {"n": 1}
    assert trio.current_time() - before < 0.1
    size = 64_000  # (48 lines, under the message limit: 3 MB, 2 MB past the burst)
    flood = "\n".join(["PAD"] * 48 + ['{"jsonrpc":"2.0","id":ID,"result":{}}'])
    before = trio.current_time()
    await client.request("tools/call", call("raw", line=flood, pad=size))
    await client.request("tools/call", call("echo", n=2))
    owed = 48 * (size + 1) - JUNK_BURST
    assert owed / JUNK_RATE - 0.3 <= trio.current_time() - before <= owed / JUNK_RATE + 0.5


async def test_a_stopping_daemon_tells_a_shim_that_asked_and_goes_on_serving_it(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """A drain refuses new requests; a client whose hello asked for the
    notice (the shim) is told instead, and what it sent before it heard is
    still served. A session that begins during the drain is decided by its
    first message (a hello asking, or anything else)."""
    from actors.daemon import STOPPING
    from broker.hello import STOPPING_NOTICE

    broker = await start_upstream(nursery, ScriptedServer(nursery))

    async def client(hello: dict[str, Any] | None, before: bool = True) -> Client:
        ours, theirs = trio.testing.memory_stream_pair()
        session = Session(
            StreamConnection(theirs, 1 << 20), broker.upstreams, broker.registry, SETTINGS
        )
        nursery.start_soon(session.run)
        if not before:
            session.daemon_stopping(STOPPING)  # (a session that begins during the drain)
        opened = Client(ours, session)
        if hello is not None:
            await opened.send({"mcpbroker": hello})
        await opened.initialize()
        if before:
            session.daemon_stopping(STOPPING)
        return opened

    asking = {"servers": ["s"], "notices": ["stopping"]}
    for told in (await client(asking), await client(asking, before=False)):
        echoed = await told.request("tools/call", call("echo", n=1))
        assert echoed["result"]["echo"] == {"n": 1}
        assert told.others == [STOPPING_NOTICE]
    for refused in (await client({"servers": ["s"]}), await client(None, before=False)):
        answer = await refused.request("tools/call", call("echo", n=1))
        assert answer["error"]["message"] == f"mcpbroker: {STOPPING}"
        assert refused.others == []


async def test_after_a_shims_bare_hello_its_host_may_send_its_own(nursery: trio.Nursery) -> None:
    """`mcpbroker connect` without servers says a hello asking only for
    notices; what its host writes first may be a hello of its own (a command,
    as `echo '{"mcpbroker":{"command":"status"}}' | mcpbroker connect` does,
    or servers), which decides: it was taken for a message, -32600."""
    broker = await start_upstream(nursery, ScriptedServer(nursery))

    async def control(command: str, servers: tuple[str, ...]) -> Any:
        return {"ran": command}

    async def client() -> Client:
        ours, theirs = trio.testing.memory_stream_pair()
        connection = StreamConnection(theirs, 1 << 20)
        session = Session(connection, broker.upstreams, broker.registry, SETTINGS, control=control)
        nursery.start_soon(session.run)
        opened = Client(ours, session)
        await opened.send({"mcpbroker": {"notices": ["stopping"]}})
        return opened

    commanded = await client()
    await commanded.send({"mcpbroker": {"command": "status"}})
    assert await commanded.receive() == {"ran": "status"}
    served = await client()
    await served.send({"mcpbroker": {"servers": ["s"]}})
    assert "result" in await served.initialize()
    assert served.session._notices == {"stopping"}  # (the shim's ask is kept)


async def test_a_401_cured_leaves_status_and_the_next_one_is_logged(
    nursery: trio.Nursery,
) -> None:
    """Status said to run `mcpbroker auth` after the user had (calls
    succeeded again), and a revocation a day later was not logged.
    (Found by review of the 401 commit.)"""
    events: list[str] = []

    class Log:
        def warning(self, event: str, **fields: Any) -> None:
            events.append(event)

        info = debug = error = exception = warning

    detail = "HTTP 401 Unauthorized (it asks for authorization: run `mcpbroker auth` ...)"
    broker = await start_upstream(nursery, ScriptedServer(nursery))
    upstream = broker.upstreams["s"]
    assert isinstance(upstream, Upstream)
    upstream._log = Log()  # type: ignore[assignment]
    client = await open_client(nursery, broker)
    await client.initialize()
    with trio.fail_after(10):
        upstream._failed(Failed(98, detail))  # (the token was revoked)
        assert "401" in (upstream.statistics().last_error or "")
        answer = await client.request("tools/call", call("echo", ok=1))  # (auth run again)
        assert answer["result"]["echo"] == {"ok": 1}
    assert upstream.statistics().last_error is None
    upstream._failed(Failed(99, detail))  # (revoked again)
    assert events.count("server.unauthorized") == 2


async def test_a_list_that_fails_again_after_a_restart_is_still_retried(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """The retry timer of the first connection's failure swallowed the new
    connection's, then did nothing (another generation): the list was never
    read again while calls said "it tries again". (Found by review.)"""
    script = ScriptedServer(nursery)
    failing = True

    def answer(method: str, params: dict[str, Any]) -> Any:
        if method == "tools/list" and failing:
            return ListError("busy")
        return {LISTS[method][0]: getattr(script, LISTS[method][1])}

    script.list_answer = answer
    broker = await start_upstream(nursery, script)
    await trio.testing.wait_all_tasks_blocked()
    assert "tools" in broker.registry.current.entry("s").unread  # (a retry due at +5 s)
    await script.links[0].die()  # (the server restarts within the 5 s)
    with trio.fail_after(60):
        while script.launches < 2 or broker.registry.current.entry("s").loading:
            await trio.sleep(0.05)
    await trio.testing.wait_all_tasks_blocked()
    assert "tools" in broker.registry.current.entry("s").unread  # (failed again)
    failing = False
    await trio.sleep(600)
    assert "tools" not in broker.registry.current.entry("s").unread


async def test_a_call_of_a_tool_past_a_cut_list_is_told_of_the_cut(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool the broker left out of a list too long was a bare "Unknown
    tool" in an aggregated view (and worked in the server's own). The cut is
    kept on the server's entry, and the call is told of it. Found by probing."""
    import functools

    import actors.registry
    from broker.listing import Lister

    monkeypatch.setattr(actors.registry, "Lister", functools.partial(Lister, max_items=2))
    scripts = {"a": ScriptedServer(nursery), "b": ScriptedServer(nursery)}
    broker = await start_broker(nursery, scripts)
    client = await open_client(nursery, broker)  # (aggregated)
    with trio.fail_after(10):
        await client.initialize()
        tools = await client.request("tools/list")
        names = [tool["name"] for tool in tools["result"]["tools"]]
        assert names == ["a__echo", "a__sleep", "b__echo", "b__sleep"]
        answer = await client.request("tools/call", call("a__raw"))
    assert broker.registry.current.entry("a").cut == {"tools": "more than 2 items"}
    assert answer["error"]["code"] == -32602
    assert "list it cut off: more than 2 items" in answer["error"]["message"]
    assert "mcpbroker connect --server a" in answer["error"]["message"]


async def test_what_a_server_never_sent_is_taken_in_order_less_what_was_withdrawn() -> None:
    """Upstream.take_unsent (a reload hands it to the server's new actor): the
    requests in its inbox, in order, without one its client cancelled and
    those of a session that left; the rest stays in the inbox for the old
    actor, which drains (an answer to what its process asked must reach it),
    and nothing is left to fail at retire()."""
    upstream = Upstream("s", ServerConfig(command="scripted"), SETTINGS)
    outbox, delivered = trio.open_memory_channel[Any](10)
    stays, leaves = (SessionHandle(outbox, trio.CancelScope()) for _ in range(2))

    def tool_call(id: int) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": call("echo")}

    await upstream.send(ClientRequest(stays, [tool_call(1), tool_call(2)], 10))
    await upstream.send(ClientRequest(leaves, [tool_call(3)], 10))
    await upstream.send(ClientRequest(stays, [tool_call(4)], 10))
    await upstream.send(ClientCancelled(stays, {"requestId": 2}))
    await upstream.send(Detach(leaves))
    unsent = upstream.take_unsent()
    assert [[m["id"] for m in item.messages] for item in unsent] == [[1], [4]]
    assert all(item.session is stays for item in unsent)
    assert upstream.statistics().inbox == 2  # (the cancellation, the departure)
    upstream.retire("was restarted by a reload of the configuration", retryable=True)
    with pytest.raises(trio.WouldBlock):
        delivered.receive_nowait()  # (nothing answered with an error)


async def test_what_take_unsent_leaves_the_old_actor_is_all_handled_in_order(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """The inbox is full and sessions wait for room when a reload takes what
    was never sent (Upstream.take_unsent): taking it out lets those waiting
    in, more than the inbox holds. Every item but the requests is still
    handled by the old actor (none dropped: an answer, a cancellation, a
    departure), in order, before what comes after."""
    script = ScriptedServer(nursery)
    upstream = Upstream("s", ServerConfig(command="scripted"), SETTINGS, launch=script.launch)
    outbox, _ = trio.open_memory_channel[Any](10)
    sessions = [SessionHandle(outbox, trio.CancelScope()) for _ in range(INBOX_SIZE + 20)]
    for session in sessions[:INBOX_SIZE]:
        await upstream.send(Attach(session, {}))
    for session in sessions[INBOX_SIZE:]:
        nursery.start_soon(upstream.send, Attach(session, {}))  # (they wait for room)
    await trio.testing.wait_all_tasks_blocked()
    assert upstream.take_unsent() == []
    with trio.fail_after(30):
        nursery.start_soon(upstream.send, Detach(sessions[-1]))  # (after them, once in)
        await trio.testing.wait_all_tasks_blocked()
        await nursery.start(upstream.run)
        await upstream.wait_ready()
        await trio.sleep(1)
    assert upstream.statistics().sessions == len(sessions) - 1
    assert (upstream.load, upstream.statistics().inbox) == (0, 0)


async def test_requests_held_for_their_turn_are_waiting_not_in_flight(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """On a gated server (serverRequests: exclusive) a second session's call
    waits for the first one's to end: it was never sent, so statistics count
    it as waiting, apart from what is in flight."""
    script = ScriptedServer(nursery)
    upstream = Upstream(
        "s",
        ServerConfig(command="scripted", server_requests="exclusive"),
        SETTINGS,
        launch=script.launch,
    )
    broker = Broker({"s": upstream})
    await nursery.start(broker.registry.run)
    await nursery.start(upstream.run)
    first, second = await open_client(nursery, broker), await open_client(nursery, broker)
    for client in (first, second):
        await client.initialize()
    await first.send(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call("sleep", seconds=5)}
    )
    await trio.sleep(1)
    await second.send(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call("echo", n=2)}
    )
    await trio.sleep(1)
    figures = upstream.statistics()
    assert (figures.in_flight, figures.waiting) == (1, 1)
    assert len(script.requests("tools/call")) == 1  # (the held one was indeed not sent)
    assert (await second.receive())["result"]["echo"] == {"n": 2}  # (after the first's 5 s)
    assert len(script.requests("tools/call")) == 2
    figures = upstream.statistics()
    assert (figures.in_flight, figures.waiting) == (0, 0)


async def slow_pair(nursery: trio.Nursery, lockstep: bool = False) -> Client:
    """A session of a ready server and one that takes 5 s to start: its
    initialize waits for both (it is deferred)."""
    scripts = {"a": ScriptedServer(nursery), "b": ScriptedServer(nursery, initialize_delay=5)}
    return await open_client(nursery, await start_broker(nursery, scripts), lockstep=lockstep)


INIT = {
    "jsonrpc": "2.0",
    "id": "i",
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}},
}


async def test_a_request_waiting_for_its_servers_holds_no_ping_up(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """While a request waits for the view's servers (up to 10 s), the session
    answers a ping at once; what else it reads waits, in order, for after."""
    client = await slow_pair(nursery)
    start = trio.current_time()
    await client.send(INIT)
    await trio.sleep(0.1)
    await client.send({"jsonrpc": "2.0", "id": "p1", "method": "ping"})
    await client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    await trio.sleep(0.1)
    await client.send({"jsonrpc": "2.0", "id": "l", "method": "tools/list"})
    await trio.sleep(0.1)
    await client.send({"jsonrpc": "2.0", "id": "p2", "method": "ping"})
    first, second = await client.receive(), await client.receive()
    assert (first["id"], second["id"]) == ("p1", "p2") and "result" in second
    assert trio.current_time() - start < 1
    initialized, listed = await client.receive(), await client.receive()
    assert (initialized["id"], listed["id"]) == ("i", "l")
    assert trio.current_time() - start >= 5  # (after b started)
    assert {tool["name"] for tool in listed["result"]["tools"]} >= {"a__echo", "b__echo"}


async def test_a_session_waits_in_vain_for_a_server_once_not_at_each_request(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """A server that does not settle within SETTLE_TIMEOUT held the session's
    initialize 10 s, then its tools/list 10 s more, its prompts/list 10 s
    more: a host's start-up took 30 s. Now the session waits for it once;
    later requests take what the catalog has. Found by probing."""
    from actors.session import SETTLE_TIMEOUT

    scripts = {"a": ScriptedServer(nursery), "b": ScriptedServer(nursery, initialize_delay=25)}
    client = await open_client(nursery, await start_broker(nursery, scripts))
    start = trio.current_time()
    await client.initialize()
    assert trio.current_time() - start == pytest.approx(SETTLE_TIMEOUT, abs=0.5)
    tools = await client.request("tools/list")
    prompts = await client.request("prompts/list")
    assert trio.current_time() - start == pytest.approx(SETTLE_TIMEOUT, abs=0.5)
    names = [tool["name"] for tool in tools["result"]["tools"]]
    assert names and all(name.startswith("a__") for name in names)  # (what there is)
    assert [prompt["name"] for prompt in prompts["result"]["prompts"]] == ["a__greet"]
    await trio.sleep(30)  # (b is serving now: its items are there, at once)
    tools = await client.request("tools/list")
    assert any(tool["name"].startswith("b__") for tool in tools["result"]["tools"])


async def test_a_request_cancelled_while_it_waits_for_its_servers_is_dropped(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    client = await slow_pair(nursery)
    await client.send(INIT)
    await trio.sleep(0.1)
    cancel = {"requestId": "i", "reason": "host gave up"}
    await client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
    await trio.sleep(0.1)
    await client.send({**INIT, "id": "i2"})
    answer = await client.receive()
    assert answer["id"] == "i2" and "result" in answer  # (and nothing for "i")
    await trio.sleep(1)
    assert client.others == [] and client.session.handle.close_reason is None


async def test_a_client_that_stops_sending_while_a_request_waits_still_gets_its_answer(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """(printf ... | mcpbroker connect: the input ends after the last request)
    The end of the client's input is read during the wait, and taken after
    it: the waiting request is answered, and what came before the end too."""
    client = await slow_pair(nursery)
    await client.send(INIT)
    await trio.sleep(0.1)
    await client.send({"jsonrpc": "2.0", "id": "p", "method": "ping"})
    await client.stream.send_eof()
    with trio.fail_after(10):
        answers = [await client.receive(), await client.receive()]
    assert [answer["id"] for answer in answers] == ["p", "i"] and "result" in answers[1]


async def test_what_a_session_reads_while_a_request_waits_is_bounded_in_bytes(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """Read on while a request waits, a session holds at most about 1 MiB
    (HELD_BYTES) for after the wait, whatever the number of messages: then
    it stops reading, and its client's writes wait (64 messages of up to
    broker.maxMessageBytes each held a gigabyte)."""
    from actors.session import HELD_BYTES, HELD_FRAMES

    client = await slow_pair(nursery, lockstep=True)
    await client.send(INIT)
    await trio.sleep(0.1)
    notice = {"jsonrpc": "2.0", "method": "notifications/x", "params": {"pad": "x" * 60_000}}
    count = HELD_BYTES // 60_000 + 1
    assert count < HELD_FRAMES  # (the bytes bound it, not the number)
    for _ in range(count):
        await client.send(notice)
    with trio.move_on_after(1) as blocked:
        await client.send(notice)
    assert blocked.cancelled_caught  # (nothing reads it: the wait is on)
    answer = await client.receive()
    assert answer["id"] == "i" and "result" in answer  # (and then it reads on)
