"""The client side of Streamable HTTP at 2026-07-28, as rules: what the HTTP
link sends a modern server, and how it reads what comes back.

The 2026-07-28 revision of the transport (modelcontextprotocol,
``docs/specification/2026-07-28/basic/transports/streamable-http.mdx``) has
no session: every request is its own POST, answered on that POST (one JSON
object, or an SSE stream of the request's notifications and then its
answer); there is no ``initialize``, no ``Mcp-Session-Id``, no GET stream,
no DELETE, no ``Last-Event-ID``; closing a POST's stream cancels its
request (no ``notifications/cancelled`` is sent on this transport).

A request is the modern revision's while the Upstream says the connection
speaks a modern version (``Speak``, broker/eras/upstream.py: the probe's,
then the server's), never by what its ``_meta`` holds; the Upstream stamps
every request to a modern server with that version (:func:`modern_version`
reads it). Such a POST carries (:func:`modern_headers`):

- ``MCP-Protocol-Version``: the ``_meta`` version (the told one if it names none);
- ``Mcp-Method``: the ``method``;
- ``Mcp-Name``, for ``tools/call``, ``prompts/get`` and ``resources/read``:
  ``params.name`` / ``params.uri``;
- ``Mcp-Param-NAME``, for a ``tools/call``: each argument the tool's
  ``inputSchema`` marks ``x-mcp-header: NAME`` (:class:`ParamHeaders`, learnt
  from the server's ``tools/list`` answers as they pass; the marks are read
  by the listener side's rules, broker/wire/param_headers.py).

Values that are not plain printable ASCII without edge whitespace (or that
look like the sentinel) go as ``=?base64?UTF-8 in base64?=``
(:func:`encode_header_value`, "Value Encoding").

**Answers.** A 2xx is read as a legacy POST's (JSON or SSE). An error status
with a JSON-RPC error in its body is that request's answer (a modern server
answers -32601 with 404, -32602/-32020/-32021/-32022 with 400):
:func:`error_answer`; a ``tools/call`` refused with ``HeaderMismatch`` is
first tried once more, after the link listed the tools again, if the marks
changed (:func:`relist_request`). Anything else fails the request (``Failed``); for the
probe, that means legacy (a legacy server wants a session, or an old
HTTP+SSE server has no such endpoint: 400, 404, 405). An ``initialize``
refused with a *modern* error (:func:`modern_refusal`) is handed up as its
answer instead of falling back to HTTP+SSE (the spec's "Backward
Compatibility": a recognized modern JSON-RPC error means the server speaks
a modern version), so that the Upstream opens the server modern. One
refused with a 4xx and any other JSON-RPC error (the SDK's modern-only
handler answers -32602: no ``_meta``) is asked ``server/discover``; if that
answers a DiscoverResult naming only modern versions
(:func:`only_modern_versions`), the initialize's answer handed up is the
refusal such a server gives per the spec, -32022 naming them
(:func:`modern_only_refusal`); otherwise the refusal is read as before.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import attrs
import orjson

from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    HEADER_MISMATCH,
    LATEST_MODERN_VERSION,
    MODERN_ERROR_CODES,
    MODERN_VERSIONS,
    PROTOCOL_VERSION_KEY,
    UNSUPPORTED_PROTOCOL_VERSION,
)
from broker.jsonrpc import METHOD_NOT_FOUND, Message
from broker.lifecycle import LEGACY_VERSIONS
from broker.wire.http_modern import METHOD_HEADER, NAME_FIELDS, NAME_HEADER
from broker.wire.http_upstream import VERSION_HEADER
from broker.wire.param_headers import annotated_params, is_marked, value_at

PARAM_PREFIX = "mcp-param-"
# Codes by which a refused initialize shows a modern server (no fallback then).
REFUSAL_CODES = MODERN_ERROR_CODES | {METHOD_NOT_FOUND}
MAX_ERROR_BODY = 64 * 1024  # bytes of an error status's body read for its JSON-RPC error
MAX_RELIST_PAGES = 100  # pages of tools/list the link reads after a HeaderMismatch
# Printable ASCII and space (RFC 9110 field values; tab is left to the sentinel).
_SAFE = re.compile(r"[\x20-\x7e]*")
_SENTINEL = re.compile(r"=\?base64\?.*\?=", re.DOTALL)


def modern_version(message: Message) -> str | None:
    """The modern protocol version a request carries in ``params._meta``
    (None: a legacy request, or a notification or answer)."""
    if "id" not in message or "method" not in message:
        return None
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if type(meta) is orjson.Fragment:
        # A _meta kept as bytes: a modern client's the session remembered
        # (broker/eras/metacache.py) or the Upstream's stamp for a legacy
        # one (broker/eras/upstream.py); both only ever of 2026-07-28.
        return LATEST_MODERN_VERSION
    version = meta.get(PROTOCOL_VERSION_KEY) if isinstance(meta, dict) else None
    return version if isinstance(version, str) and version in MODERN_VERSIONS else None


def encode_header_value(value: str) -> str:
    """``value`` as a header carries it: as it is if it is safe, else the
    spec's ``=?base64?...?=`` form (the inverse of the listener's
    ``broker.wire.http_modern.decode_header_value``)."""
    if _SAFE.fullmatch(value) and value == value.strip() and not _SENTINEL.fullmatch(value):
        return value
    return f"=?base64?{base64.b64encode(value.encode('utf-8')).decode('ascii')}?="


@attrs.frozen
class Learnt:
    """A ``tools/list`` answer as the link hands it up, and the tools it
    left out (their ``x-mcp-header`` marks are invalid)."""

    answer: bytes
    dropped: tuple[str, ...] = ()


class ParamHeaders:
    """Which arguments of each tool of a server go in ``Mcp-Param-*`` headers,
    as its ``tools/list`` answers said (a tool with an invalid annotation has
    none: param_headers.py's rule)."""

    def __init__(self) -> None:
        # tool name -> (path of properties, header token) of each marked argument
        self._marked: dict[str, list[tuple[tuple[str, ...], str]]] = {}

    def learn(self, answer: bytes, *, first_page: bool) -> Learnt:
        """A ``tools/list`` answer: its tools' marks replace what was known
        (all of it for a first page, a list asked for without a cursor).

        A tool whose marks are invalid is left out of the answer, as the
        spec asks of a client over Streamable HTTP ("Schema Extension":
        "exclude the invalid tool from the result of ``tools/list``")."""
        try:
            message = orjson.loads(answer)
        except orjson.JSONDecodeError:
            return Learnt(answer)
        result = message.get("result") if isinstance(message, dict) else None
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            return Learnt(answer)
        assert isinstance(result, dict)
        if first_page:
            self._marked.clear()
        kept: list[Any] = []
        dropped: list[str] = []
        for tool in tools:
            name = tool.get("name") if isinstance(tool, dict) else None
            if not isinstance(name, str):
                kept.append(tool)
                continue
            assert isinstance(tool, dict)
            schema = tool.get("inputSchema")
            marks = [(path, token) for path, token, _ in annotated_params(schema)]
            if marks:
                self._marked[name] = marks
            else:
                self._marked.pop(name, None)
                if is_marked(schema):
                    dropped.append(name)
                    continue
            kept.append(tool)
        if not dropped:
            return Learnt(answer)
        result["tools"] = kept
        return Learnt(orjson.dumps(message), tuple(dropped))

    def headers(self, name: Any, arguments: Any) -> dict[str, str]:
        """The ``Mcp-Param-*`` headers of a call of tool ``name``: one per
        marked argument that has a value (``null`` and absent: none)."""
        marks = self._marked.get(name) if isinstance(name, str) else None
        if not marks or not isinstance(arguments, dict):
            return {}
        headers: dict[str, str] = {}
        for path, token in marks:
            rendered = _render(value_at(arguments, path))
            if rendered is not None:
                headers[PARAM_PREFIX + token] = encode_header_value(rendered)
        return headers


def modern_headers(message: Message, version: str, params: ParamHeaders) -> dict[str, str]:
    """The headers that mirror a modern request's body (see the module's text)."""
    method = message["method"]
    headers = {VERSION_HEADER: version, METHOD_HEADER: encode_header_value(str(method))}
    field = NAME_FIELDS.get(method) if isinstance(method, str) else None
    body = message.get("params")
    if field is not None and isinstance(body, dict):
        name = body.get(field)
        if isinstance(name, str):
            headers[NAME_HEADER] = encode_header_value(name)
        if method == "tools/call":
            headers.update(params.headers(name, body.get("arguments")))
    return headers


def is_tools_list_start(message: Message) -> bool:
    """A ``tools/list`` without a cursor: its answer lists a server's tools afresh."""
    if message.get("method") != "tools/list":
        return False
    body = message.get("params")
    return not (isinstance(body, dict) and body.get("cursor") is not None)


def error_answer(body: bytes, request: Any) -> bytes | None:
    """An error status's body, if it holds a JSON-RPC error: that error as
    the answer to ``request`` (the POST's one request: a ``null`` id is
    taken for it); None if it holds none, or the answer to another id."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(message, dict) or not isinstance(message.get("error"), dict):
        return None
    id = message.get("id")
    if id is None:
        message["id"] = request
    elif id != request:
        return None
    return orjson.dumps(message)


def modern_refusal(body: bytes, request: Any) -> bytes | None:
    """An ``initialize`` refused with an error status: its JSON-RPC error if
    that error is one only a modern server gives (so: no HTTP+SSE fallback),
    else None."""
    answer = error_answer(body, request)
    if answer is None:
        return None
    code = orjson.loads(answer)["error"].get("code")
    # The server's code is untrusted: one that is no int (a list is unhashable) is no refusal.
    return answer if isinstance(code, int) and code in REFUSAL_CODES else None


def only_modern_versions(answer: bytes) -> list[str] | None:
    """A ``server/discover`` answer's ``supportedVersions``, if it is a
    DiscoverResult naming only versions of the modern era (none of the
    legacy ones, and at least one); None for anything else (an error, a
    dual-era server's list, something unreadable)."""
    try:
        message = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    result = message.get("result") if isinstance(message, dict) else None
    versions = result.get("supportedVersions") if isinstance(result, dict) else None
    if not isinstance(versions, list) or not versions:
        return None
    if not all(isinstance(v, str) and v not in LEGACY_VERSIONS for v in versions):
        return None
    return versions


def modern_only_refusal(refused: bytes, versions: list[str]) -> bytes:
    """The refusal of ``initialize`` a modern-only server gives (the spec's
    "Backward Compatibility"): -32022 naming ``versions`` in ``data.supported``,
    as the answer ``refused`` (an :func:`error_answer`) was, with its error kept
    in ``data.refused``. What the link hands up for a server that refused the
    initialize otherwise and whose ``server/discover`` named only ``versions``."""
    message = orjson.loads(refused)
    said = message["error"]
    error = {
        "code": UNSUPPORTED_PROTOCOL_VERSION,
        "message": (
            f"initialize was refused ({said.get('code')}: {said.get('message')}) and "
            f"server/discover names only {', '.join(versions)}"
        ),
        "data": {"supported": versions, "refused": said},
    }
    return orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error})


