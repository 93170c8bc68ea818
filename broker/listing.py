"""How the Registry reads a server's lists, and whom it tells when they change.

Sans-I/O: the Registry actor (actors/registry.py) sends the requests and
waits for the answers; these rules say what to ask next and what to make of
each answer.

- Reading one list (:class:`Lister`): the first request has no cursor; each
  answer is one page, whose well-formed items (:func:`broker.catalog.valid_item`)
  are kept and whose malformed ones are handed back to be logged; a page with
  a ``nextCursor`` asks for the next. A server whose cursors never end is cut
  off after :data:`MAX_PAGES` pages, keeping what it sent. (A request that
  fails ends the list too, with what was read: the caller simply stops.)
- Telling sessions (:func:`list_changed`): after a server's lists change,
  each subscribed session whose view includes that server gets each matching
  ``list_changed`` notification once (resources and templates share one), and
  sessions whose view does not include it get nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import attrs

from broker import jsonrpc
from broker.catalog import Catalog, Kind, ServerEntry, valid_item
from broker.jsonrpc import Message

MAX_PAGES = 1000  # a server whose cursors never end is cut off here

S = TypeVar("S")


@attrs.define(slots=True)
class PageRead:
    """What one page of a list came to."""

    next: dict[str, Any] | None  # the params of the next request; None: the list is read
    invalid: list[Any]  # items left out as malformed (for the log)


class Lister:
    """Reads one server's list of one kind, page by page."""

    def __init__(self, kind: Kind, max_pages: int = MAX_PAGES) -> None:
        self.kind = kind
        self.max_pages = max_pages
        self.pages = 0
        self._items: list[dict[str, Any]] = []

    def first_request(self) -> dict[str, Any]:
        """The params of the first request."""
        return {}

    def page(self, result: Any) -> PageRead:
        """Take the result of one list request; say what to ask next, if anything."""
        self.pages += 1
        invalid: list[Any] = []
        page = result.get(self.kind.key) if isinstance(result, dict) else None
        for item in page if isinstance(page, list) else ():
            if valid_item(self.kind, item):
                self._items.append(item)
            else:
                invalid.append(item)
        cursor = result.get("nextCursor") if isinstance(result, dict) else None
        if not cursor or self.pages >= self.max_pages:
            return PageRead(None, invalid)
        return PageRead({"cursor": cursor}, invalid)

    def items(self) -> tuple[dict[str, Any], ...]:
        """The well-formed items read so far, in the server's order."""
        return tuple(self._items)


def changed_kinds(old: ServerEntry, new: ServerEntry, kinds: Iterable[Kind]) -> list[Kind]:
    """The kinds, of ``kinds``, whose lists differ between two entries of a server."""
    return [kind for kind in kinds if old.items(kind) != new.items(kind)]


def list_changed(
    server: str, kinds: Iterable[Kind], subscribers: Mapping[S, frozenset[str]]
) -> list[tuple[S, Message]]:
    """Who is told what when ``server``'s lists of ``kinds`` changed: each
    subscriber whose view includes the server, once per notification, in the
    order of ``kinds`` and then of ``subscribers``. (The sessions of one
    notification share one message: it is not to be changed.)"""
    out: list[tuple[S, Message]] = []
    for method in dict.fromkeys(kind.notification for kind in kinds):
        note = jsonrpc.notification(method)
        out.extend((session, note) for session, view in subscribers.items() if server in view)
    return out


def new_clashes(before: Catalog, after: Catalog) -> list[str]:
    """The name clashes of ``after`` that ``before`` did not have (to be logged once)."""
    known = set(before.clashes)
    return [clash for clash in after.clashes if clash not in known]
