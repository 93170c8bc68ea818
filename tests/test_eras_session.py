"""A modern client's session, sans-I/O (broker/eras/session.py), h11 style."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from broker.calls import CallStats, CallTracker
from broker.catalog import Catalog, ServerEntry
from broker.eras.session import ModernSessionProtocol, become_modern
from broker.eras.tokens import OWN_PREFIX
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    LOG_LEVEL_KEY,
    PROTOCOL_VERSION_KEY,
    SERVER_INFO_KEY,
    SUBSCRIPTION_ID_KEY,
    SUPPORTED_VERSIONS,
)
from broker.lifecycle import BROKER_CLIENT_CAPABILITIES, ServerIdentity
from broker.session import (
    Attach,
    CancelUpstream,
    Defer,
    Forward,
    Reply,
    RespondUpstream,
    SessionProtocol,
    SetLogLevel,
)
from broker.states import ServerState, SessionState
from broker.wire.envelope import Answer, split_answer
from tests.test_session_protocol import FILES, GITHUB, LOADING, Catalogs, server

KEY = b"k" * 32
ELICIT = {"mode": "form", "message": "Colour?", "requestedSchema": {"type": "object"}}


def meta(capabilities: Any = None, **more: Any) -> dict[str, Any]:
    return {
        PROTOCOL_VERSION_KEY: "2026-07-28",
        CLIENT_CAPABILITIES_KEY: {} if capabilities is None else capabilities,
        **more,
    }


def request(id: Any, method: str, _meta: Any = None, **params: Any) -> dict[str, Any]:
    params["_meta"] = meta() if _meta is None else _meta
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


def session(*entries: Any, view: tuple[str, ...] = ("files", "github"),
            transparent: bool = False) -> ModernSessionProtocol:  # fmt: skip
    legacy = SessionProtocol(view, Catalogs(Catalog(entries or (FILES, GITHUB))),
                             transparent=transparent)  # fmt: skip
    return become_modern(legacy, KEY)


def opened(proto: ModernSessionProtocol) -> ModernSessionProtocol:
    """A session past its first request (attached)."""
    proto.receive(request(0, "tools/list"))
    return proto


def written(proto: ModernSessionProtocol, *messages: Any) -> list[Any]:
    """What the client reads (an answer passed on unparsed, parsed here)."""
    out: list[Any] = []
    proto.take_outgoing(list(messages), out)
    return [message.read() if isinstance(message, Answer) else message for message in out]


def test_a_modern_session_has_no_handshake_and_attaches_on_its_first_request() -> None:
    proto = session()
    assert proto.state is SessionState.OPERATING
    assert proto.protocol_version == "2026-07-28"
    first = proto.receive(request(1, "server/discover"))
    assert first[0] == Attach(("files", "github"), BROKER_CLIENT_CAPABILITIES)
    assert isinstance(first[1], Reply)
    assert [type(a) for a in proto.receive(request(2, "server/discover"))] == [Reply]


def test_server_discover_is_answered_by_the_broker() -> None:
    (reply,) = opened(session()).receive(request(1, "server/discover"))
    assert isinstance(reply, Reply) and isinstance(reply.message, dict)
    result = reply.message["result"]
    assert reply.message["id"] == 1
    assert result["supportedVersions"] == list(SUPPORTED_VERSIONS)
    assert result["_meta"][SERVER_INFO_KEY]["name"] == "mcpbroker"
    assert result["resultType"] == "complete"


def test_discover_waits_for_the_view_to_settle() -> None:
    proto = opened(session(FILES, server("github", LOADING)))
    discover = request(1, "server/discover")
    assert proto.receive(discover) == [Defer(discover)]
    assert isinstance(proto.receive(discover, settled=True)[0], Reply)


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (request(1, "tools/list", _meta={"progressToken": 1}), -32602),
        (request(1, "tools/list", _meta={PROTOCOL_VERSION_KEY: "2026-07-28"}), -32602),
        (request(1, "tools/list", _meta=meta(**{PROTOCOL_VERSION_KEY: "1999-01-01"})), -32022),
        (request(1, "tools/call", _meta=meta(**{LOG_LEVEL_KEY: "chatty"}), name="x"), -32602),
        (request(1, "ping"), -32601),
        (request(1, "logging/setLevel", level="info"), -32601),
        (request(1, "resources/subscribe", uri="file:///README.md"), -32601),
        (request(1, "tasks/get", taskId="x"), -32601),
        (request(1, "sampling/createMessage"), -32601),
    ],
)
def test_what_the_modern_era_refuses(message: dict[str, Any], code: int) -> None:
    (reply,) = opened(session()).receive(message)
    assert isinstance(reply, Reply) and isinstance(reply.message, dict)
    assert reply.message["id"] == 1 and reply.message["error"]["code"] == code


def test_initialize_in_a_modern_session_names_the_modern_version() -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}}}  # fmt: skip
    (reply,) = opened(session()).receive(init)
    assert isinstance(reply, Reply) and isinstance(reply.message, dict)
    assert reply.message["error"]["code"] == -32022
    assert reply.message["error"]["data"] == {"supported": ["2026-07-28"],
                                              "requested": "2025-06-18"}  # fmt: skip


def test_lists_carry_result_type_and_caching_hints() -> None:
    (reply,) = opened(session()).receive(request(1, "tools/list"))
    assert isinstance(reply, Reply) and isinstance(reply.message, dict)
    result = reply.message["result"]
    assert [tool["name"] for tool in result["tools"]] == [
        "files__read", "files__write", "github__search"]  # fmt: skip
    assert (result["resultType"], result["ttlMs"], result["cacheScope"]) == (
        "complete", 0, "private")  # fmt: skip


def test_a_call_goes_to_its_server_with_its_meta_and_its_answer_comes_back_modern(
) -> None:  # fmt: skip
    """The modern keys go along (a modern server reads the client's own
    capabilities; the Upstream strips them for a legacy server:
    tests/test_eras_upstream.py)."""
    proto = opened(session())
    call = request("c1", "tools/call", _meta=meta(progressToken=5), name="files__read",
                   arguments={"path": "x"})  # fmt: skip
    assert proto.receive(call) == [
        Forward("files", {"jsonrpc": "2.0", "id": "c1", "method": "tools/call",
                          "params": {"name": "read", "arguments": {"path": "x"},
                                     "_meta": meta(progressToken=5)}})
    ]  # fmt: skip
    assert proto.inflight == {"c1"}
    progress = {"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": 5, "progress": 1}}  # fmt: skip
    answer = split_answer(b'{"jsonrpc":"2.0","id":1,"result":{"content":[]}}')
    assert answer is not None
    answer.id = "c1"
    assert written(proto, progress, answer) == [
        progress,
        {"jsonrpc": "2.0", "id": "c1", "result": {"content": [], "resultType": "complete"}},
    ]
    assert proto.inflight == set() and proto.open_calls == {}


def test_a_modern_servers_answer_reaches_the_client_as_the_server_wrote_it() -> None:
    """A 2026-07-28 server's answer (the Upstream marks it, ``Answer.modern``)
    is in the era's terms already: passed on unparsed and unstamped. The same
    line from a legacy server is read (it names a key the broker would put),
    its own keys kept."""
    hints = {"ttlMs": 60000, "cacheScope": "public"}
    for modern in (True, False):
        proto = opened(session())
        call = request("r1", "resources/read", uri="file:///x")
        assert [type(a) for a in proto.receive(call)] == [Forward]
        line = (b'{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","contents":[],'
                b'"ttlMs":60000,"cacheScope":"public"}}')  # fmt: skip
        answer = split_answer(line)
        assert answer is not None
        answer.id, answer.modern = "r1", modern
        out: list[Any] = []
        proto.take_outgoing([answer], out)
        if modern:
            assert out == [answer] and answer.encode() == line.replace(b":1,", b':"r1",')
        else:  # (read, the server's own keys kept)
            assert out[0]["result"] == {"resultType": "complete", "contents": [], **hints}
        assert proto.inflight == set() and proto.open_calls == {}


HINTS = {"ttlMs": 0, "cacheScope": "private"}


@pytest.mark.parametrize("read", [False, True])
def test_a_servers_answer_is_completed_where_it_lacks_the_eras_keys(read: bool) -> None:
    """The schema has a 2026-07-28 server include ``resultType`` (and on a read
    the caching hints): an answer that does reaches the client as the server
    wrote it; one that does not is completed, as a legacy server's always is
    (the official Python SDK's client refuses a result without
    ``resultType``), keeping what the server said. Unparsed or, while a call
    waits for its client's retry, read (docs/eras.md)."""
    for method, params, result, completed in (
        ("tools/call", {"name": "files__read"}, b'{"content":[]}',
         {"resultType": "complete", "content": []}),
        ("tools/call", {"name": "files__read"}, b'{"content":[],"resultType":"complete"}',
         {"resultType": "complete", "content": []}),
        ("resources/read", {"uri": "file:///x"}, b'{"contents":[]}',
         {"resultType": "complete", "contents": [], **HINTS}),
        ("resources/read", {"uri": "file:///x"}, b'{"resultType":"complete","contents":[]}',
         {"resultType": "complete", "contents": [], **HINTS}),
        ("resources/read", {"uri": "file:///x"},
         b'{"contents":[],"ttlMs":5,"cacheScope":"public","resultType":"complete"}',
         {"resultType": "complete", "contents": [], "ttlMs": 5, "cacheScope": "public"}),
    ):  # fmt: skip
        for modern in (True, False):
            proto = opened(session())
            if read:  # (a call at github parked: every answer is read)
                proto.receive(request("q", "tools/call", _meta=meta({"elicitation": {}}),
                                      name="github__search"))  # fmt: skip
                assert len(written(proto, question("mcpbroker:github:1"))) == 1
                assert proto.questions.parked
            assert [type(a) for a in proto.receive(request("r2", method, **params))] == [Forward]
            bare = split_answer(b'{"jsonrpc":"2.0","id":2,"result":%s}' % result)
            assert bare is not None
            bare.id, bare.modern, bare.method = "r2", modern, method
            got = written(proto, bare)
            assert got == [{"jsonrpc": "2.0", "id": "r2", "result": completed}], (result, modern)
            assert "r2" not in proto.inflight and "r2" not in proto.open_calls


