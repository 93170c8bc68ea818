"""What clients' requests came to, counted and timed, sans-I/O.

A :class:`CallTracker` per session sees each request of its client start
(when the session reads it) and end (when the session writes its answer,
or the client cancels it, or leaves): the one place where both ends of a
request, its server, its method and the answer's outcome are all in view.
It adds each ending to the daemon-wide :class:`CallStats` (what
``/metrics`` shows: actors/metrics.py) and, for ``tools/call`` with the
audit log on, makes an :class:`AuditRecord` for the actor to write.

Times are handed in: the actor sets :attr:`CallTracker.now` once per read
and once per write (a request's duration runs from the read that brought
it to the write that answered it). The session protocol calls the tracker
only when there is one (``--metrics`` or ``broker.auditLog``): without
either, the hot path pays one ``is None`` test per message.

Labels stay bounded: a method the broker does not know is counted as
``other``; the server is a configured name, or ``""`` for requests the
broker answers itself (``initialize``, lists, ``ping``, refusals before
routing, such as an unknown tool).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

import attrs

from broker.jsonrpc import REQUEST_TIMEOUT, RequestId
from broker.wire.envelope import Answer

# Upper bounds (seconds) of the latency histogram's buckets, as Prometheus's
# ``le``; a last bucket (+Inf) takes the rest. From a cached answer in a few
# milliseconds to the default request timeout (300 s).
DURATION_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)

# Methods counted by name (what MCP clients send); anything else is "other".
METHODS = frozenset(
    {
        "initialize",
        "ping",
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "completion/complete",
        "logging/setLevel",
        "tasks/get",
        "tasks/result",
        "tasks/list",
        "tasks/cancel",
        "server/discover",
    }
)
OTHER = "other"

OK = "ok"
ERROR = "error"
CANCELLED = "cancelled"
TIMEOUT = "timeout"  # (an outcome of the audit log: the error REQUEST_TIMEOUT)


class Histogram:
    """Counts per bucket of :data:`DURATION_BUCKETS` (not cumulative; the last
    one is +Inf), and their sum."""

    def __init__(self) -> None:
        self.counts = [0] * (len(DURATION_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(DURATION_BUCKETS, value)] += 1
        self.sum += value


class CallStats:
    """The daemon's counts of answered requests, shared by every session's
    tracker (one thread: plain dicts, no locks), read at each scrape."""

    def __init__(self) -> None:
        # (server, method, outcome) -> requests that ended so (OK, ERROR, CANCELLED)
        self.requests: dict[tuple[str, str, str], int] = {}
        # (server, method, code) -> requests answered with that JSON-RPC error
        self.errors: dict[tuple[str, str, int], int] = {}
        # server -> the time its answered requests took
        self.durations: dict[str, Histogram] = {}

    def ended(self, server: str, method: str, outcome: str, duration: float) -> None:
        key = (server, method, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1
        if outcome != CANCELLED:
            histogram = self.durations.get(server)
            if histogram is None:
                histogram = self.durations[server] = Histogram()
            histogram.observe(duration)

    def failed(self, server: str, method: str, code: int) -> None:
        key = (server, method, code)
        self.errors[key] = self.errors.get(key, 0) + 1


@attrs.frozen
class AuditRecord:
    """One ``tools/call`` that ended: the audit log's line, less what the
    actor adds (the time, the session and its client)."""

    server: str
    tool: str
    duration: float  # seconds, from the read of the request to the write of its answer
    outcome: str  # OK, ERROR, TIMEOUT or CANCELLED
    code: int | None = None  # the JSON-RPC error's code (ERROR, TIMEOUT)
    arguments: Any = None  # only with broker.auditArguments


class Pending:
    """A request of the session not yet answered."""

    __slots__ = ("arguments", "method", "server", "started", "tool")

    def __init__(self, server: str, method: str, started: float) -> None:
        self.server = server
        self.method = method
        self.started = started
        self.tool: str | None = None  # tools/call, with the audit log on
        self.arguments: Any = None


class CallTracker:
    """One session's requests between their start and their end (above)."""

    def __init__(self, stats: CallStats, *, audit: bool = False, arguments: bool = False) -> None:
        self.stats = stats
        self.audit = audit  # make AuditRecords of tools/call
        self.arguments = arguments  # ... with their arguments
        self.now = 0.0  # set by the actor before each read and each write
        self.pending: dict[RequestId, Pending] = {}
        self.records: list[AuditRecord] = []  # for the actor to write, then clear

    def start(self, id: RequestId, request: Any) -> None:
        """A request was read (answered by the broker, unless :meth:`routed`).
        A second request with an id in flight is refused by the session and
        not counted: its answer carries no id."""
        if id in self.pending:
            return
        method = request["method"]
        pending = self.pending[id] = Pending("", method if method in METHODS else OTHER, self.now)
        if self.audit and method == "tools/call":
            self._note_tool(pending, request)  # (a call refused here is audited too)

    def routed(self, id: RequestId, server: str, request: Any) -> None:
        """A request goes to ``server`` (``request``: as that server gets it)."""
        pending = self.pending.get(id)
        if pending is None:
            method = request["method"]
            pending = self.pending[id] = Pending(
                server, method if method in METHODS else OTHER, self.now
            )
        else:
            pending.server = server
        if self.audit and pending.method == "tools/call":
            self._note_tool(pending, request)

    def _note_tool(self, pending: Pending, request: Any) -> None:
        """Keep what the audit log says of a call: its tool (and arguments)."""
        params = request.get("params")
        if type(params) is not dict:
            params = {}
        name = params.get("name")
        pending.tool = name if type(name) is str else ""
        if self.arguments:
            pending.arguments = params.get("arguments")

    def answered(self, id: Any, answer: Any) -> None:
        """The session writes an answer (a dict or an unparsed :class:`Answer`)."""
        if type(id) is not int and type(id) is not str:
            return
        pending = self.pending.pop(id, None)
        if pending is None:
            return
        code = error_code(answer)
        outcome = OK if code is None else ERROR
        duration = self.now - pending.started
        self.stats.ended(pending.server, pending.method, outcome, duration)
        if code is not None:
            self.stats.failed(pending.server, pending.method, code)
        if pending.tool is not None:
            audited = TIMEOUT if code == REQUEST_TIMEOUT else outcome
            self._record(pending, audited, duration, code)

    def cancelled(self, id: Any) -> None:
        """The client cancelled a request (or left with it in flight)."""
        if type(id) is not int and type(id) is not str:
            return
        pending = self.pending.pop(id, None)
        if pending is None:
            return
        self.stats.ended(pending.server, pending.method, CANCELLED, 0.0)
        if pending.tool is not None:
            self._record(pending, CANCELLED, self.now - pending.started, None)

    def closed(self) -> None:
        """The session ended: what it still had in flight is cancelled."""
        for id in list(self.pending):
            self.cancelled(id)

    def _record(self, pending: Pending, outcome: str, duration: float, code: int | None) -> None:
        assert pending.tool is not None
        self.records.append(
            AuditRecord(pending.server, pending.tool, duration, outcome, code, pending.arguments)
        )


def error_code(answer: Any) -> int | None:
    """The JSON-RPC error code of an answer (None: a result). An unparsed
    answer (broker/wire/envelope.py) is read only if it is an error."""
    if type(answer) is Answer:
        head, tail = answer.head, answer.tail
        if tail[1:9] != b'"error":' and head[:9] != b'{"error":':
            return None
        answer = answer.read()
    if type(answer) is not dict:
        return None
    error = answer.get("error")
    if type(error) is not dict:
        return None
    code = error.get("code")
    return code if type(code) is int else 0
