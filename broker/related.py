"""A message for a client that belongs to one of that client's requests.

A server's progress, its log messages and its requests to a client
(sampling, elicitation, roots) are caused by a client request, but on stdio
nothing in a server's request or log message says which. The upstream can
tell when the session has exactly one request at that server (the gate sees
to it that one session at a time has requests at a server that asks
clients things: docs/rules/server-requests.md), and a progress token names
its request. A transport with a stream per request (Streamable HTTP) puts
such a message on that request's stream; it asks for them
(``SessionHandle.related``) and gets them wrapped in :class:`Related`.
Other transports get the message as it is (and :func:`broker.wire.frames.encode`
writes a ``Related`` as its message, should one reach them).
"""

from __future__ import annotations

from typing import Any

from broker.jsonrpc import Message, RequestId
from broker.records import Record


class Related(Record):
    __slots__ = ("message", "request")

    def __init__(self, message: Message, request: RequestId) -> None:
        self.message = message
        self.request = request  # the client's id of the request it belongs to

    def fields(self) -> tuple[Any, ...]:
        return (self.message, self.request)

    def __hash__(self) -> int:
        return hash(self.request)
