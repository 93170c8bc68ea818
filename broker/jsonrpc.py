"""JSON-RPC 2.0 as MCP uses it: decoding, validation, error objects.

A message is kept as the plain ``dict`` orjson decodes it into; the broker
reads the few fields it routes on and passes everything else through. Every
number survives that: one orjson cannot hold exactly (an integer past 64
bits, which it would make a float, or ``1e400``, which it refuses) is kept as
written, as an ``orjson.Fragment`` (:func:`decode`). Nothing deeper than
:data:`MAX_DEPTH` is taken, so that whatever the broker reads it can also
write (orjson reads 1024 levels but writes only 254). What is
wrong with a message is raised as :class:`JsonRpcError`, which carries the
error object to send back (in the spirit of h11's ``error_status_hint``), so
an actor can answer and go on.
"""

from __future__ import annotations

import enum
import json
import math
from typing import Any, Final, TypeGuard

import orjson

Message = dict[str, Any]
RequestId = int | str

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Server-defined codes, the same numbers the official MCP SDKs use.
CONNECTION_CLOSED = -32000  # the upstream server went away (or never came up)
REQUEST_TIMEOUT = -32001
LIMIT_REACHED = -32005  # a configured limit (in flight, queued bytes) would be passed

# The deepest nesting of arrays and objects taken, the message itself counting
# as one level. Well below the 254 levels orjson writes, so whatever the broker
# builds around a message (a batch, a list result) can still be written.
MAX_DEPTH: Final = 128
# The longest string id the broker keeps in its tables (MCP sets no limit; real
# clients use numbers or UUIDs). A longer one is refused, not stored.
MAX_ID_LENGTH: Final = 256


