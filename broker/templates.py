"""Matching URIs against RFC 6570 URI templates (the inverse of expansion).

MCP servers publish resource templates such as ``file:///{path}`` or
``repo://{owner}/{repo}/issues{?state}``; to route ``resources/read`` the broker
must tell whether a URI could have come from a template. :func:`match` says
so for templates of every level (every operator, explode and prefix
modifiers).

Each expression expands either to nothing (its variables undefined) or to its
operator's prefix followed by characters its operator allows: values (with
``%XX`` escapes), the separators that join list items, ``,`` and ``=``, and for
the named operators (``;``, ``?``, ``&``) the names. So an expression matches
``(prefix (allowed | %XX)*)?``; query expressions thereby accept their
parameters in any order, each optional, as a client may leave any out.

A regular expression of that shape backtracks exponentially on some URIs that
fail late (an item may hold ``,`` and items are joined by ``,``), and one
client's ``resources/read`` must never stall the daemon. :class:`Template`
therefore walks a small NFA over the URI instead: time linear in the URI's
length, which is capped at :data:`MAX_URI`, times the states the walk holds at
once (up to the expressions of the template).

That is still work on the daemon's one event loop for every ``resources/read``
no listed resource answers, multiplied by the templates of the view. So a
template's literal start and end are checked first (in C: most templates fail
here); each template remembers the moves its walk made (a DFA built as URIs
need it, up to :data:`MAX_MOVES`), so a long run of characters costs a
dictionary look-up each; and the walks of one lookup share a :class:`Budget`:
a lookup that spends it matches no further template (:class:`BudgetSpent`).
"""

from __future__ import annotations

import functools
import re
import string

import attrs

MAX_URI = 2048  # longer URIs match no template (exact URIs are matched elsewhere)
# The work one lookup may do, over every template it tries: about 10 ms on the
# event loop. A character costs 1 when the template's walk has made that move
# before, else STEP_COST per state it holds: so a URI of MAX_URI characters can
# be tried against dozens of templates that share its literal start and end.
MATCH_BUDGET = 100_000
STEP_COST = 10  # a move worked out costs this per state it starts from; one remembered, 1
MAX_MOVES = 1024  # the moves a template remembers

_EXPRESSION = re.compile(r"\{([^{}]*)\}")
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_RESERVED = _UNRESERVED | frozenset(":/?#[]@!$&'()*+,;=")
_HEX = frozenset(string.hexdigits)
# operator: (prefix, characters an expansion may hold after it)
_OPERATORS: dict[str, tuple[str, frozenset[str]]] = {
    "": ("", _UNRESERVED | frozenset(",=")),
    "+": ("", _RESERVED),
    "#": ("#", _RESERVED),
    ".": (".", _UNRESERVED | frozenset(",=")),
    "/": ("/", _UNRESERVED | frozenset("/,=")),
    ";": (";", _UNRESERVED | frozenset(";,=")),
    "?": ("?", _UNRESERVED | frozenset("&,=")),
    "&": ("&", _UNRESERVED | frozenset("&,=")),
}
# Loose matching, operator: the characters an expansion may not hold. The MCP
# SDKs match their own templates so (``{var}`` as ``[^/]+``, ``{+var}`` as
# ``.+``): a value with a space, an "@" or a ":" unencoded, which RFC 6570
# would have encoded, still reaches them. The broker falls back to it
# (broker/catalog.py) when no template of the view matches strictly.
_LOOSE: dict[str, frozenset[str]] = {
    "": frozenset("/"),
    "+": frozenset(),
    "#": frozenset(),
    ".": frozenset("/"),
    "/": frozenset(),
    ";": frozenset("/"),
    "?": frozenset("#"),
    "&": frozenset("#"),
}
# Where an NFA walk is inside an expression (phases >= 0 are prefix positions).
_BODY, _PCT1, _PCT2 = -1, -2, -3


class TemplateError(ValueError):
    """A string that is not a URI template this module understands."""


class BudgetSpent(Exception):
    """A lookup stepped :data:`MATCH_BUDGET` states without finding its template."""


class Budget:
    """The work one lookup may still do (shared by the templates it tries)."""

    def __init__(self, steps: int = MATCH_BUDGET) -> None:
        self.left = steps


@attrs.frozen
class _Literal:
    text: str


@attrs.frozen
class _Expression:
    prefix: str
    allowed: frozenset[str]
    # Loose matching: any character but these (``allowed`` is then unused).
    forbidden: frozenset[str] | None = None


State = tuple[int, int]  # (token index, phase)


