"""SessionProtocol: a downstream client's lifecycle, local answers, routing, batches."""

from __future__ import annotations

import copy
from typing import Any

import attrs
import pytest

from broker import jsonrpc
from broker.catalog import KIND_BY_METHOD, RESOURCE_NOT_FOUND, Catalog, ServerEntry
from broker.jsonrpc import (
    CONNECTION_CLOSED,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LIMIT_REACHED,
    METHOD_NOT_FOUND,
)
from broker.lifecycle import LATEST_LEGACY_VERSION, LEGACY_VERSIONS, ServerIdentity
from broker.session import (
    Attach,
    CancelUpstream,
    Defer,
    Forward,
    NotifyUpstreams,
    Reply,
    RespondUpstream,
    SessionProtocol,
)
from broker.states import ServerState, SessionState

# LOADING: coming up (not settled); DOWN: down (settled), in the server's own states.
READY, LOADING, IDLE, DOWN = (ServerState.READY, ServerState.STARTING, ServerState.IDLE,
                              ServerState.RESTARTING)  # fmt: skip
BROKER_INFO = {"name": "mcpbroker", "version": "0.1.0"}
EVERYTHING = {"tools": {}, "prompts": {}, "resources": {}}
# The broker tells each session when a list changes, whatever the server said.
LISTS = {key: {"listChanged": True} for key in ("tools", "prompts", "resources")}
SUBSCRIBABLE = {"resources": {"listChanged": True, "subscribe": True}}


@attrs.define
class Catalogs:
    """What the Registry is to a session: the latest snapshot, as ``current``."""

    current: Catalog


def server(
    name: str,
    state: ServerState = READY,
    *,
    capabilities: dict[str, Any] | None = None,
    instructions: str | None = None,
    error: str | None = None,
    **lists: tuple[dict[str, Any], ...],
) -> ServerEntry:
    """A server entry; ``capabilities=None`` gives it no identity (it never started)."""
    identity = (
        None
        if capabilities is None
        else ServerIdentity("2025-06-18", capabilities, {"name": f"{name}-server"}, instructions)
    )
    return ServerEntry(name, state, identity=identity, lists=lists, error=error)


def named(*names: str) -> tuple[dict[str, Any], ...]:
    return tuple({"name": name, "description": f"does {name}"} for name in names)


FILES = server(
    "files",
    capabilities={**EVERYTHING, "resources": {"subscribe": True}, "logging": {}, "completions": {}},
    instructions="Read files.",
    tools=named("read", "write"),
    prompts=named("summarize"),
    resources=({"uri": "file:///README.md", "name": "readme"},),
    templates=({"uriTemplate": "file:///{+path}", "name": "any file"},),
)
GITHUB = server(
    "github",
    capabilities={**EVERYTHING, "tools": {"listChanged": False}},
    instructions="Search GitHub.",
    tools=named("search"),
    prompts=named("review"),
    resources=({"uri": "file:///gh.txt", "name": "gh"},),
    templates=({"uriTemplate": "gh://{owner}/{repo}/issues{?state}", "name": "issues"},),
)


def new(
    entries: tuple[ServerEntry, ...] = (FILES, GITHUB),
    view: tuple[str, ...] | None = None,
    *,
    transparent: bool = False,
    refusal: str | None = None,
    page_size: int = 0,
) -> SessionProtocol:
    """A session whose view is every entry (unless given), not yet initialized."""
    view = tuple(entry.name for entry in entries) if view is None else view
    catalogs = Catalogs(Catalog(entries, page_size=page_size))
    return SessionProtocol(view, catalogs, transparent=transparent, refusal=refusal)


def session(*args: Any, version: str = "2025-06-18", **kwargs: Any) -> SessionProtocol:
    """An initialized session (see :func:`new` for the arguments)."""
    proto = new(*args, **kwargs)
    proto.receive(initialize(version=version), settled=True)
    assert proto.state is SessionState.OPERATING
    return proto


