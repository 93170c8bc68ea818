"""The races a multiplexer must get right, played out on the sans-I/O protocol."""

from __future__ import annotations

from typing import Any

from broker import jsonrpc
from broker.timeouts import TimeoutPolicy
from broker.upstream import Deliver, SendUpstream, UpstreamProtocol

A, B = "session-a", "session-b"


def ready(timeout: float = 10.0) -> UpstreamProtocol:
    proto = UpstreamProtocol("srv", TimeoutPolicy(timeout, 100.0))
    proto.start()
    proto.server_message(
        jsonrpc.result_response(
            "mcpbroker-initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {"resources": {"subscribe": True}},
                "serverInfo": {"name": "srv"},
            },
        )
    )
    proto.attach(A, {})
    proto.attach(B, {})
    return proto


def forward(
    proto: UpstreamProtocol,
    session: str,
    id: Any,
    method: str = "tools/call",
    now: float = 0.0,
    **params: Any,
) -> int:
    (send,) = proto.client_request(
        session, {"jsonrpc": "2.0", "id": id, "method": method, "params": params}, now
    )
    assert isinstance(send, SendUpstream)
    return int(send.message["id"])


def test_a_cancellation_that_crosses_the_response() -> None:
    proto = ready()
    upstream_id = forward(proto, A, 1)
    (delivery,) = proto.server_message(jsonrpc.result_response(upstream_id, {"ok": True}))
    assert isinstance(delivery, Deliver) and delivery.message["id"] == 1
    assert proto.client_cancelled(A, {"requestId": 1}) is None  # nothing left to cancel


def test_a_response_that_crosses_the_cancellation_is_dropped() -> None:
    proto = ready()
    upstream_id = forward(proto, A, 1)
    cancel = proto.client_cancelled(A, {"requestId": 1, "reason": "stop"})
    assert cancel == jsonrpc.notification(
        "notifications/cancelled", {"requestId": upstream_id, "reason": "stop"}
    )
    assert proto.server_message(jsonrpc.result_response(upstream_id, {"late": True})) == []


def test_progress_after_the_response_is_dropped() -> None:
    proto = ready()
    upstream_id = forward(proto, A, 1, _meta={"progressToken": "p"})
    proto.server_message(jsonrpc.result_response(upstream_id, {}))
    progress = jsonrpc.notification(
        "notifications/progress", {"progressToken": upstream_id, "progress": 1}
    )
    assert proto.server_message(progress) == []


def test_a_subscribe_and_a_disconnect_at_once() -> None:
    proto = ready()
    upstream_id = forward(proto, A, 1, "resources/subscribe", uri="file:///x")
    closing = proto.session_closed(A)  # gone before the server answered
    assert [(m["method"], m["params"]) for m in closing] == [
        ("notifications/cancelled", {"requestId": upstream_id, "reason": "client disconnected"}),
        ("resources/unsubscribe", {"uri": "file:///x"}),
    ]
    assert proto.server_message(jsonrpc.result_response(upstream_id, {})) == []
    # The next subscriber is the first again: the server hears of it.
    forward(proto, B, 1, "resources/subscribe", uri="file:///x")


def test_a_timeout_that_crosses_the_response() -> None:
    proto = ready(timeout=10)
    first = forward(proto, A, 1, now=0)
    second = forward(proto, A, 2, now=5)
    proto.server_message(jsonrpc.result_response(second, {}), now=14)  # just in time
    actions = proto.expire(now=15)
    assert [a.message["params"]["requestId"] for a in actions if isinstance(a, SendUpstream)] == [
        first
    ]
    errors = [a.message for a in actions if isinstance(a, Deliver)]
    assert [e["id"] for e in errors] == [1] and errors[0]["error"][
        "code"
    ] == jsonrpc.REQUEST_TIMEOUT
    assert proto.server_message(jsonrpc.result_response(first, {"late": True})) == []
    assert proto.expire(now=100) == []


def test_answered_requests_do_not_pile_up_in_the_deadline_heap() -> None:
    proto = ready(timeout=300)
    for i in range(10_000):
        upstream_id = forward(proto, A, i, now=i / 1000)
        proto.server_message(jsonrpc.result_response(upstream_id, {}), now=i / 1000)
    assert len(proto.deadlines._heap) < 200


def test_a_clients_roots_change_reaches_its_servers_only_once_attached() -> None:
    proto = ready()
    note = jsonrpc.notification("notifications/roots/list_changed")
    assert proto.client_notification(A, note) == note
    assert proto.client_notification("stranger", note) is None
    assert proto.client_notification(A, jsonrpc.notification("notifications/other")) is None
