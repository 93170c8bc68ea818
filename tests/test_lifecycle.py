"""Version negotiation and the initialize handshake on both sides."""

from __future__ import annotations

from typing import Any

import pytest

from broker.jsonrpc import INVALID_PARAMS, JsonRpcError
from broker.lifecycle import (
    LATEST_LEGACY_VERSION,
    LEGACY_VERSIONS,
    HandshakeError,
    ServerIdentity,
    initialize_request,
    initialize_result,
    negotiate_version,
    read_client_initialize,
    read_initialize_result,
)


def response(result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": "init", "result": result}


def server_result(version: str = "2025-06-18", **extra: Any) -> dict[str, Any]:
    return {
        "protocolVersion": version,
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "s", "version": "1"},
        **extra,
    }


def test_four_legacy_versions() -> None:
    assert LEGACY_VERSIONS == ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
    assert LATEST_LEGACY_VERSION == "2025-11-25"


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_negotiate_known_version(version: str) -> None:
    assert negotiate_version(version) == version


@pytest.mark.parametrize("version", ["2026-07-28", "2024-01-01", "", "latest"])
def test_negotiate_unknown_version_gives_latest(version: str) -> None:
    assert negotiate_version(version) == LATEST_LEGACY_VERSION


@pytest.mark.parametrize("version", [None, 20241105, ["2025-03-26"], {"v": 1}, True])
def test_negotiate_non_string_gives_latest(version: Any) -> None:
    assert negotiate_version(version) == LATEST_LEGACY_VERSION


# -- downstream: the client's initialize --------------------------------------


def test_read_client_initialize() -> None:
    params = {
        "protocolVersion": "2025-03-26",
        "capabilities": {"roots": {}},
        "clientInfo": {"name": "c"},
    }
    assert read_client_initialize(params) == ("2025-03-26", {"roots": {}}, {"name": "c"})


def test_read_client_initialize_defaults() -> None:
    assert read_client_initialize({"protocolVersion": "x"}) == ("x", {}, None)


@pytest.mark.parametrize(
    "params",
    [None, {}, {"protocolVersion": 1}, {"protocolVersion": "x", "capabilities": []}],
)
def test_read_client_initialize_invalid(params: Any) -> None:
    with pytest.raises(JsonRpcError) as info:
        read_client_initialize(params)
    assert info.value.code == INVALID_PARAMS


def test_initialize_result_instructions_only_when_given() -> None:
    assert "instructions" not in initialize_result("v", {}, {}, None)
    assert "instructions" not in initialize_result("v", {}, {}, "")
    assert initialize_result("v", {}, {}, "hi")["instructions"] == "hi"


# -- upstream: the broker's initialize ----------------------------------------


def test_initialize_request() -> None:
    request = initialize_request("h")
    assert request["id"] == "h"
    assert request["method"] == "initialize"
    assert request["params"]["protocolVersion"] == LATEST_LEGACY_VERSION
    assert request["params"]["clientInfo"]["name"] == "mcpbroker"


def test_read_initialize_result_accepts_good_result() -> None:
    identity = read_initialize_result(response(server_result(instructions="use me")))
    assert identity == ServerIdentity(
        protocol_version="2025-06-18",
        capabilities={"tools": {}},
        server_info={"name": "s", "version": "1"},
        instructions="use me",
    )


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_read_initialize_result_any_legacy_version(version: str) -> None:
    assert read_initialize_result(response(server_result(version))).protocol_version == version


def test_read_initialize_result_tolerates_missing_optional_fields() -> None:
    identity = read_initialize_result(
        response({"protocolVersion": "2024-11-05", "capabilities": [], "instructions": 5})
    )
    assert identity == ServerIdentity("2024-11-05", {}, {}, None)


def handshake_error(message: dict[str, Any]) -> str:
    with pytest.raises(HandshakeError) as info:
        read_initialize_result(message)
    return str(info.value)


def test_read_initialize_result_error_response() -> None:
    message = {"jsonrpc": "2.0", "id": "init", "error": {"code": -1, "message": "go away"}}
    assert "go away" in handshake_error(message)


def test_read_initialize_result_error_not_an_object() -> None:
    assert "boom" in handshake_error({"jsonrpc": "2.0", "id": "init", "error": "boom"})


@pytest.mark.parametrize("version", ["2026-07-28", "1.0", None, 5])
def test_read_initialize_result_bad_version(version: Any) -> None:
    assert repr(version) in handshake_error(response(server_result(version)))


@pytest.mark.parametrize("result", [None, [], "ok", 1])
def test_read_initialize_result_not_an_object(result: Any) -> None:
    assert "not an object" in handshake_error(response(result))
