"""A modern session reads the ``_meta`` bytes its client repeats once (broker/eras/metacache.py).

The rule must never read a line otherwise than decoding it in full would:
unit tests for each anchor and fallback, then property tests holding it,
and a session that uses it, to the general path (the same message, the
same answers and errors, the same bytes upstream but the ids).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker import jsonrpc
from broker.eras.metacache import MARKER_BYTES, MAX_REMEMBERED, MetaCache
from broker.eras.session import become_modern
from broker.eras.tokens import OWN_PREFIX
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LOG_LEVEL_KEY,
    PROTOCOL_VERSION_KEY,
)
from broker.jsonrpc import JsonRpcError
from broker.session import Forward, Reply, SessionProtocol
from broker.wire.envelope import Answer, split_answer
from tests.test_eras_fuzz import _state, modern_requests
from tests.test_fuzz import Catalogs, ModernCatalogs, _ready_upstream, json_values


def _json(value: Any) -> bytes:
    """A value as orjson writes it, or (an integer past 64 bits) the standard library."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


META = {
    PROTOCOL_VERSION_KEY: "2026-07-28",
    CLIENT_CAPABILITIES_KEY: {"sampling": {}},
    CLIENT_INFO_KEY: {"name": "c", "version": "1"},
}
C = orjson.dumps(META)


def _call(
    id: Any = 1, meta: Any = META, first: bool = False, method: Any = "tools/call", **params: Any
) -> bytes:
    """A tools/call (or another method) as the SDK writes it (``_meta`` last), or with it first."""
    rest = {"name": "t", "arguments": {"x": 1}, **params}
    body = {"_meta": meta, **rest} if first else {**rest, "_meta": meta}
    return _json({"jsonrpc": "2.0", "id": id, "method": method, "params": body})


def _remembering(meta: dict[str, Any] = META) -> MetaCache:
    cache = MetaCache()
    line = _call(0, meta)
    cache.remember(line, jsonrpc.decode(line)["params"]["_meta"])
    return cache


# -- the rule, case by case -------------------------------------------------------


@pytest.mark.parametrize("first", [False, True])
def test_a_line_with_the_remembered_bytes_decodes_to_what_it_says(first: bool) -> None:
    cache = _remembering()
    line = _call(7, first=first)
    message = cache.decode(line)
    assert orjson.dumps(message) == orjson.dumps(jsonrpc.decode(line))  # (what a server gets)
    assert message is not None and message["params"]["_meta"] is cache.fragment  # (not decoded)
    assert cache.capabilities == {"sampling": {}} and cache.client_info == META[CLIENT_INFO_KEY]