def test_log_messages_reach_the_client_only_while_a_request_asked_for_them() -> None:
    proto = opened(session())
    log = {"jsonrpc": "2.0", "method": "notifications/message",
           "params": {"level": "warning", "data": "careful"}}  # fmt: skip
    assert written(proto, log) == []
    call = request(1, "tools/call", _meta=meta(**{LOG_LEVEL_KEY: "info"}), name="files__read")
    assert proto.receive(call)[1:] == [SetLogLevel("info")]
    debug = {**log, "params": {"level": "debug", "data": "noise"}}
    assert written(proto, log, debug) == [log]
    written(proto, {"jsonrpc": "2.0", "id": 1, "result": {"content": []}})
    assert written(proto, log) == []


def test_the_servers_hear_a_level_lowered_when_the_request_that_asked_ends() -> None:
    """(It was never lowered: a server kept logging at the most verbose
    level a request of the session had ever asked for.)"""
    proto = opened(session())
    for id, level in ((1, "debug"), (2, "warning")):
        proto.receive(request(id, "tools/call", _meta=meta(**{LOG_LEVEL_KEY: level}),
                              name="files__read"))  # fmt: skip
    assert proto.take_level_change() == (False, "debug")
    written(proto, {"jsonrpc": "2.0", "id": 1, "result": {"content": []}})
    assert proto.bridge_pending() and proto.take_level_change() == (True, "warning")
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
    proto.receive(cancel)
    assert proto.take_level_change() == (True, None)
    assert not proto.bridge_pending()