class Template:
    def __init__(self, template: str, loose: bool = False) -> None:
        self.template = template
        self.tokens = _tokens(template, loose)
        first, last = self.tokens[:1], self.tokens[-1:]
        # The literal text every expansion starts and ends with.
        self.head = first[0].text if first and isinstance(first[0], _Literal) else ""
        self.tail = last[0].text if last and isinstance(last[0], _Literal) else ""
        # The walk's moves, worked out as URIs need them (a lazily built DFA):
        # from a set of states, on a character, to the next set.
        self._start = frozenset(self._closure({(0, 0)}))
        self._known = {self._start: self._start}
        self._moves: dict[frozenset[State], dict[str, frozenset[State]]] = {}
        self._remembered = 0

    def fullmatch(self, uri: str, budget: Budget | None = None) -> bool:
        """Whether ``uri`` could be an expansion of the template (raises
        :class:`BudgetSpent` when the walk would cost more than ``budget``
        has left)."""
        if len(uri) > MAX_URI or not (uri.startswith(self.head) and uri.endswith(self.tail)):
            return False
        if budget is None:
            budget = Budget()
        states = self._start
        for char in uri:
            row = self._moves.get(states)
            after = row.get(char) if row is not None else None
            if after is None:
                budget.left -= STEP_COST * len(states)
                after = self._move(states, char)
            else:
                budget.left -= 1
            if budget.left < 0:
                raise BudgetSpent(self.template)
            if not after:
                return False
            states = after
        return (len(self.tokens), 0) in states

    def _move(self, states: frozenset[State], char: str) -> frozenset[State]:
        """The set of states the walk goes to from ``states`` on ``char``;
        remembered (the set kept as one object, so that looking it up is an
        identity check), up to :data:`MAX_MOVES` moves."""
        after = frozenset(self._closure({s for state in states for s in self._step(state, char)}))
        if self._remembered < MAX_MOVES:
            after = self._known.setdefault(after, after)
            self._moves.setdefault(states, {})[char] = after
            self._remembered += 1
        return after

    def _step(self, state: State, char: str) -> list[State]:
        index, phase = state
        if index == len(self.tokens):
            return []
        token = self.tokens[index]
        if isinstance(token, _Literal):
            text = token.text
            return [(index, phase + 1)] if phase < len(text) and text[phase] == char else []
        if phase >= 0:
            prefix = token.prefix
            return [(index, phase + 1)] if phase < len(prefix) and prefix[phase] == char else []
        if phase == _BODY:
            forbidden = token.forbidden
            if char in token.allowed if forbidden is None else char not in forbidden:
                return [(index, _BODY)]
            return [(index, _PCT1)] if char == "%" else []
        if char in _HEX:
            return [(index, _PCT2 if phase == _PCT1 else _BODY)]
        return []

    def _closure(self, states: set[State]) -> set[State]:
        """Add every state reachable without reading a character."""
        pending = list(states)
        while pending:
            index, phase = pending.pop()
            if index == len(self.tokens):
                continue
            token = self.tokens[index]
            follow: list[State] = []
            if isinstance(token, _Literal):
                if phase == len(token.text):
                    follow.append((index + 1, 0))
            elif phase == _BODY or (phase == 0 and not token.prefix):
                follow += [(index + 1, 0), (index, _BODY)]
            elif phase == 0:
                follow.append((index + 1, 0))  # the expression expanded to nothing
            elif phase == len(token.prefix):
                follow.append((index, _BODY))
            for state in follow:
                if state not in states:
                    states.add(state)
                    pending.append(state)
        return states


@functools.lru_cache(maxsize=256)
def compile_template(template: str, loose: bool = False) -> Template:
    """The matcher for a template (raises :class:`TemplateError`)."""
    return Template(template, loose)


def match(template: str, uri: str, budget: Budget | None = None, loose: bool = False) -> bool:
    """Whether ``uri`` could be an expansion of ``template`` (raises
    :class:`BudgetSpent` if ``budget`` runs out first); ``loose``: as the MCP
    SDKs match their own templates (:data:`_LOOSE`)."""
    try:
        matcher = compile_template(template, loose)
    except TemplateError:
        return False
    return matcher.fullmatch(uri, budget)


def _tokens(template: str, loose: bool = False) -> tuple[_Literal | _Expression, ...]:
    tokens: list[_Literal | _Expression] = []
    position = 0
    for expression in _EXPRESSION.finditer(template):
        tokens += _literal(template, template[position : expression.start()])
        tokens.append(_expression(expression.group(1), loose))
        position = expression.end()
    tokens += _literal(template, template[position:])
    return tuple(tokens)


def _literal(template: str, text: str) -> list[_Literal]:
    if "{" in text or "}" in text:
        raise TemplateError(f"unbalanced braces in URI template {template!r}")
    return [_Literal(text)] if text else []


def _expression(body: str, loose: bool = False) -> _Expression:
    operator = body[:1] if body[:1] in _OPERATORS else ""
    variables = body[len(operator) :].split(",")
    if not all(v.rstrip("*").split(":")[0] for v in variables):
        raise TemplateError(f"empty variable in expression {{{body}}}")
    prefix, allowed = _OPERATORS[operator]
    return _Expression(prefix, allowed, _LOOSE[operator] if loose else None)
