"""RequestMap: upstream ids, progress tokens and cancellation for shared servers."""

from __future__ import annotations

from typing import Any

import pytest

from broker.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, JsonRpcError, RequestId
from broker.requestmap import InFlight, RequestMap

A, B = "session-a", "session-b"


def request(id: RequestId, method: str = "tools/call", token: Any = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "echo"}
    if token is not None:
        params["_meta"] = {"progressToken": token, "other": "kept"}
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


def response(upstream_id: Any, result: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": upstream_id, "result": result or {}}


def progress(token: Any, value: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": token, "progress": value},
    }


def test_same_client_id_from_two_sessions() -> None:
    requests = RequestMap()
    from_a, from_b = request(1), request(1)
    up_a = requests.open(A, from_a)
    up_b = requests.open(B, from_b)
    assert up_a != up_b
    assert (from_a["id"], from_b["id"]) == (up_a, up_b)
    assert len(requests) == 2

    # Answered out of order: each goes back to its own session with id 1.
    answer_b = response(up_b, {"who": "b"})
    assert requests.close(answer_b) == InFlight(B, 1, "tools/call")
    assert answer_b == response(1, {"who": "b"})
    answer_a = response(up_a, {"who": "a"})
    assert requests.close(answer_a) == InFlight(A, 1, "tools/call")
    assert answer_a == response(1, {"who": "a"})
    assert len(requests) == 0


def test_string_and_int_ids_are_distinct_and_kept() -> None:
    requests = RequestMap()
    up_str = requests.open(A, request("1"))
    up_int = requests.open(A, request(1))
    answer_int, answer_str = response(up_int), response(up_str)
    requests.close(answer_int)
    requests.close(answer_str)
    assert answer_int["id"] == 1 and type(answer_int["id"]) is int
    assert answer_str["id"] == "1" and type(answer_str["id"]) is str


def test_upstream_ids_are_fresh_ints() -> None:
    requests = RequestMap()
    ids = [requests.open(A, request(f"r{n}")) for n in range(5)]
    assert all(type(i) is int for i in ids)
    assert len(set(ids)) == 5


def test_duplicate_in_flight_id_rejected() -> None:
    requests = RequestMap()
    requests.open(A, request(7))
    with pytest.raises(JsonRpcError) as info:
        requests.open(A, request(7))
    # id null: the one answer with id 7 belongs to the request in flight
    assert (info.value.code, info.value.id, info.value.data) == (INVALID_REQUEST, None, {"id": 7})
    assert len(requests) == 1


def test_id_reusable_once_answered() -> None:
    requests = RequestMap()
    requests.close(response(requests.open(A, request(7))))
    requests.open(A, request(7))
    assert requests.count(A) == 1


def test_unknown_or_bad_response_ids_are_dropped() -> None:
    requests = RequestMap()
    requests.open(A, request(1))
    for bad in (999, "1", True, None, 1.0):
        assert requests.close(response(bad)) is None
    assert len(requests) == 1


def test_progress_token_rewritten_and_restored() -> None:
    requests = RequestMap()
    sent = request(1, token="tok-a")
    upstream_id = requests.open(A, sent)
    meta = sent["params"]["_meta"]
    assert meta == {"progressToken": upstream_id, "other": "kept"}

    note = progress(upstream_id, 5)
    assert requests.progress(note) == InFlight(A, 1, "tools/call", "tok-a")
    assert note["params"] == {"progressToken": "tok-a", "progress": 5}


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("t" * 257, "a progressToken of 257 characters (the limit is 256)"),
        ("x" * 1_000_000, "a progressToken of 1000000 characters"),
        ({"big": "x" * 1000}, "must be a string or a number"),
        (["a"], "must be a string or a number"),
        (True, "must be a string or a number"),
    ],
)
def test_a_progress_token_too_long_or_of_no_tokens_type_is_refused(token: Any, why: str) -> None:
    requests = RequestMap()
    with pytest.raises(JsonRpcError) as refused:
        requests.open(A, request("c", token=token))
    assert refused.value.code == INVALID_PARAMS and refused.value.id == "c"
    assert why in refused.value.message
    assert len(requests) == 0  # nothing kept
    for fine in ("t" * 256, 7, 2.5):
        requests.open(A, request(f"ok-{fine!r}", token=fine))
    assert len(requests) == 3


