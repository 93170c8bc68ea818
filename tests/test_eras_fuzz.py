"""Property tests: a modern session takes anything, in and out, and answers it."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz import MODERN_META, MODERN_SEEDS, check_modern
from broker import jsonrpc
from broker.eras.session import become_modern
from broker.eras.subscriptions import ACKNOWLEDGED
from broker.eras.tokens import OWN_PREFIX
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    LOG_LEVEL_KEY,
    PROTOCOL_VERSION_KEY,
    SUBSCRIPTION_ID_KEY,
)
from broker.session import Defer, Forward, Reply, SessionProtocol
from broker.wire.envelope import Answer, split_answer
from tests.test_fuzz import Catalogs, ModernCatalogs, _dumpable, json_values, levels, messages

MODERN_METHODS = [
    "server/discover",
    "tools/list",
    "tools/call",
    "prompts/get",
    "resources/read",
    "completion/complete",
    "subscriptions/listen",
    "initialize",
    "ping",
    "resources/subscribe",
]
meta = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            PROTOCOL_VERSION_KEY: st.one_of(st.just("2026-07-28"), json_values),
            CLIENT_CAPABILITIES_KEY: st.one_of(
                st.just({"elicitation": {}, "sampling": {}}), json_values
            ),
        },
        optional={LOG_LEVEL_KEY: st.one_of(levels, json_values), "progressToken": json_values},
    ),
)
modern_params = st.fixed_dictionaries(
    {"_meta": meta},
    optional={
        "name": st.sampled_from(["a__t", "t", "x"]) | json_values,
        "uri": json_values,
        "notifications": st.one_of(
            json_values,
            st.fixed_dictionaries(
                {},
                optional={
                    "toolsListChanged": st.booleans(),
                    "resourceSubscriptions": st.lists(st.text(max_size=6), max_size=2)
                    | json_values,
                },
            ),
        ),
        "inputResponses": json_values,
        # (this daemon's shape, another broker's, anything)
        "requestState": st.one_of(st.sampled_from([OWN_PREFIX + "x", "mcpbroker.x"]), json_values),
    },
)
modern_requests = st.fixed_dictionaries(
    {
        "jsonrpc": st.just("2.0"),
        "id": st.one_of(st.integers(0, 4), st.text(max_size=3)),
        # (and a method that is no string: a list is unhashable)
        "method": st.one_of(st.sampled_from(MODERN_METHODS), st.sampled_from([["tools/call"], {}])),
        "params": modern_params,
    }
)
server_messages = st.one_of(
    messages,
    st.fixed_dictionaries(
        {
            "jsonrpc": st.just("2.0"),
            "id": st.sampled_from(["mcpbroker:a:1", "mcpbroker:a:2", "mcpbroker:b:1", 7]),
            "method": st.sampled_from(["elicitation/create", "sampling/createMessage"]),
        },
        optional={"params": json_values},
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(modern_requests, messages), max_size=6),
       st.lists(server_messages, max_size=6), st.booleans())  # fmt: skip
def test_a_modern_session_answers_anything(
    received: list[Any], sent: list[Any], transparent: bool
) -> None:
    """Nothing raises, and every request is answered or passed on, once."""
    view = ("a",) if transparent else ("a", "b")
    session = become_modern(SessionProtocol(view, Catalogs(), transparent=transparent), b"k" * 16)
    for message in received:
        actions = session.receive(message, settled=True)
        assert not any(isinstance(action, Defer) for action in actions)
        if is_request(message):
            assert sum(accounts_for(message, action) for action in actions) == 1
    out: list[Any] = []
    session.take_outgoing(sent, out)
    session.take_upstream_answers()


def accounts_for(request: dict[str, Any], action: Any) -> bool:
    """Whether the action answers the request, passes it on, or acknowledges its stream."""
    if not isinstance(action, Reply | Forward) or not isinstance(action.message, dict):
        return False
    message = action.message
    if message.get("method") == ACKNOWLEDGED:
        return bool(message["params"]["_meta"][SUBSCRIPTION_ID_KEY] == request["id"])
    if isinstance(action, Forward):
        return bool(message.get("id") == request["id"])
    return ("error" in message and message.get("id") is None) or message.get("id") == request["id"]


def is_request(message: Any) -> bool:
    try:
        return jsonrpc.classify(message) is jsonrpc.Kind.REQUEST
    except jsonrpc.JsonRpcError:
        return False


def _modern(
    view: tuple[str, ...], transparent: bool, attached: bool, catalogs: Any = Catalogs
) -> Any:
    session = become_modern(SessionProtocol(view, catalogs(), transparent=transparent), b"k" * 16)
    if attached:  # (its first request attaches it; forward_fast takes none before)
        meta = {PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {}}
        discover = {"jsonrpc": "2.0", "id": "d", "method": "server/discover"}
        session.receive({**discover, "params": {"_meta": meta}}, settled=True)
    return session


def _state(session: Any) -> tuple[Any, ...]:
    """What a session keeps of its requests, the clients' values comparable
    (but its records of calls at modern servers: the general path keeps them,
    the fast paths do not, and neither needs them)."""
    modern = session.catalogs.current.modern
    return (
        session.inflight,
        {
            id: (m, s, _comparable(c), _comparable({k: v for k, v in p.items() if k != "_meta"}))
            for id, (m, s, c, p) in session.open_calls.items()
            if s not in modern
        },
        _comparable(session.client_info),
        session.log_levels.level(),
    )


def _comparable(value: Any) -> Any:
    """``value`` with each Fragment (a number orjson cannot hold, as a decoded
    line has it; equal only to itself) as its bytes."""
    if isinstance(value, orjson.Fragment):
        return ("fragment", orjson.dumps(value))
    if isinstance(value, dict):
        return {key: _comparable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_comparable(item) for item in value]
    return value


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.one_of(modern_requests, messages), max_size=5),
    st.booleans(),
    st.booleans(),
    st.sampled_from([Catalogs, ModernCatalogs]),
)
# (a cancel naming an unhashable id failed the session with a TypeError)
@example(
    [{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": []}}],
    False,
    False,
    Catalogs,
)
def test_the_modern_fast_path_does_what_receive_does(
    received: list[Any], transparent: bool, attached: bool, catalogs: Any
) -> None:
    """At a legacy server and at a modern one (whose calls the fast path keeps no record of)."""
    view = ("a",) if transparent else ("a", "b")
    fast = _modern(view, transparent, attached, catalogs)
    slow = _modern(view, transparent, attached, catalogs)
    for message in received:
        taken = fast.forward_fast(copy.deepcopy(message))
        answer = slow.receive(copy.deepcopy(message))
        if taken is None:
            fast.receive(copy.deepcopy(message))
        else:
            assert answer == [Forward(*taken)]
        assert _state(fast) == _state(slow)


small_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=2),
    max_leaves=4,
)  # fmt: skip
answer_bodies = st.one_of(
    st.builds(lambda r: {"result": r}, st.dictionaries(st.sampled_from(["content", "x"]),
                                                        small_values, max_size=2)),
    st.just({"result": {"resultType": "complete", "content": []}}),
    st.just({"result": []}),
    st.just({"error": {"code": -1, "message": "no"}}),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["tools/call", "prompts/get"]),
                       st.sampled_from([None, "debug", "error"]), answer_bodies, st.booleans()),
             max_size=6),
    st.randoms(use_true_random=False),
)  # fmt: skip
def test_answers_written_unparsed_are_the_answers_written_parsed(
    calls: list[tuple[int, str, str | None, dict[str, Any], bool]], random: Any
) -> None:
    """The fast way out (an Answer stamped as it is) writes what the client would
    read had it been parsed, and leaves the session in the same state: calls in
    flight together, some asking for log messages, answered in any order."""
    fast, slow = _modern(("a",), True, True), _modern(("a",), True, True)
    for id, method, level, _, _ in calls:
        meta = {PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {}}
        if level is not None:
            meta[LOG_LEVEL_KEY] = level
        request = {"jsonrpc": "2.0", "id": id, "method": method,
                   "params": {"name": "t", "_meta": meta}}  # fmt: skip
        assert fast.receive(copy.deepcopy(request)) == slow.receive(copy.deepcopy(request))
    random.shuffle(calls)
    for upstream_id, (id, _, _, body, typescript_shape) in enumerate(calls):
        message = {**body, "jsonrpc": "2.0", "id": upstream_id} if typescript_shape else {
            "jsonrpc": "2.0", "id": upstream_id, **body}  # fmt: skip
        answer = split_answer(orjson.dumps(message))
        assert answer is not None
        answer.id = id  # (matched by the upstream)
        out_fast: list[Any] = []
        out_slow: list[Any] = []
        fast.take_outgoing([answer], out_fast)
        slow.take_outgoing([{**message, "id": id}], out_slow)
        assert [m.read() if isinstance(m, Answer) else m for m in out_fast] == out_slow
        assert _state(fast) == _state(slow)


# -- bytes in, as the actors read them, in the modern era (benchmarks/fuzz.py) --


def _spliced(seed: bytes, start: int, length: int, junk: bytes) -> bytes:
    """``seed`` with ``length`` bytes from ``start`` (both cut to fit) replaced by ``junk``."""
    start %= len(seed)
    return seed[:start] + junk + seed[start + length :]


def _carrying_meta(request: dict[str, Any]) -> bytes:
    """``request`` written with the _meta bytes the session remembered (as the
    last key of params, the last of the message: where the SDK writes it)."""
    if not _dumpable(request):
        return b"{"
    params = {key: value for key, value in request["params"].items() if key != "_meta"}
    params["_meta"] = orjson.Fragment(MODERN_META)
    return orjson.dumps({key: value for key, value in request.items() if key != "params"} | {
        "params": params})  # fmt: skip


# Lines a modern client or server sends, whole and with a few bytes changed
# anywhere (in the remembered _meta, most of a call's bytes, a near miss is
# read past the cache, the changed line decoded in full).
modern_lines = st.lists(
    st.one_of(
        st.sampled_from(MODERN_SEEDS),
        st.builds(
            _spliced,
            st.sampled_from(MODERN_SEEDS),
            st.integers(0, 400),
            st.integers(0, 4),
            st.binary(max_size=4) | st.sampled_from([b"1", b'"', b"}", b"\\", b"0" * 20]),
        ),
        modern_requests.map(lambda m: orjson.dumps(m) if _dumpable(m) else b"{"),
        modern_requests.map(_carrying_meta),
    ),
    max_size=6,
).map(lambda lines: b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines))


@settings(max_examples=300, deadline=None)
@given(st.one_of(modern_lines, st.binary(max_size=600)))
def test_modern_bytes_from_a_peer_are_framed_decoded_and_answered_without_a_crash(
    data: bytes,
) -> None:
    """benchmarks/fuzz.py's ``check_modern``: a modern session that remembered its
    client's _meta, a 2026-07-28 server bridged to a legacy session."""
    check_modern(data)  # (only JsonRpcError, where the actors catch it, may be raised inside)
