"""The Upstream actor: one stdio MCP server process, shared by every session.

Three kinds of task serve it:

- the dispatcher takes client requests, cancellations and session arrivals
  and departures from the inbox (one bounded channel, so a session that
  outpaces the server waits), rewrites them with :class:`UpstreamProtocol`
  and writes what is ready (up to :data:`DISPATCH_BATCH` items) in one
  ``send_all``;
- the reader turns the server's stdout into responses and notifications and
  delivers them with :meth:`SessionHandle.deliver`, which never waits;
- the supervisor starts the process, runs the ``initialize`` handshake, and
  when the process dies fails every request in flight with an error naming
  the server, then restarts it with exponential backoff.

A request that arrives while the server is starting waits for the handshake;
one that arrives while it is down is answered at once with an error.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Hashable
from typing import Any, cast

import trio

from actors.errors import TransportClosed, map_transport_errors
from actors.fastio import FastIO
from actors.logs import get_logger
from actors.mailbox import Outgoing, SessionHandle
from actors.process import Launcher, LaunchError, ServerLink, launch_stdio
from actors.server_actor import (
    Attach,
    ClientCancelled,
    ClientLogLevel,
    ClientNotification,
    ClientRequest,
    ClientResponse,
    InboxItem,
    ServerEvent,
    Status,
    UpstreamStatistics,
)
from broker import jsonrpc
from broker.config import BrokerSettings, ServerConfig
from broker.framing import LineFramer, Oversize
from broker.jsonrpc import INTERNAL_ERROR, JsonRpcError, Message
from broker.lifecycle import HandshakeError
from broker.timeouts import TimeoutPolicy
from broker.upstream import (
    Action,
    Broadcast,
    Deliver,
    ListChanged,
    Ready,
    SendUpstream,
    UpstreamProtocol,
    Warn,
)

INBOX_SIZE = 256
# Inbox items (each one session's requests from one read) written to the
# server together at most. Everything ready in one write costs the fewest
# system calls but makes the server wait for the whole batch and the broker
# then wait for the server's whole answer; a few items a write keep both
# busy (benchmarks/README.md: the daemon went from 93% to 100% of a core at
# 64 clients x 16, and throughput up about a tenth).
DISPATCH_BATCH = 8
READ_CHUNK = 256 * 1024
STDERR_LINE_LIMIT = 64 * 1024
STARTUP_TIMEOUT = 30.0
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0
EXIT_CODE_WAIT = 0.5  # after stdout closes, how long to wait for the exit code
STABLE_AFTER = 10.0  # a process that lived this long resets the backoff
# Messages of the broker's own (ping replies, cancellations) that may wait for
# a server to read them. A server that sends requests while it does not read
# its input would otherwise grow that queue without end: past this, it is
# taken as stuck, stopped and restarted.
CONTROL_LIMIT = 4096


_NOT_YET = (Status.IDLE, Status.STARTING)


class Upstream:
    def __init__(
        self,
        name: str,
        config: ServerConfig,
        settings: BrokerSettings,
        launch: Launcher | None = None,
        *,
        lazy: bool = False,
        events: trio.MemorySendChannel[Any] | None = None,
        numbering: tuple[int, int] = (1, 1),
    ) -> None:
        self.name = name
        self.config = config
        self.settings = settings
        self._launch: Launcher = launch or functools.partial(launch_stdio, config)
        timeout = config.timeout or settings.request_timeout
        self._timeouts = TimeoutPolicy(timeout, max(timeout, settings.max_request_timeout))
        self._inbox_send, self._inbox = trio.open_memory_channel[InboxItem](INBOX_SIZE)
        # Items sent and not yet handled (a channel hands an item straight to a
        # waiting receiver, so its buffer alone undercounts).
        self._queued = 0
        self._requests = 0
        self._timeouts_count = 0
        self._protocol = UpstreamProtocol(name, self._timeouts, numbering)
        self._status = Status.IDLE if lazy else Status.STARTING
        self._status_changed = trio.Event()
        self._start_requested = trio.Event()
        if not lazy:
            self._start_requested.set()
        self.events = events
        self._stdin: FastIO | None = None
        self._write_lock = trio.StrictFIFOLock()
        self._control_out: list[Message] = []  # see _write_soon
        self._control_writing = False
        self._abandoned: str | None = None  # why the broker stopped this process, if it did
        self._process_nursery: trio.Nursery | None = None
        self._pid: int | None = None
        self._restarts = 0
        self._log = get_logger(server=name)

    # -- the actor's public face -------------------------------------------

    async def send(self, item: InboxItem) -> None:
        count = _count(item)
        self._queued += count
        try:
            self._inbox_send.send_nowait(item)  # no checkpoint when there is room
        except trio.WouldBlock:
            await self._inbox_send.send(item)
        except BaseException:
            self._queued -= count
            raise

    @property
    def status(self) -> Status:
        return self._status

    @property
    def identity(self) -> Any:
        return self._protocol.identity

    def statistics(self) -> UpstreamStatistics:
        return UpstreamStatistics(
            name=self.name,
            status=self._status.value,
            pid=self._pid,
            restarts=self._restarts,
            sessions=len(self._protocol.sessions),
            in_flight=len(self._protocol.requests),
            inbox=self._inbox.statistics().current_buffer_used,
            last_error=self._protocol.last_error,
            requests=self._requests,
            timeouts=self._timeouts_count,
        )

    @property
    def load(self) -> int:
        """Requests in flight or waiting: how busy this instance is (for pools)."""
        return len(self._protocol.requests) + self._queued

    def request_start(self) -> None:
        """Start a lazy server now (it is needed). Harmless if it already runs."""
        self._start_requested.set()

    async def wait_ready(self) -> None:
        """Wait until the server has finished its handshake (for tests and tools)."""
        while self._status is not Status.READY:
            await self._status_changed.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._dispatch)
            task_status.started()
            await self._supervise()

    # -- dispatcher ---------------------------------------------------------

    async def _dispatch(self) -> None:
        async for first in self._inbox:
            batch = [first]
            while len(batch) < DISPATCH_BATCH:
                try:
                    batch.append(self._inbox.receive_nowait())
                except trio.WouldBlock:
                    break
            out: list[Message] = []
            now = trio.current_time()
            for item in batch:
                if isinstance(item, ClientRequest) and self._status in _NOT_YET:
                    await self._write(out)
                    out = []
                    await self._wait_not_starting()
                    now = trio.current_time()
                try:
                    out.extend(self._handle(item, now))
                except Exception:  # a bug of the broker's: this item only, not the daemon
                    self._log.exception("server.inbox_item_failed", item=type(item).__name__)
                self._queued -= _count(item)
            await self._write(out)

    def _handle(self, item: InboxItem, now: float) -> list[Message]:
        protocol = self._protocol
        if isinstance(item, ClientRequest):
            return self._forward(item.session, item.messages, now)
        if isinstance(item, ClientCancelled):
            out = protocol.client_cancelled(item.session, item.params)
        elif isinstance(item, ClientResponse):
            out = protocol.client_response(item.session, item.message)
        elif isinstance(item, ClientNotification):
            out = protocol.client_notification(item.session, item.message)
        elif isinstance(item, Attach):
            protocol.attach(item.session, item.capabilities)
            return []
        elif isinstance(item, ClientLogLevel):
            return self._split(protocol.client_log_level(item.session, item.level))
        else:
            return protocol.session_closed(item.session)
        return [] if out is None else [out]

    def _forward(
        self, session: SessionHandle, requests: list[Message], now: float
    ) -> list[Message]:
        self._requests += len(requests)
        protocol = self._protocol
        out: list[Message] = []
        i = 0
        while True:
            # The hot path: the requests, rewritten, as many as come in a row;
            # the one after them is handled here.
            i = protocol.take_requests(session, requests, i, out, now)
            if i == len(requests):
                return out
            request, i = requests[i], i + 1
            try:
                out += self._split(protocol.client_request(session, request, now))
            except JsonRpcError as exc:
                session.deliver(exc.to_response())
            except Exception:  # a bug of the broker's: answer this request, go on
                self._log.exception("server.request_failed", method=request.get("method"))
                session.deliver(
                    jsonrpc.error_response(
                        request.get("id"),
                        INTERNAL_ERROR,
                        "mcpbroker: internal error while forwarding this request "
                        "(the daemon's log has the details)",
                    )
                )

    def _split(self, actions: list[Action]) -> list[Message]:
        """Carry out every action but the writes, and return the messages to write."""
        out = [action.message for action in actions if isinstance(action, SendUpstream)]
        if len(out) != len(actions):
            self._apply([action for action in actions if not isinstance(action, SendUpstream)])
        return out

    async def _write(self, messages: list[Message]) -> None:
        if not messages:
            return
        data = b"".join(map(jsonrpc.encode, messages))
        try:
            self._write_lock.acquire_nowait()  # no checkpoint when nobody else writes
        except trio.WouldBlock:
            await self._write_lock.acquire()
        try:
            stdin = self._stdin
            if stdin is None:
                return  # the process is gone; the reader has failed what was in flight
            try:
                with map_transport_errors():
                    await stdin.send_all(data)
            except TransportClosed:
                pass  # likewise: the reader sees the exit
        finally:
            self._write_lock.release()

    def _write_soon(self, message: Message) -> None:
        """Write a message of the broker's own (a ping reply, a cancellation) without
        waiting: the reader and the timer must never block on the server's stdin.

        Messages queue here while one writer task writes them, so a server that
        floods the broker with requests costs a list, not a task per message;
        one that does so without reading is stopped (:data:`CONTROL_LIMIT`).
        """
        assert self._process_nursery is not None
        if len(self._control_out) >= CONTROL_LIMIT:
            self._abandoned = (
                f"stopped reading its input ({CONTROL_LIMIT} messages of the broker's "
                "own were waiting for it)"
            )
            self._process_nursery.cancel_scope.cancel()
            return
        self._control_out.append(message)
        if not self._control_writing:
            self._control_writing = True
            self._process_nursery.start_soon(self._write_control)

    async def _write_control(self) -> None:
        try:
            while self._control_out:
                messages, self._control_out = self._control_out, []
                await self._write(messages)
        finally:
            self._control_writing = False

    async def _wait_not_starting(self) -> None:
        self.request_start()
        while self._status in _NOT_YET:
            await self._status_changed.wait()

    def _set_status(self, status: Status) -> None:
        self._status = status
        self._status_changed.set()
        self._status_changed = trio.Event()
        self._emit(ServerEvent(self.name, status=status))

    def _emit(self, event: ServerEvent) -> None:
        if self.events is None:
            return
        try:
            self.events.send_nowait(event)
        except trio.WouldBlock:
            self._log.error("server.event_dropped", event=repr(event), reason="registry busy")

    # -- supervisor ---------------------------------------------------------

    async def _supervise(self) -> None:
        await self._start_requested.wait()
        backoff = BACKOFF_INITIAL
        while True:
            started = trio.current_time()
            try:
                await self._run_process()
            except LaunchError as exc:  # retrying cannot help: say so once, then wait
                self._went_down(str(exc))
                await trio.sleep_forever()
            if trio.current_time() - started >= STABLE_AFTER:
                backoff = BACKOFF_INITIAL
            self._log.warning(
                "server.restart_scheduled", delay=backoff, error=self._protocol.last_error
            )
            await trio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)
            self._restarts += 1

    async def _run_process(self) -> None:
        self._protocol = self._protocol.restarted()
        self._set_status(Status.STARTING)
        try:
            link = await self._launch()
        except OSError as exc:
            self._went_down(f"could not be started ({exc.strerror or exc}: {self.config.command})")
            return
        self._pid = link.pid
        self._log.info("server.started", pid=link.pid, command=self.config.command)
        try:
            try:
                reason = await self._serve_link(link)
            except Exception as exc:  # a bug of the broker's: restart this server, not the daemon
                self._log.exception("server.handling_failed")
                reason = f"was stopped after an internal error of the broker ({type(exc).__name__})"
            self._stdin = None
            with trio.move_on_after(EXIT_CODE_WAIT):
                code = await link.wait()
                if code is not None:
                    reason += f" with code {code}"
            self._went_down(reason)
        finally:
            self._stdin = None
            with trio.CancelScope(shield=True):
                await link.close()
            self._pid = None

    async def _serve_link(self, link: ServerLink) -> str:
        reason = f"did not answer initialize within {STARTUP_TIMEOUT:g} s"
        async with trio.open_nursery() as nursery:
            self._process_nursery = nursery
            self._control_out = []  # anything left was for the previous process
            self._abandoned = None
            self._stdin = FastIO(link.send_stream)
            if link.stderr is not None:
                nursery.start_soon(self._pump_stderr, link.stderr)
            nursery.start_soon(self._watch_startup, nursery.cancel_scope)
            nursery.start_soon(self._expire_requests)
            await self._write([self._protocol.start()])
            reason = await self._read(FastIO(link.receive_stream))
            nursery.cancel_scope.cancel()
        self._process_nursery = None
        return self._abandoned or reason

    async def _expire_requests(self) -> None:
        """Answer and cancel requests that outlive their timeout.

        Every request gets the same timeout and progress only pushes deadlines
        later, so with nothing pending, nothing can expire sooner than one
        timeout from now.
        """
        while True:
            deadline = self._protocol.deadlines.next_deadline()
            if deadline is None:
                await trio.sleep(self._timeouts.timeout)
                continue
            await trio.sleep_until(deadline)
            actions = self._protocol.expire(trio.current_time())
            answered = sum(isinstance(action, Deliver) for action in actions)
            if answered:
                self._timeouts_count += answered
                self._log.warning("server.requests_timed_out", count=answered)
            self._apply(actions)

    async def _watch_startup(self, scope: trio.CancelScope) -> None:
        with trio.move_on_after(STARTUP_TIMEOUT):
            await self._wait_not_starting()
            return
        scope.cancel()

    def _went_down(self, reason: str) -> None:
        self._set_status(Status.DOWN)
        failed = self._protocol.server_gone(reason)
        self._log.error("server.down", reason=reason, failed_requests=len(failed))
        for delivery in failed:
            cast(SessionHandle, delivery.session).deliver(delivery.message)

    # -- reader -------------------------------------------------------------

    async def _read(self, stdout: FastIO) -> str:
        framer = LineFramer(self.settings.max_message_bytes)
        while True:
            try:
                with map_transport_errors():
                    data = await stdout.receive_some(READ_CHUNK)
            except TransportClosed:
                data = b""
            if not data:
                return "exited" if self._status is Status.READY else "exited during startup"
            now = trio.current_time()
            # Messages for each session from this chunk, delivered together at
            # its end (one outbox item and one writer wake-up per session, not
            # per message). Any other action first delivers what is gathered,
            # so each session gets its messages in the server's order.
            deliveries: defaultdict[Hashable, list[Outgoing]] = defaultdict(list)
            lines, i = framer.feed(data), 0
            while True:
                # The hot path: answers passed on unparsed (broker/envelope.py), as
                # many as come in a row; the line after them is handled here.
                i = self._protocol.take_answers(lines, i, deliveries)
                if i == len(lines):
                    break
                line, i = lines[i], i + 1
                if isinstance(line, Oversize):
                    self._log.error("server.message_too_large", size=line.size)
                    continue
                try:
                    message = jsonrpc.decode(line)
                    session = self._protocol.response_fast(message)
                    if session is not None:  # an answer in another shape
                        deliveries[session].append(message)
                        continue
                    actions = self._protocol.server_message(message, now)
                except JsonRpcError as exc:
                    self._log.warning(
                        "server.invalid_message",
                        error=exc.message,
                        line=line[:200].decode(errors="replace"),
                    )
                    continue
                except HandshakeError as exc:
                    _deliver_all(deliveries)  # what came before it still goes out
                    return f"failed the initialize handshake: {exc}"
                for action in actions:
                    if type(action) is Deliver:
                        deliveries[action.session].append(action.message)
                    else:
                        _deliver_all(deliveries)
                        deliveries.clear()
                        self._apply([action])
            _deliver_all(deliveries)

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Deliver):
                cast(SessionHandle, action.session).deliver(action.message)
            elif isinstance(action, ListChanged) and self.events is not None:
                # The Registry refreshes its cache first, then tells sessions.
                self._emit(ServerEvent(self.name, list_changed=action.message["method"]))
            elif isinstance(action, Broadcast | ListChanged):  # (no Registry: as is)
                for session in self._protocol.sessions:
                    cast(SessionHandle, session).deliver(action.message)
            elif isinstance(action, SendUpstream):
                self._write_soon(action.message)
            elif isinstance(action, Warn):
                self._log.warning(action.event, detail=action.detail)
            elif isinstance(action, Ready):
                self._log.info(
                    "server.ready",
                    server_info=action.identity.server_info,
                    protocol_version=action.identity.protocol_version,
                )
                self._set_status(Status.READY)

    async def _pump_stderr(self, stderr: trio.abc.ReceiveStream) -> None:
        framer = LineFramer(STDERR_LINE_LIMIT)
        while True:
            try:
                with map_transport_errors():
                    data = await stderr.receive_some(READ_CHUNK)
            except TransportClosed:
                return
            if not data:
                return
            for line in framer.feed(data):
                text = (
                    f"<{line.size} bytes>"
                    if isinstance(line, Oversize)
                    else line.decode(errors="replace")
                )
                self._log.info("server.stderr", line=text)


def _count(item: InboxItem) -> int:
    """How many requests or notices an inbox item carries (for :attr:`Upstream.load`)."""
    return len(item.messages) if isinstance(item, ClientRequest) else 1


def _deliver_all(deliveries: dict[Hashable, list[Outgoing]]) -> None:
    for session, messages in deliveries.items():
        cast(SessionHandle, session).deliver_all(messages)
