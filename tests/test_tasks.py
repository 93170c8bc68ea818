"""Tasks (2025-11-25) through shared servers: ids per server, access per session."""

from __future__ import annotations

from typing import Any

import pytest

from broker import jsonrpc
from broker.catalog import Catalog, ServerEntry
from broker.jsonrpc import JsonRpcError
from broker.lifecycle import ServerIdentity
from broker.states import ServerState
from broker.tasks import RELATED_TASK, split_task_id
from broker.upstream import Deliver, SendUpstream, UpstreamProtocol
from broker.views import initialize_for, route

A, B = "session-a", "session-b"
TASKS = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}


def ready(name: str) -> UpstreamProtocol:
    proto = UpstreamProtocol(name)
    proto.start()
    proto.server_message(
        jsonrpc.result_response(
            "mcpbroker-initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}, "tasks": TASKS},
                "serverInfo": {"name": name},
            },
        )
    )
    return proto


def call(proto: UpstreamProtocol, session: str, id: int, method: str, **params: Any) -> int:
    (send,) = proto.client_request(
        session, {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
    )
    assert isinstance(send, SendUpstream)
    return int(send.message["id"])


def answer(proto: UpstreamProtocol, upstream_id: int, result: Any) -> dict[str, Any]:
    (delivery,) = proto.server_message(jsonrpc.result_response(upstream_id, result))
    assert isinstance(delivery, Deliver)
    return delivery.message["result"]


def create_task(proto: UpstreamProtocol, session: str, server_task_id: str) -> str:
    sent = call(proto, session, 1, "tools/call", name="slow", task={"ttl": 1000})
    result = answer(proto, sent, {"task": {"taskId": server_task_id, "status": "working"}})
    return str(result["task"]["taskId"])


def test_task_ids_are_named_after_their_server() -> None:
    a, b = ready("a"), ready("b")
    assert create_task(a, A, "t1") == "a:t1"
    assert create_task(b, A, "t1") == "b:t1"
    assert split_task_id("a:t1", ["a", "b"]) == ("a", "t1")
    assert split_task_id("a%3Ab:t1", ["a", "a:b"]) == ("a:b", "t1")
    assert split_task_id("a:b:t1", ["a", "a:b"]) == ("a", "b:t1")  # (the first ":" ends it)
    assert split_task_id("c:t1", ["a", "b"]) is None


def test_a_colon_in_a_server_name_makes_no_two_task_ids_alike() -> None:
    """Servers ``a`` and ``a:b``: ``a``'s task ``b:t1`` was ``a:b:t1``, which
    a tasks/get routed to ``a:b`` (or to its own task ``t1``); each id now
    goes back to the server and task it came from."""
    servers, made = ["a", "a:b", "%", "50%:"], {}
    for server, task in [("a", "b:t1"), ("a:b", "t1"), ("%", "t1"), ("50%:", "%3A:t1")]:
        made[server, task] = create_task(ready(server), A, task)
    assert made["a", "b:t1"] == "a:b:t1" and made["a:b", "t1"] == "a%3Ab:t1"
    assert len(set(made.values())) == len(made)
    for (server, task), given in made.items():
        assert split_task_id(given, servers) == (server, task)
    assert split_task_id("a%3ab:t1", servers) is None  # (not an id the broker gave)
    assert split_task_id("a%3Ab:t1", ["a"]) is None and split_task_id("a", servers) is None


def test_only_the_creating_session_may_use_a_task() -> None:
    proto = ready("srv")
    create_task(proto, A, "t1")
    with pytest.raises(JsonRpcError) as refused:
        call(proto, B, 2, "tasks/get", taskId="t1")
    assert refused.value.code == jsonrpc.INVALID_PARAMS and "srv:t1" in refused.value.message
    sent = call(proto, A, 2, "tasks/get", taskId="t1")
    assert answer(proto, sent, {"taskId": "t1", "status": "working"})["taskId"] == "srv:t1"


def test_the_related_task_meta_of_a_result_is_renamed() -> None:
    proto = ready("srv")
    create_task(proto, A, "t1")
    sent = call(proto, A, 3, "tasks/result", taskId="t1")
    result = answer(proto, sent, {"content": [], "_meta": {RELATED_TASK: {"taskId": "t1"}}})
    assert result["_meta"][RELATED_TASK] == {"taskId": "srv:t1"}


def test_status_notifications_reach_only_the_owner() -> None:
    proto = ready("srv")
    create_task(proto, A, "t1")
    note = jsonrpc.notification(
        "notifications/tasks/status", {"taskId": "t1", "status": "completed"}
    )
    (delivery,) = proto.server_message(note)
    assert isinstance(delivery, Deliver) and delivery.session == A
    assert delivery.message["params"]["taskId"] == "srv:t1"
    stray = jsonrpc.notification("notifications/tasks/status", {"taskId": "t9", "status": "failed"})
    assert proto.server_message(stray) == []


def test_a_task_list_shows_a_session_only_its_own_tasks() -> None:
    proto = ready("srv")
    create_task(proto, A, "mine")
    create_task(proto, B, "theirs")
    sent = call(proto, A, 4, "tasks/list")
    listed = answer(proto, sent, {"tasks": [{"taskId": "mine"}, {"taskId": "theirs"}]})
    assert listed["tasks"] == [{"taskId": "srv:mine"}]


def test_a_task_list_entry_with_a_non_string_id_is_dropped() -> None:
    proto = ready("srv")
    create_task(proto, A, "mine")
    sent = call(proto, A, 4, "tasks/list")
    listed = answer(proto, sent, {"tasks": [{"taskId": ["mine"]}, {"taskId": "mine"}]})
    assert listed["tasks"] == [{"taskId": "srv:mine"}]


@pytest.mark.parametrize("meta", [["x"], "x", 5])
def test_a_task_result_whose_meta_is_no_object_passes_unrenamed(meta: Any) -> None:
    proto = ready("srv")
    create_task(proto, A, "t1")
    sent = call(proto, A, 2, "tasks/get", taskId="t1")
    result = answer(proto, sent, {"taskId": "t1", "status": "working", "_meta": meta})
    assert result["taskId"] == "srv:t1" and result["_meta"] == meta


def catalog(*servers: str, tasks: dict[str, Any] | None = None) -> Catalog:
    identity = ServerIdentity("2025-11-25", {"tools": {}, "tasks": tasks or TASKS}, {"name": "x"})
    return Catalog([ServerEntry(s, ServerState.READY, identity) for s in servers])


def test_sessions_route_task_requests_by_the_server_in_the_id() -> None:
    request = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": "b:t7"}}
    server, rewritten = route(catalog("a", "b"), ("a", "b"), False, request)
    assert server == "b" and rewritten["params"]["taskId"] == "t7"
    assert request["params"]["taskId"] == "b:t7"  # the client's message is left alone
    with pytest.raises(JsonRpcError):
        route(catalog("a"), ("a",), False, {**request, "params": {"taskId": "zzz"}})


def test_task_lists_need_exactly_one_listing_server() -> None:
    request = {"jsonrpc": "2.0", "id": 1, "method": "tasks/list"}
    assert route(catalog("a"), ("a",), False, request)[0] == "a"
    with pytest.raises(JsonRpcError) as several:
        route(catalog("a", "b"), ("a", "b"), False, request)
    assert several.value.code == jsonrpc.METHOD_NOT_FOUND
    capabilities = initialize_for(catalog("a", "b"), ("a", "b"), False, "2025-11-25")
    assert "list" not in capabilities["capabilities"]["tasks"]
    assert (
        initialize_for(catalog("a"), ("a",), True, "2025-11-25")["capabilities"]["tasks"] == TASKS
    )
    assert "tasks" not in initialize_for(catalog("a"), ("a",), True, "2025-06-18")["capabilities"]
