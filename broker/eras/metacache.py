"""A modern session's memory of the ``_meta`` bytes its client repeats, sans-I/O.

A 2026-07-28 client puts the same ``_meta`` on every request of its session
(its version, capabilities and name), about 190 bytes of a 300-byte call.
Decoded and checked on every line, those bytes cost a modern call a third
more than a legacy one. :class:`MetaCache` remembers the exact bytes of the
last ``_meta`` value the session checked good (:meth:`MetaCache.remember`),
and reads a line that carries them again without decoding or checking them
(:meth:`MetaCache.decode`): the value's bytes are swapped for a short marker
number, the smaller line is decoded, and the marker, found where the
request's ``params._meta`` is, is replaced by the remembered bytes, as an
``orjson.Fragment`` (one, shared: it cannot be changed).

**Why a Fragment, not the value.** The request goes to its server encoded
again; orjson writes a Fragment's bytes as they are, where the value (two
nested objects, six strings) cost 1,300 instructions a call to encode. What
the broker needs of a remembered ``_meta`` it has here instead: its
capabilities and client info (:attr:`MetaCache.capabilities`,
:attr:`MetaCache.client_info`), its version (2026-07-28, the only one
remembered: the HTTP link's ``modern_version``), and that it holds nothing
but the modern keys, so a legacy server gets none of it (the era bridge's
``legacy_params`` drops it) and it carries no ``progressToken`` to rewrite
(broker/requestmap.py reads only an object).

**Why the marker proves the place.** The rule swaps one occurrence of
``"_meta":`` followed by the remembered value's bytes ``C`` (what orjson
writes for it; where it is looked for: below) for ``"_meta":`` followed
by :data:`MARKER`'s 20 digits ``M``, and takes the result only if the
swapped line holds no other run of 20 digits (nor of ``-``: the run
:func:`~broker.jsonrpc.needs_exact` looks for, with the same translation)
and its decoded ``params._meta`` (the top-level ``params``, its ``_meta``
key: what the broker reads, duplicates resolved as the decoder resolves
them) equals :data:`MARKER`. That value is an integer no float equals
(odd, past 2**53) and that fits 64 bits, so orjson read it from a number
token whose bytes are exactly ``M`` (a JSON integer has one spelling);
the only such run in the swapped line is the one put in (a run of digits
that overlapped it would be a longer token, another number), so the
swapped spot is a value, and it is the value of ``params._meta``. The
original line is the swapped one with ``C``, a complete JSON value, in that
value's place: the same grammar, so it is JSON exactly when the swapped
line is, and decodes to the same message with ``C``'s value (the
remembered dict) as ``params._meta``. No structural reading of the bytes
(which key, at which depth, a key spelled with escapes such as
``"p\\u0061rams"``, a second ``params`` or ``_meta``) is needed: the decoder
settles all of it. A line-level cut (``"params":{"_meta":...`` as the first
key, with nothing before it that opens an object) would not: a second
top-level ``params`` key spelled with escapes overrides the one cut from,
and cannot be found in the bytes.

The rest of the line decodes as it would have: ``C`` holds no run of 20
digits (:func:`~broker.jsonrpc.needs_exact`; such a value is not
remembered), and the line outside it holds none either (the check above,
which is :func:`~broker.jsonrpc.decode`'s), so the original needs no exact
parse, and the swapped line, whose one run is ``M``, none that orjson's
cannot give. Its depth is the original's but ``C``'s, and ``C`` sat at the
same place in a line already taken (so within
:data:`~broker.jsonrpc.MAX_DEPTH`): the original is too deep exactly when
the swapped line is. (A 303-byte call is about 130 bytes swapped: under
the 256 bytes past which :func:`~broker.jsonrpc.decode` counts brackets, a
pass of 2,300 instructions per call the full path paid.)

**Why this way, in CPython 3.11** (``python -m benchmarks.hotpath``): the
usual line is cut with ``removesuffix`` (no argument format to parse: 1,500
instructions less than ``endswith`` and a slice), and the one run of 20
digits the check allows is how the marker's absence elsewhere is known
without a search of its own (1,100 instructions less than ``partition``).

**What is remembered.** Only a ``_meta`` the session's checks found good
(version 2026-07-28, capabilities an object) and whose keys are all among
the version, capabilities and client info: one with a log level, a
``progressToken`` or any other key is never remembered (such a line is
decoded and checked in full, as before, and its keys reach the server);
and only when orjson writes it back as the line wrote it (a client that
writes spaces or escapes otherwise is simply never matched) and reads it
back equal. Where the bytes are looked for: first where the official SDK
and ``mcpbroker bench`` write them (params' last key, params the message's
last: the line ends with them and ``}}``), then after the line's last
``"_meta":`` (any other client's order); the marker, not the place, is
what proves them ``params._meta``.
:data:`MAX_REMEMBERED` bounds how often a session tries to remember anew
(a client whose ``_meta`` changes on every call, or that writes it
otherwise than orjson does, would pay for a try on each).

**Fallbacks.** Anything else is ``None``: the caller decodes the line in
full, as before. No remembered bytes; the bytes absent; ``M`` already in the
line; the swapped line not JSON, or too deep; no marker at
``params._meta``. So a bad ``_meta`` is never matched (its bytes differ
from a good one's) and gets today's answers (-32602, -32022), decided by
the full path.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from broker import jsonrpc
from broker.eras.versions import CLIENT_CAPABILITIES_KEY, CLIENT_INFO_KEY, PROTOCOL_VERSION_KEY
from broker.jsonrpc import Message

# The number put where the remembered bytes were: 20 digits, so the one
# run jsonrpc.LONG may find (module docstring); under 2**64, so orjson reads
# it as an int; odd and past 2**53, so no float equals it.
MARKER: Final = 17346128095734612809
MARKER_BYTES: Final = b"17346128095734612809"
_KEY: Final = b'"_meta":'
_SWAP: Final = _KEY + MARKER_BYTES
_SWAP_TAIL: Final = _SWAP + b"}}"
# The _meta keys a remembered value may hold (anything else reaches the server).
_DEEP: Final = 2 * jsonrpc.MAX_DEPTH - len(_SWAP_TAIL)  # (a head this long may nest too deep)
REMEMBERED_KEYS: Final = frozenset({PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY, CLIENT_INFO_KEY})
# How many times a session tries to remember a value (the first, and changes after it).
MAX_REMEMBERED: Final = 16
# (a static in a compiled build: orjson.loads is looked up by name on each call)
_loads: Final = orjson.loads
_removesuffix: Final = bytes.removesuffix
_partition: Final = bytes.partition


class MetaCache:
    """The last good ``_meta`` of a session's client, as bytes and as a value."""

    def __init__(self) -> None:
        self.key = b""  # '"_meta":' and the value's bytes; empty: nothing remembered
        self.tail = b""  # the key, params' last, at the end of the line: the key and '}}'
        self.fragment = orjson.Fragment(b"{}")  # the value's bytes, what the requests carry
        self.capabilities: dict[str, Any] = {}  # its clientCapabilities
        self.client_info: Any = None  # its clientInfo
        self.remembered = 0
        # The params of the message :meth:`decode` returned last (its caller
        # reads them too: a dict lookup less a call).
        self.params: Message = {}

    def decode(self, line: bytes) -> Message | None:
        """``line``'s message, its ``params._meta`` the remembered value, if
        the line carries that value's bytes there (the module's docstring
        says why the marker proves it); None: decode it in full."""
        key = self.key
        if not key:
            return None  # (any bytes end a WebSocket message or a POST: no key is safe)
        # Where the SDK and the benchmark's client write it: the last key of
        # params, the message's last key ('..."_meta":{...}}}'); else after
        # the last '"_meta":'. (A find of the whole key, a long needle, costs
        # CPython ten times as much.)
        head = _removesuffix(line, self.tail)
        if head is not line:
            # The line but the bytes holds no run of 20 digits (nor is deep):
            # jsonrpc.decode's checks, in line (a call less), before the marker.
            shape = head.translate(jsonrpc.SHAPE)
            if _partition(shape, jsonrpc.LONG)[1] or (
                len(head) > _DEEP and shape.count(b"[") > jsonrpc.MAX_DEPTH
            ):
                return None
            swapped = head + _SWAP_TAIL
        else:
            at = line.rfind(_KEY)
            if not line.startswith(key, at):
                return None  # (at -1: the last byte, never the key)
            swapped = line[:at] + _SWAP + line[at + len(key) :]
            shape = swapped.translate(jsonrpc.SHAPE)
            marker_at = at + len(_KEY)
            if (
                shape.find(jsonrpc.LONG) != marker_at
                or shape.find(jsonrpc.LONG, marker_at + 1) >= 0
                or (len(swapped) > 2 * jsonrpc.MAX_DEPTH and shape.count(b"[") > jsonrpc.MAX_DEPTH)
            ):
                return None
        try:
            # (a compiled build checks the message is a dict here: a TypeError)
            message: Message = _loads(swapped)
            params: Message = message["params"]
            if params["_meta"] != MARKER:
                return None
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None  # (not JSON, or no params._meta: the full path says what the line is)
        params["_meta"] = self.fragment
        self.params = params
        return message

    def remember(self, line: bytes, meta: dict[str, Any]) -> None:
        """``meta``, the checked-good ``params._meta`` of ``line``'s request,
        is remembered if it is of the kind remembered (module docstring) and
        ``line`` holds its bytes as orjson writes them."""
        if self.remembered >= MAX_REMEMBERED or not meta.keys() <= REMEMBERED_KEYS:
            return
        value = orjson.dumps(meta)  # (a decoded value: it encodes)
        key = _KEY + value
        if key == self.key:
            return
        self.remembered += 1  # (tried: a client never matched stops paying for it)
        if len(key) <= len(_SWAP) or line.find(key) < 0 or jsonrpc.needs_exact(value):
            return
        again = orjson.loads(value)
        if again != meta:
            return
        self.key, self.tail = key, key + b"}}"
        self.fragment = orjson.Fragment(value)
        self.capabilities = again[CLIENT_CAPABILITIES_KEY]
        self.client_info = again.get(CLIENT_INFO_KEY)
