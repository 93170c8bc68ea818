"""broker.catalog: one immutable snapshot of every server's lists, and routing by it."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.catalog import (
    KINDS,
    PROMPTS,
    RESOURCE_NOT_FOUND,
    RESOURCES,
    TEMPLATES,
    TOOLS,
    Catalog,
    ServerEntry,
    decode_cursor,
    encode_cursor,
)
from broker.jsonrpc import CONNECTION_CLOSED, INVALID_PARAMS, JsonRpcError
from broker.lifecycle import ServerIdentity
from broker.states import ServerState

# LOADING: coming up (not settled); DOWN: down (settled), in the server's own states.
READY, LOADING, IDLE, DOWN = (ServerState.READY, ServerState.STARTING, ServerState.IDLE,
                              ServerState.RESTARTING)  # fmt: skip


def server(
    name: str, state: ServerState = READY, error: str | None = None, **lists: Any
) -> ServerEntry:
    """An entry whose lists are given as ids: tools=["read"], resources=["file:///a"]."""
    fields = {"tools": "name", "prompts": "name", "resources": "uri", "templates": "uriTemplate"}
    built = {
        kind: tuple({fields[kind]: id, "description": f"{id} of {name}"} for id in ids)
        for kind, ids in lists.items()
    }
    return ServerEntry(name, state, lists=built, error=error)


FILES = server(
    "files",
    tools=["read", "write"],
    prompts=["summarize"],
    resources=["file:///README.md", "shared://notes"],
    templates=["file:///{+path}", "shared://{name}"],
)
GITHUB = server(
    "github",
    tools=["search", "read"],
    prompts=["review"],
    resources=["shared://notes", "file:///gh.txt"],
    templates=["gh://{owner}/{repo}/issues{?state}", "shared://{name}"],
)
ALL = ("files", "github")


@contextlib.contextmanager
def took_under(seconds: float) -> Iterator[None]:
    """Fail when the block took longer than ``seconds`` (after it ran)."""
    start = time.perf_counter()
    yield
    assert time.perf_counter() - start < seconds


def catalog(*entries: ServerEntry, **options: Any) -> Catalog:
    return Catalog(entries or (FILES, GITHUB), **options)


def ids(
    catalog: Catalog, kind: Any, view: tuple[str, ...] = ALL, transparent: bool = False
) -> list:
    return [item[kind.id_field] for item in catalog.items(kind, view, transparent)]


def error_of(call: Any, *args: Any) -> JsonRpcError:
    with pytest.raises(JsonRpcError) as info:
        call(*args)
    return info.value


# -- listing -----------------------------------------------------------------


def test_items_in_config_order_then_each_servers_order() -> None:
    assert ids(catalog(), TOOLS) == [
        "files__read",
        "files__write",
        "github__search",
        "github__read",
    ]
    assert ids(catalog(GITHUB, FILES), TOOLS) == [
        "github__search", "github__read", "files__read", "files__write",
    ]  # fmt: skip
    assert ids(catalog(), PROMPTS) == ["files__summarize", "github__review"]


def test_view_order_does_not_matter() -> None:
    assert ids(catalog(), TOOLS, ("github", "files")) == ids(catalog(), TOOLS, ALL)


def test_view_limits_the_items() -> None:
    assert ids(catalog(), TOOLS, ("github",)) == ["github__search", "github__read"]
    assert ids(catalog(), TOOLS, ()) == []


def test_transparent_items_are_the_servers_own() -> None:
    assert catalog().items(TOOLS, ("github",), True) == list(GITHUB.items(TOOLS))
    assert ids(catalog(), RESOURCES, ("github",), True) == ["shared://notes", "file:///gh.txt"]


def test_separator() -> None:
    assert ids(catalog(separator="."), TOOLS, ("files",)) == ["files.read", "files.write"]


def test_renamed_copies_leave_the_servers_items_alone() -> None:
    before = copy.deepcopy(FILES.lists)
    [read, _] = catalog().items(TOOLS, ("files",), False)
    assert read == {"name": "files__read", "description": "read of files"}
    assert FILES.lists == before
    read["name"] = "changed"  # nor does a caller's change reach the snapshot
    assert ids(catalog(), TOOLS, ("files",)) == ["files__read", "files__write"]


def test_same_resource_uri_listed_once_by_the_first_server() -> None:
    snapshot = catalog()
    assert ids(snapshot, RESOURCES) == ["file:///README.md", "shared://notes", "file:///gh.txt"]
    [notes] = [r for r in snapshot.items(RESOURCES, ALL, False) if r["uri"] == "shared://notes"]
    assert notes["description"] == "shared://notes of files"
    assert ids(snapshot, TEMPLATES) == [
        "file:///{+path}", "shared://{name}", "gh://{owner}/{repo}/issues{?state}",
    ]  # fmt: skip
    assert snapshot.clashes == [
        "resources: 'shared://notes' is listed by servers files, github; "
        "'files' (which came first) serves it",
        "templates: 'shared://{name}' is listed by servers files, github; "
        "'files' (which came first) serves it",
    ]


def test_shared_resource_of_a_server_outside_the_view() -> None:
    assert ids(catalog(), RESOURCES, ("github",)) == ["shared://notes", "file:///gh.txt"]


def test_name_clash_is_recorded_and_both_stay_routable() -> None:
    snapshot = catalog(server("a", tools=["b__c"]), server("a__b", tools=["c"]))
    [first, second] = ids(snapshot, TOOLS, ("a", "a__b"))
    assert first == "a__b__c" and second.startswith("a__b__c-")
    [clash] = snapshot.clashes
    assert clash.startswith("tools: ")
    assert snapshot.route_named(TOOLS, ("a", "a__b"), first) == ("a", "b__c")
    assert snapshot.route_named(TOOLS, ("a", "a__b"), second) == ("a__b", "c")


def test_the_senior_server_keeps_a_clashing_name_and_uri() -> None:
    """``github`` came first (a reload added ``files`` before it in the file):
    the name and the URI both claim stay ``github``'s; the list keeps config order."""
    newcomer = server("files", tools=["gh__read"], resources=["shared://notes"])
    incumbent = server("files__gh", tools=["read"], resources=["shared://notes"])
    snapshot = Catalog([newcomer, incumbent], seniority=("files__gh", "files"))
    view = ("files", "files__gh")
    assert snapshot.route_named(TOOLS, view, "files__gh__read") == ("files__gh", "read")
    assert snapshot.route_resource(view, "shared://notes") == "files__gh"
    assert ids(snapshot, RESOURCES, view) == ["shared://notes"]
    assert snapshot.items(RESOURCES, view, False)[0]["description"].endswith("of files__gh")
    assert [t["name"] for t in snapshot.items(TOOLS, view, False)][1] == "files__gh__read"
    replaced = snapshot.replace(server("files", tools=["gh__read"]))
    assert replaced.route_named(TOOLS, view, "files__gh__read") == ("files__gh", "read")


