"""What one HTTP link's SSE streams may hold at once in events not yet
complete (docs/architecture.md, "Servers reached by HTTP").

Each stream's parser bounds its own unfinished event (four times
``maxMessageBytes``: actors/links/http.py ``HARD_LIMIT_FACTOR``), but a
link has up to 65 streams (its request tasks and the GET stream): one
server that keeps each of them in the middle of a large event could make
the daemon hold 65 such events, some 4 GiB at the defaults.
:class:`StreamBudget` bounds their sum for the link: the bytes each stream
has read since the end of its last event are counted (as they come over
the wire), and the stream whose bytes take the sum past the budget fails
with :class:`OverBudget` (an ``SSEError``: its request's failure, as for
an event past its own limit; on an HTTP+SSE link, whose one stream carries
every answer, the link's end).

An event ends at a blank line, whether or not the parser makes anything of
it: the bytes of a comment (``: ping``, a keep-alive sent every 15 s by the
official SDK's servers) or a data-less event are let go at their blank
line too, so an idle stream holds nothing however long it stays open.
The blank lines are looked for in the body as it comes over the wire: the
link asks for it uncompressed (actors/links/http.py, ``accept-encoding``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2


class OverBudget(httpx2.SSEError):
    """A stream's bytes took its link's unfinished events past the budget."""


class StreamBudget:
    """The budget of one link: ``limit`` bytes of unfinished events in all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0  # bytes read by the link's streams since their events' last end

    def events(
        self, response: httpx2.Response, max_event: int
    ) -> AsyncIterator[httpx2.ServerSentEvent]:
        """``response``'s events (``httpx2.EventSource``, each at most
        ``max_event`` bytes), its bytes counted against the budget until the
        blank line that ends their event comes, or it is closed."""
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _Counted(response.stream, self)
        return aiter(httpx2.EventSource(response, max_event))


# Two line ends in a row (a blank line: the end of an event) other than the
# one line end CRLF; each line ending LF, CR or CRLF (the SSE grammar).
_BLANK_LINES = (b"\n\n", b"\r\r", b"\n\r")
_LINE_ENDS = b"\r\n"


class _Counted(httpx2.AsyncByteStream):
    """A response's body, each chunk counted against the budget up to the
    last blank line in it (the end of an event): what follows it is held."""

    def __init__(self, stream: httpx2.AsyncByteStream, budget: StreamBudget) -> None:
        self._stream = stream
        self._budget = budget
        self._pending = 0  # bytes read since the end of the last event
        self._last = 0  # the last byte read (0: none, or no line end)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        budget = self._budget
        async for chunk in self._stream:
            if not chunk:
                continue
            end = _events_end(self._last, chunk)
            self._last = chunk[-1] if chunk[-1] in _LINE_ENDS else 0
            if end:
                budget.held -= self._pending
                self._pending = 0
            self._pending += len(chunk) - end
            budget.held += len(chunk) - end
            if budget.held > budget.limit:
                self.settle()
                raise OverBudget(
                    f"the server's SSE streams held over {budget.limit} bytes "
                    "of unfinished events at once"
                )
            yield chunk

    def settle(self) -> None:
        """The stream is done: what it held is let go."""
        self._budget.held -= self._pending
        self._pending = 0

    async def aclose(self) -> None:
        self.settle()
        await self._stream.aclose()


def _events_end(last: int, chunk: bytes) -> int:
    """How many of ``chunk``'s bytes end events: those up to its last blank
    line (0: none; ``last``: the byte before it, if a line end)."""
    end = max(chunk.rfind(blank) for blank in _BLANK_LINES) + 2
    if end < 2:
        if not (last and chunk[0] in _LINE_ENDS and bytes((last, chunk[0])) != b"\r\n"):
            return 0
        end = 1
    if chunk[end - 1 : end + 1] == b"\r\n":
        end += 1  # (the blank line ends CRLF)
    return end
