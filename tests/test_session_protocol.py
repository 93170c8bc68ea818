"""SessionProtocol: a downstream client's lifecycle, local answers, routing, batches."""

from __future__ import annotations

from typing import Any

import pytest

from broker import jsonrpc
from broker.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    id_key,
)
from broker.lifecycle import LATEST_LEGACY_VERSION, LEGACY_VERSIONS
from broker.session import (
    EMPTY_LISTS,
    FORWARDED_METHODS,
    CancelUpstream,
    Forward,
    Phase,
    Reply,
    SessionProtocol,
)

BROKER_INFO = {"name": "mcpbroker", "version": "0.1.0"}


def req(id: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def initialize(id: Any = 0, version: Any = "2025-06-18") -> dict[str, Any]:
    params = {"protocolVersion": version, "capabilities": {"roots": {}}, "clientInfo": {"n": 1}}
    return req(id, "initialize", params)


def ok(id: Any, result: Any = None) -> Reply:
    return Reply(jsonrpc.result_response(id, {} if result is None else result))


def error_of(actions: list[Any]) -> tuple[Any, int, str]:
    """(id, code, message) of the single error reply in ``actions``."""
    [action] = actions
    assert isinstance(action, Reply)
    assert isinstance(action.message, dict)
    error = action.message["error"]
    return action.message["id"], error["code"], error["message"]


def session(*view: str, version: str = "2025-06-18") -> SessionProtocol:
    proto = SessionProtocol(view)
    proto.receive(initialize(version=version))
    assert proto.phase is Phase.OPERATING
    return proto


def upstream_answer(id: Any) -> dict[str, Any]:
    return jsonrpc.result_response(id, {"from": "upstream", "id": id})


# -- initialize --------------------------------------------------------------


def test_initialize_result() -> None:
    proto = SessionProtocol(("files",))
    assert proto.receive(initialize(1, "2025-06-18")) == [
        ok(
            1,
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {
                    "tools": {"listChanged": True},
                    "resources": {"listChanged": True},
                    "prompts": {"listChanged": True},
                    "completions": {},
                },
                "serverInfo": BROKER_INFO,
                "instructions": "mcpbroker shares these MCP servers: files.",
            },
        )
    ]
    assert proto.phase is Phase.OPERATING
    assert proto.protocol_version == "2025-06-18"
    assert proto.client_capabilities == {"roots": {}}
    assert proto.client_info == {"n": 1}


def initialized_result(version: Any) -> dict[str, Any]:
    [reply] = SessionProtocol(()).receive(initialize("i", version))
    assert isinstance(reply, Reply) and isinstance(reply.message, dict)
    return reply.message["result"]


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_initialize_negotiates_known_version(version: str) -> None:
    assert initialized_result(version)["protocolVersion"] == version


@pytest.mark.parametrize("version", ["2026-07-28", "1999-01-01"])
def test_initialize_unknown_version_gives_latest(version: str) -> None:
    assert initialized_result(version)["protocolVersion"] == LATEST_LEGACY_VERSION


def test_no_completions_for_2024_11_05() -> None:
    assert "completions" not in initialized_result("2024-11-05")["capabilities"]


def test_empty_view_instructions() -> None:
    assert "no MCP servers" in initialized_result("2025-06-18")["instructions"]


def test_initialize_bad_params() -> None:
    proto = SessionProtocol(())
    id, code, _ = error_of(proto.receive(req(5, "initialize", {"capabilities": {}})))
    assert (id, code) == (5, INVALID_PARAMS)
    assert proto.phase is Phase.NEW


def test_second_initialize_rejected() -> None:
    proto = session("files")
    id, code, message = error_of(proto.receive(initialize(2, "2024-11-05")))
    assert (id, code) == (2, INVALID_REQUEST)
    assert "already initialized" in message
    assert proto.protocol_version == "2025-06-18"


# -- before initialize -------------------------------------------------------


def test_ping_before_initialize() -> None:
    proto = SessionProtocol(("files",))
    assert proto.receive(req("p", "ping")) == [ok("p")]
    assert proto.phase is Phase.NEW


@pytest.mark.parametrize("method", ["tools/list", "tools/call", "made/up"])
def test_other_requests_before_initialize(method: str) -> None:
    proto = SessionProtocol(("files",))
    id, code, message = error_of(proto.receive(req(1, method)))
    assert (id, code) == (1, INVALID_REQUEST)
    assert "initialize" in message


def test_notification_before_initialize_ignored() -> None:
    proto = SessionProtocol(("files",))
    assert proto.receive(jsonrpc.notification("notifications/initialized")) == []


# -- local answers and errors ------------------------------------------------


@pytest.mark.parametrize("initialized", [False, True])
def test_server_discover_not_found(initialized: bool) -> None:
    proto = session("files") if initialized else SessionProtocol(("files",))
    id, code, _ = error_of(proto.receive(req(1, "server/discover")))
    assert (id, code) == (1, METHOD_NOT_FOUND)


def test_unknown_method() -> None:
    id, code, message = error_of(session("files").receive(req("u", "made/up")))
    assert (id, code) == ("u", METHOD_NOT_FOUND)
    assert "made/up" in message


