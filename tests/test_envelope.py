"""Answers that cross the broker unparsed (broker/wire/envelope.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from broker.eras.modern import complete_answer
from broker.session import SessionProtocol
from broker.upstream import UpstreamProtocol
from broker.wire.envelope import HELD, PREFIX, Answer, answer_id, split_answer
from tests.test_fuzz import (
    Catalogs,
    _in_shape,
    _initialized,
    _ready_upstream,
    json_values,
    server_answers,
)

ids = st.integers(1, 2**62)
client_ids = st.one_of(st.integers(-(2**62), 2**62), st.text(max_size=8))
outcomes = st.sampled_from(["result", "error"])


def in_shape(id: int, key: str, value: Any, typescript: bool) -> bytes:
    """A server's answer, in the Python SDK's key order or the TypeScript SDK's."""
    if typescript:
        return orjson.dumps({key: value, "jsonrpc": "2.0", "id": id})
    return orjson.dumps({"jsonrpc": "2.0", "id": id, key: value})


@given(ids, client_ids, outcomes, json_values, st.booleans())
def test_an_answer_crosses_with_only_its_id_changed(
    id: int, client_id: Any, key: str, value: Any, typescript: bool
) -> None:
    try:
        line = in_shape(id, key, value, typescript)
    except TypeError:  # an integer past 64 bits: no server's answer holds one either
        assume(False)
    answer = split_answer(line)
    assert answer is not None and answer.id == id
    assert bytes(answer.head) + orjson.dumps(id) + bytes(answer.tail) == line
    answer.id = client_id
    out = answer.encode()
    assert out == bytes(answer.head) + orjson.dumps(client_id) + bytes(answer.tail)
    assert orjson.loads(out) == {**orjson.loads(line), "id": client_id}


def test_the_servers_bytes_are_kept() -> None:
    # Parsed and encoded again, these would change (or not parse at all).
    line = b'{"jsonrpc":"2.0","id":7,"result":{"n":123456789012345678901234567890,"s":"\\u00e9"}}'
    answer = split_answer(line)
    assert answer is not None
    answer.id = "c"
    assert answer.encode() == line.replace(b'"id":7', b'"id":"c"')


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","id":"s","result":1}',  # not one of the broker's ids
        b'{"jsonrpc":"2.0","id":null,"error":{"code":1,"message":"m"}}',
        b'{"id":1,"jsonrpc":"2.0","result":1}',  # another order
        b'{"jsonrpc": "2.0", "id": 1, "result": 1}',  # spaces
        b'{"result":1, "jsonrpc":"2.0","id":1}',
        b'{"jsonrpc":"2.0","id":01,"result":1}',  # not JSON
        b'{"jsonrpc":"2.0","id":-1,"result":1}',
        b'{"jsonrpc":"2.0","id":1,"result":1',  # cut short
        b'{"result":1,"jsonrpc":"2.0","id":1',
        b'{"jsonrpc":"2.0","id":1,"method":"roots/list"}',  # a request, not an answer
        b'{"method":"roots/list","jsonrpc":"2.0","id":1}',
        b'{"result":{"jsonrpc":"2.0","id":1}}',  # the id is not the answer's own
        b'{"jsonrpc":"2.0","method":"notifications/progress","params":{}}',
        b'{"jsonrpc":"2.0","id":12345678901234567890,"result":1}',  # longer than ours
        b"[]",
        b"",
    ],
)
def test_other_lines_are_left_to_the_parser(line: bytes) -> None:
    assert split_answer(line) is None


def test_the_shortest_answers_are_split() -> None:
    assert split_answer(b'{"result":1,"jsonrpc":"2.0","id":1}') == Answer(
        b'{"result":1,"jsonrpc":"2.0","id":', 1, b"}"
    )
    assert split_answer(b'{"jsonrpc":"2.0","id":1,"error":{}}') == Answer(
        b'{"jsonrpc":"2.0","id":', 1, b',"error":{}}'
    )


def forwarded(proto: UpstreamProtocol, request: dict[str, Any]) -> int:
    proto.client_request("A", request)
    return int(request["id"])


