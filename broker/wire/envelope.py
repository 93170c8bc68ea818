"""Answers passed on as the server wrote them, without parsing.

Of a server's answer to a request the broker reads nothing but the id: it
puts the client's id in its place and passes the rest on. Servers write
answers in one of two compact shapes, one line each:

- ``{"jsonrpc":"2.0","id":N,"result":...}`` (or ``"error"``): the Python SDK,
  orjson and most hand-written servers;
- ``{"result":...,"jsonrpc":"2.0","id":N}`` (or ``"error"``): the TypeScript
  SDK.

:func:`split_answer` cuts such a line around its id without parsing it
(N is one of the broker's own upstream ids, a positive integer), and an
:class:`Answer` is what crosses to the session: the bytes before the id, the
id (the client's, once the upstream has matched it), and the bytes after it.
The session writes ``head + id + tail``.

Why: the client gets the server's bytes, numbers and escapes as written
(parsed with orjson, an integer past 64 bits became a float and ``1e400``
was refused), and a large result (a file, a screenshot) is not parsed at
all, which was nearly all of the broker's work for it (~1 ms per MiB here).
For small answers it costs about what parsing and encoding did.

What the broker gives up: it no longer checks that such an answer is valid
JSON. A server that writes a broken one hands its client a line that does
not parse, as it would if the host had launched it directly (parsed, the line
would have been logged and dropped, and the request left to time out).
Answers the broker must read (tasks, subscriptions, its own requests),
every other shape, and anything that is not an answer are parsed in full
as before.
"""

from __future__ import annotations

import re
from types import FunctionType
from typing import Any, Final

import orjson

from broker import jsonrpc
from broker.jsonrpc import RequestId

# A large answer's line is not copied: head and tail are views of it (a 1 MiB
# result copied three times cost a millisecond of page faults); a small one's
# rest is (split_answer: a view costs more than copying a few hundred bytes).
Bytes = bytes | memoryview

PREFIX: Final = b'{"jsonrpc":"2.0","id":'
SUFFIX: Final = b',"jsonrpc":"2.0","id":'
_FIRST_KEYS: Final = (b'{"result":', b'{"error":')  # an answer in the TypeScript SDK's shape
_MAX_ID_DIGITS: Final = 19  # the broker's own upstream ids are positive and never this long
# The other shape: the prefix, then the id, followed by "result" or "error".
_USUAL: Final = re.compile(
    re.escape(PREFIX) + rb"(?:0|[1-9][0-9]{0,%d})(?=,\"(?:result|error)\":)" % (_MAX_ID_DIGITS - 1)
)
_usual: Final = _USUAL.match
_RESULT_KEY: Final = b',"result":'
_ERROR_KEY: Final = b',"error":'
# (a static in a compiled build: orjson.dumps is looked up by name on each call)
_dumps: Final = orjson.dumps
_CLOSE: Final = ord("}")
_J: Final = ord("j")
_E: Final = ord("e")
# Answers up to this long have their rest copied (a view costs more than
# copying so little); longer ones are viewed: a 1 MiB result copied three
# times cost a millisecond of page faults.
COPIED: Final = 4096
# What an Answer holds beyond its line's bytes, about, for a queue's byte
# count (actors/mailbox.py): the object, its id, the copied rest or the
# views of the line (tracemalloc: 115 to 380 bytes for a small one).
HELD: Final = 256


class Answer:
    """A server's answer on its way to a client, its bytes untouched but the id."""

    __slots__ = ("head", "id", "method", "modern", "tail")

    def __init__(self, head: Bytes, id: RequestId, tail: Bytes) -> None:
        self.head = head  # the line up to the id's value
        self.id = id  # the upstream id, then (matched) the client's
        self.tail = tail  # the line after the id's value
        # Written by a 2026-07-28 server (the Upstream says so): a modern
        # client gets it as it is when it carries that era's keys
        # (broker/eras/modern.py, complete_modern_answer).
        self.modern = False
        # The method of the request it answers, once the Upstream matched it.
        self.method: str | None = None

    def pieces(self) -> tuple[Bytes, bytes, Bytes]:
        """The answer's bytes in pieces to join (a large result is then copied
        once, into what the session writes)."""
        return self.head, _dumps(self.id), self.tail

    def is_error(self) -> bool:
        """Whether it is an error response, by one byte: :func:`split_answer`
        takes only two shapes, ``{"jsonrpc":"2.0","id":N`` then ``,"result":``
        or ``,"error":`` (the tail), or ``{"result":`` or ``{"error":`` first
        (the head); the third byte of the key's side tells (a stamped result,
        broker/eras/modern.py, keeps its key where it was)."""
        # (read as bytes where they are: a compiled build then indexes
        # them directly, where a memoryview costs a generic lookup)
        head, tail = self.head, self.tail
        first = head[2] if isinstance(head, bytes) else int(head[2])
        if first == _J:  # {"jsonrpc":...: the key follows the id
            return (tail[2] if isinstance(tail, bytes) else int(tail[2])) == _E
        return first == _E

    def encode(self) -> bytes:
        """The answer's bytes (no framing: that is the wire format's)."""
        return b"".join(self.pieces())

    def written(self) -> bytes:
        """The server's bytes, to search for a key or a string without copying
        them: every byte of the answer but (perhaps) its prefix and id, which
        hold neither. The line it came in, which head or tail views, as
        :func:`split_answer` made them; a small answer's rest after its id, in
        the usual shape (split_answer copies so little rather than view it);
        an answer whose head was replaced, its bytes now."""
        # (bytes tested first: a compiled build looks memoryview up by name)
        part: Any = self.tail if self.head is PREFIX else self.head
        if type(part) is bytes:
            if self.head is PREFIX:
                return part
        else:
            line = part.obj  # (a view of the line)
            if type(line) is bytes:
                return line
        return self.encode()

    def read(self, max_depth: int = jsonrpc.MAX_DEPTH) -> Any:
        """The answer parsed, for the rare reader that must look inside (a
        batch, the broker's own requests); an error response for its id if the
        server's line is not JSON (or nests deeper than ``max_depth``)."""
        try:
            return jsonrpc.decode(self.encode(), max_depth)
        except jsonrpc.JsonRpcError as exc:
            return jsonrpc.error_response(
                self.id, jsonrpc.INTERNAL_ERROR, f"The server's answer is not JSON ({exc.message})"
            )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Answer)
            and (self.head, self.id, self.tail) == (other.head, other.id, other.tail)
            and type(self.id) is type(other.id)
        )

    def __repr__(self) -> str:
        return f"Answer({self.head!r}, {self.id!r}, {self.tail!r})"


