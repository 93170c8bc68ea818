"""What the shim remembers so that its host survives a daemon restart.

Pure logic, standard library only, no I/O: :class:`HostState` is fed every
complete line the host writes (:meth:`HostState.up`) and every line the
daemon writes (:meth:`HostState.down`), and keeps, bounded, what a new
daemon must be told again and what a dead one owed the host:

- the host's ``initialize`` and ``notifications/initialized`` lines, its last
  ``logging/setLevel`` and its resource subscriptions (replayed, with the
  shim's own ids, whose answers the shim drops: :meth:`HostState.replay`);
  an ``initialize`` or ``logging/setLevel`` only once the daemon answered it
  with a result (one it refused, or could not read, is not the session's);
- the ids of the host's requests not yet answered (each gets an error at a
  gap: :meth:`HostState.gap_errors`);
- the ids of the daemon's requests to the host not yet answered (the host's
  late answers to a dead daemon are dropped: :meth:`HostState.up`);
- whether the daemon said it has begun to stop (its ``stopping`` notice,
  broker/hello.py: never passed to the host; :attr:`HostState.stopping`).

No line is parsed as JSON on the way: :func:`scan` finds a line's top-level
``"method"`` and ``"id"`` with byte searches, and turns to ``json`` only for
lines whose shape those searches cannot vouch for (rare: no SDK writes them),
and for the rare lines that are remembered (a subscription's URI).
"""

from __future__ import annotations

RESUME_ID = b'"mcpbroker-resume-'  # ids of the shim's replayed requests (their answers are dropped)
MAX_PENDING = 65536  # host requests remembered as in flight (the daemon refuses far fewer)
MAX_SUBSCRIPTIONS = 4096
MAX_REMEMBERED_LINE = 1 << 20  # a state line longer than this is not kept for replay
MAX_ASKED = 16  # initialize / setLevel lines awaiting their answers (the oldest go)
GAP_CODE = -32000  # as for a server that went away (broker/jsonrpc.py CONNECTION_CLOSED)
GAP_MESSAGE = (
    "mcpbroker: the daemon went away while this request was in flight (it may or may "
    "not have been carried out); the shim is reconnecting: try again"
)

# The daemon's notice that it has begun to stop (broker/hello.py's
# STOPPING_NOTICE, as orjson writes it).
STOPPING_NOTICE = b'{"mcpbroker":{"notice":"stopping"}}'

_WS = b" \t\r\n"
_ID, _METHOD = b'"id"', b'"method"'


def scan(line: bytes) -> tuple[bytes | None, bytes | None]:
    """A JSON-RPC line's top-level method name and id, as raw bytes (None if absent).

    The id is the JSON value's bytes (``7`` or ``"abc"``), escapes resolved
    to a canonical form when it has any, so that the host's id and the
    daemon's copy of it compare equal. The compact shapes the SDKs write
    are recognised by their first and last bytes (:func:`_scan_compact`).
    A line that cannot be read (a bad escape, a lone surrogate, nesting past
    Python's recursion) is untracked, (None, None): it goes on, for the
    daemon to answer with its error (it ended the shim with a traceback).
    """
    try:
        return _scan(line)
    except (ValueError, UnicodeError, RecursionError):
        return None, None


def _scan(line: bytes) -> tuple[bytes | None, bytes | None]:
    found = _scan_compact(line)
    if found is not None:
        return found
    found_method, method = _key(line, _METHOD)
    found_id, id = _key(line, _ID)
    if found_method and found_id:
        if method is not None and method.startswith(b'"'):
            method = method[1:-1]
        if id is not None and not _is_id(id):
            id = None  # (7x, 1.5, true: no answer can name it; the daemon's has id null)
        return method, id
    return _scan_slowly(line)


# The shapes the SDKs write, compact: the Python SDK, orjson and the daemon put
# "jsonrpc" first and "id" second; the TypeScript SDK puts "method" (or
# "result", "error") first and "id" last.
_FIRST = b'{"jsonrpc":"2.0","id":'
_FIRST_NOTIFICATION = b'{"jsonrpc":"2.0","method":"'
_LAST = b',"jsonrpc":"2.0","id":'
_ANSWER_NEXT = (b',"result":', b',"error":')
_ANSWER_FIRST = (b'{"result":', b'{"error":')


