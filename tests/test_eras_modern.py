"""The downstream rules for a modern client (broker/eras/modern.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.catalog import Catalog, ServerEntry
from broker.eras.modern import (
    CACHEABLE_METHODS,
    RequestMeta,
    check_input_requests,
    client_era,
    complete_answer,
    complete_modern_answer,
    complete_result,
    discover_result,
    read_meta,
)
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LOG_LEVEL_KEY,
    PROTOCOL_VERSION_KEY,
    SERVER_INFO_KEY,
    SUPPORTED_VERSIONS,
    Era,
)
from broker.jsonrpc import JsonRpcError
from broker.lifecycle import ServerIdentity
from broker.states import ServerState
from broker.wire.envelope import Answer, split_answer

META = {PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {"sampling": {}}}


def request(method: str = "tools/call", meta: Any = META, id: Any = 1, **params: Any) -> Any:
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


# -- which era a client speaks ------------------------------------------------


def test_a_request_with_the_version_in_meta_opens_a_modern_session() -> None:
    assert client_era(request("server/discover")) is Era.MODERN
    assert client_era(request("tools/call", name="x")) is Era.MODERN
    # An unsupported version is still a modern client: it is answered -32022.
    assert client_era(request(meta={PROTOCOL_VERSION_KEY: "2099-01-01"})) is Era.MODERN


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"_meta": META}},
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "x"}},
        request("tools/list", meta=None),
        request("tools/list", meta={"progressToken": 1}),
        {"jsonrpc": "2.0", "method": "notifications/initialized", "params": {"_meta": META}},
        {"jsonrpc": "2.0", "id": 1, "result": {}},
        [request()],
        "garbage",
    ],
)
def test_anything_else_is_left_to_the_legacy_rules(message: Any) -> None:
    assert client_era(message) is Era.LEGACY


# -- checking each request's _meta ----------------------------------------------


def test_a_complete_meta_is_read() -> None:
    meta = {**META, CLIENT_INFO_KEY: {"name": "c", "version": "1"}, LOG_LEVEL_KEY: "info"}
    assert read_meta(request(meta=meta)) == RequestMeta(
        "2026-07-28", {"sampling": {}}, {"name": "c", "version": "1"}, "info"
    )


@pytest.mark.parametrize(
    "meta",
    [
        None,
        "x",
        {},
        {CLIENT_CAPABILITIES_KEY: {}},  # no version
        {PROTOCOL_VERSION_KEY: "2026-07-28"},  # no capabilities
        {PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: []},
        {**META, LOG_LEVEL_KEY: "loud"},
    ],
)
def test_a_request_missing_its_meta_is_invalid_params(meta: Any) -> None:
    with pytest.raises(JsonRpcError) as caught:
        read_meta(request(meta=meta, id="r1"))
    assert caught.value.code == -32602
    assert caught.value.to_response()["id"] == "r1"


@pytest.mark.parametrize("version", ["1900-01-01", "2025-11-25", 20260728])
def test_a_version_not_served_in_this_era_is_minus_32022(version: Any) -> None:
    with pytest.raises(JsonRpcError) as caught:
        read_meta(request(meta={**META, PROTOCOL_VERSION_KEY: version}, id=9))
    response = caught.value.to_response()
    assert response["id"] == 9
    assert response["error"]["code"] == -32022
    assert response["error"]["data"]["supported"] == list(SUPPORTED_VERSIONS)


# -- server/discover --------------------------------------------------------------

FILES = ServerEntry(
    "files",
    ServerState.READY,
    identity=ServerIdentity(
        "2025-06-18",
        {"tools": {}, "resources": {"subscribe": True}, "logging": {}, "tasks": {"list": {}}},
        {"name": "files-server", "version": "2"},
        "Read files.",
    ),
    lists={"tools": ({"name": "read"},)},
)


def test_discover_for_an_aggregated_view_is_the_broker_and_every_version() -> None:
    result = discover_result(Catalog([FILES]), ("files",), False)
    assert result["resultType"] == "complete"
    assert result["supportedVersions"] == list(SUPPORTED_VERSIONS)
    assert result["_meta"] == {SERVER_INFO_KEY: {"name": "mcpbroker", "version": "0.1.0"}}
    assert result["capabilities"] == {
        "tools": {"listChanged": True},
        "prompts": {"listChanged": True},
        "resources": {"listChanged": True, "subscribe": True},
        "logging": {},
    }  # tasks are an extension in 2026-07-28: not offered
    assert "Read files." in result["instructions"]
    assert (result["ttlMs"], result["cacheScope"]) == (0, "private")


def test_discover_for_a_transparent_view_is_the_server_itself() -> None:
    result = discover_result(Catalog([FILES]), ("files",), True)
    assert result["_meta"][SERVER_INFO_KEY] == {"name": "files-server", "version": "2"}
    assert result["instructions"] == "Read files."
    assert "tasks" not in result["capabilities"]


def test_discover_for_a_transparent_server_that_is_down_is_an_error() -> None:
    down = ServerEntry("files", ServerState.RESTARTING, identity=None, lists={})
    with pytest.raises(JsonRpcError) as caught:
        discover_result(Catalog([down]), ("files",), True)
    assert caught.value.code == -32000


# -- results for a modern client ------------------------------------------------


def test_every_result_gets_result_type_and_cacheable_ones_the_hints() -> None:
    assert complete_result("tools/call", {"content": []}) == {
        "content": [],
        "resultType": "complete",
    }
    for method in ("tools/list", "prompts/list", "resources/list", "resources/templates/list",
                   "resources/read"):  # fmt: skip
        assert complete_result(method, {"x": 1}) == {
            "x": 1,
            "resultType": "complete",
            "ttlMs": 0,
            "cacheScope": "private",
        }


def test_what_the_server_said_is_kept() -> None:
    said = {"contents": [], "resultType": "complete", "ttlMs": 60000, "cacheScope": "public"}
    assert complete_result("resources/read", said) is said
    asking = {"resultType": "input_required", "requestState": "s"}
    assert complete_result("resources/read", asking) is asking  # never cached


@given(st.dictionaries(st.text(max_size=5), st.integers(), max_size=4), st.sampled_from(
    ["tools/call", "tools/list", "resources/read", "ping"]))  # fmt: skip
def test_complete_result_never_changes_its_input(result: dict[str, Any], method: str) -> None:
    before = dict(result)
    out = complete_result(method, result)
    assert result == before
    assert out["resultType"] == result.get("resultType", "complete")
    assert {k: v for k, v in out.items() if k in result} == result


# -- never asking a client for what it did not declare -----------------------------

ELICIT = {"method": "elicitation/create", "params": {"mode": "form", "message": "name?"}}
ELICIT_URL = {"method": "elicitation/create", "params": {"mode": "url", "url": "https://x"}}
SAMPLE = {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}}


def test_input_requests_the_client_declared_pass() -> None:
    check_input_requests({"elicitation": {}, "sampling": {}}, {"a": ELICIT, "b": SAMPLE})
    check_input_requests({"elicitation": {"url": {}}}, {"a": ELICIT_URL})


@pytest.mark.parametrize(
    ("capabilities", "requests", "required"),
    [
        ({}, {"a": ELICIT}, {"elicitation": {}}),
        ({"elicitation": {}}, {"a": ELICIT, "b": SAMPLE}, {"sampling": {}}),
        ({"elicitation": {"form": {}}}, {"a": ELICIT_URL}, {"elicitation": {"url": {}}}),
        ({"sampling": {}}, {"r": {"method": "roots/list"}}, {"roots": {}}),
    ],
)
def test_an_input_the_client_did_not_declare_is_minus_32021(
    capabilities: dict[str, Any], requests: dict[str, Any], required: dict[str, Any]
) -> None:
    with pytest.raises(JsonRpcError) as caught:
        check_input_requests(capabilities, requests)
    assert caught.value.code == -32021
    assert caught.value.data == {"requiredCapabilities": required}


def test_an_unknown_input_request_is_invalid() -> None:
    with pytest.raises(JsonRpcError) as caught:
        check_input_requests({"sampling": {}}, {"a": {"method": "tools/call"}})
    assert caught.value.code == -32602


@pytest.mark.parametrize(
    ("capabilities", "asked"),
    [
        ({"elicitation": {}}, {"method": ["elicitation/create"]}),
        ({"elicitation": {}}, {"method": {"m": 1}}),
        ({}, {"method": "elicitation/create", "params": [1]}),
        ({"elicitation": {}}, {"method": "elicitation/create", "params": "url"}),
    ],
)
def test_an_input_request_of_the_wrong_shape_is_invalid(
    capabilities: dict[str, Any], asked: dict[str, Any]
) -> None:
    with pytest.raises(JsonRpcError) as caught:
        check_input_requests(capabilities, {"a": asked})
    assert caught.value.code == -32602


# -- stamping an answer without parsing it --------------------------------------

STAMPED_KEYS = (b'"resultType"', b'"ttlMs"', b'"cacheScope"')
results = st.dictionaries(
    st.sampled_from(["content", "isError", "resultType", "ttlMs", "cacheScope", "x"]),
    st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=12)),
    max_size=4,
)
bodies = st.one_of(
    st.builds(lambda r: {"result": r}, results),
    st.builds(lambda v: {"result": v}, st.none() | st.lists(st.integers(0, 9), max_size=2)),
    st.builds(lambda c: {"error": {"code": c, "message": "no"}}, st.integers(-32700, 0)),
)


def server_answer(body: dict[str, Any], typescript_shape: bool) -> tuple[Any, bytes, Answer]:
    """A server's answer holding ``body``, in one of the two compact shapes
    (the id first, or after the rest); its line; the answer cut from it,
    the client's id (``"c1"``) in place."""
    message = {**body, "jsonrpc": "2.0", "id": 7} if typescript_shape else {
        "jsonrpc": "2.0", "id": 7, **body}  # fmt: skip
    line = orjson.dumps(message)
    answer = split_answer(line)
    assert answer is not None
    answer.id = "c1"
    return message, line, answer


