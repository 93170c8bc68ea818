"""JSON-RPC decoding, classification and error objects."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker import jsonrpc
from broker.jsonrpc import (
    INVALID_REQUEST,
    PARSE_ERROR,
    JsonRpcError,
    Kind,
    classify,
    decode,
    encode,
    needs_exact,
)
from broker.wire import ndjson


def rpc(**fields: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", **fields}


def classify_error(message: Any) -> JsonRpcError:
    with pytest.raises(JsonRpcError) as info:
        classify(message)
    return info.value


# -- classify: good messages -------------------------------------------------


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (rpc(id=1, method="tools/list"), Kind.REQUEST),
        (rpc(id="abc", method="tools/call", params={"name": "x"}), Kind.REQUEST),
        (rpc(id=0, method="ping", params=None), Kind.REQUEST),
        (rpc(id=-5, method="ping"), Kind.REQUEST),
        (rpc(method="notifications/initialized"), Kind.NOTIFICATION),
        (rpc(method="notifications/progress", params={"progress": 1}), Kind.NOTIFICATION),
        (rpc(id=1, result={}), Kind.RESPONSE),
        (rpc(id="x", result=None), Kind.RESPONSE),
        (rpc(id=1, error={"code": -1, "message": "no"}), Kind.RESPONSE),
        (rpc(id=None, error={"code": -32700, "message": "Parse error"}), Kind.RESPONSE),
    ],
)
def test_classify(message: dict[str, Any], kind: Kind) -> None:
    assert classify(message) is kind


# -- classify: invalid shapes ------------------------------------------------


@pytest.mark.parametrize("message", [[], [rpc(id=1, method="ping")], "x", 1, None, True])
def test_non_object_is_invalid_request(message: Any) -> None:
    error = classify_error(message)
    assert (error.code, error.id) == (INVALID_REQUEST, None)
    assert "object" in error.message


@pytest.mark.parametrize("version", [None, "1.0", 2.0, "2"])
def test_wrong_jsonrpc_version_echoes_id(version: Any) -> None:
    message = {"jsonrpc": version, "id": 7, "method": "ping"}
    error = classify_error(message)
    assert (error.code, error.id) == (INVALID_REQUEST, 7)
    assert "jsonrpc" in error.message


def test_missing_jsonrpc_echoes_string_id() -> None:
    error = classify_error({"id": "7", "method": "ping"})
    assert (error.code, error.id) == (INVALID_REQUEST, "7")


@pytest.mark.parametrize("bad_id", [True, False, 1.5, 1.0, None, [1], {"a": 1}])
def test_bad_request_id_types(bad_id: Any) -> None:
    error = classify_error(rpc(id=bad_id, method="ping"))
    assert (error.code, error.id) == (INVALID_REQUEST, None)
    assert '"id"' in error.message


@pytest.mark.parametrize("params", [[1, 2], "x", 3, True])
def test_params_not_an_object(params: Any) -> None:
    error = classify_error(rpc(id=3, method="tools/call", params=params))
    assert (error.code, error.id) == (INVALID_REQUEST, 3)
    assert '"params"' in error.message


def test_params_not_an_object_in_notification() -> None:
    error = classify_error(rpc(method="notifications/progress", params=[]))
    assert (error.code, error.id) == (INVALID_REQUEST, None)


@pytest.mark.parametrize("method", [1, None, ["ping"], {"m": 1}])
def test_method_not_a_string(method: Any) -> None:
    error = classify_error(rpc(id="r", method=method))
    assert (error.code, error.id) == (INVALID_REQUEST, "r")
    assert '"method"' in error.message


def test_bad_method_with_bad_id_echoes_nothing() -> None:
    error = classify_error(rpc(id=1.5, method=2))
    assert (error.code, error.id) == (INVALID_REQUEST, None)


def test_both_result_and_error() -> None:
    error = classify_error(rpc(id=1, result={}, error={"code": 1, "message": "x"}))
    assert error.code == INVALID_REQUEST
    assert "both" in error.message
    # A response's id is one of the *receiver's* ids: never echoed back.
    assert error.id is None


def test_response_without_id() -> None:
    error = classify_error(rpc(result={}))
    assert (error.code, error.id) == (INVALID_REQUEST, None)


def test_neither_request_nor_response_echoes_id() -> None:
    error = classify_error(rpc(id=4))
    assert (error.code, error.id) == (INVALID_REQUEST, 4)


# -- decode / encode ---------------------------------------------------------


def test_decode() -> None:
    assert decode(b'{"jsonrpc":"2.0","id":1,"method":"ping"}') == rpc(id=1, method="ping")


@pytest.mark.parametrize("line", [b"{", b"not json", b'{"a":1,}', b"\xff\xfe", b""])
def test_decode_bad_json_is_parse_error(line: bytes) -> None:
    with pytest.raises(JsonRpcError) as info:
        decode(line)
    assert (info.value.code, info.value.id) == (PARSE_ERROR, None)
    assert info.value.to_response()["error"]["code"] == PARSE_ERROR


# Lines orjson refuses whatever their numbers: refused the same when the
# exact parser (more lenient) is asked to read them.
@pytest.mark.parametrize(
    "line",
    [
        *(b"NaN", b'{"a":Infinity}', b'"\\ud800"', b'["\xff"]', b"[1e400,", b"[" * 2000),
        *(b"[12345678901234567890,NaN]", b'[12345678901234567890,"\\ud800"]'),
    ],
)
def test_exact_decoding_refuses_what_orjson_refuses(line: bytes) -> None:
    with pytest.raises(JsonRpcError) as info:
        decode(line)
    assert info.value.code == PARSE_ERROR


@pytest.mark.parametrize(
    ("line", "exact"),
    [
        (b"18446744073709551616", True),  # 2**64
        (b"-9223372036854775809", True),  # -(2**63) - 1
        (b"18446744073709551615", True),  # 2**64 - 1 fits: a false alarm, harmless
        (b'"12345678901234567890"', True),  # in a string: likewise
        (b"1234567890123456789", False),  # nineteen digits always fit
        (b"-999999999999999999", False),
        (b'{"id":12345,"n":-1.5}', False),
    ],
)
def test_needs_exact_spots_every_integer_past_64_bits(line: bytes, exact: bool) -> None:
    assert needs_exact(line) is exact
    assert encode(decode(line)) == line


def test_a_number_past_a_doubles_range_is_kept_as_written() -> None:
    # orjson refuses these; JSON does not.
    assert encode(decode(b"[1e400,-2E+999,1.5]")) == b"[1e400,-2E+999,1.5]"


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.integers(min_value=-(10**19), max_value=-(2**63) - 1)  # 19 digits, yet too low
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(exclude_categories=["Cs"])),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


@given(JSON_VALUES)
def test_every_number_survives_decoding_and_encoding(value: Any) -> None:
    # The standard library's json keeps integers exactly: what it reads from the
    # broker's encoding must equal what it wrote.
    line = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    assert json.loads(encode(decode(line))) == value


def test_encode_frames_nothing_and_ndjson_appends_one_newline() -> None:
    data = encode(rpc(id=1, result={}))
    assert b"\n" not in data
    assert decode(data) == rpc(id=1, result={})
    assert ndjson.encode(rpc(id=1, result={})) == data + b"\n"


def test_encode_batch() -> None:
    assert encode([rpc(id=1, result={})]) == b'[{"jsonrpc":"2.0","id":1,"result":{}}]'


# -- error objects and builders ----------------------------------------------


def test_error_to_response() -> None:
    error = JsonRpcError(-32601, "Method not found: x", id="a")
    assert error.to_response() == rpc(
        id="a", error={"code": -32601, "message": "Method not found: x"}
    )


def test_error_data_included_only_when_set() -> None:
    assert JsonRpcError(1, "m", data={"k": 1}).error_object() == {
        "code": 1,
        "message": "m",
        "data": {"k": 1},
    }
    assert "data" not in JsonRpcError(1, "m").error_object()


def test_builders() -> None:
    assert jsonrpc.result_response(5, {"x": 1}) == rpc(id=5, result={"x": 1})
    assert jsonrpc.error_response(None, -32700, "bad") == rpc(
        id=None, error={"code": -32700, "message": "bad"}
    )
    assert jsonrpc.notification("n") == rpc(method="n")
    assert jsonrpc.notification("n", {"a": 1}) == rpc(method="n", params={"a": 1})


def test_ids() -> None:
    assert jsonrpc.is_valid_id(0)
    assert jsonrpc.is_valid_id("")
    assert not jsonrpc.is_valid_id(True)
    assert not jsonrpc.is_valid_id(1.0)
    assert not jsonrpc.is_valid_id(None)
    assert jsonrpc.id_key(1) != jsonrpc.id_key("1")
    assert jsonrpc.id_key(1) == jsonrpc.id_key(1)


@pytest.mark.parametrize(
    "message",
    [
        jsonrpc.notification("notifications/progress", {"progressToken": 12345, "progress": 17}),
        jsonrpc.notification("notifications/message", {"level": "debug", "data": "a line"}),
        jsonrpc.notification("n", {"data": {"a": 1, "b": "two", "c": [1, 2, 3]}}),
        jsonrpc.notification("n", {"data": "x" * 10_000}),
        jsonrpc.notification("n", {"d": list(range(1000, 2000))}),
        jsonrpc.notification("n", {"d": [str(n) for n in range(1000)]}),
        jsonrpc.notification("n", {"d": [{"k": n} for n in range(1000)]}),
        jsonrpc.result_response(1, {"tools": [{"name": "t", "inputSchema": {}}] * 100}),
        # Text that holds JSON or CSV: its braces and commas are no objects
        # (counted 7 to 40 times what it held; found by review).
        jsonrpc.notification("n", {"data": '{"a": [1, 2], "b": {"c": 3}}, ' * 2000}),
        jsonrpc.notification("n", {"data": "1,2,3,4,5,6,7,8\n" * 5000}),
        jsonrpc.notification("n", {"data": ['a "quoted", {text}\\', "\\\\", "{,}"] * 500}),
    ],
)
def test_held_size_is_about_what_a_decoded_message_holds(message: Any) -> None:
    import tracemalloc

    line = jsonrpc.encode(message)
    tracemalloc.start()
    try:
        held = [jsonrpc.decode(line) for _ in range(100)]
        measured = tracemalloc.get_traced_memory()[0] / len(held)
    finally:
        tracemalloc.stop()
    assert 0.6 * measured <= jsonrpc.held_size(line) <= 3 * measured