def _scan_compact(line: bytes) -> tuple[bytes | None, bytes | None] | None:
    """:func:`scan` for the SDKs' compact shapes, or None for any other."""
    if line.startswith(_FIRST):
        id, end = _id_at(line, len(_FIRST))
        if id is None:
            return None
        if line.startswith(b',"method":"', end):
            return _method_at(line, end + 11, id)
        return (None, id) if line.startswith(_ANSWER_NEXT, end) else None
    if line.startswith(_FIRST_NOTIFICATION):
        if line.find(_ID) != -1:
            return None
        return _method_at(line, len(_FIRST_NOTIFICATION), None)
    last = line.rfind(_LAST)
    if last == -1:
        return None
    id, end = _id_at(line, last + len(_LAST))
    if id is None or line.find(b"}", end) != end or line[end + 1 :].strip(_WS):
        return None  # (unless only the closing brace follows, that id is nested)
    if line.startswith(b'{"method":"'):
        return _method_at(line, 11, id)
    return (None, id) if line.startswith(_ANSWER_FIRST) else None


def _is_id(value: bytes) -> bool:
    """Whether a scalar's bytes are a JSON string or integer (a request id)."""
    if value[:1] == b'"':
        return True  # (_value_at: a whole string, canonical if it had escapes)
    digits = value[1:] if value[:1] == b"-" else value
    return digits.isdigit() and (digits[:1] != b"0" or len(digits) == 1)


def _id_at(line: bytes, i: int) -> tuple[bytes | None, int]:
    """A compact id at ``i`` (an integer, or a string without escapes), and its end."""
    if line[i : i + 1] == b'"':
        end = line.find(b'"', i + 1)
        if end == -1 or line.find(b"\\", i, end) != -1:
            return None, i
        return line[i : end + 1], end + 1
    comma, brace = line.find(b",", i), line.find(b"}", i)
    end = comma if comma != -1 and (brace == -1 or comma < brace) else brace
    value = line[i:end]
    if end == -1 or not _is_id(value):
        return None, i
    return value, end


def _method_at(line: bytes, i: int, id: bytes | None) -> tuple[bytes | None, bytes | None] | None:
    end = line.find(b'"', i)
    if end == -1 or line.find(b"\\", i, end) != -1:
        return None
    return line[i:end], id


def _key(line: bytes, key: bytes) -> tuple[bool, bytes | None]:
    """(sure, value) of a top-level ``key``: sure is False if the byte search
    cannot tell (then the caller parses)."""
    first = line.find(key)
    if first == -1:
        return True, None  # (no such key anywhere: not at the top level either)
    # Nothing nested opens before the first occurrence: it is at the top level.
    if line.find(b"{", 1, first) == -1 and line.find(b"[", 1, first) == -1:
        value, _end = _value_at(line, first + len(key))
        return value is not None, value
    # The last occurrence, whose value only the closing brace follows, is too.
    last = line.rfind(key)
    value, end = _value_at(line, last + len(key))
    if value is not None and line[end:].strip(_WS) == b"}":
        return True, value
    return False, None


def _value_at(line: bytes, i: int) -> tuple[bytes | None, int]:
    """The scalar value after a key ending at ``i`` (None if it is not one), and its end."""
    n = len(line)
    while i < n and line[i] in _WS:
        i += 1
    if i >= n or line[i] != 0x3A:  # ':' (else this was a string value, not a key)
        return None, i
    i += 1
    while i < n and line[i] in _WS:
        i += 1
    if i < n and line[i] == 0x22:  # a string: up to the first quote not escaped
        end = line.find(b'"', i + 1)
        while end != -1 and _escaped(line, end):
            end = line.find(b'"', end + 1)
        if end == -1:
            return None, n
        value = line[i : end + 1]
        return (_canonical(value) if b"\\" in value else value), end + 1
    end = i
    while end < n and line[end] not in b",}] \t\r\n":
        end += 1
    if end == i or line[i] in b"{[":
        return None, end
    return line[i:end], end


def _escaped(line: bytes, quote: int) -> bool:
    backslashes = 0
    while line[quote - 1 - backslashes] == 0x5C:
        backslashes += 1
    return backslashes % 2 == 1


def _canonical(value: bytes) -> bytes:
    import json  # (ids with escapes are rare)

    return json.dumps(json.loads(value), ensure_ascii=False, separators=(",", ":")).encode()


