"""The aggregated catalog: every server's tools, prompts, resources and templates.

A :class:`Catalog` is an immutable snapshot. The Registry actor builds a new
one whenever a server's lists change and publishes it; sessions read the
latest snapshot to answer list requests and to route calls, without a round
trip to any server.

Two ways to see it:

- aggregated (the default): tool and prompt names are qualified
  (``SERVER__name``, see :mod:`broker.naming`), resources and templates keep
  their URIs, items come in config order of their servers, then each server's
  own order;
- transparent (a session that asked for exactly one server): that server's
  items exactly as it lists them.

List requests are paginated with the broker's own opaque cursors (see
:func:`encode_cursor`); ``page_size`` 0 means one page holds everything.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import orjson

from broker import jsonrpc
from broker.jsonrpc import CONNECTION_CLOSED, INVALID_PARAMS, JsonRpcError
from broker.lifecycle import ServerIdentity
from broker.naming import DEFAULT_SEPARATOR, assign_names, qualify, sanitize
from broker.states import DOWN, ServerState
from broker.templates import Budget, BudgetSpent, match

RESOURCE_NOT_FOUND = -32002  # MCP's code for a resource that does not exist


@attrs.frozen
class Kind:
    name: str  # our name for it
    method: str  # the list request
    key: str  # the result's array
    id_field: str  # what identifies an item
    named: bool  # named items get qualified names when aggregated
    notification: str  # the list_changed notification that covers it
    capability: str  # the server capability that says it has any


TOOLS = Kind(
    "tools", "tools/list", "tools", "name", True, "notifications/tools/list_changed", "tools"
)
PROMPTS = Kind(
    "prompts",
    "prompts/list",
    "prompts",
    "name",
    True,
    "notifications/prompts/list_changed",
    "prompts",
)
RESOURCES = Kind(
    "resources",
    "resources/list",
    "resources",
    "uri",
    False,
    "notifications/resources/list_changed",
    "resources",
)
TEMPLATES = Kind(
    "templates",
    "resources/templates/list",
    "resourceTemplates",
    "uriTemplate",
    False,
    "notifications/resources/list_changed",
    "resources",
)
KINDS = (TOOLS, PROMPTS, RESOURCES, TEMPLATES)
KIND_BY_METHOD = {kind.method: kind for kind in KINDS}
KINDS_BY_NOTIFICATION: dict[str, tuple[Kind, ...]] = {
    note: tuple(k for k in KINDS if k.notification == note)
    for note in {k.notification for k in KINDS}
}


@attrs.frozen
class ServerEntry:
    """One server in the catalog: its state (the server connection's own,
    broker/states.py, as its Upstream last reported it) and its lists."""

    name: str
    state: ServerState = ServerState.STARTING
    identity: ServerIdentity | None = None
    lists: Mapping[str, tuple[dict[str, Any], ...]] = attrs.field(factory=dict)
    error: str | None = None
    # READY, and its lists are being fetched: not served from the catalog yet.
    loading: bool = False
    # Lists (by kind name) its last fetch could not read, and why: they keep
    # the last list read, and are fetched again later (actors/registry.py).
    unread: Mapping[str, str] = attrs.field(factory=dict)
    # Lists (by kind name) the broker stopped reading before their end, and
    # why (broker/listing.py): what the list holds past the cut is not served.
    cut: Mapping[str, str] = attrs.field(factory=dict)

    @property
    def serving(self) -> bool:
        """Ready, and its lists are in the catalog."""
        return self.state is ServerState.READY and not self.loading

    @property
    def settled(self) -> bool:
        """Serving, or down: a session has nothing to wait for."""
        return self.serving or self.state in DOWN

    def items(self, kind: Kind) -> tuple[dict[str, Any], ...]:
        return self.lists.get(kind.name, ())


class Catalog:
    """One snapshot of every configured server's catalog (config order)."""

    def __init__(
        self,
        servers: Iterable[ServerEntry],
        separator: str = DEFAULT_SEPARATOR,
        page_size: int = 0,
        seniority: Sequence[str] = (),
        before: Catalog | None = None,
    ) -> None:
        """``seniority``: which server keeps a name or URI two servers claim
        (the earlier; servers not in it come after, in config order): config
        order at start, then each server a reload adds after those there
        before (actors/registry.py), so a reload never takes a name away.
        ``before``: the catalog this one follows. A name it gave stays with its
        item while the item is listed (or its server is down, its lists
        unknown), and a URI stays with the server that served it while that
        server lists it: what a server lists later is the newcomer. (A
        server's first lists since the daemon took it up go by seniority, so
        that a daemon started afresh names as config order says.)"""
        self.servers = {entry.name: _well_formed(entry) for entry in servers}
        self.separator = separator
        self.page_size = page_size
        self.seniority = tuple(seniority)
        self.clashes: list[str] = []
        if before is not None and before.separator != separator:
            before = None  # (every name changes: none is held)
        # The servers whose lists have been read (in this catalog or one
        # before it): what any other lists is its first lists.
        self._served: frozenset[str] = frozenset(
            name
            for name, entry in self.servers.items()
            if entry.serving or entry.lists or (before is not None and name in before._served)
        )
        # The names given, by kind: those of the items listed, and those kept
        # for the items of a server that is not serving (the next catalog's
        # ``before._held``).
        self._held: dict[str, dict[tuple[str, str], str]] = {}
        # The servers that speak the 2026-07-28 era (their identity's version
        # is not a legacy one): they ask a client nothing mid-call, so a
        # modern session keeps no record of a call to one (broker/eras/session.py).
        self.modern = frozenset(
            name
            for name, entry in self.servers.items()
            if entry.identity is not None and entry.identity.modern
        )
        self._names: dict[str, dict[tuple[str, str], str]] = {}
        self._routes: dict[str, dict[str, tuple[str, str]]] = {}
        self._renamed: dict[str, dict[str, tuple[dict[str, Any], ...]]] = {}
        for kind in (TOOLS, PROMPTS):
            self._index_names(kind, before)
        self._resource_owners = self._owners(RESOURCES, before)
        self._template_owners = self._owners(TEMPLATES, before)
        # The servers that offer resources, each with the URI schemes it lists
        # ("file:"): a read nothing explains goes by them (_sole_resource_server),
        # found once here, not by a walk of every item at each such read.
        self._offering = {
            entry.name: frozenset(
                _scheme(key)
                for kind in (RESOURCES, TEMPLATES)
                for item in entry.items(kind)
                if isinstance(key := item.get(kind.id_field), str)
            )
            for entry in self.servers.values()
            if entry.identity is not None and "resources" in entry.identity.capabilities
        }

    def replace(self, entry: ServerEntry) -> Catalog:
        """A new snapshot with one server's entry replaced."""
        servers = [entry if name == entry.name else old for name, old in self.servers.items()]
        return Catalog(servers, self.separator, self.page_size, self.seniority, self)

    def renamed(self, before: Catalog, kind: Kind) -> set[str]:
        """The servers whose items of a named kind have other names here than
        in ``before`` (a clash with another server's item came or went)."""
        old = before._names.get(kind.name, {})
        return {
            pair[0] for pair, name in self._names[kind.name].items() if old.get(pair, name) != name
        }

    def entry(self, server: str) -> ServerEntry:
        return self.servers[server]

    def settled(self, view: Iterable[str]) -> bool:
        return all(self.servers[name].settled for name in view)

    # -- building -------------------------------------------------------------

    def _index_names(self, kind: Kind, before: Catalog | None) -> None:
        pairs = [
            (entry.name, item.get("name", ""))
            for entry in self.servers.values()
            for item in entry.items(kind)
        ]
        held: dict[tuple[str, str], str] = {}
        if before is not None:
            listed = set(pairs)
            held = {
                pair: name
                for pair, name in before._held[kind.name].items()
                if pair in listed
                or ((entry := self.servers.get(pair[0])) is not None and not entry.serving)
            }
            self._yield_to_first_lists(kind, before, held)
        names, clashes = assign_names(pairs, self.separator, self.seniority, held)
        self.clashes += [f"{kind.name}: {clash}" for clash in clashes]
        self._names[kind.name] = names
        self._held[kind.name] = held | names
        self._routes[kind.name] = {q: pair for pair, q in names.items()}
        self._renamed[kind.name] = {
            entry.name: tuple(
                {**item, "name": names[(entry.name, item.get("name", ""))]}
                for item in entry.items(kind)
            )
            for entry in self.servers.values()
        }

    def _yield_to_first_lists(
        self, kind: Kind, before: Catalog, held: dict[tuple[str, str], str]
    ) -> None:
        """Drop from ``held`` the names a senior server's first lists claim
        (its items and a junior's, loaded before it at start, are named as
        config order says; the junior's sessions are told of the rename)."""
        first = [
            entry
            for name, entry in self.servers.items()
            if name not in before._served and entry.items(kind)
        ]
        if not first or not held:
            return
        order = [*self.seniority, *(s for s in self.servers if s not in self.seniority)]
        rank = {name: index for index, name in enumerate(order)}
        holders = {name: pair for pair, name in held.items()}
        for entry in first:
            for item in entry.items(kind):
                pair = holders.get(qualify(entry.name, item.get("name", ""), self.separator))
                if pair is not None and rank.get(pair[0], len(rank)) > rank[entry.name]:
                    del held[pair]

    def _owners(self, kind: Kind, before: Catalog | None) -> dict[str, list[str]]:
        owners: dict[str, list[str]] = {}
        rank = {name: index for index, name in enumerate(self.seniority)}
        by_seniority = sorted(self.servers.values(), key=lambda e: rank.get(e.name, len(rank)))
        for entry in by_seniority:
            for item in entry.items(kind):
                key = item.get(kind.id_field)
                if isinstance(key, str) and entry.name not in owners.setdefault(key, []):
                    owners[key].append(entry.name)
        previous = {} if before is None else before._owners_of(kind)
        for key, names in owners.items():
            if len(names) > 1:
                # The server that served it keeps serving it, unless a senior
                # server's first lists claim it too (as for names).
                served = previous.get(key)
                if served and served[0] in names and before is not None:
                    seniors = names[: names.index(served[0])]
                    if seniors and all(name in before._served for name in seniors):
                        names.remove(served[0])
                        names.insert(0, served[0])
                self.clashes.append(
                    f"{kind.name}: {key!r} is listed by servers "
                    f"{', '.join(names)}; {names[0]!r} (which came first) serves it"
                )
        return owners

    def _owners_of(self, kind: Kind) -> dict[str, list[str]]:
        return self._resource_owners if kind is RESOURCES else self._template_owners

    # -- listing --------------------------------------------------------------

    def items(self, kind: Kind, view: Iterable[str], transparent: bool) -> list[dict[str, Any]]:
        """Everything of one kind a view sees, in order."""
        wanted = set(view)
        out: list[dict[str, Any]] = []
        for entry in self.servers.values():
            if entry.name not in wanted:
                continue
            if transparent:
                out.extend(entry.items(kind))
            elif kind.named:
                out.extend(self._renamed[kind.name][entry.name])
            else:
                owners = self._resource_owners if kind is RESOURCES else self._template_owners
                out.extend(
                    item
                    for item in entry.items(kind)
                    if _first_in(owners.get(item.get(kind.id_field, ""), []), wanted) == entry.name
                )
        return out

    def page(
        self, kind: Kind, view: tuple[str, ...], transparent: bool, cursor: Any
    ) -> dict[str, Any]:
        """The result of a list request (raises -32602 for a cursor not ours)."""
        items = self.items(kind, view, transparent)
        start = 0 if cursor is None else decode_cursor(cursor, kind)
        if not self.page_size:
            return {kind.key: items[start:]}
        end = start + self.page_size
        result: dict[str, Any] = {kind.key: items[start:end]}
        if end < len(items):
            result["nextCursor"] = encode_cursor(kind, end)
        return result

    # -- routing --------------------------------------------------------------

    def route_named(self, kind: Kind, view: tuple[str, ...], name: Any) -> tuple[str, str]:
        """(server, its own name) for a qualified tool or prompt name."""
        route = self._routes[kind.name].get(name) if isinstance(name, str) else None
        if route is not None and route[0] in view:
            return route
        label = kind.name[:-1]
        for server in view:  # a name of a server that is not serving: say why
            entry = self.servers[server]
            if not (isinstance(name, str) and name.startswith(sanitize(server) + self.separator)):
                continue
            if not entry.serving:
                retryable = entry.state not in (ServerState.FAILED, ServerState.STOPPED)
                raise JsonRpcError(
                    CONNECTION_CLOSED,
                    not_serving_message(entry),
                    data={"server": server, "retryable": retryable},
                )
            if kind.name in entry.unread:  # its list may lack it: say so
                raise JsonRpcError(
                    INVALID_PARAMS,
                    f"Unknown {label}: {name} (the broker could not read the {kind.name} "
                    f"of MCP server {server!r}: {entry.unread[kind.name]}; it tries again)",
                    data={"server": server},
                )
            if kind.name in entry.cut:  # it may be past the cut: say how to reach it
                raise JsonRpcError(
                    INVALID_PARAMS,
                    f"Unknown {label}: {name} (the broker keeps only part of the "
                    f"{kind.name} of MCP server {server!r}, whose list it cut off: "
                    f"{entry.cut[kind.name]}; this may be one left out: a session of "
                    f"that server alone, mcpbroker connect --server {server}, passes "
                    "every name on to it)",
                    data={"server": server},
                )
        raise JsonRpcError(INVALID_PARAMS, f"Unknown {label}: {name}")

    def route_resource(self, view: tuple[str, ...], uri: Any) -> str:
        """The server a ``resources/read`` of ``uri`` goes to: the one that
        lists it; else the first whose template matches it (RFC 6570, then as
        the SDKs match: :data:`broker.templates._LOOSE`); else the one server
        of the view that offers resources (or the one of those that lists
        anything of its scheme): a URI a server hands out without listing it
        (a tool's ``resource_link``) is read from it."""
        if isinstance(uri, str):
            owner = _first_in(self._resource_owners.get(uri, []), set(view))
            if owner is not None:
                return owner
            budget = Budget()  # (one read's share of the event loop: broker/templates.py)
            try:
                owner = self._template_owner(view, uri, budget)
            except BudgetSpent:
                owner = self._sole_resource_server(view, uri)
                if owner is None:
                    raise JsonRpcError(
                        RESOURCE_NOT_FOUND,
                        "Resource not found (the broker gave up matching it against the "
                        "servers' resource templates: too many, or too complex)",
                        data={"uri": uri},
                    ) from None
            owner = owner or self._sole_resource_server(view, uri)
            if owner is not None:
                return owner
        raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", data={"uri": uri})

    def _template_owner(self, view: tuple[str, ...], uri: str, budget: Budget) -> str | None:
        for loose in (False, True):
            for entry in self.servers.values():
                if entry.name in view and any(
                    match(t.get("uriTemplate", ""), uri, budget, loose)
                    for t in entry.items(TEMPLATES)
                ):
                    return entry.name
        return None

    def _sole_resource_server(self, view: tuple[str, ...], uri: str) -> str | None:
        offering = [name for name in view if name in self._offering]
        scheme = _scheme(uri)
        if len(offering) > 1 and len(scheme) > 1:
            offering = [name for name in offering if scheme in self._offering[name]]
        return offering[0] if len(offering) == 1 else None

    def route_template(self, view: tuple[str, ...], uri: Any) -> str:
        """The server a completion of ``ref/resource`` ``uri`` goes to: the one
        that lists that exact template (or resource); else, for a concrete URI
        (the schema allows one), the server a read of it goes to."""
        wanted = set(view)
        if isinstance(uri, str):
            for owners in (self._template_owners, self._resource_owners):
                owner = _first_in(owners.get(uri, []), wanted)
                if owner is not None:
                    return owner
            if "{" not in uri:  # (a concrete URI; a template nobody lists is unknown)
                with contextlib.suppress(JsonRpcError):
                    return self.route_resource(view, uri)
        raise JsonRpcError(INVALID_PARAMS, f"Unknown resource template: {uri}")


