"""Notifications across the eras (broker/eras/subscriptions.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.eras.subscriptions import (
    Changes,
    Filter,
    Listeners,
    Offer,
    RequestLogLevels,
    UpstreamListen,
    offer_of,
)
from broker.eras.versions import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY, SUBSCRIPTION_ID_KEY
from broker.jsonrpc import JsonRpcError

EVERYTHING = Offer(frozenset({"toolsListChanged", "promptsListChanged", "resourcesListChanged"}),
                   subscribe=True)  # fmt: skip
TOOLS_CHANGED = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


def listen(id: Any, **wanted: Any) -> dict[str, Any]:
    params = {"_meta": {PROTOCOL_VERSION_KEY: "2026-07-28"}, "notifications": wanted}
    return {"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": params}


def updated(uri: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}}


def test_offer_of_a_views_capabilities() -> None:
    assert offer_of({"tools": {"listChanged": True}, "resources": {"subscribe": True}}) == Offer(
        frozenset({"toolsListChanged"}), subscribe=True
    )
    assert offer_of({"tools": {}, "prompts": {"listChanged": False}}) == Offer()


def test_listen_is_acknowledged_first_with_what_is_granted() -> None:
    listeners = Listeners(Offer(frozenset({"toolsListChanged"}), subscribe=False))
    acks, changes = listeners.listen(
        listen(1, toolsListChanged=True, promptsListChanged=True, resourceSubscriptions=["f:///a"])
    )
    assert acks == [
        {
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {
                "_meta": {SUBSCRIPTION_ID_KEY: 1},
                "notifications": {"toolsListChanged": True},
            },
        }
    ]
    assert changes == Changes()


def test_notifications_go_to_the_streams_that_asked_stamped_with_their_id() -> None:
    listeners = Listeners(EVERYTHING)
    listeners.listen(listen(1, toolsListChanged=True))
    _, changes = listeners.listen(listen("r", resourceSubscriptions=["f:///a", "f:///b"]))
    assert changes == Changes(added=frozenset({"f:///a", "f:///b"}))
    assert listeners.route(TOOLS_CHANGED) == [
        {**TOOLS_CHANGED, "params": {"_meta": {SUBSCRIPTION_ID_KEY: 1}}}
    ]
    assert listeners.route(updated("f:///a")) == [
        {**updated("f:///a"), "params": {"uri": "f:///a", "_meta": {SUBSCRIPTION_ID_KEY: "r"}}}
    ]
    assert listeners.route(updated("f:///c")) == []
    assert listeners.route({"jsonrpc": "2.0", "method": "notifications/prompts/list_changed"}) == []


@pytest.mark.parametrize("uri", [["f:///a"], {"f:///a": 1}])
def test_an_update_whose_uri_is_no_string_goes_to_no_stream(uri: Any) -> None:
    listeners = Listeners(EVERYTHING)
    listeners.listen(listen(1, resourceSubscriptions=["f:///a"]))
    note = {**updated("f:///a"), "params": {"uri": uri}}
    assert listeners.route(note) == []


def test_cancelling_a_stream_releases_only_the_uris_no_other_stream_holds() -> None:
    listeners = Listeners(EVERYTHING)
    listeners.listen(listen(1, resourceSubscriptions=["f:///a", "f:///b"]))
    listeners.listen(listen(2, resourceSubscriptions=["f:///b"]))
    assert listeners.cancel(1) == Changes(removed=frozenset({"f:///a"}))
    assert listeners.cancel(1) is None
    assert listeners.route(updated("f:///b")) != []
    results, changes = listeners.close_all()
    assert results == [
        {"jsonrpc": "2.0", "id": 2,
         "result": {"resultType": "complete", "_meta": {SUBSCRIPTION_ID_KEY: 2}}}
    ]  # fmt: skip
    assert changes == Changes(removed=frozenset({"f:///b"}))
    assert len(listeners) == 0


@pytest.mark.parametrize(
    "request_",
    [
        {"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": {}},
        listen(1, resourceSubscriptions="f:///a"),
        listen(1, resourceSubscriptions=[1]),
    ],
)
def test_a_malformed_listen_is_invalid_params(request_: dict[str, Any]) -> None:
    with pytest.raises(JsonRpcError) as caught:
        Listeners(EVERYTHING).listen(request_)
    assert caught.value.code == -32602 and caught.value.id == 1


def test_streams_are_bounded_and_their_ids_unique() -> None:
    listeners = Listeners(EVERYTHING, limit=1)
    listeners.listen(listen(1))
    with pytest.raises(JsonRpcError) as same:
        listeners.listen(listen(1))
    assert same.value.code == -32600
    with pytest.raises(JsonRpcError) as full:
        listeners.listen(listen(2))
    assert full.value.code == -32005


@given(st.lists(st.tuples(st.integers(0, 5), st.sets(st.sampled_from("abcd"))), max_size=12))
def test_the_uris_wanted_are_always_the_union_of_the_open_streams(
    steps: list[tuple[int, set[str]]],
) -> None:
    """Listening to a stream not open, cancelling one that is: the changes told,
    added up, are always exactly the URIs some open stream holds."""
    listeners = Listeners(EVERYTHING)
    wanted: set[str] = set()
    for id, uris in steps:
        changes = listeners.cancel(id)
        if changes is None:
            _, changes = listeners.listen(listen(id, resourceSubscriptions=sorted(uris)))
        assert not (changes.added & wanted) and changes.removed <= wanted
        wanted = (wanted | changes.added) - changes.removed
        assert wanted == set(listeners.uris())


# -- the broker's stream at a modern server ------------------------------------


def test_the_upstream_stream_follows_what_legacy_sessions_want() -> None:
    upstream = UpstreamListen({"roots": {}})
    first = Filter(frozenset({"toolsListChanged"}), frozenset({"f:///a"}))
    assert upstream.want(first, 10) == [
        {
            "jsonrpc": "2.0",
            "id": 10,
            "method": "subscriptions/listen",
            "params": {
                "_meta": {
                    PROTOCOL_VERSION_KEY: "2026-07-28",
                    CLIENT_CAPABILITIES_KEY: {"roots": {}},
                },
                "notifications": {"toolsListChanged": True, "resourceSubscriptions": ["f:///a"]},
            },
        }
    ]
    assert upstream.want(first, 11) == []
    second = Filter(frozenset({"toolsListChanged"}), frozenset())
    cancel, reopen = upstream.want(second, 12)
    assert cancel == {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 10, "reason": "subscriptions changed"},
    }
    assert reopen["id"] == 12


def stamped(notification: dict[str, Any], id: Any, **params: Any) -> dict[str, Any]:
    return {**notification, "params": {**params, "_meta": {SUBSCRIPTION_ID_KEY: id}}}


def test_the_upstream_streams_notifications_come_out_legacy() -> None:
    upstream = UpstreamListen({})
    upstream.want(Filter(frozenset({"toolsListChanged"})), 10)
    assert upstream.receive(stamped(TOOLS_CHANGED, 10)) is None  # before the ack: dropped
    ack = {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged"}
    assert upstream.receive(stamped(ack, 10, notifications={"toolsListChanged": True})) is None
    assert upstream.granted == Filter(frozenset({"toolsListChanged"}))
    assert upstream.receive(stamped(TOOLS_CHANGED, 10)) == {**TOOLS_CHANGED, "params": {}}
    assert upstream.receive(stamped(TOOLS_CHANGED, 9)) is None  # an old stream's
    progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
    assert upstream.receive(progress) is progress
    assert upstream.ended({"jsonrpc": "2.0", "id": 3, "result": {}}) is None
    # A graceful end: listen again for the same.
    again = upstream.ended({"jsonrpc": "2.0", "id": 10, "result": {}})
    assert again == Filter(frozenset({"toolsListChanged"}))
    assert upstream.id is None


def test_a_changed_filter_replaces_an_acknowledged_stream_make_before_break() -> None:
    # Until the new stream is acknowledged the old one is still relayed, so
    # an update of a URI both hold is never lost in between; then the old
    # one is cancelled, and its stragglers dropped.
    upstream = UpstreamListen({})
    ack = {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged"}
    updated = {"jsonrpc": "2.0", "method": "notifications/resources/updated"}
    x = Filter(frozenset(), frozenset({"f:///x"}))
    upstream.want(x, 10)
    upstream.receive(stamped(ack, 10, notifications={"resourceSubscriptions": ["f:///x"]}))
    xy = Filter(frozenset(), frozenset({"f:///x", "f:///y"}))
    (listen,) = upstream.want(xy, 11)  # (no cancel yet)
    assert listen["method"] == "subscriptions/listen" and upstream.id == 11
    assert upstream.receive(stamped(updated, 10, uri="f:///x")) == {
        **updated, "params": {"uri": "f:///x"}}  # fmt: skip
    assert upstream.receive(stamped(updated, 11, uri="f:///x")) is None  # (before its ack)
    assert upstream.take_retired() == []
    both = {"resourceSubscriptions": ["f:///x", "f:///y"]}
    assert upstream.receive(stamped(ack, 11, notifications=both)) is None
    assert upstream.take_retired() == [{"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 10, "reason": "subscriptions changed"}}]  # fmt: skip
    assert upstream.take_retired() == []
    assert upstream.receive(stamped(updated, 10, uri="f:///x")) is None
    assert upstream.receive(stamped(updated, 11, uri="f:///x")) is not None


def test_a_replacement_refused_leaves_the_stream_it_was_to_replace() -> None:
    upstream = UpstreamListen({})
    ack = {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged"}
    x = Filter(frozenset(), frozenset({"f:///x"}))
    upstream.want(x, 10)
    upstream.receive(stamped(ack, 10, notifications={"resourceSubscriptions": ["f:///x"]}))
    xy = Filter(frozenset(), frozenset({"f:///x", "f:///y"}))
    upstream.want(xy, 11)
    # Replaced again before that one's ack: that one is cancelled at once.
    xyz = Filter(frozenset(), frozenset({"f:///x", "f:///y", "f:///z"}))
    cancel, listen = upstream.want(xyz, 12)
    assert cancel["params"]["requestId"] == 11 and listen["id"] == 12
    refused = {"jsonrpc": "2.0", "id": 12, "error": {"code": -32603, "message": "limit"}}
    assert upstream.ended(refused) is None
    assert upstream.id == 10 and upstream.filter == x  # (still open: the listen again)
    assert upstream.want(xyz, 13) == []  # (refused: not asked again)
    (cancel,) = upstream.want(Filter(), 14)
    assert cancel["params"]["requestId"] == 10


def test_a_refused_stream_is_not_asked_again_until_the_filter_changes() -> None:
    upstream = UpstreamListen({})
    tools = Filter(frozenset({"toolsListChanged"}))
    (listen,) = upstream.want(tools, "l1")
    refused = {"jsonrpc": "2.0", "id": "l1", "error": {"code": -32603, "message": "limit"}}
    assert upstream.ended(refused) is None
    assert upstream.want(tools, "l2") == []  # (no loop of refusals)
    wider = Filter(frozenset({"toolsListChanged"}), frozenset({"f:///a"}))
    (listen,) = upstream.want(wider, "l3")
    assert listen["id"] == "l3"


def test_an_empty_filter_closes_the_stream() -> None:
    upstream = UpstreamListen({})
    assert upstream.want(Filter(), "l1") == []  # nothing to hear of: no stream
    upstream.want(Filter(frozenset(), frozenset({"f:///a"})), "l2")
    (cancel,) = upstream.want(Filter(), "l3")
    assert cancel["method"] == "notifications/cancelled"
    assert cancel["params"]["requestId"] == "l2"
    assert upstream.id is None


# -- per-request log levels ------------------------------------------------------


def message(level: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": level, "data": "x"}}  # fmt: skip


def test_a_session_hears_log_messages_only_while_a_request_asked_for_them() -> None:
    levels = RequestLogLevels()
    assert not levels.admits(message("emergency"))
    assert levels.open(1, None) is None
    assert not levels.admits(message("emergency"))
    assert levels.open(1, "warning") == "warning"
    assert levels.open(2, "error") is None  # warning is still the most verbose
    assert levels.admits(message("warning")) and not levels.admits(message("info"))
    assert levels.open(3, "debug") == "debug"
    assert levels.close(3) is True and levels.level() == "warning"
    assert levels.close(1) is True and levels.level() == "error"
    assert levels.close(1) is False
    assert levels.close(2) is True and levels.level() is None
    assert not levels.admits(message("error"))
    assert not levels.admits({"jsonrpc": "2.0", "method": "notifications/message"})
