"""The audit log (``broker.auditLog``): one JSON line per tool call that ended.

Each line: ``time`` (UTC, when the call ended), ``session``, the client's
``client`` name and ``clientVersion`` (from its initialize), ``server``,
``tool`` (as that server calls it), ``duration`` (seconds), ``outcome``
(``ok``, ``error``, ``timeout`` or ``cancelled``), ``code`` for an error or
a timeout, and ``arguments`` only with ``broker.auditArguments``. The
records are made by broker/calls.py where a call's start and end meet (the
session); this module writes them, in a file that rotates like the daemon's
log (actors/logs.py ``RotatingLog``: 10 MiB, 3 older files kept, mode 0600).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import orjson

from actors.logs import RotatingLog, get_logger
from broker.calls import AuditRecord

FAILURE_REPORT_EVERY = 60.0  # seconds between two log lines of a failing audit log


class AuditLog:
    def __init__(self, path: str) -> None:
        """Opens ``path`` (raises UnsafePath or OSError if it cannot)."""
        self.path = path
        self._file = RotatingLog(path)
        self._lost = 0  # records not written since the last report
        self._reported = -FAILURE_REPORT_EVERY

    def write(self, records: Iterable[AuditRecord], session: int, client: Any) -> None:
        """Write the records of one session's calls (``client``: its clientInfo)."""
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        info = client if isinstance(client, dict) else {}
        lines = []
        for record in records:
            line: dict[str, Any] = {
                "time": now,
                "session": session,
                "client": info.get("name"),
                "clientVersion": info.get("version"),
                "server": record.server,
                "tool": record.tool,
                "duration": round(record.duration, 6),
                "outcome": record.outcome,
            }
            if record.code is not None:
                line["code"] = record.code
            if record.arguments is not None:  # (kept only with broker.auditArguments)
                line["arguments"] = record.arguments
            lines.append(orjson.dumps(line, default=repr).decode())
        # One write of the batch's lines (RotatingLog: one record each, so a
        # rotation never splits a line; a file may pass its size by a batch).
        # A file that cannot be written (a full disk) loses records, not the
        # calls: the OSError cut the session in the middle of its answers.
        try:
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
        except (OSError, ValueError) as exc:
            self._failed(len(lines), exc)

    def _failed(self, records: int, exc: Exception) -> None:
        self._lost += records
        now = time.monotonic()
        if now - self._reported >= FAILURE_REPORT_EVERY:
            get_logger().error(
                "audit.write_failed", path=self.path, error=str(exc), records_lost=self._lost
            )
            self._lost = 0
            self._reported = now
