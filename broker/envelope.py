"""Large answers passed on without parsing their result.

A server's answer to a request is ``{"jsonrpc":"2.0","id":N,"result":...}``,
and the broker reads nothing of it but the id: the result only crosses. For
a large result (a file, a screenshot) parsing it is most of the broker's
cost (about 1 ms per MiB here) and builds a string nobody reads. So a line
of at least :data:`LARGE` bytes in exactly that shape, the way servers write
it, becomes ``{"jsonrpc": "2.0", "id": N, "result": Fragment(raw)}``: the id
is read (and rewritten as usual), the result's bytes are written back as
they came (``orjson.Fragment``).

What the broker gives up: it no longer checks that such a result is valid
JSON. A server that writes a broken one hands its client a line that does not
parse, where a fully parsed line would have been logged and dropped (and the
request would have timed out). Smaller lines, other shapes, and answers the
broker must read (tasks, subscriptions) are parsed in full as before.
"""

from __future__ import annotations

from typing import Any

import orjson

LARGE = 16 * 1024  # bytes; below this, parsing costs less than it is worth skipping
PREFIX = b'{"jsonrpc":"2.0","id":'
RESULT = b',"result":'
_MAX_ID_DIGITS = 19  # the broker's own upstream ids are positive and never this long


def parse_large_answer(line: bytes) -> dict[str, Any] | None:
    """The answer in ``line`` with its result left unparsed, or None (parse it)."""
    if len(line) < LARGE or not line.startswith(PREFIX) or not line.endswith(b"}"):
        return None
    start = len(PREFIX)
    end = line.find(RESULT, start, start + _MAX_ID_DIGITS + len(RESULT))
    digits = line[start:end]
    if end < 0 or not digits.isdigit() or (len(digits) > 1 and digits[0] == ord("0")):
        return None
    result = line[end + len(RESULT) : -1]
    return {"jsonrpc": "2.0", "id": int(digits), "result": orjson.Fragment(result)}
