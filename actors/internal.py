"""Requests the broker makes to servers on its own behalf (catalog fetches).

An :class:`InternalClient` is a session without a connection: it has a
:class:`SessionHandle` like any client, so Upstreams route its responses the
same way, and a task that hands each response to the call waiting for it.
"""

from __future__ import annotations

import itertools
from typing import Any

import trio

from actors.mailbox import SessionHandle
from actors.server_actor import ClientCancelled, ClientRequest, ServerActor
from broker.jsonrpc import JsonRpcError, Message
from broker.wire.envelope import Answer

OUTBOX_SIZE = 1024
ORJSON_DEPTH = 1024  # as deep as orjson reads
CANCEL_TIMEOUT = 1.0


class InternalClient:
    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[Any](OUTBOX_SIZE)
        self.handle = SessionHandle(self._send, trio.CancelScope(), internal=True)
        self._ids = itertools.count(1)
        self._waiting: dict[int, trio.MemorySendChannel[Message]] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for messages, size in self._receive:
            self.handle.written(size)
            for message in messages:
                if isinstance(message, Answer):  # (a list may hold a deep item, left out later)
                    message = message.read(ORJSON_DEPTH)
                if isinstance(message, dict) and "method" not in message:
                    waiter = self._waiting.pop(message.get("id"), None)  # type: ignore[arg-type]
                    if waiter is not None:
                        waiter.send_nowait(message)

    async def call(self, upstream: ServerActor, method: str, params: dict[str, Any]) -> Any:
        """Send one request and return its result; raises JsonRpcError on an error.

        Cancelling the call (a timeout around it) cancels the request upstream.
        """
        id = next(self._ids)
        send, receive = trio.open_memory_channel[Message](1)
        self._waiting[id] = send
        request = {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
        response: Message | None = None
        try:
            await upstream.send(ClientRequest(self.handle, [request]))
            response = await receive.receive()
        finally:
            self._waiting.pop(id, None)
            if response is None:
                with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_TIMEOUT):
                    await upstream.send(ClientCancelled(self.handle, {"requestId": id}))
        if "error" in response:
            error = response["error"]
            if not isinstance(error, dict):  # a server's error is untrusted: this one says nothing
                error = {}
            raise JsonRpcError(error.get("code", 0), error.get("message", "error"))
        return response.get("result")
