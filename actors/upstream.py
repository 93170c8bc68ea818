"""The Upstream actor: one MCP server connection, shared by every session.

It reaches its server through a :class:`~actors.links.link.Link` of any kind
(actors/links/: a child process over stdio, a WebSocket): the link takes
messages and gives frames; everything here is the same for every kind.

Three kinds of task serve it:

- the dispatcher takes client requests, cancellations and session arrivals
  and departures from the inbox (one channel, bounded in items and bytes),
  rewrites them with :class:`UpstreamProtocol` and writes what is ready (up
  to :data:`DISPATCH_BATCH` items) in one write;
- the reader turns the frames the link gives into responses and
  notifications and delivers them with :meth:`SessionHandle.deliver`, which
  never waits;
- the supervisor opens the link (starts the process, connects), runs the
  ``initialize`` handshake, and when the link ends (the process exits, the
  connection closes) fails every request in flight with an error naming the
  server, then opens it again with exponential backoff.

**The dispatcher never waits** on the server, so one server that stops
reading, or takes its time to start, never holds up a session's requests to
other servers, nor other sessions (they all wait on this inbox only while
the dispatcher is busy with the CPU). Writes go through :meth:`_send_nowait`:
what the link does not take at once waits in a backlog, bounded in bytes
(``broker.maxQueuedBytes``), that a writer task drains. A request that comes
while the backlog is full is answered at once (-32005); one already in it is
answered by its timeout like any other. A request that arrives while the
server is starting is parked, bounded likewise, and handled once the
handshake is done (or answered with an error if the server fails to start);
one that arrives while it is down is answered at once with an error.
"""

from __future__ import annotations

import collections
import contextlib
import math
import random
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any, cast

import psutil
import trio

from actors.errors import TransportClosed
from actors.links import launcher_for
from actors.links.link import Launcher, LaunchError, Link, LinkContext
from actors.logs import get_logger
from actors.mailbox import SMALL_MESSAGE, Outgoing, SessionHandle
from actors.server_actor import (
    Attach,
    ClientCancelled,
    ClientLogLevel,
    ClientNotification,
    ClientRequest,
    ClientResponse,
    Detach,
    InboxItem,
    ServerActor,
    ServerEvent,
    UpstreamStatistics,
)
from actors.stderr import LineBudget
from broker import jsonrpc
from broker.config import BrokerSettings, ServerConfig
from broker.fanout import Fanout
from broker.jsonrpc import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    LIMIT_REACHED,
    JsonRpcError,
    Message,
    held_size,
)
from broker.lifecycle import HandshakeError
from broker.recovery import Liveness, RestartPolicy, Restarts
from broker.redact import shown_url
from broker.server_requests import ClientIds
from broker.states import COMING_UP, STATUS, ServerState, ServerTrigger
from broker.timeouts import TimeoutPolicy
from broker.upstream import (
    Action,
    Broadcast,
    Deliver,
    ListChanged,
    Ready,
    SendUpstream,
    Speak,
    UpstreamProtocol,
    Warn,
)
from broker.upstream_actions import ListenLater, Reconnect
from broker.wire.frames import Failed, LinkFrame, OnStream, Oversize, Renewed

