"""What every wire format hands the rules: frames.

A frame is the bytes of one message, nothing around them (no newline, no
WebSocket header, no SSE ``data:``). A message longer than the limit is not
kept: the wire format reports it as an :class:`Oversize` instead, with just
enough of its ends to read an answer's id, so that its sender can be told.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import orjson

from broker import jsonrpc
from broker.jsonrpc import INVALID_REQUEST, JsonRpcError
from broker.related import Related

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


# How much of each end of an oversize line is kept: enough for the id of an
# answer in either compact shape (broker/wire/envelope.py), which sits near one end.
KEPT_ENDS = 64


@attrs.frozen(eq=False)
class Oversize:
    """A message that exceeded the limit; ``size`` is how many bytes it had.

    For a line, ``size`` counts every byte before the ``\\n`` (a ``\\r``
    included), so it does not depend on how the line was chunked. ``head`` and ``tail`` are its
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
        """The JSON-RPC error a client gets for it (no id: it was never parsed)."""
        return JsonRpcError(
            INVALID_REQUEST, f"Message too large: {self.size} bytes (the limit is {limit})"
        ).to_response()


@attrs.frozen
class OnStream:
    """A message that came on the stream of the server's answer to one request
    (Streamable HTTP: a POST's SSE stream), and so belongs to that request's
    session: ``frame`` its bytes, ``request`` that request's upstream id.
    The rules route a server's request by it (docs/rules/server-requests.md)."""

    frame: bytes
    request: int | str


@attrs.frozen
class Failed:
    """The link could not get the server's answer to one request (``request``,
    its upstream id): ``detail`` says what came instead (``"HTTP 500 ..."``).
    Its caller gets an error naming the server; the connection goes on."""

    request: int | str
    detail: str


@attrs.frozen
class Renewed:
    """The link opened a new session with the server (it had ended the old
    one: Streamable HTTP's 404): what the server held for the broker in the
    old session (subscriptions, the log level) must be asked for again."""


Frame = bytes | Oversize
LinkFrame = Frame | OnStream | Failed | Renewed
"""What an upstream link hands the rules: frames, and what only some links know."""


# (a static in a compiled build: orjson.dumps is looked up by name on each call)
_dumps: Final = orjson.dumps


def encode(message: object) -> bytes:
    """One outgoing message's bytes (no framing). A message orjson cannot write
    is a bug of the broker's (decode refuses what encode cannot write); rather
    than lose it silently, a request's or answer's id still gets an error."""
    try:
        return _dumps(message)
    except TypeError as exc:  # (orjson's errors are TypeErrors)
        if type(message) is Related:  # (a transport that has no use for its cause)
            return encode(message.message)
        id = message.get("id") if isinstance(message, dict) else None
        if not jsonrpc.is_valid_id(id):
            id = None
        return orjson.dumps(
            jsonrpc.error_response(
                id, jsonrpc.INTERNAL_ERROR, f"mcpbroker could not write this message ({exc})"
            )
        )
