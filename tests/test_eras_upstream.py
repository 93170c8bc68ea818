"""UpstreamProtocol's era: the server/discover probe, and requests to a modern server."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import trio

from broker import jsonrpc
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LOG_LEVEL_KEY,
    PROTOCOL_VERSION_KEY,
)
from broker.lifecycle import BROKER_CLIENT_CAPABILITIES, BROKER_VERSION, HandshakeError
from broker.states import ServerState, ServerTrigger
from broker.upstream import (
    HANDSHAKE_ID,
    PROBE_ID,
    Deliver,
    Ready,
    SendUpstream,
    Speak,
    UpstreamProtocol,
)
from broker.wire.envelope import split_answer
from tests.scripted import ScriptedServer
from tests.test_actors import open_client, start_broker

MODERN = "2026-07-28"
DISCOVERED = {
    "resultType": "complete",
    "supportedVersions": [MODERN],
    "capabilities": {"tools": {}, "logging": {}},
    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "m", "version": "1"}},
}
INIT_RESULT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {"tools": {}},
    "serverInfo": {"name": "old", "version": "1"},
}


def started(era: str) -> tuple[UpstreamProtocol, dict[str, Any]]:
    proto = UpstreamProtocol("m", era=era)
    return proto, proto.start()


def modern_protocol() -> UpstreamProtocol:
    proto, _ = started("auto")
    (ready,) = proto.server_message(jsonrpc.result_response(PROBE_ID, DISCOVERED))
    assert isinstance(ready, Ready)
    return proto


def legacy_protocol() -> UpstreamProtocol:
    proto, _ = started("legacy")
    proto.server_message(jsonrpc.result_response(HANDSHAKE_ID, INIT_RESULT))
    assert proto.state is ServerState.READY
    return proto


def meta_of(message: dict[str, Any]) -> dict[str, Any]:
    """The ``_meta`` the server reads (a stamp kept as bytes, decoded)."""
    meta: dict[str, Any] = orjson.loads(orjson.dumps(message["params"]["_meta"]))
    return meta


def test_a_legacy_server_is_opened_with_initialize_unprobed() -> None:
    proto, first = started("legacy")
    assert first["method"] == "initialize"
    assert not proto.probing


@pytest.mark.parametrize("era", ["auto", "modern"])
def test_a_modern_answer_opens_a_modern_connection_without_initialize(era: str) -> None:
    proto, first = started(era)
    assert first["method"] == "server/discover" and first["id"] == PROBE_ID
    assert meta_of(first)[PROTOCOL_VERSION_KEY] == MODERN
    actions = proto.server_message(jsonrpc.result_response(PROBE_ID, DISCOVERED))
    assert actions == [Ready(proto.identity)]  # no notifications/initialized
    assert proto.modern and proto.state is ServerState.READY
    assert proto.identity is not None and proto.identity.protocol_version == MODERN
    assert proto.identity.server_info == {"name": "m", "version": "1"}


def test_auto_falls_back_to_initialize_on_an_error() -> None:
    proto, _ = started("auto")
    assert proto.speaking == MODERN  # (the probe is a modern request)
    refused = jsonrpc.error_response(PROBE_ID, -32601, "Method not found")
    speak, sent = proto.server_message(refused)
    assert speak == Speak(None) and proto.speaking is None  # the link goes legacy first
    assert isinstance(sent, SendUpstream) and sent.message["method"] == "initialize"
    assert not proto.probing
    actions = proto.server_message(jsonrpc.result_response(HANDSHAKE_ID, INIT_RESULT))
    assert isinstance(actions[-1], Ready) and not proto.modern


def test_auto_falls_back_to_initialize_when_the_probe_times_out() -> None:
    proto, _ = started("auto")
    speak, sent = proto.probe_expired()
    assert speak == Speak(None)
    assert isinstance(sent, SendUpstream) and sent.message["method"] == "initialize"
    assert proto.probe_expired() == []  # once
    # A late answer to the probe changes nothing.
    assert proto.server_message(jsonrpc.result_response(PROBE_ID, DISCOVERED)) == []
    assert not proto.modern and proto.state is ServerState.INITIALIZING


def test_a_forced_modern_server_that_is_legacy_fails_its_handshake() -> None:
    proto, _ = started("modern")
    assert proto.probe_expired() == []  # the startup timeout decides
    with pytest.raises(HandshakeError, match="not modern"):
        proto.server_message(jsonrpc.error_response(PROBE_ID, -32601, "Method not found"))


def test_a_server_naming_another_modern_version_is_probed_again_then_refused() -> None:
    proto, _ = started("auto")
    wrong = jsonrpc.error_response(
        PROBE_ID, -32022, "Unsupported", data={"supported": [MODERN], "requested": MODERN}
    )
    (sent,) = proto.server_message(wrong)
    assert isinstance(sent, SendUpstream) and sent.message["method"] == "server/discover"
    future = jsonrpc.error_response(PROBE_ID, -32022, "Unsupported", data={"supported": ["2099"]})
    with pytest.raises(HandshakeError, match="2099"):
        proto.server_message(future)


def test_requests_to_a_modern_server_are_stamped_with_their_clients_capabilities() -> None:
    proto = modern_protocol()
    host = {"name": "host", "version": "1"}
    proto.attach("a", {"sampling": {}}, client_info=host)
    (sent,) = proto.client_request(
        "a", {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "t"}}
    )
    assert isinstance(sent, SendUpstream)
    meta = meta_of(sent.message)
    assert meta[PROTOCOL_VERSION_KEY] == MODERN
    assert meta[CLIENT_CAPABILITIES_KEY] == {"sampling": {}}
    assert meta[CLIENT_INFO_KEY] == host  # (its initialize's: the SDK knows no client without)
    assert sent.message["params"]["name"] == "t"
    # The broker's own (no attached session): its own capabilities and name.
    (sent,) = proto.client_request("internal", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert isinstance(sent, SendUpstream)
    assert meta_of(sent.message)[CLIENT_CAPABILITIES_KEY] == BROKER_CLIENT_CAPABILITIES
    assert meta_of(sent.message)[CLIENT_INFO_KEY] == {
        "name": "mcpbroker",
        "version": BROKER_VERSION,
    }
    # The answer comes back unchanged but for the client's id.
    upstream_id = sent.message["id"]
    answered = jsonrpc.result_response(upstream_id, {"resultType": "complete", "tools": []})
    (delivered,) = proto.server_message(answered)
    assert isinstance(delivered, Deliver) and delivered.message["id"] == 1
    assert delivered.message["result"] == {"resultType": "complete", "tools": []}


def test_an_unparsed_answer_says_whether_a_modern_server_wrote_it() -> None:
    """``Answer.modern``: what a modern client's session passes on unstamped;
    ``Answer.method``: what it completes one by, had it kept no record."""
    for proto in (modern_protocol(), legacy_protocol()):
        proto.attach("a", {}, modern=True)
        request = {"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "t"}}
        assert proto.forward_fast("a", request)
        line = b'{"jsonrpc":"2.0","id":%d,"result":{"content":[]}}' % request["id"]
        answer = split_answer(line)
        assert answer is not None
        assert proto.answer_fast(answer) == "a"
        assert (answer.id, answer.modern, answer.method) == ("c", proto.modern, "tools/call")


def test_a_modern_server_is_pinged_with_discover_and_never_asked_legacy_only_things() -> None:
    proto = modern_protocol()
    ping = proto.ping()
    assert ping["method"] == "server/discover"
    assert meta_of(ping)[PROTOCOL_VERSION_KEY] == MODERN
    assert proto.client_log_level("a", "debug") == []  # no logging/setLevel
    assert proto.renewed() == []


def test_a_restarted_connection_is_probed_again() -> None:
    proto = modern_protocol()
    proto.server_gone("exited")
    fresh = proto.restarted()
    assert fresh.era == "auto" and not fresh.modern
    assert fresh.start()["method"] == "server/discover" and fresh.unprobed is None


@pytest.mark.parametrize("ended", ["probe out", "probe answered legacy", "probe timed out"])
def test_a_process_that_ends_before_its_handshake_once_probed_is_not_probed_again(
    ended: str,
) -> None:
    """Some legacy servers exit on a request before initialize, at once or
    after answering it, and a slow one reads the probe after it timed out:
    the next process is not probed (nor any after it), so it is no crash loop."""
    proto, _ = started("auto")
    if ended == "probe answered legacy":
        proto.server_message(jsonrpc.error_response(PROBE_ID, -32601, "Method not found"))
    elif ended == "probe timed out":
        proto.probe_expired()
    proto.server_gone("exited during startup")
    fresh = proto.restarted()
    assert fresh.unprobed is not None and "server/discover" in fresh.unprobed
    assert fresh.start()["method"] == "initialize" and fresh.era == "auto"
    fresh.server_message(jsonrpc.result_response(HANDSHAKE_ID, INIT_RESULT))
    fresh.server_gone("exited")
    later = fresh.restarted()
    later.move(ServerTrigger.BACKOFF_ELAPSED)
    later.move(ServerTrigger.LAUNCHED)
    assert later.start()["method"] == "initialize" and later.unprobed == fresh.unprobed
    # ... still opened modern if it turns out to be a modern-only server
    refusal = jsonrpc.error_response(HANDSHAKE_ID, -32022, "no", data={"supported": [MODERN]})
    later.server_message(refusal)
    later.server_message(jsonrpc.result_response(PROBE_ID, DISCOVERED))
    assert later.modern and later.state is ServerState.READY


def test_a_url_server_unreachable_while_probed_is_probed_again() -> None:
    proto = UpstreamProtocol("m", era="auto", process=False)
    proto.start()
    proto.server_gone("could not be reached")
    fresh = proto.restarted()
    assert fresh.unprobed is None and fresh.start()["method"] == "server/discover"


def test_a_process_that_ends_after_its_handshake_is_probed_again() -> None:
    """Opened legacy after the probe (answered, or timed out), then gone: the
    probe did not end it, and the next process is probed as the first was."""
    for end in ("answered", "expired"):
        proto, _ = started("auto")
        if end == "answered":
            proto.server_message(jsonrpc.error_response(PROBE_ID, -32601, "Method not found"))
        else:
            proto.probe_expired()
        proto.server_message(jsonrpc.result_response(HANDSHAKE_ID, INIT_RESULT))
        proto.server_gone("exited")
        fresh = proto.restarted()
        assert fresh.unprobed is None and fresh.start()["method"] == "server/discover"


def test_auto_after_a_late_probe_takes_the_refused_initialize_as_modern_evidence() -> None:
    """A server slow to start reads the probe after it timed out; a dual-era
    one then fixes its era at modern and refuses the initialize that
    followed (naming only modern versions): it is probed again, and modern."""
    proto, _ = started("auto")
    proto.probe_expired()
    assert proto.server_message(jsonrpc.result_response(PROBE_ID, DISCOVERED)) == []  # late
    refusal = jsonrpc.error_response(HANDSHAKE_ID, -32022, "no", data={"supported": [MODERN]})
    speak, probe = proto.server_message(refusal)
    assert speak == Speak(MODERN) and isinstance(probe, SendUpstream)
    assert probe.message["method"] == "server/discover"
    proto.server_message(jsonrpc.result_response(PROBE_ID, DISCOVERED))
    assert proto.modern and proto.state is ServerState.READY


def test_a_server_refusing_initialize_then_probed_legacy_fails_once() -> None:
    """The refusal's probe is sent once: a server whose probe then answers
    legacy fails its handshake (restarted with backoff), never loops."""
    proto, _ = started("auto")
    proto.probe_expired()
    refusal = jsonrpc.error_response(HANDSHAKE_ID, -32022, "no", data={"supported": [MODERN]})
    proto.server_message(refusal)
    with pytest.raises(HandshakeError, match="refused initialize and is not modern"):
        proto.server_message(jsonrpc.error_response(PROBE_ID, -32601, "Method not found"))


def test_the_era_key_is_checked() -> None:
    from broker.config import ConfigError, parse_config

    servers = {"m": {"command": "x", "era": "auto"}}
    assert parse_config({"mcpServers": servers}).servers["m"].era == "auto"
    assert parse_config({"mcpServers": {"m": {"command": "x"}}}).servers["m"].era == "auto"
    servers = {"m": {"command": "x", "era": "legacy"}}
    assert parse_config({"mcpServers": servers}).servers["m"].era == "legacy"
    with pytest.raises(ConfigError, match=r'"mcpServers.m.era" must be'):
        parse_config({"mcpServers": {"m": {"command": "x", "era": "2026"}}})


def test_a_clients_log_level_is_stamped_on_its_requests_to_a_modern_server() -> None:
    proto = modern_protocol()
    proto.attach("a", {})
    proto.attach("b", {})
    assert proto.client_log_level("a", "warning") == []  # (no logging/setLevel upstream)
    (sent,) = proto.client_request("a", {"jsonrpc": "2.0", "id": 1, "method": "tools/call"})
    assert isinstance(sent, SendUpstream) and meta_of(sent.message)[LOG_LEVEL_KEY] == "warning"
    (sent,) = proto.client_request("b", {"jsonrpc": "2.0", "id": 1, "method": "tools/call"})
    assert isinstance(sent, SendUpstream) and LOG_LEVEL_KEY not in meta_of(sent.message)


def test_a_sessions_stamp_is_made_once_until_what_it_says_changes() -> None:
    """Its bytes are kept (an orjson.Fragment) and written as they are, until
    the session's log level, or what it attached with, changes."""
    proto = modern_protocol()
    host = {"name": "host", "version": "1"}
    proto.attach("a", {"sampling": {}}, client_info=host)
    n = iter(range(100))

    def sent_meta(session: str = "a", **params: Any) -> Any:
        request = {"jsonrpc": "2.0", "id": next(n), "method": "tools/call", "params": params}
        (sent,) = proto.client_request(session, request)
        assert isinstance(sent, SendUpstream)
        return sent.message["params"]["_meta"]

    first = sent_meta(name="t")
    assert type(first) is dict and first[CLIENT_INFO_KEY] == host
    again = sent_meta(name="t")
    assert type(again) is orjson.Fragment and orjson.dumps(again) == orjson.dumps(first)
    assert sent_meta(name="t") is again  # (one, shared)
    # A _meta of the client's own: merged, as a value; the stamp kept.
    own = sent_meta(name="t", _meta={"progressToken": "p"})
    assert type(own) is dict and own[CLIENT_INFO_KEY] == host and "progressToken" in own
    assert sent_meta(name="t") is again
    # A log level set, an attachment renewed, a session gone: made again.
    proto.client_log_level("a", "debug")
    leveled = sent_meta(name="t")
    assert type(leveled) is dict and leveled[LOG_LEVEL_KEY] == "debug"
    assert meta_of({"params": {"_meta": sent_meta(name="t")}}) == leveled
    other = {"name": "other", "version": "2"}
    proto.attach("a", {}, client_info=other)
    assert sent_meta(name="t")[CLIENT_INFO_KEY] == other
    proto.attach("a", {})  # (naming none now: not the name it gave before)
    assert CLIENT_INFO_KEY not in sent_meta(name="t")
    proto.session_closed("a")
    assert proto.modern_server is not None and "a" not in proto.modern_server.stamps  # (no leak)
    proto.attach("a", {"roots": {}}, client_info=host)
    renewed = sent_meta(name="t")
    assert type(renewed) is dict and renewed[CLIENT_CAPABILITIES_KEY] == {"roots": {}}
    assert LOG_LEVEL_KEY not in renewed


