"""The MCP lifecycle, legacy era: versions, ``initialize`` on both sides.

Downstream, the broker is the server: it answers ``initialize`` itself,
negotiating the protocol version as the spec says (the client's version if the
broker speaks it, else the newest the broker speaks). Upstream, the broker is
the client: :func:`initialize_request` opens the handshake with a server and
:func:`read_initialize_result` checks the answer.
"""

from __future__ import annotations

from typing import Any

import attrs

from broker.jsonrpc import INVALID_PARAMS, JsonRpcError, Message, RequestId

# Oldest first. The legacy era opens every session with ``initialize``.
LEGACY_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_LEGACY_VERSION = LEGACY_VERSIONS[-1]
BATCH_VERSIONS = frozenset({"2025-03-26"})

BROKER_NAME = "mcpbroker"
# What the broker offers servers as their client: it routes each of these to a
# session that declared it, or answers with an error when none did.
BROKER_CLIENT_CAPABILITIES = {
    "roots": {"listChanged": True},
    "sampling": {},
    "elicitation": {"form": {}, "url": {}},
}
BROKER_VERSION = "0.1.0"
# What the broker calls itself as servers' client (never changed: shared).
BROKER_CLIENT_INFO = {"name": BROKER_NAME, "version": BROKER_VERSION}


@attrs.frozen
class ServerIdentity:
    """What an upstream server said about itself in its ``initialize`` result."""

    protocol_version: str
    capabilities: dict[str, Any]
    server_info: dict[str, Any]
    instructions: str | None = None

    @property
    def modern(self) -> bool:
        """The server speaks the 2026-07-28 era on this connection (its
        version is not a legacy one: it came from ``server/discover``)."""
        return self.protocol_version not in LEGACY_VERSIONS


def negotiate_version(requested: Any) -> str:
    """The version the broker answers a client's ``initialize`` with."""
    if isinstance(requested, str) and requested in LEGACY_VERSIONS:
        return requested
    return LATEST_LEGACY_VERSION


def read_client_initialize(params: dict[str, Any] | None) -> tuple[str, dict[str, Any], Any]:
    """Check a client's ``initialize`` params: (requested version, capabilities, info)."""
    if not params or not isinstance(params.get("protocolVersion"), str):
        raise JsonRpcError(INVALID_PARAMS, "initialize needs params.protocolVersion (a string)")
    capabilities = params.get("capabilities", {})
    if not isinstance(capabilities, dict):
        raise JsonRpcError(INVALID_PARAMS, "initialize params.capabilities must be an object")
    return params["protocolVersion"], capabilities, params.get("clientInfo")


def initialize_result(
    version: str,
    capabilities: dict[str, Any],
    server_info: dict[str, Any],
    instructions: str | None,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": server_info,
    }
    if instructions:
        result["instructions"] = instructions
    return result


def broker_server_info() -> dict[str, Any]:
    return {"name": BROKER_NAME, "version": BROKER_VERSION}


def initialize_request(id: RequestId) -> Message:
    """The broker's own ``initialize``, sent once to each upstream server."""
    return {
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": LATEST_LEGACY_VERSION,
            "capabilities": BROKER_CLIENT_CAPABILITIES,
            "clientInfo": BROKER_CLIENT_INFO,
        },
    }


class HandshakeError(Exception):
    """An upstream server's answer to ``initialize`` that the broker cannot use."""


def read_initialize_result(response: Message) -> ServerIdentity:
    if "error" in response:
        error = response["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise HandshakeError(f"server refused initialize: {message}")
    result = response.get("result")
    if not isinstance(result, dict):
        raise HandshakeError("initialize result is not an object")
    version = result.get("protocolVersion")
    if version not in LEGACY_VERSIONS:
        raise HandshakeError(f"server answered with unsupported protocol version {version!r}")
    return identity_of(version, result, result.get("serverInfo"))


def identity_of(version: str, result: dict[str, Any], server_info: Any) -> ServerIdentity:
    """A server's identity from the result it said it in (``initialize``, or
    ``server/discover``), each field taken only if it has the right type."""
    capabilities = result.get("capabilities")
    instructions = result.get("instructions")
    return ServerIdentity(
        protocol_version=version,
        capabilities=capabilities if isinstance(capabilities, dict) else {},
        server_info=server_info if isinstance(server_info, dict) else {},
        instructions=instructions if isinstance(instructions, str) else None,
    )