def test_list_changed_reaches_only_the_streams_that_asked() -> None:
    proto = opened(session())
    changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    assert written(proto, changed) == []  # nobody listens
    ack, *subscribe = proto.receive(
        request(
            "L",
            "subscriptions/listen",
            notifications={"toolsListChanged": True, "resourceSubscriptions": ["zz://x"]},
        )
    )
    assert ack == Reply({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                         "params": {"_meta": {SUBSCRIPTION_ID_KEY: "L"},
                                    "notifications": {"toolsListChanged": True}}})  # fmt: skip
    assert subscribe == []  # zz://x: no server of the view has it
    assert written(proto, changed) == [{**changed, "params": {"_meta": {SUBSCRIPTION_ID_KEY: "L"}}}]
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "L"}}
    assert proto.receive(cancel) == []  # the broker's own stream: nothing upstream
    assert written(proto, changed) == []


# -- a legacy server's question, as input_required --------------------------------


def question(id: str = "mcpbroker:files:1", method: str = "elicitation/create") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": ELICIT}


def test_a_servers_question_becomes_input_required_and_the_retry_takes_the_call_over() -> None:
    proto = opened(session())
    proto.receive(request(1, "tools/call", _meta=meta({"elicitation": {}}), name="files__read"))
    (asked,) = written(proto, question())
    state = asked["result"]["requestState"]
    assert asked == {"jsonrpc": "2.0", "id": 1, "result": {
        "resultType": "input_required",
        "inputRequests": {"elicitation-1": {"method": "elicitation/create", "params": ELICIT}},
        "requestState": state,
    }}  # fmt: skip
    answer = {"action": "accept", "content": {"colour": "blue"}}
    retry = request(2, "tools/call", _meta=meta({"elicitation": {}}), name="files__read",
                    inputResponses={"elicitation-1": answer}, requestState=state)  # fmt: skip
    assert proto.receive(retry) == [
        RespondUpstream("files", {"jsonrpc": "2.0", "id": "mcpbroker:files:1", "result": answer})
    ]
    assert 2 in proto.inflight
    # The server's answer to the call (still its first id upstream) goes to the retry.
    assert written(proto, {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}) == [
        {"jsonrpc": "2.0", "id": 2, "result": {"content": [], "resultType": "complete"}}
    ]
    assert proto.inflight == set() and proto.aliases == {} and proto.open_calls == {}


def test_a_question_the_call_did_not_declare_goes_back_to_the_server() -> None:
    proto = opened(session())
    proto.receive(request(1, "tools/call", _meta=meta({"sampling": {}}), name="files__read"))
    assert written(proto, question()) == []
    ((server, error),) = proto.take_upstream_answers()
    assert server == "files" and error["id"] == "mcpbroker:files:1"
    assert "'elicitation'" in error["error"]["message"]
    assert proto.take_upstream_answers() == []


