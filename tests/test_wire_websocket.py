"""The WebSocket handshake's rules and framing (broker/wire/websocket.py), and
the listener's settings (no sockets)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.downstream.unix import StartError
from actors.downstream.websocket import is_loopback, policy_for
from broker.config import BrokerSettings, ConfigError, parse_address, parse_config, with_listeners
from broker.wire.envelope import split_answer
from broker.wire.frames import Oversize
from broker.wire.websocket import Accept, Policy, Reject, check_handshake, frame_of, text_of

SERVERS = ("files", "git hub")
OPEN = Policy()


def check(
    path: str = "/mcp",
    host: str = "127.0.0.1:8765",
    headers: dict[str, str] | None = None,
    subprotocols: tuple[str, ...] = ("mcp",),
    policy: Policy = OPEN,
) -> Accept | Reject:
    fields = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    return check_handshake(path, host, fields, subprotocols, SERVERS, policy)


def test_paths_choose_the_view() -> None:
    assert check("/mcp") == Accept(None, False, "mcp")
    assert check("/mcp/") == Accept(None, False, "mcp")
    assert check("/mcp?x=1") == Accept(None, False, "mcp")
    assert check("/mcp/files") == Accept(("files",), True, "mcp")
    assert check("/mcp/git%20hub") == Accept(("git hub",), True, "mcp")
    unknown = check("/mcp/nope")
    assert isinstance(unknown, Reject) and unknown.status == 404 and "'nope'" in unknown.reason
    assert "files" in unknown.reason  # it says what there is
    assert isinstance(check("/"), Reject) and check("/").status == 404  # type: ignore[union-attr]
    assert check("/mcpx").status == 404  # type: ignore[union-attr]


@pytest.mark.parametrize("host", ["localhost", "localhost:1", "127.0.0.1", "[::1]:9", "[::1]"])
def test_loopback_hosts_pass(host: str) -> None:
    assert isinstance(check(host=host), Accept)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "", "10.0.0.1:1", "[::2]"])
def test_other_hosts_are_refused_unless_allowed(host: str) -> None:
    refusal = check(host=host)
    assert isinstance(refusal, Reject) and refusal.status == 403
    name = host.rpartition(":")[0] if host.count(":") == 1 else host.strip("[]")
    assert isinstance(check(host=host, policy=Policy(allowed_hosts=frozenset({name}))), Accept)


def test_origins_are_refused_unless_listed() -> None:
    assert isinstance(check(), Accept)  # no Origin: not a browser
    for origin in ("https://evil.example", "null", "http://localhost:3000"):
        refusal = check(headers={"Origin": origin})
        assert isinstance(refusal, Reject) and refusal.status == 403 and origin in refusal.reason
    listed = Policy(allowed_origins=frozenset({"http://localhost:3000"}))
    assert isinstance(check(headers={"origin": "http://localhost:3000"}, policy=listed), Accept)


def test_the_token_is_required_when_set() -> None:
    policy = Policy(token="t0ken")
    for given_ in (None, "Bearer", "Bearer wrong", "Basic t0ken", "Bearer t0ken2"):
        headers = {} if given_ is None else {"Authorization": given_}
        refusal = check(headers=headers, policy=policy)
        assert isinstance(refusal, Reject) and refusal.status == 401
        assert ("WWW-Authenticate", 'Bearer realm="mcpbroker"') in refusal.headers
    assert isinstance(check(headers={"Authorization": "Bearer t0ken"}, policy=policy), Accept)
    assert isinstance(check(headers={"authorization": "bearer t0ken"}, policy=policy), Accept)


def test_subprotocol() -> None:
    assert check(subprotocols=()) == Accept(None, False, None)  # proposes none: no subprotocol
    assert check(subprotocols=("x", "mcp")) == Accept(None, False, "mcp")
    refusal = check(subprotocols=("graphql-ws",))
    assert isinstance(refusal, Reject) and refusal.status == 400


def test_checks_come_before_the_path() -> None:
    """A client that may not connect learns nothing of the configured servers."""
    refusal = check("/mcp/nope", host="evil.example")
    assert isinstance(refusal, Reject) and refusal.status == 403 and "files" not in refusal.reason


@given(st.text(max_size=300))
def test_frames_are_the_message_bytes_or_oversize(text: str) -> None:
    data = text.encode()
    assert frame_of(text, 300 * 4) == data
    assert frame_of(data, 300 * 4) == data
    if len(data) > 10:
        frame = frame_of(text, 10)
        assert isinstance(frame, Oversize) and frame.size == len(data)
        assert frame.head == data[:64] and frame.tail == data[-64:]


def test_text_of_an_answer_is_the_servers_bytes() -> None:
    answer = split_answer(b'{"jsonrpc":"2.0","id":7,"result":{"n":1e400}}')
    assert answer is not None
    answer.id = "c"
    assert text_of(answer) == '{"jsonrpc":"2.0","id":"c","result":{"n":1e400}}'
    assert text_of({"jsonrpc": "2.0", "id": 1, "result": {}}) == (
        '{"jsonrpc":"2.0","id":1,"result":{}}'
    )


def test_addresses() -> None:
    assert parse_address("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert parse_address("8765") == ("127.0.0.1", 8765)
    assert parse_address(":0") == ("127.0.0.1", 0)
    assert parse_address("[::1]:9") == ("::1", 9)
    for bad in ("host", "host:x", "host:70000", ""):
        with pytest.raises(ValueError):
            parse_address(bad)
    with pytest.raises(ConfigError, match=r"broker\.websocket"):
        parse_config({"mcpServers": {}, "broker": {"websocket": "nowhere"}})


def test_the_command_line_overrides_the_config() -> None:
    config = parse_config({"mcpServers": {}, "broker": {"websocket": "1"}})
    config = with_listeners(config, "127.0.0.1:2", "/tmp/t")
    assert config.broker.websocket == "127.0.0.1:2" and config.broker.token_file == "/tmp/t"
    with pytest.raises(ConfigError, match="--ws"):
        with_listeners(config, "x:y", None)


def test_off_loopback_a_token_is_required(tmp_path: object) -> None:
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
    with pytest.raises(StartError, match="needs a token"):
        policy_for("0.0.0.0", BrokerSettings())
    assert policy_for("127.0.0.1", BrokerSettings()).token is None


def test_the_token_file_must_hold_one_token(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "t"  # type: ignore[operator]
    path.write_text("  abc  \n")
    assert policy_for("0.0.0.0", BrokerSettings(token_file=str(path))).token == "abc"
    path.write_text("a b")
    with pytest.raises(StartError, match="one token"):
        policy_for("127.0.0.1", BrokerSettings(token_file=str(path)))
    with pytest.raises(StartError, match="cannot read"):
        policy_for("127.0.0.1", BrokerSettings(token_file=str(path) + ".missing"))


def test_an_origin_naming_the_listener_itself_is_same_origin() -> None:
    """A page at the listener's own address would be one the daemon served (it
    serves none); any other port or name is another origin."""
    for origin in ("http://127.0.0.1:8767", "HTTP://127.0.0.1:8767/", "ws://127.0.0.1:8767"):
        assert isinstance(check(host="127.0.0.1:8767", headers={"Origin": origin}), Accept)
    for origin in ("http://127.0.0.1:8768", "http://localhost:8767", "http://127.0.0.1"):
        refusal = check(host="127.0.0.1:8767", headers={"Origin": origin})
        assert isinstance(refusal, Reject) and refusal.status == 403


@pytest.mark.parametrize(
    "host", ["[::1]evil.example", "localhost:1, evil.example", "localhost evil", "[::1]:9x"]
)
def test_a_host_field_that_is_not_one_host_is_refused(host: str) -> None:
    refusal = check(host=host)
    assert isinstance(refusal, Reject) and refusal.status == 403


def test_host_names_are_compared_without_case() -> None:
    """RFC 3986 section 3.2.2: LOCALHOST is localhost; allowedHosts too."""
    assert isinstance(check(host="LOCALHOST:8765"), Accept)
    allowed = Policy(allowed_hosts=frozenset({"Box.Example"}))
    assert isinstance(check(host="box.EXAMPLE", policy=allowed), Accept)


def test_an_absolute_form_target_names_the_host() -> None:
    """RFC 9112 section 3.2.2: the target's authority, not the Host field."""
    refusal = check("http://evil.example/mcp", host="localhost:8765")
    assert isinstance(refusal, Reject) and refusal.status == 403
    assert check("http://localhost:8765/mcp/files", host="evil.example") == Accept(
        ("files",), True, "mcp"
    )


def test_a_token_file_under_home_may_be_written_with_a_tilde(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(As broker.auditLog; "~/.config/mcpbroker/token" was a file named ~.)"""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "token").write_text("abc\n")  # type: ignore[operator]
    assert policy_for("0.0.0.0", BrokerSettings(token_file="~/token")).token == "abc"


@pytest.mark.parametrize("target", ["http://[/mcp", "//[/mcp", "ws://[::1/mcp"])
def test_a_target_that_does_not_parse_is_refused_not_raised(target: str) -> None:
    """(urlsplit's ValueError went up through the listener: one handshake,
    before any token check, ended the daemon.)"""
    refusal = check(path=target)
    assert isinstance(refusal, Reject) and refusal.status in (400, 403)


@given(st.text(max_size=40))
def test_no_target_raises(target: str) -> None:
    assert isinstance(check(path=target), (Accept, Reject))
