"""The rules of a 2026-07-28 POST to a modern server by URL
(broker/wire/http_upstream_modern.py): no event loop."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from broker import jsonrpc
from broker.eras.session import become_modern
from broker.eras.versions import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY
from broker.session import SessionProtocol
from broker.wire.http_modern import decode_header_value
from broker.wire.http_upstream_modern import (
    ParamHeaders,
    encode_header_value,
    error_answer,
    is_answer,
    is_header_mismatch,
    is_tools_list_start,
    modern_headers,
    modern_only_refusal,
    modern_refusal,
    modern_version,
    next_cursor,
    only_modern_versions,
    relist_request,
)
from tests.test_fuzz import Catalogs

MODERN = "2026-07-28"
META = {PROTOCOL_VERSION_KEY: MODERN, CLIENT_CAPABILITIES_KEY: {}}


def request(method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": dict(META)}}


def listed(*tools: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"tools": list(tools)}})


def tool(name: str, **properties: Any) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object", "properties": properties}}


def test_a_request_is_modern_by_the_version_in_its_meta() -> None:
    assert modern_version(request("tools/list")) == MODERN
    legacy = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {}}}
    assert modern_version(legacy) is None
    assert (
        modern_version({**request("x"), "params": {"_meta": {PROTOCOL_VERSION_KEY: "2025-11-25"}}})
        is None
    )
    notification = request("notifications/cancelled")
    del notification["id"]
    assert modern_version(notification) is None
    assert modern_version({"jsonrpc": "2.0", "id": 1, "method": "ping"}) is None


def test_a_remembered_meta_names_the_version_a_session_remembers() -> None:
    # A modern session's calls after its first carry the _meta it remembered
    # as the client's bytes (broker/eras/metacache.py): only 2026-07-28 ones.
    session = become_modern(SessionProtocol(("a",), Catalogs(), transparent=True), b"k" * 16)
    frames = [orjson.dumps(request("tools/call", name="t") | {"id": n}) for n in range(2)]
    session.receive(jsonrpc.decode(orjson.dumps(request("server/discover"))), settled=True)
    forwards: dict[str, list[Any]] = {}
    assert session.take_forwards(frames, 0, forwards) == 2
    second = forwards["a"][1]
    assert type(second["params"]["_meta"]) is orjson.Fragment
    assert modern_version(second) == MODERN
    assert modern_headers(second, MODERN, ParamHeaders()) == modern_headers(
        forwards["a"][0], MODERN, ParamHeaders()
    )


@pytest.mark.parametrize(
    ("value", "sent"),
    [
        ("us-west1", "us-west1"),
        ("Hello, 世界", "=?base64?SGVsbG8sIOS4lueVjA==?="),
        (" padded ", "=?base64?IHBhZGRlZCA=?="),
        ("line1\nline2", "=?base64?bGluZTEKbGluZTI=?="),
        ("=?base64?literal?=", "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="),
        ("tab\there", "=?base64?dGFiCWhlcmU=?="),
    ],
)
def test_values_are_encoded_as_the_spec_shows(value: str, sent: str) -> None:
    """The spec's table ("Value Encoding"), and the listener's decoder reads them back."""
    assert encode_header_value(value) == sent
    assert decode_header_value(sent) == value


def test_every_request_mirrors_its_version_and_method() -> None:
    headers = modern_headers(request("tools/list"), MODERN, ParamHeaders())
    assert headers == {"mcp-protocol-version": MODERN, "mcp-method": "tools/list"}


@pytest.mark.parametrize(
    ("method", "params", "name"),
    [
        ("tools/call", {"name": "get_weather", "arguments": {}}, "get_weather"),
        ("prompts/get", {"name": "greet"}, "greet"),
        (
            "resources/read",
            {"uri": "file:///projects/app/config.json"},
            "file:///projects/app/config.json",
        ),
        ("resources/read", {"uri": "test://era/café"}, "=?base64?dGVzdDovL2VyYS9jYWbDqQ==?="),
    ],
)
def test_a_named_request_mirrors_its_name(method: str, params: dict[str, Any], name: str) -> None:
    headers = modern_headers(request(method, **params), MODERN, ParamHeaders())
    assert headers["mcp-name"] == name
    assert headers["mcp-method"] == method


def test_marked_arguments_go_in_param_headers_once_the_tool_was_listed() -> None:
    params = ParamHeaders()
    call = request(
        "tools/call",
        name="sql",
        arguments={"region": "Zürich", "query": "SELECT 1", "n": 42, "dry": True, "opt": None},
    )
    assert "mcp-param-region" not in modern_headers(call, MODERN, params)  # never listed
    marked = tool(
        "sql",
        region={"type": "string", "x-mcp-header": "Region"},
        query={"type": "string"},
        n={"type": "integer", "x-mcp-header": "N"},
        dry={"type": "boolean", "x-mcp-header": "Dry"},
        opt={"type": "string", "x-mcp-header": "Opt"},
        absent={"type": "string", "x-mcp-header": "Absent"},
    )
    params.learn(listed(marked), first_page=True)
    headers = modern_headers(call, MODERN, params)
    assert {k: v for k, v in headers.items() if k.startswith("mcp-param-")} == {
        "mcp-param-Region": "=?base64?WsO8cmljaA==?=",
        "mcp-param-N": "42",
        "mcp-param-Dry": "true",
    }  # (null and absent arguments: no header)


def test_a_nested_mark_reads_the_value_at_its_path() -> None:
    params = ParamHeaders()
    nested = tool(
        "t",
        where={
            "type": "object",
            "properties": {"zone": {"type": "string", "x-mcp-header": "Zone"}},
        },
    )
    params.learn(listed(nested), first_page=True)
    assert params.headers("t", {"where": {"zone": "eu"}}) == {"mcp-param-Zone": "eu"}
    assert params.headers("t", {"where": "eu"}) == {}


def test_a_tool_with_an_invalid_mark_gets_no_param_headers_and_is_dropped() -> None:
    params = ParamHeaders()
    invalid = tool(
        "t", x={"type": "number", "x-mcp-header": "X"}, y={"type": "string", "x-mcp-header": "Y"}
    )
    params.learn(listed(invalid), first_page=True)
    assert params.headers("t", {"x": 1, "y": "a"}) == {}


def test_a_fresh_list_replaces_what_was_learnt_and_a_later_page_adds() -> None:
    params = ParamHeaders()
    params.learn(listed(tool("a", v={"type": "string", "x-mcp-header": "V"})), first_page=True)
    params.learn(listed(tool("b", v={"type": "string", "x-mcp-header": "W"})), first_page=False)
    assert params.headers("a", {"v": "1"}) == {"mcp-param-V": "1"}
    assert params.headers("b", {"v": "1"}) == {"mcp-param-W": "1"}
    params.learn(listed(tool("b", v={"type": "string"})), first_page=True)
    assert params.headers("a", {"v": "1"}) == {} and params.headers("b", {"v": "1"}) == {}
    params.learn(b"not json", first_page=True)  # (ignored)
    params.learn(orjson.dumps({"jsonrpc": "2.0", "id": 1, "error": {"code": 1}}), first_page=True)


def test_a_tools_list_without_a_cursor_lists_afresh() -> None:
    assert is_tools_list_start(request("tools/list"))
    assert not is_tools_list_start(request("tools/list", cursor="2"))
    assert not is_tools_list_start(request("prompts/list"))


def test_an_error_status_with_a_json_rpc_error_is_the_answer() -> None:
    error = {"code": -32601, "message": "Method not found"}
    body = orjson.dumps({"jsonrpc": "2.0", "id": 7, "error": error})
    assert error_answer(body, 7) == body
    null_id = orjson.dumps({"jsonrpc": "2.0", "id": None, "error": error})
    assert orjson.loads(error_answer(null_id, "p") or b"")["id"] == "p"  # the POST's request's
    assert error_answer(orjson.dumps({"jsonrpc": "2.0", "id": 8, "error": error}), 7) is None
    assert error_answer(b"Bad Request: Missing session ID", 7) is None
    assert error_answer(orjson.dumps({"jsonrpc": "2.0", "id": 7, "result": {}}), 7) is None


@pytest.mark.parametrize(
    ("code", "modern"),
    [
        (-32022, True),
        (-32020, True),
        (-32021, True),
        (-32601, True),
        (-32600, False),
        (-32602, False),
        ([-32601], False),  # a code that is no int is no refusal (nor a TypeError)
        ({"c": -32601}, False),
    ],
)
def test_an_initialize_refused_with_a_modern_error_is_no_reason_to_fall_back(
    code: Any, modern: bool
) -> None:
    body = orjson.dumps({"jsonrpc": "2.0", "id": "i", "error": {"code": code, "message": "no"}})
    assert (modern_refusal(body, "i") is not None) is modern
    assert modern_refusal(b"", "i") is None


def discovered(versions: Any) -> bytes:
    result = {"resultType": "complete", "supportedVersions": versions, "capabilities": {}}
    return orjson.dumps({"jsonrpc": "2.0", "id": "d", "result": result})


def test_a_discover_answer_naming_only_modern_versions_is_told_from_any_other() -> None:
    assert only_modern_versions(discovered([MODERN])) == [MODERN]
    assert only_modern_versions(discovered(["2027-01-01", MODERN])) == ["2027-01-01", MODERN]
    for other in ([MODERN, "2025-11-25"], ["2025-06-18"], [], [MODERN, 7], "2026-07-28", None):
        assert only_modern_versions(discovered(other)) is None  # dual-era, legacy, bad
    error = {"code": -32600, "message": "Bad Request: Missing session ID"}
    assert only_modern_versions(orjson.dumps({"jsonrpc": "2.0", "id": "d", "error": error})) is None
    assert only_modern_versions(b"Bad Request") is None
    assert only_modern_versions(b"[1]") is None


def test_an_initialize_refused_by_a_modern_only_server_reads_as_the_spec_has_it() -> None:
    said = {"code": -32602, "message": "params._meta must be an object"}
    refused = orjson.dumps({"jsonrpc": "2.0", "id": "i", "error": said})
    refusal = orjson.loads(modern_only_refusal(refused, [MODERN]))
    assert refusal["id"] == "i"
    assert refusal["error"]["code"] == -32022  # what the Upstream opens modern (modern_only)
    assert refusal["error"]["data"] == {"supported": [MODERN], "refused": said}
    assert refusal["error"]["message"] == (
        "initialize was refused (-32602: params._meta must be an object) and "
        "server/discover names only 2026-07-28"
    )


def test_the_answer_on_a_stream_is_told_from_its_notifications() -> None:
    assert is_answer(b'{"jsonrpc":"2.0","id":1,"result":{}}')
    assert is_answer(b'{"jsonrpc":"2.0","id":1,"result":{"text":"\\"method\\""}}')
    assert not is_answer(b'{"jsonrpc":"2.0","method":"notifications/progress","params":{}}')


def test_a_tool_with_invalid_marks_is_left_out_of_the_list() -> None:
    """Over Streamable HTTP a client must exclude such a tool from tools/list."""
    params = ParamHeaders()
    bad = tool("bad", x={"type": "array", "items": {"type": "string", "x-mcp-header": "X"}})
    good = tool("good", y={"type": "string", "x-mcp-header": "Y"})
    plain = tool("plain", z={"type": "string"})
    learnt = params.learn(listed(bad, good, plain), first_page=True)
    assert learnt.dropped == ("bad",)
    assert [t["name"] for t in orjson.loads(learnt.answer)["result"]["tools"]] == ["good", "plain"]
    assert params.headers("good", {"y": "1"}) == {"mcp-param-Y": "1"}
    # A property *named* x-mcp-header is no mark; an answer with nothing to drop is kept as it is.
    named = tool("named", **{"x-mcp-header": {"type": "string"}})
    answer = listed(named, plain)
    assert params.learn(answer, first_page=True).answer is answer


def test_after_a_header_mismatch_the_tools_are_listed_again_as_the_call_was_stamped() -> None:
    mismatch = orjson.dumps({"jsonrpc": "2.0", "id": 7, "error": {"code": -32020, "message": "x"}})
    assert is_header_mismatch(mismatch)
    assert not is_header_mismatch(orjson.dumps({"jsonrpc": "2.0", "id": 7, "result": {}}))
    assert not is_header_mismatch(b"nonsense")
    call = request("tools/call", name="t", arguments={"a": 1})
    call["params"]["_meta"]["progressToken"] = 3
    first = relist_request(call, "mcpbroker-relist-1", None)
    assert first == {
        "jsonrpc": "2.0",
        "id": "mcpbroker-relist-1",
        "method": "tools/list",
        "params": {"_meta": META},
    }
    assert relist_request(call, "r", "c2")["params"]["cursor"] == "c2"
    page = {"jsonrpc": "2.0", "id": 1, "result": {"tools": [], "nextCursor": "c2"}}
    assert next_cursor(orjson.dumps(page)) == "c2"
    assert next_cursor(listed()) is None
