"""``Mcp-Param-*`` headers against a tool's arguments (broker/wire/param_headers.py)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from broker.catalog import Catalog, ServerEntry
from broker.jsonrpc import JsonRpcError
from broker.states import ServerState
from broker.wire.param_headers import annotated_params, check, tool_schema

SCHEMA = {
    "type": "object",
    "properties": {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "limit": {"type": "integer", "x-mcp-header": "Limit"},
        "dry": {"type": "boolean", "x-mcp-header": "Dry"},
        "where": {
            "type": "object",
            "properties": {"zone": {"type": "string", "x-mcp-header": "Zone"}},
        },
        "query": {"type": "string"},
    },
}


def headers(**values: str) -> list[tuple[bytes, bytes]]:
    return [(f"Mcp-Param-{k}".encode(), v.encode()) for k, v in values.items()]


def mismatch(arguments: Any, sent: list[tuple[bytes, bytes]], schema: Any = SCHEMA) -> str:
    with pytest.raises(JsonRpcError) as caught:
        check(schema, arguments, sent)
    assert caught.value.code == -32020
    return caught.value.message


def test_the_annotated_properties_are_found_through_properties_only() -> None:
    found = annotated_params(SCHEMA)
    assert sorted(found) == [
        (("dry",), "Dry", "boolean"),
        (("limit",), "Limit", "integer"),
        (("region",), "Region", "string"),
        (("where", "zone"), "Zone", "string"),
    ]


def test_headers_that_agree_pass() -> None:
    arguments = {"region": "us-west1", "limit": 42, "dry": True, "where": {"zone": "b"}}
    sent = headers(Region="us-west1", Limit="42", Dry="true", Zone="b")
    check(SCHEMA, arguments, sent)
    # names are case-insensitive; an integer compares by value; base64 is decoded
    text = "Hello, 世界"
    encoded = "=?base64?" + base64.b64encode(text.encode()).decode() + "?="
    lowered = [(b"mcp-param-region", encoded.encode()), (b"MCP-PARAM-LIMIT", b"42.0")]
    check(SCHEMA, {"region": text, "limit": 42}, lowered)
    # absent (or null) arguments want no header
    check(SCHEMA, {"query": "x", "region": None}, [])
    check(SCHEMA, {}, [(b"mcp-param-other", b"ignored")])


def test_headers_that_disagree_are_header_mismatch() -> None:
    assert "missing" in mismatch({"region": "eu"}, [])
    assert "does not match" in mismatch({"region": "eu"}, headers(Region="us"))
    assert "does not match" in mismatch({"limit": 42}, headers(Limit="42.5"))
    assert "does not match" in mismatch({"dry": False}, headers(Dry="False"))
    assert "has no such value" in mismatch({}, headers(Region="us"))
    assert "has no such value" in mismatch({"region": ["a"]}, headers(Region="a"))
    assert "more than once" in mismatch({"region": "a"}, headers(Region="a") * 2)
    assert "base64" in mismatch({"region": "a"}, headers(Region="=?base64?***?="))
    assert "does not match" in mismatch({"where": {"zone": "a"}}, headers(Zone="b"))


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "object", "x-mcp-header": "Root"},  # the root itself
        {"items": {"properties": {"a": {"type": "string", "x-mcp-header": "A"}}}},
        {"properties": {"a": {"type": "number", "x-mcp-header": "A"}}},
        {"properties": {"a": {"type": "string", "x-mcp-header": "not a token"}}},
        {
            "properties": {
                "a": {"type": "string", "x-mcp-header": "Same"},
                "b": {"type": "string", "x-mcp-header": "same"},
            }
        },
    ],
)
def test_a_schema_with_an_invalid_annotation_is_not_checked(bad: dict[str, Any]) -> None:
    schema = {**bad, "properties": {**bad.get("properties", {}), **SCHEMA["properties"]}}  # type: ignore[dict-item]
    assert annotated_params(schema) == []
    check(schema, {"region": "eu"}, [])  # (a conforming client sends nothing for it)


def test_the_schema_is_the_tool_the_view_names() -> None:
    tools = ({"name": "call", "inputSchema": SCHEMA}, {"name": "other", "inputSchema": {}})
    entry = ServerEntry("s", ServerState.READY, lists={"tools": tools})
    catalog = Catalog([entry, ServerEntry("t", ServerState.READY, lists={"tools": ()})])
    assert tool_schema(catalog, ("s", "t"), False, "s__call") is SCHEMA
    assert tool_schema(catalog, ("s",), True, "call") is SCHEMA
    assert tool_schema(catalog, ("s", "t"), False, "s__nope") is None
    assert tool_schema(catalog, ("t",), False, "s__call") is None  # not in that view
    assert tool_schema(catalog, ("s",), True, 7) is None


def test_an_integer_header_past_pythons_digit_limit_is_a_mismatch_not_a_crash() -> None:
    """``int()`` refuses more than 4300 digits with a ValueError, which the
    listener's check did not expect (a 500 and a closed connection)."""
    assert "Limit" in mismatch({"limit": 42}, headers(Limit="9" * 5000))
