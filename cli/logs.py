"""``mcpbroker logs``: the daemon's log, human-readable and filtered.

A daemon started by the shim (or with ``--log-file``) writes JSON lines to a
file that rotates (actors/logs.py: ``SOCKET.log``, then ``SOCKET.log.1`` ...
``.3``). This prints the last ``-n`` lines of it that match (``--server``,
``--session``, ``--level``), reading older files when the newest holds too
few, and with ``--follow`` goes on printing what is added, across rotations,
until interrupted. Lines that are not JSON (what a daemon printed before its
log was set up, such as a traceback) are printed as they are, unless a
filter is given.

Standard library only: it is a small reader, started often.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, BinaryIO

LEVELS = ("debug", "info", "warning", "error", "critical")
BACKUPS = 3  # actors/logs.py LOG_FILE_BACKUPS (not imported: that module needs structlog)
POLL_SECONDS = 0.25
# Fields shown first, in this order, as "server=files session=3 request=7".
CONTEXT = ("server", "session", "request", "client")
_SKIPPED = frozenset({"timestamp", "level", "event", "exception", *CONTEXT})


def main(argv: list[str]) -> int:
    from actors.paths import default_socket_path, log_path_for

    parser = argparse.ArgumentParser(
        prog="mcpbroker logs",
        description="Print the daemon's log (the JSON-lines file a daemon started by "
        "`mcpbroker connect`, or with --log-file, writes), human-readable.",
    )
    parser.add_argument(
        "--socket", metavar="PATH", help="the daemon's socket (its log is PATH.log)"
    )
    parser.add_argument("--file", metavar="PATH", help="read this log file instead")
    parser.add_argument("--server", metavar="NAME", help="only lines about this server")
    parser.add_argument("--session", metavar="ID", help="only lines about this session")
    parser.add_argument("--level", choices=LEVELS, help="only lines at this level or above")
    parser.add_argument(
        "-n", "--lines", type=int, default=50, metavar="N", help="the last N lines (default 50)"
    )
    parser.add_argument(
        "-f", "--follow", action="store_true", help="then print lines as they are added"
    )
    parser.add_argument("--json", action="store_true", help="print the JSON lines as they are")
    args = parser.parse_args(argv)
    if args.lines < 0:
        parser.error("-n/--lines must be 0 or more")
    path = args.file or log_path_for(args.socket or default_socket_path())
    wanted = Filter(args.server, args.session, args.level)
    show = _raw if args.json else render
    if not os.path.exists(path) and not args.follow:
        print(f"mcpbroker logs: no log at {path}", file=sys.stderr)
        return 1
    if os.path.isdir(path):  # (read as empty: nothing said, exit 0)
        print(f"mcpbroker logs: {path} is a directory, not a log file", file=sys.stderr)
        return 1
    try:
        lines, position = last_lines(path, wanted, args.lines)
        for line in lines:
            print(show(line), flush=False)
        sys.stdout.flush()
        if args.follow:
            for line in follow(path, position):
                if wanted(line):
                    print(show(line), flush=True)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # (| head)
        sys.stderr.close()
        return 0
    return 0


class Filter:
    """Which lines to print: those about a server, a session, from a level on."""

    def __init__(
        self, server: str | None = None, session: str | None = None, level: str | None = None
    ) -> None:
        self.server = server
        self.session = session
        self.level = LEVELS.index(level) if level else 0

    def __call__(self, line: str) -> bool:
        if self.server is None and self.session is None and not self.level:
            return True
        record = parse(line)
        if record is None:
            return False
        if self.server is not None and str(record.get("server")) != self.server:
            return False
        if self.session is not None and str(record.get("session")) != self.session:
            return False
        level = record.get("level")
        return level not in LEVELS or LEVELS.index(level) >= self.level


def parse(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


# Control characters other than tab and newline, as \u00XX (valid in a JSON
# string too): a server's stderr line with ESC ]0; or ESC [2J retitled, cleared
# or hid the reader's terminal (OSC 52 writes its clipboard).
CONTROLS = {c: f"\\u{c:04x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c not in (9, 10)}


def render(line: str) -> str:
    """A JSON line as ``TIME LEVEL EVENT context... key=value...`` (the traceback
    of an exception after it); any other line as it is. Control characters are
    escaped either way."""
    return _render(line).translate(CONTROLS)


def _render(line: str) -> str:
    record = parse(line)
    if record is None or "event" not in record:
        return line
    when = str(record.get("timestamp", "")).replace("T", " ").removesuffix("Z")[:23]
    fields = [f"{key}={_value(record[key])}" for key in CONTEXT if key in record]
    fields += [f"{key}={_value(v)}" for key, v in record.items() if key not in _SKIPPED]
    text = f"{when} {record.get('level', '-'):<8} {record['event']:<28} {' '.join(fields)}"
    exception = record.get("exception")
    if exception:
        text += "\n" + "\n".join("    " + row for row in str(exception).rstrip().splitlines())
    return text.rstrip()


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value if value and not any(c.isspace() for c in value) else json.dumps(value)
    return json.dumps(value, separators=(",", ":"))


def _raw(line: str) -> str:
    return line.translate(CONTROLS)


def files_of(path: str) -> list[str]:
    """The log and its rotated files that exist, newest first."""
    candidates = [path] + [f"{path}.{n}" for n in range(1, BACKUPS + 1)]
    return [each for each in candidates if os.path.exists(each)]


Position = tuple[tuple[int, int], int]  # a file's (device, inode), and an offset in it


def last_lines(path: str, wanted: Filter, count: int) -> tuple[list[str], Position | None]:
    """The last ``count`` lines that match, oldest first, from the log and as
    many of its rotated files as it takes; and where the log was read up to
    (for :func:`follow`, so that no line is missed or printed twice)."""
    found: deque[str] = deque()
    position = None
    for each in files_of(path):
        lines, end = _read_lines(each)
        if each == path:
            position = end
        if len(found) >= count:
            break
        matching = [line for line in lines if wanted(line)]
        found.extendleft(reversed(matching[max(0, len(matching) - (count - len(found))) :]))
    return (list(found)[-count:] if count else []), position


def _read_lines(path: str) -> tuple[list[str], Position | None]:
    try:
        with open(path, "rb") as file:
            stat = os.fstat(file.fileno())
            data = file.read()
    except OSError:
        return [], None
    end = data.rfind(b"\n") + 1  # (a half-written last line is left for follow)
    text = data[:end].decode("utf-8", "replace")
    return [line for line in text.split("\n") if line.strip()], ((stat.st_dev, stat.st_ino), end)


def follow(path: str, start: Position | None = None, poll: float = POLL_SECONDS) -> Iterator[str]:
    """The lines added to ``path`` after ``start`` (None: from its start),
    forever. When the file rotates (another file at the path, or a shorter
    one), what the old one still had is read, then the new one from its
    start; a half-written last line waits for its end."""
    file: BinaryIO | None = None
    identity: tuple[int, int] | None = None
    pending = b""
    try:
        while True:
            if file is None:
                file, identity = _open(path)
                if file is not None and start is not None and start[0] == identity:
                    file.seek(start[1])
                start = None
            elif _rotated(path, identity, file):
                yield from _complete(pending + file.read())
                pending = b""
                file.close()
                file = None
                continue
            chunk = file.read() if file is not None else b""
            if not chunk:
                time.sleep(poll)
                continue
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            yield from _complete(b"\n".join(lines))
    finally:
        if file is not None:
            file.close()


def _complete(data: bytes) -> list[str]:
    text = data.decode("utf-8", "replace")
    return [line for line in text.split("\n") if line.strip()]


def _open(path: str) -> tuple[BinaryIO | None, tuple[int, int] | None]:
    try:
        file = open(path, "rb")  # noqa: SIM115 (kept open while followed)
    except OSError:
        return None, None
    stat = os.fstat(file.fileno())
    return file, (stat.st_dev, stat.st_ino)


def _rotated(path: str, identity: tuple[int, int] | None, file: BinaryIO) -> bool:
    try:
        stat = os.stat(path)
    except OSError:
        return False  # (between the rename and the new file: wait)
    return (stat.st_dev, stat.st_ino) != identity or stat.st_size < file.tell()
