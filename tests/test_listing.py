"""broker.listing: reading a server's lists page by page, and who hears of a change."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from broker.catalog import KINDS, PROMPTS, RESOURCES, TEMPLATES, TOOLS, Catalog, ServerEntry
from broker.listing import (
    MAX_PAGES,
    Lister,
    PageRead,
    changed_kinds,
    list_changed,
    new_clashes,
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


def test_a_result_that_is_no_list_ends_with_nothing() -> None:
    for result in (None, [], "tools", {"tools": "a"}, {"tools": {"name": "a"}}):
        lister = Lister(TOOLS)
        assert lister.page(result) == PageRead(None, [])
        assert lister.items() == ()


def test_a_server_whose_cursors_never_end_is_cut_off_keeping_what_it_sent() -> None:
    lister = Lister(PROMPTS, max_pages=3)
    pages = [{"prompts": [{"name": f"p{i}"}], "nextCursor": f"c{i}"} for i in range(10)]
    assert len(read_all(lister, pages)) == 3
    assert [p["name"] for p in lister.items()] == ["p0", "p1", "p2"]


def test_the_default_limit() -> None:
    lister = Lister(TOOLS)
    assert lister.max_pages == MAX_PAGES == 1000
    assert len(read_all(lister, [{"tools": [], "nextCursor": "again"}] * 2000)) == MAX_PAGES


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
    assert list(lister.items()) == [i for r in read for i in r["tools"] if isinstance(i, dict)]
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
