"""Sharing modes other than one shared process: per-session servers and pools.

A :class:`ServerGroup` runs several Upstream instances of one configured
server behind the same face as a single Upstream (``send``, ``status``,
``identity``, ``statistics``, ...), so sessions and the Registry need not know
the difference. One instance, the *catalog instance*, answers the Registry's
list requests and reports status and ``list_changed`` to it.

- :class:`PerSessionServer` (``"share": "per-session"``): every client session
  gets an instance of its own, started when the session first uses the server
  and stopped when the session ends. The catalog instance is one more,
  serving only the Registry; the aggregated catalog shows its lists, and a
  session's own instance announces its ``list_changed`` to that session
  directly.
- :class:`EraServer` (``"era": "per-client"``): two instances, each client
  served in its own protocol era (docs/eras.md, "Each client in its era"):
  the catalog instance opened legacy, for legacy clients; a second opened
  as ``auto`` would, started by the first modern client, for modern ones.
- :class:`PooledServer` (``"pool": N``): N instances; each request goes to the
  least busy one. What is stateful per session sticks to the instance the
  session was assigned when it attached (subscriptions): those rules are
  :class:`broker.pooling.PoolRouting`'s. What every instance may need to
  hear (cancellations, answers to server requests, departures, log levels)
  goes to all of them: each acts only on its own.

**A failed catalog instance hands the catalog on.** A per-session server's
or a pool's catalog instance that has failed (docs/rules/restarts.md) while
another instance is ready gives the catalog role to that instance: it then
answers the Registry's list requests and reports its state, so the server's
tools stay listed and its calls served (and ``status`` shows it up) while
any instance is. A pool keeps the failed one as an ordinary instance (it is
tried again as every failed server is); a per-session server stops it (unless
it is still a session's own, promoted before: it stays that session's, tried
again), and keeps the promoted instance after its session leaves, as its
catalog's.

**Ready before the first call.** Every instance of a group *warms up*
(broker/upstream.py): after its handshake it lists its own tools, and it
counts as ready, and is handed the requests that waited for it (in order,
bounded), only once it offers the tools the catalog instance offers (it
re-lists on each ``tools/list_changed``), or after
:data:`actors.upstream.WARM_UP_TIMEOUT` (an :class:`EraServer`'s modern
instance once it has listed its own: see there). A server that registers tools only
after ``notifications/initialized`` thus never sees a call before it can
serve it; a call for a tool the instance does not offer gets -32602 naming
the server and the tool.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import trio

from actors.logs import get_logger
from actors.mailbox import SessionHandle
from actors.server_actor import (
    Attach,
    ClientLogLevel,
    ClientRequest,
    Detach,
    InboxItem,
    ServerActor,
    UpstreamStatistics,
)
from actors.upstream import Upstream
from broker import jsonrpc
from broker.config import BrokerSettings, ServerConfig
from broker.fanout import Fanout
from broker.jsonrpc import LIMIT_REACHED
from broker.pooling import InstanceFacts, PoolRouting
from broker.server_requests import ClientIds
from broker.states import ServerState


class ServerGroup:
    share = "per-session"

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        settings: BrokerSettings,
        ids: ClientIds | None = None,
    ) -> None:
        """``ids``: the server's ids for what it asks clients (one sequence
        for every instance: broker/server_requests.py, ``ClientIds``)."""
        self.name = name
        self.config = config
        self.settings = settings
        self.ids = ClientIds(name) if ids is None else ids
        self._catalog = self._instance(0)
        self._nursery: trio.Nursery | None = None
        self._running = trio.Event()  # (set once run() has its nursery: see _start)
        self._instances_changed = trio.Event()  # (set, and renewed, as one starts)
        self._scopes: dict[Upstream, trio.CancelScope] = {}
        self._retired = False  # (no instance starts after retire(): see there)
        self._log = get_logger(server=name)
        # The counters of the instances that ended (a per-session one whose
        # session left): counters only go up, and Prometheus read each
        # session's end as a counter reset.
        self._ended: collections.Counter[str] = collections.Counter()

    def reconfigure(self, config: ServerConfig, settings: BrokerSettings) -> None:
        """New live settings (see Upstream.reconfigure), for every instance, and
        for the instances started later."""
        self.config = config
        self.settings = settings
        for instance in self._all_instances():
            instance.reconfigure(config, settings)

    def _every_instance(self) -> list[Upstream]:
        return self.instances()

    def _all_instances(self) -> list[Upstream]:
        """The catalog instance and every other, once each."""
        return list({self._catalog: None, **dict.fromkeys(self._every_instance())})

    def retry(self) -> None:
        """Try every failed instance again now (a reload)."""
        for instance in self._all_instances():
            instance.retry()

    def _instance(self, index: int) -> Upstream:
        """Instance ``index``; the first (the catalog's) follows the config's startup."""
        lazy = index == 0 and self.config.startup == "lazy"
        expected = None if index == 0 else self._catalog.tools
        return Upstream(
            self.name,
            self.config,
            self.settings,
            lazy=lazy,
            numbering=self.ids,
            warm_up=True,
            expected_tools=expected,
        )

    # -- the face of an Upstream -----------------------------------------------

    @property
    def events(self) -> Any:
        return self._catalog.events

    @events.setter
    def events(self, channel: Any) -> None:
        self._catalog.events = channel

    @property
    def status(self) -> ServerState:
        return self._catalog.status

    @property
    def identity(self) -> Any:
        return self._catalog.identity

    def request_start(self) -> None:
        self._catalog.request_start()

    async def wait_ready(self) -> None:
        await self._catalog.wait_ready()

    def instances(self) -> list[Upstream]:
        return list(self._scopes)

    def statistics(self) -> UpstreamStatistics:
        running = [instance.statistics() for instance in self._scopes]
        catalog = self._catalog.statistics()
        parts = running or [catalog]
        counted = running if self._ended else parts  # (an ended catalog is in _ended)
        ended = self._ended
        # The row shows the catalog instance, or, while that one is not ready
        # (restarting, failed), one that is and serves the calls meanwhile.
        shown = catalog
        if catalog.status != "ready":
            shown = next((p for p in running if p.status == "ready"), catalog)
        return attrs.evolve(
            shown,
            last_error=shown.last_error or catalog.last_error,
            restarts=ended["restarts"] + sum(p.restarts for p in counted),
            sessions=self._sessions(parts),
            in_flight=sum(p.in_flight for p in parts),
            waiting=sum(p.waiting for p in parts),
            inbox=sum(p.inbox for p in parts),
            requests=ended["requests"] + sum(p.requests for p in counted),
            timeouts=ended["timeouts"] + sum(p.timeouts for p in counted),
            errors=ended["errors"] + sum(p.errors for p in counted),
            instances=len(parts),
            share=self.share,
            cpu=_total(p.cpu for p in parts),
            rss=_total(p.rss for p in parts),
            backlog_bytes=sum(p.backlog_bytes for p in parts),
            parked=sum(p.parked for p in parts),
            pids=tuple(pid for p in parts for pid in p.pids),
        )

    def _sessions(self, parts: list[UpstreamStatistics]) -> int:
        """Sessions using the server: each instance has sessions of its own."""
        return sum(p.sessions for p in parts)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._running.set()
            await self._start(self._catalog)
            await self._started()
            if self.hands_catalog_on:
                nursery.start_soon(self._watch_catalog)
            task_status.started()

    async def _started(self) -> None:
        """Hook: start whatever else runs from the beginning."""

    async def send(self, item: InboxItem) -> None:
        raise NotImplementedError

    # -- the catalog instance ----------------------------------------------------

    hands_catalog_on = True  # (not an EraServer: its instances are not alike)

    async def _watch_catalog(self) -> None:
        """Hand the catalog to a ready instance when the catalog instance has
        failed (see the module's doc); watch every instance only while it has."""
        while True:
            if self._catalog.status is not ServerState.FAILED:
                await self._catalog.wait_status_changed()
                continue
            live = [i for i in self.instances() if i.status is ServerState.READY]
            if live and not self._retired:
                self._promote(live[0])
                continue
            # Wait until any of them moves. The events are taken now, with the
            # states just read: a child task reading its own later could take
            # the one that replaced it, and miss the move (the catalog then
            # stayed with the failed instance until retryFailedAfter).
            moves = [instance.status_event() for instance in self.instances()]
            moves.append(self._instances_changed)
            async with trio.open_nursery() as nursery:
                for event in moves:
                    nursery.start_soon(_then_cancel, event.wait, nursery)

    def _promote(self, live: Upstream) -> None:
        failed = self._catalog
        live.events, failed.events = failed.events, None
        self._catalog = live
        self._log.warning("server.catalog_moved", reason=failed.statistics().last_error)
        self._promoted(failed, live)
        live.announce()  # (the Registry reads its lists: the server is back in every view)

    def _promoted(self, failed: Upstream, live: Upstream) -> None:
        """Hook: ``live`` has taken over the catalog from ``failed``."""

    # -- instances --------------------------------------------------------------

    async def _start(self, instance: Upstream) -> None:
        # A session may reach a group a reload just made before the daemon's
        # task runs it (its Attach raced the start): it waits for that.
        await self._running.wait()
        assert self._nursery is not None
        await self._nursery.start(self._run_instance, instance)

    async def _run_instance(
        self, instance: Upstream, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with trio.CancelScope() as scope:
            self._scopes[instance] = scope
            self._instances_changed.set()
            self._instances_changed = trio.Event()
            try:
                await instance.run(task_status=task_status)
            finally:
                del self._scopes[instance]
                last = instance.statistics()
                for counter in ("restarts", "requests", "timeouts", "errors"):
                    self._ended[counter] += getattr(last, counter)

    def retire(self, reason: str, *, retryable: bool = False) -> None:
        """Stop for good (see Upstream.retire): every instance answers what it
        has in flight or waiting; the caller then cancels :meth:`run`. What
        comes later (a session that raced the reload) goes to the retired
        catalog instance, which answers its requests with the same error:
        no instance starts in a group about to stop."""
        self._retired = True
        for instance in self._all_instances():
            instance.retire(reason, retryable=retryable)

    def take_unsent(self) -> list[ClientRequest]:
        """What no instance has sent to its server yet (see Upstream.take_unsent)."""
        return [item for instance in self._all_instances() for item in instance.take_unsent()]

    def take_over(self, unsent: list[ClientRequest]) -> None:
        """A reload put this group (not running yet) in the place of one that
        never sent ``unsent`` to a server: each goes now, in order, to the
        instance it would go to if sent (Upstream.take_over), ahead of what
        sessions send from now on."""
        raise NotImplementedError

    def asked(self) -> Fanout:
        """What the sessions asked of every instance (log levels, subscriptions)."""
        asked = self._catalog.asked()
        for instance in self.instances():
            if instance is not self._catalog:
                asked = asked.merged(instance.asked())
        return asked

    def modern_sessions(self) -> set[Any]:
        return set().union(*(instance.modern_sessions() for instance in self._all_instances()))

    def inherit(self, old: ServerActor) -> None:
        """A reload put this group in ``old``'s place: its counters go on from
        the old one's, whatever it was (counted as those of instances that
        ended: counters only go up); what the sessions asked, see the
        subclasses."""
        last = old.statistics()
        for counter in ("restarts", "requests", "timeouts", "errors"):
            self._ended[counter] += getattr(last, counter)

    def _stop(self, instance: Upstream) -> None:
        """Stop an instance: its process is shut down the way the spec says."""
        scope = self._scopes.get(instance)
        if scope is not None:
            scope.cancel()


class PerSessionServer(ServerGroup):
    """An instance per session, started by the session's first request to the
    server (not by its attaching: a session that never uses the server costs
    no process). Until then the group keeps what the instance must be told
    first: the session's Attach and its log level."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        settings: BrokerSettings,
        ids: ClientIds | None = None,
    ) -> None:
        super().__init__(name, config, settings, ids)
        self._mine: dict[SessionHandle, Upstream] = {}
        self._taken_over: list[SessionHandle] = []  # (their instances start with the group)
        self._waiting: dict[SessionHandle, list[InboxItem]] = {}  # (attached, no instance yet)
        self._inherited = Fanout()  # what sessions asked of the server a reload replaced

    def inherit(self, old: ServerActor) -> None:
        """Each session's instance is asked, at its handshake, what that
        session asked of the server this group replaces; a session subscribed
        to something gets its instance as it attaches (not at its first
        request), so that its updates go on."""
        super().inherit(old)
        self._inherited = old.asked().for_new_server()  # (a copy: old may be draining)

    def _every_instance(self) -> list[Upstream]:
        """The running instances, and those a reload's take_over made that have
        not started yet: what they hold goes with a second reload (take_unsent)
        or is answered (retire), as for any instance."""
        running = self.instances()
        return running + [i for i in self._mine.values() if i not in self._scopes]

    def asked(self) -> Fanout:
        """What the sessions asked of every instance, and of the group for
        those that have none yet: their log level (kept with their Attach)
        and what a reload before this one left them. (A reload passes it all
        on: a session tells its level only when it changes.)"""
        idle = self._inherited.without(self._mine.keys())
        for session, kept in self._waiting.items():
            for item in kept:
                if isinstance(item, ClientLogLevel) and session not in self._mine:
                    if item.level is None:
                        idle.clear_level(session)
                    else:
                        idle.set_level(session, item.level)
        return super().asked().merged(idle)

    async def send(self, item: InboxItem) -> None:
        session = item.session
        if session.internal or self._retired:
            await self._catalog.send(item)
            return
        instance = self._mine.get(session)
        if instance is None and not isinstance(item, ClientRequest):
            self._keep(item)  # (no instance yet: nothing of it to cancel or answer)
            subscribed = isinstance(item, Attach) and session in self._inherited.subscribing()
            # (its updates go on: it gets its instance now, told the kept Attach)
            if subscribed and await self._start_for(session) is None:
                self._tell_unsubscribed(session)
            return
        if isinstance(item, Detach):
            assert instance is not None  # (without one: kept above)
            del self._mine[session]
            self._inherited.session_gone(session)
            if instance is self._catalog:  # (promoted: it serves the catalog now)
                await instance.send(item)
                return
            self._stop(instance)
            self._log.info("server.instance_stopped", session=session.id)
            return
        if instance is None:
            instance = await self._start_for(session)
            if instance is None:
                assert isinstance(item, ClientRequest)  # (the rest was kept above)
                self._refuse(item)
                return
        await instance.send(item)

    def take_over(self, unsent: list[ClientRequest]) -> None:
        """Each session's requests go to an instance of its own, made now and
        started with the group (:meth:`_started`); one whose session leaves
        first is never started (its Detach comes here: see :meth:`send`)."""
        for item in unsent:
            session = item.session
            if session.internal:
                self._catalog.take_over([item])
                continue
            instance = self._mine.get(session) or self._new_instance(session)
            if instance is None:
                self._refuse(item)
                continue
            if session not in self._taken_over:
                self._taken_over.append(session)
            instance.take_over([item])

    async def _started(self) -> None:
        for session in self._taken_over:
            instance = self._mine.get(session)
            if instance is None:  # (its session left before: nothing to start)
                continue
            if self._retired:  # (a second reload took what it held, or answered it)
                continue
            await self._start(instance)
            if self._mine.get(session) is not instance:  # (it left meanwhile)
                self._stop(instance)
                continue
            self._log.info("server.instance_started", session=session.id)
        self._taken_over.clear()

    def _new_instance(self, session: SessionHandle) -> Upstream | None:
        """``session``'s instance, not started; None if every instance allowed
        (maxInstances) runs."""
        if len(self._mine) >= self.config.max_instances:
            return None
        instance = self._mine[session] = self._instance(len(self._mine) + 1)
        session.owns_instance = True
        instance.adopt(self._inherited.only({session}))
        return instance

    async def _start_for(self, session: SessionHandle) -> Upstream | None:
        """Start ``session``'s instance and tell it what was kept for the
        session; None if every instance allowed (maxInstances) runs."""
        instance = self._new_instance(session)
        if instance is None:
            return None
        try:
            await self._start(instance)
        except BaseException:  # (cancelled: the session is closing)
            del self._mine[session]  # (it never ran: it must not take requests)
            raise
        self._log.info("server.instance_started", session=session.id)
        for first in self._waiting.pop(session, []):
            await instance.send(first)
        return instance

    def _refuse(self, item: ClientRequest) -> None:
        """A session's first request when every instance allowed runs: -32005.
        (Its Attach stays kept: a later request may find room.)"""
        limit = self.config.max_instances
        self._log.warning("server.instances_limit", session=item.session.id, limit=limit)
        for request in item.messages:
            item.session.deliver(
                jsonrpc.error_response(
                    request["id"],
                    LIMIT_REACHED,
                    f"MCP server {self.name!r} runs one process per session and already runs "
                    f"{limit}, its limit (maxInstances): try again when a session has ended",
                    data={"server": self.name, "limit": limit},
                )
            )

    def _tell_unsubscribed(self, session: SessionHandle) -> None:
        """A session subscribed to something before a reload finds no room for
        its instance: it gets no updates until its next request to the server
        finds room (that instance is asked its subscriptions). It is told so,
        with a log message, since nothing else would tell it."""
        limit = self.config.max_instances
        asked = self._inherited.only({session})
        uris = sorted(asked.subscribed_uris())
        self._log.warning(
            "server.instances_limit", session=session.id, limit=limit, subscriptions=uris
        )
        said = (
            f"mcpbroker: MCP server {self.name!r}, restarted by a reload, runs one process per "
            f"session and already runs {limit}, its limit (maxInstances): your subscriptions "
            f"({', '.join(uris)}) get no updates until a request of yours to it finds room"
        )
        params = {"level": "warning", "logger": "mcpbroker", "data": said}
        session.deliver(jsonrpc.notification("notifications/message", params))

    def _keep(self, item: InboxItem) -> None:
        """What a session without an instance sends: its Attach and its last log
        level are kept for the instance its first request starts; the rest (its
        departure, a cancellation, an answer, a notification) has nothing to
        reach."""
        session = item.session
        if isinstance(item, Attach):
            self._waiting[session] = [item]
        elif isinstance(item, ClientLogLevel) and session in self._waiting:
            kept = [i for i in self._waiting[session] if not isinstance(i, ClientLogLevel)]
            self._waiting[session] = [*kept, item]
        elif isinstance(item, Detach):
            self._waiting.pop(session, None)
            self._inherited.session_gone(session)

    def _promoted(self, failed: Upstream, live: Upstream) -> None:
        # One that served only the catalog stops: its successor does now. One
        # that a session still has (promoted once before) stays that session's,
        # tried again as every failed server is: stopped, it would take the
        # session's requests and answer none.
        if failed not in self._mine.values():
            self._stop(failed)


class EraServer(ServerGroup):
    """A server that speaks both eras, each client served in its own.

    The catalog instance is opened ``"legacy"`` (which works whatever the
    server speaks) and serves the Registry and every legacy client; the
    modern instance is opened ``"auto"`` (the probe) when the first modern
    client attaches, and serves the modern ones. So neither era is bridged,
    and a tool that asks its client the legacy way (server-to-client
    requests) works for legacy clients. A session keeps the instance it
    attached to. Where the catalog instance came up modern (a modern-only
    server, which refuses ``initialize``), modern clients share it: a second
    instance would be the same."""

    share = "per-era"
    hands_catalog_on = False

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        settings: BrokerSettings,
        ids: ClientIds | None = None,
    ) -> None:
        super().__init__(name, config, settings, ids)
        self._modern: Upstream | None = None  # (started by the first modern client)
        self._modern_sessions: set[SessionHandle] = set()
        self._inherited_modern = Fanout()  # (what they asked of the server a reload replaced)
        self._modern_before: set[Any] = set()  # (the sessions that were modern there)
        self._shared_before = False  # (the group a reload replaced was modern-only)

    def _instance(self, index: int) -> Upstream:
        """The catalog instance (0), opened legacy; the modern one (1), opened
        auto. Each warms up (lists its own tools after its handshake), but the
        modern one is not held to the catalog's tools as a per-session one
        is: a server may offer other tools in the other era (one registered
        on ``notifications/initialized``, which the modern era has not, or
        added at run time to the legacy process), and would then keep every
        modern client waiting for the warm-up's time-out on each start."""
        config = attrs.evolve(self.config, era="legacy" if index == 0 else "auto")
        lazy = index == 0 and config.startup == "lazy"
        return Upstream(
            self.name, config, self.settings, lazy=lazy, numbering=self.ids, warm_up=True
        )

    def reconfigure(self, config: ServerConfig, settings: BrokerSettings) -> None:
        self.config = config
        self.settings = settings
        self._catalog.reconfigure(attrs.evolve(config, era="legacy"), settings)
        if self._modern is not None:
            self._modern.reconfigure(attrs.evolve(config, era="auto"), settings)

    def _every_instance(self) -> list[Upstream]:
        return [] if self._modern is None else [self._modern]

    def inherit(self, old: ServerActor) -> None:
        """What the sessions asked of the server this one replaces is asked of
        the instance of their era at its handshake: the catalog (legacy)
        instance takes what legacy sessions asked, the modern one, when the
        first modern client starts it, what the modern sessions asked (a
        modern client's listen URIs are subscribed once, and not again)."""
        super().inherit(old)
        asked = old.asked()
        modern = self._modern_before = old.modern_sessions()
        identity = old.identity  # (a per-client group's catalog came up modern: modern-only)
        per_era = old.statistics().share == self.share
        self._shared_before = per_era and identity is not None and identity.modern
        if self._shared_before:  # (its modern sessions shared the catalog instance: they do)
            self._catalog.adopt(asked)
            return
        self._catalog.adopt(asked.without(modern))
        self._inherited_modern = asked.only(modern)

    def _shares_catalog(self) -> bool:
        """Modern clients share the catalog instance: it came up modern (a
        modern-only server), or, while it opens after a reload, the one it
        replaced did (docs/eras.md)."""
        identity = self._catalog.identity
        return identity.modern if identity is not None else self._shared_before

    def take_over(self, unsent: list[ClientRequest]) -> None:
        """A modern session's requests go to the modern instance, made now (and
        started with the group) if none is; the rest to the catalog instance.
        (A modern session's Attach comes later: it finds its instance made.)"""
        for item in unsent:
            session = item.session
            if session not in self._modern_before or self._shared_before:
                self._catalog.take_over([item])
                continue
            self._modern_sessions.add(session)
            self._made_modern().take_over([item])

    def _made_modern(self) -> Upstream:
        """The modern instance, made now (not started) if there is none, with
        what its sessions asked of the server a reload replaced."""
        if self._modern is None:
            self._modern = self._instance(1)
            self._modern.adopt(self._inherited_modern)
        return self._modern

    async def _started(self) -> None:
        if self._retired:  # (a second reload took what it held, or answered it)
            return
        if self._modern is not None and self._modern not in self._scopes:  # (take_over's)
            await self._start(self._modern)
            self._log.info("server.instance_started", era="modern")

    async def send(self, item: InboxItem) -> None:
        session = item.session
        if (
            isinstance(item, Attach)
            and item.modern
            and not self._retired
            and not self._shares_catalog()
        ):
            self._modern_sessions.add(session)
            if self._modern is None:
                try:
                    await self._start(self._made_modern())
                except BaseException:  # (cancelled: the session is closing)
                    self._modern = None  # (it never ran: the next modern client starts one)
                    self._modern_sessions.discard(session)
                    raise
                self._log.info("server.instance_started", era="modern")
        if self._modern is not None and session in self._modern_sessions:
            if isinstance(item, Detach):
                self._modern_sessions.discard(session)
            await self._modern.send(item)
        else:
            await self._catalog.send(item)


class PooledServer(ServerGroup):
    share = "pool"

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        settings: BrokerSettings,
        ids: ClientIds | None = None,
    ) -> None:
        super().__init__(name, config, settings, ids)
        self._pool = [self._catalog] + [self._instance(i) for i in range(1, config.pool)]
        self._routing = PoolRouting()

    def _instance(self, index: int) -> Upstream:
        # (Its requests to clients are numbered from the group's one sequence:
        # never two alike.) Instance 0 (the catalog's) follows the config's startup; the others wait
        # for it (see _grow), so they are lazy until then.
        lazy = index > 0 or self.config.startup == "lazy"
        instance = Upstream(
            self.name, self.config, self.settings, lazy=lazy, numbering=self.ids, warm_up=True
        )
        # Its sessions' catalog is the catalog instance's (the Registry's): a
        # list_changed of another instance is not theirs (it re-lists, to
        # warm up, all the same). The catalog instance's goes to the Registry.
        instance.lists_to_sessions = False
        instance.keep_request_states()  # (a retry goes where its state was made)
        return instance

    def request_start(self) -> None:
        self._catalog.request_start()  # (and the others once it is ready: _grow)

    def _every_instance(self) -> list[Upstream]:
        return self._pool

    def _sessions(self, parts: list[UpstreamStatistics]) -> int:
        # (every instance of a pool hears every session: each counted it once)
        return max((p.sessions for p in parts), default=0)

    async def wait_ready(self) -> None:
        """Wait until every instance of the pool is ready (for tests and tools)."""
        for instance in self._pool:
            await instance.wait_ready()

    async def _started(self) -> None:
        for instance in self._pool[1:]:
            await self._start(instance)  # (it hears sessions arrive, and waits to start)
        assert self._nursery is not None
        self._nursery.start_soon(self._grow)

    async def _grow(self) -> None:
        """Start the other instances once the catalog's is ready, each expecting the
        tools it offers: like a per-session instance, each is then ready only when it
        offers them (or refuses calls for those it does not, naming the server)."""
        await self._catalog.wait_ready()
        for instance in self._pool[1:]:
            instance.expect_tools(self._catalog.tools)
            instance.request_start()

    async def send(self, item: InboxItem) -> None:
        if isinstance(item, ClientRequest):
            for instance, one in self._routed(item):
                await instance.send(one)
            return
        if isinstance(item, Attach):
            self._routing.attach(item.session, self._facts())
        elif isinstance(item, Detach):
            self._routing.detach(item.session)
        for instance in self._pool:
            await instance.send(item)

    def take_over(self, unsent: list[ClientRequest]) -> None:
        for item in unsent:
            for instance, one in self._routed(item):
                instance.take_over([one])

    def _routed(self, item: ClientRequest) -> Iterator[tuple[Upstream, ClientRequest]]:
        """Each request of ``item`` to the least busy instance (as busy as it is
        when the one before has been sent), or to the one its session or its
        task sticks to (broker/pooling.py)."""
        size = item.size // max(1, len(item.messages))
        for message in item.messages:
            route = self._routing.route(item.session, message, self._facts(), self._pool)
            if route.left is not None:  # (moved off a failed instance)
                self._pool[route.left].forget_subscriptions(item.session)
            yield self._pool[route.index], ClientRequest(item.session, [message], size)

    def inherit(self, old: ServerActor) -> None:
        """Every instance hears every session's log level; a session's
        subscriptions go to the catalog's instance, to which such a session
        is assigned (where its later subscription requests go)."""
        super().inherit(old)
        asked = old.asked()
        subscribing = asked.subscribing()
        self._pool[0].adopt(asked)
        for instance in self._pool[1:]:
            instance.adopt(asked.levels_only())
        for session in subscribing:
            self._routing.assign(session, 0)

    def _promoted(self, failed: Upstream, live: Upstream) -> None:
        # The catalog's instance is first (broker/pooling.py): the two swap places.
        index = self._pool.index(live)
        self._pool[0], self._pool[index] = live, failed
        self._routing.swap(0, index)

    def _facts(self) -> list[InstanceFacts]:
        """What the routing rules (broker/pooling.py) see of each instance now."""
        return [
            InstanceFacts(
                instance.status is ServerState.READY,
                instance.load,
                instance.tools,
                failed=instance.status is ServerState.FAILED,
            )
            for instance in self._pool
        ]


async def _then_cancel(wait: Any, nursery: trio.Nursery) -> None:
    await wait()
    nursery.cancel_scope.cancel()


def _total(values: Iterable[Any]) -> Any:
    """The sum of the figures known (None if none is)."""
    known = [value for value in values if value is not None]
    return sum(known) if known else None
