"""The rules of servers reached by HTTP, without I/O: what a POST's answer
means (broker/wire/http_upstream.py), ``${VAR}`` in headers, and a server's
request that came on the stream of one request (``related``), which goes to
that request's session, with no gate (broker/upstream.py)."""

from __future__ import annotations

from typing import Any

import pytest

from broker import jsonrpc
from broker.jsonrpc import INTERNAL_ERROR, METHOD_NOT_FOUND
from broker.upstream import Deliver, SendUpstream, UpstreamProtocol, Warn
from broker.wire import http_upstream as rules
from tests.test_turns import A, B, C, ask, call, protocol


def outcome(status: int, content_type: str = "", **flags: bool) -> str:
    defaults = {"has_session": True, "initialize": False, "detecting": False}
    return rules.outcome_of(status, content_type, **{**defaults, **flags})


@pytest.mark.parametrize(
    ("status", "content_type", "flags", "expected"),
    [
        (202, "", {}, rules.ACCEPTED),
        (200, "application/json", {}, rules.JSON),
        (200, "application/json; charset=utf-8", {}, rules.JSON),
        (200, "Text/Event-Stream", {}, rules.STREAM),
        (200, "", {}, rules.ACCEPTED),  # an empty answer to a notification
        (204, "", {}, rules.ACCEPTED),
        (200, "text/html", {}, rules.FAILED),
        (500, "application/json", {}, rules.FAILED),
        (401, "", {}, rules.FAILED),
        # 404 means the session is gone only if the POST carried one ...
        (404, "", {}, rules.EXPIRED),
        (404, "", {"has_session": False}, rules.FAILED),
        # ... and not for the initialize that opens a new one.
        (404, "", {"initialize": True}, rules.FAILED),
        # The spec's fallback: only for an initialize, only with no type configured.
        (405, "", {"initialize": True, "detecting": True}, rules.FALLBACK),
        (400, "", {"initialize": True, "detecting": True}, rules.FALLBACK),
        (404, "", {"initialize": True, "detecting": True}, rules.FALLBACK),
        (405, "", {"initialize": True}, rules.FAILED),
        (401, "", {"initialize": True, "detecting": True}, rules.FAILED),
    ],
)
def test_what_a_posts_answer_means(
    status: int, content_type: str, flags: dict[str, bool], expected: str
) -> None:
    assert outcome(status, content_type, **flags) == expected


NULL_ERROR_THEN_ANSWER = (
    b'[{"jsonrpc":"2.0","id":null,"error":{"code":1,"message":"m"}},'
    b'{"jsonrpc":"2.0","id":7,"result":{}}]'
)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"jsonrpc":"2.0","id":7,"result":{}}', None),
        (b'{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"no"}}', None),
        (b'[{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":7,"result":{}}]', None),
        (NULL_ERROR_THEN_ANSWER, None),
        (b'{"jsonrpc":"2.0","method":"n"}\n{"jsonrpc":"2.0","id":7,"result":{}}\n', None),
        (b'{"jsonrpc":"2.0","method":"n"}\n{"jsonrpc":"2.0","method":"m"}', "holds no answer"),
        (b'{"jsonrpc":"2.0","method":"n"}\n{"jsonrpc":"2.0","id":7,"res', "not JSON"),
        (b"", "not JSON"),
        (b"<html>", "not JSON"),
        (b'{"jsonrpc":"2.0","method":"notifications/message"}', "holds no answer"),
        (b"[1, 2]", "holds no answer"),
        (b'{"jsonrpc":"2.0","id":8,"result":{}}', "another request (id 8)"),
        (b'{"jsonrpc":"2.0","id":"7","result":{}}', "another request (id '7')"),
        (
            b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}',
            "an error for no request: -32700 Parse error",
        ),
    ],
)
def test_a_json_body_that_is_not_its_requests_answer_is_named(
    body: bytes, problem: str | None
) -> None:
    found = rules.json_body(body, 7)[1]
    assert found == problem if problem is None else problem in (found or "")
    assert rules.json_body(body, None)[1] is None  # (a notification's POST: nothing to fail)


def test_a_json_body_is_handed_on_as_its_messages() -> None:
    one = b'{"jsonrpc":"2.0","id":7,"result":{}}'
    assert rules.json_body(one, 7) == ([one], None)  # as it came
    # The shape the Upstream cuts unparsed is not parsed here either (a large
    # result costs no JSON read): what is inside it passes as on stdio.
    cut = b'{"jsonrpc":"2.0","id":7,"result":{"x":' + b"1" * 100_000 + b"}}"
    assert rules.json_body(cut, 7) == ([cut], None)
    unread = b'{"jsonrpc":"2.0","id":7,"result":{"x":nope}}'
    assert rules.json_body(unread, 7) == ([unread], None)
    assert "not JSON" in (rules.json_body(unread, 8)[1] or "")  # (another id: parsed)
    lines = b'{"jsonrpc":"2.0","method":"n"}\r\n' + one + b"\n"
    assert rules.json_body(lines, 7) == ([b'{"jsonrpc":"2.0","method":"n"}', one], None)
    batch = b'[{"jsonrpc":"2.0","method":"n"}, ' + one + b"]"
    assert rules.json_body(batch, 7) == ([b'{"jsonrpc":"2.0","method":"n"}', one], None)


