"""What one HTTP link's SSE streams may hold at once in events not yet
complete (docs/architecture.md, "Servers reached by HTTP").

Each stream's parser bounds its own unfinished event (four times
``maxMessageBytes``: actors/links/http.py ``HARD_LIMIT_FACTOR``), but a
link has up to 65 streams (its request tasks and the GET stream): one
server that keeps each of them in the middle of a large event could make
the daemon hold 65 such events, some 4 GiB at the defaults.
:class:`StreamBudget` bounds their sum for the link: the bytes each stream
has read since its last complete event are counted (as they come over the
wire; within a chunk of what the parser holds), and the stream whose bytes
take the sum past the budget fails with :class:`OverBudget` (an
``SSEError``: its request's failure, never the link's, as for an event past
its own limit).
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
        self.held = 0  # bytes read by the link's streams since their last complete event

    def events(
        self, response: httpx2.Response, max_event: int
    ) -> AsyncIterator[httpx2.ServerSentEvent]:
        """``response``'s events (``httpx2.EventSource``, each at most
        ``max_event`` bytes), its bytes counted against the budget until its
        next event comes or it is closed."""
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        counted = _Counted(response.stream, self)
        response.stream = counted
        return _settled(httpx2.EventSource(response, max_event), counted)


async def _settled(
    source: httpx2.EventSource, counted: _Counted
) -> AsyncIterator[httpx2.ServerSentEvent]:
    async for event in source:
        counted.settle()
        yield event


class _Counted(httpx2.AsyncByteStream):
    """A response's body, each chunk counted against the budget."""

    def __init__(self, stream: httpx2.AsyncByteStream, budget: StreamBudget) -> None:
        self._stream = stream
        self._budget = budget
        self._pending = 0  # bytes read since the last complete event

    async def __aiter__(self) -> AsyncIterator[bytes]:
        budget = self._budget
        async for chunk in self._stream:
            self._pending += len(chunk)
            budget.held += len(chunk)
            if budget.held > budget.limit:
                self.settle()
                raise OverBudget(
                    f"the server's SSE streams held over {budget.limit} bytes "
                    "of unfinished events at once"
                )
            yield chunk

    def settle(self) -> None:
        """An event came (or the stream is done): what it held is let go."""
        self._budget.held -= self._pending
        self._pending = 0

    async def aclose(self) -> None:
        self.settle()
        await self._stream.aclose()
