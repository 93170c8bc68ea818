"""What of a server's address may be shown: in logs, ``mcpbroker status``
and the errors clients (and so models) read.

A url server's address may carry secrets: a password in its userinfo
(``https://user:pw@host/mcp``) or an API key in its query
(``?key=...``), a common way to configure remote MCP servers. They are
masked wherever the address is shown; the host, port and path, which say
which server it is, stay. docs/security.md.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

MASK = "***"


def shown_url(url: str) -> str:
    """``url`` with its userinfo and the values of its query masked, and no
    fragment (``http://***@host/mcp?key=***``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{field.partition('=')[0]}={MASK}" if "=" in field else MASK
        for field in parts.query.split("&")
        if field
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
