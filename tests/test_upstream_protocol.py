"""UpstreamProtocol: one server's handshake, id map and notifications."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from broker import jsonrpc
from broker.jsonrpc import CONNECTION_CLOSED, INVALID_REQUEST, METHOD_NOT_FOUND, JsonRpcError
from broker.lifecycle import HandshakeError, ServerIdentity
from broker.states import ServerState
from broker.upstream import (
    HANDSHAKE_ID,
    Broadcast,
    Deliver,
    ListChanged,
    Ready,
    SendUpstream,
    UpstreamProtocol,
)

A, B = "session-a", "session-b"
INIT_RESULT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {"tools": {"listChanged": True}},
    "serverInfo": {"name": "files", "version": "2.0"},
}


def request(id: Any, method: str = "tools/call", **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": {"name": "t", **params}}


def result(id: Any, value: Any = None) -> dict[str, Any]:
    return jsonrpc.result_response(id, value if value is not None else {"ok": True})


def cancelled(request_id: Any, reason: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"requestId": request_id}
    if reason is not None:
        params["reason"] = reason
    return jsonrpc.notification("notifications/cancelled", params)


def ready_protocol(name: str = "files") -> UpstreamProtocol:
    proto = UpstreamProtocol(name)
    proto.server_message(result(HANDSHAKE_ID, INIT_RESULT))
    assert proto.state is ServerState.READY
    return proto


def forward(proto: UpstreamProtocol, session: str, id: Any, **params: Any) -> int:
    """Send a client request through; returns the upstream id it got."""
    (sent,) = proto.client_request(session, request(id, **params))
    assert isinstance(sent, SendUpstream)
    return sent.message["id"]


# -- handshake ---------------------------------------------------------------


def test_start_message() -> None:
    proto = UpstreamProtocol("files")
    assert proto.state is ServerState.INITIALIZING
    message = proto.start()
    assert message["jsonrpc"] == "2.0"
    assert message["id"] == HANDSHAKE_ID
    assert message["method"] == "initialize"
    assert set(message["params"]) == {"protocolVersion", "capabilities", "clientInfo"}
    assert message["params"]["clientInfo"]["name"] == "mcpbroker"


def test_handshake_response() -> None:
    proto = UpstreamProtocol("files")
    proto.start()
    identity = ServerIdentity("2025-06-18", INIT_RESULT["capabilities"], INIT_RESULT["serverInfo"])
    assert proto.server_message(result(HANDSHAKE_ID, INIT_RESULT)) == [
        SendUpstream(jsonrpc.notification("notifications/initialized")),
        Ready(identity),
    ]
    assert proto.state is ServerState.READY
    assert proto.identity == identity


def test_handshake_refused() -> None:
    proto = UpstreamProtocol("files")
    proto.start()
    refusal = jsonrpc.error_response(HANDSHAKE_ID, -32602, "unsupported")
    with pytest.raises(HandshakeError):
        proto.server_message(refusal)
    assert proto.state is ServerState.INITIALIZING


def test_client_request_before_ready() -> None:
    proto = UpstreamProtocol("files")
    with pytest.raises(JsonRpcError) as info:
        proto.client_request(A, request(3))
    assert (info.value.code, info.value.id) == (CONNECTION_CLOSED, 3)
    assert "'files'" in info.value.message


def test_client_request_after_gone() -> None:
    proto = ready_protocol()
    proto.server_gone("exited")
    with pytest.raises(JsonRpcError) as info:
        proto.client_request(A, request(3))
    assert info.value.code == CONNECTION_CLOSED
    assert "(it exited; restarting)" in info.value.message
    assert info.value.data == {"server": "files", "retryable": True}
    with pytest.raises(JsonRpcError) as restarting:  # until the new process is ready
        proto.restarted().client_request(A, request(4))
    assert "(it exited; restarting)" in restarting.value.message


def test_late_handshake_id_is_dropped_once_ready() -> None:
    proto = ready_protocol()
    assert proto.server_message(result(HANDSHAKE_ID, INIT_RESULT)) == []


# -- requests and responses --------------------------------------------------


def test_request_and_response_round_trip() -> None:
    proto = ready_protocol()
    up_a = forward(proto, A, 1)
    up_b = forward(proto, B, 1)
    assert up_a != up_b
    assert proto.server_message(result(up_b, "b")) == [Deliver(B, result(1, "b"))]
    assert proto.server_message(result(up_a, "a")) == [Deliver(A, result(1, "a"))]
    assert proto.server_message(result(up_a, "again")) == []


def test_duplicate_client_id_rejected() -> None:
    proto = ready_protocol()
    forward(proto, A, 1)
    with pytest.raises(JsonRpcError) as info:
        forward(proto, A, 1)
    assert info.value.code == INVALID_REQUEST


def test_invalid_server_message_raises() -> None:
    proto = ready_protocol()
    with pytest.raises(JsonRpcError):
        proto.server_message({"id": 1, "result": {}})


# -- requests from the server ------------------------------------------------


def test_server_ping_answered() -> None:
    proto = ready_protocol()
    ping = {"jsonrpc": "2.0", "id": "p1", "method": "ping"}
    assert proto.server_message(ping) == [SendUpstream(result("p1", {}))]


@pytest.mark.parametrize("method", ["made/up", "tools/list"])
def test_unknown_server_request(method: str) -> None:
    # (sampling, elicitation and roots: tests/test_turns.py)
    proto = ready_protocol()
    message = {"jsonrpc": "2.0", "id": 9, "method": method, "params": {}}
    [action] = proto.server_message(message)
    assert isinstance(action, SendUpstream)
    assert action.message["id"] == 9
    assert action.message["error"]["code"] == METHOD_NOT_FOUND
    assert method in action.message["error"]["message"]


# -- notifications from the server -------------------------------------------


@pytest.mark.parametrize(
    "method",
    [
        "notifications/tools/list_changed",
        "notifications/resources/list_changed",
        "notifications/prompts/list_changed",
    ],
)
def test_list_changed_goes_to_the_catalog_first(method: str) -> None:
    proto = ready_protocol()
    note = jsonrpc.notification(method)
    assert proto.server_message(note) == [ListChanged(jsonrpc.notification(method))]


def test_other_notifications_are_broadcast() -> None:
    proto = ready_protocol()
    note = jsonrpc.notification("notifications/custom", {"x": 1})
    assert proto.server_message(note) == [Broadcast(note)]


def test_progress_delivered_with_client_token() -> None:
    proto = ready_protocol()
    forward(proto, A, 1)
    up_b = forward(proto, B, 1, _meta={"progressToken": "mine"})
    note = jsonrpc.notification("notifications/progress", {"progressToken": up_b, "progress": 3})
    expected = jsonrpc.notification(
        "notifications/progress", {"progressToken": "mine", "progress": 3}
    )
    # (with the client's id of the request it belongs to: broker/related.py)
    assert proto.server_message(note) == [Deliver(B, expected, 1)]


def test_progress_after_response_dropped() -> None:
    proto = ready_protocol()
    upstream_id = forward(proto, A, 1, _meta={"progressToken": 5})
    proto.server_message(result(upstream_id))
    note = jsonrpc.notification("notifications/progress", {"progressToken": upstream_id})
    assert proto.server_message(note) == []


def test_server_cancelled_ignored() -> None:
    proto = ready_protocol()
    assert proto.server_message(cancelled(1)) == []


# -- failure and cancellation ------------------------------------------------


def test_server_gone_fails_every_request() -> None:
    proto = ready_protocol("files")
    forward(proto, A, 1)
    forward(proto, B, "x")
    delivered = proto.server_gone("exited with status 1")
    assert proto.state is ServerState.RESTARTING
    assert sorted((d.session, d.message["id"]) for d in delivered) == [(A, 1), (B, "x")]
    for deliver in delivered:
        error = deliver.message["error"]
        assert error["code"] == CONNECTION_CLOSED
        assert "'files'" in error["message"]
        assert "exited with status 1" in error["message"]
        assert error["data"] == {"server": "files", "retryable": True}
    assert proto.server_gone("again") == []


def test_client_cancelled_translates_id() -> None:
    proto = ready_protocol()
    forward(proto, A, 1)
    up_b = forward(proto, B, 1)
    assert proto.client_cancelled(B, {"requestId": 1, "reason": "user"}) == cancelled(up_b, "user")
    assert proto.server_message(result(up_b)) == []  # late response dropped


def test_client_cancelled_non_string_reason_left_out() -> None:
    proto = ready_protocol()
    upstream_id = forward(proto, A, "r")
    assert proto.client_cancelled(A, {"requestId": "r", "reason": 5}) == cancelled(upstream_id)


def test_client_cancelled_unknown_request() -> None:
    proto = ready_protocol()
    forward(proto, A, 1)
    assert proto.client_cancelled(B, {"requestId": 1}) is None
    assert proto.client_cancelled(A, {"requestId": 2}) is None
    assert proto.client_cancelled(A, {}) is None


def test_session_closed_cancels_its_requests() -> None:
    proto = ready_protocol()
    up_a1 = forward(proto, A, 1)
    up_b = forward(proto, B, 1)
    up_a2 = forward(proto, A, 2)
    assert proto.session_closed(A) == [
        cancelled(up_a1, "client disconnected"),
        cancelled(up_a2, "client disconnected"),
    ]
    assert proto.server_message(result(up_a1)) == []
    assert proto.server_message(result(up_b)) == [Deliver(B, result(1))]
    assert proto.session_closed(A) == []


def test_progress_with_null_params_is_dropped_not_a_crash() -> None:
    # "params": null is a valid notification; a progress without a token matches nothing.
    proto = ready_protocol()
    note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": None}
    assert proto.server_message(note) == []


# -- what an in-flight request remembers ---------------------------------------


@pytest.mark.parametrize("uri", ["task-list", "task", "creates-task"])
def test_a_subscription_to_a_uri_named_like_a_task_record_stays_a_subscription(uri: str) -> None:
    """A subscribed URI is remembered as a subscription, never mistaken for a
    task request's record: its answer passes through untouched (even one
    shaped like a task answer) and its updates reach the subscriber."""
    proto = ready_protocol()
    (sent,) = proto.client_request(A, request(7, "resources/subscribe", uri=uri))
    assert isinstance(sent, SendUpstream)
    upstream_id = sent.message["id"]
    # A server may put anything in a result; none of it is the broker's to rename.
    answer = {
        "taskId": "t1",
        "task": {"taskId": "t2"},
        "tasks": [{"taskId": "t3"}],
        "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t4"}},
    }
    expected = jsonrpc.result_response(7, copy.deepcopy(answer))
    assert proto.server_message(result(upstream_id, answer)) == [Deliver(A, expected)]
    with pytest.raises(JsonRpcError):  # nobody created a task t2
        proto.client_request(A, request(8, "tasks/get", taskId="t2"))
    update = jsonrpc.notification("notifications/resources/updated", {"uri": uri})
    assert proto.server_message(update) == [Deliver(A, update)]