def test_a_probe_the_link_could_not_get_answered_means_legacy() -> None:
    """HTTP: the probe's POST met an error status with no JSON-RPC error (a
    legacy server's 400 without a session, an old server's 404 or 405)."""
    proto, _ = started("auto")
    assert proto.probe_failed("other", "HTTP 400") is None  # not the probe
    speak, sent = proto.probe_failed(PROBE_ID, "HTTP 405 Method Not Allowed") or []
    assert speak == Speak(None)
    assert isinstance(sent, SendUpstream) and sent.message["method"] == "initialize"
    assert proto.probe_failed(PROBE_ID, "HTTP 400") is None  # decided already
    forced, _ = started("modern")
    with pytest.raises(HandshakeError, match=r"not modern.*HTTP 404"):
        forced.probe_failed(PROBE_ID, "HTTP 404 Not Found")


def test_a_legacy_clients_name_is_kept_across_restarts_and_forgotten_when_it_leaves() -> None:
    proto = modern_protocol()
    proto.attach("a", {}, client_info={"name": "host", "version": "1"})
    proto.attach("m", {}, modern=True, client_info={"name": "modern", "version": "1"})
    assert proto.client_infos == {"a": {"name": "host", "version": "1"}}  # (a modern one's says it)
    fresh = proto.restarted()
    assert fresh.client_infos == proto.client_infos
    fresh.session_closed("a")
    assert fresh.client_infos == {}


