"""The two eras: versions, the -32022 and -32021 errors, the upstream probe (broker/eras/)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.eras.probe import (
    TIMED_OUT,
    Incompatible,
    Legacy,
    Modern,
    Reprobe,
    discover_request,
    read_probe_answer,
)
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    MODERN_VERSIONS,
    PROTOCOL_VERSION_KEY,
    SERVER_INFO_KEY,
    SUPPORTED_VERSIONS,
    UNSUPPORTED_PROTOCOL_VERSION,
    Era,
    era_of,
    missing_capability,
    negotiate_modern,
    unsupported_version,
)
from broker.jsonrpc import JsonRpcError
from broker.lifecycle import BROKER_CLIENT_CAPABILITIES, LEGACY_VERSIONS, ServerIdentity


def test_the_versions_of_each_era() -> None:
    assert MODERN_VERSIONS == ("2026-07-28",)
    assert SUPPORTED_VERSIONS[:4] == LEGACY_VERSIONS
    assert SUPPORTED_VERSIONS[4:] == ("2026-07-28",)
    assert [era_of(v) for v in SUPPORTED_VERSIONS] == [Era.LEGACY] * 4 + [Era.MODERN]
    assert era_of("2099-01-01") is None
    assert era_of(20260728) is None


def test_a_modern_request_is_served_at_its_own_version_or_refused_with_the_list() -> None:
    assert negotiate_modern("2026-07-28") == "2026-07-28"
    for requested in ("1900-01-01", "2025-11-25", None, 7):
        with pytest.raises(JsonRpcError) as caught:
            negotiate_modern(requested)
        assert caught.value.code == UNSUPPORTED_PROTOCOL_VERSION == -32022
        assert caught.value.data["supported"] == list(SUPPORTED_VERSIONS)
    error = unsupported_version("1900-01-01").error_object()
    assert error == {
        "code": -32022,
        "message": "Unsupported protocol version: 1900-01-01",
        "data": {"supported": list(SUPPORTED_VERSIONS), "requested": "1900-01-01"},
    }


def test_missing_capability_names_what_is_required() -> None:
    error = missing_capability({"elicitation": {}}, "elicitation").error_object()
    assert error["code"] == MISSING_REQUIRED_CLIENT_CAPABILITY == -32021
    assert error["data"] == {"requiredCapabilities": {"elicitation": {}}}


# -- the upstream probe ---------------------------------------------------------


def answer(result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "result": result}


def error(code: int, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": "no"}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": 1, "error": err}


def test_the_probe_is_server_discover_with_the_modern_meta() -> None:
    probe = discover_request(7)
    assert probe["method"] == "server/discover" and probe["id"] == 7
    meta = probe["params"]["_meta"]
    assert meta[PROTOCOL_VERSION_KEY] == "2026-07-28"
    assert meta[CLIENT_CAPABILITIES_KEY] == BROKER_CLIENT_CAPABILITIES


def test_a_discover_result_naming_a_modern_version_is_a_modern_server() -> None:
    result = {
        "resultType": "complete",
        "supportedVersions": ["2025-11-25", "2026-07-28"],
        "capabilities": {"tools": {}},
        "_meta": {SERVER_INFO_KEY: {"name": "weather", "version": "1"}},
        "instructions": "Ask about weather.",
        "ttlMs": 0,
        "cacheScope": "public",
    }
    assert read_probe_answer(answer(result)) == Modern(
        ServerIdentity("2026-07-28", {"tools": {}}, {"name": "weather", "version": "1"},
                       "Ask about weather.")
    )  # fmt: skip


@pytest.mark.parametrize(
    "response",
    [
        answer({"supportedVersions": ["2025-11-25"], "capabilities": {}}),  # legacy advertisement
        answer({"protocolVersion": "2025-06-18"}),  # not a DiscoverResult
        answer(None),
        error(-32601),  # method not found: the commonest legacy answer
        error(-32602),
        error(-32600),
        error(-32000),
        error(-32022),  # no data: not actionable
        error(-32022, {"supported": ["2025-06-18", "2025-11-25"]}),
        {"jsonrpc": "2.0", "id": 1, "error": "broken"},
    ],
)
def test_any_other_answer_is_a_legacy_server(response: dict[str, Any]) -> None:
    assert isinstance(read_probe_answer(response), Legacy)


def test_no_answer_in_time_is_a_legacy_server() -> None:
    assert isinstance(TIMED_OUT, Legacy)


def test_unsupported_version_naming_a_mutual_modern_version_probes_once_more() -> None:
    refused = error(-32022, {"supported": ["2026-07-28"], "requested": "2027-01-01"})
    assert read_probe_answer(refused) == Reprobe("2026-07-28")
    # The second probe refused alike: no loop, and the server speaks nothing legacy.
    assert isinstance(read_probe_answer(refused, first=False), Incompatible)


def test_a_modern_only_server_the_broker_cannot_speak_is_incompatible() -> None:
    verdict = read_probe_answer(error(-32022, {"supported": ["2027-01-01"]}))
    assert isinstance(verdict, Incompatible)
    assert "2027-01-01" in verdict.message
