"""A session's view of the servers: what it is told, what it sees, where requests go.

A view is the tuple of server names a session uses. An *aggregated* view
(the default, any number of servers) presents the broker as one server whose
catalog is the union of theirs, with qualified names. A *transparent* view (a
session that asked for exactly one server) presents that server as it is:
its own names, serverInfo, instructions and capabilities.
"""

from __future__ import annotations

from typing import Any

from broker.catalog import PROMPTS, TOOLS, Catalog, not_serving_message
from broker.jsonrpc import (
    CONNECTION_CLOSED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    JsonRpcError,
    Message,
)
from broker.lifecycle import broker_server_info, initialize_result
from broker.tasks import TASK_METHODS, split_task_id

# What the broker can honour of a server's capabilities: it keeps log levels and
# resource subscriptions per session (broker/fanout.py) and tasks per server and
# session (broker/tasks.py). Experimental capabilities are not passed on.
PASSED_CAPABILITIES = ("tools", "prompts", "resources", "completions", "logging")


def initialize_for(
    catalog: Catalog, view: tuple[str, ...], transparent: bool, version: str
) -> dict[str, Any]:
    """The ``initialize`` result for a session with this view."""
    if transparent:
        entry = catalog.entry(view[0])
        if entry.identity is None:
            raise JsonRpcError(
                CONNECTION_CLOSED,
                not_serving_message(entry),
                data={"server": view[0]},
            )
        capabilities = _honoured(entry.identity.capabilities, version)
        info = _server_info(entry.identity.server_info, view[0])
        return initialize_result(version, capabilities, info, entry.identity.instructions)
    return initialize_result(
        version, _union(catalog, view, version), broker_server_info(), _instructions(catalog, view)
    )


def _server_info(info: dict[str, Any], name: str) -> dict[str, Any]:
    """A server's ``serverInfo`` as its transparent view tells it: what the
    server said, with the two fields the schema requires of it (``name``
    and ``version``, strings) put in where it gave none: a 2026-07-28 server
    need not say who it is (``server/discover``'s ``_meta``), and a client
    such as the official SDK's refuses an ``initialize`` without them. Its
    name in the config, and version ``"unknown"``."""
    given, version = info.get("name"), info.get("version")
    if type(given) is str and type(version) is str:
        return info
    return {
        **info,
        "name": given if type(given) is str else name,
        "version": version if type(version) is str else "unknown",
    }


def _honoured(capabilities: dict[str, Any], version: str) -> dict[str, Any]:
    """A server's capabilities as far as the broker can offer them through itself."""
    out: dict[str, Any] = {}
    for key in PASSED_CAPABILITIES:
        if key not in capabilities or (key == "completions" and version == "2024-11-05"):
            continue
        if key in ("completions", "logging"):
            out[key] = {}
        else:
            out[key] = {"listChanged": True}
    resources = capabilities.get("resources")
    if "resources" in out and isinstance(resources, dict) and resources.get("subscribe"):
        out["resources"]["subscribe"] = True
    tasks = capabilities.get("tasks")
    if isinstance(tasks, dict) and version == "2025-11-25":
        out["tasks"] = tasks  # task ids are renamed per server (broker/tasks.py)
    return out


def _union(catalog: Catalog, view: tuple[str, ...], version: str) -> dict[str, Any]:
    """The three lists (maybe empty) and logging, always; the rest if any server has it."""
    capabilities: dict[str, Any] = {
        key: {"listChanged": True} for key in ("tools", "resources", "prompts")
    }
    capabilities["logging"] = {}  # the broker answers logging/setLevel itself
    for name in view:
        identity = catalog.entry(name).identity
        if identity is None:
            continue
        for key, value in _honoured(identity.capabilities, version).items():
            capabilities[key] = {**capabilities.get(key, {}), **value}
    listing = [name for name in view if _tasks_of(catalog, name).get("list") is not None]
    if "tasks" in capabilities and len(listing) != 1:
        capabilities["tasks"] = {k: v for k, v in capabilities["tasks"].items() if k != "list"}
    return capabilities


def _instructions(catalog: Catalog, view: tuple[str, ...]) -> str:
    if not view:
        return "mcpbroker: no MCP servers are configured."
    parts = [
        f"This is mcpbroker, sharing {len(view)} MCP server(s): {', '.join(view)}. "
        f"Tools and prompts are named SERVER{catalog.separator}NAME."
    ]
    for name in view:
        identity = catalog.entry(name).identity
        if identity is not None and identity.instructions:
            parts.append(f"## {name}\n{identity.instructions}")
    return "\n\n".join(parts)


def route(
    catalog: Catalog, view: tuple[str, ...], transparent: bool, request: Message
) -> tuple[str, Message]:
    """The server a forwarded request goes to, and the request in its terms."""
    method = request["method"]
    params = request.get("params") or {}
    if transparent and method not in TASK_METHODS:
        return view[0], request
    if method in ("tools/call", "prompts/get"):
        kind = TOOLS if method == "tools/call" else PROMPTS
        server, name = catalog.route_named(kind, view, params.get("name"))
        return server, _with_params(request, name=name)
    if method in ("resources/read", "resources/subscribe", "resources/unsubscribe"):
        return catalog.route_resource(view, params.get("uri")), request
    if method == "completion/complete":
        return _route_completion(catalog, view, request, params.get("ref"))
    if method in TASK_METHODS:
        split = split_task_id(params.get("taskId"), view)
        if split is None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown task: {params.get('taskId')}")
        return split[0], _with_params(request, taskId=split[1])
    if method == "tasks/list":
        return _route_task_list(catalog, view), request
    raise JsonRpcError(INVALID_PARAMS, f"{method} cannot be routed")  # pragma: no cover


def _route_completion(
    catalog: Catalog, view: tuple[str, ...], request: Message, ref: Any
) -> tuple[str, Message]:
    if not isinstance(ref, dict):
        raise JsonRpcError(INVALID_PARAMS, "completion/complete needs params.ref")
    if ref.get("type") == "ref/prompt":
        server, name = catalog.route_named(PROMPTS, view, ref.get("name"))
        return server, _with_params(request, ref={**ref, "name": name})
    if ref.get("type") == "ref/resource":
        return catalog.route_template(view, ref.get("uri")), request
    raise JsonRpcError(INVALID_PARAMS, f"Unknown completion ref type: {ref.get('type')!r}")


def _route_task_list(catalog: Catalog, view: tuple[str, ...]) -> str:
    listing = [name for name in view if _tasks_of(catalog, name).get("list") is not None]
    if len(listing) == 1:
        return listing[0]
    if not listing:
        raise JsonRpcError(METHOD_NOT_FOUND, "No server of this session lists tasks")
    raise JsonRpcError(
        METHOD_NOT_FOUND,
        f"Several servers of this session keep tasks ({', '.join(listing)}); "
        "use tasks/get for each task, or connect with --server NAME",
    )


def _tasks_of(catalog: Catalog, server: str) -> dict[str, Any]:
    identity = catalog.entry(server).identity
    tasks = identity.capabilities.get("tasks") if identity is not None else None
    return tasks if isinstance(tasks, dict) else {}


def _with_params(request: Message, **changes: Any) -> Message:
    return {**request, "params": {**(request.get("params") or {}), **changes}}