def test_an_answer_the_broker_must_read_is_not_taken_unparsed() -> None:
    proto = _ready_upstream()
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}}
    plain = forwarded(proto, dict(call))
    tasked = forwarded(proto, {**call, "id": 2, "params": {"name": "t", "task": {}}})
    for upstream_id, taken in ((plain, True), (tasked, False)):
        answer = split_answer(in_shape(upstream_id, "result", {}, typescript=False))
        assert answer is not None
        assert (proto.answer_fast(answer) is not None) is taken
        assert answer.id == (1 if taken else upstream_id)  # the client's id, once matched
    assert len(proto.requests) == 1  # the task's request is left for the parser


def test_a_session_writes_an_answer_and_forgets_its_request() -> None:
    session = _initialized(("a",), transparent=True)
    request = {"jsonrpc": "2.0", "id": "r1", "method": "tools/call", "params": {"name": "t"}}
    assert session.forward_fast(request) is not None
    assert session.inflight == {"r1"}
    answer = Answer(b'{"jsonrpc":"2.0","id":', "r1", b',"result":{}}')
    assert session.outgoing(answer) is answer
    assert not session.inflight


def test_an_answer_in_a_batch_is_read_into_the_batch() -> None:
    session = SessionProtocol(("a",), Catalogs(), transparent=True)
    session.receive(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": "2025-03-26"},
        }
    )
    calls = [
        {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": "t"}} for n in (1, 2)
    ]
    session.receive(calls)
    first = Answer(b'{"jsonrpc":"2.0","id":', 1, b',"result":{"n":1}}')
    broken = Answer(b'{"jsonrpc":"2.0","id":', 2, b',"result":{"n":}')
    assert session.outgoing(first) is None  # held for the rest of the batch
    batch = session.outgoing(broken)
    assert isinstance(batch, list)
    assert batch[0] == {"jsonrpc": "2.0", "id": 1, "result": {"n": 1}}
    assert batch[1]["id"] == 2 and batch[1]["error"]["code"] == -32603


@given(
    st.lists(st.tuples(st.sampled_from(["parsed", "prefix", "suffix"]), server_answers), max_size=8)
)
def test_taking_a_run_of_answers_is_taking_them_one_by_one(answers: list[Any]) -> None:
    fast, slow = _ready_upstream(), _ready_upstream()
    for proto in (fast, slow):
        for n in range(8):  # upstream ids 1 to 8, half of them session A's
            call = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": "t"}}
            assert proto.forward_fast("AB"[n % 2], call)
    lines: list[Any] = [_in_shape(shape, message) for shape, message in answers]
    deliveries: dict[Any, list[Any]] = {}
    sizes: dict[Any, int] = {}
    taken = fast.take_answers(lines, 0, deliveries, sizes)
    expected: dict[Any, list[Any]] = {}
    expected_sizes: dict[Any, int] = {}
    for index, line in enumerate(lines):
        answer = split_answer(line)
        session = None if answer is None else slow.answer_fast(answer)
        if session is None:
            assert taken == index
            break
        expected.setdefault(session, []).append(answer)
        expected_sizes[session] = expected_sizes.get(session, 0) + len(line) + HELD
    else:
        assert taken == len(lines)
    assert deliveries == expected and sizes == expected_sizes
    assert len(fast.requests) == len(slow.requests) and len(fast.deadlines) == len(slow.deadlines)


@given(
    st.integers(min_value=1, max_value=10**18),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=20), max_size=8),
    st.sampled_from(["result", "error"]),
    st.booleans(),
    st.booleans(),
)
def test_an_oversize_answers_id_is_read_from_its_ends_in_any_spacing(
    id: int, body: dict[str, Any], key: str, id_first: bool, spaced: bool
) -> None:
    """A server that writes spaces (Python's json.dumps) gets its too-large
    answer's caller told at once too, not left to time out."""
    import json

    fields = {"jsonrpc": "2.0", "id": id, key: body} if id_first else {key: body, "id": id}
    line = json.dumps(fields, separators=None if spaced else (",", ":")).encode()
    assert answer_id(line[:64], line[-64:]) == id


@pytest.mark.parametrize(
    "head, tail",
    [
        (b'{"result":{"id":3,"x":', b'"y":{"id":4}}'),  # ids inside the result
        (b'[{"jsonrpc":"2.0","id":1,', b'"id":2}]'),  # a batch
        (b'{"jsonrpc":"2.0","id":"s",', b"}"),  # not one of the broker's ids
        (b'{"jsonrpc":"2.0","id":12345678901234567890,', b"}"),  # too long
    ],
)
def test_no_id_is_guessed_from_inside_an_answer(head: bytes, tail: bytes) -> None:
    assert answer_id(head, tail) is None


