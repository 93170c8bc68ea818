"""The Streamable HTTP rules (broker/wire/http.py) and SSE encoding, without an event loop."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from broker import jsonrpc
from broker.related import Related
from broker.wire import http, sse
from broker.wire.envelope import split_answer
from broker.wire.websocket import Policy

LOCAL = [(b"host", b"127.0.0.1:8080")]
SERVERS = ("files", "git")


def check(method: str = "POST", path: str = "/mcp", headers: Any = (), **policy: Any) -> Any:
    return http.check_request(
        method, path, "127.0.0.1:8080", [*LOCAL, *headers], SERVERS, Policy(**policy)
    )


def test_a_plain_request_is_served_on_the_view_its_path_names() -> None:
    target = check()
    assert isinstance(target, http.Target)
    assert (target.view, target.transparent) == (None, False)
    one = check(path="/mcp/git")
    assert (one.view, one.transparent) == (("git",), True)


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        ({"headers": [(b"origin", b"https://evil.example")]}, 403),
        ({"headers": [(b"authorization", b"Bearer wrong")], "token": "right"}, 401),
        ({"token": "right"}, 401),
        ({"path": "/other"}, 404),
        ({"path": "/mcp/nope"}, 404),
        ({"method": "PUT"}, 405),
    ],
)
def test_refusals(kwargs: dict[str, Any], status: int) -> None:
    refused = check(**kwargs)
    assert isinstance(refused, http.Refuse)
    assert refused.status == status
    body = orjson.loads(refused.body())
    assert body["id"] is None and body["error"]["message"] == refused.reason


def test_a_foreign_host_is_refused_even_on_loopback() -> None:
    refused = http.check_request("GET", "/mcp", "rebound.example", [], SERVERS, Policy())
    assert isinstance(refused, http.Refuse) and refused.status == 403


def test_two_host_headers_are_400() -> None:
    """(RFC 9112 section 3.2; only the first was checked.)"""
    headers = [(b"host", b"localhost"), (b"Host", b"rebound.example")]
    refused = http.check_request("GET", "/mcp", "localhost", headers, SERVERS, Policy())
    assert isinstance(refused, http.Refuse) and refused.status == 400


def test_the_right_token_and_listed_origin_pass() -> None:
    headers = [(b"authorization", b"Bearer right"), (b"origin", b"http://localhost:6274")]
    target = check(
        headers=headers, token="right", allowed_origins=frozenset({"http://localhost:6274"})
    )
    assert isinstance(target, http.Target)


def test_no_version_header_is_2025_03_26_and_fine() -> None:
    assert isinstance(check(), http.Target)
    for version in ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"):
        assert isinstance(check(headers=[(b"mcp-protocol-version", version.encode())]), http.Target)


def test_a_version_that_is_not_legacy_is_left_to_the_modern_rules() -> None:
    for version in ("2026-07-28", "2099-01-01"):
        target = check(headers=[(b"mcp-protocol-version", version.encode())])
        assert isinstance(target, http.Target) and target.modern
    assert not check(headers=[(b"mcp-protocol-version", b"2025-11-25")]).modern


def test_session_ids() -> None:
    fresh = check()
    assert http.check_session(fresh, known=False, initialize=True) is None
    assert http.check_session(fresh, known=False).status == 400  # type: ignore[union-attr]
    named = check(headers=[(b"mcp-session-id", b"abc")])
    assert http.check_session(named, known=False).status == 404  # type: ignore[union-attr]
    assert http.check_session(named, known=True) is None


@pytest.mark.parametrize(
    ("accept", "mode"),
    [
        ("application/json, text/event-stream", True),
        ("text/event-stream", True),
        ("*/*", True),
        (None, True),
        ("application/json", False),
        ("application/json;q=0.9", False),
    ],
)
def test_sse_whenever_the_client_takes_it(accept: str | None, mode: bool) -> None:
    fields = {} if accept is None else {"accept": accept}
    assert http.choose_mode(fields) is mode


def test_initialize_is_answered_in_json_when_the_client_takes_it() -> None:
    assert http.choose_mode({"accept": "application/json, text/event-stream"}, True) is False
    assert http.choose_mode({"accept": "text/event-stream"}, True) is True


def test_neither_json_nor_sse_is_406() -> None:
    refused = http.choose_mode({"accept": "text/html"})
    assert isinstance(refused, http.Refuse) and refused.status == 406


def request(id: Any, method: str = "tools/call", **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


def body(message: Any) -> bytes:
    return orjson.dumps(message)


def test_read_post() -> None:
    post = http.read_post(body(request(1, _meta={"progressToken": "t"})), 1000, None)
    assert post == http.Post((1,), (), ("t",), False, False)
    init = http.read_post(body(request("i", "initialize")), 1000, None)
    assert isinstance(init, http.Post) and init.initialize
    note = http.read_post(body(jsonrpc.notification("notifications/initialized")), 1000, None)
    assert note == http.Post((), (), (), False, False)
    answer = http.read_post(body(jsonrpc.result_response("mcpbroker:s:1", {})), 1000, None)
    assert answer == http.Post((), ("mcpbroker:s:1",), (), False, False)


MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}


@pytest.mark.parametrize("header", [None, "2025-11-25"])
def test_read_post_refuses_a_modern_body_taken_for_legacy(header: str | None) -> None:
    """A 2026-07-28 request that came without its MCP-Protocol-Version (or with
    a legacy one) is told so (-32020), not to initialize first."""
    refused = http.read_post(body(request(7, _meta=MODERN_META)), 1000, None, header)
    assert isinstance(refused, http.Refuse)
    assert (refused.status, refused.code, refused.id) == (400, -32020, 7)
    assert "MCP-Protocol-Version header" in refused.reason and "'2026-07-28'" in refused.reason
    assert ("absent" in refused.reason) is (header is None)


@pytest.mark.parametrize("said", ["2025-06-18", 20260728, None])
def test_read_post_takes_a_legacy_meta_version(said: Any) -> None:
    """Only a version past the legacy ones contradicts a legacy request."""
    meta = {"io.modelcontextprotocol/protocolVersion": said}
    assert isinstance(http.read_post(body(request(7, _meta=meta)), 1000, None), http.Post)


@pytest.mark.parametrize(
    ("data", "version", "status", "code"),
    [
        (b"x" * 1001, None, 413, jsonrpc.INVALID_REQUEST),
        (b"{not json", None, 400, jsonrpc.PARSE_ERROR),
        (b'{"jsonrpc":"2.0"}', None, 400, jsonrpc.INVALID_REQUEST),
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', "2025-06-18", 400, None),
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', None, 400, None),
        (b"[]", "2025-03-26", 400, None),
        (b'[{"jsonrpc":"2.0","id":1,"method":"initialize"}]', "2025-03-26", 400, None),
        (b'[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":1,"method":"b"}]',
         "2025-03-26", 400, None),
        # An id longer than the broker keeps: no stream could be matched to
        # its id-less error (the POST got no answer at all).
        (b'{"jsonrpc":"2.0","id":"%s","method":"ping"}' % (b"x" * 257), "2025-11-25", 400,
         jsonrpc.INVALID_REQUEST),
        (b'[{"jsonrpc":"2.0","id":"%s","method":"ping"}]' % (b"x" * 257), "2025-03-26", 400,
         jsonrpc.INVALID_REQUEST),
    ],
)  # fmt: skip
def test_bad_bodies(data: bytes, version: str | None, status: int, code: int | None) -> None:
    refused = http.read_post(data, 1000, version)
    assert isinstance(refused, http.Refuse) and refused.status == status
    if code is not None:
        assert refused.code == code


def test_a_batch_on_2025_03_26() -> None:
    batch = [request(1), jsonrpc.notification("notifications/x"), request("2")]
    post = http.read_post(body(batch), 1000, "2025-03-26")
    assert post == http.Post((1, "2"), (), (), False, True)


def test_a_batchs_items_that_are_no_messages_are_left_to_the_session() -> None:
    """(JSON-RPC 2.0, section 6: each gets its error in the batch's answer,
    as the session writes it on every transport; the whole batch was
    refused, its good requests never run.) A batch of nothing else: 400."""
    long = {**request(3), "id": "x" * 257}
    post = http.read_post(body([request(7), 5, long]), 10_000, "2025-03-26")
    assert post == http.Post((7,), (), (), False, True)
    refused = http.read_post(body([5, long]), 10_000, "2025-03-26")
    assert isinstance(refused, http.Refuse) and refused.code == jsonrpc.INVALID_REQUEST


# -- streams -----------------------------------------------------------------


def opened(streams: http.HttpStreams, *ids: Any, sse: bool = True, tokens: Any = ()) -> int:
    number = streams.open(http.Post(ids, (), tokens, False, False), sse)
    assert isinstance(number, int)
    return number


def initialized(version: str = "2025-11-25") -> http.HttpStreams:
    streams = http.HttpStreams(1 << 20)
    number = streams.open(http.Post(("i",), (), (), True, False), False)
    assert isinstance(number, int)
    result = {"protocolVersion": version, "capabilities": {}}
    streams.add(jsonrpc.result_response("i", result), b"{}")
    assert streams.version == version
    assert streams.take(number) and streams.done(number)
    return streams


def add(streams: http.HttpStreams, message: Any) -> int | None:
    return streams.add(message, http.encode(message))


def datas(events: list[http.Event]) -> list[Any]:
    out = []
    for event in events:
        (line,) = [x for x in event.data.split(b"\n") if x.startswith(b"data: ")]
        out.append(orjson.loads(line[6:]))
    return out


def test_an_answer_goes_on_the_stream_of_its_request_and_ends_it() -> None:
    streams = initialized()
    one, two = opened(streams, 1), opened(streams, 2)
    assert add(streams, jsonrpc.result_response(2, "b")) == two
    assert add(streams, jsonrpc.result_response(1, "a")) == one
    assert datas(streams.take(one)) == [jsonrpc.result_response(1, "a")]
    assert streams.done(one) and not streams.done(http.STANDALONE)


def test_an_unparsed_answer_is_routed_by_its_id() -> None:
    streams = initialized()
    number = opened(streams, 7)
    answer = split_answer(b'{"jsonrpc":"2.0","id":1,"result":{}}')
    assert answer is not None
    answer.id = 7
    assert streams.add(answer, answer.encode()) == number
    (event,) = streams.take(number)
    assert event.data == b"id: %d-%d\ndata: " % (number, event.number) + answer.encode() + b"\n\n"


def test_progress_goes_with_its_request_until_it_is_answered() -> None:
    streams = initialized()
    number = opened(streams, 1, tokens=("tok",))
    progress = jsonrpc.notification("notifications/progress", {"progressToken": "tok"})
    assert add(streams, progress) == number
    assert add(streams, Related(progress, 1)) == number
    add(streams, jsonrpc.result_response(1, {}))
    assert add(streams, progress) == http.STANDALONE  # late: nowhere else to go


def test_related_server_requests_follow_their_cause_and_so_do_their_cancellations() -> None:
    streams = initialized()
    a, b = opened(streams, "a"), opened(streams, "b")
    sampling = request("mcpbroker:s:1", "sampling/createMessage")
    assert add(streams, Related(sampling, "b")) == b
    cancelled = jsonrpc.notification("notifications/cancelled", {"requestId": "mcpbroker:s:1"})
    assert add(streams, cancelled) == b
    # unrelated, with two streams open: the standalone stream; with one: that one
    assert add(streams, request("mcpbroker:s:2", "roots/list")) == http.STANDALONE
    add(streams, jsonrpc.result_response("b", {}))
    assert add(streams, request("mcpbroker:s:3", "roots/list")) == a
    log = jsonrpc.notification("notifications/message", {"level": "info"})
    assert add(streams, log) == a
    assert add(streams, jsonrpc.notification("notifications/tools/list_changed")) == 0


def test_a_json_stream_carries_only_its_answer() -> None:
    streams = initialized()
    number = opened(streams, 1, sse=False, tokens=("t",))
    progress = jsonrpc.notification("notifications/progress", {"progressToken": "t"})
    assert add(streams, progress) == http.STANDALONE
    assert add(streams, Related(request("x", "sampling/createMessage"), 1)) == http.STANDALONE
    add(streams, jsonrpc.result_response(1, "r"))
    (event,) = streams.take(number)
    assert orjson.loads(event.data) == jsonrpc.result_response(1, "r")  # no SSE framing


def json_first(streams: http.HttpStreams, id: Any, tokens: Any = ()) -> int:
    number = streams.open(http.Post((id,), (), tokens, False, False), True, json_first=True)
    assert isinstance(number, int)
    return number


def test_json_first_a_stream_answered_first_is_json() -> None:
    streams = initialized()
    number = json_first(streams, 1, tokens=("t",))
    assert add(streams, jsonrpc.result_response(1, "r")) == number
    stream = streams.streams[number]
    assert not stream.sse and stream.opening is None
    (event,) = streams.take(number)
    assert orjson.loads(event.data) == jsonrpc.result_response(1, "r")  # no SSE framing
    assert streams.done(number)
    progress = jsonrpc.notification("notifications/progress", {"progressToken": "t"})
    assert add(streams, progress) == http.STANDALONE  # late: nowhere else to go


@pytest.mark.parametrize("version", ["2025-11-25", "2025-06-18"])
def test_json_first_a_stream_turns_sse_at_what_comes_before_its_answer(version: str) -> None:
    streams = initialized(version)
    number = json_first(streams, 1, tokens=("t",))
    progress = jsonrpc.notification("notifications/progress", {"progressToken": "t"})
    assert add(streams, progress) == number
    stream = streams.streams[number]
    assert stream.sse and not stream.json_first
    # a 2025-11-25 client's stream opens with its priming event, numbered first
    opening = stream.opening
    assert (opening is not None) is (version == "2025-11-25")
    assert add(streams, jsonrpc.result_response(1, "r")) == number
    events = streams.take(number)
    assert datas(events) == [progress, jsonrpc.result_response(1, "r")]
    if opening is not None:
        primed = int(opening.split(b"id: ")[1].split(b"\n")[0].split(b"-")[1])
        assert primed < events[0].number < events[1].number
    assert streams.done(number)


def test_json_first_a_server_request_related_to_the_call_turns_it_sse() -> None:
    streams = initialized()
    number = json_first(streams, "c")
    sampling = request("mcpbroker:s:1", "sampling/createMessage")
    assert add(streams, Related(sampling, "c")) == number
    assert streams.streams[number].sse
    (event,) = streams.take(number)
    assert event.data.startswith(b"id: ")  # an SSE event, resumable


def test_json_first_a_quiet_stream_turned_sse_by_its_writer_carries_the_rest() -> None:
    streams = initialized()
    number = json_first(streams, 1)
    streams.as_sse(number)
    assert streams.streams[number].sse and streams.streams[number].opening is not None
    add(streams, jsonrpc.result_response(1, "r"))
    assert datas(streams.take(number)) == [jsonrpc.result_response(1, "r")]


def test_json_first_a_stream_whose_client_left_carries_nothing_more() -> None:
    streams = initialized()
    number = json_first(streams, 1, tokens=("t",))
    writer = object()
    streams.attach(number, writer)
    streams.detach(number, writer)
    progress = jsonrpc.notification("notifications/progress", {"progressToken": "t"})
    assert add(streams, progress) == http.STANDALONE
    assert add(streams, jsonrpc.result_response(1, "r")) is None
    assert number not in streams.streams


@pytest.mark.parametrize(
    ("accept", "batch", "first"),
    [
        ("application/json, text/event-stream", False, True),
        ("*/*", False, True),
        ("text/event-stream", False, False),
        ("application/json, text/event-stream", True, False),
    ],
)
def test_json_first_when_the_client_takes_both_and_it_is_no_batch(
    accept: str, batch: bool, first: bool
) -> None:
    post = http.Post((1,), (), (), False, batch)
    assert http.json_first({"accept": accept}, post) is first


def test_a_json_answer_whose_client_left_is_dropped() -> None:
    streams = initialized()
    number = opened(streams, 1, sse=False)
    writer = object()
    streams.attach(number, writer)
    streams.detach(number, writer)
    assert add(streams, jsonrpc.result_response(1, "r")) is None
    assert number not in streams.streams and streams.pending_count == 0


def test_a_batch_answer_goes_on_the_batch_stream() -> None:
    streams = initialized("2025-03-26")
    number = opened(streams, 1, 2)
    answers = [jsonrpc.result_response(1, "a"), jsonrpc.result_response(2, "b")]
    assert add(streams, answers) == number
    assert streams.take(number) and streams.done(number)


def test_a_cancelled_request_is_struck_off_its_stream_and_its_id_is_free() -> None:
    """No answer comes to a request the client cancelled: a JSON batch is
    answered with the rest, a stream with nothing else due ends, and the id
    is no longer in flight (it was, for the whole session)."""
    streams = initialized("2025-03-26")
    batch = opened(streams, 42, 43, sse=False)
    single = opened(streams, 50)
    add(streams, [jsonrpc.result_response(43, "b")])  # (the session answers the rest)
    assert not streams.done(batch)
    body = b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":42}}'
    post = http.read_post(body, 1 << 20, "2025-03-26")
    assert isinstance(post, http.Post) and post.cancelled == (42,)
    assert streams.answered(post) == [batch]
    assert streams.take(batch) and streams.done(batch)
    assert streams.answered(http.Post((), (), (), False, False, (50, 99))) == [single]
    assert streams.done(single)
    assert isinstance(streams.open(http.Post((50,), (), (), False, False), True), int)


def test_a_second_request_with_an_id_in_flight_is_refused() -> None:
    streams = initialized()
    opened(streams, 1)
    refused = streams.open(http.Post((1,), (), (), False, False), True)
    assert isinstance(refused, http.Refuse) and refused.status == 400


def test_resume_replays_what_came_after_the_last_event_seen() -> None:
    streams = initialized()
    number = opened(streams, 1, tokens=("t",))
    for n in range(4):
        add(streams, jsonrpc.notification("notifications/progress", {"progressToken": "t", "n": n}))
    written = streams.take(number)  # written out, then the connection broke
    add(streams, jsonrpc.result_response(1, "done"))
    resumed = streams.resume(written[1].id)
    assert not isinstance(resumed, http.Refuse)
    again, replay = resumed
    assert again == number
    assert [m["params"]["n"] for m in datas(replay)] == [2, 3]
    assert datas(streams.take(number)) == [jsonrpc.result_response(1, "done")]
    assert streams.done(number)


@pytest.mark.parametrize("last", ["junk", "99-1", "1-x", ""])
def test_resume_of_an_unknown_stream_is_refused(last: str) -> None:
    streams = initialized()
    assert isinstance(streams.resume(last), http.Refuse)


def test_the_replay_buffer_is_bounded_and_forgets_finished_streams() -> None:
    streams = initialized()
    first = opened(streams, 0)
    add(streams, jsonrpc.result_response(0, "x"))
    streams.take(first)
    assert first in streams.streams  # still held for a resume
    for n in range(1, http.REPLAY_EVENTS + 1):
        number = opened(streams, n)
        add(streams, jsonrpc.result_response(n, "x"))
        streams.take(number)
    assert first not in streams.streams
    assert isinstance(streams.resume(f"{first}-1"), http.Refuse)


def test_the_standalone_stream_drops_its_oldest_when_nobody_listens() -> None:
    streams = http.HttpStreams(1 << 20, max_pending=3)
    for n in range(5):
        add(streams, jsonrpc.notification("notifications/tools/list_changed", {"n": n}))
    assert streams.dropped == 2
    assert [m["params"]["n"] for m in datas(streams.take(http.STANDALONE))] == [2, 3, 4]


def test_a_session_that_does_not_read_its_answers_overflows() -> None:
    streams = http.HttpStreams(1 << 20, max_pending=2)
    opened(streams, 1, 2, 3)
    add(streams, jsonrpc.result_response(1, {}))
    add(streams, jsonrpc.result_response(2, {}))
    with pytest.raises(http.Overflow, match="client not reading"):
        add(streams, jsonrpc.result_response(3, {}))


def test_priming_only_for_clients_that_expect_it() -> None:
    assert initialized("2025-06-18").priming(0) is None
    priming = initialized("2025-11-25").priming(0)
    assert priming is not None and priming.startswith(b"id: 0-") and b"data: \n\n" in priming


def test_sse_events_keep_a_message_with_raw_newlines_whole() -> None:
    assert sse.event(b'{"a":1}', "1-2") == b'id: 1-2\ndata: {"a":1}\n\n'
    data = b'{\n"a": "b"\r\n}'
    lines = [line for line in sse.event(data).split(b"\n") if line]
    assert b"\n".join(line[6:] for line in lines) == b'{\n"a": "b"\n}'
    assert orjson.loads(b"\n".join(line[6:] for line in lines)) == {"a": "b"}


@pytest.mark.parametrize(
    ("value", "length"), [("12", 12), ("0", 0), (None, None), ("", None), ("²", None), ("-1", None)]
)
def test_content_length_is_a_number_or_none(value: str | None, length: int | None) -> None:
    fields = {} if value is None else {"content-length": value}
    assert http.content_length(fields) == length


def test_an_absolute_form_target_is_checked_by_its_authority() -> None:
    refused = http.check_request(
        "POST", "http://evil.example/mcp", "localhost:8080", LOCAL, SERVERS, Policy()
    )
    assert isinstance(refused, http.Refuse) and refused.status == 403
    served = http.check_request(
        "POST", "http://127.0.0.1:8080/mcp/git", "127.0.0.1:8080", LOCAL, SERVERS, Policy()
    )
    assert isinstance(served, http.Target) and served.view == ("git",)
