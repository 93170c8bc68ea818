"""The one place where transport errors become broker errors (as httpcore does).

Code outside this module sees :class:`TransportClosed`, never the trio or OS
exception that caused it.
"""

from __future__ import annotations

from types import TracebackType

import trio


class TransportClosed(Exception):
    """The peer went away, or the stream was closed under us."""


class NotReading(TransportClosed):
    """The transport gave up on a client that does not read what it is sent
    (a Streamable HTTP session's events piling up): the message says so, for
    the session's close reason."""


class map_transport_errors:
    """``with map_transport_errors():`` turns trio and OS errors into TransportClosed.

    A class rather than a ``@contextmanager`` generator: it is entered on every
    read and write of the hot path, and this is several times cheaper.
    """

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        if isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError)):
            raise TransportClosed(str(exc) or type(exc).__name__) from exc
        if isinstance(exc, OSError):
            raise TransportClosed(exc.strerror or str(exc)) from exc
