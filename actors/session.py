"""The Session actor: one downstream client connection and its MCP session.

Two tasks per client, over a :class:`~actors.downstream.connection.Connection`
of any transport (actors/downstream/). The reader takes the frames the
client sends, decodes them, runs them through :class:`SessionProtocol` and
carries out the actions: local replies go into the session's own outbound
queue, requests go to the inbox of the Upstream that owns them. The writer
drains the outbound queue (where the Upstreams also deliver responses and
notifications), asks the rules what to write, and hands the connection
whatever is ready at once, which its wire format encodes.

When the client closes its side, the session stops reading, lets the requests
it still has in flight finish for up to :data:`LINGER_SECONDS` (so
``printf '...' | socat - UNIX-CONNECT:...`` gets its answers), answers those
that did not with an error, then detaches from its servers, which cancel
whatever it still had in flight upstream.

The daemon may end a session from its side (:meth:`Session.refuse`, then
:meth:`Session.stop`: the daemon is stopping, or a reload removed the one
server a transparent session used): new requests are answered with an error
saying why, the session stops reading, writes what is queued, answers each
request still in flight with that error, and closes. A reload also changes
the servers a session sees (:meth:`Session.add_server`,
:meth:`Session.drop_server`, :meth:`Session.replace_server`).

A 2026-07-28 client's call that a legacy server asked a question in is
*parked* until the client's retry (broker/eras/session.py); a task of the
session's, started when the first call parks and ended when none is left,
gives up those whose client does not come back within ``broker.inputTimeout``.
"""

from __future__ import annotations

import collections
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from actors.audit import AuditLog
from actors.downstream.connection import Connection
from actors.errors import NotReading, TransportClosed
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
from broker.calls import CallStats, CallTracker
from broker.config import BrokerSettings
from broker.eras.modern import client_era
from broker.eras.session import ModernSessionProtocol, become_modern
from broker.eras.versions import Era
from broker.hello import STOPPING_NOTICE, Opening, open_session
from broker.jsonrpc import CONNECTION_CLOSED, JsonRpcError, Message, error_response
from broker.session import (
    DROP,
    HOLD,
    Action,
    CancelUpstream,
    Defer,
    Forward,
    NotifyUpstreams,
    Reply,
    RespondUpstream,
    SessionProtocol,
    SetLogLevel,
    while_waiting,
)
from broker.session import (
    Attach as AttachServers,
)
from broker.states import SessionState, SessionTrigger
from broker.wire.envelope import answer_id
from broker.wire.frames import Frame, Oversize


@attrs.frozen
class SessionStatistics:
    id: int
    view: tuple[str, ...]
    protocol_version: str | None
    client: Any
    in_flight: int
    outbox: int
    age: float
    transport: str = "unix"
    queued_bytes: int = 0  # delivered to it and not yet written


WRITE_BATCH_BYTES = 1024 * 1024
LINGER_SECONDS = 5.0
SETTLE_TIMEOUT = 10.0  # how long a request waits for the view's servers to start
# What a session waiting for its servers reads ahead, at most, for after the
# wait (then it stops reading until the wait ends): see _wait_for_servers.
HELD_FRAMES = 64
HELD_BYTES = 1024 * 1024  # (a read that passes it is kept whole: then reading stops)
FLUSH_SECONDS = 5.0
DETACH_TIMEOUT = 5.0


