"""How the Registry reads a server's lists, and whom it tells when they change.

Sans-I/O: the Registry actor (actors/registry.py) sends the requests and
waits for the answers; these rules say what to ask next and what to make of
each answer.

- Reading one list (:class:`Lister`): the first request has no cursor; each
  answer is one page, whose well-formed items (:func:`broker.catalog.valid_item`)
  are kept and whose malformed ones are handed back to be logged; an item
  whose id (name, URI) an earlier one has is left out; a page with a
  ``nextCursor`` asks for the next. A result that is not a page of that list
  (no object, no array under the list's key) is an error, like a request that
  fails: the caller keeps the list it had (:attr:`PageRead.error`).
- A paginator that never ends is cut off, keeping what it sent (and saying why,
  :attr:`PageRead.cut`, for the log): at a cursor it gave before, at a page
  that brings nothing new, after :data:`MAX_PAGES` pages, and at
  :data:`MAX_ITEMS` items or :data:`MAX_LIST_BYTES` of them (a list that big
  is no use to a model anyway, and each server's lists live in the daemon's
  memory and in every catalog rebuild).
- Telling sessions (:func:`list_changed`): after a server's lists change,
  each subscribed session whose view includes that server gets each matching
  ``list_changed`` notification once (resources and templates share one), and
  sessions whose view does not include it get nothing; but a session whose
  view holds a server whose items were renamed by the change (a clash came or
  went, :func:`renamed_elsewhere`) is told too.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from typing import Any, TypeVar

import attrs
import orjson

from broker import jsonrpc
from broker.catalog import PROMPTS, TOOLS, Catalog, Kind, ServerEntry, valid_item
from broker.jsonrpc import Message

MAX_PAGES = 1000  # a server whose cursors never end is cut off here
MAX_ITEMS = 10_000  # items of one list of one server
MAX_LIST_BYTES = 4 * 1024 * 1024  # their size, as JSON

S = TypeVar("S")


@attrs.define(slots=True)
class PageRead:
    """What one page of a list came to."""

    next: dict[str, Any] | None  # the params of the next request; None: the list is read
    invalid: list[Any]  # items left out as malformed (for the log)
    error: str | None = None  # the result was no page: the list could not be read
    cut: str | None = None  # why the list was cut off before its end (for the log)


class Lister:
    """Reads one server's list of one kind, page by page."""

    def __init__(
        self,
        kind: Kind,
        max_pages: int = MAX_PAGES,
        max_items: int = MAX_ITEMS,
        max_bytes: int = MAX_LIST_BYTES,
    ) -> None:
        self.kind = kind
        self.max_pages = max_pages
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.pages = 0
        self.bytes = 0
        self._items: list[dict[str, Any]] = []
        self._ids: set[str] = set()
        self._cursors: set[str] = set()

    def first_request(self) -> dict[str, Any]:
        """The params of the first request."""
        return {}

    def page(self, result: Any) -> PageRead:
        """Take the result of one list request; say what to ask next, if anything."""
        self.pages += 1
        page = result.get(self.kind.key) if isinstance(result, dict) else None
        if not isinstance(page, list):
            return PageRead(None, [], error=f"the result holds no {self.kind.key!r} array")
        invalid: list[Any] = []
        new = 0
        for item in page:
            if not valid_item(self.kind, item):
                invalid.append(item)
            elif item[self.kind.id_field] not in self._ids:
                if len(self._items) >= self.max_items:
                    return PageRead(None, invalid, cut=f"more than {self.max_items} items")
                self.bytes += len(orjson.dumps(item))
                if self.bytes > self.max_bytes:
                    return PageRead(None, invalid, cut=f"more than {self.max_bytes} bytes")
                self._ids.add(item[self.kind.id_field])
                self._items.append(item)
                new += 1
        cursor = result.get("nextCursor")
        if not cursor:
            return PageRead(None, invalid)
        key = cursor if isinstance(cursor, str) else repr(cursor)
        if key in self._cursors:
            return PageRead(None, invalid, cut="it gave a cursor it had given before")
        if page and not new:
            return PageRead(None, invalid, cut="a page brought no item not listed before")
        if self.pages >= self.max_pages:
            return PageRead(None, invalid, cut=f"more than {self.max_pages} pages")
        self._cursors.add(key)
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


def renamed_elsewhere(
    before: Catalog,
    after: Catalog,
    cause: str | None,
    subscribers: Mapping[S, frozenset[str]],
    transparent: Container[S] = (),
) -> list[tuple[S, Message]]:
    """Who is told what when ``cause``'s lists changed (None: a reload) and
    renamed items of other servers (a clash came or went): each subscriber
    whose view holds a renamed server but not ``cause`` (whose own change
    tells the others), once per notification; not a ``transparent`` one,
    which sees its server's own names. Names are given over the whole
    catalog, so a server outside a view can rename a tool inside it."""
    out: list[tuple[S, Message]] = []
    for kind in (TOOLS, PROMPTS):
        renamed = after.renamed(before, kind) - {cause}
        if renamed:
            note = jsonrpc.notification(kind.notification)
            out.extend(
                (session, note)
                for session, view in subscribers.items()
                if cause not in view and not renamed.isdisjoint(view) and session not in transparent
            )
    return out


def renamed(
    kinds: Iterable[Kind], subscribers: Mapping[S, frozenset[str]], transparent: Container[S]
) -> list[tuple[S, Message]]:
    """Who is told what when the separator changed (``kinds``: those whose names
    carry it): each subscriber once per notification, however many servers it
    sees; not a ``transparent`` one, whose names carry no separator (and whose
    initialize may not have offered ``listChanged`` for them)."""
    out: list[tuple[S, Message]] = []
    for method in dict.fromkeys(kind.notification for kind in kinds):
        note = jsonrpc.notification(method)
        out.extend(
            (session, note)
            for session, view in subscribers.items()
            if view and session not in transparent
        )
    return out


def new_clashes(before: Catalog, after: Catalog) -> list[str]:
    """The name clashes of ``after`` that ``before`` did not have (to be logged once)."""
    known = set(before.clashes)
    return [clash for clash in after.clashes if clash not in known]
