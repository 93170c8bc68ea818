"""What of a server's address is shown (broker/redact.py): no password, no
query value, the rest as it is."""

from __future__ import annotations

import pytest

from broker.redact import shown_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://mcp.example/mcp", "https://mcp.example/mcp"),
        ("http://user:pw@127.0.0.1:8080/mcp", "http://***@127.0.0.1:8080/mcp"),
        ("https://h/mcp?key=k1&tenant=t", "https://h/mcp?key=***&tenant=***"),
        ("https://h/mcp?opaque-key", "https://h/mcp?***"),
        ("wss://a:b@h/ws#x", "wss://***@h/ws"),
        ("http://[::1]:9/mcp", "http://[::1]:9/mcp"),
        ("http://[not a url", "***"),
    ],
)
def test_userinfo_and_query_values_are_masked(url: str, shown: str) -> None:
    assert shown_url(url) == shown


async def test_a_url_no_link_takes_is_named_without_its_secrets() -> None:
    """(_unreachable quoted the url as written: its password and key reached
    status, the log and every client's error.)"""
    from actors.links import launcher_for
    from actors.links.link import LaunchError
    from broker.config import ServerConfig

    launch = launcher_for(ServerConfig(url="gopher://user:hunter2@example.com/mcp?key=SECRET"))
    with pytest.raises(LaunchError) as refused:
        await launch(None)  # type: ignore[arg-type]
    assert "hunter2" not in str(refused.value) and "SECRET" not in str(refused.value)


def test_a_scheme_in_capitals_is_the_same_scheme() -> None:
    """(HTTPS:// fell through to 'cannot reach yet': RFC 3986 3.1.)"""
    from actors.links import launcher_for
    from broker.config import ServerConfig

    launch = launcher_for(ServerConfig(url="HTTPS://example.com/mcp"), "s")
    assert getattr(launch, "func", None).__name__ == "launch_http"  # type: ignore[union-attr]
    assert launch.args[0].url == "https://example.com/mcp"  # type: ignore[attr-defined]
