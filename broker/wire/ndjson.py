"""Newline-delimited JSON: MCP's stdio transport and the daemon's unix socket.

One JSON-RPC message per line. :class:`LineFramer` turns arbitrary chunks of
bytes into frames (each line, without its newline), however the chunks were
split, and enforces a size limit before anything is decoded: a line longer
than the limit is skipped up to its newline and reported once as
:class:`~broker.wire.frames.Oversize`, so a client that sends one huge
message gets an error and can carry on. :func:`encode` and
:func:`write_messages` go the other way.
"""

from __future__ import annotations

import io

import orjson

from broker import jsonrpc
from broker.related import Related
from broker.wire import frames
from broker.wire.envelope import Answer, Bytes
from broker.wire.frames import DEFAULT_MAX_MESSAGE_BYTES, KEPT_ENDS, Frame, Oversize

NEWLINE = b"\n"


def encode(message: object) -> bytes:
    """One message as one line, newline included."""
    return orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE)


def write_messages(
    messages: list[jsonrpc.Message | list[jsonrpc.Message] | Answer | Related],
    chunks: list[Bytes],
) -> int:
    """Add the lines for ``messages`` to ``chunks`` (to join and write in one
    go); returns the bytes added. An answer passed on unparsed goes in pieces,
    so that a large result's bytes are copied once, into the write."""
    size = 0
    for message in messages:
        if type(message) is Answer:
            head, id, tail = message.pieces()
            chunks += (head, id, tail, NEWLINE)
            size += len(head) + len(id) + len(tail) + 1
        else:
            data = frames.encode(message)
            chunks += (data, NEWLINE)
            size += len(data) + 1
    return size


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

    def feed(self, chunk: bytes | bytearray) -> list[Frame]:
        # BytesIO finds the newlines with memchr, where bytes.split(b"\n")
        # tests byte by byte: a 300-byte line framed in 1,400 instructions
        # less, a 1 MiB one in 5 million (benchmarks/README.md, 2026-11-26
        # (evening)). Each line keeps its newline but the last, unfinished one.
        lines = io.BytesIO(chunk).readlines()
        rest = lines.pop() if lines and lines[-1][-1] != 10 else b""  # (10: the newline)
        if (
            not self._held
            and self._skipped is None
            and len(chunk) <= self.max_bytes
            and chunk.find(b"\r") < 0  # (not `in`: see broker/jsonrpc.py LONG)
        ):
            # The usual chunk (under load, many lines): whole lines, none too
            # long, none to trim; just skip blank ones (what _emit would do,
            # without a call per line).
            if rest:
                self._hold(rest)
            return [line[:-1] for line in lines if line[0] not in _BLANK or line.strip()]
        out: list[Frame] = []
        for line in lines:
            line = line[:-1]
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

    def _emit(self, line: bytes, out: list[Frame]) -> None:
        size = len(line)
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > self.max_bytes:
            out.append(Oversize(size, line[:KEPT_ENDS], line[-KEPT_ENDS:]))
        elif line and (line[0] not in _BLANK or line.strip()):
            out.append(line)


_BLANK = b" \t\r\n\f\v"
