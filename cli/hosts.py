"""MCP hosts' config files, and moving their servers into the broker's config.

The rules of ``mcpbroker install``, ``uninstall`` and ``import``, without
I/O: where each host keeps its servers (:data:`HOSTS`, :func:`host_path`),
finding the server blocks in a decoded file (:func:`server_blocks`), which
entries the broker can take over (:func:`why_kept`), merging them into the
broker's config without losing one (:func:`merge`), and the edits that point
the host at ``mcpbroker connect`` (:func:`plan_install`). ``cli/install.py``
reads and writes the files. docs/hosts.md says what each host keeps where,
with sources, and the decisions taken here.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from broker.config import HOST_SERVER_KEYS, SERVER_KEY_OF, ConfigError, parse_config
from cli.jsonedit import Delete, Edit, Set

BlockPath = tuple[str, ...]

# Keys of a host's entry that are about the host's own handling of the
# server; they stay on the entry that points at the broker.
HOST_SIDE_KEYS = ("disabled", "autoApprove", "alwaysAllow", "disabledTools")
# The remote servers the broker reaches today (actors/links/): other URLs
# stay in the host.
REMOTE_SCHEMES = ("ws://", "wss://")
AGGREGATE_NAME = "mcpbroker"


@attrs.frozen
class Host:
    """One MCP host: its name on the command line and how its entries look."""

    client: str
    title: str
    servers_key: str  # "mcpServers", or "servers" (VS Code)
    url_key: str | None  # the key of a remote entry's URL; None: the host has none
    typed: bool  # whether the host writes "type": "stdio" in its entries


HOSTS: dict[str, Host] = {
    host.client: host
    for host in (
        Host("claude-desktop", "Claude Desktop", "mcpServers", None, False),
        Host("claude-code", "Claude Code", "mcpServers", "url", True),
        Host("cursor", "Cursor", "mcpServers", "url", False),
        Host("vscode", "VS Code", "servers", "url", True),
        Host("windsurf", "Windsurf", "mcpServers", "serverUrl", False),
    )
}


def host_path(client: str, home: str, env: Mapping[str, str], system: str) -> str:
    """Where ``client`` keeps its servers for this user (``system``: "Darwin"
    or another, read as Linux)."""
    mac = system == "Darwin"
    app_support = posixpath.join(home, "Library", "Application Support")
    xdg = env.get("XDG_CONFIG_HOME") or posixpath.join(home, ".config")
    if client == "claude-desktop":
        base = app_support if mac else xdg
        return posixpath.join(base, "Claude", "claude_desktop_config.json")
    if client == "claude-code":
        return posixpath.join(env.get("CLAUDE_CONFIG_DIR") or home, ".claude.json")
    if client == "cursor":
        return posixpath.join(home, ".cursor", "mcp.json")
    if client == "vscode":
        return posixpath.join(app_support if mac else xdg, "Code", "User", "mcp.json")
    if client == "windsurf":
        return posixpath.join(home, ".codeium", "windsurf", "mcp_config.json")
    raise ValueError(f"unknown client {client!r}")


# -- reading ---------------------------------------------------------------------------------


def server_blocks(data: Any) -> list[BlockPath]:
    """Where a decoded config file keeps servers: ``mcpServers`` (most hosts),
    ``servers`` (VS Code's mcp.json), ``mcp.servers`` (VS Code's
    settings.json), and ``projects.PATH.mcpServers`` (Claude Code's
    ~/.claude.json), in the file's order."""
    if not isinstance(data, dict):
        return []
    blocks: list[BlockPath] = []
    for key in ("mcpServers", "servers"):
        if isinstance(data.get(key), dict):
            blocks.append((key,))
    mcp = data.get("mcp")
    if isinstance(mcp, dict) and isinstance(mcp.get("servers"), dict):
        blocks.append(("mcp", "servers"))
    projects = data.get("projects")
    if isinstance(projects, dict):
        for project, settings in projects.items():
            if isinstance(settings, dict) and isinstance(settings.get("mcpServers"), dict):
                blocks.append(("projects", project, "mcpServers"))
    return blocks


def lookup(data: Any, path: BlockPath) -> Any:
    for key in path:
        data = data[key]
    return data


def entries(data: Any) -> Iterator[tuple[BlockPath, str, Any]]:
    """Every server entry of a decoded file: (its block, its name, the entry)."""
    for block in server_blocks(data):
        for name, entry in lookup(data, block).items():
            yield block, name, entry


def for_broker(entry: dict[str, Any]) -> dict[str, Any]:
    """A host's entry as the broker's config has it: Windsurf's ``serverUrl``
    is ``url``, and what only the host reads (which tools it approves or
    hides) stays with the host; the rest as it was."""
    host_only = [key for key in HOST_SIDE_KEYS if key != "disabled"]
    converted = {key: value for key, value in entry.items() if key not in host_only}
    if "serverUrl" in converted and "url" not in converted:
        converted["url"] = converted.pop("serverUrl")
    return converted


