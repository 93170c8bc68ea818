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
from typing import Any, Final

import attrs

from broker.jsonrpc import REQUEST_TIMEOUT, RequestId
from broker.wire.envelope import Answer

# Upper bounds (seconds) of the latency histogram's buckets, as Prometheus's
# ``le``; a last bucket (+Inf) takes the rest. From a cached answer in a few
# milliseconds to the default request timeout (300 s).
DURATION_BUCKETS: Final[tuple[float, ...]] = (
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
METHODS: Final = frozenset(
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

# Error codes counted apart per server and method, at most; the others (and a
# code that is not an integer) are counted as OTHER_CODE.
MAX_ERROR_CODES: Final = 32
OTHER_CODE: Final = 0

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


class Counts:
    """What the requests of one method to one server came to."""

    __slots__ = ("cancelled", "durations", "errors", "failed", "method", "ok", "server")

    def __init__(self, server: str, method: str, durations: Histogram) -> None:
        self.server = server
        self.method = method
        self.ok = 0  # answered with a result
        self.failed = 0  # answered with a JSON-RPC error
        self.cancelled = 0  # cancelled by the client, or its session ended first
        self.errors: dict[int, int] = {}  # error code -> answers with it
        self.durations = durations  # the server's (shared by its methods)


class CallStats:
    """The daemon's counts of ended requests, shared by every session's
    tracker (one thread: plain counters, no locks), read at each scrape."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], Counts] = {}  # (server, method) ->
        self.durations: dict[str, Histogram] = {}  # server -> its answered requests' times

    def of(self, server: str, method: str) -> Counts:
        """The counts of ``method`` (a label: METHODS or OTHER) to ``server``."""
        counts = self.counts.get((server, method))
        if counts is None:
            durations = self.durations.get(server)
            if durations is None:
                durations = self.durations[server] = Histogram()
            counts = self.counts[(server, method)] = Counts(server, method, durations)
        return counts

    @property
    def requests(self) -> dict[tuple[str, str, str], int]:
        """(server, method, outcome) -> requests that ended so (OK, ERROR, CANCELLED)."""
        out = {}
        for (server, method), c in self.counts.items():
            for outcome, n in ((OK, c.ok), (ERROR, c.failed), (CANCELLED, c.cancelled)):
                if n:
                    out[(server, method, outcome)] = n
        return out

    @property
    def errors(self) -> dict[tuple[str, str, int], int]:
        """(server, method, code) -> requests answered with that JSON-RPC error."""
        return {
            (server, method, code): n
            for (server, method), c in self.counts.items()
            for code, n in c.errors.items()
        }


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


# A request of the session not yet answered: its counts, when it was read,
# and (tools/call, with the audit log on) its tool and arguments. A tuple:
# one is made per request.
Pending = tuple[Counts, float, str | None, Any]


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
        counts = self.stats.of("", method if method in METHODS else OTHER)
        audited = self.audit and method == "tools/call"
        tool, arguments = self._tool(request) if audited else (None, None)
        self.pending[id] = (counts, self.now, tool, arguments)  # (a refused call is audited)

    def routed(self, id: RequestId, server: str, request: Any) -> None:
        """A request goes to ``server`` (``request``: as that server gets it)."""
        method = request["method"]
        label = method if method in METHODS else OTHER
        counts = self.stats.counts.get((server, label)) or self.stats.of(server, label)
        audited = self.audit and method == "tools/call"
        tool, arguments = self._tool(request) if audited else (None, None)
        pending = self.pending.get(id)
        self.pending[id] = (counts, self.now if pending is None else pending[1], tool, arguments)

    def _tool(self, request: Any) -> tuple[str | None, Any]:
        """What the audit log says of a call: its tool (and arguments)."""
        params = request.get("params")
        if type(params) is not dict:
            params = {}
        name = params.get("name")
        return (name if type(name) is str else ""), (
            params.get("arguments") if self.arguments else None
        )

    def answered(self, id: Any, answer: Any) -> None:
        """The session writes an answer (a dict or an unparsed :class:`Answer`)."""
        if type(id) is not int and type(id) is not str:
            return
        pending = self.pending.pop(id, None)
        if pending is None:
            return
        counts, started, tool, arguments = pending
        duration = self.now - started
        durations = counts.durations  # (Histogram.observe, inlined: once per request)
        durations.counts[bisect_left(DURATION_BUCKETS, duration)] += 1
        durations.sum += duration
        if type(answer) is Answer:
            code = error_code(answer) if answer.is_error() else None
        else:
            code = error_code(answer)
        if code is None:
            counts.ok += 1
        else:
            counts.failed += 1
            errors = counts.errors
            if code not in errors and len(errors) >= MAX_ERROR_CODES:
                code = OTHER_CODE  # (a server that makes codes up cannot grow the labels)
            errors[code] = errors.get(code, 0) + 1
        if tool is not None:
            outcome = OK if code is None else TIMEOUT if code == REQUEST_TIMEOUT else ERROR
            self.records.append(
                AuditRecord(counts.server, tool, duration, outcome, code, arguments)
            )

    def cancelled(self, id: Any) -> None:
        """The client cancelled a request (or left with it in flight)."""
        if type(id) is not int and type(id) is not str:
            return
        pending = self.pending.pop(id, None)
        if pending is None:
            return
        counts, started, tool, arguments = pending
        counts.cancelled += 1
        if tool is not None:
            duration = self.now - started
            self.records.append(
                AuditRecord(counts.server, tool, duration, CANCELLED, None, arguments)
            )

    def closed(self) -> None:
        """The session ended: what it still had in flight is cancelled."""
        for id in list(self.pending):
            self.cancelled(id)


def error_code(answer: Any) -> int | None:
    """The JSON-RPC error code of an answer (None: a result). An unparsed
    answer (broker/wire/envelope.py) is read only if it is an error."""
    if type(answer) is Answer:
        if not answer.is_error():
            return None
        answer = answer.read()
    if type(answer) is not dict:
        return None
    error = answer.get("error")
    if type(error) is not dict:
        return None
    code = error.get("code")
    return code if type(code) is int else OTHER_CODE
