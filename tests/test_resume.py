"""The shim's memory of its host's session (cli/resume.py): no processes."""

from __future__ import annotations

import json
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.resume import GAP_CODE, HostState, scan

ids = st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=20))
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["id", "method", "x"]), inner, max_size=3),
    ),
    max_leaves=8,
)


methods = st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\')


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # the Python SDK's shape, the TypeScript SDK's (id last), a notification
        (
            b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"id":9}}\n',
            (b"tools/call", b"3"),
        ),
        (
            b'{"method":"tools/call","params":{"id":9},"jsonrpc":"2.0","id":"a"}\n',
            (b"tools/call", b'"a"'),
        ),
        (
            b'{"method":"notifications/x","params":{"id":1},"jsonrpc":"2.0"}\n',
            (b"notifications/x", None),
        ),
        (b'{"jsonrpc":"2.0","id":4,"result":{"method":"m"}}\n', (None, b"4")),
        (b'{"result":{"id":1},"jsonrpc":"2.0","id":5}\n', (None, b"5")),
        (b'{ "jsonrpc" : "2.0", "id" : 6, "method" : "ping" }\n', (b"ping", b"6")),
        (b'{"jsonrpc":"2.0","id":"\\u00e9","method":"ping"}\n', (b"ping", '"é"'.encode())),
        (b"not json\n", (None, None)),
    ],
)
def test_scan_finds_the_top_level_method_and_id(
    line: bytes, expected: tuple[object, object]
) -> None:
    assert scan(line) == expected


@given(
    id=ids,
    method=st.text(methods, min_size=1, max_size=10),
    params=values,
    id_last=st.booleans(),
    spaced=st.booleans(),
)
def test_scan_agrees_with_a_parser(
    id: object, method: str, params: object, id_last: bool, spaced: bool
) -> None:
    message: dict[str, object] = {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
    if id_last:
        message = {"method": method, "params": params, "jsonrpc": "2.0", "id": id}
    separators = (", ", ": ") if spaced else (",", ":")
    line = json.dumps(message, separators=separators).encode() + b"\n"
    found_method, found_id = scan(line)
    assert found_method == method.encode()
    assert found_id is not None and json.loads(found_id) == id


def test_in_flight_requests_get_an_error_at_a_gap_and_answered_ones_do_not() -> None:
    state = HostState()
    for id in (1, 2, 3):
        assert state.up(b'{"jsonrpc":"2.0","id":%d,"method":"tools/call"}\n' % id)
    assert state.down(b'{"jsonrpc":"2.0","id":2,"result":{}}\n')
    state.up(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}\n')
    errors = [json.loads(line) for line in state.gap_errors().splitlines()]
    assert [(e["id"], e["error"]["code"]) for e in errors] == [(1, GAP_CODE)]
    assert state.gap_errors() == b""  # (each once)


def test_the_replay_restores_the_session_and_its_answers_are_dropped() -> None:
    state = HostState()
    init = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"1"}}\n'
    initialized = b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
    for line in (
        init,
        initialized,
        b'{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"info"}}\n',
        b'{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"error"}}\n',
        b'{"jsonrpc":"2.0","id":3,"method":"resources/subscribe","params":{"uri":"a://1"}}\n',
        b'{"jsonrpc":"2.0","id":4,"method":"resources/subscribe","params":{"uri":"a://2"}}\n',
        b'{"jsonrpc":"2.0","id":5,"method":"resources/unsubscribe","params":{"uri":"a://1"}}\n',
    ):
        state.up(line)
        id = scan(line)[1]
        if id is not None:
            assert state.down(b'{"jsonrpc":"2.0","id":%s,"result":{}}\n' % id)
    first, rest = state.replay()
    assert first is not None
    replayed_init = json.loads(first)
    assert (
        replayed_init["method"] == "initialize"
        and replayed_init["params"] == json.loads(init)["params"]
    )
    lines = rest.splitlines(keepends=True)
    assert lines[0] == initialized
    requests = [json.loads(line) for line in lines[1:]]
    assert [(r["method"], r["params"]) for r in requests] == [
        ("logging/setLevel", {"level": "error"}),
        ("resources/subscribe", {"uri": "a://2"}),
    ]
    for request in requests:  # their answers never reach the host
        answer = b'{"jsonrpc":"2.0","id":%s,"result":{}}\n' % json.dumps(request["id"]).encode()
        assert not state.down(answer)
    assert state.down(b'{"jsonrpc":"2.0","id":7,"result":{}}\n')  # the host's own do