def usual_id_read(line: bytes) -> tuple[int, int]:
    """Where the id of an answer in the usual shape ends, and the id ((-1, 0):
    not that shape), byte by byte: what the compiled rules take (a few
    instructions a byte, and the pair a C struct, where the regular
    expression's method calls cost 3,000 a call). Interpreted, a dozen
    bytecodes a byte cost more than the match :func:`split_answer` takes
    there instead (one call: four bytes methods cost CPython 3.11 a
    format-string parse of their arguments each; benchmarks/README.md,
    2026-11-26 (evening))."""
    if not line.startswith(PREFIX):
        return -1, 0
    start = end = len(PREFIX)
    limit = min(len(line), start + _MAX_ID_DIGITS + 1)
    id = 0
    while end < limit:
        digit = line[end] - 48  # (48: "0")
        if digit < 0 or digit > 9:
            break
        id = id * 10 + digit
        end += 1
    if end == start or end > start + _MAX_ID_DIGITS or (line[start] == 48 and end > start + 1):
        return -1, 0
    key = line[end : end + len(_RESULT_KEY)]
    return (end, id) if key == _RESULT_KEY or key.startswith(_ERROR_KEY) else (-1, 0)


def _compiled() -> bool:
    """Whether this module runs compiled (mypyc makes its functions builtins)."""
    return not isinstance(_compiled, FunctionType)


_COMPILED: Final = _compiled()


def split_answer(line: bytes) -> Answer | None:
    """The answer in ``line`` cut around its upstream id, or None (parse the line)."""
    head: Bytes
    tail: Bytes
    # The usual shape: the prefix, then the id (digits, no leading zero, at
    # most 19) if the key follows it.
    # (each build the cheaper way for it: usual_id_read; tests/test_envelope.py
    # holds the two to the same answers, in both builds)
    if _COMPILED:
        end, id = usual_id_read(line)
    else:
        match = _usual(line)
        end = -1 if match is None else match.end()
    if end >= 0:
        if line[-1] != _CLOSE:
            return None
        # (a small answer's rest copied, cheaper than a view; a large one's viewed)
        tail = line[end:] if len(line) <= COPIED else memoryview(line)[end:]
        return Answer(PREFIX, id if _COMPILED else int(line[len(PREFIX) : end]), tail)
    if line.startswith(_FIRST_KEYS):
        at = line.rfind(SUFFIX, max(0, len(line) - len(SUFFIX) - _MAX_ID_DIGITS - 1))
        if at < 0 or not line.endswith(b"}"):
            return None
        start, end = at + len(SUFFIX), len(line) - 1
        head, tail = memoryview(line)[:start], b"}"
    else:
        return None  # (the usual shape with another id or key: nothing else takes it)
    digits = line[start:end]
    if not digits.isdigit() or (digits[0] == 48 and len(digits) > 1):  # 48: "0"
        return None
    return Answer(head, int(digits), tail)


def answer_id(head: bytes, tail: bytes) -> int | None:
    """The upstream id of an answer known only by its first and last bytes (a
    message too long to take, broker/wire/frames.py ``Oversize``): the id as
    the first key (or the second, after ``"jsonrpc":"2.0"``), or as the last,
    with any whitespace JSON allows (Python's ``json.dumps`` writes spaces);
    None if neither end shows one. Sound for any valid JSON object: a key at
    the very start, or one whose value is followed only by the closing brace
    at the very end, is the top-level object's."""
    match = _ID_FIRST.match(head) or _ID_LAST.search(tail)
    return int(match.group(1)) if match is not None else None


_WS = rb"[ \t\r\n]*"
_ID = rb'"id"' + _WS + rb":" + _WS + rb"([0-9]{1,%d})" % _MAX_ID_DIGITS + _WS
_ID_FIRST = re.compile(
    _WS
    + rb"\{"
    + _WS
    + rb'(?:"jsonrpc"'
    + _WS
    + rb":"
    + _WS
    + rb'"2\.0"'
    + _WS
    + rb","
    + _WS
    + rb")?"
    + _ID
    + rb","
)
_ID_LAST = re.compile(rb"," + _WS + _ID + rb"\}" + _WS + rb"\Z")