def test_a_question_whose_params_are_not_an_object_goes_back_to_the_server() -> None:
    # (Found by test_a_modern_session_answers_anything: it raised, which failed
    # the session.)
    proto = opened(session())
    proto.receive(request(1, "tools/call", _meta=meta({"elicitation": {}}), name="files__read"))
    assert written(proto, {**question(), "params": 1}) == []
    ((server, error),) = proto.take_upstream_answers()
    assert server == "files" and error["id"] == "mcpbroker:files:1"
    assert error["error"]["code"] == -32602
    assert proto.state is SessionState.OPERATING


def test_a_question_with_two_calls_at_that_server_is_not_guessed() -> None:
    proto = opened(session())
    for id in (1, 2):
        proto.receive(request(id, "tools/call", _meta=meta({"elicitation": {}}),
                              name="files__read"))  # fmt: skip
    assert written(proto, question()) == []
    ((server, error),) = proto.take_upstream_answers()
    assert server == "files" and error["error"]["code"] == -32603


def test_another_sessions_request_state_is_refused() -> None:
    one, two = opened(session()), opened(session())
    one.receive(request(1, "tools/call", _meta=meta({"elicitation": {}}), name="files__read"))
    (asked,) = written(one, question())
    stolen = request(5, "tools/call", name="files__read", inputResponses={},
                     requestState=asked["result"]["requestState"])  # fmt: skip
    (reply,) = two.receive(stolen)
    assert isinstance(reply, Reply) and isinstance(reply.message, dict)
    assert reply.message["error"]["code"] == -32602


def test_cancelling_a_retry_cancels_the_call_upstream_by_its_first_id() -> None:
    proto = opened(session())
    proto.receive(request(1, "tools/call", _meta=meta({"elicitation": {}}), name="files__read"))
    (asked,) = written(proto, question())
    proto.receive(
        request(
            2,
            "tools/call",
            name="files__read",
            _meta=meta({"elicitation": {}}),
            inputResponses={},
            requestState=asked["result"]["requestState"],
        )
    )
    # Asked again (no answer given); the client gives up on its retry instead.
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled",
              "params": {"requestId": 2, "reason": "user"}}  # fmt: skip
    assert proto.receive(cancel) == [CancelUpstream({"requestId": 1, "reason": "user"})]
    ((server, error),) = proto.take_upstream_answers()
    assert server == "files" and error["id"] == "mcpbroker:files:1"
    assert proto.inflight == set()


def test_a_malformed_retry_is_refused_and_leaves_its_state_unspent() -> None:
    proto = opened(session())
    proto.receive(request(1, "tools/call", _meta=meta({"elicitation": {}}), name="files__read"))
    (asked,) = written(proto, question())
    state = asked["result"]["requestState"]
    for id, responses in ((2, {"elicitation-1": "just a string"}), (3, {"elicitation-1": None}),
                          (4, ["a list"])):  # fmt: skip
        (reply,) = proto.receive(request(id, "tools/call", name="files__read",
                                         _meta=meta({"elicitation": {}}),
                                         inputResponses=responses, requestState=state))  # fmt: skip
        assert isinstance(reply, Reply) and isinstance(reply.message, dict)
        assert reply.message["id"] == id and reply.message["error"]["code"] == -32602
        assert "inputResponses" in reply.message["error"]["message"]
    assert proto.take_upstream_answers() == []  # (nothing reached the server)
    answer = {"action": "accept", "content": {}}
    assert proto.receive(request(5, "tools/call", name="files__read",
                                 _meta=meta({"elicitation": {}}),
                                 inputResponses={"elicitation-1": answer},
                                 requestState=state)) == [
        RespondUpstream("files", {"jsonrpc": "2.0", "id": "mcpbroker:files:1", "result": answer})
    ]  # fmt: skip


@pytest.mark.parametrize("state", [5, ["x"], {"a": 1}])
def test_a_request_state_that_is_not_a_string_is_refused(state: Any) -> None:
    # (The spec's requestState is an opaque string; before, one at a legacy
    # server ran as a new call, the modern-only params passed on.)
    proto = opened(session())
    call = request(1, "tools/call", _meta=meta({}), name="files__read", requestState=state,
                   inputResponses={})  # fmt: skip
    assert proto.forward_fast(call) is None
    (reply,) = proto.receive(call)
    assert isinstance(reply, Reply) and isinstance(reply.message, dict)
    assert reply.message["id"] == 1 and reply.message["error"]["code"] == -32602
    assert proto.inflight == set()


