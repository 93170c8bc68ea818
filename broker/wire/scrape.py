"""The metrics endpoint's rules (``mcpbroker serve --metrics``), sans-I/O.

One resource, ``/metrics``, read with ``GET`` (or ``HEAD``). Who may read it
is decided as for a WebSocket client (broker/wire/websocket.py
``check_access``): a loopback ``Host`` (or one in ``broker.allowedHosts``),
no browser ``Origin`` but the allowed ones, and the bearer token when one is
configured (required off loopback). The figures say what runs and how much,
never what was said, but a web page still has no business reading them.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from broker.wire.websocket import Policy, Reject, check_access, fields_of

PATH = "/metrics"
METHODS = ("GET", "HEAD")


def check_scrape(
    method: str, target: str, host: str, headers: Sequence[tuple[bytes, bytes]], policy: Policy
) -> Reject | None:
    """What to refuse a scrape with (None: answer it): ``target`` is the
    request's target, ``host`` its Host field, ``headers`` every field."""
    refused = check_access(host, fields_of(headers), policy)
    if refused is not None:
        return refused
    if urlsplit(target).path != PATH:
        return Reject(404, f"Not found: the metrics are at {PATH}")
    if method not in METHODS:
        return Reject(405, f"Method {method} not allowed", (("Allow", ", ".join(METHODS)),))
    return None
