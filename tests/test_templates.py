"""broker.templates: a URI matches a template when an RFC 6570 expansion could produce it."""

from __future__ import annotations

import contextlib
import re
import signal
import string
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from uritemplate import URITemplate

from broker.templates import (
    MAX_URI,
    Budget,
    BudgetSpent,
    TemplateError,
    compile_template,
    match,
)

# The examples of RFC 6570 section 3.2 use these values.
RFC_VALUES: dict[str, Any] = {
    "var": "value",
    "hello": "Hello World!",
    "path": "/foo/bar",
    "empty": "",
    "list": ["red", "green", "blue"],
    "keys": {"semi": ";", "dot": ".", "comma": ","},
    "x": "1024",
    "y": "768",
}

MATCHING = [
    # simple
    ("{var}", "value"),
    ("{hello}", "Hello%20World%21"),
    ("{x,y}", "1024,768"),
    ("{keys}", "comma,%2C,dot,.,semi,%3B"),
    ("{keys*}", "comma=%2C,dot=.,semi=%3B"),
    ("{list}", "red,green,blue"),
    # + reserved
    ("{+path}/here", "/foo/bar/here"),
    ("{+hello}", "Hello%20World!"),
    ("file:///{+path}", "file:///a/b/c.txt"),
    # # fragment
    ("{#var}", "#value"),
    ("{#hello}", "#Hello%20World!"),
    ("{#path,x}/here", "#/foo/bar,1024/here"),
    # . label
    ("X{.var}", "X.value"),
    ("X{.x,y}", "X.1024.768"),
    ("X{.list*}", "X.red.green.blue"),
    # / path segments
    ("{/var}", "/value"),
    ("{/var,x}/here", "/value/1024/here"),
    ("{/list*}", "/red/green/blue"),
    ("{/list*,x}", "/red/green/blue/1024"),
    # ; path-style parameters
    ("{;x,y}", ";x=1024;y=768"),
    ("{;x,y,empty}", ";x=1024;y=768;empty"),
    ("{;list*}", ";list=red;list=green;list=blue"),
    ("{;keys*}", ";comma=%2C;dot=.;semi=%3B"),
    # ? query, in any order, each optional
    ("{?x,y}", "?x=1024&y=768"),
    ("{?x,y}", "?y=768&x=1024"),
    ("{?x,y}", "?y=768"),
    ("{?x,y,empty}", "?x=1024&y=768&empty="),
    ("{?list}", "?list=red,green,blue"),
    ("{?keys*}", "?comma=%2C&dot=.&semi=%3B"),
    # & continuation
    ("?fixed=yes{&x}", "?fixed=yes&x=1024"),
    ("{&x,y,empty}", "&x=1024&y=768&empty="),
    # prefix modifiers
    ("{var:3}", "val"),
    ("{+path:6}/here", "/foo/b/here"),
    ("{/var:1,var}", "/v/value"),
    ("{?var:3}", "?var=val"),
    # undefined variables expand to nothing
    ("x{?undef}", "x"),
    ("{/undef}{?undef}", ""),
    # what MCP servers publish
    ("repo://{owner}/{repo}/issues{?state}", "repo://octo/hello/issues"),
    ("repo://{owner}/{repo}/issues{?state}", "repo://octo/hello/issues?state=open"),
    ("users://{id}/profile", "users://42/profile"),
]

NOT_MATCHING = [
    ("file:///{path}", "file:///a/b"),  # "/" is not unreserved: {+path} is needed
    ("{var}", "a b"),
    ("{var}", "a#b"),
    ("X{.var}", "X.a/b"),
    ("X{.var}", "Xvalue"),
    ("{/var}", "/a?x"),
    ("{#var}", "value"),
    ("{?x}", "?x=1#frag"),
    ("{?x}", "x=1"),
    ("{;x}", ";x=a/b"),
    ("repo://{owner}", "git://octo"),
    ("File:///{+p}", "file:///x"),
    ("repo://{owner}/{repo}/issues{?state}", "repo://octo/hello/world/issues"),
    ("users://{id}/profile", "users://42/profile/extra"),
]