def is_broker_entry(entry: Any) -> bool:
    """Whether an entry already goes through mcpbroker (an earlier install)."""
    if not isinstance(entry, dict):
        return False
    command, args = entry.get("command"), entry.get("args")
    if not isinstance(command, str) or not isinstance(args, list):
        return False
    if posixpath.basename(command) == "mcpbroker":
        return args[:1] == ["connect"]
    if args[:1] == ["-P"]:  # (cli/service.py's daemon_command since it has -P)
        args = args[1:]
    return args[:3] == ["-m", "cli.main", "connect"]  # a Python running mcpbroker


def why_kept(name: str, entry: Any) -> str | None:
    """Why the broker cannot take this entry over (it then stays in the
    host, untouched), or None."""
    if not isinstance(entry, dict):
        return "is not an object"
    if is_broker_entry(entry):
        return "already goes through mcpbroker"
    if _has_variable(entry):
        return "uses ${...} variables, which only the host fills in"
    known = {*SERVER_KEY_OF.values(), *HOST_SERVER_KEYS, *HOST_SIDE_KEYS, "serverUrl"}
    unknown = sorted(key for key in entry if key not in known)
    if unknown:
        return f"has settings mcpbroker does not read ({', '.join(unknown)})"
    converted = for_broker(entry)
    url = converted.get("url")
    if isinstance(url, str) and not url.startswith(REMOTE_SCHEMES):
        return f"is a remote server mcpbroker cannot reach yet ({url})"
    try:
        parse_config({"mcpServers": {name: converted}})
    except ConfigError as exc:
        return f"is not a server mcpbroker can run: {exc}"
    return None


