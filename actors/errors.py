"""The one place where transport errors become broker errors (as httpcore does).

Code outside this module sees :class:`TransportClosed`, never the trio or OS
exception that caused it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio


class TransportClosed(Exception):
    """The peer went away, or the stream was closed under us."""


@contextmanager
def map_transport_errors() -> Iterator[None]:
    try:
        yield
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise TransportClosed(str(exc) or type(exc).__name__) from exc
    except OSError as exc:
        raise TransportClosed(exc.strerror or str(exc)) from exc
