"""The downstream rules for a modern (2026-07-28) client, sans-I/O.

A modern client never sends ``initialize``: its first message is already a
request, carrying its version and capabilities in ``_meta``
(:func:`client_era` tells the two eras apart on that first message). Each
request is checked on its own (:func:`read_meta`): ``_meta`` missing, or
without a version or capabilities, is -32602; a version the broker does not
serve in this era is -32022, naming the versions it does. The broker answers
``server/discover`` itself (:func:`discover_result`), from the same catalog
and view that ``initialize`` reads for a legacy client, and every result it
writes to a modern client, its own or a legacy server's, carries
``resultType`` (and, on lists, reads and discover, the caching hints
``ttlMs`` and ``cacheScope``): :func:`complete_result`, or
:func:`complete_answer` on an answer left unparsed. A 2026-07-28 server's
answer passes as it came when it carries them (the schema's MUST for such a
server), and is completed as a legacy server's is when it does not
(:func:`complete_modern_answer`; docs/eras.md).
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import orjson

from broker.catalog import Catalog
from broker.eras.versions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LATEST_MODERN_VERSION,
    LOG_LEVEL_KEY,
    PROTOCOL_VERSION_KEY,
    SERVER_INFO_KEY,
    SUPPORTED_VERSIONS,
    Era,
    missing_capability,
    negotiate_modern,
)
from broker.fanout import level_rank
from broker.jsonrpc import INVALID_PARAMS, JsonRpcError, Message
from broker.server_requests import CAPABILITY_OF, supports
from broker.views import initialize_for
from broker.wire.envelope import PREFIX, Answer

# The results the spec makes cacheable (server/utilities/caching): they carry
# ``ttlMs`` and ``cacheScope`` once complete.
CACHEABLE_METHODS: Final = frozenset(
    {
        "server/discover",
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
    }
)
# The broker's hints where a server gave none: immediately stale (the broker
# tells listeners of every change through subscriptions/listen, and a server
# restart may change any list at any moment), and private (what a view shows
# is one user's: no shared cache may hand it to another).
DEFAULT_TTL_MS = 0
DEFAULT_CACHE_SCOPE = "private"
# The requests on which a server may answer ``input_required`` (basic/patterns/mrtr).
INPUT_METHODS: Final = frozenset({"tools/call", "prompts/get", "resources/read"})


@attrs.frozen
class RequestMeta:
    """What a modern request says about its client, checked."""

    version: str
    capabilities: dict[str, Any]
    client_info: Any = None
    log_level: str | None = None  # absent: no notifications/message for this request


def client_era(message: Any) -> Era:
    """The era of a client session, from its first message.

    A request (not ``initialize``) whose ``_meta`` names a protocol version
    opens a modern session; anything else is left to the legacy rules, which
    answer it as they always did (``initialize`` first)."""
    if type(message) is not dict or message.get("method") in (None, "initialize"):
        return Era.LEGACY
    if "id" not in message:
        return Era.LEGACY
    params = message.get("params")
    meta = params.get("_meta") if type(params) is dict else None
    if type(meta) is dict and PROTOCOL_VERSION_KEY in meta:
        return Era.MODERN
    return Era.LEGACY


def read_meta(request: Message) -> RequestMeta:
    """Check a modern request's ``_meta`` (raises -32602 or -32022, with its id)."""
    try:
        return _read_meta(request.get("params"))
    except JsonRpcError as exc:
        exc.id = request.get("id")
        raise


def _read_meta(params: Any) -> RequestMeta:
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict):
        raise JsonRpcError(
            INVALID_PARAMS,
            f"Invalid params: a 2026-07-28 request needs params._meta with "
            f"{PROTOCOL_VERSION_KEY!r} and {CLIENT_CAPABILITIES_KEY!r}",
        )
    if PROTOCOL_VERSION_KEY not in meta:
        raise JsonRpcError(INVALID_PARAMS, f"Invalid params: _meta lacks {PROTOCOL_VERSION_KEY!r}")
    version = negotiate_modern(meta[PROTOCOL_VERSION_KEY])
    capabilities = meta.get(CLIENT_CAPABILITIES_KEY)
    if not isinstance(capabilities, dict):
        raise JsonRpcError(
            INVALID_PARAMS,
            f"Invalid params: _meta needs {CLIENT_CAPABILITIES_KEY!r} (an object)",
        )
    level = meta.get(LOG_LEVEL_KEY)
    if level is not None and level_rank(level) is None:
        raise JsonRpcError(INVALID_PARAMS, f"Invalid params: unknown log level {level!r}")
    return RequestMeta(version, capabilities, meta.get(CLIENT_INFO_KEY), level)