def _has_variable(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, dict):
        return any(_has_variable(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_variable(item) for item in value)
    return False


# -- merging ---------------------------------------------------------------------------------


def same_server(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two entries run the same server the same way (what only the
    host reads, and ``"type": "stdio"`` on a command, do not count)."""
    return _essence(a) == _essence(b)


def _essence(entry: Mapping[str, Any]) -> dict[str, Any]:
    ignored = {"autoApprove", "alwaysAllow", "disabledTools", "description"}
    essence = {key: value for key, value in entry.items() if key not in ignored}
    if essence.get("type") == "stdio" and "command" in essence:
        del essence["type"]
    if not essence.get("disabled", False):
        essence.pop("disabled", None)
    for key in ("args", "env", "headers"):
        if not essence.get(key):
            essence.pop(key, None)
    return essence


@attrs.frozen
class Merge:
    """Where each incoming server went in the broker's config."""

    names: dict[tuple[BlockPath, str], str]  # (block, host name) -> broker name
    added: dict[str, dict[str, Any]]  # broker name -> entry, new in the broker's config
    renamed: dict[tuple[BlockPath, str], str]  # those whose name was taken


def merge(
    existing: Mapping[str, Any], incoming: list[tuple[BlockPath, str, dict[str, Any]]], label: str
) -> Merge:
    """Put ``incoming`` entries into a broker config whose servers are
    ``existing``, losing none: a name free in the broker keeps its entry; a
    name the broker has for the same server reuses it; a name the broker has
    for another server becomes NAME-LABEL (then NAME-LABEL-2, ...), the first
    of these that is free or already this server."""
    taken: dict[str, Any] = dict(existing)
    names: dict[tuple[BlockPath, str], str] = {}
    added: dict[str, dict[str, Any]] = {}
    renamed: dict[tuple[BlockPath, str], str] = {}
    for block, name, entry in incoming:
        entry = for_broker(entry)
        chosen = None
        for candidate in _candidates(name, label):
            other = taken.get(candidate)
            if other is None or (isinstance(other, dict) and same_server(other, entry)):
                chosen = candidate
                break
        assert chosen is not None
        if chosen not in taken:
            taken[chosen] = added[chosen] = entry
        names[(block, name)] = chosen
        if chosen != name:
            renamed[(block, name)] = chosen
    return Merge(names=names, added=added, renamed=renamed)


def _candidates(name: str, label: str) -> Iterator[str]:
    yield name
    yield f"{name}-{label}"
    number = 2
    while True:
        yield f"{name}-{label}-{number}"
        number += 1


# -- the host's new entries ------------------------------------------------------------------


@attrs.frozen
class Target:
    """How the host reaches the broker: ``command`` (the absolute path of
    ``mcpbroker``, or a Python and ``-m cli.main``), ``config`` (a ``--config``
    for shims, when the broker's config is not where they look by default),
    or ``url`` (the base of the HTTP listener)."""

    command: tuple[str, ...]
    config: str | None = None
    url: str | None = None


def connect_entry(host: Host, target: Target, view: list[str]) -> dict[str, Any]:
    """The entry that reaches the broker for ``view`` (one server's name, or
    none: every server)."""
    if target.url is not None:
        if host.url_key is None:
            raise ValueError(f"{host.title} has no entries by URL; leave out --url")
        url = target.url.rstrip("/") + "/mcp" + "".join("/" + name for name in view)
        entry: dict[str, Any] = {"type": "http"} if host.url_key == "url" else {}
        entry[host.url_key] = url
        return entry
    args = [*target.command[1:], "connect", *view]
    if target.config is not None:
        args += ["--config", target.config]
    entry = {"type": "stdio"} if host.typed else {}
    entry.update(command=target.command[0], args=args)
    return entry


@attrs.frozen
class Plan:
    """What an install does: servers added to the broker's config, edits
    of the host's file, and what was renamed or left in the host."""

    broker_added: dict[str, dict[str, Any]]
    host_edits: list[Edit]
    moved: list[tuple[BlockPath, str, str]]  # (block, host name, broker name)
    renamed: dict[tuple[BlockPath, str], str]
    kept: list[tuple[BlockPath, str, str]]  # (block, host name, why)


def plan_install(
    host: Host,
    data: Any,
    broker_servers: Mapping[str, Any],
    target: Target,
    aggregate: bool = False,
) -> Plan:
    """Move the servers of a host's decoded file ``data`` into the broker's
    config (``broker_servers``, its ``mcpServers``) and point the host at the
    broker: an entry per server (``mcpbroker connect NAME``, keeping the
    host's name for it and its ``disabled``), or one entry for every server
    (``aggregate``)."""
    movable, kept = [], []
    for block, name, entry in entries(data):
        reason = why_kept(name, entry)
        if reason is None:
            movable.append((block, name, entry))
        else:
            kept.append((block, name, reason))
    merged = merge(broker_servers, movable, host.client)
    edits: list[Edit] = []
    moved = []
    for block, name, entry in movable:
        broker_name = merged.names[(block, name)]
        moved.append((block, name, broker_name))
        if aggregate:
            edits.append(Delete((*block, name)))
            continue
        new = connect_entry(host, target, [broker_name])
        new.update({key: entry[key] for key in HOST_SIDE_KEYS if key in entry})
        edits.append(Set((*block, name), new))
    if aggregate and movable and not _has_aggregate(data):
        edits.append(_aggregate_edit(host, data, target, kept))
    return Plan(merged.added, edits, moved, merged.renamed, kept)


def _has_aggregate(data: Any) -> bool:
    """Whether the file has an entry for every server already (an earlier
    ``install --aggregate``)."""
    return any(
        is_broker_entry(entry) and not _view_of(entry["args"]) for _, _, entry in entries(data)
    )


def _view_of(args: list[Any]) -> list[Any]:
    """The server names a broker entry's ``connect`` names (none: every
    server), its ``--config FILE`` aside (it follows them when the broker's
    config is not the default one: such an aggregate entry was not found,
    and a second one added)."""
    rest = args[args.index("connect") + 1 :]
    if "--config" in rest:
        at = rest.index("--config")
        rest = rest[:at] + rest[at + 2 :]
    return rest


def _aggregate_edit(host: Host, data: Any, target: Target, kept: list[Any]) -> Edit:
    """The one entry for every server, in the file's first block (made if
    there is none): named ``mcpbroker`` (``mcpbroker-2``, ... if a kept
    entry has the name)."""
    blocks = server_blocks(data)
    block = blocks[0] if blocks else (host.servers_key,)
    kept_names = {name for where, name, _ in kept if where == block}
    name = AGGREGATE_NAME
    number = 2
    while name in kept_names:
        name = f"{AGGREGATE_NAME}-{number}"
        number += 1
    return Set((*block, name), connect_entry(host, target, []))


def shim_config_arg(config: str, home: str) -> str | None:
    """The ``--config`` a shim needs to find ``config``: none when it is
    where a shim looks with nothing but HOME set (hosts pass few variables on)."""
    default = os.path.join(home, ".config", "mcpbroker", "config.json")
    return None if os.path.abspath(config) == default else os.path.abspath(config)


def describe_block(block: BlockPath) -> str:
    if block[:1] == ("projects",):
        return f"project {block[1]}"
    return ".".join(block)


def restore_servers(current: Any, original: Any) -> list[Edit]:
    """The edits that give the current file the server entries of the
    original (from before the install), leaving the rest as it is now: every
    entry of the original's blocks put back, and every entry that runs
    mcpbroker and the original did not have removed. Entries added since
    that do not run mcpbroker stay."""
    edits: list[Edit] = []
    original_blocks = server_blocks(original)
    for block in original_blocks:
        now = _block_or_empty(current, block)
        for name, entry in lookup(original, block).items():
            if now.get(name) != entry:
                edits.append(Set((*block, name), entry))
    for block, name, entry in entries(current):
        had = lookup(original, block) if block in original_blocks else {}
        if name not in had and is_broker_entry(entry):
            edits.append(Delete((*block, name)))
    return edits


def _block_or_empty(data: Any, block: BlockPath) -> dict[str, Any]:
    try:
        found = lookup(data, block)
    except (KeyError, TypeError):
        return {}
    return found if isinstance(found, dict) else {}