def test_ping_after_initialize() -> None:
    assert session("files").receive(req(9, "ping")) == [ok(9)]


def test_invalid_message_answered() -> None:
    proto = session("files")
    id, code, _ = error_of(proto.receive({"jsonrpc": "2.0", "id": 3, "method": 4}))
    assert (id, code) == (3, INVALID_REQUEST)
    id, code, _ = error_of(proto.receive("hello"))
    assert (id, code) == (None, INVALID_REQUEST)


def test_client_response_ignored() -> None:
    assert session("files").receive(jsonrpc.result_response(1, {})) == []


# -- routing -----------------------------------------------------------------


@pytest.mark.parametrize("method", sorted(FORWARDED_METHODS))
def test_forwarded_to_single_server(method: str) -> None:
    proto = session("files")
    message = req(4, method, {"name": "x"})
    assert proto.receive(message) == [Forward("files", req(4, method, {"name": "x"}))]
    assert proto.inflight == {id_key(4)}


@pytest.mark.parametrize(("method", "key"), sorted(EMPTY_LISTS.items()))
def test_empty_view_lists_are_empty(method: str, key: str) -> None:
    proto = session()
    assert proto.receive(req(1, method)) == [ok(1, {key: []})]
    assert proto.inflight == set()


def test_empty_view_call_is_an_error() -> None:
    id, code, message = error_of(session().receive(req(1, "tools/call", {"name": "t"})))
    assert (id, code) == (1, INVALID_REQUEST)
    assert "No MCP servers" in message


def test_multi_server_view_not_implemented() -> None:
    proto = session("files", "github")
    id, code, message = error_of(proto.receive(req(1, "tools/list")))
    assert (id, code) == (1, INTERNAL_ERROR)
    assert "2 servers" in message and "--server NAME" in message
    assert proto.inflight == set()


# -- cancellation and in-flight bookkeeping ----------------------------------


def cancel(request_id: Any, **extra: Any) -> dict[str, Any]:
    return jsonrpc.notification("notifications/cancelled", {"requestId": request_id, **extra})


def test_cancellation_goes_upstream() -> None:
    proto = session("files")
    proto.receive(req("r", "tools/call"))
    assert proto.receive(cancel("r", reason="user")) == [
        CancelUpstream({"requestId": "r", "reason": "user"})
    ]
    assert proto.inflight == set()


@pytest.mark.parametrize(
    "note",
    [
        cancel(None),
        cancel(1.5),
        cancel(True),
        jsonrpc.notification("notifications/cancelled"),
    ],
)
def test_cancellation_without_valid_id_ignored(note: dict[str, Any]) -> None:
    assert session("files").receive(note) == []


def test_inflight_cleared_by_outgoing_response() -> None:
    proto = session("files")
    proto.receive(req(1, "tools/call"))
    proto.receive(req("1", "tools/call"))
    assert proto.inflight == {id_key(1), id_key("1")}
    assert proto.outgoing(upstream_answer("1")) == upstream_answer("1")
    assert proto.inflight == {id_key(1)}
    note = jsonrpc.notification("notifications/progress", {"progressToken": 1})
    assert proto.outgoing(note) == note
    assert proto.inflight == {id_key(1)}
    assert proto.outgoing(upstream_answer(1)) == upstream_answer(1)
    assert proto.inflight == set()


# -- refusal -----------------------------------------------------------------


@pytest.mark.parametrize("message", [initialize(1), req(1, "ping"), req(1, "tools/list")])
def test_refusal_answers_every_request(message: dict[str, Any]) -> None:
    proto = SessionProtocol((), refusal="unknown server 'nope'")
    id, code, text = error_of(proto.receive(message))
    assert (id, code) == (1, INVALID_PARAMS)
    assert "unknown server 'nope'" in text
    assert proto.phase is Phase.NEW


# -- batches -----------------------------------------------------------------


def batch_session() -> SessionProtocol:
    return session("files", version="2025-03-26")


def sent_out(proto: SessionProtocol, messages: list[Any]) -> list[Any]:
    """What the connection writes for ``messages`` (held ones left out)."""
    written = [proto.outgoing(message) for message in messages]
    return [message for message in written if message is not None]


def replies(actions: list[Any]) -> list[Any]:
    return [action.message for action in actions if isinstance(action, Reply)]


