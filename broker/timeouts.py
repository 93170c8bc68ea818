"""Request deadlines for one upstream, sans-I/O (times are passed in).

Every forwarded request gets ``timeout`` seconds. Progress on it (a
``notifications/progress`` from the server) starts the clock again, but never
past ``max_total`` seconds after the request was sent, as the MCP spec
suggests for progress-resetting timeouts. :meth:`Deadlines.expired` says which
requests ran out; the caller cancels them upstream and answers the client.
"""

from __future__ import annotations

import heapq
import math

import attrs

COMPACT_AT = 64  # heap entries below which stale ones are not worth a rebuild


@attrs.frozen
class TimeoutPolicy:
    timeout: float = 300.0
    max_total: float = 3600.0

    @property
    def enabled(self) -> bool:
        return math.isfinite(self.timeout) and self.timeout > 0


class Deadlines:
    def __init__(self, policy: TimeoutPolicy) -> None:
        self.policy = policy
        self._enabled = policy.enabled
        self._heap: list[tuple[float, int]] = []
        # upstream id -> (sent at, current deadline)
        self._times: dict[int, tuple[float, float]] = {}

    def add(self, upstream_id: int, now: float) -> None:
        if not self._enabled:
            return
        deadline = now + self.policy.timeout
        self._times[upstream_id] = (now, deadline)
        heapq.heappush(self._heap, (deadline, upstream_id))

    def touch(self, upstream_id: int, now: float) -> None:
        """Progress arrived: start the clock again, within the total limit."""
        times = self._times.get(upstream_id)
        if times is None:
            return
        sent, _ = times
        deadline = min(now + self.policy.timeout, sent + self.policy.max_total)
        self._times[upstream_id] = (sent, deadline)
        heapq.heappush(self._heap, (deadline, upstream_id))

    def discard(self, upstream_id: int) -> None:
        """Forget a request (answered or cancelled).

        Its heap entries go stale and are skipped when they reach the top; so
        that they cannot pile up under load (one per request for a whole
        timeout), the heap is rebuilt from the live entries whenever stale
        ones outnumber them two to one.
        """
        if self._times.pop(upstream_id, None) is not None and len(
            self._heap
        ) > COMPACT_AT + 3 * len(self._times):
            self._heap = [(deadline, uid) for uid, (_, deadline) in self._times.items()]
            heapq.heapify(self._heap)

    def next_deadline(self) -> float | None:
        while self._heap:
            deadline, upstream_id = self._heap[0]
            times = self._times.get(upstream_id)
            if times is not None and times[1] == deadline:
                return deadline
            heapq.heappop(self._heap)  # answered, cancelled, or extended since
        return None

    def expired(self, now: float) -> list[int]:
        """The requests whose deadline has passed (forgotten here)."""
        out = []
        while (deadline := self.next_deadline()) is not None and deadline <= now:
            _, upstream_id = heapq.heappop(self._heap)
            del self._times[upstream_id]
            out.append(upstream_id)
        return out

    def sent_at(self, upstream_id: int) -> float | None:
        times = self._times.get(upstream_id)
        return None if times is None else times[0]