def test_a_retry_that_takes_the_call_over_brings_its_own_progress_token_and_log_level() -> None:
    proto = opened(session())
    first = meta({"elicitation": {}}, progressToken="P1", **{LOG_LEVEL_KEY: "debug"})
    proto.receive(request(1, "tools/call", _meta=first, name="files__read"))
    (asked,) = written(proto, question())
    answer = {"action": "accept", "content": {}}
    again = meta({"elicitation": {}}, progressToken="P2", **{LOG_LEVEL_KEY: "error"})
    proto.receive(request(2, "tools/call", name="files__read", _meta=again,
                          inputResponses={"elicitation-1": answer},
                          requestState=asked["result"]["requestState"]))  # fmt: skip
    assert proto.take_level_change() == (True, "error")  # (the retry's, the first's closed)
    progress = {"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": "P1", "progress": 1}}  # fmt: skip
    info = {"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "info", "data": "x"}}  # fmt: skip
    assert written(proto, progress, info) == [
        {**progress, "params": {"progressToken": "P2", "progress": 1}}
    ]
    assert written(proto, {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}) == [
        {"jsonrpc": "2.0", "id": 2, "result": {"content": [], "resultType": "complete"}}
    ]
    assert proto.retry_tokens == {} and proto.log_levels.level() is None


def test_a_retry_without_a_progress_token_gets_no_progress() -> None:
    proto = opened(session())
    first = meta({"elicitation": {}}, progressToken="P1")
    proto.receive(request(1, "tools/call", _meta=first, name="files__read"))
    (asked,) = written(proto, question())
    proto.receive(request(2, "tools/call", name="files__read", _meta=meta({"elicitation": {}}),
                          inputResponses={"elicitation-1": {"action": "decline"}},
                          requestState=asked["result"]["requestState"]))  # fmt: skip
    progress = {"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": "P1", "progress": 1}}  # fmt: skip
    assert written(proto, progress) == []


def test_a_late_cancel_of_the_first_request_leaves_the_retry_its_call() -> None:
    # The cancel of request 1 crossed its input_required answer; the retry,
    # 2, carries the call now: the cancel names a complete request.
    proto = opened(session())
    proto.receive(request(1, "tools/call", _meta=meta({"elicitation": {}}), name="files__read"))
    (asked,) = written(proto, question())
    answer = {"action": "accept", "content": {}}
    proto.receive(request(2, "tools/call", name="files__read", _meta=meta({"elicitation": {}}),
                          inputResponses={"elicitation-1": answer},
                          requestState=asked["result"]["requestState"]))  # fmt: skip
    proto.take_upstream_answers()
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
    assert proto.receive(cancel) == []
    assert 2 in proto.inflight
    assert written(proto, {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}) == [
        {"jsonrpc": "2.0", "id": 2, "result": {"content": [], "resultType": "complete"}}
    ]
    assert proto.inflight == set() and proto.aliases == {} and proto.open_calls == {}


def test_a_parked_call_whose_client_does_not_come_back_is_given_up() -> None:
    """Past inputTimeout: cancelled upstream by its first id (before the
    server's question is answered with an error, so a late answer of the
    call is dropped upstream), forgotten here, and the late retry told why."""
    legacy = SessionProtocol(("files", "github"), Catalogs(Catalog((FILES, GITHUB))))
    proto = opened(become_modern(legacy, KEY, input_timeout=120.0))
    proto.receive(request(1, "tools/call", _meta=meta({"elicitation": {}}), name="files__read"))
    (asked,) = written(proto, question())
    assert proto.arm_parked(10.0) == 130.0
    assert proto.expire_parked(129.0) == []
    cancel, answer = proto.expire_parked(130.0)
    assert cancel == CancelUpstream({"requestId": 1, "reason": (
        "mcpbroker: the client did not come back with its input in time")})  # fmt: skip
    assert isinstance(answer, RespondUpstream) and answer.server == "files"
    assert answer.message["id"] == "mcpbroker:files:1"
    assert answer.message["error"]["code"] == -32603
    assert proto.inflight == set() and proto.open_calls == {}
    retry = request(2, "tools/call", _meta=meta({"elicitation": {}}), name="files__read",
                    inputResponses={"elicitation-1": {"action": "accept"}},
                    requestState=asked["result"]["requestState"])  # fmt: skip
    (late,) = proto.receive(retry)
    assert isinstance(late, Reply) and isinstance(late.message, dict)
    assert late.message["id"] == 2 and late.message["error"]["code"] == -32602
    assert "requestState expired" in late.message["error"]["message"]
    assert proto.inflight == set()


