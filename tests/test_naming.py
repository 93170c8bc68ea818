"""broker.naming: qualified names are valid, unique, stable and deterministic."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.naming import (
    DEFAULT_SEPARATOR,
    MAX_NAME,
    VALID_NAME,
    assign_names,
    disambiguate,
    qualify,
    sanitize,
)

Pair = tuple[str, str]

# Any unicode (hypothesis leaves out lone surrogates, which orjson never decodes),
# long names near and over the 128 limit, and short ones.
names = st.one_of(
    st.text(max_size=30),
    st.builds(str.__mul__, st.text(min_size=1, max_size=3), st.integers(20, 70)),
    st.sampled_from(["a", "b_", "_"]),
)
separators = st.text(alphabet="abz09_.-", min_size=1, max_size=8)  # what config.py allows


@st.composite
def split_pairs(draw: st.DrawFn) -> Pair:
    """``a__a__a`` cut at one of its separators: makes clashes likely."""
    words = draw(st.integers(2, 4))
    cut = draw(st.integers(1, words - 1))
    return DEFAULT_SEPARATOR.join("a" * cut), DEFAULT_SEPARATOR.join("a" * (words - cut))


plain = st.lists(st.tuples(names, names), max_size=8)
# Plain pairs and likely clashes, shuffled together.
pairs = st.builds(list.__add__, plain, st.lists(split_pairs(), max_size=6)).flatmap(st.permutations)


def assigned(items: list[Pair], separator: str = DEFAULT_SEPARATOR) -> dict[Pair, str]:
    names, _ = assign_names(items, separator)
    return names


def assert_valid(name: str) -> None:
    assert VALID_NAME.fullmatch(name), name


# -- examples ----------------------------------------------------------------


def test_valid_names_are_used_as_they_are() -> None:
    assert qualify("github", "search") == "github__search"
    assert qualify("my-server.v2", "get_file") == "my-server.v2__get_file"
    assert sanitize("search") == "search"


def test_separator_is_configurable() -> None:
    assert qualify("github", "search", separator=".") == "github.search"
    assert assigned([("github", "search")], "-") == {("github", "search"): "github-search"}


def test_invalid_names_are_sanitised_with_a_hash() -> None:
    name = sanitize("my server")
    assert name.startswith("my_server-")
    assert_valid(name)
    assert sanitize("my_server") == "my_server"  # the valid twin keeps its name
    assert sanitize("my server") != sanitize("my/server")


def test_empty_and_symbol_only_names() -> None:
    for original in ("", "   ", "ü", "工具", "🔧", "\x00", "search\n"):  # ("$" admits "\n")
        assert_valid(sanitize(original))
        assert_valid(qualify(original, original))
    assert sanitize("") != sanitize(" ")


def test_long_names_are_cut_with_a_hash_of_the_whole() -> None:
    long_a, long_b = "a" * 200 + "x", "a" * 200 + "y"
    assert len(qualify("s", long_a)) == MAX_NAME
    assert qualify("s", long_a) != qualify("s", long_b)
    assert qualify("s", "t" * 125) == "s__" + "t" * 125  # exactly 128: kept whole
    assert qualify("s", "t" * 126) != "s__" + "t" * 126


def test_clash_keeps_the_first_and_reports_it() -> None:
    names, clashes = assign_names([("a", "b__c"), ("a__b", "c")])
    assert names[("a", "b__c")] == "a__b__c"
    renamed = names[("a__b", "c")]
    assert renamed != "a__b__c" and renamed.startswith("a__b__c-")
    [clash] = clashes
    assert clash == (  # (it says which server's item was renamed)
        f"'c' of server 'a__b' is named {renamed!r}: 'a__b__c' is 'b__c' of server 'a', "
        "which came first"
    )


def test_names_are_the_same_in_every_process() -> None:
    """Pinned: the hashes are sha256, never Python's per-process ``hash()``."""
    assert sanitize("my server") == "my_server-b12987"
    assert qualify("s", "a" * 200) == "s__" + "a" * 118 + "-ac521d"
    assert assigned([("a", "b__c"), ("a__b", "c")])[("a__b", "c")] == "a__b__c-3a400f"


def test_clash_order_follows_the_input() -> None:
    names, _ = assign_names([("a__b", "c"), ("a", "b__c")])
    assert names[("a__b", "c")] == "a__b__c"