INBOX_SIZE = 256
# Bytes of client requests the inbox may hold (each item is counted as the
# read it came from); past this a session's reader waits for the dispatcher.
INBOX_BYTES = 32 * 1024 * 1024
# Inbox items (each one session's requests from one read) written to the
# server together at most. Everything ready in one write costs the fewest
# system calls but makes the server wait for the whole batch and the broker
# then wait for the server's whole answer; a few items a write keep both
# busy (benchmarks/README.md: the daemon went from 93% to 100% of a core at
# 64 clients x 16, and throughput up about a tenth).
DISPATCH_BATCH = 8
READ_CHUNK = 256 * 1024  # the most a link's read takes (for the backlog's slack)
# Bytes below which what waits in the backlog is copied to its own size (an
# encoder's output may hold twice its size, and never less than 4 KiB).
PINNED = 64 * 1024
STARTUP_TIMEOUT = 30.0
# How long after its start an instance that warms up (per-session, pool) may
# take to offer the tools the catalog shows before it is taken as ready anyway.
WARM_UP_TIMEOUT = 10.0
# Seconds a server of "era": "auto" has to answer the server/discover probe
# before it is opened with initialize (docs/eras.md).
PROBE_TIMEOUT = 5.0
STDERR_TAIL = 5  # a server's last stderr lines, kept for the report of a crash loop
# Bytes of stdout lines that are not JSON-RPC a server may write at once, and
# a second after that, before its reader pauses (see _read).
JUNK_BURST = 1024 * 1024
JUNK_RATE = 1024 * 1024
# Bytes of the broker's own messages (ping replies, cancellations) that may wait
# for a server beyond the backlog's limit (client requests stop at the limit,
# these do not). A server that sends requests while it does not read its input
# would otherwise grow the backlog without end: past this, it is taken as
# stuck, stopped and restarted.
CONTROL_SLACK = 1024 * 1024


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
        numbering: tuple[int, int] | ClientIds = (1, 1),
        warm_up: bool = False,
        expected_tools: frozenset[str] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.settings = settings
        self._log = get_logger(server=name)
        self._launch: Launcher = launch or launcher_for(config, name)
        self._timeouts = TimeoutPolicy.for_server(config, settings)
        self._timeouts_changed = trio.Event()  # set by reconfigure (_expire_requests)
        self._inbox_send, self._inbox = trio.open_memory_channel[InboxItem](INBOX_SIZE)
        # Items sent and not yet handled (a channel hands an item straight to a
        # waiting receiver, so its buffer alone undercounts), and their bytes.
        self._queued = 0
        self._queued_bytes = 0
        self._inbox_room = trio.Event()  # set whenever the inbox's bytes fall below the limit
        self._inbox_room.set()
        # Requests that came while the server was starting, handled once it is ready.
        self._parked: list[ClientRequest] = []
        self._front: list[InboxItem] = []  # (handled before the inbox: take_unsent)
        self._parked_bytes = 0
        # What the link did not take yet (its units), drained by the writer task.
        self._backlog: list[bytes] = []
        self._backlog_bytes = 0
        self._writing = False  # the writer holds bytes taken from the backlog
        # A client's notification (roots changed) that came while the backlog
        # was full: the latest, written once the backlog is below its bound.
        self._held_notification: Message | None = None
        self._backlog_ready = trio.Event()
        self._max_backlog = settings.max_queued_bytes
        self._requests = 0
        self._timeouts_count = 0
        self._errors = 0  # error answers of the broker's own for this server
        self._ready_since: float | None = None
        self._protocol = UpstreamProtocol(
            name,
            self._timeouts,
            numbering,
            settings.max_server_in_flight,
            server_requests=config.server_requests,
            max_waiting=settings.max_waiting_requests,
            max_waiting_bytes=settings.max_queued_bytes,
            warm_up=warm_up,
            expected_tools=expected_tools,
            state=ServerState.IDLE if lazy else ServerState.STARTING,
            era=config.era,
            process=config.command is not None,
        )
        self._status_changed = trio.Event()
        self._start_requested = trio.Event()
        if not lazy:
            self._start_requested.set()
        self.events = events
        # Whether a list_changed goes to its sessions as it is when there is
        # no Registry to tell (``events`` None): a per-session or per-era
        # instance's own lists; not a pool's other instances, whose catalog
        # is the catalog instance's (actors/sharing.py).
        self.lists_to_sessions = True
        self._link: Link | None = None
        self._abandoned: str | None = None  # why the broker ended this connection, if it did
        self._link_nursery: trio.Nursery | None = None
        self._restarts = 0
        self._policy = RestartPolicy.for_server(config, settings)
        self._backoff = Restarts(self._policy)
        self._random = random.Random()  # the jitter of restarts (tests may seed it)
        self._ready_for: float | None = None  # how long the last connection was ready
        self._retry = trio.Event()  # set by retry(): a failed server is tried again
        self._retired: str | None = None  # why retire() stopped it for good
        self._retired_retryable = False  # (and whether its requests may be sent again)
        self._heard = False  # the server sent something since the last ping (liveness)
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        # Lines on stdout that are not JSON-RPC (a server's debug prints) are
        # logged within the budget stderr gets (actors/stderr.py), the rest
        # counted: 100,000 of them wrote 27 MB of log and stalled every session.
        self._invalid_budget = LineBudget(now=-math.inf)
        self._invalid_unlogged = 0
        # And read within a budget of bytes: a server that floods its stdout
        # with them is read more slowly (its pipe fills, it waits), so that
        # decoding them does not hold up everyone else's messages.
        self._junk_budget = LineBudget(JUNK_BURST, JUNK_RATE, now=-math.inf)
        self._junk_bytes = 0  # of such lines in the read being handled
        self._refused_401 = False  # a 401 told (status, log) and no answer since

    # -- the actor's public face -------------------------------------------

    async def send(self, item: InboxItem) -> None:
        if self._retired is not None:  # (a session that raced the reload)
            self._refuse_retired(item)
            return
        while self._queued_bytes >= INBOX_BYTES:
            await self._inbox_room.wait()
        count, size = _count(item), _size(item)
        self._queued += count
        self._queued_bytes += size
        if self._queued_bytes >= INBOX_BYTES:
            self._inbox_room = trio.Event()
        try:
            self._inbox_send.send_nowait(item)  # no checkpoint when there is room
        except trio.WouldBlock:
            await self._inbox_send.send(item)
        except BaseException:
            self._taken(item)
            raise

    @property
    def status(self) -> ServerState:
        return self._protocol.state

    @property
    def identity(self) -> Any:
        return self._protocol.identity

    @property
    def tools(self) -> frozenset[str] | None:
        """The names of the tools this instance offers, if it warms up and has listed them."""
        return self._protocol.tools

    def statistics(self) -> UpstreamStatistics:
        pid = self._link.info.get("pid") if self._link is not None else None
        waiting = len(self._protocol.turns.held)  # (opened, so in the request map, but unsent)
        return UpstreamStatistics(
            name=self.name,
            status=STATUS[self._protocol.state],
            state=self._protocol.state.value,
            pid=pid,
            restarts=self._restarts,
            sessions=len(self._protocol.sessions),
            in_flight=len(self._protocol.requests) - waiting,
            waiting=waiting,
            inbox=self._inbox.statistics().current_buffer_used + len(self._front),
            last_error=self._protocol.last_error,
            requests=self._requests,
            timeouts=self._timeouts_count,
            errors=self._errors + self._timeouts_count,
            uptime=None if self._ready_since is None else trio.current_time() - self._ready_since,
            backlog_bytes=self._backlog_bytes,
            parked=sum(len(item.messages) for item in self._parked),
            url=self._link.info.get("url") if self._link is not None else self._shown_url,
            pids=() if pid is None else (pid,),
            **process_usage(pid),
        )

    def keep_request_states(self) -> None:
        """Remember the requestStates this instance gives modern clients
        (a pool's instance: see :meth:`mints`)."""
        self._protocol.minted = {}

    def mints(self, state: Any) -> bool:
        """Whether this instance gave a modern client the ``requestState``
        ``state`` (for pools: its retry must come here)."""
        return self._protocol.mints(state)

    def owns_task(self, session: Any, task_id: Any) -> bool:
        """Whether this instance made the task ``task_id`` of ``session`` (for pools)."""
        return self._protocol.tasks.owns(session, task_id)

    @property
    def load(self) -> int:
        """Requests in flight or waiting: how busy this instance is (for pools)."""
        return len(self._protocol.requests) + self._queued

    def expect_tools(self, tools: frozenset[str] | None) -> None:
        """From its next start on, this instance is ready only once it offers these
        tools (see ``expected_tools`` in broker/upstream.py)."""
        self._protocol.expected_tools = tools

    def reconfigure(self, config: ServerConfig, settings: BrokerSettings) -> None:
        """New settings that apply without a restart (broker/configdiff.py, LIVE):
        timeouts, limits, startup. They hold for what comes next; what is in
        flight keeps its deadline until progress moves it."""
        self.config = config
        self.settings = settings
        self._max_backlog = settings.max_queued_bytes
        self._timeouts = TimeoutPolicy.for_server(config, settings)
        self._protocol.reconfigure(
            self._timeouts,
            settings.max_server_in_flight,
            settings.max_waiting_requests,
            settings.max_queued_bytes,
        )
        self._timeouts_changed.set()
        self._policy = self._backoff.policy = RestartPolicy.for_server(config, settings)
        if config.startup == "eager":
            self.request_start()

    def inherit(self, old: ServerActor) -> None:
        """A reload restarted the server with this actor in ``old``'s place
        (before it runs): the subscriptions and log levels its sessions asked
        of the old one (of any of its instances) are asked of the new process
        at its handshake, as a crash's restart asks them (docs/configuration.md)."""
        self.adopt(old.asked())
        # Its counters go on from the old one's, whatever it was (counters only
        # go up: from 0, Prometheus read each restarting reload as a reset).
        last = old.statistics()
        self._requests, self._timeouts_count = last.requests, last.timeouts
        self._errors, self._restarts = last.errors - last.timeouts, last.restarts

    def take_over(self, unsent: list[ClientRequest]) -> None:
        """A reload restarted the server with this actor in the place of one
        that never wrote ``unsent`` to its process (before this one runs: it
        is coming up): they are parked for its start, in order, ahead of
        whatever sessions send it from now on; so a client's later
        cancellation or departure, which comes here, reaches them."""
        assert self._protocol.state in COMING_UP, "a new actor, not running yet"
        for item in unsent:
            self._park(item)

    def asked(self) -> Fanout:
        """What its sessions asked of the server (log levels, subscriptions)."""
        return self._protocol.fanout

    def modern_sessions(self) -> set[Any]:
        """The 2026-07-28 sessions attached (for a reload: actors/sharing.py)."""
        return set(self._protocol.modern_sessions)

    def forget_subscriptions(self, session: SessionHandle) -> None:
        """Forget ``session``'s subscriptions, telling the server nothing: this
        instance has failed (its process is gone) and a pool moved the session
        to another, where it subscribes and unsubscribes from now on; a retry
        must not subscribe them again for it (actors/sharing.py)."""
        self._protocol.fanout.drop_subscriptions(session)

    def adopt(self, asked: Fanout) -> None:
        """Before it runs: ask these of the process at its handshake."""
        self._protocol.fanout = asked.for_new_server()

    def request_start(self) -> None:
        """Start a lazy server now (it is needed). Harmless if it already runs."""
        if self._protocol.state is ServerState.IDLE:
            self._set_status(ServerTrigger.START_REQUESTED)
        self._start_requested.set()

    async def wait_ready(self) -> None:
        """Wait until the server has finished its handshake (for tests and tools)."""
        while self._protocol.state is not ServerState.READY:
            await self._status_changed.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._dispatch)
            task_status.started()
            try:
                await self._supervise()
            finally:
                if self._protocol.state is not ServerState.STOPPED:  # (retire() stopped it)
                    self._set_status(ServerTrigger.STOP)

    def retire(self, reason: str, *, retryable: bool = False) -> None:
        """Stop for good (a reload removed or replaced this server): every request
        in flight, waiting for the server to start, or still in the inbox, is
        answered now with an error naming the server and ``reason``; requests
        that come later (a session that raced the reload) get it at once. The
        caller then cancels :meth:`run`, which stops the server the way the spec
        says. ``retryable``: the server is replaced (a reload restarts it), so
        what it was asked may be asked again at once."""
        self._retired = reason
        self._retired_retryable = retryable
        if self._protocol.state is ServerState.STOPPED:
            return
        failed = self._protocol.server_gone(reason, ServerTrigger.STOP, retryable=retryable)
        self._errors += len(failed)
        self._set_status()
        self._log.info("server.retired", reason=reason, failed_requests=len(failed))
        for delivery in failed:
            cast(SessionHandle, delivery.session).deliver(delivery.message)
        waiting: list[InboxItem] = [*self._parked]
        self._parked, self._parked_bytes = [], 0
        waiting += self._drain_inbox()
        for item in self._front:
            self._taken(item)
        self._front = []
        for item in waiting:
            self._refuse_retired(item)

    def take_unsent(self) -> list[ClientRequest]:
        """Take away, in order, the requests never written to the server (parked
        while it started, or still in the inbox): a reload that restarts the
        server gives them to the new actor at once instead of failing them
        (Daemon.reload, take_over; what reaches this one later, when its drain
        ends: Daemon._retire). Cancellations and departures in the inbox are
        applied to them; every item but the requests stays, in order, for this
        actor, handled ahead of its inbox, none dropped (it drains: an answer
        to what its process asked a client must reach it; retire() drops
        them)."""
        unsent, self._parked, self._parked_bytes = self._parked, [], 0
        rest: list[InboxItem] = []
        for item in self._drain_inbox():
            if isinstance(item, ClientRequest):
                unsent.append(item)
                continue
            if isinstance(item, ClientCancelled):
                gone = item.params.get("requestId")
                for kept in unsent:
                    if kept.session is item.session:
                        kept.messages = [m for m in kept.messages if m.get("id") != gone]
            elif isinstance(item, Detach):
                unsent = [kept for kept in unsent if kept.session is not item.session]
            rest.append(item)
        # Not back into the inbox, which may not hold them all (the senders
        # that waited for room came in as it was drained): ahead of it,
        # counted in again. (No need to wake the dispatcher: it waits only on
        # an empty inbox, and this one had them.)
        for item in rest:
            self._queued += _count(item)
        self._front += rest
        return [item for item in unsent if item.messages]

    def _drain_inbox(self) -> list[InboxItem]:
        """Everything in the inbox, taken out without handling it."""
        items: list[InboxItem] = []
        while True:
            try:
                item = self._inbox.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return items
            self._taken(item)
            items.append(item)

    def _refuse_retired(self, item: InboxItem) -> None:
        """What reaches a retired server: its requests are answered with the
        error :meth:`retire` gave, the rest dropped (the server is gone)."""
        if not isinstance(item, ClientRequest):
            return
        for request in item.messages:
            item.session.deliver(
                jsonrpc.error_response(
                    request["id"],
                    CONNECTION_CLOSED,
                    f"MCP server {self.name!r} {self._retired}",
                    data={"server": self.name, "retryable": self._retired_retryable},
                )
            )

    # -- dispatcher ---------------------------------------------------------

    async def _dispatch(self) -> None:
        while True:
            if self._front:  # (take_unsent's, before the dispatcher began)
                batch, self._front = self._front, []
            else:
                try:
                    first = await self._inbox.receive()
                except trio.EndOfChannel:
                    return
                batch = [first]
                if self._front:  # (take_unsent's, after that one came)
                    batch += self._front
                    self._front = []
            while len(batch) < DISPATCH_BATCH:
                try:
                    batch.append(self._inbox.receive_nowait())
                except trio.WouldBlock:
                    break
            out: list[Message] = []
            now = trio.current_time()
            for item in batch:
                try:
                    self._handle(item, now, out)
                except Exception:  # a bug of the broker's: this item only, not the daemon
                    self._log.exception("server.inbox_item_failed", item=type(item).__name__)
                if self._protocol.released:  # requests whose turn came (broker/turns.py)
                    out += self._protocol.take_released()
                self._taken(item)
            self._send_nowait(out)

    def _taken(self, item: InboxItem) -> None:
        """An inbox item left the inbox: count it out."""
        self._queued -= _count(item)
        self._queued_bytes -= _size(item)
        if self._queued_bytes < INBOX_BYTES:
            self._inbox_room.set()

    def _handle(self, item: InboxItem, now: float, out: list[Message]) -> None:
        """Handle an inbox item; what it writes to the server is added to ``out``."""
        protocol = self._protocol
        if isinstance(item, ClientRequest):
            if self._protocol.state in COMING_UP:
                self._park(item)
            elif self._backlog_bytes >= self._max_backlog:
                self._refuse(item, f"is not reading its input ({self._backlog_bytes} bytes wait)")
            else:
                out += self._forward(item.session, item.messages, now)
        elif isinstance(item, ClientCancelled):
            self._unpark_cancelled(item.session, item.params.get("requestId"))
            cancelled = protocol.client_cancelled(item.session, item.params)
            if cancelled is not None:
                out.append(cancelled)
            else:  # (a call waiting for the client's own answers, maybe)
                self._apply(protocol.withdraw(item.session, item.params))
        elif isinstance(item, ClientResponse):
            answers = self._split(protocol.client_answer(item.session, item.message, now))
            if answers:  # what the server asked for: counted as the broker's own
                self._send_nowait(out)  # (what came before goes first)
                out.clear()
                self._write_soon(answers)
        elif isinstance(item, ClientNotification):
            notification = protocol.client_notification(item.session, item.message)
            if notification is None:
                pass
            elif self._backlog_bytes >= self._max_backlog:
                self._hold_notification(notification)
            else:
                out.append(notification)
        elif isinstance(item, Attach):
            protocol.attach(item.session, item.capabilities, item.modern, item.client_info)
        elif isinstance(item, ClientLogLevel):
            out += self._split(protocol.client_log_level(item.session, item.level))
        else:
            self._unpark_session(item.session)
            out += protocol.session_closed(item.session)

    def _hold_notification(self, notification: Message) -> None:
        """A client's notification while the server is not reading: it would
        pile up without end (a client is not slowed by a server). Only the
        latest is kept, and written once the backlog is below its bound: each
        says the same thing (roots changed: ask again)."""
        if self._held_notification is None:
            self._log.warning(
                "server.notification_held",
                method=notification.get("method"),
                backlog_bytes=self._backlog_bytes,
                detail="the server is not reading its input: the latest such "
                "notification is kept and written when it reads again",
            )
        self._held_notification = notification

    # -- requests that came while the server was starting ---------------------

    def _park(self, item: ClientRequest) -> None:
        self.request_start()
        if self._parked_bytes + item.size > self._max_backlog and self._parked:
            self._refuse(item, f"is starting, and {self._parked_bytes} bytes of requests wait")
            return
        self._parked.append(item)
        self._parked_bytes += item.size

    def _unpark(self) -> None:
        """The server is ready (or down): handle what was parked, in order."""
        parked, self._parked, self._parked_bytes = self._parked, [], 0
        now = trio.current_time()
        out: list[Message] = []
        for item in parked:
            out += self._forward(item.session, item.messages, now)
        self._send_nowait(out)

    def _unpark_cancelled(self, session: SessionHandle, request_id: Any) -> None:
        """A parked request its client cancelled is dropped, never sent."""
        for item in self._parked:
            if item.session is session:
                item.messages = [m for m in item.messages if m.get("id") != request_id]

    def _unpark_session(self, session: SessionHandle) -> None:
        kept = [item for item in self._parked if item.session is not session]
        self._parked_bytes -= sum(item.size for item in self._parked if item.session is session)
        self._parked = kept

    def _refuse(self, item: ClientRequest, why: str) -> None:
        """Answer every request of an item at once: the server cannot take them now."""
        self._errors += len(item.messages)
        for request in item.messages:
            item.session.deliver(
                jsonrpc.error_response(
                    request["id"],
                    LIMIT_REACHED,
                    f"MCP server {self.name!r} {why}; try again later",
                    data={"server": self.name},
                )
            )

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
                if exc.id is None:  # (the rules' checks name no id: it is this request's)
                    exc.id = request.get("id")
                session.deliver(exc.to_response())
            except Exception:  # a bug of the broker's: answer this request, go on
                self._log.exception(
                    "server.request_failed",
                    session=session.id,
                    request=request.get("id"),
                    method=request.get("method"),
                )
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

    def _send_nowait(self, messages: list[Message]) -> None:
        """Write messages to the server without waiting: what the link does not
        take now waits in the backlog, which :meth:`_drain_backlog` writes."""
        link = self._link
        if not messages or link is None or self._abandoned is not None:
            return  # (the link is gone or going: the reader fails what was in flight)
        try:
            units = link.encode(messages)
        except TypeError:  # (orjson's errors are TypeErrors) one of them: find it
            units = link.encode(self._encodable(messages))
        if not self._backlog and not self._writing:  # (nothing may overtake the backlog)
            try:
                units = link.send_nowait(units)
            except TransportClosed:
                return  # likewise: the reader sees the end
            if not units:
                return
        # (small ones copied to their own size: orjson's output keeps the buffer
        # it was written in, 4 KiB at least, and 200,000 small answers waiting
        # for a server that read slowly held 800 MB; a link's own units, a bytes
        # subclass such as the HTTP link's, are built as copies already)
        self._backlog += [_compact(unit) for unit in units]
        self._backlog_bytes += sum(map(len, units))
        self._backlog_ready.set()

    def _encodable(self, messages: list[Message]) -> list[Message]:
        """The messages that can be encoded; one that cannot is not written,
        and if it is a request in flight, its caller is answered now (decode
        refuses what encode cannot write, so this is a bug of the broker's,
        contained)."""
        out = []
        for message in messages:
            try:
                jsonrpc.encode(message)
            except TypeError as exc:
                id = message.get("id")
                entry = self._protocol.requests.forget(id) if isinstance(id, int) else None
                self._log.error(
                    "server.unencodable_message",
                    error=str(exc),
                    session=None if entry is None else cast(SessionHandle, entry.session).id,
                    request=None if entry is None else entry.client_id,
                )
                if entry is not None and isinstance(id, int):
                    self._protocol.deadlines.discard(id)
                    cast(SessionHandle, entry.session).deliver(
                        jsonrpc.error_response(
                            entry.client_id,
                            INTERNAL_ERROR,
                            f"mcpbroker could not write this request to {self.name!r} ({exc})",
                            data={"server": self.name},
                        )
                    )
            else:
                out.append(message)
        return out

    def _write_soon(self, messages: list[Message]) -> None:
        """Write messages of the broker's own (a ping reply, a cancellation),
        or answers the server asked a client for.

        Client requests stop at the backlog's limit (plus the one read that
        crossed it); these do not, so a server that keeps sending requests
        while it reads nothing is stopped past :data:`CONTROL_SLACK` more."""
        self._send_nowait(messages)
        limit = self._max_backlog + self.settings.max_message_bytes + READ_CHUNK + CONTROL_SLACK
        if self._backlog_bytes > limit:
            self._abandon(
                f"stopped reading its input ({self._backlog_bytes} bytes were waiting for it)"
            )

    async def _drain_backlog(self, link: Link) -> None:
        """The writer: what the link did not take at once, in order."""
        while True:
            await self._backlog_ready.wait()
            self._backlog_ready = trio.Event()
            while self._backlog:
                units = self._backlog
                self._backlog = []
                size = sum(map(len, units))
                self._writing = True
                try:
                    await link.send(units)
                except TransportClosed:
                    return  # the reader sees the end
                finally:
                    self._writing = False
                    self._backlog_bytes -= size
                held = self._held_notification
                if held is not None and self._backlog_bytes < self._max_backlog:
                    self._held_notification = None
                    self._send_nowait([held])

    def _abandon(self, why: str) -> None:
        """End this connection (the server is stuck); the supervisor restarts it."""
        self._abandoned = why
        if self._link_nursery is not None:
            self._link_nursery.cancel_scope.cancel()

    async def _wait_not_starting(self) -> None:
        self.request_start()
        while self._protocol.state in COMING_UP:
            await self._status_changed.wait()

    def _set_status(self, trigger: ServerTrigger | None = None) -> None:
        """The server's state moves on ``trigger`` (None: it moved in the protocol)."""
        if self._retired is not None and trigger is not None:
            # STOPPED for good (retire()): what its supervisor meets before
            # the cancel that follows lands (a launch, a retry a reload
            # asked for) moves it nowhere. (It raised LifecycleError, out of
            # the daemon's nursery: the daemon ended.)
            return
        status = self._protocol.state if trigger is None else self._protocol.move(trigger)
        self._status_changed.set()
        self._status_changed = trio.Event()
        self._emit(ServerEvent(self.name, status=status))

    async def wait_status_changed(self) -> None:
        """Wait until the server's state next moves (for a group: see actors/sharing.py)."""
        await self._status_changed.wait()

    def status_event(self) -> trio.Event:
        """The event set when the state next moves from what it is now (to wait
        on later, or among others, without missing a move made meanwhile)."""
        return self._status_changed

    def announce(self) -> None:
        """Tell ``events`` (the Registry) the state the server is in now: an
        instance that has just taken over a group's catalog."""
        self._emit(ServerEvent(self.name, status=self._protocol.state))

    def _emit(self, event: ServerEvent) -> None:
        if self.events is None:
            return
        try:
            self.events.send_nowait(event)
        except trio.WouldBlock:
            self._log.error("server.event_dropped", dropped=repr(event), reason="registry busy")

    # -- supervisor ---------------------------------------------------------

    async def _supervise(self) -> None:
        """Connect, and again each time the connection ends, as broker/recovery.py
        says: after a jittered backoff, until a crash loop is given up."""
        await self._start_requested.wait()
        while True:
            unreachable: LaunchError | None = None
            try:
                await self._connect_once()
            except* LaunchError as group:  # retrying cannot help: say so once, then wait
                # (except*: it comes out of the connection's nursery in a group)
                unreachable = cast(LaunchError, group.exceptions[0])
            except* Exception as group:  # a link's task failed: this server, not the daemon
                self._log.error("server.link_failed", exc_info=group)
                first = group.exceptions[0]
                self._went_down(
                    f"was stopped after an internal error ({type(first).__name__}: {first})"
                )
            if unreachable is not None:
                self._went_down(str(unreachable), ServerTrigger.UNREACHABLE)
                await self._wait_retry(None)  # (a reload)
                continue
            delay = self._backoff.ended(self._ready_for, self._random.random())
            if delay is None:
                await self._give_up()
                continue
            self._log.warning(
                "server.restart_scheduled",
                delay=round(delay, 3),
                attempt=self._backoff.failures,
                error=self._protocol.last_error,
            )
            await trio.sleep(delay)
            self._set_status(ServerTrigger.BACKOFF_ELAPSED)
            self._restarts += 1

    async def _give_up(self) -> None:
        """A crash loop: no more restarts (``failed``) until a reload, or
        ``retryFailedAfter`` seconds; then a new round of attempts."""
        attempts = self._backoff.failures - 1
        reason = f"{self._protocol.last_error}, after {attempts} restarts in a row"
        if self._stderr_tail:
            reason += "; its last stderr lines: " + " | ".join(self._stderr_tail)
        self._protocol.last_error = reason
        self._set_status(ServerTrigger.GAVE_UP)
        after = self._policy.retry_failed_after
        self._log.error(
            "server.failed",
            reason=reason,
            retry_after=after or None,
            stderr=list(self._stderr_tail),
        )
        await self._wait_retry(after or None)

    async def _wait_retry(self, seconds: float | None) -> None:
        """A failed server waits for :meth:`retry` (a reload), or ``seconds``."""
        with trio.move_on_after(math.inf if seconds is None else seconds):
            await self._retry.wait()
        if self._retired is not None:
            await trio.sleep_forever()  # (a reload retried it, then retired it: cancelled next)
        self._retry = trio.Event()
        self._backoff.reset()
        self._log.info("server.retrying")
        self._set_status(ServerTrigger.RETRY)

    def retry(self) -> None:
        """Try a failed server again now (a reload does, docs/rules/restarts.md).
        Harmless for a server that is not failed."""
        if self._protocol.state is ServerState.FAILED and self._retired is None:
            self._retry.set()

    async def _connect_once(self) -> None:
        """One connection to the server, from opening its link to its end.

        Raises :class:`LaunchError` if the server cannot be reached as
        configured: past the nursery, since out of one it would come wrapped
        in an ExceptionGroup that ``except LaunchError`` does not catch."""
        failure = await self._connect()
        if failure is not None:
            raise failure

    async def _connect(self) -> LaunchError | None:
        unprobed = self._protocol.unprobed
        self._protocol = self._protocol.restarted()
        if self._protocol.unprobed != unprobed:
            self._log.warning(
                "server.probe_skipped",
                reason=self._protocol.unprobed,
                detail="it is opened with initialize from now on (until its entry changes)",
            )
        async with trio.open_nursery() as nursery:  # the link's own tasks, and ours
            try:
                self._stderr_tail.clear()
                context = LinkContext(
                    nursery, self.settings.max_message_bytes, self._log, self._stderr_tail
                )
                # (bounded: a launch that waits on the server, as HTTP+SSE's
                # for its endpoint event, stayed "starting" for good)
                with trio.fail_after(STARTUP_TIMEOUT):
                    link = await self._launch(context)
            except trio.TooSlowError:
                why = f"did not open its connection within {STARTUP_TIMEOUT:g} s"
                self._went_down(f"{why} ({self._target})")
                nursery.cancel_scope.cancel()
                return None
            except OSError as exc:
                # (the OSError of a cwd that does not exist names the cwd: saying
                # the command sent the user looking for it on the PATH)
                cwd = self.config.cwd
                what = f"its cwd {cwd}" if cwd is not None and exc.filename == cwd else self._target
                self._went_down(f"could not be started ({exc.strerror or exc}: {what})")
                nursery.cancel_scope.cancel()
                return None
            except LaunchError as exc:
                nursery.cancel_scope.cancel()
                return exc
            except Exception as exc:  # a library's refusal no check foresaw: this server alone
                self._log.exception("server.launch_failed")
                nursery.cancel_scope.cancel()
                return LaunchError(f"could not be started ({type(exc).__name__}: {exc})")
            self._log.info("server.started", **link.info, target=self._target)
            self._set_status(ServerTrigger.LAUNCHED)
            try:
                try:
                    reason = await self._serve_link(link, nursery)
                except Exception as exc:  # a bug of the broker's: restart this server
                    self._log.exception("server.handling_failed")
                    reason = (
                        f"was stopped after an internal error of the broker ({type(exc).__name__})"
                    )
                self._link = None
                reason += await link.ended()
                self._went_down(reason)
            finally:
                self._link = None
                self._link_nursery = None
                with trio.CancelScope(shield=True):
                    await link.close()
                nursery.cancel_scope.cancel()
        return None

    @property
    def _target(self) -> str:
        return self.config.command or self._shown_url or ""

    @property
    def _shown_url(self) -> str | None:
        """The configured URL as logs and status show it (broker/redact.py)."""
        return None if self.config.url is None else shown_url(self.config.url)

    async def _serve_link(self, link: Link, nursery: trio.Nursery) -> str:
        reason = f"did not answer initialize within {STARTUP_TIMEOUT:g} s"
        async with trio.open_nursery() as tasks:
            self._link_nursery = tasks
            self._backlog.clear()  # anything left was for the previous connection
            self._backlog_bytes = 0
            self._held_notification = None
            self._abandoned = None
            self._link = link
            tasks.start_soon(self._watch_startup, tasks.cancel_scope)
            tasks.start_soon(self._expire_requests)
            tasks.start_soon(self._drain_backlog, link)
            tasks.start_soon(self._watch_liveness)
            if self._protocol.warm_up:
                tasks.start_soon(self._watch_warm_up)
            opening = self._protocol.start()
            link.speak(self._protocol.speaking)  # (the era its opening goes in)
            self._send_nowait([opening])
            if self._protocol.probing:
                tasks.start_soon(self._watch_probe)
            reason = await self._read(link)
            tasks.cancel_scope.cancel()
        self._link_nursery = None
        self._link = None
        return self._abandoned or reason

    async def _expire_requests(self) -> None:
        """Answer and cancel requests that outlive their timeout.

        Progress only pushes deadlines later, and what is sent from now on
        gets the timeout in force, so nothing can expire sooner than the
        first deadline pending or one timeout from now, whichever comes
        first (a reload that lowered the timeout left requests in flight
        with later deadlines than the next request's); a new timeout (a
        reload) wakes this task to look again.
        A modern server's call whose legacy clients are asked its questions
        has the same timeout for their answers (broker/eras/bridge.py,
        ``AskingClients.expire``): expired here too.
        """
        while True:
            soonest = trio.current_time() + self._timeouts.timeout  # (what is sent from now)
            deadline = self._protocol.next_deadline()
            if deadline is None or deadline > soonest:
                deadline = soonest
            with trio.move_on_at(deadline):
                await self._timeouts_changed.wait()
                self._timeouts_changed = trio.Event()
                continue
            actions = self._protocol.expire(trio.current_time())
            for action in actions:
                if isinstance(action, Deliver) and "error" in action.message:
                    self._timeouts_count += 1
                    self._log.warning(
                        "server.request_timed_out",
                        session=cast(SessionHandle, action.session).id,
                        request=action.message.get("id"),
                        timeout=self._timeouts.timeout,
                    )
            self._apply(actions)
            if self._protocol.released:
                self._send_nowait(self._protocol.take_released())

    async def _watch_probe(self) -> None:
        """A server silent to the probe is opened with initialize (legacy)."""
        await trio.sleep(PROBE_TIMEOUT)
        self._apply(self._protocol.probe_expired())

    async def _watch_warm_up(self) -> None:
        """An instance that lists its tools before it is ready waits that long at
        most for the tools the catalog shows (broker/upstream.py, warm-up)."""
        await trio.sleep(WARM_UP_TIMEOUT)
        self._apply(self._protocol.warm_up_expired())

    async def _watch_liveness(self) -> None:
        """Ping the ready server every ``pingInterval``; one silent for
        ``pingMisses`` intervals in a row is dead: it is stopped, its requests
        failed, and it is restarted (broker/recovery.py)."""
        await self._wait_not_starting()
        liveness = Liveness(self._policy.ping_misses)
        self._heard = False
        while self._policy.ping_interval > 0:
            interval = self._policy.ping_interval
            await trio.sleep(interval)
            liveness.misses_allowed = max(1, self._policy.ping_misses)
            heard, self._heard = self._heard, False
            if liveness.tick(heard):
                self._abandon(
                    f"stopped answering (no answer to {liveness.misses} pings, "
                    f"{interval:g} s apart)"
                )
                return
            self._write_soon([self._protocol.ping()])

    async def _watch_startup(self, scope: trio.CancelScope) -> None:
        with trio.move_on_after(STARTUP_TIMEOUT):
            await self._wait_not_starting()
            return
        scope.cancel()

    def _went_down(self, reason: str, trigger: ServerTrigger = ServerTrigger.ENDED) -> None:
        failed = self._protocol.server_gone(reason, trigger)
        self._errors += len(failed)
        now = trio.current_time()
        self._ready_for = None if self._ready_since is None else now - self._ready_since
        self._ready_since = None
        self._set_status()
        self._log.error(
            "server.down",
            reason=reason,
            failed_requests=len(failed),
            sessions=sorted({cast(SessionHandle, d.session).id for d in failed}),
        )
        for delivery in failed:
            cast(SessionHandle, delivery.session).deliver(delivery.message)
        self._unpark()  # what waited for it to start is answered: it is down

    def _invalid_message(self, error: str, line: bytes) -> None:
        self._junk_bytes += len(line) + 1
        if not self._invalid_budget.take(1, trio.current_time()):
            self._invalid_unlogged += 1
            return
        more = {"not_logged_before": self._invalid_unlogged} if self._invalid_unlogged else {}
        self._invalid_unlogged = 0
        self._log.warning(
            "server.invalid_message", error=error, line=line[:200].decode(errors="replace"), **more
        )

    # -- reader -------------------------------------------------------------

    async def _read(self, link: Link) -> str:
        while True:
            frames = await link.receive()
            self._heard = True
            if not frames:
                return (
                    "exited"
                    if self._protocol.state is ServerState.READY
                    else "exited during startup"
                )
            reason = self._read_frames(frames)
            if self._junk_bytes:
                await self._pause_for_junk()
            if self._refused_401 and any(type(frame) is bytes for frame in frames):
                self._authorized_again()  # (an answer came: the server takes the token)
            if reason is not None or self._abandoned is not None:
                return reason or self._abandoned or ""

    async def _pause_for_junk(self) -> None:
        """Past its budget, a read that held lines that are not JSON-RPC
        waits as long as the budget takes to pay for them (a flood is read at
        ``JUNK_RATE``; a debug print now and then never waits)."""
        junk, self._junk_bytes = self._junk_bytes, 0
        owed = junk - self._junk_budget.take(junk, trio.current_time())
        if owed > 0:
            await trio.sleep(owed / JUNK_RATE)
            self._junk_budget.take(owed, trio.current_time())  # (what the wait earned)

    def _read_frames(self, frames: Sequence[LinkFrame]) -> str | None:
        """Everything one read from the server leads to; why to stop, if it must."""
        now = trio.current_time()
        # Messages for each session from this read, delivered together at its
        # end (one outbox item and one writer wake-up per session, not per
        # message), with the bytes they had. Any other action first delivers
        # what is gathered, so each session gets its messages in the server's
        # order. The lists that changed are told once, at the end.
        deliveries: defaultdict[Hashable, list[Outgoing]] = defaultdict(list)
        sizes: defaultdict[Hashable, int] = defaultdict(int)
        changed: dict[str, None] = {}
        i = 0
        while True:
            # The hot path: answers passed on unparsed (broker/wire/envelope.py), as
            # many as come in a row; the line after them is handled here.
            i = self._protocol.take_answers(frames, i, deliveries, sizes)
            if i == len(frames):
                break
            line, i = frames[i], i + 1
            if isinstance(line, Oversize):
                actions = self._protocol.oversize(line, self.settings.max_message_bytes)
                self._errors += sum(type(action) is Deliver for action in actions)
                size = SMALL_MESSAGE
            elif isinstance(line, Failed):  # the link could not get this answer
                actions = self._failed(line)
                size = SMALL_MESSAGE
            elif isinstance(line, Renewed):  # a new session: ask again what the old held
                actions = self._protocol.renewed()
                size = SMALL_MESSAGE
            else:
                related = None
                if isinstance(line, OnStream):  # it came for this request (HTTP)
                    related = line.request
                    line = line.frame
                try:
                    message = jsonrpc.decode(line)
                    session = self._protocol.response_fast(message)
                    if session is not None:  # an answer in another shape
                        deliveries[session].append(message)
                        sizes[session] += held_size(line)
                        continue
                    actions = self._protocol.server_message(message, now, related)
                except JsonRpcError as exc:
                    self._invalid_message(exc.message, line)
                    if not isinstance(exc.response_id, int):
                        continue
                    # An answer the broker cannot take (too deep, both "result"
                    # and "error", no "jsonrpc"): its caller is told now.
                    detail = f"an invalid answer ({exc.message})"
                    actions = self._protocol.fail_now(exc.response_id, detail)
                    self._errors += len(actions)
                except HandshakeError as exc:
                    _deliver_all(deliveries, sizes)  # what came before it still goes out
                    return f"failed the initialize handshake: {exc}"
                size = held_size(line)  # (what it holds decoded: actors/mailbox.py)
            for action in actions:
                if type(action) is Deliver:
                    session = action.session
                    deliveries[session].append(
                        action.message
                        if action.related is None
                        else cast(SessionHandle, session).outgoing(action.message, action.related)
                    )
                    sizes[session] += size
                elif type(action) is ListChanged:
                    changed[action.message["method"]] = None
                else:
                    _deliver_all(deliveries, sizes)
                    deliveries.clear()
                    sizes.clear()
                    self._apply([action], size)
        _deliver_all(deliveries, sizes)
        if self._protocol.released:  # requests whose turn came (broker/turns.py)
            self._send_nowait(self._protocol.take_released())
        for method in changed:
            self._apply([ListChanged(jsonrpc.notification(method))])
        return None

    def _failed(self, failed: Failed) -> list[Action]:
        """The link could not get the answer to one request: its caller is told."""
        request = failed.request
        probe = self._protocol.probe_failed(request, failed.detail)
        if probe is not None:  # the server/discover probe: the server is legacy
            return probe
        listen = self._protocol.listen_failed(request, failed.detail, trio.current_time())
        if listen is not None:  # the broker's subscriptions/listen (a modern server)
            return listen
        if failed.detail.startswith("HTTP 401"):
            self._unauthorized()
        actions = self._protocol.fail_now(request, failed.detail) if type(request) is int else []
        self._errors += len(actions)
        if not actions:  # (nobody waits: one of the broker's own, or answered already)
            self._log.warning("server.answer_lost", request=request, detail=failed.detail)
        return actions

    def _unauthorized(self) -> None:
        """The server refused a request 401 that the broker's tokens could not
        cure (none held, or its refresh failed): status and the log say what
        to do, once, as the caller's error does (docs/oauth.md)."""
        self._protocol.last_error = self._401_error()
        if not self._refused_401:
            self._refused_401 = True
            self._log.warning("server.unauthorized", hint=f"mcpbroker auth {self.name}")

    def _authorized_again(self) -> None:
        """The server answered after a 401: status stops telling the user to
        run ``mcpbroker auth`` (they did, or a refresh worked), and a later
        401 is logged again."""
        self._refused_401 = False
        if self._protocol.last_error == self._401_error():
            self._protocol.last_error = None

    def _401_error(self) -> str:
        return f"answered 401 Unauthorized: run `mcpbroker auth {self.name}`"

    def _apply(self, actions: list[Action], size: int = SMALL_MESSAGE) -> None:
        for action in actions:
            if isinstance(action, Deliver):
                handle = cast(SessionHandle, action.session)
                handle.deliver(handle.outgoing(action.message, action.related), size)
            elif isinstance(action, ListChanged) and self.events is not None:
                # The Registry refreshes its cache first, then tells sessions.
                self._emit(ServerEvent(self.name, list_changed=action.message["method"]))
            elif isinstance(action, Broadcast | ListChanged):  # (no Registry: as is)
                if isinstance(action, ListChanged) and not self.lists_to_sessions:
                    continue
                for session in self._protocol.sessions:
                    cast(SessionHandle, session).deliver(action.message, size)
            elif isinstance(action, SendUpstream):
                self._write_soon([action.message])
            elif isinstance(action, Warn):
                self._log.warning(action.event, detail=action.detail)
            elif isinstance(action, ListenLater):
                if self._link_nursery is not None:
                    self._link_nursery.start_soon(self._listen_later, action.delay)
            elif isinstance(action, Reconnect):  # (its era found out anew: docs/eras.md)
                self._abandon(action.reason)
            elif isinstance(action, Speak):  # (before the requests it concerns)
                if self._link is not None:
                    self._link.speak(action.version)
            elif isinstance(action, Ready):
                self._log.info(
                    "server.ready",
                    server_info=action.identity.server_info,
                    protocol_version=action.identity.protocol_version,
                )
                self._ready_since = trio.current_time()
                self._set_status()  # (the protocol moved it to READY)
                self._unpark()

    async def _listen_later(self, delay: float) -> None:
        """The modern server's listen again, ``delay`` seconds from now, if
        the connection it was for is still the one there (the link's task:
        it ends with the connection)."""
        server = self._protocol.modern_server
        await trio.sleep(delay)
        if server is not None and self._protocol.modern_server is server:
            self._apply(server.listen_now())