UNBALANCED = [
    "file:///{path",
    "file:///path}",
    "{",
    "}",
    "{}",
    "{a,}",
    "{,a}",
    "{:3}",
    "{{a}}",
    "a}{x}",  # a stray brace before an expression
    "{a{b}",
]


@pytest.mark.parametrize(("template", "uri"), MATCHING)
def test_match(template: str, uri: str) -> None:
    assert match(template, uri)


@pytest.mark.parametrize(("template", "uri"), NOT_MATCHING)
def test_no_match(template: str, uri: str) -> None:
    assert not match(template, uri)


def test_file_path_needs_reserved_expansion() -> None:
    assert not match("file:///{path}", "file:///a/b")
    assert match("file:///{+path}", "file:///a/b")


@pytest.mark.parametrize(("template", "uri"), MATCHING)
def test_rfc_examples_are_uritemplate_expansions(template: str, uri: str) -> None:
    """uritemplate's own expansion of the RFC values matches too."""
    expanded = URITemplate(template).expand(RFC_VALUES)
    assert match(template, expanded)


@pytest.mark.parametrize("template", UNBALANCED)
def test_unbalanced_braces_never_match(template: str) -> None:
    for uri in (template, "file:///x", "", "a"):
        assert match(template, uri) is False
    with pytest.raises(TemplateError):
        compile_template(template)


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in the block after ``seconds`` (``re`` checks for signals)."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    ("template", "uri"),
    [
        ("file:///{+path}", "file:///" + "," * 40 + " "),
        ("file:///{path}", "file:///" + "," * 60 + "!"),
        ("X{.var}", "X" + "." * 60 + "!"),
        ("{a}{b}{c}{d}", "x" * 5000 + "!"),
        ("file:///{+path}", "file:///" + "," * 100_000),
    ],
)
def test_matching_takes_linear_time(template: str, uri: str) -> None:
    with time_limit(0.2):
        assert not match(template, uri)


# A server's template of many expressions, and a URI of the longest length
# matched: each character used to step every expression (about 1 s here, on
# the daemon's one event loop; 3.5 s at the old 8 KB limit).
MANY = "x://" + "".join(f"{{+v{i}}}" for i in range(200)) + "z"


def test_a_template_of_many_expressions_matches_in_little_time() -> None:
    uri = "x://" + "a" * (MAX_URI - 5) + "z"
    with time_limit(0.2):
        assert match(MANY, uri, Budget())
        assert not match(MANY, uri[:-1] + "y", Budget())  # its literal end, checked first


def test_the_walk_remembers_its_moves_so_a_second_uri_costs_a_step_a_character() -> None:
    uri = "gh://repos/" + "a" * 1000
    first, second = Budget(), Budget()
    match("gh://repos/{owner}/{repo}", uri, first)
    match("gh://repos/{owner}/{repo}", uri, second)
    assert 100_000 - second.left == len(uri) < 100_000 - first.left


def test_a_lookup_that_spends_its_budget_gives_up() -> None:
    budget = Budget(5000)
    uri = "r://" + "a" * 1000
    with pytest.raises(BudgetSpent):
        for n in range(100):  # templates that all share the URI's literal start
            match(f"r://{{a}}{{?q{n}}}", uri, budget)
    assert budget.left < 0


def test_a_uri_longer_than_the_limit_matches_no_template() -> None:
    assert match("file:///{+path}", "file:///" + "a" * (MAX_URI - 8))
    assert not match("file:///{+path}", "file:///" + "a" * (MAX_URI - 7))


@given(template=st.text(max_size=30), uri=st.text(max_size=30))
def test_match_never_raises(template: str, uri: str) -> None:
    assert match(template, uri) in (True, False)


