"""The bridge's deadlines, in the actors, on trio's autojump clock.

A modern client's call that a legacy server asked a question in is parked
until the client's retry: the Session actor gives it up past
``broker.inputTimeout`` (the server's question answered with an error, the
call cancelled upstream, the late retry told why). A legacy client asked a
modern server's questions has the call's own timeout to answer them: the
Upstream actor then withdraws them and answers the call -32001.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing

from actors.upstream import Upstream
from broker import jsonrpc
from broker.config import BrokerSettings, ServerConfig
from broker.eras.versions import CLIENT_CAPABILITIES_KEY, LOG_LEVEL_KEY, PROTOCOL_VERSION_KEY
from tests.scripted import ScriptedServer
from tests.test_actors import Broker, open_client, start_broker

MODERN = "2026-07-28"
FORM = {"mode": "form", "message": "Colour?", "requestedSchema": {"type": "object"}}
QUESTION = {"jsonrpc": "2.0", "id": "q1", "method": "elicitation/create", "params": FORM}
SETTINGS = BrokerSettings(max_message_bytes=64 * 1024, input_timeout=30.0)


def modern_call(id: Any, arguments: dict[str, Any], **params: Any) -> dict[str, Any]:
    meta = {PROTOCOL_VERSION_KEY: MODERN, CLIENT_CAPABILITIES_KEY: {"elicitation": {}}}
    params = {"name": "raw", "arguments": arguments, "_meta": meta, **params}
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}


async def listed(client: Any) -> None:
    """Once the catalog is in (the broker's own fetches are no longer at the
    server: a question is then the one caller's, docs/rules/server-requests.md)."""
    meta = {PROTOCOL_VERSION_KEY: MODERN, CLIENT_CAPABILITIES_KEY: {}}
    answer = await client.request("tools/list", {"_meta": meta}, id="list")
    assert "result" in answer


async def test_a_parked_call_whose_client_never_comes_back_is_given_up(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    with trio.fail_after(600):  # (virtual time: a hang fails)
        script = ScriptedServer(nursery)
        broker = await start_broker(nursery, {"s": script}, settings=SETTINGS)
        client = await open_client(nursery, broker, settings=SETTINGS)
        await listed(client)
        # The server asks its client a question in the middle of the call (and
        # answers the call only when told: never, here).
        ask = {"line": orjson.dumps(QUESTION).decode()}
        await client.send(modern_call(1, ask))
        parked = await client.receive()
        assert parked["id"] == 1 and parked["result"]["resultType"] == "input_required"
        state = parked["result"]["requestState"]
        (call,) = script.requests("tools/call")

        await trio.sleep(29)
        assert script.requests("notifications/cancelled") == []
        assert not [m for m in script.received if m.get("id") == "q1"]
        await trio.sleep(2)
        # The server's question got an error (it is not left waiting), the call
        # was cancelled, both at inputTimeout: not at the request timeout (300 s).
        (answer,) = [m for m in script.received if m.get("id") == "q1"]
        assert answer["error"]["code"] == jsonrpc.INTERNAL_ERROR
        assert "within 30 s" in answer["error"]["message"]
        (cancelled,) = script.requests("notifications/cancelled")
        assert cancelled["params"]["requestId"] == call["id"]
        assert not client.session.busy  # nothing of it is in flight any more

        # The client's retry, too late, is told so; the server hears nothing of it.
        late = await client.request("tools/call", modern_call(2, {}, requestState=state,
            inputResponses={"elicitation-1": {"action": "accept"}})["params"], id=2)  # fmt: skip
        assert late["error"]["code"] == jsonrpc.INVALID_PARAMS
        assert "requestState expired: no retry came within 30 s" in late["error"]["message"]
        assert len(script.requests("tools/call")) == 1


async def test_a_retry_in_time_gets_the_calls_answer(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """The clock stops at the retry: the call's answer after inputTimeout
    still reaches the client (it came back in time)."""
    with trio.fail_after(600):  # (virtual time: a hang fails)
        script = ScriptedServer(nursery)
        broker = await start_broker(nursery, {"s": script}, settings=SETTINGS)
        client = await open_client(nursery, broker, settings=SETTINGS)
        await listed(client)
        arguments = {"line": orjson.dumps(QUESTION).decode()}
        await client.send(modern_call(1, arguments))
        parked = await client.receive()
        await trio.sleep(20)
        retry = modern_call(2, arguments, requestState=parked["result"]["requestState"],
                            inputResponses={"elicitation-1": {"action": "decline"}})  # fmt: skip
        await client.send(retry)
        await trio.testing.wait_all_tasks_blocked()
        (answer,) = [m for m in script.received if m.get("id") == "q1"]
        assert answer["result"] == {"action": "decline"}
        await trio.sleep(60)  # past the deadline the call had while parked
        assert script.requests("notifications/cancelled") == []
        (call,) = script.requests("tools/call")
        await script.links[0].send(jsonrpc.result_response(call["id"], {"content": []}))
        done = await client.receive()
        assert done == {
            "jsonrpc": "2.0",
            "id": 2,
            "result": {"content": [], "resultType": "complete"},
        }


async def test_a_reload_sets_the_input_timeout_of_calls_parked_from_then_on(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    with trio.fail_after(600):
        script = ScriptedServer(nursery)
        broker = await start_broker(nursery, {"s": script}, settings=SETTINGS)
        client = await open_client(nursery, broker, settings=SETTINGS)
        await listed(client)  # (a modern session from here on)
        client.session.reconfigure(attrs.evolve(SETTINGS, input_timeout=5.0))
        await client.send(modern_call(1, {"line": orjson.dumps(QUESTION).decode()}))
        await client.receive()
        await trio.sleep(4.5)
        assert script.requests("notifications/cancelled") == []
        await trio.sleep(1)
        assert len(script.requests("notifications/cancelled")) == 1


TIMEOUTS = BrokerSettings(max_message_bytes=64 * 1024, request_timeout=10, max_request_timeout=25)


async def start_modern_server(nursery: trio.Nursery, script: ScriptedServer) -> Broker:
    config = ServerConfig(command="scripted", era="modern")
    upstreams = {"m": Upstream("m", config, TIMEOUTS, launch=script.launch)}
    broker = Broker(upstreams)
    await nursery.start(broker.registry.run)
    await nursery.start(upstreams["m"].run)
    return broker


@pytest.mark.parametrize("answers", [False, True])
async def test_a_legacy_client_has_the_calls_timeout_to_answer_a_modern_servers_questions(
    nursery: trio.Nursery, autojump_clock: Any, answers: bool
) -> None:
    with trio.fail_after(600):  # (virtual time: a hang fails)
        script = ScriptedServer(nursery, modern=True)
        broker = await start_modern_server(nursery, script)

        client = await open_client(nursery, broker, settings=TIMEOUTS)
        params = {"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
                  "clientInfo": {"name": "t"}}  # fmt: skip
        await client.request("initialize", params)
        await client.send(jsonrpc.notification("notifications/initialized"))
        assert "result" in await client.request("tools/list")
        questions = {"q": {"method": "elicitation/create", "params": FORM}}
        required = {"resultType": "input_required", "requestState": "st",
                    "inputRequests": questions}  # fmt: skip
        line = '{"jsonrpc":"2.0","id":ID,"result":' + orjson.dumps(required).decode() + "}"
        await client.send(
            {
                "jsonrpc": "2.0",
                "id": "c",
                "method": "tools/call",
                "params": {"name": "raw", "arguments": {"line": line}},
            }
        )
        asked = await client.receive()
        assert asked["method"] == "elicitation/create" and asked["id"] == "mcpbroker:m:1"
        asked_at = trio.current_time()
        if answers:  # in time: the call goes up again with the answer, as ever
            await trio.sleep(9)
            await client.send(jsonrpc.result_response(asked["id"], {"action": "decline"}))
            await trio.testing.wait_all_tasks_blocked()
            again = script.requests("tools/call")[-1]
            assert again["params"]["inputResponses"] == {"q": {"action": "decline"}}
            return
        withdrawn = await client.receive()
        assert withdrawn == jsonrpc.notification("notifications/cancelled",
                                                 {"requestId": "mcpbroker:m:1"})  # fmt: skip
        failed = await client.receive()
        assert trio.current_time() - asked_at == pytest.approx(10)
        assert failed["id"] == "c" and failed["error"]["code"] == jsonrpc.REQUEST_TIMEOUT
        assert "did not answer the server's questions within 10 s" in failed["error"]["message"]
        assert len(script.requests("tools/call")) == 1  # nothing went up again
        # A late answer is dropped (nothing goes to the server).
        await client.send(jsonrpc.result_response(asked["id"], {"action": "accept"}))
        await trio.sleep(1)
        assert len(script.requests("tools/call")) == 1


async def test_a_level_a_modern_request_asked_for_is_lowered_at_the_server_once_it_ends(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """A legacy client asks for warnings, a modern one's call for debug: the
    server logs at debug for that call, then at warning again. (The actor
    told the servers nothing when an answer lowered a session's level.)"""
    with trio.fail_after(60):
        script = ScriptedServer(nursery)
        script.capabilities["logging"] = {}
        broker = await start_broker(nursery, {"s": script}, settings=SETTINGS)
        legacy = await open_client(nursery, broker, settings=SETTINGS)
        await legacy.initialize()
        assert "result" in await legacy.request("logging/setLevel", {"level": "warning"})
        modern = await open_client(nursery, broker, settings=SETTINGS)
        meta = {PROTOCOL_VERSION_KEY: MODERN, CLIENT_CAPABILITIES_KEY: {}, LOG_LEVEL_KEY: "debug"}
        params = {"name": "echo", "arguments": {}, "_meta": meta}
        assert "result" in await modern.request("tools/call", params, id=1)
        await trio.sleep(1)
        levels = [m["params"]["level"] for m in script.requests("logging/setLevel")]
        assert levels == ["warning", "debug", "warning"]