def test_a_streams_resource_subscriptions_are_counted_at_their_servers() -> None:
    proto = opened(session())
    readme = "file:///README.md"  # files takes subscriptions; github's file:///gh.txt: no
    ack, subscribe = proto.receive(request(1, "subscriptions/listen", notifications={
        "resourceSubscriptions": [readme, "file:///gh.txt"]}))  # fmt: skip
    assert isinstance(ack, Reply) and isinstance(ack.message, dict)
    assert ack.message["params"]["notifications"] == {"resourceSubscriptions": [readme]}
    assert subscribe == Forward("files", {
        "jsonrpc": "2.0", "id": proto.own_prefix + "1", "method": "resources/subscribe",
        "params": {"uri": readme}})  # fmt: skip
    # A second stream on the same URI needs nothing more upstream.
    assert [type(a) for a in proto.receive(request(2, "subscriptions/listen", notifications={
        "resourceSubscriptions": [readme]}))] == [Reply]  # fmt: skip
    assert written(proto, {"jsonrpc": "2.0", "id": proto.own_prefix + "1", "result": {}}) == []
    updated = {"jsonrpc": "2.0", "method": "notifications/resources/updated",
               "params": {"uri": readme}}  # fmt: skip
    assert [m["params"]["_meta"][SUBSCRIPTION_ID_KEY] for m in written(proto, updated)] == [1, 2]
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled"}
    assert proto.receive({**cancel, "params": {"requestId": 1}}) == []
    assert proto.receive({**cancel, "params": {"requestId": 2}}) == [
        Forward("files", {"jsonrpc": "2.0", "id": proto.own_prefix + "2",
                          "method": "resources/unsubscribe", "params": {"uri": readme}})
    ]  # fmt: skip
    assert written(proto, updated) == []


def replied(proto: ModernSessionProtocol, actions: list[Any]) -> list[Any]:
    """The session's own replies among ``actions``, as its client reads them
    (they cross take_outgoing, as the actor writes them)."""
    return written(proto, *(a.message for a in actions if isinstance(a, Reply)))


@pytest.mark.parametrize("rounds", [1, 2])
def test_a_call_answered_while_its_client_was_away_ends_on_the_retry(rounds: int) -> None:
    """The server answers the parked call before the client comes back (it
    did not wait for its question, or timed out, or died): the retry gets
    that answer, and the call is over in the session too. It was kept
    (in flight for good, and each later question refused: 'one call')."""
    proto = opened(session())
    proto.calls = CallTracker(CallStats())
    caps = meta({"elicitation": {}})
    proto.receive(request(1, "tools/call", _meta=caps, name="files__read"))
    (asked,) = written(proto, question())
    for id in range(2, rounds + 1):  # (a retry, and the server asks again)
        answers = {f"elicitation-{id - 1}": {"action": "decline"}}
        retry = request(id, "tools/call", _meta=caps, name="files__read", inputResponses=answers,
                        requestState=asked["result"]["requestState"])  # fmt: skip
        assert replied(proto, proto.receive(retry)) == []
        (asked,) = written(proto, question(f"mcpbroker:files:{id}"))
        assert asked["id"] == id and asked["result"]["resultType"] == "input_required"
    assert written(proto, {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}) == []
    last = rounds + 1
    retry = request(last, "tools/call", _meta=caps, name="files__read", inputResponses={},
                    requestState=asked["result"]["requestState"])  # fmt: skip
    assert replied(proto, proto.receive(retry)) == [
        {"jsonrpc": "2.0", "id": last, "result": {"content": [], "resultType": "complete"}}
    ]
    assert proto.inflight == set() and proto.open_calls == {} and proto.aliases == {}
    assert proto.calls.pending == {}
    # The next call at that server is asked its questions (not refused: 'one call').
    proto.receive(request(9, "tools/call", _meta=caps, name="files__read"))
    (asked,) = written(proto, question("mcpbroker:files:9"))
    assert asked["id"] == 9 and asked["result"]["resultType"] == "input_required"
    assert proto.take_upstream_answers() == []


def test_a_bridged_call_leaves_no_request_pending_in_its_counts() -> None:
    """Every request of a parked call's exchange ends in the counts (metrics,
    the audit log): the first, answered input_required, and its retry."""
    proto = opened(session())
    proto.calls = CallTracker(CallStats())
    caps = meta({"elicitation": {}})
    proto.receive(request(1, "tools/call", _meta=caps, name="files__read"))
    (asked,) = written(proto, question())
    retry = request(2, "tools/call", _meta=caps, name="files__read",
                    inputResponses={"elicitation-1": {"action": "decline"}},
                    requestState=asked["result"]["requestState"])  # fmt: skip
    proto.receive(retry)
    assert written(proto, {"jsonrpc": "2.0", "id": 1, "result": {"content": []}})[0]["id"] == 2
    assert proto.calls.pending == {}


def test_another_brokers_request_state_goes_to_its_server_and_no_legacy_one() -> None:
    """A token of some other mcpbroker (one behind this one, as its 2026-07-28
    server, whose input_required passed through) is that server's: the
    retry carries it there as it is. At a legacy server, which keeps no
    state, it names nothing (a token of this daemon before a restart): -32602."""
    identity = ServerIdentity("2026-07-28", {"tools": {}}, {"name": "inner"})
    inner = ServerEntry("inner", ServerState.READY, identity, {"tools": ({"name": "ask"},)})
    proto = opened(session(FILES, inner, view=("files", "inner")))
    theirs = "mcpbroker.Zm9vYmFy.c3RhdGU"
    assert not theirs.startswith(OWN_PREFIX)
    retry = request(3, "tools/call", name="inner__ask", inputResponses={"x": {}},
                    requestState=theirs)  # fmt: skip
    ((forward,),) = [proto.receive(retry)]
    assert isinstance(forward, Forward) and forward.server == "inner"
    assert forward.message["params"]["requestState"] == theirs
    assert proto.take_forwards([orjson.dumps({**retry, "id": 4})], 0, {}) == 0  # (not fast)
    stale = request(5, "tools/call", name="files__read", inputResponses={}, requestState=theirs)
    (refused,) = proto.receive(stale)
    assert isinstance(refused, Reply) and isinstance(refused.message, dict)
    assert refused.message["id"] == 5 and refused.message["error"]["code"] == -32602
    assert proto.inflight == {3}