# -- round trip: whatever uritemplate expands, match() accepts -----------------

OPERATORS = ["", "+", "#", ".", "/", ";", "?", "&"]
LITERAL = "abc:/?#&=;.,-_~!$()*+@[]"
URI = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*")
KEYS = st.text(alphabet=string.ascii_letters + "-~_. %/é", max_size=4)
texts = st.one_of(
    st.text(alphabet=string.printable + "é€", max_size=6),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=4),
)


@st.composite
def expression(draw: st.DrawFn, position: int) -> tuple[str, dict]:
    """One ``{...}`` with 1 to 3 variables, and values (or none) for them."""
    operator = draw(st.sampled_from(OPERATORS))
    specs, values = [], {}
    for index in range(draw(st.integers(1, 3))):
        # Digits at the end keep the names of one template apart.
        name = draw(st.text(alphabet="abXY_", min_size=1, max_size=3)) + f"{position}{index}"
        modifier = draw(st.sampled_from(["", "*", ":1", ":20"]))
        specs.append(name + modifier)
        if modifier.startswith(":"):
            value = draw(st.none() | texts)  # prefixes apply to strings only
        else:
            # An empty list or map is undefined (RFC 6570 2.3), as None is here;
            # uritemplate expands some of those to a lone prefix (";", "#").
            value = draw(
                st.none()
                | texts
                | st.lists(texts, min_size=1, max_size=3)
                | st.dictionaries(KEYS, texts, min_size=1, max_size=3)
            )
        if value is not None:
            values[name] = value
    return "{" + operator + ",".join(specs) + "}", values


@st.composite
def expansions(draw: st.DrawFn) -> tuple[str, str]:
    """A template of literal text and expressions, and one of its expansions."""
    parts, values = [], {}
    for position in range(draw(st.integers(1, 4))):
        parts.append(draw(st.text(alphabet=LITERAL, max_size=4)))
        text, new = draw(expression(position))
        parts.append(text)
        values.update(new)
    parts.append(draw(st.text(alphabet=LITERAL, max_size=4)))
    template = "".join(parts)
    uri = URITemplate(template).expand(values)
    # uritemplate passes a value holding %XX through {+...} and {#...} untouched,
    # other characters included; such an output is not a URI, so not our concern.
    assume(URI.fullmatch(uri))
    return template, uri


def expanded(template: str, **values: Any) -> tuple[str, str]:
    return template, URITemplate(template).expand(values)


@given(case=expansions())
# Map keys under ; ? & hold any unreserved character, or none.
@example(case=expanded("x{?keys*}", keys={"a-b": "1"}))  # "x?a-b=1"
@example(case=expanded("x{;keys*}", keys={"a~b": "1"}))  # "x;a~b=1"
@example(case=expanded("x{&keys*}", keys={"": "1"}))  # "x&=1"
def test_every_expansion_matches_its_template(case: tuple[str, str]) -> None:
    template, uri = case
    assert match(template, uri), case


@pytest.mark.parametrize(
    ("template", "uri", "loose"),
    [
        ("time://{stamp}", "time://2024-01-01T10:00:00", True),
        ("user://{email}/profile", "user://a@b.com/profile", True),
        ("notes://{title}", "notes://hello world", True),
        ("notes://{title}", "notes://café", True),
        ("notes://{title}", "notes://a/b", False),  # {var}: anything but "/"
        ("file:///{+path}", "file:///a b/ç", True),  # {+var}: anything
        ("x{?q}", "x?q=a/b c", True),
        ("x{?q}", "x?q=1#f", False),
    ],
)
def test_loose_matching_is_the_sdks(template: str, uri: str, loose: bool) -> None:
    """As the MCP SDKs match their own templates (the broker's fallback)."""
    assert match(template, uri, loose=True) is loose
    if loose:
        assert not match(template, uri)  # (not RFC 6570's)
