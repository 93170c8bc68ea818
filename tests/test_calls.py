"""What each client request came to (broker/calls.py), through SessionProtocol:
counts by server, method and outcome, error codes, durations, audit records."""

from __future__ import annotations

from typing import Any

from broker import jsonrpc
from broker.calls import (
    CANCELLED,
    DURATION_BUCKETS,
    ERROR,
    OK,
    TIMEOUT,
    AuditRecord,
    CallStats,
    CallTracker,
    error_code,
)
from broker.catalog import Catalog, ServerEntry
from broker.session import Forward, SessionProtocol
from broker.states import ServerState
from broker.wire.envelope import split_answer


class Catalogs:
    def __init__(self) -> None:
        tools = ({"name": "read", "inputSchema": {}},)
        entry = ServerEntry("files", ServerState.READY, lists={"tools": tools})
        self.current = Catalog([entry])


def session(
    audit: bool = False, arguments: bool = False, version: str = "2025-06-18"
) -> tuple[SessionProtocol, CallStats]:
    protocol = SessionProtocol(("files",), Catalogs())
    stats = CallStats()
    protocol.calls = CallTracker(stats, audit=audit, arguments=arguments)
    reply, _ = protocol.receive(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        },
        settled=True,
    )
    write(protocol, reply.message)  # type: ignore[union-attr]
    return protocol, stats


def call(id: Any, tool: str = "files__read", **arguments: Any) -> dict[str, Any]:
    params = {"name": tool, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}


def write(protocol: SessionProtocol, *messages: Any) -> list[Any]:
    out: list[Any] = []
    protocol.take_outgoing(list(messages), out)
    return out


def test_an_answered_call_is_counted_by_server_method_and_outcome_with_its_duration() -> None:
    protocol, stats = session()
    assert protocol.calls is not None
    protocol.calls.now = 10.0
    [forward] = protocol.receive(call(1))
    assert isinstance(forward, Forward) and forward.server == "files"
    protocol.calls.now = 10.3
    write(protocol, jsonrpc.result_response(1, {"content": []}))
    assert stats.requests == {("", "initialize", OK): 1, ("files", "tools/call", OK): 1}
    assert stats.errors == {}
    histogram = stats.durations["files"]
    assert sum(histogram.counts) == 1 and abs(histogram.sum - 0.3) < 1e-9
    # 0.3 s falls in the first bucket whose bound is at least 0.3 (le="0.5")
    assert histogram.counts[DURATION_BUCKETS.index(0.5)] == 1


def test_the_fast_path_counts_the_same_and_unparsed_answers_in_both_shapes() -> None:
    protocol, stats = session()
    forwards: dict[str, list[Any]] = {}
    frames = [jsonrpc.encode(call(n)) for n in (1, 2, 3)]
    assert protocol.take_forwards(frames, 0, forwards) == 3
    ok = split_answer(b'{"jsonrpc":"2.0","id":1,"result":{"content":[]}}')
    failed = split_answer(b'{"jsonrpc":"2.0","id":2,"error":{"code":-32603,"message":"x"}}')
    typescript = split_answer(b'{"error":{"code":-32602,"message":"no"},"jsonrpc":"2.0","id":3}')
    assert ok is not None and failed is not None and typescript is not None
    write(protocol, ok, failed, typescript)
    assert stats.requests[("files", "tools/call", OK)] == 1
    assert stats.requests[("files", "tools/call", ERROR)] == 2
    assert stats.errors == {("files", "tools/call", -32603): 1, ("files", "tools/call", -32602): 1}
    assert protocol.calls is not None and protocol.calls.pending == {}


def test_refusals_of_the_broker_are_counted_under_no_server() -> None:
    protocol, stats = session()
    for reply in protocol.receive(call(7, "files__nope")):
        write(protocol, reply.message)  # type: ignore[union-attr]
    for reply in protocol.receive({"jsonrpc": "2.0", "id": 8, "method": "made/up"}):
        write(protocol, reply.message)  # type: ignore[union-attr]
    assert stats.errors == {
        ("", "tools/call", jsonrpc.INVALID_PARAMS): 1,
        ("", "other", jsonrpc.METHOD_NOT_FOUND): 1,  # an unknown method: label bounded
    }


