"""UpstreamProtocol at a modern server, for clients of both eras (no event loop).

A legacy client's call answered ``input_required`` becomes requests to that
client and a retry (AskingClients); a modern client's passes through; the
broker's one ``subscriptions/listen`` carries what legacy clients
subscribed to, and its notifications come out legacy.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from actors.daemon import RULES
from broker import jsonrpc
from broker.eras.upstream import REPROBE_INTERVAL
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    LOG_LEVEL_KEY,
    PROTOCOL_VERSION_KEY,
    SUBSCRIPTION_ID_KEY,
)
from broker.lifecycle import HandshakeError
from broker.states import ServerTrigger
from broker.timeouts import TimeoutPolicy
from broker.upstream import (
    HANDSHAKE_ID,
    PROBE_ID,
    Deliver,
    ListChanged,
    Ready,
    SendUpstream,
    Speak,
    UpstreamProtocol,
    Warn,
)
from broker.upstream_actions import ListenLater, Reconnect
from broker.wire.envelope import split_answer

MODERN = "2026-07-28"
CAPABILITIES = {
    "tools": {"listChanged": True},
    "resources": {"subscribe": True, "listChanged": True},
}
DISCOVERED = {"resultType": "complete", "supportedVersions": [MODERN], "capabilities": CAPABILITIES}
ASKS = {"sampling": {}, "elicitation": {"form": {}}}
QUESTION = {"method": "elicitation/create", "params": {"message": "Colour?", "mode": "form"}}


def modern_server() -> tuple[UpstreamProtocol, dict[str, Any]]:
    """A protocol whose server answered the probe modern: and its first listen."""
    proto = UpstreamProtocol("m", era="auto")
    proto.start()
    listen, ready = proto.server_message(jsonrpc.result_response(PROBE_ID, DISCOVERED))
    assert isinstance(listen, SendUpstream) and isinstance(ready, Ready)
    return proto, listen.message


def call(id: Any, name: str = "ask", **meta: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": {}}
    if meta:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}


def sent(actions: list[Any]) -> dict[str, Any]:
    """The one message sent, as the server reads it (a stamp kept as bytes decoded)."""
    (action,) = actions
    assert isinstance(action, SendUpstream)
    message: dict[str, Any] = orjson.loads(orjson.dumps(action.message))
    return message


def input_required(upstream_id: int, state: str = "s1", **questions: Any) -> dict[str, Any]:
    result = {"resultType": "input_required", "inputRequests": questions, "requestState": state}
    return jsonrpc.result_response(upstream_id, result)


# -- a legacy client's call answered input_required --------------------------------


def test_a_legacy_client_is_asked_and_its_call_sent_again_with_the_answers() -> None:
    proto, _ = modern_server()
    proto.attach("a", ASKS)
    first = sent(proto.client_request("a", call(7)))
    assert first["params"]["_meta"][CLIENT_CAPABILITIES_KEY] == ASKS  # its own, stamped
    (ask,) = proto.server_message(input_required(first["id"], colour=QUESTION))
    assert isinstance(ask, Deliver) and ask.session == "a"
    assert ask.message == {"jsonrpc": "2.0", "id": "mcpbroker:m:1", **QUESTION}
    answer = {"action": "accept", "content": {"answer": "blue"}}
    retry = sent(proto.client_answer("a", jsonrpc.result_response("mcpbroker:m:1", answer)))
    assert retry["params"]["inputResponses"] == {"colour": answer}
    assert retry["params"]["requestState"] == "s1"
    assert retry["params"]["_meta"][PROTOCOL_VERSION_KEY] == MODERN
    assert retry["id"] != first["id"]  # a new request upstream
    final = {"resultType": "complete", "content": [], "ttlMs": 0}
    (done,) = proto.server_message(jsonrpc.result_response(retry["id"], final))
    assert isinstance(done, Deliver)
    assert done.message == {"jsonrpc": "2.0", "id": 7, "result": final}  # as written
    assert proto.modern_server is not None
    assert len(proto.requests) == 0 and len(proto.modern_server.asking) == 0


def test_a_pools_instance_remembers_the_request_states_it_gives_modern_clients() -> None:
    # (A pool sends a retry to the instance that knows its state.)
    proto, _ = modern_server()
    proto.minted = {}
    proto.attach("m", {}, modern=True)
    request = call(7)
    assert proto.forward_fast("m", request)
    result = b'{"resultType":"input_required","inputRequests":{},"requestState":"blob-1"}'
    line = b'{"jsonrpc":"2.0","id":%d,"result":%s}' % (request["id"], result)
    answer = split_answer(line)
    assert answer is not None and proto.answer_fast(answer) is None  # (read: kept)
    (delivered,) = proto.server_message(orjson.loads(line))
    assert isinstance(delivered, Deliver) and delivered.message["id"] == 7
    assert proto.mints("blob-1") and not proto.mints("blob-2")
    request = call(8)
    assert proto.forward_fast("m", request)
    done = split_answer(line.replace(b"input_required", b"complete").replace(
        b'"id":%d' % (request["id"] - 1), b'"id":%d' % request["id"]))  # fmt: skip
    assert done is not None and proto.answer_fast(done) == "m"  # (others pass unread)
    fresh = proto.restarted()
    assert fresh.minted == {} and not fresh.mints("blob-1")


@pytest.mark.skipif(
    RULES == "compiled",
    reason="the compiled rules call ends_round directly: a patch of the module cannot reach it "
    "(what is tested is the same code in both builds)",
)
def test_a_pools_instance_searches_a_legacy_clients_answer_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (Its search for "input_required" reads the whole line: one is enough.)
    from broker import upstream

    searched: list[object] = []
    ends_round = upstream.ends_round
    monkeypatch.setattr(upstream, "ends_round", lambda a: searched.append(a) or ends_round(a))
    proto, _ = modern_server()
    proto.minted = {}
    proto.attach("a", {})
    request = call(7)
    assert proto.forward_fast("a", request)
    line = b'{"jsonrpc":"2.0","id":%d,"result":{"resultType":"complete"}}' % request["id"]
    answer = split_answer(line)
    assert answer is not None and proto.answer_fast(answer) == "a"
    assert searched == [answer] and answer.id == 7


def refuse(proto: UpstreamProtocol, code: int, now: float = 0.0) -> list[Any]:
    """A call of session ``a`` that the modern server refuses with ``code``."""
    request = call(7)
    assert proto.forward_fast("a", request)
    refusal = b'{"jsonrpc":"2.0","id":%d,"error":{"code":%d,"message":"Unsupported",' % (
        request["id"], code)  # fmt: skip
    refusal += b'"data":{"supported":["2025-11-25"]}}}'
    answer = split_answer(refusal)
    assert answer is not None and proto.answer_fast(answer) is None  # (read: an error)
    assert proto.response_fast(orjson.loads(refusal)) is None  # (nor taken parsed)
    return proto.server_message(orjson.loads(refusal), now)


@pytest.mark.parametrize("code", [-32022, -32020])
def test_a_modern_servers_refusal_of_the_era_names_the_server(code: int) -> None:
    # Relayed as it came, -32022 told every client the broker refused its
    # version (a legacy client never asked for 2026-07-28).
    proto, _ = modern_server()
    proto.attach("a", {})
    warn, *reopened, delivered = refuse(proto, code)
    assert isinstance(warn, Warn) and warn.event == "server.era_refused"
    assert isinstance(delivered, Deliver) and delivered.session == "a"
    error = delivered.message["error"]
    assert delivered.message["id"] == 7 and error["code"] == -32603
    assert error["message"].startswith("MCP server 'm' refused") and warn.detail == error["message"]
    data = {"server": "m", "code": code, "data": {"supported": ["2025-11-25"]}}
    if code == -32022:  # its era is found out again (below)
        data["retryable"] = True
    else:  # (-32020 is the 2026-07-28 revision's own check: the server is modern)
        assert not reopened and 'set its "era" to "legacy"' in error["message"]
    assert error["data"] == data
    assert len(proto.requests) == 0


def test_a_modern_server_refusing_the_version_is_opened_again_at_most_every_five_minutes() -> None:
    """A server found modern that refuses 2026-07-28 on a call (replaced by a
    legacy one behind its URL, a dual-era one restarted legacy-only) has its
    connection opened again, which probes its era anew; the call is told to
    call again. Not again within REPROBE_INTERVAL, across connections (a
    server that flips between eras), and the error says until when. (It was
    never probed again: every later call failed until the operator set
    its "era".)"""
    proto, _ = modern_server()
    proto.attach("a", {})
    warn, reopen, delivered = refuse(proto, -32022, now=1000.0)
    assert isinstance(reopen, Reconnect) and "find out its era" in reopen.reason
    assert isinstance(delivered, Deliver)
    assert "opens it again to find out its era; call again" in delivered.message["error"]["message"]
    # The actor ends the connection: the next one is probed (and here found
    # modern again, as a server that flips back would be).
    proto.server_gone(reopen.reason)
    fresh = proto.restarted()
    fresh.move(ServerTrigger.BACKOFF_ELAPSED)
    fresh.move(ServerTrigger.LAUNCHED)
    assert fresh.start()["method"] == "server/discover"
    fresh.server_message(jsonrpc.result_response(PROBE_ID, DISCOVERED))
    assert fresh.modern
    warn, delivered = refuse(fresh, -32022, now=1000.0 + REPROBE_INTERVAL - 60)
    assert isinstance(warn, Warn) and warn.event == "server.era_refused"
    error = delivered.message["error"]
    assert "opened again to find out its era 240 s ago, and is not before 60 s" in error["message"]
    assert 'set its "era" to "legacy"' in error["message"] and "retryable" not in error["data"]
    _, reopen, _ = refuse(fresh, -32022, now=1000.0 + REPROBE_INTERVAL)
    assert isinstance(reopen, Reconnect)


def test_a_server_configured_modern_is_not_opened_again_on_a_refusal() -> None:
    proto = UpstreamProtocol("m", era="modern")
    proto.start()
    proto.server_message(jsonrpc.result_response(PROBE_ID, DISCOVERED))
    proto.attach("a", {})
    _, delivered = refuse(proto, -32022)
    assert 'set its "era" to "legacy"' in delivered.message["error"]["message"]


@pytest.mark.parametrize("shape", ["after id", "typescript"])
def test_a_legacy_clients_call_takes_the_fast_paths_unless_it_is_asked(shape: str) -> None:
    """Forwarded without the general path (the request kept for a retry all the
    same); a final answer passes unparsed, an ``input_required`` one is left
    to the parser (and so to the bridge)."""
    proto, _ = modern_server()
    proto.attach("a", ASKS)

    def line(upstream_id: int, result: bytes) -> bytes:
        if shape == "typescript":
            return b'{"result":%s,"jsonrpc":"2.0","id":%d}' % (result, upstream_id)
        return b'{"jsonrpc":"2.0","id":%d,"result":%s}' % (upstream_id, result)

    request = call(7)
    assert proto.forward_fast("a", request)
    assert request["params"]["_meta"][CLIENT_CAPABILITIES_KEY] == ASKS  # stamped
    answer = split_answer(line(request["id"], b'{"resultType":"complete","content":[]}'))
    assert answer is not None
    assert proto.answer_fast(answer) == "a" and answer.id == 7
    assert len(proto.requests) == 0

    request = call(8)
    assert proto.forward_fast("a", request)
    asked = line(
        request["id"], b'{"resultType":"input_required","inputRequests":{},"requestState":"s"}'
    )
    answer = split_answer(asked)
    assert answer is not None and proto.answer_fast(answer) is None  # nothing changed
    assert len(proto.requests) == 1
    (ask,) = proto.server_message(
        input_required(request["id"], colour=QUESTION)
    )  # the bridge's, with the request as the client sent it
    assert isinstance(ask, Deliver) and ask.message["method"] == "elicitation/create"


def test_a_legacy_client_is_never_asked_what_it_did_not_declare() -> None:
    proto, _ = modern_server()
    proto.attach("a", {"sampling": {}})
    first = sent(proto.client_request("a", call(7)))
    (refused,) = proto.server_message(input_required(first["id"], colour=QUESTION))
    assert isinstance(refused, Deliver) and refused.message["id"] == 7
    assert refused.message["error"]["code"] == -32021
    assert refused.message["error"]["data"]["requiredCapabilities"] == {"elicitation": {}}


def test_two_legacy_clients_are_each_asked_their_own_question() -> None:
    proto, _ = modern_server()
    proto.attach("a", ASKS)
    proto.attach("b", ASKS)
    to_a = sent(proto.client_request("a", call(1)))
    to_b = sent(proto.client_request("b", call(1)))
    (ask_b,) = proto.server_message(input_required(to_b["id"], "sb", q=QUESTION))
    (ask_a,) = proto.server_message(input_required(to_a["id"], "sa", q=QUESTION))
    assert (ask_a.session, ask_b.session) == ("a", "b")  # type: ignore[union-attr]
    b_id = ask_b.message["id"]  # type: ignore[union-attr]
    # a cannot answer b's question; b's answer retries b's call only.
    assert proto.client_answer("a", jsonrpc.result_response(b_id, {})) == []
    retry = sent(proto.client_answer("b", jsonrpc.result_response(b_id, {"action": "decline"})))
    assert retry["params"]["requestState"] == "sb"


def test_cancelling_a_call_between_rounds_withdraws_its_questions() -> None:
    proto, _ = modern_server()
    proto.attach("a", ASKS)
    first = sent(proto.client_request("a", call(7)))
    proto.server_message(input_required(first["id"], q=QUESTION))
    assert proto.client_cancelled("a", {"requestId": 7}) is None  # nothing upstream
    (withdrawn,) = proto.withdraw("a", {"requestId": 7})
    assert isinstance(withdrawn, Deliver)
    assert withdrawn.message["method"] == "notifications/cancelled"
    assert withdrawn.message["params"] == {"requestId": "mcpbroker:m:1"}
    assert proto.client_answer("a", jsonrpc.result_response("mcpbroker:m:1", {})) == []


def test_a_legacy_client_that_does_not_answer_in_the_calls_timeout_fails_the_call() -> None:
    """Between rounds the call's own timeout runs: its questions are withdrawn
    and the call is answered -32001; the server has nothing of it to cancel."""
    proto = UpstreamProtocol("m", TimeoutPolicy(timeout=10.0), era="auto")
    proto.start()
    proto.server_message(jsonrpc.result_response(PROBE_ID, DISCOVERED))
    proto.attach("a", ASKS)
    first = sent(proto.client_request("a", call(7), now=0.0))
    proto.server_message(input_required(first["id"], q=QUESTION), now=3.0)
    assert proto.next_deadline() == 13.0  # (the request itself is answered)
    assert proto.expire(12.9) == []
    withdrawn, failed = proto.expire(13.0)
    assert isinstance(withdrawn, Deliver) and withdrawn.session == "a"
    assert withdrawn.message == jsonrpc.notification(
        "notifications/cancelled", {"requestId": "mcpbroker:m:1"}
    )
    assert isinstance(failed, Deliver) and failed.message["id"] == 7
    assert failed.message["error"]["code"] == jsonrpc.REQUEST_TIMEOUT
    assert "within 10 s" in failed.message["error"]["message"]
    assert (
        proto.next_deadline() is None
        and proto.modern_server is not None
        and len(proto.modern_server.asking) == 0
    )
    assert proto.client_answer("a", jsonrpc.result_response("mcpbroker:m:1", {})) == []


def test_a_server_gone_while_its_clients_answer_fails_their_calls() -> None:
    proto, _ = modern_server()
    proto.attach("a", ASKS)
    first = sent(proto.client_request("a", call(7)))
    proto.server_message(input_required(first["id"], q=QUESTION))
    withdrawn, failed = proto.server_gone("exited")
    assert withdrawn.message["method"] == "notifications/cancelled"
    assert failed.message["id"] == 7 and failed.message["error"]["code"] == -32000
    # (retryable as every request in flight there: it lacked the key)
    assert failed.message["error"]["data"] == {"server": "m", "retryable": True}


def test_a_modern_clients_call_passes_through_with_its_own_meta() -> None:
    proto, _ = modern_server()
    proto.attach("m", {}, modern=True)
    own = {PROTOCOL_VERSION_KEY: MODERN, CLIENT_CAPABILITIES_KEY: {"roots": {}}}
    request = call("c1", **own)
    assert proto.forward_fast("m", request)  # (no note: the fast path)
    assert request["params"]["_meta"] == own  # not stamped over
    answer = input_required(request["id"], q=QUESTION)
    assert proto.response_fast(answer) == "m"  # as it is, for the client to retry
    assert answer["result"]["resultType"] == "input_required"


@pytest.mark.parametrize("modern_client", [True, False])
def test_a_legacy_server_gets_no_modern_keys_from_any_client(modern_client: bool) -> None:
    # (A legacy client's modern keys too: the promise is the server's, and an
    # HTTP link would take such a request for a modern one, docs/eras.md.)
    proto = UpstreamProtocol("old")
    proto.start()
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "o"}}
    proto.server_message(jsonrpc.result_response(HANDSHAKE_ID, init))
    proto.attach("m", {}, modern=modern_client)
    request = call("c1", **{PROTOCOL_VERSION_KEY: MODERN, CLIENT_CAPABILITIES_KEY: {},
                            LOG_LEVEL_KEY: "info", "progressToken": 3})  # fmt: skip
    assert proto.forward_fast("m", request)
    assert request["params"]["_meta"] == {"progressToken": request["id"]}


# -- the broker's listen ------------------------------------------------------------


def test_the_listen_carries_every_list_and_the_subscribed_uris() -> None:
    proto, listen = modern_server()
    assert listen["method"] == "subscriptions/listen"
    assert listen["params"]["notifications"] == {
        "toolsListChanged": True, "resourcesListChanged": True}  # fmt: skip
    proto.attach("a", {})
    proto.attach("b", {})
    subscribe = {"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe",
                 "params": {"uri": "f:///x"}}  # fmt: skip
    cancel, again, done = proto.client_request("a", subscribe)
    assert isinstance(cancel, SendUpstream) and isinstance(again, SendUpstream)
    assert cancel.message["params"]["requestId"] == listen["id"]
    assert again.message["params"]["notifications"]["resourceSubscriptions"] == ["f:///x"]
    assert isinstance(done, Deliver) and done.message == jsonrpc.result_response(1, {})
    (done,) = proto.client_request("b", {**subscribe, "id": 2})  # (already in the filter)
    stream = again.message["id"]
    ack = {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
           "params": {"_meta": {SUBSCRIPTION_ID_KEY: stream},
                      "notifications": again.message["params"]["notifications"]}}  # fmt: skip
    assert proto.server_message(ack) == []
    updated = {"jsonrpc": "2.0", "method": "notifications/resources/updated",
               "params": {"uri": "f:///x", "_meta": {SUBSCRIPTION_ID_KEY: stream}}}  # fmt: skip
    delivered = proto.server_message(updated)
    assert sorted(d.session for d in delivered) == ["a", "b"]  # type: ignore[union-attr]
    assert delivered[0].message["params"] == {"uri": "f:///x"}  # type: ignore[union-attr]
    old = {**updated, "params": {"uri": "f:///x", "_meta": {SUBSCRIPTION_ID_KEY: listen["id"]}}}
    assert proto.server_message(old) == []  # the replaced stream's straggler
    changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
               "params": {"_meta": {SUBSCRIPTION_ID_KEY: stream}}}  # fmt: skip
    (told,) = proto.server_message(changed)
    assert isinstance(told, ListChanged)
    # The last subscriber gone: the listen goes back to the lists only.
    # (Make before break: the acknowledged stream goes on until the new one's
    # acknowledgement, then it is cancelled.)
    proto.session_closed("a")
    (listen_again,) = proto.session_closed("b")
    assert listen_again["method"] == "subscriptions/listen"
    assert "resourceSubscriptions" not in listen_again["params"]["notifications"]
    assert len(proto.server_message(changed)) == 1  # (the old stream still carries)
    lists = listen_again["params"]["notifications"]
    new_ack = {**ack, "params": {"_meta": {SUBSCRIPTION_ID_KEY: listen_again["id"]},
                                 "notifications": lists}}  # fmt: skip
    (retire,) = proto.server_message(new_ack)
    assert isinstance(retire, SendUpstream)
    assert retire.message["method"] == "notifications/cancelled"
    assert retire.message["params"]["requestId"] == stream
    assert proto.server_message(changed) == []  # (the old stream's straggler)


def test_a_stream_ended_is_opened_again_and_its_lists_fetched_again() -> None:
    proto, listen = modern_server()
    again, tools, resources = proto.server_message(jsonrpc.result_response(listen["id"], {}))
    assert isinstance(again, SendUpstream)
    assert again.message["method"] == "subscriptions/listen"
    assert again.message["id"] != listen["id"]
    assert isinstance(tools, ListChanged) and isinstance(resources, ListChanged)
    assert {tools.message["method"], resources.message["method"]} == {
        "notifications/tools/list_changed", "notifications/resources/list_changed"}  # fmt: skip
    refused = jsonrpc.error_response(again.message["id"], -32603, "Subscription limit reached")
    (warn,) = proto.server_message(refused)
    assert isinstance(warn, Warn) and "Subscription limit reached" in warn.detail


def test_a_stream_the_server_ends_again_and_again_is_opened_again_later_each_time() -> None:
    """Ended within LISTEN_SETTLE of its opening, again: the next listen
    waits 0.5 s, then twice as long each time (up to 30 s), the lists it
    missed fetched with it; one that lasted opens again at once. (A server
    that ended every listen at once had the broker listen, and list its
    tools, hundreds of times a second.)"""
    proto, listen = modern_server()
    now, delays = 100.0, []
    for _ in range(9):
        actions = proto.server_message(jsonrpc.result_response(listen["id"], {}), now)
        if isinstance(actions[0], ListenLater):
            (later,) = actions
            delays.append(later.delay)
            now += later.delay
            assert proto.modern_server is not None
            actions = proto.modern_server.listen_now()
        again, *changed = actions
        assert isinstance(again, SendUpstream) and again.message["method"] == "subscriptions/listen"
        assert [type(c) for c in changed] == [ListChanged, ListChanged]  # (what it missed)
        listen = again.message
        now += 0.1  # (it ends 0.1 s after it opened)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    lasted = proto.server_message(jsonrpc.result_response(listen["id"], {}), now + 60)
    assert isinstance(lasted[0], SendUpstream)  # (it lasted a minute: at once)


def test_a_listen_the_link_lost_is_opened_again_only_if_it_had_worked() -> None:
    proto, listen = modern_server()
    assert proto.listen_failed(42, "HTTP 500") is None  # (not the listen's)
    # Lost before its acknowledgement: taken as refused, not asked again.
    (warn,) = proto.listen_failed(listen["id"], "HTTP 500")  # type: ignore[misc]
    assert isinstance(warn, Warn) and "HTTP 500" in warn.detail
    proto, listen = modern_server()
    ack = {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
           "params": {"_meta": {SUBSCRIPTION_ID_KEY: listen["id"]},
                      "notifications": listen["params"]["notifications"]}}  # fmt: skip
    proto.server_message(ack)
    lost = proto.listen_failed(listen["id"], "connection reset")
    assert lost is not None
    warn, again, *changed = lost
    assert isinstance(again, SendUpstream) and again.message["method"] == "subscriptions/listen"
    assert [type(c) for c in changed] == [ListChanged, ListChanged]


def test_a_server_without_subscriptions_refuses_a_subscribe() -> None:
    proto = UpstreamProtocol("m", era="auto")
    proto.start()
    bare = {**DISCOVERED, "capabilities": {"resources": {}}}
    (ready,) = proto.server_message(jsonrpc.result_response(PROBE_ID, bare))  # (no listen)
    assert isinstance(ready, Ready)
    proto.attach("a", {})
    subscribe = {"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe",
                 "params": {"uri": "f:///x"}}  # fmt: skip
    with pytest.raises(jsonrpc.JsonRpcError, match="takes no resource subscriptions"):
        proto.client_request("a", subscribe)


def test_a_modern_servers_log_messages_go_to_sessions_whose_requests_asked() -> None:
    proto, _ = modern_server()
    for session in ("quiet", "chatty", "idle"):
        proto.attach(session, {})
    proto.client_log_level("chatty", "info")
    proto.client_log_level("idle", "info")
    proto.client_request("quiet", call(1))
    proto.client_request("chatty", call(1))
    log = {"jsonrpc": "2.0", "method": "notifications/message",
           "params": {"level": "warning", "data": "x"}}  # fmt: skip
    (delivered,) = proto.server_message(log)
    assert isinstance(delivered, Deliver) and delivered.session == "chatty"


# -- opening: a modern-only server under "era": "legacy" -----------------------------


def test_a_server_refusing_initialize_with_modern_versions_is_opened_modern() -> None:
    proto = UpstreamProtocol("m")  # "era": "legacy", the default
    assert proto.start()["method"] == "initialize" and proto.speaking is None
    refusal = jsonrpc.error_response(
        HANDSHAKE_ID, -32022, "no handshake", data={"supported": [MODERN]}
    )
    speak, *actions = proto.server_message(refusal)
    assert speak == Speak(MODERN)  # the link goes modern before the probe
    probe = sent(actions)
    assert probe["method"] == "server/discover" and probe["id"] == PROBE_ID
    listen, ready = proto.server_message(jsonrpc.result_response(PROBE_ID, DISCOVERED))
    assert isinstance(ready, Ready) and proto.modern
    assert isinstance(listen, SendUpstream)  # (what its sessions want: the lists)


def test_a_server_refusing_initialize_otherwise_fails_its_handshake() -> None:
    proto = UpstreamProtocol("m")
    proto.start()
    refusal = jsonrpc.error_response(HANDSHAKE_ID, -32600, "no")
    with pytest.raises(HandshakeError):
        proto.server_message(refusal)
    proto = UpstreamProtocol("m")
    proto.start()
    refusal = jsonrpc.error_response(
        HANDSHAKE_ID, -32022, "no handshake", data={"supported": [MODERN]}
    )
    proto.server_message(refusal)
    with pytest.raises(HandshakeError, match="not modern"):
        proto.server_message(jsonrpc.error_response(PROBE_ID, -32601, "no discover either"))


# -- a tool that asks the legacy way, at a modern server ---------------------------

NO_BACK_CHANNEL = (
    "Cannot send 'elicitation/create': this transport context has no back-channel "
    "for server-initiated requests."
)


def test_a_refused_back_channel_is_left_to_the_parser_and_warned_of_once() -> None:
    """The SDK refuses ``ctx.elicit`` in the modern era: the legacy client
    gets the server's error as written, and the operator one warning naming
    the setting (docs/eras.md); a plain error is no such sign."""
    proto, _ = modern_server()
    proto.attach("a", ASKS)
    warned: list[Warn] = []
    for id, text in [(1, "plain failure"), (2, NO_BACK_CHANNEL), (3, NO_BACK_CHANNEL)]:
        upstream_id = sent(proto.client_request("a", call(id)))["id"]
        error = jsonrpc.error_response(upstream_id, -32600, text)
        answer = split_answer(jsonrpc.encode(error))
        assert answer is not None
        if text == NO_BACK_CHANNEL:
            assert proto.answer_fast(answer) is None  # (nothing changed: parse it)
        else:
            assert proto.answer_fast(answer) == "a"
            continue
        actions = proto.server_message(error)
        assert actions[-1] == Deliver("a", jsonrpc.error_response(id, -32600, text))
        warned += [a for a in actions if isinstance(a, Warn)]
    (warning,) = warned
    assert warning.event == "server.needs_legacy_era" and '"era": "legacy"' in warning.detail
    assert len(proto.requests) == 0


@pytest.mark.parametrize("shape", ["after id", "typescript"])
def test_only_an_error_is_searched_for_the_refusal(shape: str) -> None:
    """A final result that merely says the words passes unparsed; an error
    that says them is left to the parser, in either shape of answer."""
    proto, _ = modern_server()
    proto.attach("a", ASKS)

    def line(upstream_id: int, key: bytes, value: bytes) -> bytes:
        if shape == "typescript":
            return b'{"%s":%s,"jsonrpc":"2.0","id":%d}' % (key, value, upstream_id)
        return b'{"jsonrpc":"2.0","id":%d,"%s":%s}' % (upstream_id, key, value)

    text = NO_BACK_CHANNEL.encode()
    result = b'{"content":[{"type":"text","text":"%s"}]}' % text
    error = b'{"code":-32600,"message":"%s"}' % text
    for id, key, value, fast in [(1, b"result", result, True), (2, b"error", error, False)]:
        upstream_id = sent(proto.client_request("a", call(id)))["id"]
        answer = split_answer(line(upstream_id, key, value))
        assert answer is not None and answer.is_error() is (key == b"error")
        assert (proto.answer_fast(answer) == "a") is fast


def test_a_fast_call_asked_keeps_the_clients_progress_token_for_its_retry() -> None:
    """The request kept for the retry is the client's: its progressToken as
    the client sent it, not the one rewritten for the first try upstream."""
    proto, _ = modern_server()
    proto.attach("a", ASKS)
    request = call(7, progressToken="p")
    assert proto.forward_fast("a", request)
    assert request["params"]["_meta"]["progressToken"] == request["id"]  # rewritten upstream
    (ask,) = proto.server_message(input_required(request["id"], colour=QUESTION))
    assert isinstance(ask, Deliver)
    answer = jsonrpc.result_response(ask.message["id"], {"action": "accept", "content": {}})
    retry = sent(proto.client_answer("a", answer))
    assert retry["params"]["name"] == "ask" and retry["params"]["arguments"] == {}
    token = retry["params"]["_meta"]["progressToken"]
    assert token == retry["id"] != request["id"]
    progress = {"progressToken": token, "progress": 1}
    (delivered,) = proto.server_message(jsonrpc.notification("notifications/progress", progress))
    assert isinstance(delivered, Deliver) and delivered.session == "a"
    assert delivered.message["params"]["progressToken"] == "p"


def test_a_modern_servers_questions_and_its_own_requests_never_share_an_id() -> None:
    """A server opened modern that also sends a request of the legacy kind
    (roots/list, outside the 2026-07-28 spec, routed all the same): its id
    and those of its input_required questions come from one sequence. They
    came from two, both from mcpbroker:m:1, so the client had two requests
    of one id, and its answer to the second was taken for the first's."""
    proto, _ = modern_server()
    proto.attach("a", {**ASKS, "roots": {}})
    first = sent(proto.client_request("a", call(7)))
    (ask,) = proto.server_message(input_required(first["id"], colour=QUESTION))
    assert isinstance(ask, Deliver) and ask.session == "a"
    sent(proto.client_request("a", call(8)))  # (in flight: the request's cause)
    roots = {"jsonrpc": "2.0", "id": 99, "method": "roots/list"}
    (request,) = proto.server_message(roots)
    assert isinstance(request, Deliver) and request.session == "a"
    assert request.message["method"] == "roots/list"
    assert request.message["id"] != ask.message["id"]
    # Each answer reaches what asked it: the roots go to the server's request.
    (answered,) = proto.client_answer(
        "a", jsonrpc.result_response(request.message["id"], {"roots": []})
    )
    assert sent([answered]) == {"jsonrpc": "2.0", "id": 99, "result": {"roots": []}}
    assert proto.modern_server is not None and len(proto.modern_server.asking) == 1