def test_a_made_up_request_state_at_a_legacy_server_is_refused_not_run_again() -> None:
    """A modern client's retry whose requestState the broker never gave it
    (its own are the session's to read) names nothing at a legacy server,
    which keeps no state: it was run as a new call, doing the work again.
    Refused -32602; a legacy client's params and a modern server's are the
    server's business. (Found by probing: /tmp/probes3/modern fault 4.)"""
    proto = legacy_protocol()
    proto.attach("m", {}, modern=True)
    proto.attach("l", {})
    meta = {PROTOCOL_VERSION_KEY: MODERN}
    params = {"name": "t", "inputResponses": {}, "requestState": "made-up", "_meta": meta}
    retry = {"jsonrpc": "2.0", "id": "r", "method": "tools/call", "params": dict(params)}
    with pytest.raises(jsonrpc.JsonRpcError) as refused:
        proto.forward_fast("m", retry)
    assert (refused.value.code, refused.value.id) == (jsonrpc.INVALID_PARAMS, "r")
    # (as the actor does: what take_requests does not take goes to
    # client_request, the same dict: its id must still be the client's)
    out: list[Any] = []
    assert proto.take_requests("m", [retry], 0, out, 0.0) == 0 and out == []
    with pytest.raises(jsonrpc.JsonRpcError, match="requestState is unknown") as again:
        proto.client_request("m", retry)
    assert again.value.id == "r"
    assert not proto.requests  # (nothing was opened)
    legacy = {"jsonrpc": "2.0", "id": "x", "method": "tools/call", "params": dict(params)}
    assert proto.forward_fast("l", legacy)  # (a legacy client's own params: passed on)
    modern = modern_protocol()
    modern.attach("m", {}, modern=True)
    assert modern.forward_fast("m", {**retry, "params": dict(params)})


