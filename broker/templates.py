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
length, which is capped at :data:`MAX_URI`.
"""

from __future__ import annotations

import functools
import re
import string

import attrs

MAX_URI = 8192  # longer URIs match no template (exact URIs are matched elsewhere)

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
# Where an NFA walk is inside an expression (phases >= 0 are prefix positions).
_BODY, _PCT1, _PCT2 = -1, -2, -3


class TemplateError(ValueError):
    """A string that is not a URI template this module understands."""


@attrs.frozen
class _Literal:
    text: str


@attrs.frozen
class _Expression:
    prefix: str
    allowed: frozenset[str]


State = tuple[int, int]  # (token index, phase)


class Template:
    def __init__(self, template: str) -> None:
        self.template = template
        self.tokens = _tokens(template)

    def fullmatch(self, uri: str) -> bool:
        """Whether ``uri`` could be an expansion of the template."""
        if len(uri) > MAX_URI:
            return False
        states = self._closure({(0, 0)})
        for char in uri:
            states = self._closure({s for state in states for s in self._step(state, char)})
            if not states:
                return False
        return (len(self.tokens), 0) in states

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
            if char in token.allowed:
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


@functools.lru_cache(maxsize=1024)
def compile_template(template: str) -> Template:
    """The matcher for a template (raises :class:`TemplateError`)."""
    return Template(template)


def match(template: str, uri: str) -> bool:
    """Whether ``uri`` could be an expansion of ``template``."""
    try:
        return compile_template(template).fullmatch(uri)
    except TemplateError:
        return False


def _tokens(template: str) -> tuple[_Literal | _Expression, ...]:
    tokens: list[_Literal | _Expression] = []
    position = 0
    for expression in _EXPRESSION.finditer(template):
        tokens += _literal(template, template[position : expression.start()])
        tokens.append(_expression(expression.group(1)))
        position = expression.end()
    tokens += _literal(template, template[position:])
    return tuple(tokens)


def _literal(template: str, text: str) -> list[_Literal]:
    if "{" in text or "}" in text:
        raise TemplateError(f"unbalanced braces in URI template {template!r}")
    return [_Literal(text)] if text else []


def _expression(body: str) -> _Expression:
    operator = body[:1] if body[:1] in _OPERATORS else ""
    variables = body[len(operator) :].split(",")
    if not all(v.rstrip("*").split(":")[0] for v in variables):
        raise TemplateError(f"empty variable in expression {{{body}}}")
    prefix, allowed = _OPERATORS[operator]
    return _Expression(prefix, allowed)