def _scheme(uri: str) -> str:
    """A URI's scheme with its colon (``"file:"``); ``":"`` for none."""
    return uri.partition(":")[0] + ":"


# The deepest item a list may hold: a list answer wraps each item in three
# levels (the response, its result, the list) and a batch in one more.
MAX_ITEM_DEPTH = jsonrpc.MAX_DEPTH - 4


def valid_item(kind: Kind, item: Any) -> bool:
    """Whether a server's list item can be listed and routed (its key is a
    string) and written back (it nests no deeper than :data:`MAX_ITEM_DEPTH`)."""
    return (
        isinstance(item, dict)
        and isinstance(item.get(kind.id_field), str)
        and not jsonrpc.depth_exceeds(item, MAX_ITEM_DEPTH)
    )


def _well_formed(entry: ServerEntry) -> ServerEntry:
    """The entry without items a misbehaving server sent malformed."""
    if all(valid_item(kind, item) for kind in KINDS for item in entry.items(kind)):
        return entry  # the usual case: nothing to copy
    lists = {
        kind.name: tuple(i for i in entry.items(kind) if valid_item(kind, i)) for kind in KINDS
    }
    return attrs.evolve(entry, lists=lists)


def _first_in(names: list[str], wanted: set[str]) -> str | None:
    return next((name for name in names if name in wanted), None)


def not_serving_message(entry: ServerEntry) -> str:
    """Why a server has nothing to offer right now."""
    if entry.state in DOWN:
        return f"MCP server {entry.name!r} is not running (it {entry.error or 'is down'})"
    if entry.error:
        return f"MCP server {entry.name!r} is restarting (last time it {entry.error})"
    return f"MCP server {entry.name!r} is still starting"


def encode_cursor(kind: Kind, offset: int) -> str:
    """An opaque cursor: which list, and where the next page starts."""
    raw = orjson.dumps({"k": kind.name, "o": offset})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: Any, kind: Kind) -> int:
    try:
        if not isinstance(cursor, str):
            raise ValueError
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = orjson.loads(raw)
        if data["k"] != kind.name or not isinstance(data["o"], int) or data["o"] < 0:
            raise ValueError
        return int(data["o"])
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        raise JsonRpcError(INVALID_PARAMS, f"Invalid cursor: {cursor!r}") from None
