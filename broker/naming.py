"""Names in the aggregated catalog: ``SERVER__tool``, always valid, always stable.

Rules (docs/naming-and-routing.md has the reasoning):

- Every emitted name matches ``^[A-Za-z0-9_.-]{1,128}$``.
- A name is a pure function of (server name, the server's own name for the
  item, separator): adding or removing another server never changes it. The
  one exception is a clash, below.
- A server name or item name that is already valid is used as it is. One that
  is not gets its invalid characters replaced by ``_`` and a short hash of the
  original appended (``my server`` -> ``my_server-3f9a1c``), so two different
  originals never sanitise to the same text.
- A qualified name longer than 128 characters is cut and given a hash of the
  whole original, so it stays unique and deterministic.
- Two items that still end up with the same name (``a`` + ``b__c`` and
  ``a__b`` + ``c``): the one from the senior server keeps it, the other gets
  a hash suffix (another, if that name is taken too), and the clash is
  reported. Nothing is dropped. Seniority is config order at start; a server
  a reload adds is junior to every server already there, so that a name a
  client already knows never moves to another server's item.
- A name already given keeps its item (``held``): an item a server lists
  later (a ``list_changed``) that would clash with it is the one renamed,
  whatever the servers' seniority.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence

VALID_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # (use fullmatch: "$" admits a final newline)
MAX_NAME = 128
DEFAULT_SEPARATOR = "__"
_INVALID_CHARS = re.compile(r"[^A-Za-z0-9_.-]")
HASH_CHARS = 6


def short_hash(*parts: str) -> str:
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()
    return digest[:HASH_CHARS]


def sanitize(name: str) -> str:
    """``name`` if valid, else its valid characters plus a hash of the original."""
    if VALID_NAME.fullmatch(name):
        return name
    cleaned = _INVALID_CHARS.sub("_", name)[: MAX_NAME - HASH_CHARS - 1] or "_"
    return f"{cleaned}-{short_hash(name)}"


def qualify(server: str, name: str, separator: str = DEFAULT_SEPARATOR) -> str:
    """The catalog name of ``name`` from ``server``."""
    full = sanitize(server) + separator + sanitize(name)
    if len(full) <= MAX_NAME:
        return full
    suffix = "-" + short_hash(server, name)
    return full[: MAX_NAME - len(suffix)] + suffix


def disambiguate(server: str, name: str, qualified: str, attempt: int = 0) -> str:
    """A second name for an item whose qualified name clashed with another's
    (``attempt`` > 0: the next one, when that is taken too)."""
    suffix = "-" + short_hash("clash", server, name, *([str(attempt)] if attempt else []))
    return qualified[: MAX_NAME - len(suffix)] + suffix


def assign_names(
    items: Iterable[tuple[str, str]],
    separator: str = DEFAULT_SEPARATOR,
    seniority: Sequence[str] = (),
    held: Mapping[tuple[str, str], str] = {},
) -> tuple[dict[tuple[str, str], str], list[str]]:
    """Qualified names for (server, name) pairs given in config order.

    ``held``: names given before (to items there or not; each name once),
    which no other item gets: an item of ``items`` in it keeps its name. On
    any other clash the item of the server earlier in ``seniority`` keeps the
    name (servers not in it come after, in the order given). Returns the names
    and a description of every clash that was resolved.
    """
    names: dict[tuple[str, str], str] = {}
    taken: dict[str, tuple[str, str]] = {name: pair for pair, name in held.items()}
    clashes: list[str] = []
    for server, name in _by_seniority(items, seniority):
        if (server, name) in names:
            continue  # a server listing the same name twice: one entry
        if (server, name) in held:
            names[(server, name)] = held[(server, name)]
            continue
        qualified = qualify(server, name, separator)
        if qualified in taken:
            other = taken[qualified]
            renamed = disambiguate(server, name, qualified)
            attempt = 0
            while renamed in taken:  # (that name is some other item's already)
                attempt += 1
                renamed = disambiguate(server, name, qualified, attempt)
            clashes.append(
                f"{name!r} of server {server!r} is named {renamed!r}: {qualified!r} "
                f"is {other[1]!r} of server {other[0]!r}, which came first"
            )
            qualified = renamed
        names[(server, name)] = qualified
        taken[qualified] = (server, name)
    return names, clashes


def _by_seniority(
    items: Iterable[tuple[str, str]], seniority: Sequence[str]
) -> Iterable[tuple[str, str]]:
    """``items`` with the servers in ``seniority`` first, in its order (each
    server's own items in the order given)."""
    if not seniority:
        return items
    rank = {server: index for index, server in enumerate(seniority)}
    return sorted(items, key=lambda pair: rank.get(pair[0], len(rank)))