def _compact(unit: bytes) -> bytes:
    """``unit`` in memory of its own size (see :meth:`Upstream._send_nowait`)."""
    return bytes(memoryview(unit)) if type(unit) is bytes and len(unit) < PINNED else unit


def _count(item: InboxItem) -> int:
    """How many requests or notices an inbox item carries (for :attr:`Upstream.load`)."""
    return len(item.messages) if isinstance(item, ClientRequest) else 1


def _size(item: InboxItem) -> int:
    """The bytes an inbox item counts for (only requests carry a client's payload)."""
    return item.size if isinstance(item, ClientRequest) else 0


def process_usage(pid: int | None) -> dict[str, Any]:
    """CPU seconds and resident bytes of a server's process (``cpu``, ``rss``),
    children included (a server started through ``npx`` or a shell is its
    child); empty if there is no process or it cannot be read."""
    if pid is None:
        return {}
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            processes = [process, *process.children(recursive=True)]
        cpu, rss = 0.0, 0
        for each in processes:
            with contextlib.suppress(psutil.Error):
                times = each.cpu_times()
                cpu += times.user + times.system
                rss += each.memory_info().rss
    except psutil.Error:
        return {}
    return {"cpu": cpu, "rss": rss}


def _deliver_all(deliveries: dict[Hashable, list[Outgoing]], sizes: dict[Hashable, int]) -> None:
    for session, messages in deliveries.items():
        cast(SessionHandle, session).deliver_all(messages, sizes[session])