def test_a_question_the_retry_does_not_declare_goes_back_to_the_server() -> None:
    """Capabilities are per request: a question that waited for the retry
    (the server asked two at once) is put to it only if the retry declares
    what it needs; else the server gets -32601, as for the first request."""
    proto = opened(session())
    both = meta({"elicitation": {}, "sampling": {}})
    proto.receive(request(1, "tools/call", _meta=both, name="files__read"))
    (asked,) = written(proto, question())
    sample = {"messages": [], "maxTokens": 5}
    assert written(proto, {**question("mcpbroker:files:2", "sampling/createMessage"),
                           "params": sample}) == []  # fmt: skip
    answer = {"action": "accept", "content": {"colour": "blue"}}
    retry = request(2, "tools/call", _meta=meta({"elicitation": {}}), name="files__read",
                    inputResponses={"elicitation-1": answer},
                    requestState=asked["result"]["requestState"])  # fmt: skip
    answered, refused = proto.receive(retry)
    assert answered == RespondUpstream(
        "files", {"jsonrpc": "2.0", "id": "mcpbroker:files:1", "result": answer}
    )
    assert isinstance(refused, RespondUpstream) and refused.server == "files"
    assert refused.message["id"] == "mcpbroker:files:2"
    assert refused.message["error"]["code"] == -32601
    assert "'sampling'" in refused.message["error"]["message"]
    assert proto.inflight == {1, 2}  # (the retry waits for the call's answer)


def test_a_listen_streams_id_is_in_use_while_it_is_open() -> None:
    """A stream is a request that stays open: a call with its id (or another
    stream) is refused with id null, as any id in use is, so the client has
    one answer per id; and the reverse. Cancelled, the id is free again.
    (The call was taken, the stream's duplicate refused with the call's id,
    and a cancellation of that id ended the stream, not the call.)"""
    proto = opened(session())
    proto.receive(request(20, "subscriptions/listen", notifications={"toolsListChanged": True}))
    call = request(20, "tools/call", name="files__read")
    for again in (call, request(20, "subscriptions/listen")):
        (refused,) = proto.receive(again)
        assert isinstance(refused, Reply) and isinstance(refused.message, dict)
        assert refused.message["id"] is None and refused.message["error"]["code"] == -32600
        assert refused.message["error"]["data"] == {"id": 20}
    line = orjson.dumps(request(20, "tools/call", name="files__read"))
    assert proto.take_forwards([line], 0, {}) == 0  # (the fast path leaves it to receive())
    proto.receive(request(30, "tools/call", name="files__read"))
    (refused,) = proto.receive(request(30, "subscriptions/listen"))
    assert isinstance(refused, Reply) and isinstance(refused.message, dict)
    assert refused.message["id"] is None and refused.message["error"]["data"] == {"id": 30}
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 20}}
    assert proto.receive(cancel) == []
    (forward,) = proto.receive(request(20, "tools/call", name="files__read"))
    assert isinstance(forward, Forward)


@pytest.mark.parametrize(
    "again",
    [
        request(10, "tools/list"),
        request(10, "resources/templates/list"),
        request(10, "server/discover"),
        request(10, "ping"),
        request(10, "initialize"),
    ],
)
@pytest.mark.parametrize("holder", ["listen", "call", "deferred"])
def test_an_id_in_use_is_refused_also_by_a_request_the_broker_answers(
    again: dict[str, Any], holder: str
) -> None:
    """docs/eras.md: a request with the id of a stream, a call or a request
    waiting for its servers is refused -32600 with id null, also one the
    broker answers itself (the client got two answers with one id)."""
    proto = opened(session(FILES, server("github", LOADING)))
    if holder == "listen":
        notifications = {"toolsListChanged": True}
        proto.receive(request(10, "subscriptions/listen", notifications=notifications))
    elif holder == "call":
        (forward,) = proto.receive(request(10, "tools/call", name="files__read"))
        assert isinstance(forward, Forward)
    else:
        discover = request(10, "server/discover")
        assert proto.receive(discover) == [Defer(discover)]
    (refused,) = proto.receive(again)
    assert isinstance(refused, Reply) and isinstance(refused.message, dict)
    assert refused.message["id"] is None and refused.message["error"]["code"] == -32600
    assert refused.message["error"]["data"] == {"id": 10}
    if holder == "deferred":
        (answer,) = proto.receive(discover, settled=True)
        assert isinstance(answer, Reply) and answer.message["id"] == 10  # type: ignore[index]
        assert 10 not in proto.inflight  # (0: opened()'s tools/list, deferred too)


