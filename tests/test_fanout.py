"""Log levels and resource subscriptions through one shared server, sans-I/O."""

from __future__ import annotations

from typing import Any

import pytest

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


def test_once_the_server_took_a_subscribe_later_ones_are_answered_by_the_broker() -> None:
    proto = ready()
    (request,) = sent(subscribe(proto, A, 1))
    assert request["method"] == "resources/subscribe"
    assert delivered(proto.server_message(jsonrpc.result_response(request["id"], {}))) == [
        (A, jsonrpc.result_response(1, {}))
    ]
    second = subscribe(proto, B, 1)
    assert sent(second) == [] and delivered(second) == [(B, jsonrpc.result_response(1, {}))]


def test_a_subscribe_while_the_first_is_on_its_way_hears_the_servers_own_answer() -> None:
    """(It was answered {} at once; the first's refusal then left it told
    success, and the URI subscribed for nobody: later ones answered {} too.)"""
    proto = ready()
    (first,) = sent(subscribe(proto, A, 1))
    (second,) = sent(subscribe(proto, B, 1))
    refusal = jsonrpc.error_response(first["id"], -32603, "not yet")
    assert delivered(proto.server_message(refusal)) == [(A, {**refusal, "id": 1})]
    assert delivered(proto.server_message(jsonrpc.result_response(second["id"], {}))) == [
        (B, jsonrpc.result_response(1, {}))
    ]
    updated = jsonrpc.notification("notifications/resources/updated", {"uri": "file:///x"})
    assert delivered(proto.server_message(updated)) == [(B, updated)]


def test_a_subscribe_refused_before_it_went_leaves_no_subscriber() -> None:
    """Refused by a rule of the broker's (here its id is in use by a call of
    the session's: -32600; the same at maxServerInFlight, -32005): the next
    subscribe goes to the server. (It was counted: the server was never
    asked, and every later subscriber was answered {} by the broker.)"""
    proto = ready()
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}}
    assert sent(proto.client_request(A, call))
    with pytest.raises(jsonrpc.JsonRpcError):
        subscribe(proto, A, 1)
    assert [m["method"] for m in sent(subscribe(proto, B, 2))] == ["resources/subscribe"]


def test_a_refusal_after_another_took_and_left_drops_the_uri() -> None:
    """A's subscribe is taken and A leaves while B's is on its way (B still
    counts: nothing goes); B's is refused: nobody is subscribed, and the
    server, which holds A's, is told to drop it."""
    proto = ready()
    (first,) = sent(subscribe(proto, A, 1))
    (second,) = sent(subscribe(proto, B, 1))
    proto.server_message(jsonrpc.result_response(first["id"], {}))
    assert sent(unsubscribe(proto, A, 2)) == []
    actions = proto.server_message(jsonrpc.error_response(second["id"], -32603, "no"))
    assert [(m["method"], m["params"]) for m in sent(actions)] == [
        ("resources/unsubscribe", {"uri": "file:///x"})
    ]
    assert delivered(actions)[0][1]["error"]["message"] == "no"


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


def test_a_session_that_wants_no_level_now_leaves_the_others_level() -> None:
    """(A 2026-07-28 session whose requests that asked for logs ended.)"""
    proto = ready()
    sent(proto.client_log_level(A, "warning"))
    assert [m["params"] for m in sent(proto.client_log_level(B, "debug"))] == [{"level": "debug"}]
    assert [m["params"] for m in sent(proto.client_log_level(B, None))] == [{"level": "warning"}]
    assert sent(proto.client_log_level(A, None)) == []  # (MCP has no "unset": kept)


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


def test_a_log_message_mcp_does_not_allow_goes_to_nobody_with_one_warning() -> None:
    """No level of RFC 5424's eight, no level, no data, or no params: there is
    nothing to filter it by, and the broker does not make a message the
    schema forbids of it (it used to pass them all, a null params rewritten
    to ``{"logger": "srv"}``). Found by probing."""
    proto = ready()
    proto.client_log_level(A, "error")  # B set none: it would get everything
    bad = [
        {"level": "trace", "data": "x"},
        {"data": "x"},
        {"level": "error"},
        None,
        {"level": 3, "data": "x"},
    ]
    first, *rest = [
        proto.server_message(jsonrpc.notification("notifications/message", params))
        for params in bad
    ]
    assert delivered(first) == [] and [type(a).__name__ for a in first] == ["Warn"]
    assert first[0].event == "server.invalid_log_message" and "'trace'" in first[0].detail
    assert rest == [[]] * len(rest)  # dropped, without a word more
    good = jsonrpc.notification("notifications/message", {"level": "error", "data": None})
    assert [s for s, _ in delivered(proto.server_message(good))] == [A, B]


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


def test_a_groups_fanouts_merge_and_split_by_session() -> None:
    one, two = Fanout(), Fanout()
    one.set_level("a", "error")
    one.subscribe("a", "u1")
    two.set_level("b", "debug")
    two.subscribe("b", "u1")
    two.subscribe("b", "u2")
    both = one.merged(two)
    assert both.subscribing() == {"a", "b"}
    assert both.subscribers("u1") == {"a", "b"} and both.upstream_level() == "debug"
    mine = both.only({"a"})
    assert mine.subscribed_uris() == ["u1"] and mine.subscribers("u1") == {"a"}
    assert mine.upstream_level() == "error"
    levels = both.levels_only()
    assert levels.subscribed_uris() == [] and levels.level_of("b") == "debug"


def test_a_sessions_subscriptions_dropped_without_the_server_are_not_renewed() -> None:
    fanout = Fanout()
    for session in ("a", "b"):
        fanout.subscribe(session, "u1")
    fanout.subscribe("a", "u2")
    fanout.accepted("u1")
    fanout.accepted("u2")
    fanout.set_level("a", "error")
    fanout.drop_subscriptions("a")
    assert fanout.subscribers("u1") == {"b"}
    assert fanout.subscribed_uris() == ["u1"]  # (what a restart subscribes again)
    assert fanout.level_of("a") == "error"  # (its log level stays)
    assert fanout.subscribe("c", "u2")  # (u2 is asked of the server again)
