"""The daemon's metrics, as Prometheus reads them (``/metrics``).

Nearly everything is read at scrape time from what ``mcpbroker status``
shows (each actor's ``statistics()``: servers, sessions, queues, restarts,
each server's CPU and memory through psutil). What must be counted as it
happens, requests by server, method and outcome, errors by code, and the
time they took, is counted by the sessions' trackers into one
:class:`~broker.calls.CallStats` (broker/calls.py) and read here too. One
custom collector turns both into metric families; prometheus_client writes
the text format. docs/observability.md lists every metric.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from importlib.metadata import version
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder

from broker.calls import DURATION_BUCKETS, CallStats
from broker.states import ServerState

PREFIX = "mcpbroker"


class BrokerCollector:
    """Metric families from the daemon's statistics and its call counts."""

    def __init__(self, statistics: Callable[[], Any], calls: CallStats) -> None:
        self._statistics = statistics  # () -> DaemonStatistics
        self._calls = calls

    def collect(self) -> Iterator[Metric]:
        daemon = self._statistics()
        yield from self._daemon(daemon)
        yield from self._servers(daemon.servers, daemon.draining)
        yield from self._sessions(daemon.sessions)
        yield from self._requests()

    def _daemon(self, daemon: Any) -> Iterator[Metric]:
        info = InfoMetricFamily(PREFIX, "The daemon: its version, how it was built and started.")
        info.add_metric(
            [],
            {
                "version": _version(),
                "rules": daemon.rules,
                "started_by": daemon.started_by,
            },
        )
        yield info
        yield GaugeMetricFamily(
            f"{PREFIX}_uptime_seconds", "Seconds since the daemon started.", value=daemon.uptime
        )

    def _servers(self, servers: Any, draining: Any) -> Iterator[Metric]:
        """Each server's series; the old actors a reload retires (``draining``)
        count in their server's requests in flight (a removed server's
        series stay until they end), and in its draining instances."""
        labels = ["server"]
        up = GaugeMetricFamily(
            f"{PREFIX}_server_up", "1 if the server is ready for requests.", labels=labels
        )
        state = GaugeMetricFamily(
            f"{PREFIX}_server_state",
            "1 for the server's state (broker/states.py), 0 for the others.",
            labels=["server", "state"],
        )
        in_flight = GaugeMetricFamily(
            f"{PREFIX}_server_requests_in_flight",
            "Requests sent to the server and not yet answered.",
            labels=labels,
        )
        waiting = GaugeMetricFamily(
            f"{PREFIX}_server_requests_waiting",
            "Requests held for their session's turn (serverRequests), not sent yet.",
            labels=labels,
        )
        inbox = GaugeMetricFamily(
            f"{PREFIX}_server_inbox_items",
            "Items waiting in the server's inbox for its dispatcher.",
            labels=labels,
        )
        backlog = GaugeMetricFamily(
            f"{PREFIX}_server_backlog_bytes",
            "Bytes written to the server that it has not taken yet.",
            labels=labels,
        )
        parked = GaugeMetricFamily(
            f"{PREFIX}_server_parked_requests",
            "Requests waiting for the server to finish starting.",
            labels=labels,
        )
        sessions = GaugeMetricFamily(
            f"{PREFIX}_server_sessions", "Sessions using the server.", labels=labels
        )
        instances = GaugeMetricFamily(
            f"{PREFIX}_server_instances",
            "Processes (or connections) of the server: 1, or a pool's, per-session or "
            "per-era count.",
            labels=labels,
        )
        restarts = CounterMetricFamily(
            f"{PREFIX}_server_restarts", "Times the server was started again.", labels=labels
        )
        forwarded = CounterMetricFamily(
            f"{PREFIX}_server_sent_requests",
            "Requests sent to the server (the broker's catalog fetches too).",
            labels=labels,
        )
        timeouts = CounterMetricFamily(
            f"{PREFIX}_server_timeouts",
            "Requests to the server that timed out (answered -32001).",
            labels=labels,
        )
        cpu = CounterMetricFamily(
            f"{PREFIX}_server_cpu_seconds",
            "CPU seconds (user + system) of the server's process(es) and their children.",
            labels=labels,
        )
        rss = GaugeMetricFamily(
            f"{PREFIX}_server_resident_memory_bytes",
            "Resident memory of the server's process(es) and their children.",
            labels=labels,
        )
        uptime = GaugeMetricFamily(
            f"{PREFIX}_server_uptime_seconds",
            "Seconds since the server's current connection became ready.",
            labels=labels,
        )
        old = GaugeMetricFamily(
            f"{PREFIX}_server_draining_instances",
            "Processes of the server a reload removed or restarted that still finish "
            "their requests in flight.",
            labels=labels,
        )
        old_in_flight: dict[str, int] = {}
        old_instances: dict[str, int] = {}
        for s in draining:
            old_in_flight[s.name] = old_in_flight.get(s.name, 0) + s.in_flight
            old_instances[s.name] = old_instances.get(s.name, 0) + s.instances
        for s in servers:
            name = [s.name]
            up.add_metric(name, 1.0 if s.state == ServerState.READY.value else 0.0)
            for each in ServerState:
                state.add_metric([s.name, each.value], 1.0 if s.state == each.value else 0.0)
            in_flight.add_metric(name, s.in_flight + old_in_flight.pop(s.name, 0))
            old.add_metric(name, old_instances.pop(s.name, 0))
            waiting.add_metric(name, s.waiting)
            inbox.add_metric(name, s.inbox)
            backlog.add_metric(name, s.backlog_bytes)
            parked.add_metric(name, s.parked)
            sessions.add_metric(name, s.sessions)
            instances.add_metric(name, s.instances)
            restarts.add_metric(name, s.restarts)
            forwarded.add_metric(name, s.requests)
            timeouts.add_metric(name, s.timeouts)
            if s.cpu is not None:
                cpu.add_metric(name, s.cpu)
            if s.rss is not None:
                rss.add_metric(name, s.rss)
            if s.uptime is not None:
                uptime.add_metric(name, s.uptime)
        for removed, count in old_in_flight.items():  # (removed: in no other series)
            in_flight.add_metric([removed], count)
            old.add_metric([removed], old_instances[removed])
        yield from (up, state, in_flight, waiting, inbox, backlog, parked, sessions, instances)
        yield old
        yield from (restarts, forwarded, timeouts, cpu, rss, uptime)

    def _sessions(self, sessions: Any) -> Iterator[Metric]:
        count = GaugeMetricFamily(
            f"{PREFIX}_sessions", "Client sessions open, by transport.", labels=["transport"]
        )
        by_transport: dict[str, int] = {}
        for s in sessions:
            by_transport[s.transport] = by_transport.get(s.transport, 0) + 1
        for transport, n in sorted(by_transport.items()):
            count.add_metric([transport], n)
        yield count
        labels = ["session", "client"]
        in_flight = GaugeMetricFamily(
            f"{PREFIX}_session_requests_in_flight",
            "Requests of the session not yet answered.",
            labels=labels,
        )
        outbox = GaugeMetricFamily(
            f"{PREFIX}_session_outbox_items",
            "Deliveries waiting in the session's outbound queue.",
            labels=labels,
        )
        queued = GaugeMetricFamily(
            f"{PREFIX}_session_outbox_bytes",
            "Bytes delivered to the session and not yet written to its client.",
            labels=labels,
        )
        for s in sessions:
            client = s.client if isinstance(s.client, dict) else {}
            names = [str(s.id), str(client.get("name", ""))]
            in_flight.add_metric(names, s.in_flight)
            outbox.add_metric(names, s.outbox)
            queued.add_metric(names, s.queued_bytes)
        yield from (in_flight, outbox, queued)

    def _requests(self) -> Iterator[Metric]:
        calls = self._calls
        requests = CounterMetricFamily(
            f"{PREFIX}_requests",
            "Client requests that ended, by server ('' for the broker's own answers), "
            "method and outcome (ok, error, cancelled).",
            labels=["server", "method", "outcome"],
        )
        for (server, method, outcome), n in sorted(calls.requests.items()):
            requests.add_metric([server, method, outcome], n)
        errors = CounterMetricFamily(
            f"{PREFIX}_request_errors",
            "Client requests answered with a JSON-RPC error, by code.",
            labels=["server", "method", "code"],
        )
        for (server, method, code), n in sorted(calls.errors.items()):
            errors.add_metric([server, method, str(code)], n)
        durations = HistogramMetricFamily(
            f"{PREFIX}_request_duration_seconds",
            "Time from reading a client's request to writing its answer, by server.",
            labels=["server"],
        )
        for server, histogram in sorted(calls.durations.items()):
            total = 0
            buckets: list[tuple[str, float]] = []
            for bound, n in zip(DURATION_BUCKETS, histogram.counts, strict=False):
                total += n
                buckets.append((_float(bound), total))
            buckets.append(("+Inf", total + histogram.counts[-1]))
            durations.add_metric([server], buckets, histogram.sum)
        yield from (requests, errors, durations)


@functools.cache
def _version() -> str:
    return version("mcpbroker")


def _float(value: float) -> str:
    return repr(float(value))


def open_registry(statistics: Callable[[], Any], calls: CallStats) -> CollectorRegistry:
    """A registry of the broker's metrics and the daemon process's own
    (``process_*``: its CPU, memory, open files)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(statistics, calls))
    ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """The scrape's body and content type, in the format ``accept`` asks for
    (the text format if ``accept`` cannot be read: a malformed ``version=``
    raised TypeError out of prometheus_client)."""
    try:
        encoder, content_type = choose_encoder(accept)
    except (TypeError, ValueError):
        encoder, content_type = choose_encoder("")
    return encoder(registry), content_type
