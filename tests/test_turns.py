"""The gate and the routing of a server's requests to clients (broker/turns.py,
broker/server_requests.py through UpstreamProtocol): never a guess."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import jsonrpc
from broker.jsonrpc import INTERNAL_ERROR, LIMIT_REACHED, METHOD_NOT_FOUND, JsonRpcError
from broker.server_requests import CAPABILITY_OF, MAX_PENDING, Route, ServerRequests, supports
from broker.states import ServerState, ServerTrigger
from broker.timeouts import TimeoutPolicy
from broker.turns import HOLDER_EXTRA
from broker.upstream import (
    HANDSHAKE_ID,
    Action,
    Deliver,
    Ready,
    SendUpstream,
    UpstreamProtocol,
    Warn,
)

A, B, C = "A", "B", "C"
EVERYTHING = {"sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {}}
INIT = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"tools": {"listChanged": True}},
    "serverInfo": {"name": "s"},
}
ROOTS_CHANGED = jsonrpc.notification("notifications/roots/list_changed")


def protocol(mode: str = "auto", **kwargs: Any) -> UpstreamProtocol:
    proto = UpstreamProtocol("s", TimeoutPolicy(5, 50), server_requests=mode, **kwargs)
    proto.server_message(jsonrpc.result_response(HANDSHAKE_ID, INIT))
    for session in (A, B, C):
        proto.attach(session, EVERYTHING)
    return proto


_ids = itertools.count(1)


def call(proto: UpstreamProtocol, session: str, now: float = 0.0) -> list[Action]:
    request = {"jsonrpc": "2.0", "id": next(_ids), "method": "tools/call", "params": {"name": "t"}}
    return proto.client_request(session, request, now)


def sent(actions: list[Action]) -> list[Any]:
    return [a.message for a in actions if isinstance(a, SendUpstream)]


def ask(proto: UpstreamProtocol, method: str = "sampling/createMessage", **params: Any) -> Any:
    message = {"jsonrpc": "2.0", "id": "srv-1", "method": method, "params": params}
    return proto.server_message(message)


def answer(proto: UpstreamProtocol, upstream_id: int) -> list[Action]:
    return proto.server_message(jsonrpc.result_response(upstream_id, {}))


# -- routing ----------------------------------------------------------------------


def test_the_one_session_at_the_server_gets_the_request() -> None:
    proto = protocol("concurrent")
    call(proto, A)
    [deliver] = ask(proto)
    assert isinstance(deliver, Deliver) and deliver.session == A
    assert deliver.message["id"] == "mcpbroker:s:1"


def test_the_request_it_belongs_to_is_named_when_the_session_has_one_there() -> None:
    """broker/related.py: a transport with a stream per request needs to know."""
    proto = protocol("concurrent")
    first = {"jsonrpc": "2.0", "id": "x", "method": "tools/call", "params": {"name": "t"}}
    proto.client_request(A, first)
    [deliver] = ask(proto)
    assert isinstance(deliver, Deliver) and deliver.related == "x"
    call(proto, A)  # two requests of A at the server now: which one asks is unknown
    [deliver] = ask(proto, "roots/list")
    assert isinstance(deliver, Deliver) and deliver.session == A and deliver.related is None


def test_two_sessions_at_the_server_means_no_one_is_picked() -> None:
    proto = protocol("concurrent")
    call(proto, A)
    call(proto, B)
    reply, warn = ask(proto)
    assert isinstance(reply, SendUpstream) and isinstance(warn, Warn)
    assert reply.message["error"]["code"] == INTERNAL_ERROR
    assert "refused, not guessed" in reply.message["error"]["message"]
    assert not proto.turns.on  # concurrent: never gated


def test_a_cause_without_the_capability_gets_nothing_and_no_one_else_does() -> None:
    proto = protocol("concurrent")
    proto.attach(B, {})  # B declared nothing; A could sample
    call(proto, B)
    reply, warn = ask(proto)
    assert isinstance(reply, SendUpstream) and isinstance(warn, Warn)
    assert reply.message["error"]["code"] == METHOD_NOT_FOUND
    assert "did not declare the 'sampling' capability" in reply.message["error"]["message"]


def test_url_elicitation_needs_the_url_capability() -> None:
    proto = protocol("concurrent")
    proto.attach(A, {"elicitation": {"form": {}}})
    call(proto, A)
    reply, _ = ask(proto, "elicitation/create", mode="url", elicitationId="e1", url="https://x")
    assert "'elicitation.url'" in reply.message["error"]["message"]


def test_no_cause_roots_are_the_roots_of_no_client() -> None:
    proto = protocol("concurrent")
    [reply] = ask(proto, "roots/list")
    assert reply == SendUpstream(jsonrpc.result_response("srv-1", {"roots": []}))
    reply, _ = ask(proto)  # sampling: an error
    assert reply.message["error"]["code"] == INTERNAL_ERROR


def test_nothing_goes_to_a_session_that_left() -> None:
    proto = protocol("concurrent")
    call(proto, A)
    proto.session_closed(A)
    [reply] = ask(proto, "roots/list")
    assert reply.message["result"] == {"roots": []}


def test_elicitation_complete_goes_to_the_session_that_got_it() -> None:
    proto = protocol("exclusive")
    call(proto, B)
    [deliver] = ask(proto, "elicitation/create", mode="url", elicitationId="e1", url="https://x")
    assert deliver.session == B
    done = jsonrpc.notification("notifications/elicitation/complete", {"elicitationId": "e1"})
    assert proto.server_message(done) == [Deliver(B, done)]
    assert proto.server_message(done) == []  # once


# -- the gate ---------------------------------------------------------------------


def test_requests_waiting_for_a_clients_answer_are_bounded() -> None:
    proto = protocol("concurrent")
    call(proto, A)
    for n in range(MAX_PENDING):
        [deliver] = proto.server_message({"jsonrpc": "2.0", "id": n, "method": "roots/list"})
        assert isinstance(deliver, Deliver) and deliver.session == A
    [refusal, warn] = proto.server_message({"jsonrpc": "2.0", "id": "x", "method": "roots/list"})
    assert isinstance(refusal, SendUpstream) and isinstance(warn, Warn)
    assert refusal.message["id"] == "x" and refusal.message["error"]["code"] == LIMIT_REACHED
    # An answer makes room for one more.
    proto.client_answer(A, {"jsonrpc": "2.0", "id": "mcpbroker:s:1", "result": {"roots": []}})
    [deliver] = proto.server_message({"jsonrpc": "2.0", "id": "y", "method": "roots/list"})
    assert isinstance(deliver, Deliver)


def test_a_request_a_client_never_answers_expires_with_the_servers_timeout() -> None:
    proto = protocol("concurrent")  # (a timeout of 5 s)
    [sent_call] = sent(call(proto, A, now=0))
    [deliver] = proto.server_message(
        {"jsonrpc": "2.0", "id": "q", "method": "sampling/createMessage", "params": {}}, now=2
    )
    asked = deliver.message["id"]
    answer(proto, sent_call["id"])  # (the call ends; the question still waits)
    assert proto.next_deadline() == 7
    assert proto.expire(now=6.9) == []
    error, cancel, warn = proto.expire(now=7)
    assert isinstance(error, SendUpstream) and error.message["id"] == "q"
    assert error.message["error"]["code"] == jsonrpc.REQUEST_TIMEOUT
    assert "did not answer sampling/createMessage within 5 s" in error.message["error"]["message"]
    assert isinstance(cancel, Deliver) and cancel.session == A
    assert cancel.message["method"] == "notifications/cancelled"
    assert cancel.message["params"]["requestId"] == asked
    assert isinstance(warn, Warn) and proto.next_deadline() is None
    # A late answer goes nowhere.
    late = {"jsonrpc": "2.0", "id": asked, "result": {}}
    assert proto.client_answer(A, late) == []


def test_url_elicitations_whose_completion_may_come_are_bounded() -> None:
    requests = ServerRequests("s")
    capable = {A: EVERYTHING}
    for n in range(MAX_PENDING + 1):
        params = {"mode": "url", "elicitationId": f"e{n}", "url": "https://x", "message": "m"}
        ask = {"jsonrpc": "2.0", "id": n, "method": "elicitation/create", "params": params}
        route = requests.route(ask, [A], capable)
        assert isinstance(route, Route)
        assert requests.answer(A, {"jsonrpc": "2.0", "id": route.message["id"], "result": {}})
    assert requests.elicitation_complete({"elicitationId": "e0"}) is None  # the oldest: forgotten
    assert requests.elicitation_complete({"elicitationId": f"e{MAX_PENDING}"}) == A


def test_auto_is_concurrent_until_the_server_asks() -> None:
    proto = protocol("auto")
    assert sent(call(proto, A)) and sent(call(proto, B))
    assert not proto.turns.on
    ask(proto)  # ambiguous: refused, and the gate is on from now on
    assert proto.turns.on
    assert call(proto, C) == []  # waits: A and B are still at the server


def test_auto_gate_with_one_session_at_the_server_gives_it_the_turn() -> None:
    proto = protocol("auto")
    a1 = sent(call(proto, A))[0]["id"]
    [deliver] = ask(proto)
    assert deliver.session == A and proto.turns.holder == A
    assert sent(call(proto, A))  # the holder goes on
    assert call(proto, B) == []  # B waits its turn
    answer(proto, a1)
    assert proto.take_released() == []  # A still has one at the server


def test_exclusive_takes_one_session_at_a_time_in_arrival_order() -> None:
    proto = protocol("exclusive")
    [a1] = sent(call(proto, A))
    assert call(proto, B) == [] and call(proto, C) == [] and call(proto, B) == []
    answer(proto, a1["id"])
    released = proto.take_released()
    assert [m["id"] for m in released] == [2, 4]  # both of B's, in order
    assert proto.turns.holder == B
    for message in released:
        answer(proto, message["id"])
    [c1] = proto.take_released()
    assert c1["id"] == 3 and proto.turns.holder == C


def test_a_held_request_cancelled_never_reaches_the_server() -> None:
    proto = protocol("exclusive")
    call(proto, A)
    request = {"jsonrpc": "2.0", "id": "b1", "method": "tools/call", "params": {"name": "t"}}
    assert proto.client_request(B, request) == []
    assert proto.client_cancelled(B, {"requestId": "b1"}) is None
    assert proto.turns.held == {} and len(proto.requests) == 1


def test_a_held_request_times_out_like_any_other_without_a_cancel_upstream() -> None:
    proto = protocol("exclusive")
    call(proto, A, now=0)
    call(proto, B, now=1)
    actions = proto.expire(now=5.5)  # A's (sent) expired, B's (held, later) not yet
    assert [type(a) for a in actions] == [SendUpstream, Deliver]
    [b1] = proto.take_released()  # the server is idle: B's turn
    actions = proto.expire(now=6.5)
    assert [type(a) for a in actions] == [SendUpstream, Deliver]  # it was sent by then
    assert actions[1].message["error"]["code"] == -32001
    call(proto, A, now=7)
    call(proto, C, now=8)
    actions = proto.expire(now=13.5)  # A's sent; C's held: an error, nothing upstream
    assert [type(a) for a in actions] == [SendUpstream, Deliver, Deliver]
    assert b1["id"] == 2
    # The one that waited says so: the server never saw it.
    sent_error, held_error = (a.message["error"]["message"] for a in actions[1:])  # type: ignore[attr-defined]
    assert "no answer or progress for 5 s" in sent_error
    assert held_error == (
        "Request 'tools/call' to MCP server 's' timed out (waited 5 s for its turn and was "
        "never sent: the server serves one client at a time (serverRequests) and another "
        "client's request was in progress)"
    )


def test_a_departing_sessions_held_requests_are_dropped_and_the_turn_passes() -> None:
    proto = protocol("exclusive")
    [a1] = sent(call(proto, A))
    call(proto, B)
    call(proto, C)
    assert proto.session_closed(B) == []  # held: nothing to cancel upstream
    assert proto.session_closed(A) == [
        jsonrpc.notification(
            "notifications/cancelled", {"requestId": a1["id"], "reason": "client disconnected"}
        )
    ]
    [c1] = proto.take_released()
    assert proto.turns.holder == C and c1["id"] == a1["id"] + 2


def test_the_holder_cannot_keep_the_turn_while_others_wait() -> None:
    proto = protocol("exclusive")
    [first] = sent(call(proto, A))
    call(proto, B)
    extra = [sent(call(proto, A)) for _ in range(HOLDER_EXTRA + 3)]
    assert all(extra[:HOLDER_EXTRA]) and not any(extra[HOLDER_EXTRA:])
    for message in [first] + [m for batch in extra for m in batch]:
        answer(proto, message["id"])
    [_] = proto.take_released()
    assert proto.turns.holder == B


def test_waiting_is_bounded() -> None:
    proto = protocol("exclusive", max_waiting=2)
    call(proto, A)
    call(proto, B)
    call(proto, B)
    request = {"jsonrpc": "2.0", "id": "c1", "method": "tools/call", "params": {"name": "t"}}
    with pytest.raises(JsonRpcError) as raised:
        proto.client_request(C, request)
    assert raised.value.code == LIMIT_REACHED
    assert raised.value.id == "c1"  # (its own id, not the upstream one it had been given)
    assert len(proto.requests) == 3  # the refused one left nothing behind


def test_waiting_is_bounded_in_bytes_too() -> None:
    proto = protocol("exclusive", max_waiting_bytes=100_000)
    call(proto, A)

    def big(id: str, size: int) -> dict[str, Any]:
        arguments = {"data": "x" * size}
        params = {"name": "t", "arguments": arguments}
        return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}

    assert proto.client_request(B, big("b1", 60_000)) == []  # held
    with pytest.raises(JsonRpcError) as raised:
        proto.client_request(B, big("b2", 60_000))
    assert raised.value.code == LIMIT_REACHED and raised.value.id == "b2"
    assert "broker.maxQueuedBytes" in raised.value.message
    assert proto.client_request(C, big("c1", 30_000)) == []  # there is room for this one
    assert len(proto.turns.held) == 2 and 90_000 < proto.turns.held_bytes <= 100_000
    assert proto.client_cancelled(B, {"requestId": "b1"}) is None
    assert proto.client_request(B, big("b3", 60_000)) == []  # room again
    proto.server_gone("exited")
    assert proto.turns.held_bytes == 0


def test_a_new_holder_is_asked_for_its_roots() -> None:
    proto = protocol("exclusive")
    [a1] = sent(call(proto, A))
    [deliver] = ask(proto, "roots/list")
    assert deliver.session == A
    call(proto, B)
    answer(proto, a1["id"])
    changed, b1 = proto.take_released()
    assert changed == ROOTS_CHANGED and b1["method"] == "tools/call"
    answer(proto, b1["id"])
    assert [m["method"] for m in sent(call(proto, B))] == ["tools/call"]  # it has B's


def test_roots_asked_with_no_cause_are_asked_again_of_the_first_caller() -> None:
    proto = protocol("auto")
    ask(proto, "roots/list")  # at start-up: no one's, so none
    assert proto.turns.on
    first = sent(call(proto, A))
    assert first[0] == ROOTS_CHANGED and first[1]["method"] == "tools/call"
    assert [m["method"] for m in sent(call(proto, A))] == ["tools/call"]


def test_a_clients_roots_change_reaches_the_server_only_if_it_has_its_roots() -> None:
    proto = protocol("exclusive")
    call(proto, A)
    ask(proto, "roots/list")
    assert proto.client_notification(A, ROOTS_CHANGED) == ROOTS_CHANGED
    assert proto.client_notification(B, ROOTS_CHANGED) is None


def test_a_restarted_server_keeps_its_gate_on() -> None:
    proto = protocol("auto")
    call(proto, A)
    ask(proto)
    proto.server_gone("exited")
    fresh = proto.restarted()
    assert fresh.turns.on and fresh.turns.held == {} and fresh.turns.holder is None


def test_a_restarted_server_is_asked_to_read_the_roots_of_the_next_holder() -> None:
    proto = protocol("exclusive")
    [a1] = sent(call(proto, A))
    [deliver] = ask(proto, "roots/list")
    assert deliver.session == A
    answer(proto, a1["id"])
    assert [m["method"] for m in sent(call(proto, A))] == ["tools/call"]  # it has A's roots
    proto.server_gone("exited")
    proto.move(ServerTrigger.BACKOFF_ELAPSED)
    proto.move(ServerTrigger.LAUNCHED)
    fresh = proto.restarted()
    fresh.server_message(jsonrpc.result_response(HANDSHAKE_ID, INIT))
    # The new process has nobody's roots: A's next call is preceded by roots changed.
    first = sent(call(fresh, A))
    assert first[0] == ROOTS_CHANGED and first[1]["method"] == "tools/call"


# -- warm-up ------------------------------------------------------------------


def warming(expected: frozenset[str] | None) -> tuple[UpstreamProtocol, str]:
    proto = UpstreamProtocol("s", warm_up=True, expected_tools=expected)
    actions = proto.server_message(jsonrpc.result_response(HANDSHAKE_ID, INIT))
    assert proto.state is ServerState.WARMING and not any(isinstance(a, Ready) for a in actions)
    listing = sent(actions)[-1]
    assert listing["method"] == "tools/list"
    return proto, listing["id"]


def tools(*names: str) -> dict[str, Any]:
    return {"tools": [{"name": name, "inputSchema": {}} for name in names]}


def test_an_instance_is_ready_once_it_offers_what_the_catalog_shows() -> None:
    proto, listing = warming(frozenset({"a", "late"}))
    assert proto.server_message(jsonrpc.result_response(listing, tools("a"))) == []
    assert proto.state is ServerState.WARMING
    changed = jsonrpc.notification("notifications/tools/list_changed")
    again = sent(proto.server_message(changed))[0]
    actions = proto.server_message(jsonrpc.result_response(again["id"], tools("a", "late")))
    assert [type(a) for a in actions] == [Ready] and proto.state is ServerState.READY


def test_a_call_for_a_tool_the_instance_lacks_names_the_server_and_the_tool() -> None:
    proto, listing = warming(frozenset({"a"}))
    proto.server_message(jsonrpc.result_response(listing, tools("a")))
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "zz"}}
    assert proto.forward_fast(A, request) is False
    with pytest.raises(JsonRpcError) as raised:
        proto.client_request(A, request)
    assert raised.value.code == -32602
    assert "'s'" in raised.value.message and "'zz'" in raised.value.message


@pytest.mark.parametrize("name", [["a"], {"a": 1}])
def test_a_call_whose_tool_name_is_no_string_is_refused_like_an_unknown_tool(name: Any) -> None:
    proto, listing = warming(frozenset({"a"}))
    proto.server_message(jsonrpc.result_response(listing, tools("a")))
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name}}
    with pytest.raises(JsonRpcError) as raised:
        proto.client_request(A, request)
    assert raised.value.code == -32602 and raised.value.id == 1
    assert "'s'" in raised.value.message


def test_warm_up_gives_up_waiting_for_missing_tools() -> None:
    proto, listing = warming(frozenset({"a", "never"}))
    proto.server_message(jsonrpc.result_response(listing, tools("a")))
    warn, ready = proto.warm_up_expired()
    assert isinstance(warn, Warn) and "never" in warn.detail and isinstance(ready, Ready)
    assert proto.warm_up_expired() == []


def test_warm_up_follows_pages_and_tolerates_a_refusal() -> None:
    proto, listing = warming(None)
    page = {**tools("a"), "nextCursor": "2"}
    [more] = sent(proto.server_message(jsonrpc.result_response(listing, page)))
    assert more["params"] == {"cursor": "2"}
    [ready] = proto.server_message(jsonrpc.result_response(more["id"], tools("b")))
    assert isinstance(ready, Ready) and proto.tools == {"a", "b"}
    proto2, listing2 = warming(frozenset({"x"}))
    refusal = jsonrpc.error_response(listing2, -32601, "no")
    assert [type(a) for a in proto2.server_message(refusal)] == [Ready]


# -- the property: a server's request reaches only the session that caused it ------


SESSIONS = ("A", "B", "C")
events = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.sampled_from(SESSIONS)),
        st.tuples(st.just("answer"), st.integers(0, 7)),
        st.tuples(
            st.just("ask"), st.integers(0, 7), st.sampled_from(sorted(CAPABILITY_OF) * 2 + ["ping"])
        ),
        st.tuples(st.just("reply"), st.integers(0, 7)),
        st.tuples(st.just("cancel"), st.sampled_from(SESSIONS), st.integers(0, 7)),
        st.tuples(st.just("leave"), st.sampled_from(SESSIONS)),
        st.tuples(st.just("wait"), st.integers(1, 4)),
    ),
    max_size=40,
)


class Model:
    """A server that asks only on behalf of a request it is working on, and the
    truth of whose request that is (the ``who`` the test wrote into it)."""

    def __init__(self, proto: UpstreamProtocol) -> None:
        self.proto = proto
        self.working: dict[int, tuple[str, int]] = {}  # upstream id -> (who, seq)
        self.seen: dict[str, int] = {}  # who -> the last seq the server received
        self.asked: dict[str, str] = {}  # client-side id -> the session it went to
        self.gone: set[str] = set()
        self.open: dict[str, list[Any]] = {s: [] for s in SESSIONS}  # client ids in flight

    def to_server(self, messages: list[Any]) -> None:
        for message in messages:
            if message.get("method") == "tools/call":
                who, seq = message["params"]["who"], message["params"]["seq"]
                assert who not in self.gone
                assert seq > self.seen.get(who, 0)  # each session's requests in order
                self.seen[who] = seq
                self.working[message["id"]] = (who, seq)
            elif message.get("method") == "notifications/cancelled":
                self.working.pop(message["params"]["requestId"], None)

    def apply(self, actions: list[Action]) -> None:
        self.to_server(sent(actions))
        self.to_server(self.proto.take_released())
        for action in actions:
            if isinstance(action, Deliver) and "method" not in action.message:
                id = action.message.get("id")
                if id in self.open[action.session]:
                    self.open[action.session].remove(id)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["auto", "exclusive", "concurrent"]), events, st.data())
def test_a_server_request_reaches_only_the_session_that_caused_it(
    mode: str, script: list[Any], data: st.DataObject
) -> None:
    proto = UpstreamProtocol("s", TimeoutPolicy(6, 60), server_requests=mode, max_waiting=8)
    proto.server_message(jsonrpc.result_response(HANDSHAKE_ID, INIT))
    capable = {s: data.draw(st.sampled_from([EVERYTHING, {}, {"roots": {}}])) for s in SESSIONS}
    for session in SESSIONS:
        proto.attach(session, capable[session])
    model = Model(proto)
    now, seq, asks = 0.0, itertools.count(1), itertools.count(1)
    for event in script:
        now += 1
        kind = event[0]
        if kind == "call" and event[1] not in model.gone:
            n = next(seq)
            request = {
                "jsonrpc": "2.0",
                "id": n,
                "method": "tools/call",
                "params": {"name": "t", "who": event[1], "seq": n},
            }
            try:
                model.apply(proto.client_request(event[1], request, now))
                model.open[event[1]].append(n)
            except JsonRpcError as exc:
                assert exc.code == LIMIT_REACHED
        elif kind == "answer" and model.working:
            upstream_id = sorted(model.working)[event[1] % len(model.working)]
            del model.working[upstream_id]
            model.apply(proto.server_message(jsonrpc.result_response(upstream_id, {})))
        elif kind == "ask":
            # The server asks on behalf of a request it is working on (or, for
            # roots/list and ping, possibly of none).
            method = event[2]
            cause = None
            if model.working:
                cause = model.working[sorted(model.working)[event[1] % len(model.working)]][0]
            elif method not in ("roots/list", "ping"):
                continue
            params = {"mode": "url", "elicitationId": "e", "url": "u"} if event[1] % 2 else {}
            message = {"jsonrpc": "2.0", "id": f"q{next(asks)}", "method": method, "params": params}
            actions = proto.server_message(message, now)
            for action in actions:
                if isinstance(action, Deliver) and action.message.get("method") in CAPABILITY_OF:
                    assert action.session == cause  # the one rule: never anyone else
                    assert action.session not in model.gone
                    model.asked[action.message["id"]] = action.session
            if (
                mode == "exclusive"
                and cause is not None
                and supports(capable[cause], method, params)
            ):
                assert isinstance(actions[0], Deliver)  # one at a time: never in doubt
            model.apply(actions)
        elif kind == "reply" and model.asked:
            id = sorted(model.asked)[event[1] % len(model.asked)]
            session = model.asked.pop(id)
            back = proto.client_response(session, jsonrpc.result_response(id, {}))
            assert back is None or back["id"].startswith("q")
        elif kind == "cancel" and model.open[event[1]]:
            client_id = model.open[event[1]].pop(event[2] % len(model.open[event[1]]))
            note = proto.client_cancelled(event[1], {"requestId": client_id})
            model.apply([SendUpstream(note)] if note else [])
        elif kind == "leave" and event[1] not in model.gone:
            model.gone.add(event[1])
            model.apply([SendUpstream(m) for m in proto.session_closed(event[1])])
            model.asked = {k: s for k, s in model.asked.items() if s != event[1]}
        elif kind == "wait":
            now += event[1]
            model.apply(proto.expire(now))
    # Liveness: answering what the server works on lets every waiting request through.
    for _ in range(100):
        if not model.working:
            break
        for upstream_id in list(model.working):
            del model.working[upstream_id]
            model.apply(proto.server_message(jsonrpc.result_response(upstream_id, {})))
    assert not proto.turns.held and len(proto.requests) == 0
