"""The optional first-line hello and the view it selects."""

from __future__ import annotations

from typing import Any

import pytest

from broker.hello import Hello, HelloError, Opening, open_session, read_hello, resolve_view

CONFIGURED = ("github", "files", "db")


def hello(body: Any) -> dict[str, Any]:
    return {"mcpbroker": body}


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize"},
        {"jsonrpc": "2.0", "mcpbroker": {"servers": ["files"]}},
        {"other": 1},
        [hello({})],
        "mcpbroker",
        None,
    ],
)
def test_plain_mcp_is_not_a_hello(message: Any) -> None:
    assert read_hello(message) is None


def test_hello_with_servers() -> None:
    assert read_hello(hello({"servers": ["files", "db"]})) == Hello(("files", "db"))


def test_hello_servers_deduplicated_in_order() -> None:
    assert read_hello(hello({"servers": ["db", "files", "db"]})) == Hello(("db", "files"))


@pytest.mark.parametrize("body", [{}, {"servers": None}, {"future": True}])
def test_hello_without_servers_means_all(body: dict[str, Any]) -> None:
    assert read_hello(hello(body)) == Hello(None)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (["files"], "must be an object"),
        ("files", "must be an object"),
        ({"servers": "files"}, "list of server names"),
        ({"servers": ["files", 1]}, "list of server names"),
        ({"command": ["status"]}, "unknown command"),
        ({"command": {"status": 1}}, "unknown command"),
    ],
)
def test_bad_hello(body: Any, fragment: str) -> None:
    with pytest.raises(HelloError, match=fragment):
        read_hello(hello(body))


def test_no_hello_sees_every_server() -> None:
    assert resolve_view(None, CONFIGURED) == CONFIGURED
    assert resolve_view(Hello(), iter(CONFIGURED)) == CONFIGURED


def test_named_servers_in_the_order_named() -> None:
    assert resolve_view(Hello(("db", "github")), CONFIGURED) == ("db", "github")


def test_empty_server_list() -> None:
    assert resolve_view(Hello(()), CONFIGURED) == ()


def test_unknown_servers() -> None:
    with pytest.raises(HelloError) as info:
        resolve_view(Hello(("files", "nope", "gone")), CONFIGURED)
    message = str(info.value)
    assert "'nope', 'gone'" in message
    assert "github, files, db" in message
    assert "'files'" not in message
    # (marked as for good: the resuming shim ends on it, and on no other
    # error, such as a server still starting: cli/reconnect.py)
    assert info.value.data == {"unknown": ["nope", "gone"], "retryable": False}
    refused = open_session({"mcpbroker": {"servers": ["nope"]}}, CONFIGURED)
    assert refused is not None and refused.refusal_data == {"unknown": ["nope"], "retryable": False}


def test_unknown_server_with_nothing_configured() -> None:
    with pytest.raises(HelloError, match=r"configured servers: none"):
        resolve_view(Hello(("files",)), ())


def test_naming_exactly_one_server_asks_for_it_transparently() -> None:
    assert Hello(("a",)).transparent
    assert not Hello(("a", "b")).transparent
    assert not Hello().transparent  # every server: aggregated, however many there are


def test_a_view_of_every_server_is_marked_so_a_reload_can_grow_it() -> None:
    configured = ("a", "b")
    assert open_session({"mcpbroker": {}}, configured) == Opening(("a", "b"), every=True)
    assert open_session({"mcpbroker": {"servers": ["a", "b"]}}, configured) == Opening(("a", "b"))
    assert open_session({"mcpbroker": {"command": "reload"}}, configured) == Opening(
        command="reload"
    )


def test_the_tokens_command_names_its_servers() -> None:
    """`mcpbroker auth NAME` tells a running daemon that NAME's tokens changed."""
    opening = open_session({"mcpbroker": {"command": "tokens", "servers": ["a"]}}, ("a", "b"))
    assert opening == Opening(("a",), command="tokens")
    refused = open_session({"mcpbroker": {"command": "tokens", "servers": "a"}}, ("a",))
    assert refused is not None and "list of server names" in (refused.refusal or "")


def test_a_hello_names_the_notices_its_client_understands() -> None:
    configured = ("a", "b")
    asked = open_session({"mcpbroker": {"notices": ["stopping", "later"]}}, configured)
    assert asked == Opening(("a", "b"), every=True, notices=frozenset({"stopping"}))
    plain = open_session({"mcpbroker": {"servers": ["a"]}}, configured)
    assert plain is not None and plain.notices == frozenset()
    refused = open_session({"mcpbroker": {"notices": "stopping"}}, configured)
    assert refused is not None and "list of names" in (refused.refusal or "")
    assert read_hello({"mcpbroker": {"notices": [], "later": 1}}) == Hello()
