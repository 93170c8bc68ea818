"""Which era an upstream server speaks: the ``server/discover`` probe, decided.

The broker, as a dual-era client, opens a server connection with
``server/discover`` at the newest modern version (the spec's stdio
"Backward Compatibility"). :func:`read_probe_answer` decides from the
answer; the Upstream actor owns the clock, and a probe that times out is
:data:`TIMED_OUT` (legacy):

- a ``DiscoverResult`` naming a modern version the broker speaks: modern;
- a ``DiscoverResult`` naming only legacy versions: legacy (the server
  answers discover but advertises the handshake; the SDK does the same);
- -32022 naming a modern version the broker speaks: probe once more at it;
  naming legacy versions only, or nothing usable: legacy;
  naming only modern versions the broker does not speak: incompatible;
- any other error, or anything unreadable: legacy. The fallback is never
  keyed to one error code (legacy servers answer -32601, -32602, or
  nothing at all).
"""

from __future__ import annotations

from typing import Any

import attrs

from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LATEST_MODERN_VERSION,
    MODERN_VERSIONS,
    PROTOCOL_VERSION_KEY,
    SERVER_INFO_KEY,
    UNSUPPORTED_PROTOCOL_VERSION,
)
from broker.jsonrpc import Message, RequestId
from broker.lifecycle import (
    BROKER_CLIENT_CAPABILITIES,
    BROKER_CLIENT_INFO,
    LEGACY_VERSIONS,
    ServerIdentity,
    identity_of,
)


@attrs.frozen
class Modern:
    """The server is modern: every request goes to it at ``identity.protocol_version``."""

    identity: ServerIdentity


@attrs.frozen
class Legacy:
    """The server is legacy: open it with ``initialize`` (``reason``: for the log)."""

    reason: str


@attrs.frozen
class Reprobe:
    """The server is modern but not at the version probed: probe again at ``version``."""

    version: str


@attrs.frozen
class Incompatible:
    """The server speaks only modern versions the broker does not: it cannot be used."""

    message: str


Verdict = Modern | Legacy | Reprobe | Incompatible
TIMED_OUT = Legacy("no answer to server/discover in time")


def discover_request(id: RequestId, version: str = LATEST_MODERN_VERSION) -> Message:
    """The broker's probe: ``server/discover`` with the modern ``_meta``."""
    return {
        "jsonrpc": "2.0",
        "id": id,
        "method": "server/discover",
        "params": {
            "_meta": {
                PROTOCOL_VERSION_KEY: version,
                CLIENT_INFO_KEY: BROKER_CLIENT_INFO,
                CLIENT_CAPABILITIES_KEY: BROKER_CLIENT_CAPABILITIES,
            }
        },
    }


def read_probe_answer(response: Message, *, first: bool = True) -> Verdict:
    """The era the server's answer to the probe shows (``first``: the first probe)."""
    if "error" in response:
        return _read_error(response["error"], first)
    result = response.get("result")
    if not isinstance(result, dict) or not isinstance(result.get("supportedVersions"), list):
        return Legacy("server/discover answered with something other than a DiscoverResult")
    mutual = [v for v in MODERN_VERSIONS if v in result["supportedVersions"]]
    if not mutual:
        return Legacy("server/discover names no modern version")
    return Modern(_identity(mutual[-1], result))


def _read_error(error: Any, first: bool) -> Verdict:
    code = error.get("code") if isinstance(error, dict) else None
    if code != UNSUPPORTED_PROTOCOL_VERSION:
        return Legacy(f"server/discover refused with code {code!r}")
    data = error.get("data")
    supported = data.get("supported") if isinstance(data, dict) else None
    if not isinstance(supported, list):
        return Legacy("-32022 without a list of supported versions")
    mutual = [v for v in MODERN_VERSIONS if v in supported]
    if mutual and first:
        return Reprobe(mutual[-1])
    if any(v in LEGACY_VERSIONS for v in supported) or not supported:
        return Legacy("the server names legacy versions only")
    return Incompatible(
        f"the server speaks only {', '.join(map(str, supported))}; "
        f"the broker speaks {', '.join(MODERN_VERSIONS)} and the legacy versions"
    )


def modern_only(response: Message) -> str | None:
    """A server's refusal of ``initialize`` that names only modern versions
    (-32022 with ``data.supported``: a 2026-07-28-only server, as the spec's
    "Backward Compatibility" has it): the newest of them the broker speaks,
    to probe at; None for any other answer."""
    error = response.get("error")
    if not isinstance(error, dict) or error.get("code") != UNSUPPORTED_PROTOCOL_VERSION:
        return None
    data = error.get("data")
    supported = data.get("supported") if isinstance(data, dict) else None
    if not isinstance(supported, list) or any(v in LEGACY_VERSIONS for v in supported):
        return None
    mutual = [v for v in MODERN_VERSIONS if v in supported]
    return mutual[-1] if mutual else None


def _identity(version: str, result: dict[str, Any]) -> ServerIdentity:
    meta = result.get("_meta")
    info = meta.get(SERVER_INFO_KEY) if isinstance(meta, dict) else None
    return identity_of(version, result, info)
