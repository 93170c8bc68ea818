"""The Registry actor: the aggregated catalog, kept fresh, published as snapshots.

The Registry learns from every Upstream when its status changes and when it
sends a ``list_changed`` notification (through one bounded event channel),
fetches that server's lists (draining every page) with an
:class:`InternalClient`, and publishes a new immutable :class:`Catalog`.
Sessions read ``registry.current`` to answer list requests and route calls,
so a client's ``tools/list`` costs no round trip to any server.

After each change it tells every subscribed session whose view includes the
server, once, with the matching ``list_changed`` notification; and only when
the lists really changed. A server that is restarting keeps its lists (its
calls get a retryable error meanwhile), and sessions hear of its restart only
if it comes back with other lists; one that fails or stops drops out of the
catalog (sessions are told), and comes back when it is up again. A list that
cannot be read (an error, no answer, no list) keeps the last one read, and is
fetched again later (:meth:`Registry._retry_later`). What to ask for
next, what a page holds, and who is told what are rules of
:mod:`broker.listing`; this actor sends, waits and delivers.

A reload adds, removes and replaces servers (:meth:`Registry.add_server`,
:meth:`Registry.remove_server`, :meth:`Registry.replace_server`), each a
synchronous change of the catalog made by the daemon together with the views
of its sessions, so that no session ever looks up a server the catalog does
not hold. Events from a server no longer in the catalog are ignored.

One Registry serves all four kinds (DESIGN.md sketches one per kind): a
server's lists change together when it restarts, and one snapshot keeps a
session's view of them consistent.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import trio

from actors.internal import InternalClient
from actors.logs import get_logger
from actors.mailbox import SessionHandle
from actors.server_actor import ServerActor, ServerEvent
from broker.catalog import (
    KINDS,
    KINDS_BY_NOTIFICATION,
    PROMPTS,
    TOOLS,
    Catalog,
    Kind,
    ServerEntry,
)
from broker.config import BrokerSettings
from broker.jsonrpc import JsonRpcError
from broker.listing import (
    Lister,
    changed_kinds,
    list_changed,
    new_clashes,
    renamed,
    renamed_elsewhere,
)
from broker.states import DOWN, ServerState

EVENTS_SIZE = 1024
FETCH_TIMEOUT = 30.0
RETRY_FIRST = 5.0  # seconds before a list that could not be read is fetched again
RETRY_MAX = 300.0  # (the delay doubles on each failure in a row, up to this)


@attrs.frozen
class Subscribe:
    session: SessionHandle
    view: frozenset[str]
    transparent: bool = False  # (its names carry no separator: broker/hello.py)


@attrs.frozen
class Unsubscribe:
    session: SessionHandle


RegistryEvent = ServerEvent | Subscribe | Unsubscribe


class Registry:
    def __init__(self, upstreams: Mapping[str, ServerActor], settings: BrokerSettings) -> None:
        """Serve the catalog of ``upstreams``, and hear from them (sets their ``events``)."""
        self._upstreams = upstreams
        entries = [ServerEntry(name, up.status) for name, up in upstreams.items()]
        # The latest catalog, which every session reads on every call: an
        # attribute, not a property, so that the compiled rules read it
        # without running a line of Python (a frame a call, before).
        self.current = Catalog(entries, settings.separator, settings.page_size, tuple(upstreams))
        self._changed = trio.Event()
        self.events, self._events = trio.open_memory_channel[RegistryEvent](EVENTS_SIZE)
        self._client = InternalClient()
        self._subscribers: dict[SessionHandle, frozenset[str]] = {}
        self._transparent: set[SessionHandle] = set()  # (of the subscribers)
        self._generation = dict.fromkeys(upstreams, 0)
        self._pending: dict[str, set[Kind]] = {}  # lists to refresh, per server being refreshed
        # Lists to fetch again, per server waiting, with the generation whose
        # fetch failed (a restart's new fetch failing starts a timer of its own).
        self._retry_kinds: dict[str, tuple[int, set[Kind]]] = {}
        self._failures: dict[str, int] = {}  # failed refreshes in a row, per server
        self._nursery: trio.Nursery | None = None
        self._log = get_logger()
        for upstream in upstreams.values():
            upstream.events = self.events

    async def subscribe(
        self, session: SessionHandle, view: tuple[str, ...], transparent: bool = False
    ) -> None:
        await self.events.send(Subscribe(session, frozenset(view), transparent))

    async def unsubscribe(self, session: SessionHandle) -> None:
        await self.events.send(Unsubscribe(session))

    async def wait_settled(self, view: tuple[str, ...]) -> None:
        """Wait until no server of the view is starting or loading its lists.

        A lazy server that has not started yet is started now.
        """
        for name in view:
            if name in self.current.servers and self.current.entry(name).state is ServerState.IDLE:
                self._upstreams[name].request_start()
        # (a reload may remove a server of the view meanwhile)
        while not self.current.settled([n for n in view if n in self.current.servers]):
            await self._changed.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._client.run)
            task_status.started()
            async for event in self._events:
                try:
                    self._handle(event)
                except Exception:  # a bug of the broker's: this event only, not the daemon
                    self._log.exception("catalog.event_failed", failed=repr(event))

    # -- events ---------------------------------------------------------------

    def _handle(self, event: RegistryEvent) -> None:
        if isinstance(event, Subscribe):
            self._subscribers[event.session] = event.view
            if event.transparent:
                self._transparent.add(event.session)
        elif isinstance(event, Unsubscribe):
            self._subscribers.pop(event.session, None)
            self._transparent.discard(event.session)
        elif event.server not in self.current.servers:
            return  # a server a reload removed
        elif event.status is not None:
            self._status_changed(event.server, event.status)
        elif event.list_changed is not None:
            kinds = KINDS_BY_NOTIFICATION.get(event.list_changed, ())
            # Ready, its lists read or being read: a change while they are
            # read is read after them (it may have come after that list).
            if kinds and self.current.entry(event.server).state is ServerState.READY:
                self._want_refresh(event.server, kinds)

    def _status_changed(self, server: str, status: ServerState) -> None:
        """The server's state moved: the entry takes it (the server's own state,
        broker/states.py); a ready server's lists are fetched (it is served
        once they are: ``loading``; sessions hear of the kinds that differ from
        what the catalog had), a server that is restarting keeps its lists, one
        that failed or stopped leaves the catalog."""
        self._generation[server] += 1
        entry = self.current.entry(server)
        if status is ServerState.READY:
            self._publish(attrs.evolve(entry, state=status, loading=True, error=None))
            self._want_refresh(server, KINDS)
        elif status is ServerState.RESTARTING:
            # Its lists stay (a call gets a retryable error meanwhile): a restart
            # that brings the same lists back is no change to tell sessions of.
            error = self._upstreams[server].statistics().last_error
            self._publish(attrs.evolve(entry, state=status, loading=False, error=error))
        elif status in DOWN:
            error = self._upstreams[server].statistics().last_error
            down = attrs.evolve(
                entry, state=status, loading=False, lists={}, unread={}, cut={}, error=error
            )
            self._publish(down)
            self._notify(server, changed_kinds(entry, down, KINDS))
        else:  # coming up
            self._publish(attrs.evolve(entry, state=status, loading=False))

    def _want_refresh(self, server: str, kinds: tuple[Kind, ...]) -> None:
        """Refresh some of a server's lists: one task per server at a time.

        Requests that arrive while a refresh runs are merged and done after it,
        so refreshes of one server never overlap or publish out of order, and a
        server that floods list_changed costs one task.
        """
        pending = self._pending.get(server)
        if pending is not None:
            pending.update(kinds)
            return
        self._pending[server] = set(kinds)
        assert self._nursery is not None
        self._nursery.start_soon(self._refresh_while_wanted, server)

    async def _refresh_while_wanted(self, server: str) -> None:
        try:
            while wanted := self._pending[server]:
                self._pending[server] = set()
                try:
                    await self._refresh(server, tuple(k for k in KINDS if k in wanted))
                except Exception:  # a bug of the broker's: keep what is known, settle
                    self._log.exception("catalog.refresh_failed", server=server)
                    entry = self.current.servers.get(server)
                    if entry is not None and entry.loading:
                        identity = self._upstreams[server].identity
                        self._publish(attrs.evolve(entry, loading=False, identity=identity))
        finally:
            del self._pending[server]

    # -- fetching -------------------------------------------------------------

    async def _refresh(self, server: str, kinds: tuple[Kind, ...]) -> None:
        """Fetch some of a server's lists and publish them (if the server is still up)."""
        generation = self._generation[server]
        upstream = self._upstreams.get(server)
        if upstream is None:
            return  # a reload removed it

        identity = upstream.identity
        capabilities = identity.capabilities if identity is not None else {}
        fetched: dict[str, tuple[dict[str, Any], ...]] = {}
        failed: dict[str, str] = {}
        cut: dict[str, str] = {}
        for kind in kinds:
            if kind.capability not in capabilities:
                fetched[kind.name] = ()  # it offers none now (a restart, a reload)
            else:
                outcome = await self._fetch(upstream, kind)
                if isinstance(outcome, str):
                    failed[kind.name] = outcome
                else:
                    fetched[kind.name], why = outcome
                    if why is not None:
                        cut[kind.name] = why
        if self._generation[server] != generation:
            return  # it restarted or went down meanwhile; a newer refresh follows
        old = self.current.entry(server)
        # A list that could not be read keeps the last one read (and is tried
        # again later): one failed refresh must not empty a running server.
        unread = {k: e for k, e in old.unread.items() if k not in fetched} | failed
        lists = {**old.lists, **fetched}
        cut = {k: why for k, why in old.cut.items() if k not in fetched} | cut
        new = attrs.evolve(
            old, loading=False, identity=identity, lists=lists, unread=unread, cut=cut
        )
        self._publish(new)
        self._notify(server, changed_kinds(old, new, kinds))
        if failed:
            self._retry_later(server, [kind for kind in kinds if kind.name in failed])
        elif not unread:
            self._failures.pop(server, None)

    async def _fetch(
        self, upstream: ServerActor, kind: Kind
    ) -> tuple[tuple[dict[str, Any], ...], str | None] | str:
        """One list of a server, every page (the rules: broker/listing.py),
        and why it was cut off before its end (None: it was not); or, if it
        could not be read, why."""
        cut: str | None = None
        lister = Lister(kind)
        # (every line of this fetch names its server and method)
        warn = functools.partial(self._log.warning, server=upstream.name, method=kind.method)
        params: dict[str, Any] | None = lister.first_request()
        while params is not None:
            try:
                with trio.fail_after(FETCH_TIMEOUT):
                    result = await self._client.call(upstream, kind.method, params)
            except (JsonRpcError, trio.TooSlowError) as exc:
                error = exc.message if isinstance(exc, JsonRpcError) else "no answer in time"
                warn("catalog.fetch_failed", error=error)
                return error
            read = lister.page(result)
            for item in read.invalid:
                warn("catalog.invalid_item", item=repr(item)[:200])
            if read.error is not None:
                warn("catalog.fetch_failed", error=read.error, result=repr(result)[:200])
                return read.error
            if read.cut is not None:
                warn("catalog.list_cut", reason=read.cut, kept=len(lister.items()))
                cut = read.cut
            params = read.next
        return lister.items(), cut

    def _retry_later(self, server: str, kinds: Iterable[Kind]) -> None:
        """Fetch lists that could not be read again, after a while (one timer
        a server; the delay doubles on each failure in a row, up to
        :data:`RETRY_MAX`)."""
        generation = self._generation[server]
        pending = self._retry_kinds.get(server)
        if pending is not None and pending[0] == generation:
            pending[1].update(kinds)
            return
        if pending is not None:  # (a timer of an earlier connection's: it stands down)
            self._failures.pop(server, None)
        self._retry_kinds[server] = (generation, set(kinds))
        failures = self._failures[server] = self._failures.get(server, 0) + 1
        delay = min(RETRY_FIRST * 2 ** (failures - 1), RETRY_MAX)
        self._log.info("catalog.fetch_retry", server=server, seconds=delay)
        assert self._nursery is not None
        self._nursery.start_soon(self._retry, server, generation, delay)

    async def _retry(self, server: str, generation: int, delay: float) -> None:
        await trio.sleep(delay)
        pending = self._retry_kinds.get(server)
        if pending is None or pending[0] != generation:
            return  # (a later connection's failure took it over)
        del self._retry_kinds[server]
        entry = self.current.servers.get(server)
        if self._generation.get(server) == generation and entry is not None and entry.serving:
            self._want_refresh(server, tuple(k for k in KINDS if k in pending[1]))

    # -- publishing -----------------------------------------------------------

    def reconfigure(self, settings: BrokerSettings) -> None:
        """New live settings (a reload): a new separator renames the tools and
        prompts of every server, and every session is told its lists changed;
        a new page size holds for the next list request."""
        old = self.current
        self.current = Catalog(
            old.servers.values(), settings.separator, settings.page_size, old.seniority, old
        )
        if settings.separator != old.separator:  # (once a session, not once a server)
            for session, note in renamed((TOOLS, PROMPTS), self._subscribers, self._transparent):
                session.deliver(note)

    # -- a reload ---------------------------------------------------------------

    def add_server(self, name: str, viewers: Iterable[SessionHandle]) -> None:
        """``name`` is new in the upstreams (in their order): it joins the catalog,
        and the views of ``viewers`` (sessions that see every server, or that
        named it). They are told once its lists are read, like any server that
        comes up. It is junior to every server there: a name or URI it
        shares with one of theirs stays theirs (docs/naming-and-routing.md)."""
        upstream = self._upstreams[name]
        upstream.events = self.events
        self._generation[name] = self._generation.get(name, 0) + 1
        seniority = (*(s for s in self.current.seniority if s != name), name)
        self._rebuild({name: ServerEntry(name, upstream.status)}, seniority=seniority)
        for session in viewers:
            view = self._subscribers.get(session)
            if view is not None:
                self._subscribers[session] = view | {name}

    def remove_server(self, name: str) -> None:
        """``name`` has left the upstreams: its lists leave the catalog, and every
        session that saw something of it is told (once per kind that changed)."""
        entry = self.current.servers.get(name)
        if entry is None:
            return
        self._generation[name] += 1  # (a refresh under way is dropped)
        self._notify(name, changed_kinds(entry, ServerEntry(name), KINDS))
        seniority = tuple(s for s in self.current.seniority if s != name)
        self._rebuild({}, cause=name, seniority=seniority)
        for session, view in self._subscribers.items():
            if name in view:
                self._subscribers[session] = view - {name}

    def replace_server(self, name: str) -> None:
        """``name`` has a new actor (a reload restarted it): the catalog keeps the
        old one's lists until the new one's are read, so sessions are told only
        if they differ (its calls wait for it meanwhile, as for any server
        starting)."""
        upstream = self._upstreams[name]
        upstream.events = self.events
        self._generation[name] += 1
        old = self.current.entry(name)
        self._rebuild({name: attrs.evolve(old, state=upstream.status, loading=False, error=None)})

    def _rebuild(
        self,
        new: dict[str, ServerEntry],
        cause: str | None = None,
        seniority: tuple[str, ...] | None = None,
    ) -> None:
        """A catalog of the upstreams as they are now (their order), with ``new``
        entries, the others as they were (servers the daemon is adding in the
        same reload, not yet given to the catalog, are left for their turn);
        ``seniority``, if given, replaces the catalog's."""
        known = self.current.servers
        entries = [
            entry
            for name in self._upstreams
            if (entry := new.get(name) or known.get(name)) is not None
        ]
        old = self.current
        seniority = old.seniority if seniority is None else seniority
        self.current = Catalog(entries, old.separator, old.page_size, seniority, old)
        for clash in new_clashes(old, self.current):
            self._log.warning("catalog.clash", detail=clash)
        self._tell_renamed(old, cause)
        self._changed.set()
        self._changed = trio.Event()

    def _publish(self, entry: ServerEntry) -> None:
        before, self.current = self.current, self.current.replace(entry)
        for clash in new_clashes(before, self.current):
            self._log.warning("catalog.clash", detail=clash)
        self._tell_renamed(before, entry.name)
        self._changed.set()
        self._changed = trio.Event()

    def _tell_renamed(self, before: Catalog, cause: str | None) -> None:
        for session, note in renamed_elsewhere(
            before, self.current, cause, self._subscribers, self._transparent
        ):
            session.deliver(note)

    def _notify(self, server: str, kinds: list[Kind]) -> None:
        for session, note in list_changed(server, kinds, self._subscribers):
            session.deliver(note)
