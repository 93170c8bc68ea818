"""``Mcp-Param-*`` headers of a 2026-07-28 ``tools/call``, checked against its arguments.

A tool may mark parameters of its ``inputSchema`` with ``x-mcp-header: NAME``
(``server/tools``, "x-mcp-header"); a client over Streamable HTTP then
mirrors each such argument into ``Mcp-Param-NAME`` (booleans as
``true``/``false``, numbers in decimal, any value that is not plain ASCII in
the ``=?base64?...?=`` form), so that intermediaries can route on them. A
server that reads the body must check that they agree
(``basic/transports/streamable-http``, "Server Behavior for Custom Headers"):
present together and equal, or absent together (``null`` counts as absent);
otherwise ``HeaderMismatch`` (-32020, 400).

An annotation counts only on a property reached from the schema's root
through ``properties`` keys alone, of type string, integer or boolean, its
name an HTTP token, unique ignoring case. A schema with any other annotation
is invalid, and conforming clients drop such a tool and send no headers for
it: nothing is checked then (as the SDK's server does). An integer compares
by value (``42`` and ``42.0``); anything else as the text the client renders.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from broker.catalog import TOOLS, Catalog
from broker.jsonrpc import JsonRpcError
from broker.wire.http_modern import decode_header_value, mismatch

ANNOTATION = "x-mcp-header"
PREFIX = "mcp-param-"
TYPES = frozenset({"string", "integer", "boolean"})
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")
# JSON Schema applicators whose values are schemas: past them a property is no
# longer reached through ``properties`` alone (``$ref`` is not followed).
_ONE = frozenset(
    {
        "items",
        "contains",
        "unevaluatedItems",
        "additionalProperties",
        "propertyNames",
        "unevaluatedProperties",
        "not",
        "if",
        "then",
        "else",
        "contentSchema",
    }
)
_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_MAP = frozenset({"patternProperties", "dependentSchemas", "$defs", "definitions"})


def tool_schema(catalog: Catalog, view: tuple[str, ...], transparent: bool, name: Any) -> Any:
    """The ``inputSchema`` of the tool a view calls ``name`` (None: no such tool,
    which the session answers itself)."""
    if not isinstance(name, str):
        return None
    if transparent:
        server, own = view[0], name
    else:
        try:
            server, own = catalog.route_named(TOOLS, view, name)
        except JsonRpcError:
            return None
    for tool in catalog.entry(server).items(TOOLS):
        if tool.get("name") == own:
            return tool.get("inputSchema")
    return None


def check(schema: Any, arguments: Any, headers: Sequence[tuple[bytes, bytes]]) -> None:
    """Raise ``HeaderMismatch`` unless the request's ``Mcp-Param-*`` headers
    agree with its ``arguments`` as ``schema`` annotates them."""
    annotated = annotated_params(schema)
    if not annotated:
        return
    values: dict[str, list[str]] = {}
    for raw_name, raw_value in headers:
        key = raw_name.decode("latin-1").lower()
        if key.startswith(PREFIX):
            values.setdefault(key, []).append(raw_value.decode("latin-1").strip())
    arguments = arguments if isinstance(arguments, dict) else {}
    for path, token, kind in annotated:
        header = f"Mcp-Param-{token}"
        sent = values.get(PREFIX + token.lower())
        value = value_at(arguments, path)
        where = ".".join(path)
        if sent is not None and len(sent) > 1:
            raise mismatch(f"{header} is sent more than once")
        rendered = _render(value)
        if rendered is None:
            if sent is not None:
                raise mismatch(f"{header} is sent but argument {where!r} has no such value")
            continue
        if sent is None:
            raise mismatch(f"{header} is missing for argument {where!r}")
        decoded = decode_header_value(sent[0])
        if decoded is None:
            raise mismatch(f"{header} is not valid base64 of UTF-8")
        if not _same(kind, value, rendered, decoded):
            raise mismatch(f"{header} {decoded!r} does not match argument {where!r}")


def annotated_params(schema: Any) -> list[tuple[tuple[str, ...], str, str]]:
    """``(path, header name, type)`` of each annotated property; none at all
    if any annotation of the schema is invalid (the tool is then not one a
    conforming client sends headers for)."""
    found: list[tuple[tuple[str, ...], str, str]] = []
    seen: set[str] = set()
    for path, node in _positions(schema):
        if ANNOTATION not in node:
            continue
        token, kind = node[ANNOTATION], node.get("type")
        valid = (
            bool(path)
            and isinstance(token, str)
            and _TOKEN.fullmatch(token) is not None
            and isinstance(kind, str)
            and kind in TYPES
            and token.lower() not in seen
        )
        if not valid or path is None or not isinstance(token, str) or not isinstance(kind, str):
            return []
        seen.add(token.lower())
        found.append((path, token, kind))
    return found


def is_marked(schema: Any) -> bool:
    """Whether any schema position of ``schema`` has an ``x-mcp-header``
    (with :func:`annotated_params` empty: the marks are invalid)."""
    return any(ANNOTATION in node for _, node in _positions(schema))


def _positions(root: Any) -> Iterator[tuple[tuple[str, ...] | None, dict[str, Any]]]:
    """Every schema position under ``root``, with its ``properties`` path (None
    once an applicator other than ``properties`` was crossed)."""
    stack: list[tuple[tuple[str, ...] | None, Any]] = [((), root)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield path, node
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                for name, sub in value.items():
                    stack.append(((*path, name) if path is not None else None, sub))
            elif key in _ONE:
                stack.append((None, value))
            elif key in _LIST and isinstance(value, list):
                stack.extend((None, sub) for sub in value)
            elif key in _MAP and isinstance(value, dict):
                stack.extend((None, sub) for sub in value.values())


def value_at(arguments: dict[str, Any], path: tuple[str, ...]) -> Any:
    """The argument at ``path`` (an ``x-mcp-header`` mark's place), or None."""
    node: Any = arguments
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _render(value: Any) -> str | None:
    """An argument as a client writes it in its header (None: it writes none)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        try:
            return str(value)
        except ValueError:  # (an int past Python's digit limit)
            return None
    return None


def _same(kind: str, value: Any, rendered: str, decoded: str) -> bool:
    if (
        kind == "integer"
        and not isinstance(value, bool)
        and (isinstance(value, int) or (isinstance(value, float) and value.is_integer()))
        and _DECIMAL.fullmatch(decoded) is not None
    ):
        whole, _, fraction = decoded.partition(".")
        try:
            return not fraction.strip("0") and int(whole) == int(value)
        except ValueError:  # (past Python's 4300 digits: no argument's value)
            return False
    return decoded == rendered