@pytest.mark.parametrize(
    "first",
    [
        request(1, "ping"),
        request(1, "tools/call", name="nobody__tool"),
        request(1, "subscriptions/listen", notifications=7),
    ],
)
def test_a_session_whose_first_request_is_refused_attaches_on_the_next(first: Any) -> None:
    """Its attachment (hearing from its servers: their questions, its
    streams' notifications) went with the refused request's actions."""
    proto = session()
    (refused,) = proto.receive(first)
    assert isinstance(refused, Reply)
    assert Attach(("files", "github"), BROKER_CLIENT_CAPABILITIES) in proto.receive(
        request(2, "tools/list")
    )


def test_a_clients_id_of_the_shape_of_the_sessions_own_is_answered() -> None:
    """The session's own requests (its streams' subscriptions) have ids of a
    tag of its own, and only their answers are its own: a client's request
    whose id starts as they do is answered. (Every answer whose id started
    'mcpbroker:subscription:' was taken for the session's own: dropped, and
    the request in flight for good; and the session's own id could be the
    client's, refused upstream as in use.)"""
    proto = opened(session())
    assert proto.own_prefix.startswith("mcpbroker:subscription:")
    for id in ("mcpbroker:subscription:1", proto.own_prefix + "x"):
        (forward,) = proto.receive(request(id, "tools/call", name="files__read"))
        assert isinstance(forward, Forward)
        answer = {"jsonrpc": "2.0", "id": id, "result": {"content": []}}
        assert [m["id"] for m in written(proto, answer)] == [id]
    assert proto.inflight == set()


def test_the_daemon_ending_a_session_ends_its_streams_gracefully() -> None:
    """Each open listen gets its result (SubscriptionsListenResult: "the
    subscription has ended gracefully, for example, during server shutdown"),
    as the session's last words before its in-flight requests' errors."""
    proto = opened(session())
    proto.receive(request("L", "subscriptions/listen", notifications={"toolsListChanged": True}))
    assert proto.end_streams() == [
        {"jsonrpc": "2.0", "id": "L",
         "result": {"resultType": "complete", "_meta": {SUBSCRIPTION_ID_KEY: "L"}}}
    ]  # fmt: skip
    assert proto.streams == set() and proto.end_streams() == []


def test_a_retry_that_names_a_tool_of_another_server_is_refused_and_spends_nothing() -> None:
    """(It was taken for the parked call's retry: the client got the call's
    answer as its answer for a tool of another server.)"""
    proto = opened(session())
    caps = meta({"elicitation": {}})
    proto.receive(request(1, "tools/call", _meta=caps, name="files__read"))
    (asked,) = written(proto, question())
    state = asked["result"]["requestState"]
    answers = {"elicitation-1": {"action": "decline"}}
    elsewhere = request(2, "tools/call", _meta=caps, name="github__search",
                        inputResponses=answers, requestState=state)  # fmt: skip
    (refused,) = proto.receive(elsewhere)
    assert isinstance(refused, Reply) and isinstance(refused.message, dict)
    assert refused.message["error"]["code"] == -32602
    assert "a call at MCP server 'files'" in refused.message["error"]["message"]
    right = request(3, "tools/call", _meta=caps, name="files__read",
                    inputResponses=answers, requestState=state)  # fmt: skip
    (respond,) = proto.receive(right)
    assert isinstance(respond, RespondUpstream) and respond.server == "files"


def test_a_retry_that_changes_its_calls_params_is_refused_and_spends_nothing() -> None:
    """A retry of the same server's other tool, or of the same tool with other
    arguments, was taken for the parked call's: the client got the call's
    answer (to what it first asked) as the answer to what it asks now."""
    proto = opened(session())
    caps = meta({"elicitation": {}})
    proto.receive(request(1, "tools/call", _meta=caps, name="files__read", arguments={"p": 1}))
    (asked,) = written(proto, question())
    state = asked["result"]["requestState"]
    answers = {"elicitation-1": {"action": "decline"}}
    for id, name, arguments in ((2, "files__write", {"p": 1}), (3, "files__read", {"p": 2})):
        changed = request(id, "tools/call", _meta=caps, name=name, arguments=arguments,
                          inputResponses=answers, requestState=state)  # fmt: skip
        (refused,) = proto.receive(changed)
        assert isinstance(refused, Reply) and isinstance(refused.message, dict)
        assert refused.message["error"]["code"] == -32602
        assert "must repeat its call's params" in refused.message["error"]["message"]
    right = request(4, "tools/call", _meta=meta({"elicitation": {}, "sampling": {}}),
                    name="files__read", arguments={"p": 1},
                    inputResponses=answers, requestState=state)  # fmt: skip
    (respond,) = proto.receive(right)
    assert isinstance(respond, RespondUpstream) and respond.server == "files"
