"""structlog set-up for the daemon: human-readable on a terminal, JSON otherwise,
or JSON lines into a file that rotates (``--log-file``: what a daemon started
by the shim writes)."""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import sys
from typing import Any, TextIO

import structlog

from actors.paths import open_private

LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FILE_BYTES = 10 * 1024 * 1024  # a log file rotates past this size...
LOG_FILE_BACKUPS = 3  # ...keeping this many older ones: at most 40 MiB in all


class RotatingLog:
    """A file for structlog's ``WriteLogger``: each line one record of the standard
    library's ``RotatingFileHandler``, whose files are opened without following a
    symlink and readable by the user alone."""

    def __init__(
        self, path: str, max_bytes: int = LOG_FILE_BYTES, backups: int = LOG_FILE_BACKUPS
    ) -> None:
        self._handler = _PrivateRotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
        )

    def write(self, text: str) -> None:
        self._handler.emit(logging.makeLogRecord({"msg": text.rstrip("\n")}))

    def flush(self) -> None:
        self._handler.flush()

    def isatty(self) -> bool:
        return False


class _PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    def _open(self) -> Any:  # (a TextIOWrapper, as the base class opens)
        fd = open_private(self.baseFilename, os.O_WRONLY | os.O_APPEND)
        return os.fdopen(fd, "a", encoding="utf-8")


class _Forgiving:
    """The log's stream, whose failures cost log lines, not the daemon: a
    stderr whose reader went away (``serve | tee`` after tee ended, a closed
    terminal) raised BrokenPipeError or EIO out of every ``log.*()`` call,
    and the first one after killed the daemon. The stdlib handler behind
    ``--log-file`` already goes on the same way (it prints "Logging error")."""

    def __init__(self, stream: TextIO | RotatingLog) -> None:
        self._stream = stream
        self.lost = 0  # lines that could not be written

    def write(self, text: str) -> None:
        try:
            self._stream.write(text)
        except (OSError, ValueError):  # (ValueError: the stream was closed)
            self.lost += 1

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()


def configure_logging(
    level: str = "info",
    *,
    stream: TextIO | RotatingLog | None = None,
    json: bool | None = None,
) -> None:
    """Send every log line to ``stream`` (stderr), filtered at ``level``."""
    stream = stream or sys.stderr
    if json is None:
        json = not stream.isatty()
    # (JSON escapes control characters itself; the console format wrote a
    # server's ESC sequences to the terminal or journal as they came)
    renderers: list[Any] = (
        [structlog.processors.JSONRenderer()]
        if json
        else [_escape_controls, structlog.dev.ConsoleRenderer(colors=stream.isatty())]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            *renderers,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(file=_Forgiving(stream)),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


# Control characters but tab and newline, as \u00XX (cli/logs.py the same).
CONTROLS = {c: f"\\u{c:04x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c not in (9, 10)}


def _escape_controls(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    """The console format's values with their control characters escaped."""
    return {
        key: value.translate(CONTROLS) if isinstance(value, str) else value
        for key, value in event.items()
    }


def get_logger(**context: Any) -> Any:
    return structlog.get_logger("mcpbroker").bind(**context)
