"""The 2026-07-28 Streamable HTTP rules (broker/wire/http_modern.py), without an event loop."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from broker.eras.tokens import RequestStates
from broker.eras.versions import SUPPORTED_VERSIONS
from broker.jsonrpc import id_key
from broker.wire import http
from broker.wire.http_modern import (
    METHODS,
    ModernPost,
    answer_mode,
    answers,
    decode_header_value,
    parked_token,
    read_post,
    status_of,
    wrong_verb,
)
from broker.wire.websocket import Policy

MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def request(method: str = "tools/list", meta: Any = META, **params: Any) -> dict[str, Any]:
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": 5, "method": method, "params": params}


def headers_for(message: dict[str, Any], **changes: str | None) -> list[tuple[bytes, bytes]]:
    fields: dict[str, str | None] = {
        "mcp-protocol-version": MODERN,
        "mcp-method": message.get("method"),
    }
    params = message.get("params") or {}
    name = params.get("name", params.get("uri"))
    if isinstance(name, str):
        fields["mcp-name"] = name
    fields.update({key.replace("_", "-"): value for key, value in changes.items()})
    return [(k.encode(), v.encode()) for k, v in fields.items() if v is not None]


def post(message: Any, headers: list[tuple[bytes, bytes]] | None = None) -> Any:
    if headers is None:
        headers = headers_for(message)
    body = message if isinstance(message, bytes) else orjson.dumps(message)
    return read_post(body, http.fields_of(headers), headers)


def refused(answer: Any, status: int, code: int) -> dict[str, Any]:
    assert isinstance(answer, http.Refuse), answer
    assert (answer.status, answer.code) == (status, code), answer
    body: dict[str, Any] = orjson.loads(answer.body())
    assert body["error"]["code"] == code
    return body


def test_a_request_whose_headers_mirror_its_body_passes() -> None:
    for message in (
        request(),
        request("server/discover"),
        request("tools/call", name="files__read", arguments={}),
        request("prompts/get", name="p"),
        request("resources/read", uri="file:///a b/c.txt"),
        request("subscriptions/listen", notifications={}),
    ):
        answer = post(message)
        assert isinstance(answer, ModernPost) and answer.request
        assert (answer.id, answer.method) == (5, message["method"])


def test_a_header_is_case_insensitive_by_name_and_exact_by_value() -> None:
    message = request("tools/call", name="echo")
    shouted = [(b"MCP-Protocol-Version", MODERN.encode()), (b"Mcp-Method", b"tools/call")]
    assert isinstance(post(message, [*shouted, (b"MCP-NAME", b"echo")]), ModernPost)
    refused(post(message, [*shouted, (b"mcp-name", b"ECHO")]), 400, -32020)
    refused(post(message, headers_for(message, mcp_method="Tools/Call")), 400, -32020)


@pytest.mark.parametrize(
    ("message", "changes"),
    [
        (request(), {"mcp_method": None}),
        (request(), {"mcp_method": "tools/call"}),
        (request("tools/call", name="a"), {"mcp_name": None}),
        (request("tools/call", name="a"), {"mcp_name": "b"}),
        (request("resources/read", uri="file:///x"), {"mcp_name": "file:///y"}),
        (request("prompts/get", name="a"), {"mcp_name": "=?base64?not base64?="}),
    ],
)
def test_a_missing_or_different_header_is_header_mismatch(
    message: dict[str, Any], changes: dict[str, str | None]
) -> None:
    body = refused(post(message, headers_for(message, **changes)), 400, -32020)
    assert body["id"] == 5  # (the request's id: it was read)


def test_a_routing_header_sent_twice_is_header_mismatch() -> None:
    message = request()
    twice = [*headers_for(message), (b"Mcp-Method", b"tools/list")]
    body = refused(post(message, twice), 400, -32020)
    assert "more than once" in body["error"]["message"]


def test_mcp_name_may_come_as_base64_of_utf8() -> None:
    name = "résumé ✓"
    encoded = "=?base64?" + base64.b64encode(name.encode()).decode() + "?="
    message = request("tools/call", name=name)
    assert isinstance(post(message, headers_for(message, mcp_name=encoded)), ModernPost)
    assert decode_header_value(encoded) == name
    assert decode_header_value("plain") == "plain"
    assert decode_header_value("=?base64?YQ=?=") is None  # not canonical
    assert decode_header_value("=?base64?/w==?=") is None  # not UTF-8


@pytest.mark.parametrize(
    "meta",
    [None, [], {"io.modelcontextprotocol/protocolVersion": MODERN}, {"x": 1}],
)
def test_meta_missing_or_incomplete_is_invalid_params(meta: Any) -> None:
    message = request(meta=meta)
    refused(post(message), 400, -32602)


def test_a_version_the_broker_does_not_serve_is_32022_naming_every_version() -> None:
    meta = {**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
    message = request(meta=meta)
    body = refused(
        post(message, headers_for(message, mcp_protocol_version="2099-01-01")), 400, -32022
    )
    assert body["error"]["data"] == {
        "supported": list(SUPPORTED_VERSIONS),
        "requested": "2099-01-01",
    }
    # A body that says another version than its header: a mismatch first (as the SDK).
    refused(post(message), 400, -32020)


def test_an_unknown_version_header_is_32022_before_anything_else() -> None:
    for message in (request(meta=None), {"jsonrpc": "2.0", "method": "notifications/x"}):
        headers = [(b"mcp-protocol-version", b"1999-01-01")]
        body = refused(post(message, headers), 400, -32022)
        assert body["id"] == message.get("id")
        assert body["error"]["data"]["requested"] == "1999-01-01"


def test_an_unknown_or_removed_method_is_404() -> None:
    for method in ("ping", "logging/setLevel", "resources/subscribe", "tasks/get", "x/y"):
        assert method not in METHODS
        refused(post(request(method)), 404, -32601)


def test_bodies_that_are_no_single_request() -> None:
    version = [(b"mcp-protocol-version", MODERN.encode())]
    refused(post(b"{not json", version), 400, -32700)
    refused(post([request()], headers_for(request())), 400, -32600)
    response = {"jsonrpc": "2.0", "id": 1, "result": {}}
    refused(post(response, version), 400, -32600)
    notification = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}
    accepted = post(notification, version)
    assert isinstance(accepted, ModernPost) and not accepted.request


def test_an_id_longer_than_the_broker_keeps_is_refused_before_any_stream() -> None:
    """(Its error has no id: a stream would wait for an answer in its id forever.)"""
    long = {**request(), "id": "x" * 257}
    body = refused(post(long), 400, -32600)
    assert body["id"] is None and "257 characters" in body["error"]["message"]
    assert isinstance(post({**request(), "id": "x" * 256}), ModernPost)


def test_a_retry_says_its_request_state() -> None:
    message = request("tools/call", name="a", requestState="mcpbroker.abc", inputResponses={})
    answer = post(message)
    assert isinstance(answer, ModernPost) and answer.request_state == "mcpbroker.abc"
    assert post(request()).request_state is None


def test_which_requests_are_modern_and_the_verbs_and_statuses() -> None:
    for version, modern in [(MODERN, True), ("2099-01-01", True), ("2025-06-18", False)]:
        headers = [(b"host", b"127.0.0.1"), (b"mcp-protocol-version", version.encode())]
        target = http.check_request("POST", "/mcp", "127.0.0.1", headers, ["s"], Policy())
        assert isinstance(target, http.Target) and target.modern is modern
    accepts_json = {"accept": "application/json"}
    assert answer_mode(accepts_json, "tools/call") is False
    refused = answer_mode(accepts_json, "subscriptions/listen")
    assert isinstance(refused, http.Refuse) and refused.status == 406
    assert answer_mode({"accept": "text/event-stream"}, "subscriptions/listen") is True
    for verb in ("GET", "DELETE"):
        refusal = wrong_verb(verb)
        assert refusal.status == 405 and refusal.headers == (("Allow", "POST"),)
        # (a version the broker does not know: 400 -32022, as a POST's, not 405,
        # which tells a legacy client with a typo that there is no GET stream)
        unknown = wrong_verb(verb, "2025-13-01")
        assert (unknown.status, unknown.code) == (400, -32022)
    assert [status_of(code) for code in (-32020, -32021, -32022, -32602, -32601, -32603, 7)] == [
        400,
        400,
        400,
        400,
        404,
        200,
        200,
    ]


def test_only_the_brokers_own_input_required_parks_a_call() -> None:
    ours = RequestStates(b"k" * 32).mint("session", {"call": 1})
    result = {"resultType": "input_required", "inputRequests": {}, "requestState": ours}
    assert parked_token({"jsonrpc": "2.0", "id": 1, "result": result}) == ours
    server_state = {**result, "requestState": "a server's own"}  # (the client retries it)
    assert parked_token({"jsonrpc": "2.0", "id": 1, "result": server_state}) is None
    brokers = {**result, "requestState": "mcpbroker.Zm9vYmFy.c3RhdGU"}  # (one behind this one)
    assert parked_token({"jsonrpc": "2.0", "id": 1, "result": brokers}) is None
    complete = {"resultType": "complete", "requestState": ours}
    assert parked_token({"jsonrpc": "2.0", "id": 1, "result": complete}) is None
    assert parked_token(None) is None
    assert answers({"jsonrpc": "2.0", "id": 1, "result": {}}, id_key(1))
    in_use = {"code": -32600, "message": "in use", "data": {"id": 1}}  # (the session's refusal)
    assert answers({"jsonrpc": "2.0", "id": None, "error": in_use}, id_key(1))
    assert not answers({"jsonrpc": "2.0", "id": None, "error": in_use}, id_key("1"))
    assert not answers({"jsonrpc": "2.0", "id": None, "error": {"code": -32700}}, id_key(1))
    assert not answers({"jsonrpc": "2.0", "id": "1", "result": {}}, id_key(1))
    assert not answers({"jsonrpc": "2.0", "id": 1, "method": "x"}, id_key(1))
