"""The bridge between the eras (broker/eras/bridge.py, tokens.py), h11 style."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.eras.bridge import (
    AnswerClient,
    AnsweringServers,
    AskClient,
    AskingClients,
    CancelCall,
    Finish,
    Rebind,
    SendServer,
    ends_round,
    legacy_params,
    modern_params,
)
from broker.eras.tokens import RequestStates, TooManyStates, is_ours
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LOG_LEVEL_KEY,
    PROTOCOL_VERSION_KEY,
)
from broker.requestmap import InputRound, RequestMap
from broker.wire.envelope import split_answer

KEY = b"k" * 32
ELICIT = {"method": "elicitation/create", "params": {"mode": "form", "message": "name?"}}
SAMPLE = {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}}
CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "greet"}}
BOTH = {"elicitation": {}, "sampling": {}}


def result(id: Any, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "result": value}


def error(id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}


# -- single messages across the eras ------------------------------------------


def test_a_modern_request_loses_its_modern_meta_for_a_legacy_server() -> None:
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "x",
            "_meta": {
                PROTOCOL_VERSION_KEY: "2026-07-28",
                CLIENT_CAPABILITIES_KEY: {},
                CLIENT_INFO_KEY: {"name": "c"},
                LOG_LEVEL_KEY: "debug",
                "progressToken": "p",
            },
        },
    }
    assert legacy_params(request["params"]) == {"name": "x", "_meta": {"progressToken": "p"}}
    bare = {"name": "x", "_meta": {PROTOCOL_VERSION_KEY: "2026-07-28"}}
    assert legacy_params(bare) == {"name": "x"}
    # A _meta a modern session remembered, kept as the client's bytes: the
    # modern keys alone (broker/eras/metacache.py), dropped whole.
    remembered = {"name": "x", "_meta": orjson.Fragment(b'{"a":1}')}
    assert legacy_params(remembered) == {"name": "x"}
    assert "_meta" in remembered  # (a copy)


MODERN_KEYS = [PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY, CLIENT_INFO_KEY, LOG_LEVEL_KEY]


META_KEYS = st.sampled_from([*MODERN_KEYS, "progressToken", "x"])


@given(st.dictionaries(META_KEYS, st.integers(), max_size=6), st.booleans())
def test_the_upstreams_params_strip_leaves_all_but_the_modern_keys_and_changes_nothing(
    meta: dict[str, Any], has_meta: bool
) -> None:
    """legacy_params (the Upstream's per-call strip) copies, never changes
    what the session holds, and keeps every key that is not a modern one."""
    params: dict[str, Any] = {"name": "x", "_meta": meta} if has_meta else {"name": "x"}
    before = {**params, "_meta": dict(meta)} if has_meta else dict(params)
    stripped = legacy_params(params)
    assert params == before
    kept = {k: v for k, v in meta.items() if k not in MODERN_KEYS}
    if not has_meta or kept == meta:  # (nothing to strip)
        assert stripped is None
        return
    assert stripped is not None and stripped is not params
    assert stripped == ({"name": "x", "_meta": kept} if kept else {"name": "x"})


def test_a_legacy_request_gains_what_its_initialize_said_for_a_modern_server() -> None:
    request = {**CALL, "params": {"name": "greet", "_meta": {"progressToken": 3}}}
    stamped = modern_params(request["params"], "2026-07-28", {"roots": {}}, {"name": "c"}, "info")
    assert stamped == {
        "name": "greet",
        "_meta": {
            "progressToken": 3,
            PROTOCOL_VERSION_KEY: "2026-07-28",
            CLIENT_CAPABILITIES_KEY: {"roots": {}},
            CLIENT_INFO_KEY: {"name": "c"},
            LOG_LEVEL_KEY: "info",
        },
    }
    assert request["params"] == {"name": "greet", "_meta": {"progressToken": 3}}  # untouched


# -- (a) a legacy client at a modern server ------------------------------------


def asked(bridge: AskingClients, capabilities: dict[str, Any], answer: dict[str, Any],
          rounds: int = 0) -> list[Any]:  # fmt: skip
    return bridge.input_required("s1", capabilities, InputRound(CALL, rounds), answer)


def test_input_required_becomes_requests_to_the_client_then_one_retry() -> None:
    bridge = AskingClients("weather")
    answer = {
        "resultType": "input_required",
        "inputRequests": {"login": ELICIT, "capital": SAMPLE},
        "requestState": "server-blob",
    }
    assert asked(bridge, BOTH, answer) == [
        AskClient("s1", {"jsonrpc": "2.0", "id": "mcpbroker:weather:1", **ELICIT}),
        AskClient("s1", {"jsonrpc": "2.0", "id": "mcpbroker:weather:2", **SAMPLE}),
    ]
    assert bridge.owns("mcpbroker:weather:1")
    assert bridge.client_answered("s1", result("mcpbroker:weather:2", {"text": "Paris"})) == []
    login = {"action": "accept", "content": {"name": "octocat"}}
    retry = {
        **CALL,
        "params": {
            "name": "greet",
            "inputResponses": {"capital": {"text": "Paris"}, "login": login},
            "requestState": "server-blob",
        },
    }
    assert bridge.client_answered("s1", result("mcpbroker:weather:1", login)) == [
        SendServer(retry, InputRound(CALL, 1), "s1")
    ]
    assert len(bridge) == 0 and not bridge.owns("mcpbroker:weather:1")


def test_a_round_without_questions_is_retried_at_once_without_state_if_none_given() -> None:
    bridge = AskingClients("weather")
    earlier = {**CALL, "params": {"name": "greet", "requestState": "old"}}
    actions = bridge.input_required("s1", {}, InputRound(earlier, 2), {
        "resultType": "input_required", "inputRequests": {}})  # fmt: skip
    assert actions == [
        SendServer({**CALL, "params": {"name": "greet", "inputResponses": {}}},
                   InputRound(earlier, 3), "s1")
    ]  # fmt: skip


def test_a_question_the_client_did_not_declare_is_never_asked() -> None:
    bridge = AskingClients("weather")
    answer = {"resultType": "input_required", "inputRequests": {"a": SAMPLE, "b": ELICIT}}
    (reply,) = asked(bridge, {"elicitation": {}}, answer)
    assert isinstance(reply, AnswerClient) and reply.session == "s1"
    assert reply.message["id"] == 7
    assert reply.message["error"]["code"] == -32021
    assert reply.message["error"]["data"] == {"requiredCapabilities": {"sampling": {}}}
    assert len(bridge) == 0


def test_the_rounds_are_bounded() -> None:
    bridge = AskingClients("weather", max_rounds=3)
    answer = {"resultType": "input_required", "inputRequests": {"a": ELICIT}}
    (reply,) = asked(bridge, BOTH, answer, rounds=3)
    assert reply == AnswerClient("s1", error(7, -32603,
        "MCP server 'weather' needed input: more than 3 rounds"))  # fmt: skip


def test_the_questions_waiting_for_clients_are_bounded_as_a_legacy_servers_are() -> None:
    bridge = AskingClients("weather")
    many = {f"q{n}": ELICIT for n in range(1000)}
    answer = {"resultType": "input_required", "inputRequests": many}
    assert len(asked(bridge, BOTH, answer)) == 1000  # (under the bound: asked)
    more = {f"q{n}": ELICIT for n in range(25)}
    other = {**CALL, "id": 8}
    (reply,) = bridge.input_required("s2", BOTH, InputRound(other, 0), {**answer,
        "inputRequests": more})  # fmt: skip
    assert isinstance(reply, AnswerClient) and reply.message["id"] == 8
    assert reply.message["error"]["code"] == -32005
    assert reply.message["error"]["data"] == {"server": "weather", "limit": 1024}
    assert "1000 of its questions already wait" in reply.message["error"]["message"]
    assert len(bridge) == 1  # (the first call still waits; the refused one holds nothing)


def test_a_client_that_refuses_fails_its_call_and_its_other_questions_are_withdrawn() -> None:
    bridge = AskingClients("weather")
    answer = {"resultType": "input_required", "inputRequests": {"a": ELICIT, "b": SAMPLE}}
    asked(bridge, BOTH, answer)
    actions = bridge.client_answered("s1", error("mcpbroker:weather:1", -1, "User rejected"))
    assert actions == [
        AskClient("s1", {"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": "mcpbroker:weather:2"}}),
        AnswerClient("s1", error(7, -32603,
            "MCP server 'weather' needed input: the client refused: User rejected")),
    ]  # fmt: skip
    assert bridge.client_answered("s1", result("mcpbroker:weather:2", {})) is None


def test_a_cancelled_call_withdraws_its_questions() -> None:
    bridge = AskingClients("weather")
    asked(bridge, BOTH, {"resultType": "input_required", "inputRequests": {"a": ELICIT}})
    assert bridge.cancel("s1", 7) == [
        AskClient("s1", {"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": "mcpbroker:weather:1"}}),
    ]  # fmt: skip
    assert bridge.cancel("s1", 7) == []
    assert bridge.client_answered("s1", result("mcpbroker:weather:1", {})) is None


def test_a_client_that_does_not_answer_within_the_calls_timeout_fails_the_call() -> None:
    bridge = AskingClients("weather")
    assert bridge.next_deadline() is None
    answer = {"resultType": "input_required", "inputRequests": {"a": ELICIT, "b": SAMPLE}}
    bridge.input_required("s1", BOTH, InputRound(CALL), answer, now=100.0, timeout=30.0)
    assert bridge.client_answered("s1", result("mcpbroker:weather:2", {"text": "x"})) == []
    assert bridge.next_deadline() == 130.0
    assert bridge.expire(129.9) == []
    assert bridge.expire(130.0) == [
        AskClient("s1", {"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": "mcpbroker:weather:1"}}),
        AnswerClient("s1", {"jsonrpc": "2.0", "id": 7, "error": {
            "code": -32001,
            "message": "Request 'tools/call' to MCP server 'weather' timed out: the client "
                       "did not answer the server's questions within 30 s",
            "data": {"server": "weather"}}}),
    ]  # fmt: skip
    assert len(bridge) == 0 and bridge.next_deadline() is None
    # A late answer is nobody's (the session drops it), and nothing expires twice.
    assert bridge.client_answered("s1", result("mcpbroker:weather:1", {})) is None
    assert bridge.expire(200.0) == []


def test_a_call_without_a_timeout_waits_for_its_clients_answers() -> None:
    bridge = AskingClients("weather")
    asked(bridge, BOTH, {"resultType": "input_required", "inputRequests": {"a": ELICIT}})
    assert bridge.next_deadline() is None and bridge.expire(1e12) == []
    assert bridge.owns("mcpbroker:weather:1")


def test_another_sessions_answer_is_not_taken() -> None:
    bridge = AskingClients("weather")
    asked(bridge, BOTH, {"resultType": "input_required", "inputRequests": {"a": ELICIT}})
    assert bridge.client_answered("s2", result("mcpbroker:weather:1", {"action": "accept"})) is None
    assert bridge.owns("mcpbroker:weather:1")
    bridge.session_gone("s1")
    assert not bridge.owns("mcpbroker:weather:1") and len(bridge) == 0


# -- (b) a modern client at a legacy server ---------------------------------------


def server_request(id: Any, question: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, **question}


def ask(bridge: AnsweringServers, question: dict[str, Any] = ELICIT, *, id: Any = 100,
        session: str = "s1", client_id: Any = 1) -> list[Any]:  # fmt: skip
    return bridge.server_asked(session, BOTH, (5, client_id, "tools/call"),
                               server_request(id, question))  # fmt: skip


def retry_of(token: Any, id: Any, responses: dict[str, Any] | None = None,
             method: str = "tools/call") -> dict[str, Any]:  # fmt: skip
    params: dict[str, Any] = {"name": "greet", "requestState": token}
    if responses is not None:
        params["inputResponses"] = responses
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


def test_a_server_question_becomes_input_required_and_the_retry_takes_over_the_call() -> None:
    bridge = AnsweringServers("files", KEY)
    (reply,) = ask(bridge)
    assert isinstance(reply, AnswerClient) and reply.session == "s1"
    token = reply.message["result"]["requestState"]
    assert is_ours(token)
    assert reply.message == result(1, {
        "resultType": "input_required",
        "inputRequests": {"elicitation-1": ELICIT},
        "requestState": token,
    })  # fmt: skip
    accepted = {"action": "accept", "content": {"name": "ada"}}
    assert bridge.retry("s1", retry_of(token, 2, {"elicitation-1": accepted})) == [
        SendServer(result(100, accepted)),
        Rebind(5, "s1", 2),
    ]
    # The call's answer now goes to the retry, the usual way.
    assert bridge.call_answered(5, result(5, {"content": []})) is False
    assert bridge.parked == {}
    # A token is spent once.
    (again,) = bridge.retry("s1", retry_of(token, 3, {"elicitation-1": accepted}))
    assert again.message["error"]["code"] == -32602


def test_a_question_asked_while_the_client_is_away_is_put_on_the_retry() -> None:
    bridge = AnsweringServers("files", KEY)
    (first,) = ask(bridge, ELICIT, id=100)
    assert ask(bridge, SAMPLE, id=101) == []  # the client has not come back yet
    token = first.message["result"]["requestState"]
    actions = bridge.retry("s1", retry_of(token, 2, {"elicitation-1": {"action": "decline"}}))
    assert actions[:2] == [SendServer(result(100, {"action": "decline"})), Rebind(5, "s1", 2)]
    (second,) = actions[2:]
    assert isinstance(second, AnswerClient)
    assert second.message["id"] == 2
    assert second.message["result"]["inputRequests"] == {"sampling-2": SAMPLE}
    assert second.message["result"]["requestState"] != token


def test_a_retry_without_an_answer_is_asked_again() -> None:
    bridge = AnsweringServers("files", KEY)
    (first,) = ask(bridge)
    token = first.message["result"]["requestState"]
    rebind, again = bridge.retry("s1", retry_of(token, 2, {}))
    assert rebind == Rebind(5, "s1", 2)
    assert again.message["result"]["inputRequests"] == {"elicitation-1": ELICIT}


def test_the_call_answered_while_the_client_is_away_waits_for_the_retry() -> None:
    bridge = AnsweringServers("files", KEY)
    (first,) = ask(bridge)
    token = first.message["result"]["requestState"]
    final = error(1, -32603, "server gave up waiting")
    assert bridge.call_answered(5, final) is True  # kept, not delivered
    assert bridge.retry("s1", retry_of(token, 2, {"elicitation-1": {"action": "cancel"}})) == [
        SendServer(result(100, {"action": "cancel"})),
        Finish(5, "s1", {**final, "id": 2}),  # (the call, 5, is over)
    ]
    assert bridge.parked == {}


def test_a_question_the_client_did_not_declare_goes_back_to_the_server() -> None:
    bridge = AnsweringServers("files", KEY)
    (refusal,) = bridge.server_asked("s1", {"sampling": {}}, (5, 1, "tools/call"),
                                     server_request(100, ELICIT))  # fmt: skip
    assert isinstance(refusal, SendServer)
    assert refusal.message["id"] == 100 and refusal.message["error"]["code"] == -32601
    assert "'elicitation'" in refusal.message["error"]["message"]
    assert bridge.parked == {}


@pytest.mark.parametrize("token", ["mcpbroker.forged", "", None, 12, "server-state"])
def test_an_unknown_request_state_is_refused(token: Any) -> None:
    bridge = AnsweringServers("files", KEY)
    ask(bridge)
    (reply,) = bridge.retry("s1", retry_of(token, 2, {}))
    assert reply == AnswerClient("s1", error(2, -32602,
        "requestState is unknown, expired, or not this client's"))  # fmt: skip


def test_another_sessions_state_is_refused_and_stays_its_owners() -> None:
    bridge = AnsweringServers("files", KEY)
    (first,) = ask(bridge)
    token = first.message["result"]["requestState"]
    (stolen,) = bridge.retry("s2", retry_of(token, 2, {"elicitation-1": {"action": "accept"}}))
    assert stolen.session == "s2" and stolen.message["error"]["code"] == -32602
    (wrong,) = bridge.retry("s1", retry_of(token, 3, {}, method="prompts/get"))
    assert wrong.message["error"]["message"] == "requestState belongs to a tools/call request"
    assert bridge.retry("s1", retry_of(token, 4, {}))[0] == Rebind(5, "s1", 4)


def test_a_client_that_never_comes_back_expires() -> None:
    bridge = AnsweringServers("files", KEY, timeout=120.0)
    (first,) = ask(bridge)
    token = first.message["result"]["requestState"]
    assert bridge.next_deadline() is None  # not armed yet: the actor's clock says when
    assert bridge.arm(1000.0) == 1120.0
    assert bridge.arm(1050.0) is None  # (nothing new)
    assert bridge.next_deadline() == 1120.0
    assert bridge.expire(1119.0) == []
    assert ask(bridge, SAMPLE, id=101) == []  # asked while the client is away
    assert bridge.expire(1120.0) == [
        SendServer(error(100, -32603, "mcpbroker: the client did not come back with its "
                                      "input within 120 s")),
        SendServer(error(101, -32603, "mcpbroker: the client did not come back with its "
                                      "input within 120 s")),
        CancelCall(5),
    ]  # fmt: skip
    assert bridge.expire(2000.0) == [] and len(bridge.parked) == 0 and len(bridge.states) == 0
    assert bridge.next_deadline() is None
    # The retry that comes too late is told why; then (told once) as any unknown token.
    (late,) = bridge.retry("s1", retry_of(token, 2, {"elicitation-1": {"action": "accept"}}))
    assert late.message["error"]["code"] == -32602
    assert late.message["error"]["message"].startswith(
        "requestState expired: no retry came within 120 s, so mcpbroker gave the call up"
    )
    (again,) = bridge.retry("s1", retry_of(token, 3, {}))
    assert again.message["error"]["message"] == (
        "requestState is unknown, expired, or not this client's"
    )


def test_a_retry_in_time_stops_the_clock_and_a_new_round_starts_it_again() -> None:
    bridge = AnsweringServers("files", KEY, timeout=60.0)
    (first,) = ask(bridge)
    bridge.arm(0.0)
    token = first.message["result"]["requestState"]
    bridge.retry("s1", retry_of(token, 2, {"elicitation-1": {"action": "accept"}}))
    assert bridge.next_deadline() is None and bridge.expire(1e9) == []
    (second,) = ask(bridge, SAMPLE, id=101, client_id=2)
    assert second.message["id"] == 2 and bridge.arm(50.0) == 110.0
    # Another session's late retry is not told anything of this one's.
    bridge.expire(110.0)
    second_token = second.message["result"]["requestState"]
    (stolen,) = bridge.retry("s2", retry_of(second_token, 9, {}))
    assert stolen.message["error"]["message"] == (
        "requestState is unknown, expired, or not this client's"
    )


def test_without_a_timeout_a_parked_call_waits() -> None:
    bridge = AnsweringServers("files", KEY)
    ask(bridge)
    assert bridge.arm(0.0) is None and bridge.next_deadline() is None
    assert bridge.expire(1e12) == [] and len(bridge.parked) == 1


def test_a_session_that_leaves_ends_its_parked_calls_only() -> None:
    bridge = AnsweringServers("files", KEY)
    ask(bridge, session="s1")
    bridge.server_asked("s2", BOTH, (6, 1, "tools/call"), server_request(200, SAMPLE))
    assert bridge.session_gone("s1") == [
        SendServer(error(100, -32603, "mcpbroker: the client disconnected")),
        CancelCall(5),
    ]
    assert len(bridge.parked) == 1 and len(bridge.states) == 1


def test_a_cancelled_call_answers_the_servers_questions() -> None:
    bridge = AnsweringServers("files", KEY)
    ask(bridge)
    assert bridge.cancelled(5) == [
        SendServer(error(100, -32603, "mcpbroker: the client cancelled the request")),
    ]
    assert bridge.cancelled(5) == []


# -- the tokens ---------------------------------------------------------------------


def test_tokens_are_bounded_and_keys_must_be_long() -> None:
    states = RequestStates(KEY, limit=2)
    states.mint("s", 1)
    states.mint("s", 2)
    with pytest.raises(TooManyStates):
        states.mint("s", 3)
    with pytest.raises(ValueError):
        RequestStates(b"short")


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers()), max_size=30),
       st.binary(min_size=16, max_size=32))  # fmt: skip
def test_a_token_round_trips_for_its_session_and_for_no_other(
    minted: list[tuple[str, int]], key: bytes
) -> None:
    states = RequestStates(key)
    tokens = [(states.mint(session, value), session, value) for session, value in minted]
    assert len({token for token, _, _ in tokens}) == len(tokens)  # never two alike
    for token, session, value in tokens:
        for other in {"a", "b", "c"} - {session}:
            assert states.peek(other, token) is None
            assert states.redeem(other, token) is None
        assert states.redeem(session, token) == value
        assert states.redeem(session, token) is None
    assert len(states) == 0


def test_tokens_differ_between_keys() -> None:
    one, two = RequestStates(b"1" * 16), RequestStates(b"2" * 16)
    assert one.mint("s", 1) != two.mint("s", 1)


# -- the id map's part --------------------------------------------------------------


def test_a_retry_takes_over_a_call_in_the_id_map() -> None:
    requests = RequestMap("files")
    upstream_id = requests.open("s1", {"jsonrpc": "2.0", "id": 1, "method": "tools/call"})
    assert requests.rebind(upstream_id, "s1", 2)
    response = result(upstream_id, {"content": []})
    entry = requests.close(response)
    assert entry is not None and entry.client_id == 2 and response["id"] == 2
    # Gone, another session's, or an id in use: nothing changes.
    assert not requests.rebind(upstream_id, "s1", 3)
    other = requests.open("s2", {"jsonrpc": "2.0", "id": 1, "method": "tools/call"})
    assert not requests.rebind(other, "s1", 3)
    requests.open("s2", {"jsonrpc": "2.0", "id": 9, "method": "tools/call"})
    assert not requests.rebind(other, "s2", 9)


@pytest.mark.parametrize("pad", [0, 5000])  # (an answer's rest copied, or viewed)
@pytest.mark.parametrize("typescript_shape", [False, True])
@given(
    error=st.booleans(),
    said=st.sampled_from(["complete", "input_required", "no back-channel", "x"]),
)
def test_a_round_ends_unless_the_answer_s_bytes_name_what_would_continue_it(
    pad: int, typescript_shape: bool, error: bool, said: str
) -> None:
    """An error naming a missing back-channel, or a result naming
    input_required, anywhere in its bytes, is left to the parser."""
    body: dict[str, Any] = (
        {"error": {"code": -32603, "message": said, "data": "x" * pad}}
        if error
        else {"result": {"resultType": said, "pad": "x" * pad}}
    )
    message = {**body, "jsonrpc": "2.0", "id": 3} if typescript_shape else {
        "jsonrpc": "2.0", "id": 3, **body}  # fmt: skip
    answer = split_answer(orjson.dumps(message))
    assert answer is not None
    needle = "no back-channel" if error else '"input_required"'
    assert ends_round(answer) == (needle not in orjson.dumps(message).decode())


def test_an_error_holding_an_integer_past_64_bits_is_no_back_channel_refusal() -> None:
    """(Read exactly, such an integer could not be encoded again: the
    TypeError ended the server's reader. Found by tests/test_fuzz.py.)"""
    from broker.eras.bridge import refuses_back_channel

    assert not refuses_back_channel({"jsonrpc": "2.0", "id": 1, "error": -(2**63) - 1})
