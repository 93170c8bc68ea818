"""One downstream MCP session, sans-I/O: lifecycle, local answers, routing.

The broker is the server its clients see. :class:`SessionProtocol` takes each
decoded message a client sends and returns what to do with it:

- :class:`Reply`: answer the client (initialize, ping, every error);
- :class:`Forward`: send the request to the named upstream server;
- :class:`CancelUpstream`: pass a client's ``notifications/cancelled`` on to
  every server the session uses (only the one holding the request acts on it).

Theory of operation: a session starts ``NEW`` and accepts only ``initialize``
and ``ping``. Once it has answered ``initialize`` it is ``OPERATING`` (clients
commonly send requests before ``notifications/initialized``, and the spec's
"SHOULD NOT" there is not worth failing them for). A second ``initialize``
is an error. JSON-RPC batches are accepted only from clients that negotiated
2025-03-26, the one version whose schema has them; their responses are
collected by :class:`BatchCollector` and written as one array.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from broker import jsonrpc
from broker.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    JsonRpcError,
    Kind,
    Message,
    RequestId,
    id_key,
)
from broker.lifecycle import (
    BATCH_VERSIONS,
    broker_capabilities,
    broker_server_info,
    initialize_result,
    negotiate_version,
    read_client_initialize,
)

# Requests a session forwards to the server that owns them.
FORWARDED_METHODS = frozenset(
    {
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "prompts/list",
        "prompts/get",
        "completion/complete",
    }
)
# What an empty view (no servers at all) answers to each list request.
EMPTY_LISTS = {
    "tools/list": "tools",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
    "prompts/list": "prompts",
}


@attrs.frozen
class Reply:
    message: Message | list[Message]


@attrs.frozen
class Forward:
    server: str
    message: Message


@attrs.frozen
class CancelUpstream:
    params: dict[str, Any]


Action = Reply | Forward | CancelUpstream


class Phase(enum.Enum):
    NEW = "new"
    OPERATING = "operating"


class SessionProtocol:
    def __init__(self, view: tuple[str, ...], *, refusal: str | None = None) -> None:
        self.view = view
        # Set when the session cannot be served at all (a hello naming unknown
        # servers): every request is then answered with this error message.
        self.refusal = refusal
        self.phase = Phase.NEW
        # Ids of requests forwarded and not yet answered (the session's in-flight table).
        self.inflight: set[tuple[type, RequestId]] = set()
        self.protocol_version: str | None = None
        self.client_capabilities: dict[str, Any] = {}
        self.client_info: Any = None
        self.batches = BatchCollector()

    # -- input --------------------------------------------------------------

    def receive(self, message: Any) -> list[Action]:
        """Everything one decoded message (object or batch array) leads to."""
        if isinstance(message, list):
            return self._receive_batch(message)
        try:
            return self._receive_one(message)
        except JsonRpcError as exc:
            return [Reply(exc.to_response())]

    def _receive_one(self, message: Any) -> list[Action]:
        kind = jsonrpc.classify(message)
        if kind is Kind.REQUEST:
            return self._request(message)
        if kind is Kind.NOTIFICATION:
            return self._notification(message)
        return []  # a response: the broker sends clients no requests yet

    def _request(self, request: Message) -> list[Action]:
        method, id = request["method"], request["id"]
        if self.refusal is not None:
            raise JsonRpcError(INVALID_PARAMS, f"mcpbroker: {self.refusal}", id=id)
        if method == "ping":
            return [Reply(jsonrpc.result_response(id, {}))]
        if method == "initialize":
            return [Reply(jsonrpc.result_response(id, self._initialize(request)))]
        if method == "server/discover":
            raise JsonRpcError(
                METHOD_NOT_FOUND, "Method not found: server/discover (use initialize)", id=id
            )
        if self.phase is Phase.NEW:
            raise JsonRpcError(
                INVALID_REQUEST, "Session not initialized: send initialize first", id=id
            )
        if method in FORWARDED_METHODS:
            return [self._route(request)]
        raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}", id=id)

    def _initialize(self, request: Message) -> dict[str, Any]:
        id = request["id"]
        if self.phase is not Phase.NEW:
            raise JsonRpcError(INVALID_REQUEST, "Session already initialized", id=id)
        try:
            requested, capabilities, info = read_client_initialize(request.get("params"))
        except JsonRpcError as exc:
            exc.id = id
            raise
        version = negotiate_version(requested)
        self.phase = Phase.OPERATING
        self.protocol_version = version
        self.client_capabilities = capabilities
        self.client_info = info
        return initialize_result(
            version, broker_capabilities(version), broker_server_info(), self._instructions()
        )

    def _instructions(self) -> str | None:
        if not self.view:
            return "mcpbroker: no MCP servers are configured."
        return "mcpbroker shares these MCP servers: " + ", ".join(self.view) + "."

    def _route(self, request: Message) -> Action:
        method = request["method"]
        if len(self.view) == 1:
            self.inflight.add(id_key(request["id"]))
            return Forward(self.view[0], request)
        if not self.view:
            if method in EMPTY_LISTS:
                return Reply(jsonrpc.result_response(request["id"], {EMPTY_LISTS[method]: []}))
            raise JsonRpcError(INVALID_REQUEST, "No MCP servers are configured", id=request["id"])
        raise JsonRpcError(
            INTERNAL_ERROR,
            f"This session sees {len(self.view)} servers; merging their catalogs is not "
            "implemented yet. Connect with --server NAME to use one of them.",
            id=request["id"],
        )

    def _notification(self, message: Message) -> list[Action]:
        method = message["method"]
        if method == "notifications/cancelled":
            params = message.get("params") or {}
            request_id = params.get("requestId")
            if not jsonrpc.is_valid_id(request_id):
                return []
            self.inflight.discard(id_key(request_id))
            actions: list[Action] = [CancelUpstream(params)]
            finished = self.batches.forget(request_id)
            if finished:
                actions.append(Reply(finished))
            return actions
        return []  # initialized, progress, roots/list_changed: nothing to do yet

    def _receive_batch(self, items: list[Any]) -> list[Action]:
        if not items:
            return [Reply(jsonrpc.error_response(None, INVALID_REQUEST, "Empty batch"))]
        if self.protocol_version not in BATCH_VERSIONS:
            return [
                Reply(
                    jsonrpc.error_response(
                        None,
                        INVALID_REQUEST,
                        "JSON-RPC batches are only allowed in protocol version 2025-03-26 "
                        f"(this session negotiated {self.protocol_version or 'none yet'})",
                    )
                )
            ]
        return self.batches.run(items, self._receive_batch_item)

    def _receive_batch_item(self, item: Any) -> list[Action]:
        if isinstance(item, dict) and item.get("method") == "initialize":
            error = JsonRpcError(INVALID_REQUEST, "initialize must not be part of a batch")
            error.id = item.get("id") if jsonrpc.is_valid_id(item.get("id")) else None
            return [Reply(error.to_response())]
        if isinstance(item, list):
            return [Reply(jsonrpc.error_response(None, INVALID_REQUEST, "Nested batch"))]
        return self.receive(item)

    # -- output -------------------------------------------------------------

    def outgoing(self, message: Message | list[Message]) -> Message | list[Message] | None:
        """What to write for a message bound for the client (None: hold it)."""
        if isinstance(message, dict) and "method" not in message:
            id = message.get("id")
            if self.inflight and jsonrpc.is_valid_id(id):
                self.inflight.discard(id_key(id))
            if self.batches.pending:
                return self.batches.collect(message)
        return message


@attrs.define
class _Batch:
    waiting: set[tuple[type, RequestId]]
    responses: list[Message]
    running: bool = True  # still being received: run() sends what is ready at its end


class BatchCollector:
    """Gathers the responses to one batch's requests into one array."""

    def __init__(self) -> None:
        self._by_id: dict[tuple[type, RequestId], _Batch] = {}

    @property
    def pending(self) -> bool:
        return bool(self._by_id)

    def run(self, items: list[Any], receive: Any) -> list[Action]:
        batch = _Batch(set(), [])
        actions: list[Action] = []
        for item in items:
            for action in receive(item):
                message = action.message if isinstance(action, Reply) else None
                if isinstance(message, dict) and message.get("id") is None:
                    batch.responses.append(message)  # an error with no id to match
                else:
                    actions.append(action)
            if isinstance(item, dict) and "method" in item and jsonrpc.is_valid_id(item.get("id")):
                key = id_key(item["id"])
                if key not in self._by_id:
                    batch.waiting.add(key)
                    self._by_id[key] = batch
        batch.running = False
        if not batch.waiting and batch.responses:
            actions.append(Reply(batch.responses))
        return actions

    def forget(self, id: RequestId) -> list[Message] | None:
        """Stop waiting for a cancelled request (its answer may never come).

        Returns the batch's responses if that was the last one it waited for.
        """
        key = id_key(id)
        batch = self._by_id.pop(key, None)
        if batch is None:
            return None
        batch.waiting.discard(key)
        return batch.responses if not batch.waiting and not batch.running else None

    def collect(self, message: Message) -> Message | list[Message] | None:
        id = message.get("id")
        if not jsonrpc.is_valid_id(id):
            return message
        key = id_key(id)
        batch = self._by_id.pop(key, None)
        if batch is None:
            return message
        batch.responses.append(message)
        batch.waiting.discard(key)
        return batch.responses if not batch.waiting else None