def _render(value: Any) -> str | None:
    """An argument as its header holds it (None: no header): booleans
    ``true``/``false``, integers in decimal, strings as they are."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        try:
            return str(value)
        except ValueError:  # (past Python's digit limit)
            return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return value
    return None


def is_answer(data: bytes) -> bool:
    """Whether a message on a modern POST's stream is an answer (its last),
    not a notification: cheap for the usual ones, parsed when in doubt."""
    if data.find(b'"method"') < 0:  # (not `in`: see broker/jsonrpc.py LONG)
        return True
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        return True  # (not readable: the rules say what is wrong with it; nothing follows)
    return not isinstance(message, dict) or "method" not in message


def is_header_mismatch(answer: bytes) -> bool:
    """Whether an answer is the server's ``HeaderMismatch`` (-32020)."""
    try:
        message = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return False
    error = message.get("error") if isinstance(message, dict) else None
    return isinstance(error, dict) and error.get("code") == HEADER_MISMATCH


def relist_request(call: Message, id: str, cursor: str | None) -> Message:
    """The link's own ``tools/list`` after a call met ``HeaderMismatch`` (the
    spec: "call tools/list to check for changes to the tool's inputSchema,
    then retry"), stamped as the call was: its version, client info and
    capabilities."""
    meta = call["params"]["_meta"]
    kept = (PROTOCOL_VERSION_KEY, CLIENT_INFO_KEY, CLIENT_CAPABILITIES_KEY)
    params: dict[str, Any] = {"_meta": {key: meta[key] for key in kept if key in meta}}
    if cursor is not None:
        params["cursor"] = cursor
    return {"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params}


def next_cursor(answer: bytes) -> str | None:
    """A ``tools/list`` page's ``nextCursor`` (None: the last page, or no list)."""
    try:
        message = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    result = message.get("result") if isinstance(message, dict) else None
    cursor = result.get("nextCursor") if isinstance(result, dict) else None
    return cursor if isinstance(cursor, str) else None
