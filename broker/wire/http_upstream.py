"""The client side of MCP over HTTP, as rules: what the HTTP link must decide.

Two transports reach a server by ``"url": "http(s)://..."``
(modelcontextprotocol, docs/specification/2025-11-25/basic/transports.mdx
and 2024-11-05):

- **Streamable HTTP**: every message is a POST to one endpoint; a request's
  answer comes back as the POST's JSON body or on the POST's own SSE stream
  (after the progress, log messages and requests to the client that relate
  to it); a GET opens a stream of unrelated server messages. The server may
  give an ``Mcp-Session-Id`` with its initialize answer, which every later
  request carries, with ``MCP-Protocol-Version``; a 404 to a request that
  carries the session id means the session is gone.
- **HTTP+SSE** (2024-11-05): a GET opens the stream, whose first event
  (``endpoint``) says where to POST; every server message comes on that stream.

Which one: the config's ``type`` (``"http"``/``"streamable-http"``, or
``"sse"``), or, with none, the spec's fallback: POST the initialize, and on
400, 404 or 405 GET the URL for an ``endpoint`` event.

This module holds the decisions (:func:`outcome_of`, :func:`mode_of`,
:func:`expand`); actors/links/http.py does the I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from broker.wire.envelope import split_answer

STREAMABLE = "streamable-http"
SSE = "sse"
DETECT = "detect"  # no type given: Streamable HTTP, falling back to HTTP+SSE

ACCEPT_POST = "application/json, text/event-stream"
ACCEPT_STREAM = "text/event-stream"
SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
LAST_EVENT_HEADER = "last-event-id"
FALLBACK_STATUSES = frozenset({400, 404, 405})  # an initialize POST refused so: try HTTP+SSE

# What a GET stream's poll answered with another status than 2xx means (poll_refused).
NO_GET_STREAM = "none"  # the server offers none: no more polls
POLL_LATER = "later"  # poll again after a backoff, from the same event id
POLL_AFRESH = "afresh"  # poll again after a backoff, without Last-Event-ID

# What the answer to a POST is (outcome_of).
ACCEPTED = "accepted"  # 202: nothing to read (a notification's or response's)
JSON = "json"  # one JSON-RPC message (or a batch) in the body
STREAM = "stream"  # an SSE stream of messages, the answer last
EXPIRED = "expired"  # 404 with a session id: the session is gone
FALLBACK = "fallback"  # the initialize was refused as an old server would: try HTTP+SSE
FAILED = "failed"  # any other status or content: the request failed

_TYPES = {
    None: DETECT,
    "http": STREAMABLE,
    "streamable-http": STREAMABLE,
    "streamableHttp": STREAMABLE,
    "sse": SSE,
}

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class MissingVariable(Exception):
    """A ``${NAME}`` in the config names a variable the daemon's environment lacks."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def mode_of(config_type: str | None) -> str:
    """The transport a config's ``type`` asks for (:data:`DETECT` if none);
    ValueError if it names one that does not go over HTTP (``"stdio"``, ``"ws"``)."""
    mode = _TYPES.get(config_type)
    if mode is None:
        raise ValueError(f'"type": {config_type!r} does not go with an http(s):// url')
    return mode


def outcome_of(
    status: int, content_type: str, *, has_session: bool, initialize: bool, detecting: bool
) -> str:
    """What the answer to a POST is, from its status and ``Content-Type``.

    ``has_session``: the POST carried an ``Mcp-Session-Id``; ``initialize``: it
    was the initialize request; ``detecting``: no type was configured, so an
    old server's refusal of the initialize means HTTP+SSE.
    """
    if status == 404 and has_session and not initialize:
        return EXPIRED
    if initialize and detecting and status in FALLBACK_STATUSES:
        return FALLBACK
    if status == 202:
        return ACCEPTED
    if not 200 <= status < 300:
        return FAILED
    media = content_type.partition(";")[0].strip().lower()
    if media == "text/event-stream":
        return STREAM
    if media == "application/json":
        return JSON
    if status == 204 or (status == 200 and not media):
        return ACCEPTED  # (an empty answer to a notification, from a lenient server)
    return FAILED


def poll_refused(status: int, *, resuming: bool) -> str:
    """What a poll of the GET stream answered ``status`` (not 2xx, not the
    404 of an expired session) means. Only 405 (404, of a server without
    sessions or in a new session) says the server offers no GET stream;
    anything else (a 503 or 502 of a gateway during a deploy, a 429, a 3xx)
    may pass, so the stream is polled again, with backoff. A 4xx but 408
    and 429 to a resumption (``resuming``: it carried ``Last-Event-ID``)
    refuses that id: the next poll goes without it."""
    if status in (404, 405):
        return NO_GET_STREAM
    if resuming and 400 <= status < 500 and status not in (408, 429):
        return POLL_AFRESH
    return POLL_LATER