@pytest.mark.parametrize(
    ("config_type", "mode"),
    [
        (None, rules.DETECT),
        ("http", rules.STREAMABLE),
        ("streamable-http", rules.STREAMABLE),
        ("streamableHttp", rules.STREAMABLE),
        ("sse", rules.SSE),
    ],
)
def test_the_type_picks_the_transport(config_type: str | None, mode: str) -> None:
    assert rules.mode_of(config_type) == mode


@pytest.mark.parametrize("config_type", ["stdio", "ws"])
def test_a_type_that_is_not_http_is_refused(config_type: str) -> None:
    with pytest.raises(ValueError, match=f"{config_type!r} does not go with an http"):
        rules.mode_of(config_type)


def test_variables_are_expanded_and_a_missing_one_is_named() -> None:
    env = {"TOKEN": "t0k", "USER_1": "me"}
    assert rules.expand("Bearer ${TOKEN}", env) == "Bearer t0k"
    assert rules.expand("${USER_1}:${TOKEN}", env) == "me:t0k"
    assert rules.expand("no variables, $TOKEN, ${not a name}", env) == (
        "no variables, $TOKEN, ${not a name}"
    )
    assert rules.expand("${TOKEN}", {"TOKEN": ""}) == ""
    with pytest.raises(rules.MissingVariable) as missing:
        rules.expand("Bearer ${TOKEN} ${NOPE}", env)
    assert missing.value.name == "NOPE"


def test_messages_that_may_be_requests_are_told_from_answers() -> None:
    assert rules.may_be_request(b'{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage"}')
    assert rules.may_be_request(b'{"jsonrpc":"2.0","method":"notifications/progress"}')
    assert not rules.may_be_request(b'{"jsonrpc":"2.0","id":1,"result":{}}')


# -- a server's request related to one request (broker/upstream.py) -------------------


def related(
    proto: UpstreamProtocol, upstream_id: Any, method: str = "sampling/createMessage"
) -> Any:
    message = {"jsonrpc": "2.0", "id": "srv-1", "method": method, "params": {}}
    return proto.server_message(message, 0.0, related=upstream_id)


def upstream_ids(proto: UpstreamProtocol, *sessions: str) -> list[int]:
    ids = []
    for session in sessions:
        [send] = call(proto, session)
        assert isinstance(send, SendUpstream)
        ids.append(send.message["id"])
    return ids


def test_a_related_request_goes_to_the_session_of_its_request_among_many() -> None:
    proto = protocol("auto")
    a, b, c = upstream_ids(proto, A, B, C)
    for upstream_id, session in ((b, B), (a, A), (c, C), (b, B)):
        [deliver] = related(proto, upstream_id)
        assert isinstance(deliver, Deliver) and deliver.session == session
    assert not proto.turns.on  # the gate learnt nothing: there was nothing to guess
    # The same request, unrelated (the GET stream): the rules of stdio, refused.
    reply, warn = ask(proto)
    assert isinstance(reply, SendUpstream) and isinstance(warn, Warn)
    assert "3 clients have requests in progress" in reply.message["error"]["message"]
    assert proto.turns.on  # auto: from now on, one session at a time


def test_a_related_request_for_a_session_without_the_capability_asks_no_one_else() -> None:
    proto = protocol("concurrent")
    proto.attach(B, {})
    _, b = upstream_ids(proto, A, B)
    reply, warn = related(proto, b)
    assert isinstance(reply, SendUpstream) and isinstance(warn, Warn)
    assert reply.message["error"]["code"] == METHOD_NOT_FOUND


def test_a_related_request_for_a_request_no_longer_in_flight_has_no_cause() -> None:
    proto = protocol("concurrent")
    a, _ = upstream_ids(proto, A, B)
    proto.server_message(jsonrpc.result_response(a, {}))  # answered
    reply, warn = related(proto, a)
    assert isinstance(reply, SendUpstream) and isinstance(warn, Warn)
    assert reply.message["error"]["code"] == INTERNAL_ERROR
    assert "no client request is in progress" in reply.message["error"]["message"]
    [roots] = related(proto, a, "roots/list")  # roots: those of no client
    assert isinstance(roots, SendUpstream) and roots.message["result"] == {"roots": []}
    reply, _ = related(proto, "mcpbroker-3")  # (one of the broker's own: no session)
    assert isinstance(reply, SendUpstream) and reply.message["error"]["code"] == INTERNAL_ERROR