@given(bodies, st.sampled_from(["tools/call", "resources/read", "prompts/get"]), st.booleans())
def test_an_answer_stamped_unparsed_is_the_answer_stamped_parsed(
    body: dict[str, Any], method: str, typescript_shape: bool
) -> None:
    """In both compact shapes servers write (broker/wire/envelope.py), with the
    client's id in place of the server's, as the session writes it. Only a
    result that is not an object, or a line with a key it would put anywhere,
    is left to the parser."""
    message, line, answer = server_answer(body, typescript_shape)
    written = answer.encode()
    stamped = complete_answer(answer, method)
    put = STAMPED_KEYS if method in CACHEABLE_METHODS else STAMPED_KEYS[:1]  # what it puts
    readable = "error" in body or (
        isinstance(body["result"], dict) and not any(key in line for key in put)
    )
    assert (stamped is not None) == readable
    if stamped is None:
        assert answer.encode() == written  # left as it was, for the caller to read
    else:
        expected = {**message, "id": "c1"}
        if "result" in expected:
            expected["result"] = complete_result(method, expected["result"])
        assert isinstance(stamped, Answer) and stamped.id == "c1"
        assert orjson.loads(stamped.encode()) == expected


@given(bodies, st.sampled_from(["tools/call", "resources/read", None]), st.booleans())
def test_a_modern_servers_answer_passes_if_it_has_the_keys_and_is_stamped_if_it_has_none(
    body: dict[str, Any], method: str | None, typescript_shape: bool
) -> None:
    """complete_modern_answer: an error, or a result whose bytes name every
    key the era asks of it, as it came; one that names none, as
    complete_answer stamps it; one that names some, left to the parser."""
    message, line, answer = server_answer(body, typescript_shape)
    written = answer.encode()
    wanted = STAMPED_KEYS if method in CACHEABLE_METHODS else STAMPED_KEYS[:1]
    named = [key in line for key in wanted]
    done = complete_modern_answer(answer, method)
    if "error" in body or all(named):
        assert done is answer and answer.encode() == written  # as it came
    elif any(named) or not isinstance(body["result"], dict):
        assert done is None and answer.encode() == written  # for the caller to read
    else:
        assert done is answer
        expected = {**message, "id": "c1", "result": complete_result(method or "", body["result"])}
        assert orjson.loads(answer.encode()) == expected