def test_a_name_in_use_stays_with_its_item_whatever_a_server_lists_later() -> None:
    """``a`` (senior) lists ``b__c`` at run time (a list_changed): ``a__b__c``,
    which reached ``a__b``'s ``c``, still does; the newcomer gets the suffix
    and keeps it (a name stays with its item); so does ``a__b``'s while ``a__b``
    is down, and it gets its name back when it is listed again. A URI a senior
    server starts listing stays with the server that served it."""
    view = ("a", "a__b")
    start = Catalog([server("a", tools=["x"]), server("a__b", tools=["c"], resources=["b://own"])])
    later = start.replace(server("a", tools=["x", "b__c"], resources=["b://own"]))
    assert later.route_named(TOOLS, view, "a__b__c") == ("a__b", "c")
    newcomer = ids(later, TOOLS, view)[1]
    assert newcomer.startswith("a__b__c-")
    assert later.route_named(TOOLS, view, newcomer) == ("a", "b__c")
    assert later.route_resource(view, "b://own") == "a__b"
    assert later.items(RESOURCES, view, False)[0]["description"] == "b://own of a__b"
    assert later.renamed(start, TOOLS) == set()
    down = later.replace(server("a__b", DOWN, "exited"))
    assert ids(down, TOOLS, view) == ["a__x", newcomer]  # (not given a__b__c)
    error = error_of(down.route_named, TOOLS, view, "a__b__c")
    assert error.code == CONNECTION_CLOSED  # (fails loudly, reaches nothing else)
    back = down.replace(server("a__b", tools=["c"], resources=["b://own"]))
    assert ids(back, TOOLS, view) == ["a__x", newcomer, "a__b__c"]
    assert back.route_named(TOOLS, view, "a__b__c") == ("a__b", "c")
    assert back.route_resource(view, "b://own") == "a"  # (a__b came back to a taken URI)
    again = Catalog(back.servers.values(), before=back)  # (a rebuild: the same names)
    assert ids(again, TOOLS, view) == ids(back, TOOLS, view)
    gone = back.replace(server("a", tools=["x"]))  # the newcomer goes: its name is free
    regained = gone.replace(server("a", tools=["x", "b__c"]))
    assert regained.route_named(TOOLS, view, "a__b__c") == ("a__b", "c")
    renamed = Catalog(back.servers.values(), separator=".", before=back)
    assert ids(renamed, TOOLS, view) == ["a.x", "a.b__c", "a__b.c"]  # (none held)