def req(id: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def initialize(id: Any = 0, version: Any = "2025-06-18") -> dict[str, Any]:
    params = {"protocolVersion": version, "capabilities": {"roots": {}}, "clientInfo": {"n": 1}}
    return req(id, "initialize", params)


def call(id: Any, name: str = "files__read", **params: Any) -> dict[str, Any]:
    return req(id, "tools/call", {"name": name, **params})


def forwarded(id: Any, server: str = "files", name: str = "read") -> Forward:
    return Forward(server, call(id, name))


def ok(id: Any, result: Any = None) -> Reply:
    return Reply(jsonrpc.result_response(id, {} if result is None else result))


def result_of(actions: list[Any]) -> Any:
    """The result of the single reply in ``actions`` (an initialize also attaches)."""
    if len(actions) == 2 and isinstance(actions[1], Attach):
        actions = actions[:1]
    [action] = actions
    assert isinstance(action, Reply) and isinstance(action.message, dict), actions
    return action.message["result"]


def error_object(actions: list[Any]) -> dict[str, Any]:
    """The error object of the single error reply in ``actions``, and its id as "id"."""
    [action] = actions
    assert isinstance(action, Reply) and isinstance(action.message, dict), actions
    return {**action.message["error"], "id": action.message["id"]}


def error_of(actions: list[Any]) -> tuple[Any, int, str]:
    """(id, code, message) of the single error reply in ``actions``."""
    error = error_object(actions)
    return error["id"], error["code"], error["message"]


def upstream_answer(id: Any) -> dict[str, Any]:
    return jsonrpc.result_response(id, {"from": "upstream", "id": id})


def names(items: list[dict[str, Any]], field: str = "name") -> list[str]:
    return [item[field] for item in items]


# -- initialize, aggregated --------------------------------------------------


def test_aggregated_initialize() -> None:
    proto = new()
    result = result_of(proto.receive(initialize(1, "2025-06-18")))
    assert result["protocolVersion"] == "2025-06-18"
    assert result["serverInfo"] == BROKER_INFO
    assert result["capabilities"] == {
        **LISTS,
        **SUBSCRIBABLE,  # files can
        "completions": {},  # files has them
        "logging": {},  # the broker answers logging/setLevel itself
    }
    intro, files, github = result["instructions"].split("\n\n")
    assert "files, github" in intro and "SERVER__NAME" in intro
    assert (files, github) == ("## files\nRead files.", "## github\nSearch GitHub.")
    assert proto.state is SessionState.OPERATING
    assert proto.protocol_version == "2025-06-18"
    assert proto.client_capabilities == {"roots": {}}
    assert proto.client_info == {"n": 1}


def initialized_result(version: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return result_of(new(*args, **kwargs).receive(initialize("i", version)))


def test_no_completions_for_2024_11_05() -> None:
    assert "completions" not in initialized_result("2024-11-05")["capabilities"]


def test_no_completions_when_no_server_has_them() -> None:
    capabilities = initialized_result("2025-06-18", (GITHUB,))["capabilities"]
    assert capabilities == {**LISTS, "logging": {}}


def test_lists_offered_even_by_servers_without_them() -> None:
    bare = server("bare", capabilities={"experimental": {"x": {}}})
    capabilities = initialized_result("2025-06-18", (bare,))["capabilities"]
    assert capabilities == {**LISTS, "logging": {}}


def test_server_without_identity_left_out_of_instructions() -> None:
    down = server("down", DOWN, error="exited with code 1")
    result = initialized_result("2025-06-18", (FILES, down))
    assert "files, down" in result["instructions"]
    assert "## down" not in result["instructions"]


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_initialize_negotiates_known_version(version: str) -> None:
    assert initialized_result(version)["protocolVersion"] == version


@pytest.mark.parametrize("version", ["2026-07-28", "1999-01-01"])
def test_initialize_unknown_version_gives_latest(version: str) -> None:
    assert initialized_result(version)["protocolVersion"] == LATEST_LEGACY_VERSION


def test_empty_view_instructions() -> None:
    assert "no MCP servers" in initialized_result("2025-06-18", ())["instructions"]


def test_initialize_bad_params() -> None:
    proto = new()
    id, code, _ = error_of(proto.receive(req(5, "initialize", {"capabilities": {}})))
    assert (id, code) == (5, INVALID_PARAMS)
    assert proto.state is SessionState.CONNECTING


def test_second_initialize_rejected() -> None:
    proto = session()
    id, code, message = error_of(proto.receive(initialize(2, "2024-11-05")))
    assert (id, code) == (2, INVALID_REQUEST)
    assert "already initialized" in message
    assert proto.protocol_version == "2025-06-18"


# -- initialize, transparent -------------------------------------------------


def test_transparent_initialize_is_the_servers_own() -> None:
    result = initialized_result("2025-06-18", (FILES,), transparent=True)
    assert result == {
        "protocolVersion": "2025-06-18",
        "serverInfo": {"name": "files-server", "version": "unknown"},  # (it gave none)
        "instructions": "Read files.",
        "capabilities": {**LISTS, **SUBSCRIBABLE, "completions": {}, "logging": {}},
    }


@pytest.mark.parametrize(
    ("said", "told"),
    [
        (
            {"name": "fs", "version": "2", "title": "Files"},
            {"name": "fs", "version": "2", "title": "Files"},
        ),
        ({}, {"name": "files", "version": "unknown"}),  # (a modern server need not say)
        ({"name": 7, "version": None, "x": 1}, {"name": "files", "version": "unknown", "x": 1}),
    ],
)
def test_transparent_server_info_has_what_the_schema_requires(
    said: dict[str, Any], told: dict[str, Any]
) -> None:
    """name and version, strings: the server's own, else its name in the
    config and "unknown" (the SDK's client refuses an initialize without them)."""
    identity = ServerIdentity("2025-06-18", {"tools": {}}, said)
    entry = ServerEntry("files", READY, identity=identity, lists={"tools": ()})
    assert initialized_result("2025-06-18", (entry,), transparent=True)["serverInfo"] == told


def test_transparent_initialize_passes_only_what_the_server_has() -> None:
    capabilities = {"tools": {}, "experimental": {"x": {}}, "tasks": {"list": {}}}
    tools_only = server("t", capabilities=capabilities)
    result = initialized_result("2024-11-05", (tools_only,), transparent=True)
    assert result["capabilities"] == {"tools": {"listChanged": True}}
    assert "instructions" not in result


def test_transparent_initialize_without_completions_for_2024_11_05() -> None:
    result = initialized_result("2024-11-05", (FILES,), transparent=True)
    assert "completions" not in result["capabilities"]


def test_transparent_needs_exactly_one_server() -> None:
    assert initialized_result("2025-06-18", transparent=True)["serverInfo"] == BROKER_INFO


@pytest.mark.parametrize(
    ("entry", "settled", "message"),
    [
        (server("files", DOWN, error="exited with code 2"), False, "is not running"),
        (server("files", LOADING), True, "is still starting"),  # the wait timed out
    ],
)
def test_transparent_initialize_without_identity(
    entry: ServerEntry, settled: bool, message: str
) -> None:
    proto = new((entry,), transparent=True)
    error = error_object(proto.receive(initialize(3), settled=settled))
    assert (error["id"], error["code"]) == (3, CONNECTION_CLOSED)
    assert error["message"].startswith("MCP server 'files' " + message)
    assert error["data"] == {"server": "files"}
    assert proto.state is SessionState.CONNECTING


# -- waiting for the view to settle ------------------------------------------

UNSETTLED = [LOADING, IDLE]


def loading_github(state: ServerState) -> tuple[ServerEntry, ...]:
    return FILES, server("github", state)


def settle(proto: SessionProtocol) -> None:
    """The Registry publishes a snapshot in which github is ready."""
    assert isinstance(proto.catalogs, Catalogs)
    proto.catalogs.current = Catalog([FILES, GITHUB])


@pytest.mark.parametrize("state", UNSETTLED)
def test_initialize_deferred_until_settled(state: ServerState) -> None:
    proto = new(loading_github(state))
    message = initialize(1)
    assert proto.receive(message) == [Defer(message)]
    assert proto.state is SessionState.CONNECTING
    settle(proto)
    result = result_of(proto.receive(message, settled=True))
    assert "## github" in result["instructions"]
    assert proto.state is SessionState.OPERATING


@pytest.mark.parametrize("state", UNSETTLED)
def test_transparent_initialize_deferred_until_settled(state: ServerState) -> None:
    proto = new(loading_github(state), ("github",), transparent=True)
    message = initialize(1)
    assert proto.receive(message) == [Defer(message)]
    settle(proto)
    assert result_of(proto.receive(message, settled=True))["serverInfo"] == {
        "name": "github-server",
        "version": "unknown",
    }


@pytest.mark.parametrize("state", UNSETTLED)
@pytest.mark.parametrize("method", sorted(KIND_BY_METHOD))
def test_list_deferred_until_settled(state: ServerState, method: str) -> None:
    proto = session(loading_github(state))
    message = req(2, method)
    assert proto.receive(message) == [Defer(message)]
    settle(proto)
    assert proto.receive(message, settled=True) == session().receive(message)


@pytest.mark.parametrize("state", UNSETTLED)
def test_unknown_name_deferred_until_settled(state: ServerState) -> None:
    proto = session(loading_github(state))
    message = call(4, "github__search")
    assert proto.receive(message) == [Defer(message)]
    assert proto.inflight == {4}  # (while it waits: no other request takes its id)
    settle(proto)
    assert proto.receive(message, settled=True) == [forwarded(4, "github", "search")]
    assert proto.inflight == {4}


def test_unknown_name_after_settling_is_an_error() -> None:
    proto = session(loading_github(LOADING))
    id, code, message = error_of(proto.receive(call(4, "nope"), settled=True))
    assert (id, code, message) == (4, INVALID_PARAMS, "Unknown tool: nope")


def test_known_name_forwarded_while_another_server_loads() -> None:
    proto = session(loading_github(LOADING))
    assert proto.receive(call(5)) == [forwarded(5)]


def test_ping_not_deferred() -> None:
    proto = new(loading_github(IDLE))
    assert proto.receive(req("p", "ping")) == [ok("p")]


def test_servers_outside_the_view_are_not_waited_for() -> None:
    proto = new(loading_github(LOADING), view=("files",))
    assert result_of(proto.receive(initialize(1)))["serverInfo"] == BROKER_INFO


# -- lists -------------------------------------------------------------------


def listed(proto: SessionProtocol, method: str, id: Any = 1) -> list[dict[str, Any]]:
    result = result_of(proto.receive(req(id, method)))
    assert "nextCursor" not in result
    return result[KIND_BY_METHOD[method].key]


def test_aggregated_lists() -> None:
    proto = session()
    assert names(listed(proto, "tools/list")) == ["files__read", "files__write", "github__search"]
    assert names(listed(proto, "prompts/list")) == ["files__summarize", "github__review"]
    resources = listed(proto, "resources/list")
    assert names(resources, "uri") == ["file:///README.md", "file:///gh.txt"]
    templates = listed(proto, "resources/templates/list")
    assert names(templates, "uriTemplate") == [
        "file:///{+path}",
        "gh://{owner}/{repo}/issues{?state}",
    ]
    assert listed(proto, "tools/list")[0] == {"name": "files__read", "description": "does read"}
    assert proto.inflight == set()


def test_transparent_lists() -> None:
    proto = session((FILES, GITHUB), ("github",), transparent=True)
    assert listed(proto, "tools/list") == list(GITHUB.items(KIND_BY_METHOD["tools/list"]))
    assert names(listed(proto, "prompts/list")) == ["review"]


def test_aggregated_view_of_one_server() -> None:
    proto = session((FILES, GITHUB), ("github",))
    assert names(listed(proto, "tools/list")) == ["github__search"]


@pytest.mark.parametrize("method", sorted(KIND_BY_METHOD))
def test_empty_view_lists_are_empty(method: str) -> None:
    assert listed(session(()), method) == []


def pages(proto: SessionProtocol, method: str) -> list[list[dict[str, Any]]]:
    """Every page of a list, following nextCursor."""
    out, params, key = [], {}, KIND_BY_METHOD[method].key
    for id in range(10):
        result = result_of(proto.receive(req(id, method, params)))
        out.append(result[key])
        if "nextCursor" not in result:
            return out
        params = {"cursor": result["nextCursor"]}
    raise AssertionError("cursors never end")


def joined(pages: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [item for page in pages for item in page]


def test_pages_chain_to_the_full_list() -> None:
    proto = session(page_size=2)
    assert [len(page) for page in pages(proto, "tools/list")] == [2, 1]
    assert joined(pages(proto, "tools/list")) == listed(session(), "tools/list")
    assert [len(page) for page in pages(proto, "prompts/list")] == [2]


def test_transparent_pages() -> None:
    proto = session((FILES,), transparent=True, page_size=1)
    assert names(joined(pages(proto, "tools/list"))) == ["read", "write"]


@pytest.mark.parametrize("cursor", ["garbage", "", 7, {"o": 1}])
def test_garbage_cursor(cursor: Any) -> None:
    proto = session(page_size=2)
    id, code, message = error_of(proto.receive(req(3, "tools/list", {"cursor": cursor})))
    assert (id, code) == (3, INVALID_PARAMS)
    assert "cursor" in message


def test_cursor_of_another_list() -> None:
    proto = session(page_size=1)
    cursor = result_of(proto.receive(req(1, "prompts/list")))["nextCursor"]
    id, code, _ = error_of(proto.receive(req(2, "tools/list", {"cursor": cursor})))
    assert (id, code) == (2, INVALID_PARAMS)


# -- calls: routed by name, URI or completion ref ----------------------------


@pytest.mark.parametrize(
    ("method", "qualified", "server_name", "own"),
    [
        ("tools/call", "github__search", "github", "search"),
        ("tools/call", "files__write", "files", "write"),
        ("prompts/get", "files__summarize", "files", "summarize"),
    ],
)
def test_call_forwarded_with_the_servers_own_name(
    method: str, qualified: str, server_name: str, own: str
) -> None:
    proto = session()
    extra = {"arguments": {"q": "x"}, "_meta": {"progressToken": "p"}}
    message = req(7, method, {"name": qualified, **extra})
    before = copy.deepcopy(message)
    assert proto.receive(message) == [Forward(server_name, req(7, method, {"name": own, **extra}))]
    assert message == before  # the client's message is not changed
    assert proto.inflight == {7}


def test_transparent_call_forwarded_as_it_is() -> None:
    proto = session((FILES,), transparent=True)
    message = call(1, "read", arguments={})
    assert proto.receive(message) == [Forward("files", message)]
    assert proto.receive(call(2, "anything")) == [Forward("files", call(2, "anything"))]


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (call(1, "files__nope"), "Unknown tool: files__nope"),
        (call(1, "read"), "Unknown tool: read"),
        (req(1, "tools/call"), "Unknown tool: None"),
        (req(1, "prompts/get", {"name": "files__read"}), "Unknown prompt: files__read"),
    ],
)
def test_unknown_name(message: dict[str, Any], text: str) -> None:
    proto = session()
    assert error_of(proto.receive(message)) == (1, INVALID_PARAMS, text)
    assert proto.inflight == set()


def test_name_of_a_server_that_is_down() -> None:
    proto = session((FILES, server("github", DOWN, error="exited with code 3")))
    error = error_object(proto.receive(call("d", "github__search")))
    assert (error["id"], error["code"]) == ("d", CONNECTION_CLOSED)
    assert "'github'" in error["message"] and "exited with code 3" in error["message"]
    assert error["data"] == {"server": "github", "retryable": True}
    assert proto.inflight == set()


def read(id: Any, uri: Any) -> dict[str, Any]:
    return req(id, "resources/read", {"uri": uri})


@pytest.mark.parametrize(
    ("uri", "owner"),
    [
        ("file:///README.md", "files"),
        ("file:///gh.txt", "github"),  # an exact URI wins over files' earlier template
        ("file:///src/main.py", "files"),
        ("gh://octo/hello/issues?state=open", "github"),
    ],
)
def test_read_routed_by_uri(uri: str, owner: str) -> None:
    assert session().receive(read(1, uri)) == [Forward(owner, read(1, uri))]


def test_an_unsubscribe_goes_where_the_subscription_is() -> None:
    """c1 subscribes to b://own, which only ``b`` lists (``a`` is down); then
    ``a`` comes back listing it too, and serves its reads. The unsubscribe,
    and a repeat subscribe, go to ``b``, which holds the subscription; after
    it, the URI goes where the catalog says. It went to ``a``: answered "never
    subscribed", while ``b`` kept sending the session updates. (Neither takes
    the fast path.)"""
    own = ({"uri": "b://own", "name": "own"},)
    b = server("b", capabilities=SUBSCRIBABLE, resources=own)
    catalogs = Catalogs(Catalog([server("a", DOWN), b]))
    proto = SessionProtocol(("a", "b"), catalogs)
    proto.receive(initialize(), settled=True)
    subscribe = req(1, "resources/subscribe", {"uri": "b://own"})
    assert proto.forward_fast(subscribe) is None
    assert proto.receive(subscribe) == [Forward("b", subscribe)]
    proto.outgoing(jsonrpc.result_response(1, {}))  # (b took it)
    back = server("a", capabilities=SUBSCRIBABLE, resources=own)
    catalogs.current = catalogs.current.replace(back)
    assert proto.receive(read(2, "b://own")) == [Forward("a", read(2, "b://own"))]
    again = req(3, "resources/subscribe", {"uri": "b://own"})
    assert proto.receive(again) == [Forward("b", again)]
    unsubscribe = req(4, "resources/unsubscribe", {"uri": "b://own"})
    assert proto.forward_fast(unsubscribe) is None
    assert proto.receive(unsubscribe) == [Forward("b", unsubscribe)]
    later = req(5, "resources/unsubscribe", {"uri": "b://own"})
    assert proto.receive(later) == [Forward("a", later)]
    assert proto.subscribed == {}


def test_a_refused_subscribe_leaves_the_uri_where_the_catalog_routes_it() -> None:
    """``b`` refuses c1's subscribe of b://own; then ``b`` no longer lists it
    and ``a`` does: a repeat subscribe goes to ``a``, as a read does. (The
    note was written when the subscribe was sent and kept when refused: the
    URI was pinned to ``b`` while ``b`` was in the view.) A refused repeat
    subscribe leaves the subscription where it is. Found by probing."""
    own = ({"uri": "b://own", "name": "own"},)
    b = server("b", capabilities=SUBSCRIBABLE, resources=own)
    catalogs = Catalogs(Catalog([server("a", capabilities=SUBSCRIBABLE), b]))
    proto = SessionProtocol(("a", "b"), catalogs)
    proto.receive(initialize(), settled=True)
    subscribe = req(1, "resources/subscribe", {"uri": "b://own"})
    assert proto.receive(subscribe) == [Forward("b", subscribe)]
    assert proto.outgoing(error(1)) == error(1)
    assert proto.subscribed == {}
    catalogs.current = catalogs.current.replace(server("b", capabilities=SUBSCRIBABLE))
    catalogs.current = catalogs.current.replace(
        server("a", capabilities=SUBSCRIBABLE, resources=own)
    )
    again = req(2, "resources/subscribe", {"uri": "b://own"})
    assert proto.receive(again) == [Forward("a", again)]
    proto.outgoing(jsonrpc.result_response(2, {}))
    repeat = req(3, "resources/subscribe", {"uri": "b://own"})
    assert proto.receive(repeat) == [Forward("a", repeat)]
    proto.outgoing(error(3))  # (say, the broker's maxServerInFlight)
    assert proto.subscribed == {"b://own": "a"} and proto.subscribing == {}


def error(id: Any) -> dict[str, Any]:
    return jsonrpc.error_response(id, INVALID_PARAMS, "no such resource")


def test_a_sessions_subscriptions_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each URI a session subscribed to was noted for the whole session, with
    no limit: past MAX_SUBSCRIPTIONS a subscribe of another URI is refused,
    saying so (a repeat one is not); the notes of a server that left the
    view are let go first, and an unsubscribe makes room. Found by probing."""
    monkeypatch.setattr("broker.session.MAX_SUBSCRIPTIONS", 3)
    files = server("files", capabilities=SUBSCRIBABLE, resources=({"uri": "file:///x"},))
    b = server("b", capabilities=SUBSCRIBABLE, resources=({"uri": "b://z"},))
    catalogs = Catalogs(Catalog([files, b]))
    proto = SessionProtocol(("files", "b"), catalogs)
    proto.receive(initialize(), settled=True)

    def subscribe(id: int, uri: str, method: str = "resources/subscribe") -> list[Any]:
        actions = proto.receive(req(id, method, {"uri": uri}))
        if actions and isinstance(actions[0], Forward):
            proto.outgoing(jsonrpc.result_response(id, {}))
        return actions

    for id, uri in enumerate(("file:///x", "file:///y", "b://z"), 1):
        assert isinstance(subscribe(id, uri)[0], Forward)
    refused = error_object(subscribe(4, "file:///w"))
    assert refused["code"] == LIMIT_REACHED and "unsubscribe from some first" in refused["message"]
    assert isinstance(subscribe(5, "file:///x")[0], Forward)  # (held already)
    assert isinstance(subscribe(6, "file:///y", "resources/unsubscribe")[0], Forward)
    assert isinstance(subscribe(7, "file:///w")[0], Forward)
    assert error_object(subscribe(8, "file:///v"))["code"] == LIMIT_REACHED
    proto.view = ("files",)  # (a reload removed b)
    assert isinstance(subscribe(9, "file:///v")[0], Forward)
    assert proto.subscribed == {"file:///x": "files", "file:///w": "files", "file:///v": "files"}


@pytest.mark.parametrize("transparent", [False, True])
def test_a_subscribed_uri_is_bounded_in_length(
    monkeypatch: pytest.MonkeyPatch, transparent: bool
) -> None:
    """MAX_SUBSCRIPTIONS bounded a session's notes in URIs, not in bytes: one
    URI may be as long as a message. A subscribe of a URI past
    MAX_SUBSCRIBED_URI is refused, by any session (a shared server keeps
    its subscribers' URIs too)."""
    monkeypatch.setattr("broker.session.MAX_SUBSCRIBED_URI", 16)
    files = server("files", capabilities=SUBSCRIBABLE, resources=({"uri": "file:///x"},))
    view = ("files",) if transparent else ("files", "b")
    b = server("b", capabilities=SUBSCRIBABLE, resources=({"uri": "b://z"},))
    proto = SessionProtocol(view, Catalogs(Catalog([files, b])), transparent=transparent)
    proto.receive(initialize(), settled=True)
    long = "file:///" + "y" * 9
    refused = error_object(proto.receive(req(1, "resources/subscribe", {"uri": long})))
    assert refused["code"] == INVALID_PARAMS and "over 16 characters" in refused["message"]
    ok = proto.receive(req(2, "resources/subscribe", {"uri": "file:///x"}))
    assert isinstance(ok[0], Forward)


def test_unknown_resource() -> None:
    assert error_object(session().receive(read(2, "nope://x"))) == {
        "id": 2,
        "code": RESOURCE_NOT_FOUND,
        "message": "Resource not found",
        "data": {"uri": "nope://x"},
    }


def complete(id: Any, ref: Any) -> dict[str, Any]:
    return req(id, "completion/complete", {"ref": ref, "argument": {"name": "a", "value": "b"}})


def test_completion_of_a_prompt_gets_its_own_name() -> None:
    message = complete(1, {"type": "ref/prompt", "name": "github__review"})
    before = copy.deepcopy(message)
    expected = complete(1, {"type": "ref/prompt", "name": "review"})
    assert session().receive(message) == [Forward("github", expected)]
    assert message == before


@pytest.mark.parametrize(
    ("template", "owner"),
    [("gh://{owner}/{repo}/issues{?state}", "github"), ("file:///{+path}", "files")],
)
def test_completion_of_a_template_by_its_exact_text(template: str, owner: str) -> None:
    message = complete(1, {"type": "ref/resource", "uri": template})
    assert session().receive(message) == [Forward(owner, message)]


@pytest.mark.parametrize(
    ("ref", "text"),
    [
        ({"type": "ref/resource", "uri": "nope://a.txt"}, "Unknown resource template"),
        ({"type": "ref/prompt", "name": "nope"}, "Unknown prompt: nope"),
        ({"type": "ref/tool", "name": "x"}, "Unknown completion ref type: 'ref/tool'"),
        (None, "completion/complete needs params.ref"),
    ],
)
def test_completion_errors(ref: Any, text: str) -> None:
    id, code, message = error_of(session().receive(complete(9, ref)))
    assert (id, code) == (9, INVALID_PARAMS)
    assert message.startswith(text)


# -- before initialize -------------------------------------------------------


def test_ping_before_initialize() -> None:
    proto = new()
    assert proto.receive(req("p", "ping")) == [ok("p")]
    assert proto.state is SessionState.CONNECTING


@pytest.mark.parametrize("method", ["tools/list", "tools/call", "made/up"])
def test_other_requests_before_initialize(method: str) -> None:
    id, code, message = error_of(new().receive(req(1, method)))
    assert (id, code) == (1, INVALID_REQUEST)
    assert "initialize" in message


def test_notification_before_initialize_ignored() -> None:
    assert new().receive(jsonrpc.notification("notifications/initialized")) == []


# -- local answers and errors ------------------------------------------------


@pytest.mark.parametrize(
    "again",
    [
        req(20, "ping"),
        req(20, "tools/list"),
        req(20, "prompts/list"),
        req(20, "resources/list"),
        req(20, "resources/templates/list"),
        req(20, "logging/setLevel", {"level": "debug"}),
        req(20, "initialize"),
        req(20, "no/such/method"),
        call(20, "github__search"),
    ],
)
def test_a_request_reusing_an_id_in_flight_is_refused_whoever_answers_it(
    again: dict[str, Any],
) -> None:
    """docs/eras.md: a request with an id in use is refused -32600 with id
    null, also one the broker answers itself, so the call's answer stays
    the only one with that id."""
    proto = session()
    assert proto.receive(call(20)) == [forwarded(20)]
    actions = proto.receive(again)
    assert error_of(actions) == (
        None,
        INVALID_REQUEST,
        "Invalid Request: id 20 is already in use by a request in flight",
    )
    assert proto.inflight == {20}
    assert proto.receive(req("20", "ping")) == [ok("20")]  # ("20" is another id)
    proto.outgoing(upstream_answer(20))
    assert proto.receive(req(20, "ping")) == [ok(20)]  # (answered: free again)


def test_a_deferred_requests_id_is_in_flight_while_it_waits() -> None:
    """A request waiting for its servers (Defer) holds its id: a ping read
    meanwhile (answered at once: broker.session.while_waiting) is refused;
    the id is free once the request is taken again, or its wait cancelled."""
    from broker.session import DROP, NOW, while_waiting

    proto = session(loading_github(LOADING))
    waiting = req(2, "tools/list")
    assert proto.receive(waiting) == [Defer(waiting)]
    assert while_waiting(req(2, "ping"), 2, proto.inflight) == NOW
    assert error_of(proto.receive(req(2, "ping")))[:2] == (None, INVALID_REQUEST)
    settle(proto)
    assert result_of(proto.receive(waiting, settled=True))["tools"]
    assert proto.inflight == set()
    assert proto.receive(req(2, "ping")) == [ok(2)]

    proto = session(loading_github(LOADING))
    assert proto.receive(waiting) == [Defer(waiting)]
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
    assert while_waiting(cancel, 2, proto.inflight) == DROP  # (never taken again)
    assert proto.inflight == set()
    assert proto.receive(req(2, "ping")) == [ok(2)]


@pytest.mark.parametrize("initialized", [False, True])
def test_server_discover_not_found(initialized: bool) -> None:
    proto = session() if initialized else new()
    id, code, _ = error_of(proto.receive(req(1, "server/discover")))
    assert (id, code) == (1, METHOD_NOT_FOUND)


def test_unknown_method() -> None:
    id, code, message = error_of(session().receive(req("u", "made/up")))
    assert (id, code) == ("u", METHOD_NOT_FOUND)
    assert "made/up" in message


def test_ping_after_initialize() -> None:
    assert session().receive(req(9, "ping")) == [ok(9)]


def test_invalid_message_answered() -> None:
    proto = session()
    id, code, _ = error_of(proto.receive({"jsonrpc": "2.0", "id": 3, "method": 4}))
    assert (id, code) == (3, INVALID_REQUEST)
    id, code, _ = error_of(proto.receive("hello"))
    assert (id, code) == (None, INVALID_REQUEST)


def test_response_to_nothing_the_broker_asked_ignored() -> None:
    assert session().receive(jsonrpc.result_response(1, {})) == []


# -- cancellation and in-flight bookkeeping ----------------------------------


def cancel(request_id: Any, **extra: Any) -> dict[str, Any]:
    return jsonrpc.notification("notifications/cancelled", {"requestId": request_id, **extra})


def test_cancellation_goes_upstream() -> None:
    proto = session()
    proto.receive(call("r"))
    assert proto.receive(cancel("r", reason="user")) == [
        CancelUpstream({"requestId": "r", "reason": "user"})
    ]
    assert proto.inflight == set()


@pytest.mark.parametrize(
    "note",
    [
        cancel(None),
        cancel(1.5),
        cancel(True),
        jsonrpc.notification("notifications/cancelled"),
    ],
)
def test_cancellation_without_valid_id_ignored(note: dict[str, Any]) -> None:
    assert session().receive(note) == []


def test_inflight_cleared_by_outgoing_response() -> None:
    proto = session()
    proto.receive(call(1))
    proto.receive(call("1"))
    assert proto.inflight == {1, "1"}
    assert proto.outgoing(upstream_answer("1")) == upstream_answer("1")
    assert proto.inflight == {1}
    note = jsonrpc.notification("notifications/progress", {"progressToken": 1})
    assert proto.outgoing(note) == note
    assert proto.inflight == {1}
    assert proto.outgoing(upstream_answer(1)) == upstream_answer(1)
    assert proto.inflight == set()


# -- refusal -----------------------------------------------------------------


@pytest.mark.parametrize("message", [initialize(1), req(1, "ping"), req(1, "tools/list")])
def test_refusal_answers_every_request(message: dict[str, Any]) -> None:
    proto = new((), refusal="unknown server 'nope'")
    id, code, text = error_of(proto.receive(message))
    assert (id, code) == (1, INVALID_PARAMS)
    assert "unknown server 'nope'" in text
    assert proto.state is SessionState.CONNECTING


def test_a_refusal_carries_its_data() -> None:
    """A hello naming an unknown server is refused with data the shim reads
    (retryable false: it ends, and on no other error: cli/reconnect.py)."""
    data = {"unknown": ["nope"], "retryable": False}
    proto = SessionProtocol((), Catalogs(Catalog(())), refusal="x", refusal_data=data)
    assert error_object(proto.receive(initialize(1)))["data"] == data


# -- batches -----------------------------------------------------------------


def batch_session(entries: tuple[ServerEntry, ...] = (FILES, GITHUB)) -> SessionProtocol:
    return session(entries, version="2025-03-26")


def sent_out(proto: SessionProtocol, messages: list[Any]) -> list[Any]:
    """What the connection writes for ``messages`` (held ones left out)."""
    written = [proto.outgoing(message) for message in messages]
    return [message for message in written if message is not None]


def replies(actions: list[Any]) -> list[Any]:
    return [action.message for action in actions if isinstance(action, Reply)]


def by_id(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(messages, key=lambda message: repr(message.get("id")))


@pytest.mark.parametrize("version", ["2024-11-05", "2025-06-18", "2025-11-25"])
def test_batch_rejected_outside_2025_03_26(version: str) -> None:
    proto = session(version=version)
    id, code, message = error_of(proto.receive([req(1, "ping")]))
    assert (id, code) == (None, INVALID_REQUEST)
    assert "2025-03-26" in message and version in message


def test_batch_rejected_before_initialize() -> None:
    id, code, message = error_of(new().receive([req(1, "ping")]))
    assert (id, code) == (None, INVALID_REQUEST)
    assert "none yet" in message


@pytest.mark.parametrize("initialized", [False, True])
def test_empty_batch(initialized: bool) -> None:
    proto = batch_session() if initialized else new()
    id, code, message = error_of(proto.receive([]))
    assert (id, code) == (None, INVALID_REQUEST)
    assert "Empty batch" in message


def test_mixed_batch_collected_into_one_array() -> None:
    proto = batch_session()
    invalid = {"jsonrpc": "2.0", "method": 42}
    actions = proto.receive(
        [req(1, "ping"), call(2), jsonrpc.notification("notifications/initialized"), invalid]
    )
    assert actions == [ok(1), forwarded(2)]
    assert proto.inflight == {2}

    # The actor passes the ping reply through outgoing(): held for the batch.
    assert sent_out(proto, replies(actions)) == []
    [array] = sent_out(proto, [upstream_answer(2)])
    assert isinstance(array, list)
    assert len(array) == 3
    [error] = [message for message in array if "error" in message]
    assert (error["id"], error["error"]["code"]) == (None, INVALID_REQUEST)
    assert by_id([m for m in array if "result" in m]) == [
        jsonrpc.result_response(1, {}),
        upstream_answer(2),
    ]
    assert proto.inflight == set()
    assert not proto.batches.pending


def test_batch_of_local_answers() -> None:
    proto = batch_session()
    actions = proto.receive([req(1, "ping"), req("1", "made/up"), req(2, "prompts/list")])
    assert len(actions) == 3
    [array] = sent_out(proto, replies(actions))
    assert [message["id"] for message in array] == [1, "1", 2]
    assert array[1]["error"]["code"] == METHOD_NOT_FOUND
    assert names(array[2]["result"]["prompts"]) == ["files__summarize", "github__review"]


def test_deferred_batch_item_collected_when_answered() -> None:
    proto = batch_session(loading_github(LOADING))
    actions = proto.receive([req(1, "ping"), req(2, "tools/list")])
    assert actions == [ok(1), Defer(req(2, "tools/list"))]
    assert sent_out(proto, replies(actions)) == []
    again = proto.receive(req(2, "tools/list"), settled=True)
    [array] = sent_out(proto, replies(again))
    assert [message["id"] for message in array] == [1, 2]
    assert not proto.batches.pending


def test_batch_of_invalid_items_answered_at_once() -> None:
    proto = batch_session()
    [reply] = proto.receive([1, "x", [req(1, "ping")]])
    assert isinstance(reply, Reply) and isinstance(reply.message, list)
    assert [(m["id"], m["error"]["code"]) for m in reply.message] == [(None, INVALID_REQUEST)] * 3
    assert not proto.batches.pending


def test_batch_of_notifications_gets_nothing() -> None:
    proto = batch_session()
    proto.receive(call("r"))
    assert proto.receive([jsonrpc.notification("notifications/initialized"), cancel("r")]) == [
        CancelUpstream({"requestId": "r"})
    ]


def test_initialize_in_batch_rejected() -> None:
    proto = batch_session()
    actions = proto.receive([initialize(7, "2025-03-26")])
    [array] = sent_out(proto, replies(actions))
    [error] = array
    assert (error["id"], error["error"]["code"]) == (7, INVALID_REQUEST)
    assert "batch" in error["error"]["message"]


def test_responses_outside_the_batch_pass_through() -> None:
    proto = batch_session()
    proto.receive(call("solo"))
    proto.receive([call(1), call(2)])
    assert sent_out(proto, [upstream_answer(1)]) == []
    assert sent_out(proto, [upstream_answer("solo")]) == [upstream_answer("solo")]
    assert sent_out(proto, [upstream_answer(2)]) == [[upstream_answer(1), upstream_answer(2)]]
    assert proto.inflight == set()


def test_two_batches_collected_separately() -> None:
    proto = batch_session()
    proto.receive([call(1), call(2)])
    proto.receive([call(3)])
    assert sent_out(proto, [upstream_answer(3)]) == [[upstream_answer(3)]]
    assert sent_out(proto, [upstream_answer(2), upstream_answer(1)]) == [
        [upstream_answer(2), upstream_answer(1)]
    ]


def test_cancelled_batch_request_releases_the_rest() -> None:
    proto = batch_session()
    actions = proto.receive([req(1, "ping"), call(2)])
    assert sent_out(proto, replies(actions)) == []
    # The server will never answer 2 now: the batch goes out without it.
    assert proto.receive(cancel(2)) == [
        CancelUpstream({"requestId": 2}),
        Reply([jsonrpc.result_response(1, {})]),
    ]
    assert not proto.batches.pending


def test_cancelled_batch_request_before_other_answers() -> None:
    proto = batch_session()
    actions = proto.receive([req(1, "ping"), call(2)])
    assert proto.receive(cancel(2)) == [CancelUpstream({"requestId": 2})]
    assert sent_out(proto, replies(actions)) == [[jsonrpc.result_response(1, {})]]


def test_cancel_inside_the_batch_sends_the_array_once() -> None:
    proto = batch_session()
    invalid = {"jsonrpc": "2.0", "method": 42}
    actions = proto.receive([invalid, call(2), cancel(2)])
    assert [type(action) for action in actions] == [Forward, CancelUpstream, Reply]
    [array] = replies(actions)
    assert [(m["id"], m["error"]["code"]) for m in array] == [(None, INVALID_REQUEST)]
    assert not proto.batches.pending


def test_a_roots_change_goes_to_the_servers_and_answers_to_server_requests_go_back() -> None:
    proto = session()
    note = jsonrpc.notification("notifications/roots/list_changed")
    assert proto.receive(note) == [NotifyUpstreams(note)]
    server = proto.view[0]
    answer = {"jsonrpc": "2.0", "id": f"mcpbroker:{server}:3", "result": {"roots": []}}
    assert proto.receive(answer) == [RespondUpstream(server, answer)]
    stray = {"jsonrpc": "2.0", "id": "not-ours:3", "result": {}}
    assert proto.receive(stray) == []
    # A server outside the view: a reload removed it, but its old process
    # may still wait for this answer while it drains (the session's actor
    # hands it to that one, or drops it: actors/session.py, _askers).
    gone = {"jsonrpc": "2.0", "id": "mcpbroker:gone:3", "result": {}}
    assert proto.receive(gone) == [RespondUpstream("gone", gone)]


def test_what_a_session_does_with_a_message_read_while_a_request_waits() -> None:
    """broker.session.while_waiting: a ping and a cancel of a request in
    flight now, a cancel of the waiting request drops it, all else after."""
    from broker.session import DROP, HOLD, NOW, while_waiting

    def cancel(target: Any) -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": target},
        }

    inflight = {7, "x"}
    assert while_waiting({"jsonrpc": "2.0", "id": 1, "method": "ping"}, 3, inflight) == NOW
    assert while_waiting({"jsonrpc": "2.0", "method": "ping"}, 3, inflight) == HOLD
    assert while_waiting(cancel(3), 3, inflight) == DROP
    assert while_waiting(cancel("3"), 3, inflight) == HOLD  # (another id: "3" is not 3)
    assert while_waiting(cancel(True), 1, {1}) == HOLD  # (nor is true 1)
    assert while_waiting(cancel(7), 3, inflight) == NOW
    assert while_waiting(cancel(8), 3, inflight) == HOLD  # (read, not taken yet: after it)
    assert while_waiting({"jsonrpc": "2.0", "method": "notifications/cancelled"}, 3, set()) == HOLD
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {}}
    assert while_waiting(call, 3, inflight) == HOLD
    assert while_waiting([call], 3, inflight) == HOLD