def test_answers_to_a_dead_daemon_s_requests_are_dropped() -> None:
    state = HostState()
    state.down(b'{"jsonrpc":"2.0","id":11,"method":"roots/list"}\n')
    state.down(b'{"jsonrpc":"2.0","id":12,"method":"roots/list"}\n')
    assert state.up(b'{"jsonrpc":"2.0","id":11,"result":{"roots":[]}}\n')
    state.gap_errors()
    assert not state.up(b'{"jsonrpc":"2.0","id":12,"result":{"roots":[]}}\n')
    assert state.up(b'{"jsonrpc":"2.0","id":12,"result":{"roots":[]}}\n')  # a new daemon's


def test_a_new_daemons_request_of_a_dead_ones_id_is_answered() -> None:
    """The new daemon numbers its requests anew: its first may have the id
    of one the dead daemon asked. The host's answer to it goes through (it
    was taken for the late answer to the dead one's, and dropped: the tool
    call that asked waited out its timeout)."""
    state = HostState()
    asked = b'{"jsonrpc":"2.0","id":"mcpbroker:s:1","method":"sampling/createMessage"}\n'
    state.down(asked)
    state.gap_errors()
    assert state.down(asked)  # (the new daemon's)
    assert state.up(b'{"jsonrpc":"2.0","id":"mcpbroker:s:1","result":{}}\n')


def test_an_initialize_in_flight_at_a_gap_is_the_hosts_to_send_again() -> None:
    """The host is told to try again: its retry goes to the new daemon (the
    shim replayed it, so the retry was refused as a second initialize, and
    the host never had an answer)."""
    state = HostState()
    state.up(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}\n')
    (error,) = state.gap_errors().splitlines()
    assert json.loads(error)["id"] == 0
    assert state.replay() == (None, b"")


def test_only_the_lines_the_daemon_took_are_replayed() -> None:
    """A malformed ``initialize`` or ``logging/setLevel`` the daemon answered
    with a parse error (id null) is not the session's: replaying it ended the
    shim (a JSONDecodeError), and an unanswered first ``initialize`` made the
    shim forget the one the daemon took, so the restored session refused
    every call."""
    state = HostState()
    bad_init = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"a":1}}}\n'
    init = b'{"jsonrpc":"2.0","id":5,"method":"initialize","params":{"a":2}}\n'
    bad_level = b'{"jsonrpc":"2.0","id":6,"method":"logging/setLevel","params":{"level":"x"}}}\n'
    refused = b'{"jsonrpc":"2.0","id":7,"method":"logging/setLevel","params":{"level":"y"}}\n'
    parse_error = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}\n'
    state.up(bad_init)
    state.down(parse_error)
    state.up(init)
    state.down(b'{"jsonrpc":"2.0","id":5,"result":{"capabilities":{}}}\n')
    state.up(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    state.up(bad_level)
    state.down(parse_error)
    state.up(refused)
    state.down(b'{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"no"}}\n')
    state.gap_errors()
    first, rest = state.replay()
    assert first is not None and json.loads(first)["params"] == {"a": 2}
    assert [json.loads(line)["method"] for line in rest.splitlines()] == [
        "notifications/initialized"
    ]


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","method":"ping","id":7x}\n',
        b'{"jsonrpc":"2.0","method":"ping","id":1.5}\n',
        b'{"jsonrpc":"2.0","method":"ping","id":true}\n',
        b'{"jsonrpc":"2.0","id":007,"method":"ping"}\n',
        b'{"jsonrpc":"2.0","id":--7,"method":"ping"}\n',
        b'{"jsonrpc":"2.0","id":"\xff","method":"ping"}\n',
    ],
)
def test_a_gap_writes_the_host_only_json(line: bytes) -> None:
    """An id that is not a JSON string or integer gets no error at a gap (it
    was written as it came: a line that is not JSON, which the stdio
    transport forbids)."""
    state = HostState()
    state.up(line)
    state.up(b'{"jsonrpc":"2.0","id":2,"method":"ping"}\n')
    errors = state.gap_errors().splitlines()
    assert [json.loads(error)["id"] for error in errors] == [2]


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","method":"ping","id":"a\\q"}\n',  # (a bad escape)
        b'{"jsonrpc":"2.0","method":"ping","id":"\\ud800"}\n',  # (a lone surrogate)
        b'{"jsonrpc":"2.0","x":{"method":1},"y":' + b"[" * 100_000 + b"\n",
    ],
)
def test_a_line_the_shim_cannot_read_goes_on_untracked(line: bytes) -> None:
    """(For the daemon to answer with its error: it ended the shim.)"""
    assert scan(line) == (None, None)
    assert HostState().up(line)


