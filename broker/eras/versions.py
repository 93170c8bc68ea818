"""The two eras of MCP: which versions the broker speaks, and what each one is.

Legacy versions (2024-11-05 .. 2025-11-25) open a session with ``initialize``
(broker/lifecycle.py). The modern version (2026-07-28) has no handshake:
every request says its version and the client's capabilities in ``_meta``
under the keys below, and a server that cannot serve that version answers
``UnsupportedProtocolVersion`` (-32022) naming the versions it can.

The broker speaks every version listed here on both sides, so these are
exactly what it advertises: in ``server/discover``'s ``supportedVersions``
and in a -32022 error's ``data.supported``.
"""

from __future__ import annotations

import enum
from typing import Any

from broker.jsonrpc import JsonRpcError
from broker.lifecycle import LEGACY_VERSIONS

MODERN_VERSIONS = ("2026-07-28",)
LATEST_MODERN_VERSION = MODERN_VERSIONS[-1]
# Oldest first, every version of both eras.
SUPPORTED_VERSIONS = (*LEGACY_VERSIONS, *MODERN_VERSIONS)

# The reserved ``_meta`` keys of the modern era (schema/2026-07-28, RequestMetaObject).
PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
LOG_LEVEL_KEY = "io.modelcontextprotocol/logLevel"
SUBSCRIPTION_ID_KEY = "io.modelcontextprotocol/subscriptionId"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"

# The error codes the modern era defines (the -32020 .. -32099 range is the spec's).
HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022
MODERN_ERROR_CODES = frozenset(
    {HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY, UNSUPPORTED_PROTOCOL_VERSION}
)


class Era(enum.Enum):
    LEGACY = "legacy"  # a session opened by initialize
    MODERN = "modern"  # no handshake: every request carries its version


def era_of(version: Any) -> Era | None:
    """The era of a protocol version the broker speaks; None for any other."""
    if version in MODERN_VERSIONS:
        return Era.MODERN
    if version in LEGACY_VERSIONS:
        return Era.LEGACY
    return None


def negotiate_modern(requested: Any) -> str:
    """The version a modern request is served at: the one it asked for, if the
    broker speaks it in that era; else :func:`unsupported_version` is raised."""
    if isinstance(requested, str) and requested in MODERN_VERSIONS:
        return requested
    raise unsupported_version(requested)


def unsupported_version(requested: Any) -> JsonRpcError:
    """The -32022 error for a request at a version the broker does not serve.

    ``supported`` lists every version the broker speaks, legacy ones
    included: a dual-era client reads a legacy version there as "use
    initialize" (the spec's compatibility matrix)."""
    shown = requested if isinstance(requested, str) else repr(requested)
    return JsonRpcError(
        UNSUPPORTED_PROTOCOL_VERSION,
        f"Unsupported protocol version: {shown}",
        data={"supported": list(SUPPORTED_VERSIONS), "requested": shown},
    )


def missing_capability(required: dict[str, Any], why: str) -> JsonRpcError:
    """The -32021 error: serving the request needs capabilities the client lacks."""
    return JsonRpcError(
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        f"Missing required client capability: {why}",
        data={"requiredCapabilities": required},
    )
