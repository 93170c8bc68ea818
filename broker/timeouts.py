"""Request deadlines for one upstream, sans-I/O (times are passed in).

Every forwarded request gets ``timeout`` seconds. Progress on it (a
``notifications/progress`` from the server) starts the clock again, but never
past ``max_total`` seconds after the request was sent, as the MCP spec
suggests for progress-resetting timeouts (:meth:`TimeoutPolicy.for_server`
takes both from the config). :meth:`Deadlines.expired` says which requests
ran out; the caller cancels them upstream and answers the client.

Theory of operation: nearly every request is added with the time it is sent
and answered (discarded) soon after. Times arrive in order, so their
deadlines do too: those requests live in one insertion-ordered dict (a store
and a pop per request, no heap). The rest, requests whose clock progress
restarted and any added with an earlier time than the one before, live in a
heap with lazy deletion, rebuilt when stale entries outnumber live ones.
"""

from __future__ import annotations

import heapq
import math

import attrs

from broker.config import BrokerSettings, ServerConfig

COMPACT_AT = 64  # heap entries below which stale ones are not worth a rebuild


@attrs.frozen
class TimeoutPolicy:
    timeout: float = 300.0
    max_total: float = 3600.0

    @classmethod
    def for_server(cls, config: ServerConfig, settings: BrokerSettings) -> TimeoutPolicy:
        """A server's policy: its own ``timeout`` if it has one, else the broker's
        ``requestTimeout``; the total never below that timeout (a server may allow
        more than ``maxRequestTimeout`` between answers, and then gets it in all)."""
        timeout = config.timeout or settings.request_timeout
        return cls(timeout, max(timeout, settings.max_request_timeout))

    @property
    def enabled(self) -> bool:
        return math.isfinite(self.timeout) and self.timeout > 0


class Deadlines:
    def __init__(self, policy: TimeoutPolicy) -> None:
        self.policy = policy
        self._enabled = policy.enabled
        self._timeout = policy.timeout
        # upstream id -> sent at, in the order added; deadline = sent + timeout.
        self._in_order: dict[int, float] = {}
        self._latest = -math.inf  # the last time added to _in_order
        # The others: upstream id -> (sent at, current deadline), and a heap of
        # (deadline, upstream id) with stale entries skipped when they surface.
        self._times: dict[int, tuple[float, float]] = {}
        self._heap: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._in_order) + len(self._times)

    def set_policy(self, policy: TimeoutPolicy) -> None:
        """A new policy (a reload), for requests sent from now on. Those in flight
        keep the deadline they have until progress moves it (then under the new
        policy): they leave the in-order run, which holds one timeout only."""
        if policy == self.policy:
            return
        for upstream_id, sent in self._in_order.items():
            self._push(upstream_id, sent, sent + self._timeout)
        self._in_order.clear()
        self._latest = -math.inf
        self.policy = policy
        self._enabled = policy.enabled
        self._timeout = policy.timeout

    def add(self, upstream_id: int, now: float) -> None:
        if not self._enabled:
            return
        if now >= self._latest:
            self._in_order[upstream_id] = now
            self._latest = now
        else:
            self._push(upstream_id, now, now + self._timeout)

    def touch(self, upstream_id: int, now: float) -> None:
        """Progress arrived: start the clock again, within the total limit."""
        sent = self.sent_at(upstream_id)
        if sent is None:
            return
        self._in_order.pop(upstream_id, None)
        self._push(upstream_id, sent, min(now + self._timeout, sent + self.policy.max_total))

    def discard(self, upstream_id: int) -> None:
        """Forget a request (answered or cancelled)."""
        if self._in_order.pop(upstream_id, None) is None and self._times:
            self._forget(upstream_id)

    def next_deadline(self) -> float | None:
        first = None
        for sent in self._in_order.values():
            first = sent + self._timeout
            break
        while self._heap:
            deadline, upstream_id = self._heap[0]
            times = self._times.get(upstream_id)
            if times is not None and times[1] == deadline:
                return deadline if first is None else min(first, deadline)
            heapq.heappop(self._heap)  # answered, cancelled, or extended since
        return first

    def expired(self, now: float) -> list[int]:
        """The requests whose deadline has passed (forgotten here)."""
        out = []
        for upstream_id, sent in self._in_order.items():
            if sent + self._timeout > now:
                break
            out.append(upstream_id)
        for upstream_id in out:
            del self._in_order[upstream_id]
        while self._heap:
            deadline, upstream_id = self._heap[0]
            times = self._times.get(upstream_id)
            if times is not None and times[1] == deadline:
                if deadline > now:
                    break
                del self._times[upstream_id]
                out.append(upstream_id)
            heapq.heappop(self._heap)
        return out

    def sent_at(self, upstream_id: int) -> float | None:
        sent = self._in_order.get(upstream_id)
        if sent is not None:
            return sent
        times = self._times.get(upstream_id)
        return None if times is None else times[0]

    def _push(self, upstream_id: int, sent: float, deadline: float) -> None:
        self._times[upstream_id] = (sent, deadline)
        heapq.heappush(self._heap, (deadline, upstream_id))

    def _forget(self, upstream_id: int) -> None:
        """Drop a heap request; its entries go stale, and so that they cannot
        pile up (one per progress notice for a whole timeout), the heap is
        rebuilt from the live entries whenever stale ones outnumber them."""
        if self._times.pop(upstream_id, None) is not None and len(
            self._heap
        ) > COMPACT_AT + 3 * len(self._times):
            self._heap = [(deadline, uid) for uid, (_, deadline) in self._times.items()]
            heapq.heapify(self._heap)
