"""Streamable HTTP for 2026-07-28 clients: the rules of one POST, sans-I/O.

The modern revision of the transport (``docs/specification/2026-07-28/basic/
transports/streamable-http.mdx``) has no session: every JSON-RPC request is
its own POST, answered on that POST (one JSON object, or an SSE stream
carrying the request's notifications and then its answer), and closing that
stream cancels the request. There is no GET stream, no DELETE, no
``Mcp-Session-Id`` and no ``Last-Event-ID``.

What a POST must carry, checked here before the broker does anything with it
(the order is the official SDK's, so both answer a bad request alike):

1. a body of one JSON-RPC request or notification (a batch, or a response,
   is 400 with -32600; unreadable JSON -32700), at an ``MCP-Protocol-Version``
   the broker knows (else -32022, 400, naming every version it speaks);
2. ``params._meta`` with the protocol version and the client's capabilities
   (else -32602, 400);
3. the headers mirroring the body: ``MCP-Protocol-Version`` equal to the
   ``_meta`` version, ``Mcp-Method`` equal to ``method``, and for
   ``tools/call``, ``prompts/get`` and ``resources/read`` ``Mcp-Name`` equal
   to ``params.name`` / ``params.uri`` (after the ``=?base64?...?=`` sentinel
   is decoded); a missing, repeated or different one is ``HeaderMismatch``
   (-32020, 400);
4. a version the broker serves in this era (else -32022, 400, naming every
   version it speaks, so that a dual-era client falls back to ``initialize``:
   the header is checked first, then, once it matches, the body's);
5. a method the broker serves to modern clients (else -32601, 404).

A notification POST is accepted (202) and dropped: the revision defines no
client notification on this transport (cancellation is closing the stream).
:func:`status_of` is the HTTP status of a JSON-RPC error answered as JSON
(the same table as the SDK's server). Who may connect at all (Host, Origin,
token) and which view a path names are decided as for legacy requests
(broker/wire/http.py, ``check_request``).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from typing import Any

import attrs

from broker import jsonrpc
from broker.eras.session import MODERN_ROUTED
from broker.eras.tokens import is_ours
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    HEADER_MISMATCH,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    MODERN_VERSIONS,
    PROTOCOL_VERSION_KEY,
    UNSUPPORTED_PROTOCOL_VERSION,
    unsupported_version,
)
from broker.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    JsonRpcError,
    Kind,
    RequestId,
    id_key,
)
from broker.session import LIST_METHODS
from broker.wire.http import VERSION_HEADER, Refuse, choose_mode

METHOD_HEADER = "mcp-method"
NAME_HEADER = "mcp-name"
ROUTING_HEADERS = frozenset({VERSION_HEADER, METHOD_HEADER, NAME_HEADER})
# The body field each name-bearing method mirrors in Mcp-Name.
NAME_FIELDS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
# What the broker serves a modern client (not the legacy methods 2026-07-28 removed).
METHODS = frozenset({"server/discover", "subscriptions/listen", *LIST_METHODS, *MODERN_ROUTED})
LISTEN = "subscriptions/listen"
ALLOW = "POST"  # the only verb of this revision (GET and DELETE: 405)
# The HTTP status of a JSON-RPC error answered as JSON; any other code is 200.
STATUS_OF_CODE = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    MISSING_REQUIRED_CLIENT_CAPABILITY: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}
_SENTINEL = re.compile(r"=\?base64\?(.*)\?=", re.DOTALL)


def status_of(code: int) -> int:
    return STATUS_OF_CODE.get(code, 200)


def answer_mode(fields: dict[str, str], method: str) -> bool | Refuse:
    """How to answer a modern POST (``choose_mode``: True for an SSE stream,
    False for one JSON answer, or 406); ``subscriptions/listen`` is a stream
    or nothing, so a client that takes only JSON gets 406 for it."""
    mode = choose_mode(fields)
    if mode is False and method == LISTEN:
        return Refuse(406, "Not Acceptable: subscriptions/listen is a text/event-stream")
    return mode


def wrong_verb(method: str, header: str | None = MODERN_VERSIONS[-1]) -> Refuse:
    """GET and DELETE (and any other verb) at a modern version: 405, as the spec
    asks of a server of this revision (there is no GET stream, no session).
    At an ``MCP-Protocol-Version`` (``header``) the broker does not know at
    all, 400 with -32022 as for a POST (the spec's MUST for any request): a
    405 tells a legacy client it has no GET stream, for a typo in a header."""
    if header not in MODERN_VERSIONS:
        return _refuse(unsupported_version(header))
    return Refuse(
        405,
        f"Method {method} not allowed: a 2026-07-28 client only POSTs (no GET stream, no sessions)",
        (("Allow", ALLOW),),
    )


@attrs.frozen
class ModernPost:
    """A POST that passed every rule: its request (None for a notification)."""

    message: dict[str, Any]
    request: bool

    @property
    def id(self) -> RequestId:
        id: RequestId = self.message["id"]
        return id

    @property
    def method(self) -> str:
        method: str = self.message["method"]
        return method

    @property
    def request_state(self) -> str | None:
        """The ``requestState`` a retry carries (its earlier answer's), if any."""
        params = self.message.get("params")
        state = params.get("requestState") if isinstance(params, dict) else None
        return state if isinstance(state, str) else None


def read_post(
    body: bytes, fields: dict[str, str], headers: Sequence[tuple[bytes, bytes]]
) -> ModernPost | Refuse:
    """Check a modern POST (its ``body``, its ``fields`` by lower-case name and
    its raw ``headers``) by the rules of the module's docstring."""
    try:
        message = jsonrpc.decode(body)
    except JsonRpcError as exc:
        return _refuse(exc)
    if type(message) is list:
        return _refuse(JsonRpcError(INVALID_REQUEST, "Invalid Request: no batches in 2026-07-28"))
    try:
        kind = jsonrpc.classify(message)
    except JsonRpcError as exc:
        return _refuse(exc)
    header = fields.get(VERSION_HEADER)
    if header not in MODERN_VERSIONS:  # (one the broker does not know at all)
        refused = unsupported_version(header)
        refused.id = message.get("id") if kind is Kind.REQUEST else None
        return _refuse(refused)
    if kind is Kind.NOTIFICATION:
        return ModernPost(message, False)
    too_long = jsonrpc.long_id(message.get("id"))
    if too_long is not None:  # (no answer could be matched to it: refused here)
        return _refuse(too_long)
    if kind is not Kind.REQUEST:
        return _refuse(
            JsonRpcError(INVALID_REQUEST, "Invalid Request: a 2026-07-28 client POSTs no responses")
        )
    try:
        check_request(message, fields, headers)
    except JsonRpcError as exc:
        exc.id = message["id"]
        return _refuse(exc)
    return ModernPost(message, True)


def check_request(
    message: dict[str, Any], fields: dict[str, str], headers: Sequence[tuple[bytes, bytes]]
) -> None:
    """Rules 2 to 5 for a request (raises the JsonRpcError to answer)."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or not isinstance(params, dict):
        raise JsonRpcError(
            INVALID_PARAMS,
            f"Invalid params: a 2026-07-28 request needs params._meta with "
            f"{PROTOCOL_VERSION_KEY!r} and {CLIENT_CAPABILITIES_KEY!r}",
        )
    missing = [key for key in (PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY) if key not in meta]
    if missing:
        raise JsonRpcError(INVALID_PARAMS, f"Invalid params: _meta lacks {', '.join(missing)}")
    repeated = repeated_header(headers)
    if repeated is not None:
        raise mismatch(f"the {repeated} header is sent more than once")
    version = meta[PROTOCOL_VERSION_KEY]
    if fields.get(VERSION_HEADER) != version:
        raise mismatch(
            f"MCP-Protocol-Version header {fields.get(VERSION_HEADER)!r} does not match "
            f"the body's {PROTOCOL_VERSION_KEY} {version!r}"
        )
    method = message["method"]
    if fields.get(METHOD_HEADER) != method:
        shown = fields.get(METHOD_HEADER)
        raise mismatch(f"Mcp-Method header {shown!r} does not match the body's method {method!r}")
    field = NAME_FIELDS.get(method)
    if field is not None:
        wanted = params.get(field)
        raw = fields.get(NAME_HEADER)
        if raw is None:
            raise mismatch(f"{method} needs an Mcp-Name header (the body's params.{field})")
        named = decode_header_value(raw)
        if named is None:
            raise mismatch(f"Mcp-Name header {raw!r} is not valid base64 of UTF-8")
        if named != wanted:
            raise mismatch(
                f"Mcp-Name header {named!r} does not match the body's params.{field} {wanted!r}"
            )
    if version not in MODERN_VERSIONS:
        raise unsupported_version(version)
    if method not in METHODS:
        raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}")


def mismatch(why: str) -> JsonRpcError:
    return JsonRpcError(HEADER_MISMATCH, f"Header mismatch: {why}")


def repeated_header(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """A routing header sent more than once (readers of the first copy and of
    the last would disagree), or None."""
    seen: set[str] = set()
    for name, _ in headers:
        key = name.decode("latin-1").lower()
        if key in ROUTING_HEADERS:
            if key in seen:
                return key
            seen.add(key)
    return None


def decode_header_value(value: str) -> str | None:
    """A header value as the body would hold it: as it is, or decoded from the
    spec's ``=?base64?...?=`` sentinel (UTF-8); None if the sentinel is malformed
    (non-canonical base64 included: it must never match by accident)."""
    found = _SENTINEL.fullmatch(value)
    if found is None:
        return value
    payload = found.group(1)
    try:
        decoded = base64.b64decode(payload, validate=True)
        if base64.b64encode(decoded).decode("ascii") != payload:
            return None
        return decoded.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def parked_token(answer: dict[str, Any] | None) -> str | None:
    """The broker's ``requestState`` of an ``input_required`` answer, if it is
    one: the call is parked for the client's retry (a new POST)."""
    state = retry_state(answer)
    return state if is_ours(state) else None


def retry_state(answer: dict[str, Any] | None) -> str | None:
    """The ``requestState`` of an ``input_required`` answer (the broker's or
    a 2026-07-28 server's), if it is one: the client's retry will carry it."""
    result = answer.get("result") if answer is not None else None
    if not isinstance(result, dict) or result.get("resultType") != "input_required":
        return None
    state = result.get("requestState")
    return state if isinstance(state, str) else None


def answers(message: Any, wanted: tuple[type, Any]) -> bool:
    """Whether ``message`` is the answer to the request whose ``id_key`` is
    ``wanted``: in its id, or an error with id null that names it in its
    ``data`` (the session's refusal of an id in use, docs/protocol.md: the
    POST that carried it ends with it, where it waited for an answer in an
    id nothing would answer)."""
    if type(message) is not dict or "method" in message:
        return False
    id = message.get("id")
    if id is None:
        error = message.get("error")
        data = error.get("data") if isinstance(error, dict) else None
        id = data.get("id") if isinstance(data, dict) else None
    return jsonrpc.is_valid_id(id) and id_key(id) == wanted


def _refuse(error: JsonRpcError) -> Refuse:
    status = status_of(error.code)
    return Refuse(status, error.message, code=error.code, id=error.id, data=error.data)