def discover_result(catalog: Catalog, view: tuple[str, ...], transparent: bool) -> dict[str, Any]:
    """The broker's answer to ``server/discover`` for a session with this view.

    The same capabilities, identity and instructions a legacy client's
    ``initialize`` gets (broker/views.py) at the modern version, and every
    version the broker speaks."""
    told = initialize_for(catalog, view, transparent, LATEST_MODERN_VERSION)
    result: dict[str, Any] = {
        "resultType": "complete",
        "supportedVersions": list(SUPPORTED_VERSIONS),
        "capabilities": told["capabilities"],
        "_meta": {SERVER_INFO_KEY: told["serverInfo"]},
        "ttlMs": DEFAULT_TTL_MS,
        "cacheScope": DEFAULT_CACHE_SCOPE,
    }
    if told.get("instructions"):
        result["instructions"] = told["instructions"]
    return result


def complete_result(method: str, result: Any) -> Any:
    """A result as a modern client must see it: ``resultType`` always, and the
    caching hints on a complete result of a cacheable method. What the
    server said itself is kept; a new dict is made only when something is
    added (the catalog's pages are shared and never changed)."""
    if not isinstance(result, dict):
        return result
    added: dict[str, Any] = {}
    kind = result.get("resultType", "complete")
    if "resultType" not in result:
        added["resultType"] = "complete"
    if kind == "complete" and method in CACHEABLE_METHODS:
        if "ttlMs" not in result:
            added["ttlMs"] = DEFAULT_TTL_MS
        if "cacheScope" not in result:
            added["cacheScope"] = DEFAULT_CACHE_SCOPE
    return {**result, **added} if added else result


# What complete_answer puts first in a result: resultType, and the caching
# hints; then a comma if the result has keys of its own.
_STAMP = b'"resultType":"complete"'
_HINTS = (
    b',"ttlMs":'
    + orjson.dumps(DEFAULT_TTL_MS)
    + b',"cacheScope":'
    + orjson.dumps(DEFAULT_CACHE_SCOPE)
)
_STAMPS = {  # (cacheable, followed by keys): the bytes put in
    (False, False): _STAMP,
    (False, True): _STAMP + b",",
    (True, False): _STAMP + _HINTS,
    (True, True): _STAMP + _HINTS + b",",
}
_RESULT_AFTER_ID: Final = b',"result":{'  # a result after the id (envelope.PREFIX's shape)
_RESULT_FIRST: Final = b'{"result":{'  # a result before the id (the TypeScript SDK's shape)
# The start of a stamped result: what the line starts with, then the stamp
# (one copy of the rest a call), at index 4 * (a result before the id) + 2 *
# cacheable + (followed by keys). (A list: a tuple key cost a call a tuple
# made, hashed and compared, 500 instructions.)
_STAMPED: Final = [
    start + _STAMPS[cacheable, keys]
    for start in (_RESULT_AFTER_ID, _RESULT_FIRST)
    for cacheable in (False, True)
    for keys in (False, True)
]
_CLOSE: Final = ord("}")
# (a static, as in broker/jsonrpc.py: partition, one argument, not find)
_partition: Final = bytes.partition
_find: Final = bytes.find
_RESULT_TYPED: Final = _RESULT_AFTER_ID + b'"resultType":'  # (a result that says it first)
_TYPED_LEN: Final = len(_RESULT_TYPED)