def by_id(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(messages, key=lambda message: repr(message.get("id")))


@pytest.mark.parametrize("version", ["2024-11-05", "2025-06-18", "2025-11-25"])
def test_batch_rejected_outside_2025_03_26(version: str) -> None:
    proto = session("files", version=version)
    id, code, message = error_of(proto.receive([req(1, "ping")]))
    assert (id, code) == (None, INVALID_REQUEST)
    assert "2025-03-26" in message and version in message


def test_batch_rejected_before_initialize() -> None:
    id, code, message = error_of(SessionProtocol(("files",)).receive([req(1, "ping")]))
    assert (id, code) == (None, INVALID_REQUEST)
    assert "none yet" in message


@pytest.mark.parametrize("initialized", [False, True])
def test_empty_batch(initialized: bool) -> None:
    proto = batch_session() if initialized else SessionProtocol(("files",))
    id, code, message = error_of(proto.receive([]))
    assert (id, code) == (None, INVALID_REQUEST)
    assert "Empty batch" in message


def test_mixed_batch_collected_into_one_array() -> None:
    proto = batch_session()
    invalid = {"jsonrpc": "2.0", "method": 42}
    actions = proto.receive(
        [
            req(1, "ping"),
            req(2, "tools/call", {"name": "t"}),
            jsonrpc.notification("notifications/initialized"),
            invalid,
        ]
    )
    assert actions == [ok(1), Forward("files", req(2, "tools/call", {"name": "t"}))]
    assert proto.inflight == {id_key(2)}

    # The actor passes the ping reply through outgoing(): held for the batch.
    assert sent_out(proto, replies(actions)) == []
    [array] = sent_out(proto, [upstream_answer(2)])
    assert isinstance(array, list)
    assert len(array) == 3
    [error] = [message for message in array if "error" in message]
    assert (error["id"], error["error"]["code"]) == (None, INVALID_REQUEST)
    assert by_id([m for m in array if "result" in m]) == [
        jsonrpc.result_response(1, {}),
        upstream_answer(2),
    ]
    assert proto.inflight == set()
    assert not proto.batches.pending


def test_batch_of_local_answers() -> None:
    proto = batch_session()
    actions = proto.receive([req(1, "ping"), req("1", "made/up")])
    assert len(actions) == 2
    [array] = sent_out(proto, replies(actions))
    assert [message["id"] for message in array] == [1, "1"]
    assert array[1]["error"]["code"] == METHOD_NOT_FOUND


def test_batch_of_invalid_items_answered_at_once() -> None:
    proto = batch_session()
    [reply] = proto.receive([1, "x", [req(1, "ping")]])
    assert isinstance(reply, Reply) and isinstance(reply.message, list)
    assert [(m["id"], m["error"]["code"]) for m in reply.message] == [(None, INVALID_REQUEST)] * 3
    assert not proto.batches.pending


def test_batch_of_notifications_gets_nothing() -> None:
    proto = batch_session()
    proto.receive(req("r", "tools/call"))
    assert proto.receive([jsonrpc.notification("notifications/initialized"), cancel("r")]) == [
        CancelUpstream({"requestId": "r"})
    ]


def test_initialize_in_batch_rejected() -> None:
    proto = batch_session()
    actions = proto.receive([initialize(7, "2025-03-26")])
    [array] = sent_out(proto, replies(actions))
    [error] = array
    assert (error["id"], error["error"]["code"]) == (7, INVALID_REQUEST)
    assert "batch" in error["error"]["message"]


def test_responses_outside_the_batch_pass_through() -> None:
    proto = batch_session()
    proto.receive(req("solo", "tools/call"))
    proto.receive([req(1, "tools/call"), req(2, "tools/call")])
    assert sent_out(proto, [upstream_answer(1)]) == []
    assert sent_out(proto, [upstream_answer("solo")]) == [upstream_answer("solo")]
    assert sent_out(proto, [upstream_answer(2)]) == [[upstream_answer(1), upstream_answer(2)]]
    assert proto.inflight == set()


def test_two_batches_collected_separately() -> None:
    proto = batch_session()
    proto.receive([req(1, "tools/call"), req(2, "tools/call")])
    proto.receive([req(3, "tools/call")])
    assert sent_out(proto, [upstream_answer(3)]) == [[upstream_answer(3)]]
    assert sent_out(proto, [upstream_answer(2), upstream_answer(1)]) == [
        [upstream_answer(2), upstream_answer(1)]
    ]


def test_cancelled_batch_request_releases_the_rest() -> None:
    proto = batch_session()
    actions = proto.receive([req(1, "ping"), req(2, "tools/call")])
    assert sent_out(proto, replies(actions)) == []
    # The server will never answer 2 now: the batch goes out without it.
    assert proto.receive(cancel(2)) == [
        CancelUpstream({"requestId": 2}),
        Reply([jsonrpc.result_response(1, {})]),
    ]
    assert not proto.batches.pending


def test_cancelled_batch_request_before_other_answers() -> None:
    proto = batch_session()
    actions = proto.receive([req(1, "ping"), req(2, "tools/call")])
    assert proto.receive(cancel(2)) == [CancelUpstream({"requestId": 2})]
    assert sent_out(proto, replies(actions)) == [[jsonrpc.result_response(1, {})]]


def test_cancel_inside_the_batch_sends_the_array_once() -> None:
    proto = batch_session()
    invalid = {"jsonrpc": "2.0", "method": 42}
    actions = proto.receive([invalid, req(2, "tools/call"), cancel(2)])
    assert [type(action) for action in actions] == [Forward, CancelUpstream, Reply]
    [array] = replies(actions)
    assert [(m["id"], m["error"]["code"]) for m in array] == [(None, INVALID_REQUEST)]
    assert not proto.batches.pending