def test_a_failed_answer_is_an_error_naming_the_server_for_its_caller_only() -> None:
    proto = protocol("concurrent")
    a, b = upstream_ids(proto, A, B)
    [failed] = proto.fail_now(a, "HTTP 500 Internal Server Error")
    assert isinstance(failed, Deliver) and failed.session == A
    error = failed.message["error"]
    assert error["message"] == "MCP server 's' answered with HTTP 500 Internal Server Error"
    assert error["data"] == {"server": "s"}
    assert proto.fail_now(a, "again") == []  # (answered once; nothing is answered twice)
    assert proto.requests.get(b) is not None and proto.requests.get(a) is None


def test_a_renewed_session_is_asked_again_for_what_the_old_one_held() -> None:
    proto = UpstreamProtocol("s")
    init = {
        "protocolVersion": "2025-11-25",
        "capabilities": {"resources": {"subscribe": True}, "logging": {}},
        "serverInfo": {"name": "s"},
    }
    proto.server_message(jsonrpc.result_response("mcpbroker-initialize", init))
    proto.attach(A, {})
    subscribe = {"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe"}
    proto.client_request(A, {**subscribe, "params": {"uri": "file:///x"}})
    proto.client_log_level(A, "debug")
    again = [action.message for action in proto.renewed()]
    assert [(m["method"], m["params"]) for m in again] == [
        ("resources/subscribe", {"uri": "file:///x"}),
        ("logging/setLevel", {"level": "debug"}),
    ]
    assert all(isinstance(m["id"], str) for m in again)  # the broker's own requests


def test_an_answer_on_a_posts_stream_is_its_requests_or_named() -> None:
    """(Any answer was taken for the request's: its caller waited out the
    timeout for the one that never came.)"""
    assert rules.not_its_answer(b'{"jsonrpc":"2.0","id":7,"result":{}}', 7) is None
    assert rules.not_its_answer(b'{"jsonrpc":"2.0","id":"a","result":{}}', "a") is None
    other = rules.not_its_answer(b'{"jsonrpc":"2.0","id":8,"result":{}}', 7)
    assert other == "the answer to another request (id 8) on its stream"
    assert rules.not_its_answer(b'{"jsonrpc":"2.0","id":"7","result":{}}', 7) is not None
    assert rules.not_its_answer(b'{"jsonrpc":"2.0","id":true,"result":{}}', 1) is not None
    assert rules.not_its_answer(b"not json", 7) == "a message on its stream that is not JSON"
    assert rules.not_its_answer(b'{"jsonrpc":"2.0","id":8,"result":{}}', None) is None


@pytest.mark.parametrize(
    ("value", "safe"),
    [("g-17", True), ("2025-11-25", True), ("a b", True), ("caf\u00e9", False),
     ("a\x01b", False), (" g", False), ("g\t", False), ("", True)],
)  # fmt: skip
def test_a_value_from_the_server_goes_back_in_a_header_only_if_http_can_carry_it(
    value: str, safe: bool
) -> None:
    assert rules.header_safe(value) is safe


@pytest.mark.parametrize(
    ("value", "valid"),
    [("1868a90c-aa", True), ("s\u00e9ssion", False), ("a b", False), ("a\x7f", False)],
)
def test_a_session_id_is_visible_ascii_or_refused(value: str, valid: bool) -> None:
    assert rules.is_session_id(value) is valid


def test_the_ids_of_answers_that_came_elsewhere_are_read() -> None:
    assert rules.answer_ids(b'{"jsonrpc":"2.0","id":7,"result":{}}') == [7]
    assert rules.answer_ids(b'{"id":"s","jsonrpc":"2.0","error":{"code":1}}') == ["s"]
    batch = b'[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","id":[2],"result":{}}]'
    assert rules.answer_ids(batch) == [1]
    assert rules.answer_ids(b"not json") == []


@pytest.mark.parametrize(
    ("status", "resuming", "means"),
    [
        (405, False, rules.NO_GET_STREAM),
        (404, True, rules.NO_GET_STREAM),
        (503, False, rules.POLL_LATER),
        (503, True, rules.POLL_LATER),
        (502, False, rules.POLL_LATER),
        (307, True, rules.POLL_LATER),
        (429, True, rules.POLL_LATER),
        (400, False, rules.POLL_LATER),
        (400, True, rules.POLL_AFRESH),
        (409, True, rules.POLL_AFRESH),
    ],
)
def test_only_405_to_a_get_poll_means_no_get_stream(
    status: int, resuming: bool, means: str
) -> None:
    assert rules.poll_refused(status, resuming=resuming) == means
