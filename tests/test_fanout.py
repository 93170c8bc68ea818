"""Log levels and resource subscriptions through one shared server, sans-I/O."""

from __future__ import annotations

from typing import Any

from broker import jsonrpc
from broker.fanout import Fanout
from broker.states import ServerTrigger
from broker.upstream import Deliver, SendUpstream, UpstreamProtocol

A, B = "session-a", "session-b"


def ready(capabilities: dict[str, Any] | None = None) -> UpstreamProtocol:
    proto = UpstreamProtocol("srv")
    proto.start()
    proto.server_message(
        jsonrpc.result_response(
            "mcpbroker-initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": capabilities or {"logging": {}, "resources": {"subscribe": True}},
                "serverInfo": {"name": "srv"},
            },
        )
    )
    for session in (A, B):
        proto.attach(session, {})
    return proto


def sent(actions: list[Any]) -> list[dict[str, Any]]:
    return [a.message for a in actions if isinstance(a, SendUpstream)]


def delivered(actions: list[Any]) -> list[tuple[Any, dict[str, Any]]]:
    return [(a.session, a.message) for a in actions if isinstance(a, Deliver)]


def subscribe(proto: UpstreamProtocol, session: str, id: int, uri: str = "file:///x") -> list[Any]:
    method = "resources/subscribe"
    return proto.client_request(
        session, {"jsonrpc": "2.0", "id": id, "method": method, "params": {"uri": uri}}
    )


def unsubscribe(
    proto: UpstreamProtocol, session: str, id: int, uri: str = "file:///x"
) -> list[Any]:
    method = "resources/unsubscribe"
    return proto.client_request(
        session, {"jsonrpc": "2.0", "id": id, "method": method, "params": {"uri": uri}}
    )


def test_only_the_first_subscriber_reaches_the_server() -> None:
    proto = ready()
    first = subscribe(proto, A, 1)
    assert [m["method"] for m in sent(first)] == ["resources/subscribe"]
    second = subscribe(proto, B, 1)
    assert sent(second) == [] and delivered(second) == [(B, jsonrpc.result_response(1, {}))]


def test_the_server_is_unsubscribed_when_the_last_subscriber_leaves() -> None:
    proto = ready()
    subscribe(proto, A, 1)
    subscribe(proto, B, 1)
    assert sent(unsubscribe(proto, A, 2)) == []
    last = unsubscribe(proto, B, 2)
    assert [(m["method"], m["params"]) for m in sent(last)] == [
        ("resources/unsubscribe", {"uri": "file:///x"})
    ]
    assert delivered(last) == [(B, jsonrpc.result_response(2, {}))]


def test_a_vanishing_subscriber_counts_as_unsubscribing() -> None:
    proto = ready()
    (request,) = sent(subscribe(proto, A, 1))
    proto.server_message(jsonrpc.result_response(request["id"], {}))
    subscribe(proto, B, 1)
    assert proto.session_closed(A) == []
    (message,) = proto.session_closed(B)
    assert message["method"] == "resources/unsubscribe"


def test_updates_go_only_to_subscribers() -> None:
    proto = ready()
    subscribe(proto, A, 1, "file:///a")
    subscribe(proto, B, 1, "file:///b")
    update = jsonrpc.notification("notifications/resources/updated", {"uri": "file:///a"})
    assert delivered(proto.server_message(update)) == [(A, update)]


def test_a_refused_subscription_is_forgotten() -> None:
    proto = ready()
    (request,) = sent(subscribe(proto, A, 1))
    refusal = jsonrpc.error_response(request["id"], -32601, "no subscriptions here")
    assert delivered(proto.server_message(refusal))[0][1]["error"]["code"] == -32601
    assert [m["method"] for m in sent(subscribe(proto, B, 1))] == ["resources/subscribe"]


def test_the_server_logs_at_the_most_verbose_level_any_session_wants() -> None:
    proto = ready()
    assert [m["params"] for m in sent(proto.client_log_level(A, "error"))] == [{"level": "error"}]
    assert [m["params"] for m in sent(proto.client_log_level(B, "debug"))] == [{"level": "debug"}]
    assert sent(proto.client_log_level(A, "warning")) == []  # debug still wins
    (message,) = proto.session_closed(B)
    assert message["params"] == {"level": "warning"}


def test_each_session_gets_log_messages_at_or_above_its_level() -> None:
    proto = ready()
    proto.client_log_level(A, "error")
    proto.client_log_level(B, "info")
    info = jsonrpc.notification("notifications/message", {"level": "info", "data": "x"})
    error = jsonrpc.notification(
        "notifications/message", {"level": "error", "logger": "db", "data": "y"}
    )
    assert [s for s, _ in delivered(proto.server_message(info))] == [B]
    out = delivered(proto.server_message(error))
    assert [s for s, _ in out] == [A, B]
    assert out[0][1]["params"]["logger"] == "srv/db"


def test_a_server_without_logging_is_not_asked_to_set_a_level() -> None:
    proto = ready({"tools": {}})
    assert sent(proto.client_log_level(A, "debug")) == []


def test_a_restarted_server_gets_the_subscriptions_and_level_back() -> None:
    proto = ready()
    subscribe(proto, A, 1, "file:///kept")
    proto.client_log_level(A, "notice")
    proto.server_gone("exited")
    proto.move(ServerTrigger.BACKOFF_ELAPSED)  # (the actor's moves: broker/states.py)
    fresh = proto.restarted()
    fresh.move(ServerTrigger.LAUNCHED)
    fresh.start()
    actions = fresh.server_message(
        jsonrpc.result_response(
            "mcpbroker-initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {"logging": {}, "resources": {"subscribe": True}},
                "serverInfo": {"name": "srv"},
            },
        )
    )
    renewed = [(m["method"], m.get("params")) for m in sent(actions)]
    assert renewed == [
        ("notifications/initialized", None),
        ("resources/subscribe", {"uri": "file:///kept"}),
        ("logging/setLevel", {"level": "notice"}),
    ]


def test_fanout_alone() -> None:
    fanout = Fanout()
    assert fanout.admits(A, "debug")  # no level set: everything
    assert fanout.set_level(A, "warning") == "warning"
    assert not fanout.admits(A, "info") and fanout.admits(A, "emergency")
    assert fanout.unsubscribe(A, "never-subscribed") is False
