"""broker.listing: reading a server's lists page by page, and who hears of a change."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from broker.catalog import KINDS, PROMPTS, RESOURCES, TEMPLATES, TOOLS, Catalog, ServerEntry
from broker.listing import (
    MAX_ITEMS,
    MAX_LIST_BYTES,
    MAX_PAGES,
    Lister,
    PageRead,
    changed_kinds,
    list_changed,
    new_clashes,
    renamed,
    renamed_elsewhere,
)


def tool(name: Any) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object"}}


def read_all(lister: Lister, pages: list[Any]) -> list[dict[str, Any]]:
    """Feed pages until the lister is done; the params of every request it asked for."""
    asked = [lister.first_request()]
    for page in pages:
        read = lister.page(page)
        if read.next is None:
            break
        asked.append(read.next)
    return asked


# -- reading a list ---------------------------------------------------------------


def test_the_first_request_has_no_cursor() -> None:
    assert Lister(TOOLS).first_request() == {}


def test_a_page_without_a_cursor_ends_the_list() -> None:
    lister = Lister(TOOLS)
    assert lister.page({"tools": [tool("a"), tool("b")]}) == PageRead(None, [])
    assert lister.items() == (tool("a"), tool("b"))


def test_a_cursor_asks_for_the_next_page_and_is_passed_back_as_it_came() -> None:
    lister = Lister(TOOLS)
    assert lister.page({"tools": [tool("a")], "nextCursor": "c1"}).next == {"cursor": "c1"}
    assert lister.page({"tools": [tool("b")], "nextCursor": 7}).next == {"cursor": 7}
    assert lister.page({"tools": [tool("c")]}).next is None
    assert [t["name"] for t in lister.items()] == ["a", "b", "c"]
    assert lister.pages == 3


def test_an_empty_cursor_ends_the_list() -> None:
    for cursor in ("", None, 0):
        assert Lister(TOOLS).page({"tools": [], "nextCursor": cursor}).next is None


def test_each_kind_reads_its_own_key() -> None:
    result = {"resources": [{"uri": "file:///a"}], "resourceTemplates": [{"uriTemplate": "x{y}"}]}
    resources, templates = Lister(RESOURCES), Lister(TEMPLATES)
    resources.page(result)
    templates.page(result)
    assert resources.items() == ({"uri": "file:///a"},)
    assert templates.items() == ({"uriTemplate": "x{y}"},)


def test_malformed_items_are_left_out_and_handed_back_for_the_log() -> None:
    lister = Lister(TOOLS)
    read = lister.page({"tools": [tool("ok"), {"description": "no name"}, tool(5), "junk"]})
    assert read.invalid == [{"description": "no name"}, tool(5), "junk"]
    assert lister.items() == (tool("ok"),)


def test_an_item_nested_too_deep_is_left_out() -> None:
    deep: Any = {}
    for _ in range(200):
        deep = {"d": deep}
    lister = Lister(TOOLS)
    assert len(lister.page({"tools": [{"name": "deep", "x": deep}]}).invalid) == 1
    assert lister.items() == ()


def test_a_result_that_is_no_page_is_an_error() -> None:
    """(It used to end the list as if it were empty: the caller published no
    tools for a server that has some.)"""
    for result in (None, [], "tools", {"tools": "a"}, {"tools": {"name": "a"}}, {}):
        lister = Lister(TOOLS)
        read = lister.page(result)
        assert read.next is None
        assert read.error == "the result holds no 'tools' array"
        assert lister.items() == ()


def test_a_server_whose_cursors_never_end_is_cut_off_keeping_what_it_sent() -> None:
    lister = Lister(PROMPTS, max_pages=3)
    pages = [{"prompts": [{"name": f"p{i}"}], "nextCursor": f"c{i}"} for i in range(10)]
    assert len(read_all(lister, pages)) == 3
    assert [p["name"] for p in lister.items()] == ["p0", "p1", "p2"]
    assert lister.page(pages[3]).cut == "more than 3 pages"


def test_the_default_limit() -> None:
    lister = Lister(TOOLS)
    assert lister.max_pages == MAX_PAGES == 1000
    pages = [{"tools": [tool(f"t{i}")], "nextCursor": f"c{i}"} for i in range(2000)]
    assert len(read_all(lister, pages)) == MAX_PAGES


def test_a_cursor_given_before_ends_the_list() -> None:
    """A server that hands back the same cursor (a common paginator bug) used
    to have its page stored 1000 times, every copy listed."""
    lister = Lister(TOOLS)
    page = {"tools": [tool(f"t{i}") for i in range(100)], "nextCursor": "again"}
    assert lister.page(page).next == {"cursor": "again"}
    read = lister.page({"tools": [tool("new")], "nextCursor": "again"})
    assert (read.next, read.cut) == (None, "it gave a cursor it had given before")
    assert len(lister.items()) == 101
    cursors = Lister(TOOLS)
    cursors.page({"tools": [tool("a")], "nextCursor": {"at": 1}})
    assert cursors.page({"tools": [tool("b")], "nextCursor": {"at": 1}}).cut is not None


def test_a_page_with_nothing_new_ends_the_list() -> None:
    lister = Lister(TOOLS)
    lister.page({"tools": [tool("a"), tool("b")], "nextCursor": "1"})
    read = lister.page({"tools": [tool("b"), tool("a")], "nextCursor": "2"})
    assert (read.next, read.cut) == (None, "a page brought no item not listed before")
    assert Lister(TOOLS).page({"tools": [], "nextCursor": "1"}).next == {"cursor": "1"}


def test_an_item_listed_twice_is_kept_once() -> None:
    lister = Lister(RESOURCES)
    lister.page({"resources": [{"uri": "a://1"}, {"uri": "a://1", "x": 2}], "nextCursor": "1"})
    lister.page({"resources": [{"uri": "a://2"}, {"uri": "a://1"}]})
    assert lister.items() == ({"uri": "a://1"}, {"uri": "a://2"})


def test_a_list_is_cut_at_its_item_and_byte_limits() -> None:
    """(A server paginating 2,000 new tools a page without end drove the
    daemon to 1 GB.)"""
    assert (MAX_ITEMS, MAX_LIST_BYTES) == (10_000, 4 * 1024 * 1024)
    lister = Lister(TOOLS, max_items=5)
    read = lister.page({"tools": [tool(f"t{i}") for i in range(8)], "nextCursor": "1"})
    assert (read.next, read.cut, len(lister.items())) == (None, "more than 5 items", 5)
    lister = Lister(TOOLS, max_bytes=100)  # a tool here is 45 bytes
    read = lister.page({"tools": [tool(f"t{i}") for i in range(8)]})
    assert (read.next, read.cut, len(lister.items())) == (None, "more than 100 bytes", 2)
    pages = [
        {"tools": [tool(f"t{n}-{i}") for i in range(2000)], "nextCursor": n} for n in range(1, 9)
    ]
    lister = Lister(TOOLS)
    assert len(read_all(lister, pages)) == 6  # 10,000 items, and the page that would pass them
    assert len(lister.items()) == MAX_ITEMS


pages = st.lists(
    st.fixed_dictionaries(
        {"tools": st.lists(st.one_of(st.builds(tool, st.text(max_size=3)), st.integers()))},
        optional={"nextCursor": st.one_of(st.text(max_size=2), st.none())},
    ),
    min_size=1,
    max_size=8,
)


@given(pages, st.integers(1, 5))
def test_items_are_the_valid_items_of_the_pages_asked_for(
    results: list[dict[str, Any]], limit: int
) -> None:
    lister = Lister(TOOLS, max_pages=limit)
    asked = read_all(lister, results)
    assert len(asked) <= limit
    read = results[: lister.pages]
    valid = {
        i["name"]: i for r in reversed(read) for i in reversed(r["tools"]) if isinstance(i, dict)
    }
    assert list(lister.items()) == [
        valid[n]
        for n in dict.fromkeys(i["name"] for r in read for i in r["tools"] if isinstance(i, dict))
    ]
    for params, result in zip(asked[1:], read, strict=False):
        assert params == {"cursor": result["nextCursor"]}


# -- what changed, and who is told ------------------------------------------------


def entry(name: str = "s", **lists: list[str]) -> ServerEntry:
    return ServerEntry(name, lists={k: tuple(tool(n) for n in v) for k, v in lists.items()})


def test_changed_kinds_are_those_whose_lists_differ() -> None:
    old = entry(tools=["a"], prompts=["p"])
    assert changed_kinds(old, entry(tools=["a"], prompts=["q"]), KINDS) == [PROMPTS]
    assert changed_kinds(old, entry(tools=["a", "b"]), KINDS) == [TOOLS, PROMPTS]
    assert changed_kinds(old, entry(tools=["a", "b"]), (PROMPTS,)) == [PROMPTS]  # of those asked
    assert changed_kinds(old, old, KINDS) == []


def test_a_server_gone_down_changed_every_list_it_had() -> None:
    old = entry(tools=["a"], resources=["r"])
    assert changed_kinds(old, entry(), KINDS) == [TOOLS, RESOURCES]


def test_only_sessions_whose_view_includes_the_server_are_told() -> None:
    subscribers = {"s1": frozenset({"a", "b"}), "s2": frozenset({"b"}), "s3": frozenset({"a"})}
    told = list_changed("a", [TOOLS], subscribers)
    assert [session for session, _ in told] == ["s1", "s3"]
    assert all(note == {"jsonrpc": "2.0", "method": TOOLS.notification} for _, note in told)


def test_each_notification_once_in_the_order_of_the_kinds() -> None:
    told = list_changed("a", [PROMPTS, RESOURCES, TEMPLATES, TOOLS], {"s": frozenset({"a"})})
    assert [note["method"] for _, note in told] == [
        "notifications/prompts/list_changed",
        "notifications/resources/list_changed",  # (templates too: one notification)
        "notifications/tools/list_changed",
    ]


def test_nothing_changed_nobody_told() -> None:
    assert list_changed("a", [], {"s": frozenset({"a"})}) == []
    assert list_changed("a", KINDS, {}) == []


@given(
    st.dictionaries(st.integers(0, 9), st.frozensets(st.sampled_from("abc"))),
    st.lists(st.sampled_from(KINDS)),
    st.sampled_from("abc"),
)
def test_fan_out_is_every_viewer_times_every_notification(
    subscribers: dict[int, frozenset[str]], kinds: list[Any], server: str
) -> None:
    told = list_changed(server, kinds, subscribers)
    notes = {k.notification for k in kinds}
    viewers = {s for s, view in subscribers.items() if server in view}
    assert len(told) == len(notes) * len(viewers)
    assert {(s, n["method"]) for s, n in told} == {(s, n) for s in viewers for n in notes}


def test_new_clashes_are_those_not_there_before() -> None:
    one = ServerEntry("x", lists={"resources": ({"uri": "u"},)})
    two = ServerEntry("y", lists={"resources": ({"uri": "u"},)})
    before = Catalog([one, ServerEntry("y")])
    after = before.replace(two)
    assert len(after.clashes) == 1
    assert new_clashes(before, after) == after.clashes
    assert new_clashes(after, after.replace(two)) == []
    assert new_clashes(after, before) == []


def test_sessions_whose_names_a_change_elsewhere_renamed_are_told() -> None:
    """``a``'s first lists (it came up after ``a__b``) take ``a__b__c``."""
    before = Catalog([entry("a"), entry("a__b", tools=["c"]), entry("z")])
    after = before.replace(entry("a", tools=["x", "b__c"]))
    assert after.renamed(before, TOOLS) == {"a__b"}
    subscribers = {
        "sees a__b": frozenset({"a__b", "z"}),
        "sees a too": frozenset({"a", "a__b"}),  # (told by a's own change)
        "sees z": frozenset({"z"}),
    }
    told = renamed_elsewhere(before, after, "a", subscribers)
    assert [(s, m["method"]) for s, m in told] == [
        ("sees a__b", "notifications/tools/list_changed")
    ]
    # The clash going away renames it back: told again.
    assert renamed_elsewhere(after, before, "a", subscribers) == told
    assert renamed_elsewhere(before, before, None, subscribers) == []


def test_a_new_separator_is_said_once_a_session_and_not_to_a_transparent_one() -> None:
    subscribers = {
        "every": frozenset({"a", "b", "c"}),
        "alone": frozenset({"a"}),
        "none": frozenset(),
    }
    told = renamed([TOOLS, PROMPTS], subscribers, {"alone"})
    assert [(who, note["method"]) for who, note in told] == [
        ("every", "notifications/tools/list_changed"),
        ("every", "notifications/prompts/list_changed"),
    ]


def test_a_transparent_session_is_not_told_of_renames_in_the_merged_catalog() -> None:
    """It sees its server's own names, which no clash renames (it was told,
    prompts too, which its initialize may not have offered). (Found by review.)"""
    before = Catalog([entry("a"), entry("a__b", tools=["c"])])
    after = before.replace(entry("a", tools=["x", "b__c"]))
    subscribers = {"one": frozenset({"a__b"}), "merged": frozenset({"a__b", "z"})}
    told = renamed_elsewhere(before, after, "a", subscribers, transparent={"one"})
    assert [s for s, _ in told] == ["merged"]
