"""Fuzzing the rules that read bytes from peers: framing, decoding, a client
session, a server's answers (docs/faults.md, "Fuzzing").

:func:`check` runs one input through what the daemon does with bytes, the
way its actors do it:

1. **framing**: ``LineFramer`` (a small limit, so that oversize lines are
   common) fed the input in chunks cut where the input's first bytes say;
   every line comes out once, never holding a newline, an ``Oversize`` for
   exactly the lines over the limit;
2. **decoding**: ``jsonrpc.decode`` and ``classify`` of each frame;
3. **a client session** (initialized, aggregated over a ready and a
   restarting server): ``take_forwards`` then, frame by frame, ``decode``
   and ``receive`` as ``actors/session.py`` does, and ``take_outgoing`` of
   what the session sent;
4. **a server's answers** (an ``UpstreamProtocol`` that is ready, with
   requests of two sessions in flight): ``take_answers`` then, frame by
   frame, ``oversize`` or ``decode``, ``response_fast`` and
   ``server_message`` as ``actors/upstream.py`` does; what it delivers goes
   through the session's ``take_outgoing`` and is encoded.

The only exception allowed is :class:`broker.jsonrpc.JsonRpcError` where the
actors catch it (``decode``, ``classify``, ``server_message``): it is an
answer, not a crash. Anything else escaping is a bug, and the fuzzer stops on
it with the input that caused it.

:func:`check_modern` does the same in the 2026-07-28 era: the client
session is a modern one that has remembered its client's ``_meta`` bytes
(``broker/eras/metacache.py``: a line that carries them is read without
them), and the server a 2026-07-28 one with calls of that session and of a
legacy one in flight, whose ``input_required`` answers the bridge turns
into questions to the legacy client; each question is answered, and the
call sent again.

Run by hand (not in the suite; tests/test_fuzz.py runs :func:`check` and
:func:`check_modern` on a few hundred inputs from Hypothesis)::

    pip install atheris
    python -m benchmarks.fuzz -atheris_runs=1000000 -max_len=4096 [CORPUS_DIR]
    FUZZ_ERA=modern python -m benchmarks.fuzz ...   # check_modern
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
from typing import Any

import attrs
import orjson

from broker import jsonrpc
from broker.catalog import Catalog, ServerEntry
from broker.eras.session import become_modern
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LATEST_MODERN_VERSION,
    PROTOCOL_VERSION_KEY,
)
from broker.jsonrpc import JsonRpcError
from broker.lifecycle import ServerIdentity
from broker.session import Reply, SessionProtocol
from broker.states import ServerState
from broker.upstream import Deliver, UpstreamProtocol
from broker.wire.frames import Oversize
from broker.wire.ndjson import LineFramer, write_messages

MAX_BYTES = 256  # the framer's limit here: long lines are common in fuzzed input
# check_modern's: a modern call carrying its client's _meta is about 300 bytes.
MODERN_MAX_BYTES = 512
IDENTITY = ServerIdentity(
    "2025-11-25",
    {"tools": {}, "prompts": {}, "resources": {"subscribe": True}, "logging": {}, "tasks": {}},
    {"name": "a"},
)
CATALOG = Catalog(
    [
        ServerEntry(
            "a",
            ServerState.READY,
            IDENTITY,
            {
                "tools": ({"name": "t"},),
                "resources": ({"uri": "mem://a/r"},),
                "templates": ({"uriTemplate": "mem://a/{x}"},),
            },
        ),
        ServerEntry("b", ServerState.RESTARTING, error="exited"),
    ]
)
# Seeds: lines a client or a server really sends.
SEEDS = [
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__t","arguments":{}}}\n',
    b'{"jsonrpc":"2.0","id":"x","method":"resources/subscribe","params":{"uri":"mem://a/r"}}\n'
    b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"x"}}\n',
    b'[{"jsonrpc":"2.0","id":2,"method":"ping"},{"jsonrpc":"2.0","id":3,"method":"tools/list"}]\n',
    b'{"jsonrpc":"2.0","id":1,"result":{"content":[]}}\n{"result":{},"jsonrpc":"2.0","id":2}\n',
    b'{"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"no"}}\r\n',
    b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}\n',
    b'{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{}}\n',
    b'{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"mem://a/r"}}\n',
    b'{"jsonrpc":"2.0","id":123456789012345678901234567890,"result":1e400}\n',
]


# The _meta a modern client puts on every request (the one the session remembers).
MODERN_META = orjson.dumps(
    {
        PROTOCOL_VERSION_KEY: LATEST_MODERN_VERSION,
        CLIENT_CAPABILITIES_KEY: {"elicitation": {}, "sampling": {}},
        CLIENT_INFO_KEY: {"name": "fuzz", "version": "1"},
    }
)
MODERN_CALL = (
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__t","arguments":{},'
    b'"_meta":' + MODERN_META + b"}}\n"
)
MODERN_SEEDS = [
    MODERN_CALL,
    MODERN_CALL.replace(b'"id":1', b'"id":"x"').replace(b'"arguments":{}', b'"arguments":{"a":1}'),
    b'{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":' + MODERN_META + b"}}\n",
    b'{"jsonrpc":"2.0","id":3,"method":"subscriptions/listen","params":{"notifications":'
    b'{"toolsListChanged":true},"_meta":' + MODERN_META + b"}}\n",
    b'{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","content":[]}}\n',
    # (to the calls of "B", a legacy session, then of the modern one: _modern_server_side)
    b'{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":'
    b'{"q":{"method":"elicitation/create","params":{"message":"?","requestedSchema":'
    b'{"type":"object","properties":{}}}}},"requestState":"s"}}\n',
    b'{"jsonrpc":"2.0","id":2,"result":{"resultType":"input_required","inputRequests":'
    b'{"q":{"method":"sampling/createMessage","params":{"messages":[],"maxTokens":9}}},'
    b'"requestState":"s"}}\n',
    b'{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":1}}\n',
]


class _Catalogs:
    current = CATALOG


class _ModernCatalogs:
    """The catalog once it knows server "a" speaks 2026-07-28, as the modern
    server of :func:`_modern_server_side` does (a modern session then keeps no
    record of the calls its fast paths send there)."""

    current = CATALOG.replace(
        attrs.evolve(
            CATALOG.entry("a"),
            identity=attrs.evolve(IDENTITY, protocol_version=LATEST_MODERN_VERSION),
        )
    )


def check(data: bytes) -> None:
    """One input through framing, decoding, a session and a server's answers;
    raises only on a bug (AssertionError for a broken invariant)."""
    frames = _frames(data)
    if not frames:
        return  # (nothing for the protocols: no line was complete)
    session = _session()
    _client_side(session, frames)
    _server_side(session, frames)


def check_modern(data: bytes) -> None:
    """:func:`check` in the 2026-07-28 era (the module's docstring)."""
    frames = _frames(data, MODERN_MAX_BYTES)
    if not frames:
        return
    # (half the inputs: a catalog that still says "a" is legacy, as one does
    # until a server that came back in another era is listed again)
    session = _modern_session(_ModernCatalogs if data[-1] % 2 else _Catalogs)
    _client_side(session, frames, MODERN_MAX_BYTES)
    _modern_server_side(session, frames)


def _frames(data: bytes, limit: int = MAX_BYTES) -> list[Any]:
    """The input's lines, fed to the framer (at most ``limit`` bytes a line) in
    chunks the input's first byte cuts."""
    step = (data[0] % 17 + 1) if data else 1
    framer = LineFramer(limit)
    frames: list[Any] = []
    for start in range(0, len(data), step):
        frames += framer.feed(data[start : start + step])
    expected = [line.rstrip(b"\r") for line in data.split(b"\n")[:-1]]
    expected = [line for line in expected if line.strip()]
    assert len(frames) <= len(expected), (frames, expected)
    for frame in frames:
        if isinstance(frame, Oversize):
            assert frame.size > limit
        else:
            assert b"\n" not in frame and len(frame) <= limit
    return frames


def _session() -> SessionProtocol:
    session = SessionProtocol(("a", "b"), _Catalogs())
    initialize = {"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}}}
    session.receive({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": initialize})
    session.receive(jsonrpc.notification("notifications/initialized"))
    return session


def _modern_session(catalogs: Any = _Catalogs) -> SessionProtocol:
    """A modern session, attached, that reads its client's _meta bytes unparsed."""
    session = become_modern(SessionProtocol(("a", "b"), catalogs()), b"k" * 32)
    first = LineFramer().feed(MODERN_CALL)
    forwards: dict[str, list[Any]] = {}
    session.receive(jsonrpc.decode(MODERN_CALL.replace(b'"id":1', b'"id":"first"')))
    assert session.take_forwards(first, 0, forwards) == 1, "the call was not taken"
    assert session.meta_cache.key, "the _meta was not remembered"
    return session


def _client_side(session: SessionProtocol, frames: list[Any], limit: int = MAX_BYTES) -> None:
    """What actors/session.py does with a read of a client's frames."""
    forwards: dict[str, list[Any]] = {}
    i = 0
    while True:
        i = session.take_forwards(frames, i, forwards)
        if i == len(frames):
            break
        frame, i = frames[i], i + 1
        if isinstance(frame, Oversize):
            _encode([frame.error_response(limit)])
            continue
        try:
            message = jsonrpc.decode(frame)
        except JsonRpcError as exc:
            _encode([exc.to_response()])
            continue
        for action in session.receive(message):
            if isinstance(action, Reply):  # (a Forward goes to a server, a Defer waits)
                out: list[Any] = []
                session.take_outgoing([action.message], out)
                _encode(out)


def _server_side(session: SessionProtocol, frames: list[Any]) -> None:
    """What actors/upstream.py does with a read of a server's frames, with
    requests of two sessions in flight."""
    server = UpstreamProtocol("a")
    server.start()
    answer = {"protocolVersion": "2025-11-25", "capabilities": IDENTITY.capabilities}
    server.server_message(
        jsonrpc.result_response("mcpbroker-initialize", {**answer, "serverInfo": {"name": "a"}})
    )
    for index in range(6):
        caller = session if index % 2 else "B"
        server.attach(caller, {"sampling": {}, "roots": {}})
        params = {"name": "t", "_meta": {"progressToken": index}}
        if index == 5:
            params = {"uri": "mem://a/r"}
        method = "resources/subscribe" if index == 5 else "tools/call"
        request = {"jsonrpc": "2.0", "id": index, "method": method, "params": params}
        server.client_request(caller, request)
    deliveries: dict[Any, list[Any]] = {}
    _answer_server(server, frames, deliveries)
    if len(frames) % 2:  # (half the time: what is left in flight expires, or is failed)
        server.expire(now=1e9)
    server.server_gone("exited")
    out: list[Any] = []
    session.take_outgoing(deliveries.get(session, []), out)
    _encode(out)


def _modern_server_side(session: SessionProtocol, frames: list[Any]) -> None:
    """:func:`_server_side` at a 2026-07-28 server, with calls of the modern
    session and of a legacy one ("B", whose questions the bridge asks it
    and which answers each) in flight."""
    server = UpstreamProtocol("a", era="auto")
    server.start()
    found = {"resultType": "complete", "supportedVersions": [LATEST_MODERN_VERSION]}
    found |= {"capabilities": IDENTITY.capabilities, "serverInfo": {"name": "a"}}
    server.server_message(jsonrpc.result_response("mcpbroker-discover", found))
    assert server.speaking == LATEST_MODERN_VERSION, "the server was not found modern"
    server.attach(session, {}, modern=True)
    server.attach("B", {"sampling": {}, "elicitation": {}, "roots": {}}, client_info={"name": "B"})
    meta = orjson.loads(MODERN_META)
    for index in range(6):
        caller: Any = session if index % 2 else "B"
        params: dict[str, Any] = {"name": "t", "arguments": {}}
        if caller is session:
            params["_meta"] = meta
        request = {"jsonrpc": "2.0", "id": index, "method": "tools/call", "params": params}
        server.client_request(caller, request)
    deliveries: dict[Any, list[Any]] = {}
    _answer_server(server, frames, deliveries, MODERN_MAX_BYTES)
    for _ in range(3):  # the legacy client answers what the bridge asked it, and again
        asked = [m for m in deliveries.pop("B", []) if isinstance(m, dict) and "method" in m]
        for question in asked:
            answer = jsonrpc.result_response(question.get("id"), {"action": "accept"})
            _deliver(server.client_answer("B", answer, 1.0), deliveries)
    if len(frames) % 2:
        server.expire(now=1e9)
    server.server_gone("exited")
    out: list[Any] = []
    session.take_outgoing(deliveries.get(session, []), out)
    _encode(out)


def _answer_server(
    server: UpstreamProtocol,
    frames: list[Any],
    deliveries: dict[Any, list[Any]],
    limit: int = MAX_BYTES,
) -> None:
    """What actors/upstream.py does with a read of a server's frames."""
    sizes: dict[Any, int] = {}
    i = 0
    while True:
        i = server.take_answers(frames, i, deliveries, sizes)
        if i == len(frames):
            break
        frame, i = frames[i], i + 1
        if isinstance(frame, Oversize):
            actions: list[Any] = server.oversize(frame, limit)
        else:
            try:
                message = jsonrpc.decode(frame)
                target = server.response_fast(message)
                if target is not None:
                    deliveries.setdefault(target, []).append(message)
                    continue
                actions = server.server_message(message, 1.0)
            except JsonRpcError:
                continue  # logged and dropped by the actor
        _deliver(actions, deliveries)


def _deliver(actions: list[Any], deliveries: dict[Any, list[Any]]) -> None:
    for action in actions:
        if type(action) is Deliver:
            deliveries.setdefault(action.session, []).append(action.message)


def _encode(messages: list[Any]) -> None:
    """Write messages as the connection does (the writer answers for what
    it cannot encode, actors/session.py: TypeError is its case)."""
    with contextlib.suppress(TypeError, orjson.JSONEncodeError):
        write_messages(messages, [])


def main(argv: list[str]) -> None:
    import atheris  # (only the fuzzer needs it)

    modern = os.environ.get("FUZZ_ERA") == "modern"
    one_input = check_modern if modern else check
    corpus = [a for a in argv[1:] if not a.startswith("-")]
    for path in corpus:
        directory = pathlib.Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        for n, seed in enumerate(MODERN_SEEDS if modern else SEEDS):
            (directory / f"seed-{n}").write_bytes(seed)
    if os.environ.get("FUZZ_INSTRUMENT", "1") != "0":  # (0: mutation only, four times faster)
        for module in list(sys.modules.values()):  # coverage of the rules only
            if getattr(module, "__name__", "").startswith("broker"):
                for value in list(vars(module).values()):
                    _instrument(atheris, value)
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


def _instrument(atheris: Any, value: Any) -> None:
    """Instrument a function of the rules, or each method of a class of theirs."""
    if isinstance(value, type) and value.__module__.startswith("broker"):
        for name, member in list(vars(value).items()):
            if callable(member) and hasattr(member, "__code__"):
                setattr(value, name, atheris.instrument_func(member))
    elif getattr(value, "__module__", "").startswith("broker") and hasattr(value, "__code__"):
        atheris.instrument_func(value)


if __name__ == "__main__":
    main(sys.argv)