def test_a_senior_servers_first_lists_go_by_config_order() -> None:
    """At start ``a__b`` is read before ``a``: ``a``'s first lists take
    ``a__b__c`` (config order, as a daemon started afresh names it) and
    ``a__b``'s sessions are told of the rename; a later list of ``a``'s does not."""
    view = ("a", "a__b")
    start = Catalog(
        [server("a", LOADING), server("a__b", tools=["c"], resources=["b://own"])],
        seniority=view,
    )
    assert ids(start, TOOLS, view) == ["a__b__c"]
    first = start.replace(server("a", tools=["b__c"], resources=["b://own"]))
    assert first.route_named(TOOLS, view, "a__b__c") == ("a", "b__c")
    assert first.renamed(start, TOOLS) == {"a__b"}
    assert first.route_resource(view, "b://own") == "a"
    later = Catalog([server("a__b", LOADING), server("a", tools=["b__c"])], seniority=view)
    assert later.replace(server("a__b", tools=["c"])).route_named(TOOLS, view, "a__b__c") == (
        "a",
        "b__c",
    )


def test_no_clashes() -> None:
    assert catalog(FILES).clashes == []


# -- pages and cursors -------------------------------------------------------


def test_one_page_without_page_size() -> None:
    page = catalog().page(TOOLS, ALL, False, None)
    assert page == {"tools": catalog().items(TOOLS, ALL, False)}


def test_pages_chain_to_the_whole_list() -> None:
    snapshot = catalog(page_size=3)
    first = snapshot.page(TOOLS, ALL, False, None)
    assert len(first["tools"]) == 3
    second = snapshot.page(TOOLS, ALL, False, first["nextCursor"])
    assert "nextCursor" not in second
    assert first["tools"] + second["tools"] == snapshot.items(TOOLS, ALL, False)


def test_a_full_last_page_has_no_cursor() -> None:
    assert "nextCursor" not in catalog(page_size=2).page(PROMPTS, ALL, False, None)


@given(kind=st.sampled_from(KINDS), offset=st.integers(0, 2**40))
def test_cursor_round_trip(kind: Any, offset: int) -> None:
    cursor = encode_cursor(kind, offset)
    assert decode_cursor(cursor, kind) == offset
    for other in KINDS:
        if other is not kind:
            assert error_of(decode_cursor, cursor, other).code == INVALID_PARAMS


@pytest.mark.parametrize("cursor", ["", "garbage", "e30", "bnVsbA", 3, None, ["x"], "é"])
def test_foreign_cursor_rejected(cursor: Any) -> None:
    error = error_of(decode_cursor, cursor, TOOLS)
    assert error.code == INVALID_PARAMS and "Invalid cursor" in error.message


@given(cursor=st.text(max_size=40) | st.binary(max_size=30).map(lambda b: b.hex()))
def test_any_text_is_a_cursor_or_invalid_params(cursor: str) -> None:
    try:
        assert decode_cursor(cursor, TOOLS) >= 0
    except JsonRpcError as exc:
        assert exc.code == INVALID_PARAMS


# -- routing -----------------------------------------------------------------


