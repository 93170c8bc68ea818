"""A server's stderr in the daemon's log: all of it read, a bounded part logged.

A server must never block on a full stderr pipe, so the pump reads
everything; but a server that writes megabytes a second must not fill the
disk or slow the daemon for everyone. Lines are logged (as ``server.stderr``)
while a token bucket allows: :data:`BURST` lines at once, :data:`RATE` a
second after that, each shown up to :data:`LINE_SHOWN` bytes. What is over
the budget is counted, not decoded, and reported as ``server.stderr_dropped``
(lines and bytes) at most every :data:`REPORT_EVERY` seconds and when the
stream ends. At the defaults a flooding server costs the log ~20 KiB/s.
"""

from __future__ import annotations

import collections
from typing import Any

import trio

from actors.errors import TransportClosed, map_transport_errors
from broker.wire.frames import Oversize
from broker.wire.ndjson import LineFramer

READ_CHUNK = 256 * 1024
LINE_SHOWN = 2048  # bytes of one line that reach the log
BURST = 200  # lines logged at once after a quiet spell (a start-up banner, a traceback)
RATE = 10.0  # lines a second after that
TAIL_SHOWN = 200  # bytes of a line kept in the tail (status shows it)
REPORT_EVERY = 5.0  # seconds between two reports of dropped lines


class LineBudget:
    """A token bucket of log lines (sans-I/O: the caller says what time it is)."""

    def __init__(self, burst: int = BURST, rate: float = RATE, now: float = 0.0) -> None:
        self.burst = burst
        self.rate = rate
        self._tokens = float(burst)
        self._when = now

    def take(self, wanted: int, now: float) -> int:
        """How many of ``wanted`` lines may be logged now (they are spent)."""
        self._tokens = min(self.burst, self._tokens + (now - self._when) * self.rate)
        self._when = now
        granted = min(wanted, int(self._tokens))
        self._tokens -= granted
        return granted


async def pump_stderr(
    stream: trio.abc.ReceiveStream, log: Any, tail: collections.deque[str] | None = None
) -> None:
    """Read ``stream`` to its end, logging what the budget allows; the last
    lines logged are also kept in ``tail`` (for the report of a crash loop)."""
    framer = LineFramer(LINE_SHOWN)
    budget = LineBudget(now=trio.current_time())
    dropped_lines = dropped_bytes = 0
    reported = trio.current_time()
    while True:
        try:
            with map_transport_errors():
                data = await stream.receive_some(READ_CHUNK)
        except TransportClosed:
            data = b""
        now = trio.current_time()
        lines = framer.feed(data) if data else []
        shown = budget.take(len(lines), now)
        for line in lines[:shown]:
            text = _text(line)
            log.info("server.stderr", line=text)
            if tail is not None:
                tail.append(text[:TAIL_SHOWN])
        for line in lines[shown:]:
            dropped_lines += 1
            dropped_bytes += line.size if isinstance(line, Oversize) else len(line) + 1
        if dropped_lines and (not data or now - reported >= REPORT_EVERY):
            log.warning("server.stderr_dropped", lines=dropped_lines, bytes=dropped_bytes)
            dropped_lines = dropped_bytes = 0
            reported = now
        if not data:
            return


def _text(line: bytes | Oversize) -> str:
    if isinstance(line, Oversize):
        return f"{line.head.decode(errors='replace')}... ({line.size} bytes)"
    return line.decode(errors="replace")