def test_cancelled_and_abandoned_calls_end_as_cancelled_and_late_answers_count_nothing() -> None:
    protocol, stats = session(audit=True)
    calls = protocol.calls
    assert calls is not None
    protocol.receive(call(1))
    protocol.receive(call(2))
    calls.now = 4.0
    protocol.receive(
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
    )
    write(protocol, jsonrpc.result_response(1, {}))  # late: already ended
    calls.closed()  # the session ended with 2 in flight
    assert stats.requests[("files", "tools/call", CANCELLED)] == 2
    assert sum(stats.durations["files"].counts) == 0  # a cancelled call has no answer to time
    assert [r.outcome for r in calls.records] == [CANCELLED, CANCELLED]


def test_a_duplicate_id_does_not_replace_the_request_in_flight() -> None:
    protocol, stats = session()
    assert protocol.calls is not None
    protocol.calls.now = 1.0
    protocol.receive(call(1))
    protocol.calls.now = 2.0
    [refusal] = protocol.receive(call(1))  # answered with id null: nothing to match
    write(protocol, refusal.message)  # type: ignore[union-attr]
    protocol.calls.now = 3.0
    write(protocol, jsonrpc.result_response(1, {}))
    assert stats.requests == {("", "initialize", OK): 1, ("files", "tools/call", OK): 1}
    assert stats.durations["files"].sum == 2.0  # timed from the first one's read


def test_audit_records_tool_calls_with_their_outcome_and_only_asked_for_arguments() -> None:
    for arguments in (False, True):
        protocol, _ = session(audit=True, arguments=arguments)
        calls = protocol.calls
        assert calls is not None
        calls.now = 1.0
        for n in (1, 2, 3):
            protocol.receive(call(n, path=f"/{n}"))
        protocol.receive(call(4, "files__nope"))
        protocol.receive({"jsonrpc": "2.0", "id": 5, "method": "ping"})
        calls.now = 1.5
        timeout = jsonrpc.error_response(2, jsonrpc.REQUEST_TIMEOUT, "timed out")
        failed = jsonrpc.error_response(3, jsonrpc.INTERNAL_ERROR, "broke")
        write(protocol, jsonrpc.result_response(1, {}), timeout, failed)
        given = (lambda n: {"path": f"/{n}"}) if arguments else (lambda n: None)
        assert calls.records == [
            AuditRecord("files", "read", 0.5, OK, None, given(1)),
            AuditRecord("files", "read", 0.5, TIMEOUT, jsonrpc.REQUEST_TIMEOUT, given(2)),
            AuditRecord("files", "read", 0.5, ERROR, jsonrpc.INTERNAL_ERROR, given(3)),
        ]
        calls.records.clear()
        for reply in protocol.receive(call(6, "files__nope")):
            write(protocol, reply.message)  # type: ignore[union-attr]
        [refused] = calls.records  # refused by the broker: no server, the client's name
        assert (refused.server, refused.tool, refused.code) == (
            "",
            "files__nope",
            jsonrpc.INVALID_PARAMS,
        )


def test_error_code_reads_only_error_answers() -> None:
    assert error_code(split_answer(b'{"jsonrpc":"2.0","id":1,"result":{"error":1}}')) is None
    assert error_code(split_answer(b'{"result":{},"jsonrpc":"2.0","id":1}')) is None
    assert error_code(split_answer(b'{"jsonrpc":"2.0","id":1,"error":{"code":-5}}')) == -5
    assert error_code({"jsonrpc": "2.0", "id": 1, "error": {"code": "x"}}) == 0
    assert error_code({"jsonrpc": "2.0", "id": 1, "result": {}}) is None


def test_a_batch_of_the_broker_s_own_answers_is_counted_and_forgotten() -> None:
    protocol, stats = session(version="2025-03-26")
    ping = {"jsonrpc": "2.0", "method": "ping"}
    replies = protocol.receive([{**ping, "id": 1}, {**ping, "id": 2}, call(3, "files__nope")])
    [batch] = write(protocol, *(reply.message for reply in replies))  # type: ignore[union-attr]
    assert len(batch) == 3
    assert stats.requests[("", "ping", OK)] == 2
    assert stats.errors == {("", "tools/call", jsonrpc.INVALID_PARAMS): 1}
    assert protocol.calls is not None and protocol.calls.pending == {}


def test_error_codes_counted_apart_are_bounded() -> None:
    protocol, stats = session()
    for n in range(1, 41):
        protocol.receive(call(n))
        write(protocol, jsonrpc.error_response(n, -n, "made up"))
    codes = {code for (_, _, code) in stats.errors}
    assert len(codes) == 33 and 0 in codes  # 32 apart, the rest under 0
    assert stats.errors[("files", "tools/call", 0)] == 8