class JsonRpcError(Exception):
    """A JSON-RPC error, with the id of the request it answers (if known).
    ``response_id``: the id of a response found invalid (so the broker can
    fail the request it answered at once, rather than by its timeout)."""

    def __init__(
        self, code: int, message: str, *, data: Any = None, id: RequestId | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.id = id
        self.response_id: RequestId | None = None

    def error_object(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error

    def to_response(self) -> Message:
        return {"jsonrpc": "2.0", "id": self.id, "error": self.error_object()}


class Kind(enum.Enum):
    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"


def error_response(id: RequestId | None, code: int, message: str, data: Any = None) -> Message:
    return JsonRpcError(code, message, data=data, id=id).to_response()


def result_response(id: RequestId, result: Any) -> Message:
    return {"jsonrpc": "2.0", "id": id, "result": result}


def notification(method: str, params: dict[str, Any] | None = None) -> Message:
    message: Message = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return message


def decode(line: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """Parse one line of JSON, or raise a :class:`JsonRpcError`: -32700 if it is
    not JSON, :class:`TooDeep` (-32600) if it nests deeper than ``max_depth``.

    Every number comes back as written: one orjson cannot hold (an integer
    past 64 bits, which it would make a float; ``1e400``, which it refuses)
    as an ``orjson.Fragment`` of its text, which orjson encodes unchanged.
    """
    try:
        message = _loads(line)
    except orjson.JSONDecodeError as exc:
        message = _beyond_orjson(line, exc)
        _check_depth(message, max_depth)
        return message
    # One pass in C over a copy of the line answers both questions: digits
    # and minus signs become "0" (a run of 20 may be a number orjson cannot
    # hold), and "{" becomes "[" (fewer than max_depth of them, and the line
    # cannot nest deeper; nor can a line of at most 2 * max_depth bytes).
    shape = line.translate(SHAPE)
    if _partition(shape, LONG)[1]:  # (partition, not find or `in`: see LONG)
        message = _EXACT.decode(line.decode())
    if len(line) > 2 * max_depth and shape.count(b"[") > max_depth:
        _check_depth(message, max_depth)
    return message


# What the objects a decoded line becomes cost in memory, beyond its bytes
# (CPython 3.11, 64 bits): an object with keys is a dict of 184 bytes, an
# array a list of 56, and each further member (after a comma) a pointer and,
# mostly, an object of its own (an int 28, a float 24, a string 49 and its
# text). Measured with tracemalloc on progress and log notifications, tool
# lists, arrays of numbers, strings and objects: 1 to 2.5 times what they
# hold, never less than two thirds of it.
HELD_OBJECT: Final = 184
HELD_ARRAY: Final = 56
HELD_MEMBER: Final = 40


def held_size(line: bytes) -> int:
    """About what the message decoded from ``line`` holds in memory (a 110
    byte notification, some 600): what a queue of decoded messages counts
    against a byte limit that is to bound memory. Its objects, arrays and
    members are counted outside its strings: a text holding JSON or CSV was
    counted 7 to 40 times what it held."""
    outside = line
    if b"\\" in outside:  # (escapes: a quote in a string is no string's end)
        outside = outside.replace(b"\\\\", b"").replace(b'\\"', b"")
    if b'"' in outside:
        outside = b"".join(outside.split(b'"')[::2])
    count = outside.count
    return (
        len(line) + HELD_OBJECT * count(b"{") + HELD_ARRAY * count(b"[") + HELD_MEMBER * count(b",")
    )


def needs_exact(line: bytes) -> bool:
    """Whether ``line`` may hold an integer orjson cannot keep: a run of 20
    characters that are digits or minus signs (any integer with fewer digits
    fits in 64 bits). A false alarm (such a run in a string, or ``2**64 - 1``)
    only costs the slower exact parse."""
    return line.translate(SHAPE).find(LONG) >= 0


class TooDeep(JsonRpcError):
    """A message nested deeper than the broker takes. ``id`` is the request's
    (so its sender gets an answer); ``response_id`` the id of a response (so
    the broker can fail the request it answered)."""

    def __init__(self, depth: int, message: Any) -> None:
        is_call = isinstance(message, dict) and "method" in message
        raw_id = message.get("id") if isinstance(message, dict) else None
        super().__init__(
            INVALID_REQUEST,
            f"Invalid Request: nested deeper than {depth} levels",
            id=raw_id if is_call and is_valid_id(raw_id) else None,
        )
        self.response_id = raw_id if not is_call and is_valid_id(raw_id) else None


def depth_exceeds(value: Any, max_depth: int) -> bool:
    """Whether ``value`` nests arrays and objects deeper than ``max_depth``
    (a scalar is depth 0, ``[]`` depth 1). Iterative: no recursion limit."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if type(item) is dict:
            children: Any = item.values()
        elif type(item) is list:
            children = item
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _check_depth(message: Any, max_depth: int) -> None:
    if depth_exceeds(message, max_depth):
        raise TooDeep(max_depth, message)


def _beyond_orjson(line: bytes, error: orjson.JSONDecodeError) -> Any:
    # JSON has no limit on numbers; orjson refuses one past a double's range.
    # Anything else orjson refuses (NaN, a lone surrogate, bad UTF-8) is
    # refused here too: what orjson could not write back is not taken.
    try:
        message = _EXACT.decode(line.decode())
        orjson.dumps(message)
    except (ValueError, RecursionError, orjson.JSONEncodeError):
        raise JsonRpcError(PARSE_ERROR, f"Parse error: {error}") from None
    return message


def _exact_int(text: str) -> Any:
    value = int(text)
    return value if -(2**63) <= value < 2**64 else orjson.Fragment(text)


def _exact_float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else orjson.Fragment(text)


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


_EXACT = json.JSONDecoder(
    parse_int=_exact_int, parse_float=_exact_float, parse_constant=_no_constant
)
SHAPE: Final = bytes(
    ord("0") if b in b"-0123456789" else ord("[") if b == ord("{") else b for b in range(256)
)
LONG: Final = b"0" * 20
# Searched for with ``partition`` (``find`` where the place matters), not
# ``in``, here and on every per-message path: CPython 3.11's ``bytes in
# bytes`` first tries its operand as an integer (``5 in b"..."``) and
# formats, then clears, the TypeError that raises: about 300 ns per test, a
# few percent of a forwarded call; and ``find`` parses an argument format,
# which ``partition`` (one argument) does not. Called as statics, as is
# orjson.loads: a compiled build looks a method or a module's attribute up
# by name on every call (``python -m benchmarks.hotpath --tree build/compiled``).
_loads: Final = orjson.loads
_dumps: Final = orjson.dumps
_partition: Final = bytes.partition


def encode(message: Any) -> bytes:
    """One message's bytes (framing is the wire format's: broker/wire/)."""
    return _dumps(message)


def is_valid_id(value: Any) -> TypeGuard[RequestId]:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def long_id(id: Any) -> JsonRpcError | None:
    """The error for a request whose id is longer than the broker keeps
    (:data:`MAX_ID_LENGTH`), answered with id null (the id is not echoed);
    None for any other."""
    if type(id) is not str or len(id) <= MAX_ID_LENGTH:
        return None
    return JsonRpcError(
        INVALID_REQUEST,
        f"Invalid Request: an id of {len(id)} characters (the limit is {MAX_ID_LENGTH})",
    )


def bad_progress_token(token: Any, id: RequestId | None = None) -> JsonRpcError | None:
    """The error (answering ``id``) for a ``progressToken`` the broker does not
    keep in its tables: one that is not a string or a number (MCP's
    ``ProgressToken``), or a string longer than :data:`MAX_ID_LENGTH` (as for
    ids; not echoed). None for a good one."""
    if type(token) is str:
        if len(token) <= MAX_ID_LENGTH:
            return None
        why = f"a progressToken of {len(token)} characters (the limit is {MAX_ID_LENGTH})"
    elif type(token) is int or type(token) is float:
        return None
    else:
        why = "a progressToken must be a string or a number"
    return JsonRpcError(INVALID_PARAMS, f"Invalid params: {why}", id=id)


def id_key(value: RequestId) -> tuple[type, RequestId]:
    """A dict key that keeps ``1`` and ``"1"`` apart (they are different ids)."""
    return (type(value), value)


def classify(message: Any) -> Kind:
    """Say what a decoded message is, or raise -32600 for one that is none."""
    # The two shapes of nearly every message, checked cheaply first.
    if type(message) is dict and message.get("jsonrpc") == "2.0":
        if type(message.get("method")) is str and type(message.get("params", {})) is dict:
            if "id" not in message:
                return Kind.NOTIFICATION
            if type(message["id"]) in (int, str):
                return Kind.REQUEST
        elif "result" in message and "error" not in message and type(message.get("id")) is int:
            return Kind.RESPONSE
    return _classify_thoroughly(message)


def _classify_thoroughly(message: Any) -> Kind:
    if not isinstance(message, dict):
        raise JsonRpcError(INVALID_REQUEST, "Invalid Request: a message must be a JSON object")
    raw_id = message.get("id")
    echo_id = raw_id if is_valid_id(raw_id) else None
    if "method" in message:
        if message.get("jsonrpc") != "2.0":
            raise JsonRpcError(
                INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"', id=echo_id
            )
        return _classify_call(message, echo_id)
    try:  # not a call: an invalid response says which request it answered
        if message.get("jsonrpc") != "2.0":
            raise JsonRpcError(
                INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"', id=echo_id
            )
        if "result" in message or "error" in message:
            return _classify_response(message)
        raise JsonRpcError(
            INVALID_REQUEST,
            'Invalid Request: neither a request ("method") nor a response ("result"/"error")',
            id=echo_id,
        )
    except JsonRpcError as exc:
        exc.response_id = echo_id
        raise


def _classify_call(message: Message, echo_id: RequestId | None) -> Kind:
    if not isinstance(message["method"], str):
        raise JsonRpcError(
            INVALID_REQUEST, 'Invalid Request: "method" must be a string', id=echo_id
        )
    params = message.get("params")
    if params is not None and not isinstance(params, dict):
        raise JsonRpcError(
            INVALID_REQUEST, 'Invalid Request: "params" must be an object', id=echo_id
        )
    if "id" not in message:
        return Kind.NOTIFICATION
    if echo_id is None:
        raise JsonRpcError(INVALID_REQUEST, 'Invalid Request: "id" must be a string or an integer')
    return Kind.REQUEST


def _classify_response(message: Message) -> Kind:
    if "result" in message and "error" in message:
        raise JsonRpcError(INVALID_REQUEST, 'Invalid Request: both "result" and "error"')
    if "id" not in message:
        raise JsonRpcError(INVALID_REQUEST, 'Invalid Request: a response needs an "id"')
    return Kind.RESPONSE
