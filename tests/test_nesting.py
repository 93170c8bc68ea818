"""Whatever the broker reads it can write: the nesting limit, and JSON properties.

orjson reads 1024 levels of arrays and objects but writes only 254; a message
between the two used to end the daemon. ``jsonrpc.decode`` now refuses
anything deeper than ``MAX_DEPTH`` (128) at once, with the request's id.
"""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import jsonrpc
from broker.catalog import KINDS, valid_item
from broker.jsonrpc import MAX_DEPTH, JsonRpcError, TooDeep
from broker.upstream import Deliver, UpstreamProtocol
from broker.wire.envelope import split_answer


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def request_line(levels: int, id: Any = 5) -> bytes:
    """A tools/call whose whole line nests ``levels`` deep (the message is one)."""
    lists = levels - 3  # message, params, arguments (an object), then lists
    arguments = "[" * lists + "1" + "]" * lists
    return (
        f'{{"jsonrpc":"2.0","id":{id},"method":"tools/call",'
        f'"params":{{"name":"t","arguments":{{"x":{arguments}}}}}}}'
    ).encode()


def json_line(value: Any) -> bytes:
    import json

    return json.dumps(value).encode()  # (orjson would refuse to write the deep ones)


@pytest.mark.parametrize("levels", [1, 50, MAX_DEPTH - 1, MAX_DEPTH])
def test_up_to_the_limit_a_message_is_taken(levels: int) -> None:
    line = json_line(nested(levels))
    assert jsonrpc.decode(line) == nested(levels)
    assert orjson.dumps(jsonrpc.decode(line))  # and can be written


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 255, 300, 1000, 1024])
def test_past_the_limit_a_request_is_refused_with_its_id(levels: int) -> None:
    with pytest.raises(TooDeep) as refused:
        jsonrpc.decode(request_line(levels))
    error = refused.value.to_response()
    assert error["id"] == 5 and error["error"]["code"] == jsonrpc.INVALID_REQUEST
    assert f"deeper than {MAX_DEPTH}" in error["error"]["message"]


def test_beyond_what_orjson_reads_it_is_a_parse_error() -> None:
    with pytest.raises(JsonRpcError) as refused:
        jsonrpc.decode(request_line(1100))
    assert refused.value.code == jsonrpc.PARSE_ERROR and refused.value.id is None


def test_a_deep_notification_and_a_deep_response_are_told_apart() -> None:
    deep = nested(200)
    with pytest.raises(TooDeep) as note:
        jsonrpc.decode(json_line({"jsonrpc": "2.0", "method": "n", "params": {"d": deep}}))
    assert note.value.id is None and note.value.response_id is None
    with pytest.raises(TooDeep) as answer:
        jsonrpc.decode(json_line({"jsonrpc": "2.0", "id": 9, "result": {"d": deep}}))
    assert answer.value.id is None and answer.value.response_id == 9


def test_many_brackets_in_strings_are_no_false_alarm() -> None:
    line = json_line({"jsonrpc": "2.0", "method": "n", "params": {"s": "[{" * 500}})
    assert jsonrpc.decode(line)["params"]["s"] == "[{" * 500


def test_a_deep_answer_fails_its_request_at_once() -> None:
    proto = UpstreamProtocol("s")
    proto.start()
    proto.server_message({"jsonrpc": "2.0", "id": "mcpbroker-initialize", "result": _init_result()})
    call = {"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "t"}}
    assert proto.forward_fast("A", call)
    (failed,) = proto.fail_now(call["id"], "a message nested too deep")
    assert isinstance(failed, Deliver) and failed.session == "A"
    assert failed.message["id"] == "c" and failed.message["error"]["code"] == -32603
    assert not proto.requests


def test_a_deep_item_is_left_out_of_a_list() -> None:
    tools = next(kind for kind in KINDS if kind.name == "tools")
    fine = {"name": "ok", "inputSchema": {"type": "object"}}
    deep = {"name": "deep", "inputSchema": {"x": nested(200)}}
    assert valid_item(tools, fine) and not valid_item(tools, deep)


def _init_result() -> dict[str, Any]:
    return {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "s"}}


# -- properties over arbitrary JSON -----------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=40,
)


def _deepen(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = [value] if levels % 2 else {"k": value}
    return value


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(min_value=0, max_value=300))
def test_what_decode_takes_encodes_and_reads_back_equal(value: Any, extra: int) -> None:
    line = json_line(_deepen(value, extra))
    try:
        decoded = jsonrpc.decode(line)
    except JsonRpcError as refused:
        assert refused.code in (jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST)
        return
    written = jsonrpc.encode(decoded)
    assert jsonrpc.encode(jsonrpc.decode(written)) == written


@settings(max_examples=200, deadline=None)
@given(json_values, st.integers(min_value=0, max_value=200))
def test_an_answer_crosses_unparsed_byte_exact(value: Any, extra: int) -> None:
    body = json_line(_deepen(value, extra)).decode()
    line = ('{"jsonrpc":"2.0","id":7,"result":' + body + "}").encode()
    answer = split_answer(line)
    assert answer is not None and answer.encode() == line


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_decode_refuses_garbage_with_a_json_rpc_error_only(line: bytes) -> None:
    with contextlib.suppress(JsonRpcError):  # (any other exception fails the test)
        jsonrpc.decode(line)