@pytest.mark.parametrize(
    "line",
    [
        _call(),
        b'{"jsonrpc":"2.0","id":1,"params":{}}',
        b"{}}",
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{\n',
    ],
)
def test_nothing_remembered_reads_nothing(line: bytes) -> None:
    # (an empty key is found anywhere: read so, '{"params":{}}' had an unchecked
    # _meta; nor is a newline a key no frame holds: a WebSocket message or a
    # POST may end with one, and the last line, not JSON, read as a call)
    assert MetaCache().decode(line) is None


@pytest.mark.parametrize(
    "meta",
    [
        {**META, LOG_LEVEL_KEY: "info"},  # a log level: the general path's
        {**META, "progressToken": 1},  # reaches the server: never remembered
        {**META, "x": 1},
        {**META, CLIENT_INFO_KEY: {"version": "12345678901234567890"}},  # the exact parse's
    ],
)
def test_a_meta_with_other_keys_or_long_numbers_is_not_remembered(meta: dict[str, Any]) -> None:
    cache = _remembering(meta)
    assert cache.key == b""
    assert cache.decode(_call(1, meta)) is None


def test_a_meta_written_otherwise_than_orjson_writes_it_is_not_remembered() -> None:
    cache = MetaCache()
    line = _call().replace(b'"_meta":{', b'"_meta": {')
    cache.remember(line, jsonrpc.decode(line)["params"]["_meta"])
    assert cache.key == b""


def test_a_session_tries_to_remember_so_many_times() -> None:
    cache = MetaCache()
    for n in range(MAX_REMEMBERED + 2):
        meta = {**META, CLIENT_INFO_KEY: {"name": str(n)}}
        line = _call(n, meta)
        cache.remember(line, jsonrpc.decode(line)["params"]["_meta"])
        if n < MAX_REMEMBERED:
            assert orjson.loads(orjson.dumps(cache.fragment)) == meta
    assert cache.client_info == {"name": str(MAX_REMEMBERED - 1)}
    assert orjson.loads(orjson.dumps(cache.fragment))[CLIENT_INFO_KEY] == cache.client_info


BAD = [
    # another _meta after the remembered bytes: the last one counts (and differs)
    _call().replace(b"}}}", b'},"_meta":{}}}'),
    # the marker's digits already in the line
    _call(int(MARKER_BYTES)),
    _call(arguments={"n": int(MARKER_BYTES)}),
    # a second params, spelled with an escape, overrides the one with the bytes
    _call()[:-1] + b',"p\\u0061rams":{"name":"t"}}',
    # the bytes in another object: arguments, or a key after params
    _call(meta=None, arguments={"_meta": META}),
    _call(meta=None)[:-1] + b',"x":{"_meta":' + C + b"}}",
    # a key that ends in _meta (escaped quote)
    _call(meta=None).replace(b'"_meta":null', b'"x\\"_meta":' + C),
    # not JSON around the bytes
    _call()[:-1],
    _call().replace(b'"_meta":', b'"_meta":{"a":', 1) + b"}",
    b'{"params":{"_meta":' + C + b"}",
    # params not an object
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["_meta":' + C + b"]}",
]


@pytest.mark.parametrize("line", BAD)
def test_a_line_the_bytes_do_not_settle_is_decoded_in_full(line: bytes) -> None:
    assert _remembering().decode(line) is None


def test_an_earlier_duplicate_meta_is_overridden_as_the_decoder_has_it() -> None:
    """``"_meta":{}`` then the remembered bytes: both readings take the last."""
    line = _call().replace(b'"arguments"', b'"_meta":{},"arguments"')
    assert orjson.dumps(_remembering().decode(line)) == orjson.dumps(jsonrpc.decode(line))


# -- held to the general path ------------------------------------------------------

OTHER_META = {**META, PROTOCOL_VERSION_KEY: "2025-11-25"}
PIECES = [
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b'"',
    b"\\",
    b" ",
    b'"params":',
    b'"p\\u0061rams":',
    b'"_meta":',
    b'"_m\\u0065ta":',
    b'"_meta":' + C,
    C,
    b'"_meta":' + MARKER_BYTES,
    MARKER_BYTES,
    b'"name":"t"',
    b'"jsonrpc":"2.0"',
    b'"id":1',
    b'"method":"tools/call"',
    b"1",
    b"12345678901234567890",
    b"null",
]
values = st.one_of(
    st.sampled_from([C, orjson.dumps(OTHER_META), MARKER_BYTES, b"{}", b"null", b'"x"']),
    json_values.map(_json),
)
keys = st.sampled_from([b'"_meta"', b'"_m\\u0065ta"', b'"name"', b'"arguments"', b'"x"'])


def _object(pairs: list[tuple[bytes, bytes]]) -> bytes:
    return b"{" + b",".join(key + b":" + value for key, value in pairs) + b"}"


params_objects = st.lists(st.tuples(keys, values), max_size=4).map(_object)
top_keys = st.sampled_from([b'"params"', b'"p\\u0061rams"', b'"x"', b'"id"'])
structured_lines = st.lists(
    st.tuples(top_keys, st.one_of(params_objects, values)), min_size=1, max_size=4
).map(lambda pairs: _object([(b'"jsonrpc"', b'"2.0"'), (b'"method"', b'"t"'), *pairs]))
good_calls = st.builds(
    _call,
    st.integers(0, 20),
    st.just(META),
    st.booleans(),
    name=st.sampled_from(["t", "a__t"]),  # (the tool in a transparent view, and in one of two)
    arguments=json_values,
)


def _edited(line: bytes, at: int, piece: bytes, cut: int) -> bytes:
    """``line`` with ``cut`` bytes from ``at`` replaced by ``piece``."""
    at = at % (len(line) + 1)
    return line[:at] + piece + line[at + cut :]


edits = st.tuples(st.integers(0, 400), st.sampled_from([b"", *PIECES]), st.integers(0, 2))
lines = st.one_of(
    st.lists(st.sampled_from(PIECES), max_size=14).map(b"".join),
    structured_lines,
    good_calls,
    st.tuples(st.one_of(good_calls, structured_lines), st.lists(edits, min_size=1, max_size=3)).map(
        lambda t: _apply(*t)
    ),
)


def _apply(line: bytes, changes: list[tuple[int, bytes, int]]) -> bytes:
    for at, piece, cut in changes:
        line = _edited(line, at, piece, cut)
    return line


@settings(max_examples=3000, deadline=None)
@given(lines)
@example(_call())
@example(_call(first=True))
@example(_call()[:-1] + b',"p\\u0061rams":{"name":"t"}}')
def test_what_the_bytes_read_is_what_decoding_reads(line: bytes) -> None:
    """Whatever the line, a message read with the remembered bytes is the
    message the line decodes to, ``_meta`` and all; a line that does not
    decode (or nests too deep) is never read."""
    got = _remembering().decode(line)
    try:
        want = jsonrpc.decode(line)
    except JsonRpcError:
        assert got is None
        return
    if got is not None:  # (as bytes: a number past 64 bits is a Fragment, equal only to itself)
        assert orjson.dumps(got) == orjson.dumps(want)
        assert want["params"]["_meta"] == META


metas = st.sampled_from(
    [META, META, OTHER_META, {**META, LOG_LEVEL_KEY: "info"}, {**META, "progressToken": 3},
     {PROTOCOL_VERSION_KEY: "2026-07-28"}, {**META, CLIENT_CAPABILITIES_KEY: []}, None]
)  # fmt: skip
calls = st.builds(
    _call,
    st.one_of(st.integers(0, 6), st.sampled_from(["a", "b"])),
    metas,
    st.booleans(),
    name=st.sampled_from(["t", "t", "a__t", "x"]),
    arguments=json_values,
)
# Calls with the remembered bytes whose method may be no string (a list is
# unhashable: a set's test of it raised, and failed the session), some of
# them retries (the one test that reads the method before the session's).
odd_calls = st.builds(
    _call,
    st.integers(0, 6),
    st.just(META),
    method=st.sampled_from(["tools/call", "tools/list", ["tools/call"], None, {}, 1]),
    requestState=st.sampled_from([OWN_PREFIX + "x", "mcpbroker.x", 1]),
)
session_lines = st.lists(
    st.one_of(calls, good_calls, good_calls, odd_calls, modern_requests.map(_json), lines),
    max_size=8,
)


def _read_fast(session: Any, frames: list[bytes]) -> list[Any]:
    """What the Session actor does with a read: a run of calls taken at a
    time (take_forwards, with the remembered bytes), each other line decoded
    and received."""
    out: list[Any] = []
    i = 0
    while i < len(frames):
        forwards: dict[str, list[Any]] = {}
        i = session.take_forwards(frames, i, forwards)
        out += [Forward(server, m) for server, ms in forwards.items() for m in ms]
        if i < len(frames):
            out += _receive(session, frames[i])
            i += 1
    return out


def _receive(session: Any, line: bytes) -> list[Any]:
    try:
        message = jsonrpc.decode(line)
    except JsonRpcError as exc:
        return [Reply(exc.to_response())]
    return list(session.receive(message, settled=True))


def _modern_session(transparent: bool, catalogs: Any = Catalogs) -> Any:
    view = ("a",) if transparent else ("a", "b")
    session = become_modern(SessionProtocol(view, catalogs(), transparent=transparent), b"k" * 16)
    discover = {"jsonrpc": "2.0", "id": "d", "method": "server/discover"}
    session.receive({**discover, "params": {"_meta": META}}, settled=True)
    return session


@settings(max_examples=500, deadline=None)
@given(session_lines, st.booleans(), st.sampled_from([Catalogs, ModernCatalogs]))
def test_a_session_reading_with_the_remembered_bytes_does_what_receive_does(
    frames: list[bytes], transparent: bool, catalogs: Any
) -> None:
    """Every line answered, forwarded or refused as the general path does it
    (-32602, -32022 for a bad _meta included), the session left in the same
    state, and the forwarded requests the same bytes at a legacy and at a
    modern server, ids apart."""
    fast, slow = _modern_session(transparent, catalogs), _modern_session(transparent, catalogs)
    got = _read_fast(fast, frames)
    want = [action for frame in frames for action in _receive(slow, frame)]
    assert _written(got) == _written(want)
    assert _state(fast) == _state(slow)
    for era in ("legacy", "modern"):
        assert _upstream_bytes(era, got) == _upstream_bytes(era, want)


def _written(actions: list[Any]) -> list[Any]:
    """Actions with their messages as bytes (key order too; a Fragment is equal only to itself)."""
    return [
        (type(a), a.server, orjson.dumps(a.message)) if isinstance(a, Forward)
        else (type(a), re.sub(rb" at 0x[0-9a-f]+", b"", orjson.dumps(a.message)))
        if isinstance(a, Reply)  # (an error may name a Fragment's repr)
        else a
        for a in actions
    ]  # fmt: skip


def _upstream_bytes(era: str, actions: list[Any]) -> list[bytes]:
    upstream = _ready_upstream(era)
    # (copied, the remembered _meta's Fragment kept: the Upstream must take it
    # as it comes, and drop it for a legacy server)
    requests = [_copied(a.message) for a in actions if isinstance(a, Forward)]
    out: list[Any] = []
    upstream.take_requests("B", requests, 0, out, 0.0)
    return [orjson.dumps({**m, "id": 0}) for m in out]


def _copied(value: Any) -> Any:
    """A deep copy that keeps each Fragment (which cannot be copied)."""
    if type(value) is dict:
        return {key: _copied(item) for key, item in value.items()}
    if type(value) is list:
        return [_copied(item) for item in value]
    return value


def test_a_session_remembers_once_and_reads_every_call_after() -> None:
    session = _modern_session(True)
    frames = [_call(n) for n in range(5)]
    forwards: dict[str, list[Any]] = {}
    assert session.take_forwards(frames, 0, forwards) == 5
    metas = [m["params"]["_meta"] for m in forwards["a"]]
    assert metas[0] == META  # (decoded in full, then remembered)
    assert all(meta is session.meta_cache.fragment for meta in metas[1:])
    assert [orjson.dumps(meta) for meta in metas] == [orjson.dumps(META)] * 5
    capabilities = META[CLIENT_CAPABILITIES_KEY]
    assert [call[2] for call in session.open_calls.values()] == [capabilities] * 5
    assert session.client_info == META[CLIENT_INFO_KEY]


def _answer(line: bytes, method: str, modern: bool) -> Answer:
    """``line``, a server's answer, as the Upstream hands it to a session."""
    answer = split_answer(line)
    assert answer is not None
    answer.method, answer.modern = method, modern
    return answer


def test_a_call_to_a_modern_server_leaves_no_record() -> None:
    """A modern server asks nothing mid-call and its answers pass as they
    came: the session keeps no record of a call to it (a record made and
    popped per call was a tenth of a modern call's extra work). Were the
    server legacy by the time it answers (restarted so), the answer is still
    completed, by the method the Upstream kept."""
    assert ModernCatalogs.current.modern == {"a"} and Catalogs.current.modern == frozenset()
    session = become_modern(SessionProtocol(("a",), ModernCatalogs(), transparent=True), b"k" * 16)
    discover = {"jsonrpc": "2.0", "id": "d", "method": "server/discover"}
    session.receive({**discover, "params": {"_meta": META}}, settled=True)
    forwards: dict[str, list[Any]] = {}
    frames = [_call(0), _call(1), _call(2, method="resources/read", uri="r"), _call(3)]
    assert session.take_forwards(frames, 0, forwards) == 4
    assert len(forwards["a"]) == 4
    assert session.open_calls == {} and session.inflight == {0, 1, 2, 3}

    written = b'{"jsonrpc":"2.0","id":0,"result":{"resultType":"complete","content":[]}}'
    legacy_call = b'{"jsonrpc":"2.0","id":1,"result":{"content":[]}}'
    legacy_read = b'{"jsonrpc":"2.0","id":2,"result":{"contents":[]}}'
    # (the key's name inside the result: not stamped unread, but read and completed)
    legacy_odd = b'{"jsonrpc":"2.0","id":3,"result":{"content":[],"x":{"resultType":1}}}'
    answers = [
        _answer(written, "tools/call", modern=True),
        _answer(legacy_call, "tools/call", modern=False),
        _answer(legacy_read, "resources/read", modern=False),
    ]
    out: list[Any] = []
    session.take_outgoing([*answers, _answer(legacy_odd, "tools/call", modern=False)], out)
    assert out[:3] == answers and session.inflight == set()
    results = [orjson.loads(answer.encode())["result"] for answer in answers]
    assert orjson.dumps(results[0]) == b'{"resultType":"complete","content":[]}'
    assert results[1] == {"resultType": "complete", "content": []}
    assert results[2]["resultType"] == "complete" and "ttlMs" in results[2]
    assert out[3]["result"] == {"content": [], "x": {"resultType": 1}, "resultType": "complete"}


def test_the_sdk_clients_calls_are_read_with_the_remembered_bytes() -> None:
    """The official SDK's modern client writes ``_meta`` as params' last key
    (its stamp adds it to the dumped request) and params last: the first
    place looked at. Its bytes, as its stdio transport writes them."""
    from mcp import types
    from mcp.client.session import _make_modern_stamp

    stamp = _make_modern_stamp("2026-07-28", {"name": "c", "version": "1"}, {}, lambda n, a: {})

    def sdk_line(id: int) -> bytes:
        params = types.CallToolRequestParams(name="t", arguments={"text": "é"})
        data = types.CallToolRequest(params=params).model_dump(
            by_alias=True, mode="json", exclude_none=True
        )
        stamp(data, {})
        request = types.JSONRPCRequest(jsonrpc="2.0", id=id, **data)
        return request.model_dump_json(by_alias=True, exclude_unset=True).encode()

    cache = MetaCache()
    first = sdk_line(1)
    cache.remember(first, jsonrpc.decode(first)["params"]["_meta"])
    line = sdk_line(2)
    assert line.endswith(cache.key + b"}}")
    message = cache.decode(line)
    assert message is not None and orjson.dumps(message) == orjson.dumps(jsonrpc.decode(line))