def test_a_refused_token_leaves_no_cycle_holding_the_request() -> None:
    # A refusal the caller has answered leaves nothing that holds the
    # request: not the frame that raised it (the daemon runs the garbage
    # collector rarely, and 200 refused 1 MB tokens held 200 MB).
    import gc
    import sys
    import types

    requests = RequestMap()
    sent = request("c", token="x" * 300)
    gc.disable()
    try:
        try:
            requests.open(A, sent)
        except JsonRpcError as refused:
            assert refused.code == INVALID_PARAMS
        here = sys._getframe()
        frames = [
            r for r in gc.get_referrers(sent) if isinstance(r, types.FrameType) and r is not here
        ]
        assert frames == []
    finally:
        gc.enable()


def test_progress_tokens_of_two_sessions_stay_apart() -> None:
    requests = RequestMap()
    up_a = requests.open(A, request(1, token=1))
    up_b = requests.open(B, request(1, token=1))
    note = progress(up_b)
    assert requests.progress(note).session == B  # type: ignore[union-attr]
    assert note["params"]["progressToken"] == 1
    assert requests.progress(progress(up_a)).session == A  # type: ignore[union-attr]


def test_progress_after_response_is_dropped() -> None:
    requests = RequestMap()
    upstream_id = requests.open(A, request(1, token="t"))
    requests.close(response(upstream_id))
    assert requests.progress(progress(upstream_id)) is None


@pytest.mark.parametrize(
    "note",
    [
        progress("1"),
        progress(True),
        progress(12345),
        {"jsonrpc": "2.0", "method": "notifications/progress"},
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": []},
    ],
)
def test_progress_for_nothing_is_dropped(note: dict[str, Any]) -> None:
    requests = RequestMap()
    requests.open(A, request(1, token="t"))
    assert requests.progress(note) is None


def test_progress_for_request_without_token_is_dropped() -> None:
    requests = RequestMap()
    upstream_id = requests.open(A, request(1))
    assert requests.progress(progress(upstream_id)) is None


def test_cancel_returns_upstream_id_and_drops_late_response() -> None:
    requests = RequestMap()
    upstream_id = requests.open(A, request("c"))
    assert requests.cancel(B, "c") is None  # another session's id space
    assert requests.cancel(A, "c") == upstream_id
    assert requests.close(response(upstream_id)) is None
    assert requests.cancel(A, "c") is None
    assert len(requests) == 0


@pytest.mark.parametrize("client_id", [None, 1.5, [1], "1"])
def test_cancel_unknown_or_bad_id(client_id: Any) -> None:
    requests = RequestMap()
    requests.open(A, request(1))
    assert requests.cancel(A, client_id) is None
    assert len(requests) == 1


def test_drop_session() -> None:
    requests = RequestMap()
    up_a1 = requests.open(A, request(1))
    up_b = requests.open(B, request(1))
    up_a2 = requests.open(A, request(2))
    assert sorted(requests.drop_session(A)) == [up_a1, up_a2]
    assert requests.count(A) == 0
    assert requests.count(B) == 1
    assert requests.close(response(up_a1)) is None
    assert requests.close(response(up_b)) is not None
    assert requests.drop_session(A) == []


def test_drain() -> None:
    requests = RequestMap()
    requests.open(A, request(1))
    requests.open(B, request("x", method="resources/read"))
    drained = requests.drain()
    assert sorted((entry.session, entry.method) for entry in drained) == [
        (A, "tools/call"),
        (B, "resources/read"),
    ]
    assert len(requests) == 0
    assert requests.drain() == []
    requests.open(A, request(1))  # ids are free again


def test_sole_requests_name_the_one_request_of_each_session_that_has_one() -> None:
    """What a server's request or log message belongs to, when it can be told
    (broker/related.py): a session's only request at the server."""
    requests = RequestMap()
    requests.open(A, request("a1"))
    held = requests.open(B, request("b1"))
    requests.open(B, request("b2"))
    assert requests.sole_requests() == {A: "a1"}  # B has two: unknown
    assert requests.sole_requests(skip={held}) == {A: "a1", B: "b2"}  # one is held, not sent