def test_route_named() -> None:
    snapshot = catalog()
    assert snapshot.route_named(TOOLS, ALL, "github__read") == ("github", "read")
    assert snapshot.route_named(TOOLS, ALL, "files__read") == ("files", "read")
    assert snapshot.route_named(PROMPTS, ALL, "github__review") == ("github", "review")


@pytest.mark.parametrize(
    ("kind", "view", "name", "message"),
    [
        (TOOLS, ALL, "nope", "Unknown tool: nope"),
        (TOOLS, ALL, "files__summarize", "Unknown tool: files__summarize"),  # a prompt
        (PROMPTS, ALL, "files__read", "Unknown prompt: files__read"),  # a tool
        (TOOLS, ("files",), "github__search", "Unknown tool: github__search"),  # not in view
        (TOOLS, ALL, None, "Unknown tool: None"),
        (TOOLS, ALL, ["files__read"], "Unknown tool: ['files__read']"),
    ],
)
def test_route_named_unknown(kind: Any, view: tuple[str, ...], name: Any, message: str) -> None:
    error = error_of(catalog().route_named, kind, view, name)
    assert (error.code, error.message) == (INVALID_PARAMS, message)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (server("github", DOWN, "exited with code 1"), "is not running (it exited with code 1)"),
        (server("github", DOWN), "is not running (it is down)"),
        (server("github", LOADING, "crashed"), "is restarting (last time it crashed)"),
        (server("github", LOADING), "is still starting"),
        (server("github", IDLE), "is still starting"),
    ],
)
def test_route_named_of_a_server_not_serving(entry: ServerEntry, message: str) -> None:
    error = error_of(catalog(FILES, entry).route_named, TOOLS, ALL, "github__search")
    assert error.code == CONNECTION_CLOSED
    assert error.message == f"MCP server 'github' {message}"
    retryable = entry.state not in (ServerState.FAILED, ServerState.STOPPED)
    assert error.data == {"server": "github", "retryable": retryable}


def test_route_named_of_a_server_whose_list_could_not_be_read_says_so() -> None:
    unread = attrs.evolve(GITHUB, unread={"tools": "no answer in time"})
    snapshot = catalog(FILES, unread)
    assert snapshot.route_named(TOOLS, ALL, "github__search") == ("github", "search")
    error = error_of(snapshot.route_named, TOOLS, ALL, "github__new")
    assert (error.code, error.data) == (INVALID_PARAMS, {"server": "github"})
    assert error.message == (
        "Unknown tool: github__new (the broker could not read the tools of MCP server "
        "'github': no answer in time; it tries again)"
    )
    assert error_of(snapshot.route_named, PROMPTS, ALL, "github__x").message == (
        "Unknown prompt: github__x"
    )


def test_route_named_of_a_server_whose_list_was_cut_says_so() -> None:
    """A tool past the cut of a list too long exists: the call is told so,
    and how to reach it (it was a bare "Unknown tool"). Found by probing."""
    cut = attrs.evolve(GITHUB, cut={"tools": "more than 10000 items"})
    snapshot = catalog(FILES, cut)
    assert snapshot.route_named(TOOLS, ALL, "github__search") == ("github", "search")
    error = error_of(snapshot.route_named, TOOLS, ALL, "github__echo")
    assert (error.code, error.data) == (INVALID_PARAMS, {"server": "github"})
    assert error.message == (
        "Unknown tool: github__echo (the broker keeps only part of the tools of MCP "
        "server 'github', whose list it cut off: more than 10000 items; this may be "
        "one left out: a session of that server alone, mcpbroker connect --server "
        "github, passes every name on to it)"
    )
    assert error_of(snapshot.route_named, PROMPTS, ALL, "github__x").message == (
        "Unknown prompt: github__x"
    )
    assert error_of(snapshot.route_named, TOOLS, ALL, "files__echo").message == (
        "Unknown tool: files__echo"
    )


@pytest.mark.parametrize(
    ("uri", "view", "owner"),
    [
        ("file:///README.md", ALL, "files"),
        ("shared://notes", ALL, "files"),  # listed by both: the first
        ("shared://notes", ("github",), "github"),
        ("file:///gh.txt", ALL, "github"),  # an exact URI before files' template
        ("file:///a/b.txt", ALL, "files"),  # by template
        ("gh://octo/hello/issues?state=open", ALL, "github"),
        ("shared://other", ("github",), "github"),
    ],
)
def test_route_resource(uri: str, view: tuple[str, ...], owner: str) -> None:
    assert catalog().route_resource(view, uri) == owner


