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