BIG = b"x" * 5000


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","id":7,"result":{"content":["' + BIG + b'"]}}',
        b'{"result":{"content":[]},"jsonrpc":"2.0","id":7}',
        b'{"result":{"content":["' + BIG + b'"]},"jsonrpc":"2.0","id":7}',
    ],
)
def test_an_answer_is_searched_in_the_line_it_came_in(line: bytes) -> None:
    # (a 1 MiB answer was copied twice to be searched, on every legacy
    # client's call at a modern server: broker/eras/bridge.py ends_round)
    answer = split_answer(line)
    assert answer is not None
    assert answer.written() is line
    answer.id = "client's"  # (the session's id changes nothing of the server's line)
    assert answer.written() is line
    if answer.head is not line and type(answer.head) is memoryview:
        answer.head = b'{"result":{"content":[],"resultType":"complete"},"jsonrpc":"2.0","id":'
    else:
        answer.tail = b',"result":{"resultType":"complete","content":[]}}'
    written = answer.written()
    assert written == answer.encode() or written is answer.tail  # (replaced: its bytes now)


def test_a_small_answer_in_the_usual_shape_is_searched_in_its_rest() -> None:
    """split_answer copies a small answer's rest after the id (cheaper than a
    view of it): that is what there is to search, every key and string but
    the id's."""
    line = b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}'
    answer = split_answer(line)
    assert answer is not None and type(answer.tail) is bytes
    assert answer.written() is answer.tail == b',"result":{"content":[]}}'
    assert answer.encode() == line


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}', False),
        (b'{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"m"}}', True),
        (b'{"result":{"content":[]},"jsonrpc":"2.0","id":7}', False),
        (b'{"error":{"code":-32601,"message":"m"},"jsonrpc":"2.0","id":7}', True),
        (b'{"jsonrpc":"2.0","id":7,"result":{"content":["' + BIG + b'"]}}', False),
        (b'{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"' + BIG + b'"}}', True),
    ],
)
def test_an_answer_says_whether_it_is_an_error_as_its_parse_does(line: bytes, error: bool) -> None:
    answer = split_answer(line)
    assert answer is not None
    assert answer.is_error() is error is ("error" in orjson.loads(line))
    # (a stamped result keeps its key where it was: broker/eras/modern.py)
    assert complete_answer(answer, "tools/call") is answer and answer.is_error() is error
    # (the usual shape's head, equal to the prefix though not the same object)
    if line.startswith(PREFIX):
        copy = Answer(bytes(bytearray(PREFIX)), answer.id, answer.tail)
        assert copy.is_error() is error


# Lines in and near the usual shape: the prefix, an id (any digits, a sign,
# nothing), a key (one of the two, another, a part of one), the rest.
near_usual = st.builds(
    lambda prefix, id, key, rest: prefix + id + key + rest,
    st.sampled_from([PREFIX, PREFIX[:-1], b'{"jsonrpc":"2.0","id" :', b""]),
    st.one_of(
        st.integers(0, 10**21).map(lambda n: str(n).encode()),
        st.sampled_from([b"", b"0", b"00", b"01", b"-1", b"1.5", b"1e3", b"9" * 19, b"9" * 20]),
    ),
    st.sampled_from([b',"result":', b',"error":', b',"result"', b',"res', b',"x":', b"", b"}"]),
    st.sampled_from([b"{}}", b"1}", b'{"a":1}}', b"", b"}", b"{"]),
)


@given(near_usual)
def test_the_usual_shape_is_read_alike_byte_by_byte_and_by_match(line: bytes) -> None:
    """The compiled rules read an answer's id byte by byte (usual_id_read),
    the Python rules by one match: the same end, and the same id, on any
    line (both readings run here, in either build)."""
    from broker.wire.envelope import _USUAL, usual_id_read

    match = _USUAL.match(line)
    want = (-1, 0) if match is None else (match.end(), int(line[len(PREFIX) : match.end()]))
    assert usual_id_read(line) == want


def test_each_build_reads_the_usual_shape_its_own_way() -> None:
    """The compiled rules take the byte-by-byte reading, the Python rules the
    match (what makes each cheaper: split_answer)."""
    from broker.wire import envelope

    assert envelope._COMPILED is (not envelope.__file__.endswith(".py"))