@pytest.mark.parametrize(
    ("uri", "view"),
    [("nope://x", ALL), ("file:///README.md", ("github",)), (None, ALL), (["x"], ALL)],
)
def test_route_resource_unknown(uri: Any, view: tuple[str, ...]) -> None:
    error = error_of(catalog().route_resource, view, uri)
    assert (error.code, error.message, error.data) == (
        RESOURCE_NOT_FOUND,
        "Resource not found",
        {"uri": uri},
    )


def with_capabilities(entry: ServerEntry, *capabilities: str) -> ServerEntry:
    identity = ServerIdentity(
        "2025-11-25", {key: {} for key in capabilities}, {"name": entry.name}, None
    )
    return attrs.evolve(entry, identity=identity)


def test_route_resource_falls_back_to_matching_as_the_sdks_do() -> None:
    """The SDKs match {var} as anything but "/": the merged view refused
    reads their server answers (a time stamp with ":", an e-mail, a space)."""
    sdk = server("sdk", templates=["time://{stamp}", "user://{email}/profile", "notes://{t}"])
    snapshot = catalog(FILES, sdk)
    for uri in ("time://2024-01-01T10:00:00", "user://a@b.com/profile", "notes://hello world"):
        assert snapshot.route_resource((*ALL, "sdk"), uri) == "sdk"
    # A strict match anywhere in the view comes first.
    strict = server("strict", templates=["notes://{+t}"])
    assert catalog(sdk, strict).route_resource(("sdk", "strict"), "notes://a:b") == "strict"
    assert error_of(snapshot.route_resource, ("sdk",), "notes://a/b").code == RESOURCE_NOT_FOUND


def test_route_resource_of_a_uri_nobody_lists_goes_to_the_one_server_with_resources() -> None:
    """A tool's resource_link need not be listed (the schema says so): the
    merged view refused to read it from the one server that could have it."""
    tools_only = with_capabilities(server("calc", tools=["add"]), "tools")
    reports = with_capabilities(server("reports", tools=["run"]), "tools", "resources")
    snapshot = catalog(tools_only, reports)
    assert snapshot.route_resource(("calc", "reports"), "report://run/42") == "reports"
    # Two that offer resources: the one that lists anything of its scheme.
    files = with_capabilities(FILES, "resources")
    snapshot = catalog(files, reports, with_capabilities(GITHUB, "resources"))
    view = ("files", "reports", "github")
    assert snapshot.route_resource(view, "gh://octo/hello/pulls/1") == "github"
    error = error_of(snapshot.route_resource, view, "report://run/42")
    assert (error.code, error.message) == (RESOURCE_NOT_FOUND, "Resource not found")


def test_route_resource_gives_up_after_its_budget_of_template_matching() -> None:
    """One read of a long URI against many templates that share its start
    (each walked over the whole URI): it used to cost about 2 s of the
    daemon's one event loop; it now stops after about 10 ms of work."""
    templates = [f"gh://repos/{{owner}}/{{repo}}{{?q{n}}}" for n in range(300)]
    snapshot = catalog(server("gh", templates=templates))
    uri = "gh://repos/" + "a" * 2000
    with took_under(0.3):
        error = error_of(snapshot.route_resource, ("gh",), uri)
    assert error.code == RESOURCE_NOT_FOUND
    assert "gave up matching" in error.message
    assert snapshot.route_resource(("gh",), "gh://repos/octo/hello?q299=1") == "gh"


@pytest.mark.parametrize(
    ("uri", "view", "owner"),
    [
        ("gh://{owner}/{repo}/issues{?state}", ALL, "github"),
        ("shared://{name}", ALL, "files"),
        ("shared://{name}", ("github",), "github"),
        ("file:///README.md", ALL, "files"),  # a plain resource's URI too
    ],
)
def test_route_template(uri: str, view: tuple[str, ...], owner: str) -> None:
    assert catalog().route_template(view, uri) == owner


