"""The base of the small records made once per message or per request.

A compiled build (mypyc, setup.py) makes a plain class natively, but runs
the ``__init__`` that attrs or dataclasses generate as Python: some 1,500
instructions a record, 5% of a compiled call for the one every request had
(``requestmap.InFlight``, benchmarks/README.md "2026-11-27"). So a record
made on a message's path is a plain class with ``__slots__`` and an
``__init__`` of its own, and gets from :class:`Record` what attrs would
have given it: equality by type and fields, and a repr that shows them.
"""

from __future__ import annotations

from typing import Any


class Record:
    """Equal to a record of the same type with equal fields (and so, as
    Python makes a class that defines ``__eq__`` alone, unhashable, unless
    the record defines ``__hash__``, as ``related.Related`` does)."""

    __slots__ = ()

    def fields(self) -> tuple[Any, ...]:
        """The record's fields, in its ``__init__``'s order."""
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.fields() == other.fields()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(field) for field in self.fields())})"
