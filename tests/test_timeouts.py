"""Deadlines: held to a plain model (every request's deadline in one dict)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.config import BrokerSettings, ServerConfig
from broker.timeouts import Deadlines, TimeoutPolicy

POLICY = TimeoutPolicy(timeout=10.0, max_total=25.0)


class Model:
    """What Deadlines must answer, computed the obvious way."""

    def __init__(self, policy: TimeoutPolicy) -> None:
        self.policy = policy
        self.times: dict[int, tuple[float, float]] = {}  # id -> (sent, deadline)

    def add(self, upstream_id: int, now: float) -> None:
        self.times[upstream_id] = (now, now + self.policy.timeout)

    def touch(self, upstream_id: int, now: float) -> None:
        if upstream_id in self.times:
            sent, _ = self.times[upstream_id]
            deadline = min(now + self.policy.timeout, sent + self.policy.max_total)
            self.times[upstream_id] = (sent, deadline)

    def discard(self, upstream_id: int) -> None:
        self.times.pop(upstream_id, None)

    def next_deadline(self) -> float | None:
        return min((deadline for _, deadline in self.times.values()), default=None)

    def expired(self, now: float) -> set[int]:
        gone = {uid for uid, (_, deadline) in self.times.items() if deadline <= now}
        for upstream_id in gone:
            del self.times[upstream_id]
        return gone


times = st.integers(0, 60).map(float)  # whole seconds: deadlines are often hit exactly
operations = st.lists(
    st.tuples(st.sampled_from(["add", "touch", "discard", "expired"]), st.integers(0, 12), times),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(operations, st.booleans())
def test_deadlines_agree_with_the_model(ops: list[tuple[str, int, float]], monotonic: bool) -> None:
    deadlines, model = Deadlines(POLICY), Model(POLICY)
    clock = 0.0
    for op, upstream_id, at in ops:
        # Mostly times in order, as a real clock gives them; sometimes any order.
        now = clock = max(clock, at) if monotonic else at
        if op == "add":
            if model.times.get(upstream_id) is not None:
                continue  # upstream ids are never reused while in flight
            deadlines.add(upstream_id, now)
            model.add(upstream_id, now)
        elif op == "touch":
            deadlines.touch(upstream_id, now)
            model.touch(upstream_id, now)
        elif op == "discard":
            deadlines.discard(upstream_id)
            model.discard(upstream_id)
        else:
            assert set(deadlines.expired(now)) == model.expired(now)
        assert deadlines.next_deadline() == model.next_deadline()
        assert len(deadlines) == len(model.times)
        for uid, (sent, _) in model.times.items():
            assert deadlines.sent_at(uid) == sent


def test_no_timeout_means_no_deadlines() -> None:
    deadlines = Deadlines(TimeoutPolicy(timeout=math.inf))
    deadlines.add(1, 0.0)
    assert deadlines.next_deadline() is None and deadlines.expired(1e9) == []


def test_answered_requests_leave_nothing_behind() -> None:
    deadlines = Deadlines(POLICY)
    for i in range(10_000):
        deadlines.add(i, i / 1000)
        if i % 3 == 0:
            deadlines.touch(i, i / 1000 + 0.5)  # progress moves it to the heap
        deadlines.discard(i)
    assert len(deadlines) == 0 and len(deadlines._heap) < 200


# -- a server's policy, from the config -------------------------------------------


def test_a_server_without_its_own_timeout_takes_the_brokers() -> None:
    settings = BrokerSettings(request_timeout=20.0, max_request_timeout=100.0)
    assert TimeoutPolicy.for_server(ServerConfig(), settings) == TimeoutPolicy(20.0, 100.0)


def test_a_servers_own_timeout_comes_first() -> None:
    settings = BrokerSettings(request_timeout=20.0, max_request_timeout=100.0)
    config = ServerConfig(timeout=5.0)
    assert TimeoutPolicy.for_server(config, settings) == TimeoutPolicy(5.0, 100.0)


def test_the_total_is_never_below_a_servers_timeout() -> None:
    settings = BrokerSettings(request_timeout=20.0, max_request_timeout=100.0)
    config = ServerConfig(timeout=500.0)
    assert TimeoutPolicy.for_server(config, settings) == TimeoutPolicy(500.0, 500.0)


@given(st.one_of(st.none(), st.floats(0.1, 1e6)), st.floats(0.1, 1e6), st.floats(0.1, 1e6))
def test_for_server_clamps(own: float | None, default: float, total: float) -> None:
    settings = BrokerSettings(request_timeout=default, max_request_timeout=max(default, total))
    policy = TimeoutPolicy.for_server(ServerConfig(timeout=own), settings)
    assert policy.timeout == (own or default)
    assert policy.max_total == max(policy.timeout, settings.max_request_timeout)
    assert policy.enabled