def _scan_slowly(line: bytes) -> tuple[bytes | None, bytes | None]:
    import json

    try:
        message = json.loads(line)
    except ValueError:
        return None, None
    if not isinstance(message, dict):
        return None, None  # (a batch: its parts are not tracked)
    method = message.get("method")
    id = message.get("id")
    id_bytes = None
    if isinstance(id, (int, str)) and not isinstance(id, bool):
        id_bytes = json.dumps(id, ensure_ascii=False).encode()
    return (method.encode() if isinstance(method, str) else None), id_bytes


def _batch(line: bytes) -> list[tuple[bytes | None, bytes | None]]:
    """Each item of a batch line, as :func:`scan` says it (none if unreadable)."""
    import json

    try:
        items = json.loads(line)
        return [
            _scan(json.dumps(item, ensure_ascii=False).encode())
            for item in items
            if isinstance(item, dict)
        ]
    except (ValueError, UnicodeError, RecursionError, TypeError):
        return []


def _param(line: bytes, name: bytes) -> bytes | None:
    """A params string's value, parsed (only for the rare lines remembered)."""
    import json

    try:
        params = json.loads(line).get("params") or {}
        value = params.get(name.decode())
    except (ValueError, AttributeError, RecursionError):
        return None
    return value.encode() if isinstance(value, str) else None


def cancelled_id(line: bytes) -> bytes | None:
    import json

    try:
        id = (json.loads(line).get("params") or {}).get("requestId")
    except (ValueError, AttributeError, RecursionError):
        return None
    if isinstance(id, (int, str)) and not isinstance(id, bool):
        try:
            return json.dumps(id, ensure_ascii=False).encode()
        except UnicodeError:  # (a lone surrogate: no request of the host's has it)
            return None
    return None


def with_id(line: bytes, id: bytes) -> bytes:
    """``line`` (a request with a top-level id) with that id replaced by ``id``."""
    import json

    message = json.loads(line)
    message["id"] = json.loads(id)
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def _answerable(id: bytes) -> bool:
    """Whether ``id`` is JSON for a string or an integer, to be written to the
    host as it is (:func:`scan` tracks no other shape, but its byte searches
    cannot tell a string's bytes are UTF-8)."""
    import json

    try:
        value = json.loads(id)
    except ValueError:  # (and UnicodeDecodeError)
        return False
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def _result(line: bytes) -> bool:
    """Whether a daemon's answer is a result (not an error)."""
    import json

    try:
        answer = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(answer, dict) and "result" in answer


def _readable(line: bytes) -> bool:
    import json

    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


def error_line(id: bytes, message: str = GAP_MESSAGE) -> bytes:
    """The error for the host's request ``id``; nothing if ``id`` is not
    valid JSON for a request id (the stdio transport allows no other line)."""
    import json

    if not _answerable(id):
        return b""
    text = json.dumps(message)
    return b'{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%s}}\n' % (
        id,
        GAP_CODE,
        text.encode(),
    )