def complete_answer(answer: Answer, method: str) -> Answer | None:
    """:func:`complete_result` on a server's answer as it wrote it (broker/wire/envelope.py),
    without parsing it: ``resultType`` (and on a cacheable method the caching
    hints) put first in its result, in place (an answer is one session's, as
    its id is); an error as it is. None, the answer untouched, when the bytes
    do not tell: a result that is not an object, or a key it would put
    anywhere in the line (perhaps the server's own: the caller reads the
    answer instead)."""
    head = answer.head
    after_id = head is PREFIX or head == PREFIX  # (split_answer's own PREFIX, usually)
    if after_id:
        tail = answer.tail
        line = tail if type(tail) is bytes else bytes(tail)  # (a small answer's is bytes)
        if not line.startswith(_RESULT_AFTER_ID):
            return answer if line.startswith(b',"error":') else None
        at = len(_RESULT_AFTER_ID)
        index = 0
    else:
        line = bytes(head)
        if not line.startswith(_RESULT_FIRST):
            return answer if line.startswith(b'{"error":') else None
        at = len(_RESULT_FIRST)
        index = 4
    # (partition, not `in`: see broker/jsonrpc.py LONG; and the caching hints
    # only where they are put)
    if _partition(line, b'"resultType"')[1]:
        return None
    if method in CACHEABLE_METHODS:
        if _partition(line, b'"ttlMs"')[1] or _partition(line, b'"cacheScope"')[1]:
            return None
        index += 2
    if len(line) <= at or line[at] != _CLOSE:  # "}": no keys
        index += 1
    stamped = _STAMPED[index] + line[at:]
    if after_id:
        answer.tail = stamped
    else:
        answer.head = stamped
    return answer


def complete_modern_answer(answer: Answer, method: str | None) -> Answer | None:
    """A 2026-07-28 server's answer, for a modern client: as it came when its
    bytes name the era's keys (``resultType``; on a cacheable method the
    caching hints too), which the schema has such a server include; stamped
    by :func:`complete_answer` when they name none of them (a server that
    breaks the rule: a client such as the official Python SDK's refuses a
    result without ``resultType``, though the schema says to take it as
    ``complete``). None, the answer untouched, when they name some of them
    only: the caller reads it. (A key named anywhere in the bytes, in a
    tool's text as well, is taken for the result's own: a search, not a
    parse.) An answer with ``resultType`` its result's first key (as
    benchmarks/echo_server.py writes it) on a method with no caching hints
    is told at a glance; any other is searched (the official Python SDK's
    server writes the key after ``content``)."""
    tail = answer.tail
    if (
        answer.head is PREFIX
        and type(tail) is bytes
        and tail[:_TYPED_LEN] == _RESULT_TYPED
        and (method == "tools/call" or method not in CACHEABLE_METHODS)
    ):
        return answer
    # (an error: complete_answer passes it as it is, unless it names a key)
    line = answer.written()
    # (find, not partition: the key is usually there, and partition would
    # copy the line around it)
    typed = _find(line, b'"resultType"') >= 0
    if method not in CACHEABLE_METHODS:
        return answer if typed else complete_answer(answer, "")
    ttl = _find(line, b'"ttlMs"') >= 0
    scope = _find(line, b'"cacheScope"') >= 0
    if typed and ttl and scope:
        return answer
    if typed or ttl or scope:
        return None
    return complete_answer(answer, method)


def check_input_requests(capabilities: dict[str, Any], input_requests: Any) -> None:
    """Raise -32021 if any input request needs a capability the client did not
    declare (the broker never asks a client for what it cannot give)."""
    if not isinstance(input_requests, dict):
        return
    missing: dict[str, Any] = {}
    for request in input_requests.values():
        method = request.get("method") if isinstance(request, dict) else None
        params = request.get("params") if isinstance(request, dict) else None
        # The server's JSON is untrusted: a list method is unhashable, a list
        # params has no mode; both are refused, never looked up.
        if not isinstance(method, str) or method not in CAPABILITY_OF:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown input request method: {method!r}")
        if params is None:
            params = {}
        elif not isinstance(params, dict):
            raise JsonRpcError(INVALID_PARAMS, f"Input request params must be an object: {method}")
        if not supports(capabilities, method, params):
            name = CAPABILITY_OF[method]
            url = method == "elicitation/create" and params.get("mode") == "url"
            missing[name] = {"url": {}} if url else {}
    if missing:
        raise missing_capability(missing, ", ".join(sorted(missing)))