def test_on_a_clash_the_senior_server_keeps_the_name() -> None:
    """A reload that adds ``a__b`` before ``a`` in the file does not take
    ``a__b__c`` from ``a``: seniority decides, not the order given."""
    items = [("a__b", "c"), ("a", "b__c"), ("z", "t")]
    names, clashes = assign_names(items, seniority=("a", "a__b"))
    assert names[("a", "b__c")] == "a__b__c"
    assert names[("a__b", "c")].startswith("a__b__c-")
    assert names[("z", "t")] == "z__t"  # (a server not in it: after, as given)
    assert clashes[0].startswith("'c' of server 'a__b' is named")
    assert list(names) == [("a", "b__c"), ("a__b", "c"), ("z", "t")]


def test_a_name_held_stays_with_its_item() -> None:
    """``a__b``'s ``c`` holds ``a__b__c``: ``a``'s ``b__c``, senior but new, is
    renamed; a name held for an item not listed now is given to no other."""
    items = [("a", "b__c"), ("a__b", "c")]
    names, clashes = assign_names(items, held={("a__b", "c"): "a__b__c"})
    assert names[("a__b", "c")] == "a__b__c"
    assert names[("a", "b__c")].startswith("a__b__c-")
    assert clashes[0].startswith("'b__c' of server 'a' is named")
    names, _ = assign_names([("a", "b__c")], held={("a__b", "c"): "a__b__c"})
    assert names == {("a", "b__c"): disambiguate("a", "b__c", "a__b__c")}
    names, _ = assign_names([("s", "t")], held={("s", "t"): "s__t-123456"})
    assert names == {("s", "t"): "s__t-123456"}  # (a suffix given stays too)


def test_same_item_listed_twice_is_one_entry() -> None:
    names, clashes = assign_names([("s", "t"), ("s", "t")])
    assert names == {("s", "t"): "s__t"} and clashes == []


# -- properties --------------------------------------------------------------


@given(server=names, name=names, separator=separators)
def test_qualify_is_always_valid(server: str, name: str, separator: str) -> None:
    assert_valid(qualify(server, name, separator))
    assert_valid(sanitize(server))


@given(items=pairs, separator=separators)
def test_assigned_names_are_valid_and_unique(items: list[Pair], separator: str) -> None:
    names = assigned(items, separator)
    assert set(names) == set(items)
    for name in names.values():
        assert_valid(name)
    assert len(set(names.values())) == len(names)


@given(items=pairs)
def test_only_a_clash_changes_a_name(items: list[Pair]) -> None:
    """Each name is qualify()'s, unless an earlier item already had that name."""
    names, clashes = assign_names(items)
    seen: set[str] = set()
    renamed = 0
    for pair in dict.fromkeys(items):
        natural = qualify(*pair)
        if natural in seen:
            renamed += 1
        else:
            assert names[pair] == natural
        seen.add(names[pair])
    assert len(clashes) == renamed


@given(items=pairs, other=st.lists(names, max_size=5), server=names, position=st.integers(0, 20))
def test_adding_a_server_keeps_the_others_names(
    items: list[Pair], other: list[str], server: str, position: int
) -> None:
    """Adding a server anywhere in config order (or removing it) renames nobody else."""
    added = [(server, name) for name in other]
    combined = [p for p in items if p[0] != server]
    combined[position:position] = added
    names, clashes = assign_names(combined)
    if clashes:
        return  # a clash is the one documented exception
    without = assigned([p for p in combined if p[0] != server])
    assert without == {pair: names[pair] for pair in without}


def test_a_clashs_second_name_is_never_one_already_taken() -> None:
    """``a__b``'s ``c`` clashes with ``a``'s ``b__c`` and would be renamed
    ``a__b__c-`` + hash: a name ``a`` already uses for its ``b__c-`` + hash.
    Both were listed under it, and calls went to one only."""
    taken = disambiguate("a__b", "c", "a__b__c")
    items = [("a", "b__c"), ("a", taken.removeprefix("a__")), ("a__b", "c")]
    names, clashes = assign_names(items)
    assert names[("a", "b__c")] == "a__b__c"
    assert names[("a", taken.removeprefix("a__"))] == taken
    assert names[("a__b", "c")] not in (taken, "a__b__c")
    assert len(set(names.values())) == 3
    assert len(clashes) == 1