def expand(text: str, environ: Mapping[str, str]) -> str:
    """``text`` with each ``${NAME}`` replaced by that environment variable
    (raises :class:`MissingVariable` naming the first one that is not set)."""
    if "${" not in text:
        return text

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise MissingVariable(name)
        return environ[name]

    return _VARIABLE.sub(value, text)


def header_safe(value: str) -> bool:
    """Whether a value the server gave, to be sent back in a header (an SSE
    event id as ``Last-Event-ID``, the chosen ``protocolVersion`` as
    ``MCP-Protocol-Version``), can go as it is: printable ASCII with no
    blank at its ends (a header's value; httpx2 encodes them as ASCII).
    One that cannot is not used: no resuming from that id, no version header
    (the SSE standard allows any text but NUL in an id; no server can expect
    its non-ASCII id back intact, as HTTP servers read headers as Latin-1)."""
    return value.isascii() and value.isprintable() and value.strip() == value


def is_session_id(value: str) -> bool:
    """Whether an ``Mcp-Session-Id`` is what the spec allows: visible ASCII
    (0x21 to 0x7E) only."""
    return value.isascii() and value.isprintable() and " " not in value


def may_be_request(data: bytes) -> bool:
    """Whether a message on a POST's stream may be a request of the server's
    (it has a ``"method"``), to hand up with the request it came for
    (broker/wire/frames.py ``OnStream``); notifications among them cost nothing
    more, they are parsed anyway. Cheap and one-sided: an answer whose result
    holds the text ``"method"`` is taken for one too, and is parsed."""
    return data.find(b'"method"') >= 0  # (not `in`: see broker/jsonrpc.py LONG)


def json_body(body: bytes, request: int | str | None) -> tuple[list[bytes], str | None]:
    """The messages of a POST's JSON body, each as its bytes (the body itself
    when it is one), and why they do not answer ``request``, the id of the
    request the POST carried (None: they do, or it carried none).

    The spec has that body be one object, the request's response (in
    2025-03-26, a batch's array). A body of JSON lines (one document a
    line: a notification, then the answer, as some servers write it) is
    read as its lines, as a lenient client reads it. Anything else (a body
    that does not parse, a notification alone, another request's answer,
    an error for no request) leaves the request with no answer to come:
    the link fails it at once rather than leave its caller to wait out the
    timeout.

    An answer to ``request`` in the shape the Upstream cuts unparsed
    (:func:`~broker.wire.envelope.split_answer`) is taken as it is, unparsed
    here too (a large result costs no parse on the way, as on stdio)."""
    if type(request) is int:
        cut = split_answer(body)
        if cut is not None and cut.id == request:
            return [body], None
    messages: list[Any]
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        lines = [line for line in body.splitlines() if line.strip()]
        try:
            messages = [orjson.loads(line) for line in lines] if len(lines) > 1 else []
        except orjson.JSONDecodeError:
            messages = []
        if not messages:
            return [body], None if request is None else f"a JSON body that is not JSON ({exc})"
        frames = lines
    else:
        if isinstance(message, list):
            messages, frames = message, [orjson.dumps(item) for item in message]
        else:
            messages, frames = [message], [body]
    return frames, None if request is None else _not_its_answer(messages, request)


def not_its_answer(data: bytes, request: int | str | None) -> str | None:
    """Why a message on a POST's stream that is no request or notification
    does not answer ``request`` (None: it does, or the POST carried no
    request): cheap for the usual shape (:func:`split_answer`), parsed
    else. A stream's answer to another request leaves the POST's own with
    none to come, as a JSON body's does (:func:`json_body`)."""
    if request is None:
        return None
    cut = split_answer(data) if type(request) is int else None
    if cut is not None:
        found: Any = cut.id
    else:
        try:
            message = orjson.loads(data)
        except orjson.JSONDecodeError:
            return "a message on its stream that is not JSON"
        found = message.get("id") if isinstance(message, dict) else None
    if type(found) is type(request) and found == request:
        return None
    return f"the answer to another request (id {found!r}) on its stream"


def answer_ids(data: bytes) -> list[int | str]:
    """The ids of the answers in a message (a batch's each) that is no
    request or notification, for the link to close the streams of requests
    answered elsewhere than on their own (an answer on the GET stream, or
    on another request's stream): cheap for the usual shape, parsed else."""
    cut = split_answer(data)
    if cut is not None:
        return [cut.id]
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        return []
    messages = message if isinstance(message, list) else [message]
    ids = (m.get("id") for m in messages if isinstance(m, dict) and "method" not in m)
    return [id for id in ids if isinstance(id, int | str) and not isinstance(id, bool)]


def _not_its_answer(messages: list[Any], request: int | str) -> str | None:
    answers = [m for m in messages if isinstance(m, dict) and ("result" in m or "error" in m)]
    if any(answer.get("id") == request for answer in answers):
        return None
    for answer in answers:
        error = answer.get("error")
        if answer.get("id") is None and isinstance(error, dict):
            return f"an error for no request: {error.get('code')} {error.get('message')}"
    if answers:
        return f"the answer to another request (id {answers[0].get('id')!r})"
    return "a JSON body that holds no answer"
