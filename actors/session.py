"""The Session actor: one downstream client connection and its MCP session.

Two tasks per client. The reader frames and decodes what the client sends,
runs it through :class:`SessionProtocol` and carries out the actions: local
replies go into the session's own outbound queue, requests go to the inbox of
the Upstream that owns them. The writer drains the outbound queue (where the
Upstreams also deliver responses and notifications), encodes, and writes
whatever is ready in one ``send_all``.

When the client closes its side, the session stops reading, lets the requests
it still has in flight finish for up to :data:`LINGER_SECONDS` (so
``printf '...' | socat - UNIX-CONNECT:...`` gets its answers), then detaches
from its servers, which cancel whatever it still had in flight upstream.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from actors.errors import TransportClosed, map_transport_errors
from actors.fastio import FastIO
from actors.logs import get_logger
from actors.mailbox import SMALL_MESSAGE, Delivery, Outgoing, SessionHandle, open_outbox
from actors.registry import Registry
from actors.server_actor import (
    Attach,
    ClientCancelled,
    ClientLogLevel,
    ClientNotification,
    ClientRequest,
    ClientResponse,
    Detach,
    ServerActor,
)
from broker import jsonrpc
from broker.config import BrokerSettings
from broker.envelope import Bytes
from broker.framing import LineFramer, Oversize
from broker.hello import HelloError, read_hello, resolve_view
from broker.jsonrpc import CONNECTION_CLOSED, JsonRpcError, Message
from broker.session import (
    Action,
    CancelUpstream,
    Defer,
    Forward,
    NotifyUpstreams,
    Phase,
    Reply,
    RespondUpstream,
    SessionProtocol,
    SetLogLevel,
)


@attrs.frozen
class SessionStatistics:
    id: int
    view: tuple[str, ...]
    protocol_version: str | None
    client: Any
    in_flight: int
    outbox: int
    age: float


READ_CHUNK = 256 * 1024
SEND_BUFFER = 1024 * 1024
WRITE_BATCH_BYTES = 1024 * 1024
LINGER_SECONDS = 5.0
SETTLE_TIMEOUT = 10.0  # how long a request waits for the view's servers to start
FLUSH_SECONDS = 5.0
DETACH_TIMEOUT = 5.0


class Session:
    def __init__(
        self,
        stream: trio.abc.Stream,
        upstreams: Mapping[str, ServerActor],
        registry: Registry,
        settings: BrokerSettings,
        control: Callable[[str], Any] | None = None,
    ) -> None:
        self._stream = stream
        self._io = FastIO(stream)
        if isinstance(stream, trio.SocketStream):
            # Room for a large result to leave in one or two sends, best effort.
            with contextlib.suppress(OSError):
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self._upstreams = upstreams
        self._registry = registry
        self._settings = settings
        self._control = control
        self.is_control = False  # a control connection (``mcpbroker status``), not MCP
        self._started = trio.current_time()
        self._outbox_send, self._outbox = open_outbox()
        self._handle = SessionHandle(
            self._outbox_send, trio.CancelScope(), max_bytes=settings.max_queued_bytes
        )
        self._protocol = self._new_protocol(tuple(upstreams))
        self._attached: list[ServerActor] | None = None  # set once initialized
        self._client_closed = False
        self._drained = trio.Event()
        self._log = get_logger(session=self._handle.id)

    @property
    def handle(self) -> SessionHandle:
        return self._handle

    async def run(self) -> None:
        self._log.info("session.opened")
        try:
            with self._handle.cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_loop)
                    await self._read_loop()
                    await self._linger()
                    # Let the writer flush what is queued, then stop: deliveries
                    # that still arrive are dropped (the channel is closed).
                    self._outbox_send.close()
                    nursery.cancel_scope.deadline = trio.current_time() + FLUSH_SECONDS
        finally:
            self._outbox.close()  # what was still queued goes now, not with the last reference
            with trio.CancelScope(shield=True):
                await self._detach()
                await self._stream.aclose()
            self._log.info("session.closed", reason=self._handle.close_reason or "client left")

    # -- reading ------------------------------------------------------------

    async def _read_loop(self) -> None:
        framer = LineFramer(self._settings.max_message_bytes)
        first = True
        while True:
            try:
                with map_transport_errors():
                    data = await self._io.receive_some(READ_CHUNK)
            except TransportClosed:
                return
            if not data:
                return
            # Requests to forward, gathered per server while this chunk is read
            # and sent as one inbox item each: one channel hop per server and
            # chunk, not per request. Anything else first sends what is
            # gathered, so every server hears this session's messages in order.
            forwards: dict[str, list[Message]] = {}
            size = framer.pending + len(data)  # what this read's requests are counted as
            lines, i = framer.feed(data), 0
            while True:
                # The hot path: calls to pass on, as many as come in a row; the
                # line after them is handled here.
                i = self._protocol.take_forwards(lines, i, forwards)
                if i == len(lines):
                    break
                line, i = lines[i], i + 1
                if isinstance(line, Oversize):
                    await self._reply(line.error_response(self._settings.max_message_bytes))
                    continue
                try:
                    message = jsonrpc.decode(line)
                except JsonRpcError as exc:
                    await self._reply(exc.to_response())
                    continue
                if first:
                    first = False
                    command = self._take_hello(message)
                    if command is not None:
                        if command:
                            await self._run_command(command)
                            return
                        continue
                if forwards:
                    await self._send_forwards(forwards, size)
                    forwards.clear()
                for action in self._protocol.receive(message):
                    await self._execute(action)
            if forwards:
                await self._send_forwards(forwards, size)

    async def _send_forwards(self, forwards: dict[str, list[Message]], size: int) -> None:
        for server, messages in forwards.items():
            upstream = self._upstreams.get(server)
            if upstream is None:  # a routing bug, not a client error: say so
                for message in messages:
                    await self._reply(
                        jsonrpc.error_response(
                            message["id"], CONNECTION_CLOSED, f"No server {server!r}"
                        )
                    )
                continue
            await upstream.send(ClientRequest(self._handle, messages, size))

    def _take_hello(self, message: object) -> str | None:
        """Apply a first-line hello: None if the line was MCP, else its command ("" if none)."""
        try:
            hello = read_hello(message)
            if hello is None:
                return None
            if hello.command is not None:
                return hello.command
            view = resolve_view(hello, self._upstreams)
            self._protocol = self._new_protocol(view, transparent=hello.transparent)
        except HelloError as exc:
            self._log.warning("session.bad_hello", error=str(exc))
            self._protocol = self._new_protocol((), refusal=str(exc))
        return ""

    def _new_protocol(self, view: tuple[str, ...], **options: Any) -> SessionProtocol:
        return SessionProtocol(
            view, self._registry, max_in_flight=self._settings.max_in_flight, **options
        )

    async def _run_command(self, command: str) -> None:
        """Answer a control command with one line of JSON; the connection then closes."""
        self.is_control = True
        answer = self._control(command) if self._control else {"error": "no control here"}
        await self._reply(answer)
        self._handle.close_reason = f"answered {command!r}"

    def statistics(self) -> SessionStatistics:
        return SessionStatistics(
            id=self._handle.id,
            view=self._protocol.view,
            protocol_version=self._protocol.protocol_version,
            client=self._protocol.client_info,
            in_flight=len(self._protocol.inflight),
            outbox=self._outbox.statistics().current_buffer_used,
            age=trio.current_time() - self._started,
        )

    async def _execute(self, action: Action) -> None:
        if isinstance(action, Forward):
            await self._send_forwards({action.server: [action.message]}, SMALL_MESSAGE)
        elif isinstance(action, Reply):
            await self._reply(action.message)
            if self._protocol.phase is Phase.OPERATING and self._attached is None:
                await self._attach()
        elif isinstance(action, Defer):
            with trio.move_on_after(SETTLE_TIMEOUT):
                await self._registry.wait_settled(self._protocol.view)
            for again in self._protocol.receive(action.message, settled=True):
                await self._execute(again)
        elif isinstance(action, CancelUpstream):
            for upstream in self._attached or ():
                await upstream.send(ClientCancelled(self._handle, action.params))
        elif isinstance(action, RespondUpstream):
            await self._upstreams[action.server].send(ClientResponse(self._handle, action.message))
        elif isinstance(action, SetLogLevel):
            for upstream in self._attached or ():
                await upstream.send(ClientLogLevel(self._handle, action.level))
        elif isinstance(action, NotifyUpstreams):
            for upstream in self._attached or ():
                await upstream.send(ClientNotification(self._handle, action.message))

    async def _reply(self, message: Outgoing) -> None:
        """Queue an answer of the session's own. Unlike an upstream's delivery it may
        wait for room: the only reader held up is this client's own."""
        await self._handle.send([message], _size_of(message))

    async def _attach(self) -> None:
        """Once initialized: hear from the view's servers and from the Registry."""
        self._attached = [self._upstreams[name] for name in self._protocol.view]
        for upstream in self._attached:
            await upstream.send(Attach(self._handle, self._protocol.client_capabilities))
        await self._registry.subscribe(self._handle, self._protocol.view)

    async def _detach(self) -> None:
        if self._attached is None:
            return
        with trio.move_on_after(DETACH_TIMEOUT):
            await self._registry.unsubscribe(self._handle)
            for upstream in self._attached:
                await upstream.send(Detach(self._handle))

    async def _linger(self) -> None:
        self._client_closed = True
        if self._protocol.inflight:
            with trio.move_on_after(LINGER_SECONDS):
                await self._drained.wait()

    # -- writing ------------------------------------------------------------

    async def _write_loop(self) -> None:
        async for delivery in self._outbox:
            if not await self._write_out(delivery):
                return

    async def _write_out(self, delivery: Delivery) -> bool:
        """Write a delivery and whatever else is ready; False once the client is gone."""
        chunks: list[Bytes] = []
        size = self._protocol.encode_delivery(delivery[0], chunks)
        counted = delivery[1]
        while size < WRITE_BATCH_BYTES:
            try:
                delivery = self._outbox.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            size += self._protocol.encode_delivery(delivery[0], chunks)
            counted += delivery[1]
        if chunks:
            try:
                with map_transport_errors():
                    await self._io.send_all(b"".join(chunks))
            except TransportClosed:
                self._handle.disconnect("client closed the connection")
                return False
        self._handle.written(counted)
        if self._client_closed and not self._protocol.inflight:
            self._drained.set()
        return True


def _size_of(message: Outgoing) -> int:
    """The bytes an answer of the session's own will take on the wire."""
    try:
        return len(jsonrpc.encode(message))
    except TypeError:  # (the writer answers for what it cannot encode)
        return SMALL_MESSAGE
