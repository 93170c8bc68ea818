"""Matching URIs against RFC 6570 URI templates (the inverse of expansion).

MCP servers publish resource templates such as ``file:///{path}`` or
``repo://{owner}/{repo}/issues{?state}``; to route ``resources/read`` the broker
must tell which template a URI could have come from. :func:`compile_template`
turns a template into a regular expression that accepts exactly the strings
its expansion can produce (levels 1 to 4: every operator, explode and prefix
modifiers), and :func:`match` says whether a URI fits and with what values.
Query-style expressions (``?`` and ``&``) match their parameters in any order,
each optional, as a client may leave any of them out.
"""

from __future__ import annotations

import functools
import re

_EXPRESSION = re.compile(r"\{([^{}]*)\}")

# operator: (prefix, separator, named, character class of a value)
_UNRESERVED = r"[A-Za-z0-9\-._~]|%[0-9A-Fa-f]{2}"
_RESERVED = _UNRESERVED + r"|[:/?#\[\]@!$&'()*+,;=]"
_OPERATORS: dict[str, tuple[str, str, bool, str]] = {
    "": ("", ",", False, _UNRESERVED),
    "+": ("", ",", False, _RESERVED),
    "#": ("#", ",", False, _RESERVED),
    ".": (".", ".", False, _UNRESERVED),
    "/": ("/", "/", False, _UNRESERVED),
    ";": (";", ";", True, _UNRESERVED),
    "?": ("?", "&", True, _UNRESERVED),
    "&": ("&", "&", True, _UNRESERVED),
}


class TemplateError(ValueError):
    """A string that is not a URI template this module understands."""


@functools.lru_cache(maxsize=1024)
def compile_template(template: str) -> re.Pattern[str]:
    pattern = []
    position = 0
    for expression in _EXPRESSION.finditer(template):
        pattern.append(_literal(template, template[position : expression.start()]))
        pattern.append(_expression_pattern(expression.group(1)))
        position = expression.end()
    pattern.append(_literal(template, template[position:]))
    return re.compile("".join(pattern), re.DOTALL)


def _literal(template: str, text: str) -> str:
    if "{" in text or "}" in text:
        raise TemplateError(f"unbalanced braces in URI template {template!r}")
    return re.escape(text)


def match(template: str, uri: str) -> bool:
    """Whether ``uri`` could be an expansion of ``template``."""
    try:
        return compile_template(template).fullmatch(uri) is not None
    except TemplateError:
        return False


def _expression_pattern(body: str) -> str:
    """A regex for everything one ``{...}`` expression can expand to.

    An expression expands to nothing (every variable undefined) or to its
    prefix followed by one or more items joined by its separator. An item is a
    value (list values joined by ``,``, exploded ones by the separator, pairs
    of an exploded map by ``=``) or, for the named operators, ``name`` or
    ``name=value``. Query operators may repeat ``&name=value`` in any order.
    """
    operator = body[:1] if body[:1] in _OPERATORS and body[:1] else ""
    variables = body[len(operator) :].split(",")
    if not all(v.rstrip("*").split(":")[0] for v in variables):
        raise TemplateError(f"empty variable in expression {{{body}}}")
    prefix, separator, named, char = _OPERATORS[operator]
    value = f"(?:{char}|,)*"
    item = f"(?:{_UNRESERVED})*(?:={value})?" if named else f"(?:{char}|[,=])*"
    joined = f"{item}(?:{re.escape(separator)}{item})*"
    return f"(?:{re.escape(prefix)}{joined})?"
