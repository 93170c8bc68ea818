"""Newline-delimited JSON framing, sans-I/O.

MCP's stdio transport (and the daemon's unix socket) carries one JSON-RPC
message per line. :class:`LineFramer` turns arbitrary chunks of bytes into
whole lines, however the chunks were split, and enforces a size limit before
anything is decoded: a line longer than the limit is skipped up to its
newline and reported once as :class:`Oversize`, so a client that sends one
huge message gets an error and can carry on.
"""

from __future__ import annotations

import attrs

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@attrs.frozen
class Oversize:
    """A line that exceeded the limit; ``size`` is how many bytes it had.

    ``size`` counts every byte before the ``\\n`` (a ``\\r`` included), so it
    does not depend on how the line was chunked.
    """

    size: int


class LineFramer:
    """Split a byte stream into lines of at most ``max_bytes`` each.

    ``feed(chunk)`` returns the complete lines the chunk finished, without
    their newline (a trailing ``\\r`` is removed too, blank lines are skipped),
    in order, with an :class:`Oversize` in place of each line that was too long.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buffer = bytearray()
        # While skipping an oversize line: how many bytes it has had so far.
        self._skipped: int | None = None

    def feed(self, chunk: bytes | bytearray) -> list[bytes | Oversize]:
        out: list[bytes | Oversize] = []
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            if newline < 0:
                self._keep(chunk, start)
                return out
            self._finish(chunk, start, newline, out)
            start = newline + 1

    @property
    def pending(self) -> int:
        """Bytes held of a line not yet finished (0 between lines)."""
        return len(self._buffer) if self._skipped is None else self._skipped

    def _keep(self, chunk: bytes | bytearray, start: int) -> None:
        if self._skipped is not None:
            self._skipped += len(chunk) - start
            return
        self._buffer += chunk[start:] if start else chunk
        # One byte over the limit may still be the "\r" of a "\r\n".
        if len(self._buffer) > self.max_bytes + 1:
            self._skipped = len(self._buffer)
            self._buffer.clear()

    def _finish(
        self, chunk: bytes | bytearray, start: int, end: int, out: list[bytes | Oversize]
    ) -> None:
        if self._skipped is not None:
            out.append(Oversize(self._skipped + end - start))
            self._skipped = None
            return
        if self._buffer:
            self._buffer += chunk[start:end]
            line = bytes(self._buffer)
            self._buffer.clear()
        else:
            line = bytes(chunk[start:end])
        size = len(line)
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > self.max_bytes:
            out.append(Oversize(size))
        elif line.strip():
            out.append(line)