async def test_a_modern_server_that_refuses_the_era_is_opened_again_in_the_era_it_speaks(
    nursery: Any, autojump_clock: Any
) -> None:
    """The Upstream actor: a server found modern that refuses 2026-07-28 on a
    call (here: replaced by a legacy one) is opened again, probed, and found
    legacy; the refused call is told to call again, and the next call is
    served. (It was never probed again: every later call failed -32603.)"""
    with trio.fail_after(120):  # (virtual time: a hang fails)
        script = ScriptedServer(nursery, modern=True)
        broker = await start_broker(nursery, {"s": script})
        client = await open_client(nursery, broker)
        await client.initialize()
        refusal = {"code": -32022, "message": "Unsupported protocol version",
                   "data": {"supported": ["2025-11-25"], "requested": MODERN}}  # fmt: skip
        line = orjson.dumps({"jsonrpc": "2.0", "id": 0, "error": refusal}).decode()
        line = line.replace('"id":0', '"id":ID')
        script.modern = False  # (what its next process is)
        answer = await client.request("tools/call", {"name": "raw", "arguments": {"line": line}})
        error = answer["error"]
        assert error["code"] == -32603 and error["data"]["retryable"] is True
        assert "opens it again to find out its era; call again" in error["message"]
        echo = {"name": "echo", "arguments": {"n": 1}}
        answer = await client.request("tools/call", echo)  # (at once: as in any restart)
        assert answer["error"]["code"] == -32000 and answer["error"]["data"]["retryable"]
        await trio.sleep(2)  # (its restart's backoff, 0.25 to 0.5 s)
        answer = await client.request("tools/call", echo)
        assert answer["result"]["echo"] == {"n": 1}
        assert script.launches == 2 and len(script.requests("server/discover")) == 2
        assert len(script.requests("initialize")) == 1  # (the second process: legacy)
        assert broker.upstreams["s"].identity.protocol_version == "2025-11-25"