def test_no_replay_before_the_host_initialized() -> None:
    assert HostState().replay() == (None, b"")


def test_after_a_reconnect_the_host_hears_of_the_lists_that_can_change() -> None:
    from cli.reconnect import list_changed

    answer = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": "mcpbroker-resume-1",
            "result": {"capabilities": {"tools": {"listChanged": True}, "prompts": {}}},
        }
    ).encode()
    notices = [json.loads(line) for line in list_changed(answer).splitlines()]
    assert notices == [{"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}]
    assert list_changed(b'{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"no"}}') == b""


@given(
    lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=6),
    cuts=st.lists(st.integers(1, 7), min_size=1, max_size=40),
)
def test_lines_come_out_whole_however_the_bytes_are_cut(
    lines: list[bytes], cuts: list[int]
) -> None:
    from cli.reconnect import _Lines

    seen: list[bytes] = []
    framer = _Lines(lambda line: seen.append(line) or not line.startswith(b"drop"))
    data = b"".join(line + b"\n" for line in [*lines, b"drop me"])
    out, i = b"", 0
    for n in cuts * (len(data) // len(cuts) + 1):
        if i >= len(data):
            break
        out += framer.feed(data[i : i + n])
        i += n
    assert seen == [line + b"\n" for line in [*lines, b"drop me"]]
    assert out == b"".join(line + b"\n" for line in lines)


def test_a_line_too_long_to_hold_passes_through_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    import cli.reconnect
    from cli.reconnect import _Lines

    monkeypatch.setattr(cli.reconnect, "LONG_LINE", 10)
    seen: list[bytes] = []
    framer = _Lines(lambda line: seen.append(line) or True)
    out = b"".join(framer.feed(piece) for piece in (b"x" * 8, b"y" * 8, b"z" * 8, b"!\nok\n"))
    assert out == b"x" * 8 + b"y" * 8 + b"z" * 8 + b"!\nok\n"
    assert seen == [b"ok\n"]  # (the long one went by unseen)


def test_the_rest_of_a_long_line_half_sent_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    import cli.reconnect
    from cli.reconnect import _Lines

    monkeypatch.setattr(cli.reconnect, "LONG_LINE", 10)
    seen: list[bytes] = []
    framer = _Lines(lambda line: seen.append(line) or True)
    assert framer.feed(b"x" * 12) == b"x" * 12  # (passing through)
    framer.skip_rest()  # the connection it went to is gone
    assert framer.feed(b"yyy") == b""
    assert framer.feed(b"yy\nnext\n") == b"next\n"
    assert seen == [b"next\n"]


def test_a_batchs_requests_in_flight_get_their_errors_at_a_gap() -> None:
    """(A 2025-03-26 host's batch was not tracked: lost at a gap, no error.)"""
    state = HostState()
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call"},
        {"jsonrpc": "2.0", "method": "notifications/x"},
        {"jsonrpc": "2.0", "id": "b", "method": "tools/call"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call"},
    ]
    assert state.up(json.dumps(batch).encode() + b"\n")
    answers = [{"jsonrpc": "2.0", "id": 3, "result": {}}]
    assert state.down(json.dumps(answers).encode() + b"\n")
    errors = [json.loads(line)["id"] for line in state.gap_errors().splitlines()]
    assert sorted(map(str, errors)) == ["1", "b"]


def test_the_daemons_stopping_notice_is_noted_and_never_reaches_the_host() -> None:
    import orjson

    from broker.hello import STOPPING_NOTICE

    state = HostState()
    assert not state.down(orjson.dumps(STOPPING_NOTICE) + b"\n")  # (as the daemon writes it)
    assert state.stopping
    other = HostState()
    assert other.down(b'{"mcpbroker":{"notice":"later"}}\n')  # (one it does not know: passed on)
    assert other.down(b'{"jsonrpc":"2.0","id":1,"result":{"mcpbroker":{}}}\n')
    assert not other.stopping


def test_a_stopping_daemon_holds_the_hosts_requests_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The resuming relay holds the host's requests once told, until the gap
    (the next daemon), or HOLD_TIMEOUT (the stopping daemon still serves it)."""
    import socket

    import cli.reconnect
    from cli.reconnect import HOLD_TIMEOUT, ResumingRelay

    ours, theirs = socket.socketpair()
    clock = [100.0]
    monkeypatch.setattr(cli.reconnect.time, "monotonic", lambda: clock[0])
    with ours, theirs:
        relay = ResumingRelay(ours, HostState(), "/nowhere", None, b"")
        assert relay._poll_timeout() is None and relay.held_until is None
        relay._from_daemon(b'{"mcpbroker":{"notice":"stopping"}}\n')
        assert relay.held_until is not None and relay.to_host == b""
        assert relay._poll_timeout() == HOLD_TIMEOUT * 1000
        clock[0] += HOLD_TIMEOUT - 1
        assert relay._poll_timeout() == pytest.approx(1000)
        clock[0] += 1
        assert relay._poll_timeout() is None  # (given up waiting: read stdin again)
        assert relay.held_until is None and not relay.state.stopping


def test_a_stopping_daemon_still_gets_the_hosts_answers_and_cancellations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """During a drain the host's answer to a server's sampling request was
    held with its new requests, for the next daemon, which never asked: the
    call waiting for it failed at shutdownTimeout. Answers, and cancellations
    of requests in flight, go to the stopping daemon; the rest is held, in
    order, and sent at HOLD_TIMEOUT (or to the next daemon). (Found by probing.)"""
    import socket

    import cli.reconnect
    from cli.reconnect import HOLD_TIMEOUT, ResumingRelay

    ours, theirs = socket.socketpair()
    clock = [100.0]
    monkeypatch.setattr(cli.reconnect.time, "monotonic", lambda: clock[0])
    call = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__sample"}}\n'
    other = b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"a__slow"}}\n'
    asked = b'{"jsonrpc":"2.0","id":"mcpbroker:a:1","method":"sampling/createMessage"}\n'
    answer = b'{"jsonrpc":"2.0","id":"mcpbroker:a:1","result":{"content":{}}}\n'
    cancel = b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}\n'
    new = b'{"jsonrpc":"2.0","id":3,"method":"tools/list"}\n'
    cancel_new = b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}\n'
    changed = b'{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}\n'
    with ours, theirs:
        relay = ResumingRelay(ours, HostState(), "/nowhere", None, b"")
        assert relay.up.feed(call + other) == call + other
        relay._from_daemon(asked)
        relay._from_daemon(b'{"mcpbroker":{"notice":"stopping"}}\n')
        assert relay.held_until is not None
        sent = relay.up.feed(new + answer + cancel_new + changed + cancel)
        assert sent == answer + cancel
        assert relay.held == [new, cancel_new, changed]
        assert not relay.state.daemon_pending and list(relay.state.pending) == [b"1"]
        clock[0] += HOLD_TIMEOUT
        assert relay._poll_timeout() is None  # (given up waiting: they go to this daemon)
        assert relay.held == [] and not relay.paused
        assert theirs.recv(4096) == new + cancel_new + changed
        assert relay.up.feed(new) == new  # (and nothing is held any more)


def test_what_was_held_during_a_drain_goes_to_the_next_daemon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The held lines, and a close of stdin after them, wait for the next daemon."""
    import socket

    import cli.reconnect
    from cli.reconnect import ResumingRelay

    old, old_daemon = socket.socketpair()
    ours, next_daemon = socket.socketpair()
    monkeypatch.setattr(cli.reconnect, "connect", lambda path: ours)
    monkeypatch.setattr(ResumingRelay, "_flush_to_host", lambda self: None)
    monkeypatch.setattr(cli.reconnect.os, "read", lambda fd, n: b"")  # (the host closed stdin)
    new = b'{"jsonrpc":"2.0","id":3,"method":"tools/list"}\n'
    with old, old_daemon, ours, next_daemon:
        relay = ResumingRelay(old, HostState(), "/nowhere", None, b"")
        relay._from_daemon(b'{"mcpbroker":{"notice":"stopping"}}\n')
        assert relay.up.feed(new + b'{"jsonrpc":"2.0","id":4') == b""
        relay._read_stdin()
        assert relay.paused and relay.stdin_open  # (not closed before they are sent)
        assert relay._daemon_closed() is None  # (the stopping daemon went: a gap)
        relay._gap()
        assert not relay.stdin_open and relay.held == []
        next_daemon.settimeout(5)
        got = b""
        while chunk := next_daemon.recv(4096):
            got += chunk
        assert got == new + b'{"jsonrpc":"2.0","id":4'
        assert old_daemon.recv(4096) == b""


def test_a_line_too_long_to_hold_begun_during_a_drain_waits_for_the_next_daemon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """During a drain a line over LONG_LINE went to the stopping daemon in
    pieces, ahead of the lines held before it, and was cut at the gap (its
    request lost, no answer). Now it waits in the host's pipe, stdin not
    read, and goes to the next daemon after them, whole. (Found by review.)"""
    import cli.reconnect
    from cli.reconnect import ResumingRelay

    monkeypatch.setattr(cli.reconnect, "LONG_LINE", 10)
    old, old_daemon = socket.socketpair()
    ours, next_daemon = socket.socketpair()
    monkeypatch.setattr(cli.reconnect, "connect", lambda path: ours)
    monkeypatch.setattr(ResumingRelay, "_flush_to_host", lambda self: None)
    new = b'{"jsonrpc":"2.0","id":3,"method":"tools/list"}\n'
    reads = [new, b"x" * 8, b"x" * 8, b"y\n"]
    monkeypatch.setattr(cli.reconnect.os, "read", lambda fd, n: reads.pop(0))
    with old, old_daemon, ours, next_daemon:
        relay = ResumingRelay(old, HostState(), "/nowhere", None, b"")
        relay._from_daemon(b'{"mcpbroker":{"notice":"stopping"}}\n')
        for _ in range(3):
            relay._read_stdin()
        assert relay.held == [new] and relay.paused  # (the long line waits)
        old_daemon.setblocking(False)
        with pytest.raises(BlockingIOError):
            old_daemon.recv(4096)  # (nothing went to the stopping daemon)
        relay._gap()
        assert not relay.paused
        relay._read_stdin()
        next_daemon.settimeout(5)
        got = b""
        while got.count(b"\n") < 2 and (chunk := next_daemon.recv(4096)):
            got += chunk
        assert got == new + b"x" * 16 + b"y\n"


def test_a_session_the_new_daemon_refuses_ends_the_shim(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reload removed the server of a host on `connect a`: the daemon closed
    the session, and the shim, reconnecting, was refused ("unknown server")
    but attached all the same: every call was refused from then on, also once
    `a` was back, and the host never saw its server end. Now the shim ends.
    (Found by probing.)"""
    import socket

    import cli.reconnect
    from cli.reconnect import ResumingRelay, SessionRefused

    old, old_daemon = socket.socketpair()
    ours, new_daemon = socket.socketpair()
    monkeypatch.setattr(cli.reconnect, "connect", lambda path: ours)
    monkeypatch.setattr(ResumingRelay, "_flush_to_host", lambda self: None)
    state = HostState()
    initialize = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}\n'
    state.up(initialize)
    state.down(b'{"jsonrpc":"2.0","id":0,"result":{"capabilities":{}}}\n')
    refusal = (
        b'{"jsonrpc":"2.0","id":"mcpbroker-resume-1","error":{"code":-32602,'
        b'"message":"mcpbroker: unknown server \'a\' (configured servers: b)",'
        b'"data":{"unknown":["a"],"retryable":false}}}\n'
    )
    new_daemon.sendall(refusal)
    with old, old_daemon, ours, new_daemon:
        relay = ResumingRelay(old, state, "/nowhere", None, b"")
        with pytest.raises(SessionRefused) as refused:  # (run() says it and exits 1)
            relay._gap()  # (the daemon closed the session)
        assert ours.fileno() == -1  # (closed)
    assert str(refused.value) == (
        "the daemon refused the session (mcpbroker: unknown server 'a' "
        "(configured servers: b)); ending it: the host sees this server end"
    )
    assert "reconnected" not in capsys.readouterr().err


INITIALIZE = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}\n'
STILL_STARTING = (
    b'{"jsonrpc":"2.0","id":"mcpbroker-resume-%d","error":{"code":-32000,'
    b'"message":"MCP server \'b\' is still starting","data":{"server":"b"}}}\n'
)


def _daemons(
    monkeypatch: pytest.MonkeyPatch, answers: list[bytes]
) -> tuple[list[socket.socket], list[socket.socket]]:
    """New daemons, one per connect, each answering the replayed initialize
    with its line of ``answers``: (the shim's ends, the daemons' ends)."""
    import cli.reconnect
    from cli.reconnect import ResumingRelay

    pairs = [socket.socketpair() for _ in answers]
    for (_ours, daemon), answer in zip(pairs, answers, strict=True):
        daemon.sendall(answer)
    left = [ours for ours, _daemon in pairs]
    monkeypatch.setattr(cli.reconnect, "connect", lambda path: left.pop(0))
    monkeypatch.setattr(cli.reconnect.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(ResumingRelay, "_flush_to_host", lambda self: None)
    return [ours for ours, _ in pairs], [daemon for _, daemon in pairs]


@pytest.mark.parametrize(
    "error",
    [
        STILL_STARTING,
        b'{"jsonrpc":"2.0","id":"mcpbroker-resume-%d","error":{"code":-32000,'
        b'"message":"MCP server \'b\' is not running (restarting)","data":{"server":"b"}}}\n',
    ],
    ids=["still-starting", "restarting"],
)
def test_a_new_daemon_whose_server_is_not_up_yet_is_retried_not_taken_for_a_refusal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: bytes
) -> None:
    """A new daemon answers the replayed initialize with an error while the
    server is still starting (at its 10 s settle bound: `npx -y`, JVM
    servers) or restarting: the shim took any error for "this server is no
    longer configured" and ended, so a daemon restart ended the host's
    server for good. Now only an error the daemon marks as for good
    (data.retryable false) ends it; this one is retried, and the session is
    restored once the server is up. (Found by review.)"""
    from cli.reconnect import ResumingRelay

    answer = b'{"jsonrpc":"2.0","id":"mcpbroker-resume-3","result":{"capabilities":{}}}\n'
    ours, daemons = _daemons(monkeypatch, [error % 1, error % 2, answer])
    state = HostState()
    state.up(INITIALIZE)
    state.down(b'{"jsonrpc":"2.0","id":0,"result":{"capabilities":{}}}\n')
    old, old_daemon = socket.socketpair()
    with old, old_daemon:
        relay = ResumingRelay(old, state, "/nowhere", None, b"")
        relay._gap()  # (the daemon restarted)
        assert relay.sock is ours[2]
    for sock in (*ours, *daemons):
        sock.close()
    said = capsys.readouterr().err.splitlines()
    assert said[-1] == "mcpbroker connect: reconnected", said
    assert "the new daemon did not take the session back (it answered initialize: " in said[1]
    assert not any("refused" in line for line in said), said


def test_a_server_that_never_comes_up_ends_the_shim_at_the_reconnect_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Retried up to RECONNECT_TIMEOUT, then the shim ends, saying why."""
    import cli.reconnect
    from cli.reconnect import ResumingRelay, SessionRefused

    ours, daemons = _daemons(monkeypatch, [STILL_STARTING % 1])
    monkeypatch.setattr(cli.reconnect, "RECONNECT_TIMEOUT", 0.0)
    state = HostState()
    state.up(INITIALIZE)
    state.down(b'{"jsonrpc":"2.0","id":0,"result":{"capabilities":{}}}\n')
    old, old_daemon = socket.socketpair()
    with old, old_daemon:
        relay = ResumingRelay(old, state, "/nowhere", None, b"")
        with pytest.raises(cli.reconnect.DaemonUnavailable) as gave_up:
            relay._gap()
    for sock in (*ours, *daemons):
        sock.close()
    assert not isinstance(gave_up.value, SessionRefused)
    assert str(gave_up.value) == (
        "the daemon did not take the session back within 0 s (it answered initialize: "
        "MCP server 'b' is still starting); giving up"
    )


def test_a_daemon_still_stopping_is_retried_with_one_line_to_the_hosts_log(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The old daemon, while it drains, says it is stopping at each retry:
    the shim wrote a line to the host's log per retry (more than 10 in 10 s)."""
    import socket

    import cli.reconnect
    from cli.reconnect import ResumingRelay

    refusals = [0]

    def resume(self: ResumingRelay, sock: socket.socket) -> None:
        refusals[0] += 1
        if refusals[0] <= 5:
            raise OSError("it is stopping")

    monkeypatch.setattr(ResumingRelay, "_resume", resume)
    monkeypatch.setattr(ResumingRelay, "_flush_to_host", lambda self: None)
    monkeypatch.setattr(cli.reconnect, "connect", lambda path: socket.socket())
    monkeypatch.setattr(cli.reconnect.time, "sleep", lambda seconds: None)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ResumingRelay(ours, HostState(), "/nowhere", None, b"")._gap()
    said = capsys.readouterr().err.splitlines()
    assert refusals[0] == 6
    assert said == [
        "mcpbroker connect: the daemon went away; reconnecting",
        "mcpbroker connect: the new daemon did not take the session back (it is stopping); "
        "retrying",
        "mcpbroker connect: reconnected",
    ]


@pytest.mark.parametrize("id", [b"--1", b"007", b"-", b"1-"])
def test_the_compact_scan_tracks_no_id_json_does_not_allow(id: bytes) -> None:
    """One rule for an integer id (_is_id), on the compact path too: it took
    '--1' and '007', which no parser reads, for ids. (Found by review.)"""
    method, tracked = scan(b'{"jsonrpc":"2.0","id":%s,"method":"ping"}\n' % id)
    assert method == b"ping" and tracked is None
    assert scan(b'{"jsonrpc":"2.0","id":-7,"method":"ping"}\n') == (b"ping", b"-7")