class HostState:
    """The host's session as the shim must restore it (see the module's docstring)."""

    def __init__(self) -> None:
        self.initialize: bytes | None = None
        self.initialized: bytes | None = None
        self.set_level: bytes | None = None
        self.subscriptions: dict[bytes, bytes] = {}  # uri -> the subscribe line
        self.asked: dict[bytes, tuple[bytes, bytes]] = {}  # id -> (method, line), unanswered
        self.pending: dict[bytes, None] = {}  # the host's requests in flight
        self.daemon_pending: dict[bytes, None] = {}  # the daemon's requests to the host
        self.stale: set[bytes] = set()  # a dead daemon's requests: their answers are dropped
        self.replayed: set[bytes] = set()  # the shim's replayed requests: their answers too
        self.overflow = False  # more in flight than MAX_PENDING: some cannot be answered
        self.stopping = False  # the daemon said it has begun to stop
        self._next = 0

    def up(self, line: bytes) -> bool:
        """Note a complete line from the host; False if it must not be sent on
        (the answer to a request of a daemon that is gone)."""
        if line[:1] == b"[":  # a batch (2025-03-26): its requests are in flight too
            for method, id in _batch(line):
                if method is not None and id is not None and len(self.pending) < MAX_PENDING:
                    self.pending[id] = None
            return True
        method, id = scan(line)
        if method is None:  # an answer to the daemon, or nothing to track
            if id is not None and self.stale and id in self.stale:
                self.stale.discard(id)
                return False
            if id is not None:
                self.daemon_pending.pop(id, None)
            return True
        if id is not None:
            if len(self.pending) < MAX_PENDING:
                self.pending[id] = None
            else:
                self.overflow = True
        if method in _REMEMBERED:
            self._remember(method, line, id)
        elif method == b"notifications/cancelled" and self.pending:
            self.pending.pop(cancelled_id(line) or b"", None)  # (no answer will come)
        return True

    def down(self, line: bytes) -> bool:
        """Note a complete line from the daemon; False if it must not reach the
        host (the answer to a replayed request)."""
        if line[:1] == b"[":  # a batch's answers
            for method, id in _batch(line):
                if method is None and id is not None:
                    self.pending.pop(id, None)
            return True
        method, id = scan(line)
        if id is None:
            if method is None and line.startswith(STOPPING_NOTICE):
                self.stopping = True
                return False  # (the shim's, not MCP: the host never sees it)
            return True
        if method is not None:
            # (a new daemon numbers its requests anew: an id a dead one used
            # is this one's now, and the host's answer to it must go through)
            self.stale.discard(id)
            self.daemon_pending[id] = None
            return True
        if self.replayed and id in self.replayed:
            self.replayed.discard(id)
            return False
        self.pending.pop(id, None)
        if self.asked:
            asked = self.asked.pop(id, None)
            if asked is not None:
                self._answered(*asked, line)
        return True

    def _answered(self, method: bytes, line: bytes, answer: bytes) -> None:
        """The daemon answered an ``initialize`` or ``logging/setLevel``: a
        result makes it the session's, to replay (the line the daemon read)."""
        if not _result(answer) or not _readable(line):
            return
        if method == b"initialize":
            self.initialize = line
        else:
            self.set_level = line

    def _remember(self, method: bytes, line: bytes, id: bytes | None) -> None:
        if len(line) > MAX_REMEMBERED_LINE:
            return
        if method in _ASKED:
            if id is not None:  # (remembered once answered: _answered)
                if len(self.asked) >= MAX_ASKED:
                    del self.asked[next(iter(self.asked))]
                self.asked[id] = (method, line)
        elif method == b"notifications/initialized":
            self.initialized = line
        elif method == b"resources/subscribe":
            uri = _param(line, b"uri")
            if uri is not None and (
                uri in self.subscriptions or len(self.subscriptions) < MAX_SUBSCRIPTIONS
            ):
                self.subscriptions[uri] = line
        elif method == b"resources/unsubscribe":
            uri = _param(line, b"uri")
            if uri is not None:
                self.subscriptions.pop(uri, None)

    def gap_errors(self) -> bytes:
        """The daemon is gone: an error for each host request in flight (and
        forget them); the daemon's own requests become stale. An
        ``initialize`` still in flight is not the session's: the host, told
        to try again, does."""
        self.asked.clear()
        errors = b"".join(error_line(id) for id in self.pending)
        self.pending.clear()
        self.stale |= self.daemon_pending.keys()
        self.daemon_pending.clear()
        self.replayed.clear()
        return errors

    def replay(self) -> tuple[bytes | None, bytes]:
        """What to send a new daemon: the replayed ``initialize`` (whose answer
        the caller waits for) and its id, then the rest (initialized, the log
        level, the subscriptions)."""
        if self.initialize is None:
            return None, b""
        first = with_id(self.initialize, self._fresh_id())
        rest = [self.initialized or b""]
        for line in (self.set_level, *self.subscriptions.values()):
            if line is not None:
                rest.append(with_id(line, self._fresh_id()))
        return first, b"".join(rest)

    def _fresh_id(self) -> bytes:
        self._next += 1
        id = RESUME_ID + str(self._next).encode() + b'"'
        self.replayed.add(id)
        return id


_ASKED = frozenset({b"initialize", b"logging/setLevel"})
_REMEMBERED = frozenset(
    {
        b"initialize",
        b"notifications/initialized",
        b"logging/setLevel",
        b"resources/subscribe",
        b"resources/unsubscribe",
    }
)