class Session:
    def __init__(
        self,
        connection: Connection,
        upstreams: Mapping[str, ServerActor],
        registry: Registry,
        settings: BrokerSettings,
        control: Callable[[str, tuple[str, ...]], Awaitable[Any]] | None = None,
        *,
        view: tuple[str, ...] | None = None,
        transparent: bool = False,
        every: bool = False,
        calls: CallStats | None = None,
        audit: AuditLog | None = None,
        draining: Mapping[str, Sequence[ServerActor]] | None = None,
    ) -> None:
        """``view`` (with ``transparent``) is the servers the transport already
        chose (a WebSocket path names them; ``every``: it chose every server);
        without one, the client may choose with a hello first line
        (broker/hello.py), or sees every server. ``calls`` counts what each
        request came to (for metrics), ``audit`` writes each tool call
        (broker/calls.py); without either, nothing is tracked. ``draining``:
        old actors a reload removed or replaced, by name, while they finish
        their requests (the daemon's: a client's answer to what one asked
        goes to it)."""
        self._connection = connection
        self._upstreams = upstreams
        self._draining = draining if draining is not None else {}
        self._registry = registry
        self._settings = settings
        self._control = control
        self._calls = calls
        self._audit = audit
        self.is_control = False  # a control connection (``mcpbroker status``), not MCP
        self._started = trio.current_time()
        self._outbox_send, self._outbox = open_outbox()
        self._handle = SessionHandle(
            self._outbox_send, trio.CancelScope(), max_bytes=settings.max_queued_bytes
        )
        # A transport with a stream per request wants to know which request a
        # server's message belongs to (broker/related.py).
        self._handle.related = getattr(connection, "related", False)
        bind = getattr(connection, "bind", None)  # (a 2026-07-28 HTTP context: its session)
        if bind is not None:
            bind(self._handle)
        self._hello = view is None  # the first message may be a hello
        # The view is every configured server: a reload's new servers join it.
        self._every = every or view is None
        # The servers a hello named: one a reload removes and adds back rejoins.
        self._named = frozenset(() if self._every else view or ())
        self._refusal: str | None = None  # why new requests are refused (refuse())
        self._refusal_data: dict[str, Any] | None = None  # (and that error's data)
        # The daemon has begun to stop (daemon_stopping()): why, and whether
        # the client asked to be told so (a hello's notices: the shim).
        self._daemon_stopping: str | None = None
        self._notices: frozenset[str] = frozenset()
        self._stopping: str | None = None  # why the daemon ends this session (stop())
        self._unfinished = ""  # what stop() answers the requests still in flight with
        self._reading = trio.CancelScope()  # the read loop's: stop() cancels it
        self._nursery: trio.Nursery | None = None
        # The task that gives up parked calls (_expire_parked): its scope, and
        # the scope it sleeps in until the next deadline (None: not running).
        self._expiring: trio.CancelScope | None = None
        self._parked_timer: trio.CancelScope | None = None
        self._reading_done = False
        if view is None:
            self._protocol = self._new_protocol(tuple(upstreams))
        else:
            self._protocol = self._new_protocol(view, transparent=transparent)
        self._attached: list[ServerActor] | None = None  # set once initialized
        self._capabilities: dict[str, Any] = {}  # the client's, once initialized
        self._deferred: set[Any] = set()  # ids of requests waiting for their servers
        # Reads taken while a request waited for its servers, in order, for
        # the read loop before it reads again (an empty one: the client left).
        self._held: collections.deque[tuple[list[Frame], int]] = collections.deque()
        self._idle = trio.Event()  # set (and renewed) whenever the writer may have made it idle
        self._drained = trio.Event()
        self._log = get_logger(session=self._handle.id)
        # A session per request (a 2026-07-28 POST) logs its opening and closing
        # at debug: at info they were three lines per call.
        self._note = (
            self._log.debug if getattr(connection, "per_request", False) else self._log.info
        )

    def reconfigure(self, settings: BrokerSettings) -> None:
        """New live settings (a reload): the session's limits, from now on."""
        self._settings = settings
        self._handle.max_bytes = settings.max_queued_bytes
        self._protocol.max_in_flight = settings.max_in_flight
        if self._protocol.calls is not None:
            self._protocol.calls.arguments = settings.audit_arguments
        if isinstance(self._protocol, ModernSessionProtocol):  # (calls parked from now on)
            self._protocol.questions.timeout = settings.input_timeout

    @property
    def handle(self) -> SessionHandle:
        return self._handle

    @property
    def idle(self) -> bool:
        """No client's now: a 2026-07-28 HTTP context kept for a next POST
        (actors/downstream/http_modern.py); ``mcpbroker status`` omits it."""
        return bool(getattr(self._connection, "idle", False))

    @property
    def busy(self) -> bool:
        """Whether requests of this session are in flight (or wait for their servers)."""
        return bool(self._protocol.inflight or self._deferred)

    async def wait_idle(self) -> None:
        """Wait until no request of this session is in flight (the writer looks
        after each write) or the session ended."""
        while self.busy and self._protocol.state not in (SessionState.CLOSED, SessionState.ERROR):
            await self._idle.wait()

    async def run(self) -> None:
        self._note("session.opened")
        try:
            with self._handle.cancel_scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._write_loop)
                    with self._reading:
                        await self._read_loop()
                    await self._linger()
                    self._reading_done = True  # (parked calls end with the session)
                    if self._expiring is not None:
                        self._expiring.cancel()
                    # Let the writer flush what is queued, then stop: deliveries
                    # that still arrive are dropped (the channel is closed).
                    self._outbox_send.close()
                    nursery.cancel_scope.deadline = trio.current_time() + FLUSH_SECONDS
        finally:
            self._outbox.close()  # what was still queued goes now, not with the last reference
            with trio.CancelScope(shield=True):
                await self._detach()
                await self._connection.aclose()
            self._protocol.move(SessionTrigger.ENDED)
            if self._protocol.calls is not None:
                self._protocol.calls.now = trio.current_time()
                self._protocol.calls.closed()  # what it still had in flight: cancelled
                self._write_audit()
            self._idle.set()
            self._note("session.closed", reason=self._handle.close_reason or "client left")

    # -- reading ------------------------------------------------------------

    async def _read_loop(self) -> None:
        while True:
            if self._held:
                frames, size = self._held.popleft()
            else:
                try:
                    frames, size = await self._connection.receive()
                except TransportClosed:
                    return
            if not frames:
                return
            calls = self._protocol.calls
            if calls is not None:
                calls.now = trio.current_time()
            # Requests to forward, gathered per server while these frames are
            # read and sent as one inbox item each: one channel hop per server
            # and read, not per request (each counted as the read's ``size``).
            # Anything else first sends what is gathered, so every server hears
            # this session's messages in order.
            forwards: dict[str, list[Message]] = {}
            i = 0
            while True:
                # The hot path: calls to pass on, as many as come in a row; the
                # frame after them is handled here.
                i = self._protocol.take_forwards(frames, i, forwards)
                if i == len(frames):
                    break
                frame, i = frames[i], i + 1
                if isinstance(frame, Oversize):
                    await self._reply(self._too_large(frame))
                    continue
                try:
                    message = jsonrpc.decode(frame)
                except JsonRpcError as exc:
                    await self._reply(exc.to_response())
                    continue
                if self._hello:
                    opening = open_session(message, self._upstreams)
                    # A shim's hello that names no servers (only the notices it
                    # takes) may be followed by its host's own, which decides:
                    # a command, or servers (`... | mcpbroker connect`).
                    self._hello = _bare(opening) and not self._notices
                    if opening is not None and opening.command is not None:
                        await self._run_command(opening.command, opening.view)
                        return
                    if opening is not None:
                        self._notices |= opening.notices
                    if self._daemon_stopping is not None:
                        self.daemon_stopping(self._daemon_stopping)  # (decided now)
                    if opening is not None:
                        self._open(opening)
                        continue
                if forwards:
                    await self._send_forwards(forwards, size)
                    forwards.clear()
                if self._protocol.state is SessionState.CONNECTING and (
                    client_era(message) is Era.MODERN
                ):  # a 2026-07-28 client: no handshake (broker/eras/session.py)
                    self._protocol = become_modern(
                        self._protocol, secrets.token_bytes(32), self._settings.input_timeout
                    )
                for action in self._protocol.receive(message):
                    await self._execute(action)
                await self._after_rules()  # (a retry parks again; a cancel lowers a level)
            if forwards:
                await self._send_forwards(forwards, size)
            self._write_audit()  # (calls the client cancelled)

    def _too_large(self, frame: Oversize) -> Message:
        """The error for a message over the limit: in its id, where its ends
        show one (as the SDKs write a request, ``{"jsonrpc":"2.0","id":N,``)
        that no request in flight has; else with id null (a host waited for
        an answer to its request until its own timeout)."""
        error = frame.error_response(self._settings.max_message_bytes)
        id = answer_id(frame.head, frame.tail)
        protocol = self._protocol
        if id is not None and id not in protocol.inflight and id not in protocol.streams:
            error["id"] = id
        return error

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

    def _open(self, opening: Opening) -> None:
        if opening.refusal is not None:
            self._log.warning("session.bad_hello", error=opening.refusal)
        self._every = every = opening.every
        self._named = frozenset(() if every else opening.view)
        self._protocol = self._new_protocol(
            opening.view,
            transparent=opening.transparent,
            refusal=opening.refusal,
            refusal_data=opening.refusal_data,
        )

    def _new_protocol(self, view: tuple[str, ...], **options: Any) -> SessionProtocol:
        protocol = SessionProtocol(
            view, self._registry, max_in_flight=self._settings.max_in_flight, **options
        )
        if self._calls is not None or self._audit is not None:
            protocol.calls = CallTracker(
                self._calls or CallStats(),
                audit=self._audit is not None,
                arguments=self._settings.audit_arguments,
            )
            protocol.calls.now = trio.current_time()  # (a hello's read goes on with it)
        if self._refusal is not None:
            protocol.refusal, protocol.refusal_code = self._refusal, CONNECTION_CLOSED
            protocol.refusal_data = self._refusal_data
        return protocol

    def _write_audit(self) -> None:
        """Write the tool calls that ended to the audit log (if there is one)."""
        calls = self._protocol.calls
        if calls is None or not calls.records:
            return
        records, calls.records = calls.records, []
        if self._audit is not None:
            self._audit.write(records, self._handle.id, self._protocol.client_info)

    # -- what the daemon changes (a reload, a shutdown) ------------------------

    def refuse(self, reason: str, data: dict[str, Any] | None = None) -> None:
        """From now on answer every new request with an error saying ``reason``
        (-32000, with ``data`` if given); answers to the requests in flight
        still come through."""
        self._refusal, self._refusal_data = reason, data
        self._protocol.refusal, self._protocol.refusal_code = reason, CONNECTION_CLOSED
        self._protocol.refusal_data = data

    def daemon_stopping(self, reason: str) -> None:
        """The daemon has begun to stop. A client that asked for the notice
        (the shim's hello) is told, and served on: it sends nothing new from
        now on (it holds its host's requests for the next daemon), so what it
        sent before it heard is answered, not refused. Any other client's new
        requests are refused (``reason``). Before the first message, that
        message decides (it may be a hello)."""
        self._daemon_stopping = reason
        if self._hello:
            return
        if "stopping" in self._notices:
            self._handle.deliver(STOPPING_NOTICE)
        else:
            self.refuse(reason)

    def stop(self, reason: str, unfinished: str | None = None) -> None:
        """End the session from the daemon's side: stop reading, write what is
        queued, answer each request still in flight with an error saying
        ``unfinished`` (or ``reason``), tell the client ``reason`` (a log
        message, level error: the only word MCP has for it), detach and close
        (bounded: ``FLUSH_SECONDS``)."""
        if self._refusal is None:
            self.refuse(reason)
        self._stopping = reason
        self._unfinished = unfinished or reason
        if self._handle.close_reason is None:
            self._handle.close_reason = reason
        self._reading.cancel()

    def add_server(self, name: str, order: tuple[str, ...]) -> bool:
        """A reload added ``name``: a session that sees every server sees it too
        (in ``order``, the configuration's), and hears from it once initialized;
        so does one whose hello named it (a reload removed or disabled it, and
        now it is back). Returns whether it joined this session's view."""
        self._protocol.wait_again(name)
        joins = self._every or name in self._named
        if not joins or name in self._protocol.view or self._protocol.transparent:
            return False
        wanted = {*self._protocol.view, name}
        self._protocol.view = tuple(server for server in order if server in wanted)
        self._attach_later(name)
        return True

    def drop_server(self, name: str) -> bool:
        """A reload removed ``name``: it leaves the view. Returns True for a
        transparent session on it, which cannot go on: it is refused from now on,
        and the daemon stops it once the server's requests in flight are answered."""
        self._protocol.wait_again(name)
        if name not in self._protocol.view:
            return False
        if self._protocol.transparent:
            # (the error of its requests in flight, actors/upstream.py retire())
            data = {"server": name, "retryable": False}
            self.refuse(f"MCP server {name!r} was removed from the configuration", data)
            return True
        self._protocol.view = tuple(server for server in self._protocol.view if server != name)
        if self._attached is not None:
            self._attached = [up for up in self._attached if up.name != name]
        return False

    def replace_server(self, name: str) -> None:
        """A reload restarted ``name`` with a new actor: hear from that one
        (and wait for it again, if a request of this session waited it out)."""
        self._protocol.wait_again(name)
        if name in self._protocol.view and self._attached is not None:
            self._attached = [up for up in self._attached if up.name != name]
            self._attach_later(name)

    def _attach_later(self, name: str) -> None:
        """Attach to a server that joined the view (once initialized; a session
        that initializes later attaches to its whole view then)."""
        if self._attached is None or self._nursery is None:
            return
        upstream = self._upstreams[name]
        self._attached.append(upstream)
        self._nursery.start_soon(self._attach_one, upstream, self._protocol.view)

    async def _attach_one(self, upstream: ServerActor, view: tuple[str, ...]) -> None:
        info = self._protocol.client_info
        await upstream.send(Attach(self._handle, self._capabilities, self._modern, info))
        await self._registry.subscribe(self._handle, view, self._protocol.transparent)

    @property
    def _modern(self) -> bool:
        """A 2026-07-28 client: its requests carry their own ``_meta``."""
        return isinstance(self._protocol, ModernSessionProtocol)

    async def _run_command(self, command: str, servers: tuple[str, ...]) -> None:
        """Answer a control command (about ``servers``, if it names some) with
        one line of JSON; the connection then closes."""
        self.is_control = True
        answer = (
            await self._control(command, servers) if self._control else {"error": "no control here"}
        )
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
            transport=self._connection.transport,
            queued_bytes=self._handle.queued_bytes,
        )

    async def _execute(self, action: Action) -> None:
        if isinstance(action, Forward):
            await self._send_forwards({action.server: [action.message]}, SMALL_MESSAGE)
        elif isinstance(action, Reply):
            await self._reply(action.message)
        elif isinstance(action, AttachServers):
            await self._attach(action)
        elif isinstance(action, Defer):
            if await self._wait_for_servers(action.message):
                for again in self._protocol.receive(action.message, settled=True):
                    await self._execute(again)
        elif isinstance(action, CancelUpstream):
            for upstream in self._attached or ():
                await upstream.send(ClientCancelled(self._handle, action.params))
        elif isinstance(action, RespondUpstream):
            # (none: a reload removed the server that asked, and answered its
            # calls: a parked one's retry gets that answer)
            for asker in self._askers(action.server):
                await asker.send(ClientResponse(self._handle, action.message))
        elif isinstance(action, SetLogLevel):
            for upstream in self._attached or ():
                await upstream.send(ClientLogLevel(self._handle, action.level))
        elif isinstance(action, NotifyUpstreams):
            for upstream in self._attached or ():
                await upstream.send(ClientNotification(self._handle, action.message))

    def _askers(self, server: str) -> list[ServerActor]:
        """Who may have asked the client what it answers under ``server``'s
        name: the server's actor, and the old ones a reload is retiring
        (their processes still ask while they drain). Each takes only the
        ids it gave (they are never alike: broker/server_requests.py), and
        drops the rest."""
        current = self._upstreams.get(server)
        old = self._draining.get(server, ())
        return [*old] if current is None else [current, *old]

    async def _wait_for_servers(self, request: Message) -> bool:
        """Wait (at most ``SETTLE_TIMEOUT``) for the view's servers to settle
        before ``request`` is tried again (those a request of the session
        already waited for in vain are not waited for again). The session reads on meanwhile,
        keeping what it reads in order for after the wait (at most
        ``HELD_FRAMES``), but for what may not wait: a ping is answered, a
        cancel of a request in flight is passed on, and a cancel of this
        request ends the wait (it is then never tried: no answer is due).
        False: it was cancelled."""
        waiting = _Waiting(request.get("id"))
        self._deferred.add(waiting.id)  # (stop() answers it, if it comes meanwhile)
        with trio.move_on_after(SETTLE_TIMEOUT) as timer:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_while_waiting, waiting, nursery.cancel_scope)
                await self._registry.wait_settled(self._protocol.awaited())
                nursery.cancel_scope.cancel()
        if timer.cancelled_caught:  # (no request of the session waits for them again)
            self._protocol.waited_in_vain(self._registry.current)
        self._deferred.discard(waiting.id)
        return not waiting.dropped

    async def _read_while_waiting(self, waiting: _Waiting, scope: trio.CancelScope) -> None:
        held = held_bytes = 0
        while held < HELD_FRAMES and held_bytes < HELD_BYTES:
            try:
                frames, size = await self._connection.receive()
            except TransportClosed:
                frames, size = [], 0
            if not frames:
                # The client's end, for after the wait: it may have closed only
                # its sending side, and still read the answer (printf | connect).
                self._held.append(([], 0))
                return
            kept = [frame for frame in frames if not await self._at_once(frame, waiting)]
            if kept:
                self._held.append((kept, size))
                held, held_bytes = held + len(kept), held_bytes + size
            if waiting.dropped:
                scope.cancel()
                return

    async def _at_once(self, frame: Frame, waiting: _Waiting) -> bool:
        """Whether ``frame``, read while a request waits for its servers, was
        taken now: a ping (answered), a cancel of that request (the wait
        ends) or of one in flight (passed on). Anything else waits its turn."""
        if type(frame) is not bytes:
            return False
        try:
            message = jsonrpc.decode(frame)
        except JsonRpcError:
            return False
        what = while_waiting(message, waiting.id, self._protocol.inflight)
        if what == DROP:
            waiting.dropped = True
            return True
        if what == HOLD:
            return False
        for action in self._protocol.receive(message):
            await self._execute(action)
        await self._after_rules()
        return True

    async def _reply(self, message: Outgoing) -> None:
        """Queue an answer of the session's own. Unlike an upstream's delivery it may
        wait for room: the only reader held up is this client's own."""
        await self._handle.send([message], _size_of(message))

    async def _attach(self, action: AttachServers) -> None:
        """Once initialized: hear from the view's servers and from the Registry."""
        info = self._protocol.client_info if isinstance(self._protocol.client_info, dict) else {}
        self._note(
            "session.initialized",
            client=info.get("name"),
            client_version=info.get("version"),
            protocol_version=self._protocol.protocol_version,
            view=list(action.view),
            transport=self._connection.transport,
        )
        self._capabilities = action.capabilities
        # (a server a reload removed meanwhile is no longer there to hear)
        self._attached = [self._upstreams[name] for name in action.view if name in self._upstreams]
        info = self._protocol.client_info
        for upstream in self._attached:
            await upstream.send(Attach(self._handle, action.capabilities, self._modern, info))
        await self._registry.subscribe(self._handle, action.view, self._protocol.transparent)

    async def _detach(self) -> None:
        if self._attached is None:
            return
        with trio.move_on_after(DETACH_TIMEOUT):
            await self._registry.unsubscribe(self._handle)
            for upstream in self._attached:
                await upstream.send(Detach(self._handle))

    async def _linger(self) -> None:
        """The client closed its input: what it has in flight may finish for
        up to :data:`LINGER_SECONDS`; what does not is answered with an error
        (its output may still be open: ``socat``, a shim that does not resume),
        as a stop's is, then cancelled upstream."""
        self._protocol.move(SessionTrigger.CLIENT_CLOSED)
        if self._protocol.inflight and self._stopping is None:
            with trio.move_on_after(LINGER_SECONDS):
                await self._drained.wait()
            if self._protocol.inflight and self._stopping is None:
                self._stopping = self._unfinished = (
                    f"the client closed its input, and its request did not finish "
                    f"within {LINGER_SECONDS:g} s of that (cancelled)"
                )
                if self._handle.close_reason is None:
                    self._handle.close_reason = "client left with requests unfinished"

    # -- parked calls (a 2026-07-28 client's, at a legacy server) ---------------

    def _arm_parked(self) -> None:
        """Start the clock of the calls parked since the last look, and the
        task that gives them up if it is not running (or wake it earlier)."""
        protocol = self._protocol
        assert isinstance(protocol, ModernSessionProtocol)
        deadline = protocol.arm_parked(trio.current_time())
        if deadline is None or self._reading_done or self._nursery is None:
            return
        if self._expiring is None:
            self._expiring = trio.CancelScope()
            self._nursery.start_soon(self._expire_parked, protocol, self._expiring)
        elif self._parked_timer is not None and deadline < self._parked_timer.deadline:
            self._parked_timer.deadline = deadline  # (a reload shortened inputTimeout)

    async def _expire_parked(
        self, protocol: ModernSessionProtocol, scope: trio.CancelScope
    ) -> None:
        """Give up each parked call whose client did not come back in time
        (broker/eras/bridge.py, ``AnsweringServers.expire``): cancelled
        upstream, the server's questions answered with errors. Ends when no
        call is parked (the next one starts it again) or the session ends."""
        with scope:
            while True:
                deadline = protocol.questions.next_deadline()
                if deadline is None:
                    break
                with trio.CancelScope(deadline=deadline) as self._parked_timer:
                    await trio.sleep_forever()
                self._parked_timer = None
                if protocol.calls is not None:
                    protocol.calls.now = trio.current_time()
                actions = protocol.expire_parked(trio.current_time())
                expired = sum(isinstance(action, CancelUpstream) for action in actions)
                if expired:
                    self._log.info("session.input_expired", calls=expired)
                for action in actions:
                    await self._execute(action)
                self._write_audit()
        self._expiring = self._parked_timer = None

    # -- writing ------------------------------------------------------------

    async def _write_loop(self) -> None:
        async for delivery in self._outbox:
            if not await self._write_out(delivery):
                return
        if self._stopping is not None:
            await self._say_goodbye(self._stopping)

    async def _say_goodbye(self, reason: str) -> None:
        """The daemon ends the session: its open streams end (2026-07-28
        listens get their results), what is still in flight gets an error,
        and an initialized client a last log message saying why. (Only once the
        outbox is closed and drained, so no answer can follow.)"""
        last: list[Outgoing] = [*self._protocol.end_streams()]
        last += [
            error_response(id, CONNECTION_CLOSED, f"mcpbroker: {self._unfinished}")
            for id in sorted({*self._protocol.inflight, *self._deferred}, key=str)
        ]
        if self._protocol.protocol_version is not None:
            params = {"level": "error", "logger": "mcpbroker", "data": f"mcpbroker: {reason}"}
            last.append(jsonrpc.notification("notifications/message", params))
        out: list[Outgoing] = []
        self._protocol.take_outgoing(last, out)
        with contextlib.suppress(TransportClosed):
            await self._connection.send(out)

    async def _after_rules(self) -> None:
        """What a modern session's rules left the actor after a read or a
        write (``bridge_pending``: nearly always nothing): the clocks of calls
        parked since, answers to servers' questions, and its log level, if an
        answer or a cancel lowered it."""
        protocol = self._protocol
        if not isinstance(protocol, ModernSessionProtocol) or not protocol.bridge_pending():
            return
        self._arm_parked()
        for server, answer in protocol.take_upstream_answers():
            for upstream in self._askers(server):
                await upstream.send(ClientResponse(self._handle, answer))
        changed, level = protocol.take_level_change()
        if changed:
            for upstream in self._attached or ():
                await upstream.send(ClientLogLevel(self._handle, level))

    async def _write_out(self, delivery: Delivery) -> bool:
        """Write a delivery and whatever else is ready; False once the client is gone."""
        out: list[Outgoing] = []
        calls = self._protocol.calls
        if calls is not None:
            calls.now = trio.current_time()
        self._protocol.take_outgoing(delivery[0], out)
        counted = delivery[1]
        while counted < WRITE_BATCH_BYTES:
            try:
                delivery = self._outbox.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            self._protocol.take_outgoing(delivery[0], out)
            counted += delivery[1]
        protocol = self._protocol  # (the test in line: no coroutine per write)
        if isinstance(protocol, ModernSessionProtocol) and protocol.bridge_pending():
            await self._after_rules()  # (an answer input_required parks its call)
        if out:
            try:
                await self._connection.send(out)
            except NotReading as exc:  # (the transport cut it off)
                self._handle.disconnect(str(exc))
                return False
            except TransportClosed:
                self._handle.disconnect("client closed the connection")
                return False
        self._handle.written(counted)
        if calls is not None and calls.records:
            self._write_audit()
        if self._protocol.state is SessionState.CLOSING and not self._protocol.inflight:
            self._drained.set()
        if self._idle.statistics().tasks_waiting:
            self._idle.set()
            self._idle = trio.Event()
        return True


@attrs.define
class _Waiting:
    """A request waiting for its servers (Session._wait_for_servers)."""

    id: Any
    dropped: bool = False  # cancelled by its client


def _size_of(message: Outgoing) -> int:
    """The bytes an answer of the session's own will take on the wire."""
    try:
        return len(jsonrpc.encode(message))
    except TypeError:  # (the writer answers for what it cannot encode)
        return SMALL_MESSAGE


def _bare(opening: Opening | None) -> bool:
    """A hello that only asks for notices (the shim's, run without servers)."""
    return (
        opening is not None
        and bool(opening.notices)
        and opening.every
        and opening.command is None
        and opening.refusal is None
    )
