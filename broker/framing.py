"""Newline-delimited JSON framing, sans-I/O.

MCP's stdio transport (and the daemon's unix socket) carries one JSON-RPC
message per line. :class:`LineFramer` turns arbitrary chunks of bytes into
whole lines, however the chunks were split, and enforces a size limit before
anything is decoded: a line longer than the limit is skipped up to its
newline and reported once as :class:`Oversize`, so a client that sends one
huge message gets an error and can carry on.
"""

from __future__ import annotations

from typing import Any

import attrs

from broker.jsonrpc import INVALID_REQUEST, JsonRpcError

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


# How much of each end of an oversize line is kept: enough for the id of an
# answer in either compact shape (broker/envelope.py), which sits near one end.
KEPT_ENDS = 64


@attrs.frozen(eq=False)
class Oversize:
    """A line that exceeded the limit; ``size`` is how many bytes it had.

    ``size`` counts every byte before the ``\\n`` (a ``\\r`` included), so it
    does not depend on how the line was chunked. ``head`` and ``tail`` are its
    first and last :data:`KEPT_ENDS` bytes (or fewer), so that an oversize
    answer's id can still be read and its caller told at once.
    """

    size: int
    head: bytes = b""
    tail: bytes = b""

    # Equal by size: the ends are kept to read an id from, not to tell lines apart.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Oversize) and other.size == self.size

    def __hash__(self) -> int:
        return hash(self.size)

    def error_response(self, limit: int) -> dict[str, Any]:
        """The JSON-RPC error a client gets for it (no id: the line was never parsed)."""
        return JsonRpcError(
            INVALID_REQUEST, f"Message too large: {self.size} bytes (the limit is {limit})"
        ).to_response()


class LineFramer:
    """Split a byte stream into lines of at most ``max_bytes`` each.

    ``feed(chunk)`` returns the complete lines the chunk finished, without
    their newline (a trailing ``\\r`` is removed too, blank lines are skipped),
    in order, with an :class:`Oversize` in place of each line that was too long.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.max_bytes = max_bytes
        # The start of a line not finished yet, in pieces (joined once, at its end).
        self._held: list[bytes] = []
        self._held_size = 0
        # While skipping an oversize line: how many bytes it has had so far,
        # and its first and (so far) last bytes.
        self._skipped: int | None = None
        self._skipped_head = b""
        self._skipped_tail = b""

    def feed(self, chunk: bytes | bytearray) -> list[bytes | Oversize]:
        # bytes.split does the scanning in C; under load a chunk holds many lines.
        chunk = bytes(chunk)
        *lines, rest = chunk.split(b"\n")
        if (
            not self._held
            and self._skipped is None
            and len(chunk) <= self.max_bytes
            and b"\r" not in chunk
        ):
            # The usual chunk: whole lines, none too long, none to trim; just
            # skip blank ones (what _emit would do, without a call per line).
            self._hold(rest)
            return [line for line in lines if line and (line[0] not in _BLANK or line.strip())]
        out: list[bytes | Oversize] = []
        for line in lines:
            if self._skipped is not None:
                tail = (self._skipped_tail + line[-KEPT_ENDS:])[-KEPT_ENDS:]
                out.append(Oversize(self._skipped + len(line), self._skipped_head, tail))
                self._skipped = None
                continue
            if self._held:
                line = b"".join([*self._held, line])
                self._held.clear()
                self._held_size = 0
            self._emit(line, out)
        self._hold(rest)
        return out

    @property
    def pending(self) -> int:
        """Bytes held of a line not yet finished (0 between lines)."""
        return self._held_size if self._skipped is None else self._skipped

    def _hold(self, piece: bytes) -> None:
        if not piece:
            return
        if self._skipped is not None:
            self._skipped += len(piece)
            self._skipped_tail = (self._skipped_tail + piece[-KEPT_ENDS:])[-KEPT_ENDS:]
            return
        self._held.append(piece)
        self._held_size += len(piece)
        # One byte over the limit may still be the "\r" of a "\r\n".
        if self._held_size > self.max_bytes + 1:
            self._skipped = self._held_size
            self._skipped_head = b"".join(self._held[:KEPT_ENDS])[:KEPT_ENDS]
            self._skipped_tail = piece[-KEPT_ENDS:]
            self._held.clear()
            self._held_size = 0

    def _emit(self, line: bytes, out: list[bytes | Oversize]) -> None:
        size = len(line)
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > self.max_bytes:
            out.append(Oversize(size, line[:KEPT_ENDS], line[-KEPT_ENDS:]))
        elif line and (line[0] not in _BLANK or line.strip()):
            out.append(line)


_BLANK = b" \t\r\n\f\v"