def test_route_template_of_a_concrete_uri_goes_where_a_read_of_it_would() -> None:
    """The schema's ResourceTemplateReference.uri is "the URI or URI template":
    a concrete URI was refused (-32602 Unknown resource template)."""
    assert catalog().route_template(ALL, "file:///a/b.txt") == "files"
    assert catalog().route_template(ALL, "gh://octo/hello/issues") == "github"


@pytest.mark.parametrize(
    ("uri", "view"),
    [("nope://a/b.txt", ALL), ("file:///{+path}", ("github",)), ("gh://{x}", ALL), (5, ALL)],
)
def test_route_template_unknown(uri: Any, view: tuple[str, ...]) -> None:
    error = error_of(catalog().route_template, view, uri)
    assert (error.code, error.message) == (INVALID_PARAMS, f"Unknown resource template: {uri}")


# -- snapshots ---------------------------------------------------------------


def test_replace_returns_a_new_snapshot() -> None:
    old = catalog(separator=".", page_size=5)
    new = old.replace(server("github", DOWN, "exited"))
    assert new is not old
    assert ids(old, TOOLS) == ["files.read", "files.write", "github.search", "github.read"]
    assert ids(new, TOOLS) == ["files.read", "files.write"]
    assert list(new.servers) == ["files", "github"]
    assert (new.separator, new.page_size) == (".", 5)
    assert new.entry("github").state is DOWN and old.entry("github").state is READY
    assert new.clashes == []  # the shared resource has one owner now


def test_replace_keeps_config_order() -> None:
    new = catalog().replace(server("files", tools=["new"]))
    assert ids(new, TOOLS) == ["files__new", "github__search", "github__read"]


@pytest.mark.parametrize(
    ("states", "settled"),
    [
        ((READY, READY), True),
        ((READY, DOWN), True),
        ((READY, LOADING), False),
        ((IDLE, READY), False),
    ],
)
def test_settled(states: tuple[ServerState, ServerState], settled: bool) -> None:
    snapshot = catalog(server("a", states[0]), server("b", states[1]), server("c", LOADING))
    assert snapshot.settled(("a", "b")) is settled
    assert snapshot.settled(()) is True
    assert snapshot.settled(("c",)) is False


# -- what a misbehaving server may send --------------------------------------


@pytest.mark.parametrize(
    "lists",
    [
        {"tools": ({"name": None},)},
        {"tools": ({"name": 5},)},
        {"prompts": ({"name": ["x"]},)},
        {"resources": ({"uri": ["x"]},)},
        {"templates": ({"uriTemplate": None},)},
    ],
)
def test_malformed_items_do_not_crash(lists: dict[str, Any]) -> None:
    snapshot = catalog(ServerEntry("bad", READY, lists=lists), FILES)
    view = ("bad", "files")
    for kind in KINDS:
        snapshot.page(kind, view, False, None)
    assert snapshot.route_resource(view, "file:///x") == "files"


def test_a_completion_of_an_unknown_template_is_refused_not_routed() -> None:
    """The fallback to a read is for a concrete URI: a template nobody lists
    went to the sole server offering resources. (Found by review.)"""
    snap = catalog(with_capabilities(FILES, "resources"), with_capabilities(GITHUB, "resources"))
    with pytest.raises(JsonRpcError) as error:
        snap.route_template(ALL, "gh://{x}")
    assert error.value.code == INVALID_PARAMS


def test_a_read_nothing_explains_walks_no_listed_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback's servers and schemes are found when the catalog is made:
    a read walked every listed resource of every server (10 x 10,000: 10-20
    ms of the event loop a read, 10 s for one listen of 1,024 URIs). (Found
    by review.)"""
    entries = [
        with_capabilities(server(f"s{i}", resources=[f"res{i}://item/{j}" for j in range(50)]),
                          "resources")
        for i in range(3)
    ]  # fmt: skip
    snap = catalog(*entries)
    view = tuple(e.name for e in entries)
    items = ServerEntry.items

    def no_resource_walks(self: ServerEntry, kind: Any) -> Any:
        assert kind is not RESOURCES, "a read walked the listed resources"
        return items(self, kind)

    monkeypatch.setattr(ServerEntry, "items", no_resource_walks)
    assert snap.route_resource(view, "res1://item/unlisted") == "s1"
    with pytest.raises(JsonRpcError):
        snap.route_resource(view, "zzz://nobody/lists/this")
