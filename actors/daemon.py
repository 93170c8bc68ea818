"""The Supervisor: the daemon's nursery tree, start order and shutdown.

Start order: what the process was handed (who started it, from
``$MCPBROKER_STARTED_BY``; a listening socket, if a service manager passed
one), then the lock on the socket (so two daemons never fight over it),
then every Upstream (each starts its server in the background; sessions that
need it wait for its handshake), then the Listener.

**Reload** (:meth:`Daemon.reload`: ``mcpbroker reload``, SIGHUP): the new
configuration is compared with the running one (broker/configdiff.py).
Live settings are handed to what runs (:meth:`Daemon.reconfigure`); new
servers get an actor in the tree and join the catalog and the views of the
sessions that see every server; a changed server gets a new actor in place
of the old; a removed one leaves the catalog and every view at once. An old
actor (removed or replaced) finishes its requests in flight for up to
``broker.shutdownTimeout``, answers what is left with an error naming
itself, and stops its server. A transparent session whose server was removed
is refused new requests at once and closed once that server is gone. Every
change to the catalog and the views is made in one synchronous step, so no
session ever routes to a server the catalog lacks.

**Shutdown** (:meth:`Daemon.shut_down`, on SIGTERM or SIGINT): new requests
are refused with an error saying the daemon is stopping; requests in flight
get ``broker.shutdownTimeout`` to finish; each session then answers what is
left with that error and closes. Cancelling the tree (the caller's part)
then stops each server the way the spec says (close stdin, wait, SIGTERM,
SIGKILL: actors/links/stdio.py), and the socket file is removed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable, Iterator, MutableMapping
from functools import partial
from typing import Any

import attrs
import structlog
import trio

import broker.upstream
from actors.audit import AuditLog
from actors.downstream.connection import Connection
from actors.downstream.http import serve_http
from actors.downstream.metrics import serve_metrics
from actors.downstream.stream import StreamConnection
from actors.downstream.unix import (
    ConfigRefused,
    StartError,
    claim_socket_path,
    hold_socket_lock,
    serve_unix,
    take_inherited_listener,
)
from actors.downstream.websocket import policy_for, serve_websocket
from actors.logs import get_logger
from actors.paths import STARTED_BY_ENV, UnsafePath, prepare_socket_dir, take_listeners_origin
from actors.registry import Registry
from actors.sdnotify import Notifier
from actors.server_actor import ClientRequest, ServerActor, UpstreamStatistics
from actors.session import Session, SessionStatistics
from actors.sharing import EraServer, PerSessionServer, PooledServer
from actors.upstream import Upstream
from broker.calls import CallStats
from broker.config import BrokerSettings, Config, ConfigError, ServerConfig, parse_address
from broker.configdiff import ConfigDiff, Effect, diff
from broker.server_requests import ClientIds
from broker.wire.websocket import Policy

# How broker/ was installed: compiled by mypyc (setup.py), or as Python.
RULES = "compiled" if (broker.upstream.__file__ or "").endswith((".so", ".pyd")) else "Python"
# Who started a daemon (DaemonStatistics.started_by): the shim, a service
# manager (the unit `mcpbroker service install` writes), or someone by hand.
START_MODES = ("shim", "service", "hand")
# How often a drain (a reload's, a shutdown's) looks whether requests are still in flight.
DRAIN_POLL = 0.05
# How long a stopping daemon waits for its sessions to write their last answers and close.
CLOSE_SESSIONS_TIMEOUT = 10.0
STOPPING = "the daemon is stopping"
RELOAD_READ_TIMEOUT = 10.0  # seconds a reload may take to read and check the file


def take_start_mode(environ: MutableMapping[str, str], socket_activated: bool = False) -> str:
    """Who started this daemon, from ``$MCPBROKER_STARTED_BY`` (removed, so that
    the servers the daemon starts do not inherit it); unset, "service" if a
    service manager handed over the socket, else "hand". (Not from
    ``INVOCATION_ID``: every process under any systemd service inherits it,
    a shell in a terminal run as one included.)"""
    mode = environ.pop(STARTED_BY_ENV, "")
    if mode in START_MODES:
        return mode
    return "service" if socket_activated else "hand"


@attrs.frozen
class DaemonStatistics:
    pid: int
    socket: str
    uptime: float
    servers: tuple[UpstreamStatistics, ...]
    sessions: tuple[SessionStatistics, ...]
    rules: str = RULES
    websocket: str | None = None  # the WebSocket listener's URL, if there is one
    started_by: str = "hand"  # one of START_MODES
    socket_activated: bool = False  # the socket was handed over by a service manager
    http: str | None = None  # the Streamable HTTP listener's URL, if there is one
    metrics: str | None = None  # the metrics listener's URL, if there is one
    # Its command line's listeners were a daemon's that went away, carried
    # over by the shim that started it: {"pid": that daemon's, "gone_by": when
    # the shim found it gone (seconds since the epoch)} (docs/hosts.md).
    listeners_from: dict[str, Any] | None = None
    # The old actors a reload removed or restarted that still finish their
    # requests in flight (status "draining"): their processes run, and
    # answer, until then (docs/observability.md).
    draining: tuple[UpstreamStatistics, ...] = ()
    stopping: bool = False  # SIGTERM or SIGINT: it drains, then exits (docs/configuration.md)


@attrs.frozen
class ReloadReport:
    """What a reload did (the answer ``mcpbroker reload`` prints)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    restarted: tuple[str, ...]
    updated: tuple[str, ...]  # servers whose changes applied live
    applied: tuple[str, ...]  # broker settings applied live (``broker.requestTimeout``)
    not_applied: tuple[str, ...]  # broker settings that wait for a new daemon
    warnings: tuple[str, ...]  # of the new file (unknown keys...)


class Daemon:
    def __init__(
        self, config: Config, socket_path: str, load: Callable[[], Config] | None = None
    ) -> None:
        """``load`` reads the configuration again (the file, with the command
        line's options on top), for a reload; it raises ConfigError."""
        self.config = config
        self.socket_path = socket_path
        self._load = load
        self._reloading = trio.Lock()
        self._reload_reader = trio.CapacityLimiter(1)  # (reload_file)
        # The ids of what each server asks clients, by server name, for the
        # daemon's life: an actor a reload starts in place of another goes on
        # from the old one's (which may still ask while it drains), and a
        # client's answer is never taken for another's (server_requests.py).
        self._client_ids: dict[str, ClientIds] = {}
        self.upstreams = {
            name: _server(name, server, config.broker, self._ids(name))
            for name, server in config.enabled_servers.items()
        }
        # Old actors a reload removed or replaced, by name, while they finish
        # their requests in flight (_retire): a client's answer to what one
        # asked still reaches it (Session).
        self.draining: dict[str, list[ServerActor]] = {}
        self.registry = Registry(self.upstreams, config.broker)
        self._log = get_logger()
        self._sessions: set[Session] = set()
        self._started = 0.0
        self.websocket_url: str | None = None
        self._websocket_policy: Policy | None = None
        self.http_url: str | None = None
        self._http_policy: Policy | None = None
        self.started_by = "hand"
        self.socket_activated = False
        self.listeners_from: dict[str, Any] | None = None  # (DaemonStatistics)
        self.notifier = Notifier(None)  # (a service manager's, once run() reads it)
        # Metrics and the audit log (docs/observability.md): what each request
        # came to is counted only if one of them is on.
        self.metrics_url: str | None = None
        self._metrics_policy: Policy | None = None
        self.audit: AuditLog | None = None
        observed = config.broker.metrics is not None or config.broker.audit_log is not None
        self.calls: CallStats | None = CallStats() if observed else None
        self._nursery: trio.Nursery | None = None
        self._scopes: dict[ServerActor, trio.CancelScope] = {}  # each server's run
        self._stopping: str | None = None  # set once shut_down() begins
        # (reason, unfinished) once shut_down() stops the sessions: one that
        # opens after that is stopped at once, not waited for
        self._closing: tuple[str, str] | None = None
        self._session_ended = trio.Event()  # set (and renewed) as each session ends

    def statistics(self) -> DaemonStatistics:
        return DaemonStatistics(
            pid=os.getpid(),
            socket=self.socket_path,
            uptime=trio.current_time() - self._started,
            servers=tuple(self._server_row(upstream) for upstream in self.upstreams.values()),
            sessions=tuple(
                s.statistics() for s in self._sessions if not s.is_control and not s.idle
            ),
            websocket=self.websocket_url,
            started_by=self.started_by,
            socket_activated=self.socket_activated,
            http=self.http_url,
            metrics=self.metrics_url,
            listeners_from=self.listeners_from,
            draining=tuple(
                attrs.evolve(actor.statistics(), status="draining")
                for actors in self.draining.values()
                for actor in actors
            ),
            stopping=self._stopping is not None,
        )

    def _server_row(self, upstream: ServerActor) -> UpstreamStatistics:
        """A server's statistics; while it has asked at run time for a scope
        its grant lacks (a 403 ``insufficient_scope``), what to run, as its
        error (docs/oauth.md)."""
        row = upstream.statistics()
        tokens = sys.modules.get("actors.oauth")  # (loaded once a server is reached by url)
        if tokens is None:
            return row
        wanted = tokens.BearerTokens.wanted_scope(row.name)
        if wanted is None:
            return row
        return attrs.evolve(row, last_error=tokens.step_up_hint(row.name, wanted))

    async def _control(self, command: str, servers: tuple[str, ...] = ()) -> Any:
        if command == "reload":
            return await self.reload_file()
        if command == "tokens":
            return self.tokens_changed(servers)
        assert command == "status"
        return attrs.asdict(self.statistics())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled. Raises StartError (AlreadyRunning if another
        daemon has the socket) or UnsafePath if it cannot serve this socket."""
        self._started = trio.current_time()
        settings = self.config.broker
        address = parse_address(settings.websocket) if settings.websocket else None
        # (before anything starts: a one-line error)
        self._websocket_policy = policy_for(address[0], settings) if address else None
        http_address = parse_address(settings.http) if settings.http else None
        self._http_policy = policy_for(http_address[0], settings, "HTTP") if http_address else None
        metrics = parse_address(settings.metrics) if settings.metrics else None
        if metrics is not None:
            self._metrics_policy = policy_for(metrics[0], settings, "metrics")
        self.audit = self._open_audit_log()
        inherited = self._take_process_origin()
        prepare_socket_dir(self.socket_path)
        with hold_socket_lock(self.socket_path):
            if inherited is None:
                claim_socket_path(self.socket_path)  # (before the nursery: a one-line error)
            for warning in self.config.warnings:
                self._log.warning("config.warning", detail=warning)
            async with trio.open_nursery() as nursery:
                await self.start_servers(nursery)
                await nursery.start(
                    partial(serve_unix, inherited=inherited), self.socket_path, self._serve_client
                )
                if address is not None:
                    host, port = address
                    with _listening("WebSocket", host, port):
                        port = await nursery.start(
                            serve_websocket,
                            host,
                            port,
                            self._current_websocket_policy,
                            self.upstreams,
                            settings.max_message_bytes,
                            self._serve_by_url,
                        )
                    self.websocket_url = _url("ws", host, port, "/mcp")
                if http_address is not None:
                    with _listening("HTTP", *http_address):
                        await self._start_http(nursery, *http_address)
                if metrics is not None:
                    with _listening("metrics", *metrics):
                        await self._serve_metrics(nursery, *metrics)
                self._log.info(
                    "daemon.listening",
                    socket=self.socket_path,
                    servers=list(self.upstreams),
                    pid=os.getpid(),
                    rules=RULES,
                    websocket=self.websocket_url,
                    http=self.http_url,
                    metrics=self.metrics_url,
                    audit_log=self.audit.path if self.audit else None,
                    started_by=self.started_by,
                    socket_activated=self.socket_activated,
                    listeners_from=self.listeners_from,
                )
                task_status.started()
                self.notifier.ready(self._ready_status())

    def reconfigure(self, new: Config) -> ConfigDiff:
        """Apply what of ``new`` applies live (broker/configdiff.py, LIVE):
        settings go to every server, session, the Registry and the WebSocket
        listener; servers whose only changes are live ones take them; a
        failed server is tried again (docs/rules/restarts.md). Returns
        the whole diff: what it says to add, remove or restart, and settings
        that need a new daemon, are left to the caller (the reload, #14), and
        ``self.config`` keeps the old values of those until then. Raises
        StartError (nothing changed) if the new token file cannot be read."""
        change = diff(self.config, new)
        live = {c.field: c.new for c in change.settings if c.effect is Effect.LIVE}
        settings = attrs.evolve(self.config.broker, **live)
        # Every policy is made before any is applied: one that cannot be (a
        # listener off loopback left without its token) refuses the reload
        # whole; it left the listeners before it changed, and without a token.
        # Made anew by a reload that changes anything (a token rotated in its
        # file is taken then); an unchanged reload reads no token file (gone
        # since start, or a named pipe that blocked the event loop), nor is
        # refused for it.
        websocket, http, metrics = (
            policy if change.empty else self._policy(policy, address, settings, kind)
            for policy, address, kind in (
                (self._websocket_policy, self.config.broker.websocket, "WebSocket"),
                (self._http_policy, self.config.broker.http, "HTTP"),
                (self._metrics_policy, self.config.broker.metrics, "metrics"),
            )
        )
        for upstream in self.upstreams.values():  # a reload tries failed servers again
            upstream.retry()
        if change.empty:
            return change
        self._websocket_policy, self._http_policy, self._metrics_policy = websocket, http, metrics
        servers = dict(self.config.servers)
        for name, server_change in change.updated.items():
            servers[name] = server_change.new
        for name, upstream in self.upstreams.items():
            if name not in change.restarted and name not in change.removed:
                upstream.reconfigure(servers[name], settings)
        self.registry.reconfigure(settings)
        for session in self._sessions:
            session.reconfigure(settings)
        self.config = attrs.evolve(self.config, servers=servers, broker=settings)
        self._log.info(
            "daemon.reconfigured",
            settings=[c.key for c in change.settings if c.effect is Effect.LIVE],
            servers=list(change.updated),
        )
        return change

    @staticmethod
    def _policy(
        current: Policy | None, address: str | None, settings: BrokerSettings, kind: str
    ) -> Policy | None:
        """A running listener's policy under ``settings`` (StartError if it cannot be)."""
        if current is None or not address:
            return current
        return policy_for(parse_address(address)[0], settings, kind)

    async def _start_http(self, nursery: trio.Nursery, host: str, port: int) -> None:
        settings = self.config.broker
        port = await nursery.start(
            serve_http,
            host,
            port,
            self._current_http_policy,
            self.upstreams,
            settings.max_message_bytes,
            settings.max_queued_bytes,
            self._serve_by_url,
            self.registry,  # (a modern tools/call's Mcp-Param-* headers are checked)
        )
        self.http_url = _url("http", host, port, "/mcp")

    def _current_http_policy(self) -> Policy:
        assert self._http_policy is not None
        return self._http_policy

    async def _serve_metrics(self, nursery: trio.Nursery, host: str, port: int) -> None:
        # (imported here: prometheus_client takes 15 ms a daemon without metrics need not pay)
        from actors.metrics import open_registry, render

        assert self.calls is not None
        registry = open_registry(self.statistics, self.calls)
        port = await nursery.start(
            serve_metrics, host, port, self._current_metrics_policy, partial(render, registry)
        )
        self.metrics_url = _url("http", host, port, "/metrics")

    def _current_metrics_policy(self) -> Policy:
        assert self._metrics_policy is not None
        return self._metrics_policy

    def _open_audit_log(self) -> AuditLog | None:
        path = self.config.broker.audit_log
        if path is None:
            return None
        try:
            return AuditLog(os.path.expanduser(path))
        except (UnsafePath, OSError) as exc:
            raise ConfigRefused(f"cannot write the audit log {path}: {exc}") from None

    async def start_servers(self, nursery: trio.Nursery) -> None:
        """Start the Registry and every server's actor in ``nursery``, the
        daemon's, where a reload starts new ones (the actor tests run this part
        alone, without sockets)."""
        self._nursery = nursery
        await nursery.start(self.registry.run)
        for upstream in self.upstreams.values():
            await nursery.start(self._run_server, upstream)

    async def _run_server(
        self, actor: ServerActor, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run one server's actor in a scope of its own (a reload may stop it).
        Its lines name no session (see :func:`_no_session`)."""
        _no_session()
        with trio.CancelScope() as scope:
            self._scopes[actor] = scope
            try:
                await actor.run(task_status=task_status)
            finally:
                del self._scopes[actor]

    # -- reload -----------------------------------------------------------------

    def _ids(self, name: str) -> ClientIds:
        """Server ``name``'s ids for what it asks clients (see ``_client_ids``)."""
        ids = self._client_ids.get(name)
        if ids is None:
            ids = self._client_ids[name] = ClientIds(name)
        return ids

    def tokens_changed(self, names: tuple[str, ...]) -> dict[str, Any]:
        """``mcpbroker auth NAME`` stored (or forgot) a server's tokens: the
        daemon reads them again at the server's next request, and a server it
        gave up on (401s at start) is tried again now, without waiting for
        ``retryFailedAfter`` or a reload (docs/oauth.md)."""
        from actors.oauth import BearerTokens

        known = [name for name in names if name in self.upstreams]
        for name in known:
            BearerTokens.reread(name)
            self.upstreams[name].retry()
        return {"tokens": known, "unknown": [name for name in names if name not in known]}

    async def reload_file(self) -> dict[str, Any]:
        """Read the configuration again and apply it (``mcpbroker reload``,
        SIGHUP). Returns what ``mcpbroker reload`` prints: ``{"reloaded":
        report}``, or ``{"error": why}`` when the new configuration is refused
        (it cannot be read, is not valid, or a token file cannot be read): the
        old one then goes on, unchanged.

        The file is read and checked in a thread, within RELOAD_READ_TIMEOUT:
        read on the event loop, a config that is a named pipe (``sops
        exec-file``) blocked every session for good, and SIGTERM with them."""
        async with self._reloading:  # (one at a time: applied in the order asked)
            if self._stopping is not None:
                return self._refuse_reload(ConfigError(STOPPING))
            self.notifier.reloading()
            try:
                if self._load is None:
                    raise ConfigError("this daemon was given no configuration file to read again")
                with trio.move_on_after(RELOAD_READ_TIMEOUT):
                    # (a limiter of its own: a read abandoned in a pipe nobody
                    # writes keeps its token for good; Trio's shared one, 40,
                    # ran out after 40 such reloads, and with it every thread
                    # of the daemon's: token reads, DNS lookups)
                    new = await trio.to_thread.run_sync(
                        self._load, abandon_on_cancel=True, limiter=self._reload_reader
                    )
                    if self._stopping is not None:
                        raise ConfigError(STOPPING)
                    report = self.reload(new)
                    return {"reloaded": attrs.asdict(report)}
                raise ConfigError(
                    f"the configuration file could not be read within {RELOAD_READ_TIMEOUT:g} s "
                    "(a named pipe, as `sops exec-file` gives, is read once: restart the daemon)"
                )
            except (ConfigError, StartError) as exc:
                return self._refuse_reload(exc)
            finally:
                self.notifier.ready(self._ready_status())  # (the old configuration, if refused)

    def _refuse_reload(self, exc: Exception) -> dict[str, Any]:
        self._log.error("config.reload_refused", error=str(exc))
        return {"error": str(exc)}

    def _ready_status(self) -> str:
        """What ``systemctl status`` shows of a daemon that serves."""
        count = len(self.upstreams)
        return f"serving {count} MCP server{'' if count == 1 else 's'} on {self.socket_path}"

    def reload(self, new: Config) -> ReloadReport:
        """Turn the running daemon into one running ``new`` (see the module's
        docstring); settings that need a new daemon are left as they were, and
        reported. Raises StartError (nothing changed) if the new token file
        cannot be read."""
        change = self.reconfigure(new)  # (the settings that apply live)
        settings = self.config.broker
        old = dict(self.upstreams)
        actors = {
            name: _server(name, server, settings, self._ids(name))
            if name in change.added or name in change.restarted
            else old[name]
            for name, server in new.enabled_servers.items()
        }
        # One synchronous step: the daemon's table, the catalog, the views.
        self.upstreams.clear()
        self.upstreams.update(actors)
        order = tuple(actors)
        stranded: dict[str, list[Session]] = {}
        for name in change.removed:
            old[name].events = None
            self.registry.remove_server(name)
            stranded[name] = [s for s in self._sessions if s.drop_server(name)]
        for name in change.restarted:
            old[name].events = None
            fresh, before = actors[name], old[name]
            fresh.inherit(before)  # (what sessions asked of it: docs/configuration.md)
            # (what never reached its process: the new one's first, at once, so
            # that a client's later cancellation or departure reaches it there)
            fresh.take_over(before.take_unsent())
            self.registry.replace_server(name)
            for session in self._sessions:
                session.replace_server(name)
        for name in change.added:
            joined = [s.handle for s in self._sessions if s.add_server(name, order)]
            self.registry.add_server(name, joined)
        for name in (*change.removed, *change.restarted):
            self.draining.setdefault(name, []).append(old[name])
        assert self._nursery is not None
        for name in (*change.added, *change.restarted):
            self._nursery.start_soon(self._run_server, actors[name])
        for name in change.removed:
            why = "was removed from the configuration"
            self._nursery.start_soon(self._retire, old[name], why, stranded[name])
        for name in change.restarted:
            why = "was restarted by a reload of the configuration"  # (and is back: retryable)
            self._nursery.start_soon(partial(self._retire, retryable=True), old[name], why, [])
        self.config = attrs.evolve(new, broker=settings)
        report = ReloadReport(
            added=tuple(change.added),
            removed=change.removed,
            restarted=tuple(change.restarted),
            updated=tuple(change.updated),
            applied=tuple(c.key for c in change.settings if c.effect is Effect.LIVE),
            not_applied=tuple(c.key for c in change.settings if c.effect is not Effect.LIVE),
            warnings=new.warnings,
        )
        for warning in new.warnings:
            self._log.warning("config.warning", detail=warning)
        self._log.info("daemon.reloaded", **attrs.asdict(report, recurse=False))
        return report

    async def _retire(
        self, actor: ServerActor, reason: str, stranded: list[Session], *, retryable: bool = False
    ) -> None:
        """An old actor: its requests in flight get ``broker.shutdownTimeout`` to
        finish, what is left is answered with an error, its server stops; then
        the transparent sessions it leaves without a server are closed. A
        restarted server's (``retryable``) requests that never reached its
        process went to the new actor at the reload (:meth:`reload`); those
        that reached it later (a session that raced the reload) go to the new
        actor instead (:meth:`_hand_over`)."""
        _no_session()
        with trio.move_on_after(self.config.broker.shutdown_timeout):
            # (polled: a server's in-flight table has no event, and reloads are rare)
            # (a request held for its turn is still to be sent: it counts too)
            while (figures := actor.statistics()).in_flight or figures.waiting:  # noqa: ASYNC110
                await trio.sleep(DRAIN_POLL)
        unsent = actor.take_unsent() if retryable else []
        actor.retire(reason, retryable=retryable)
        left = [each for each in self.draining.get(actor.name, ()) if each is not actor]
        if left:
            self.draining[actor.name] = left
        else:
            self.draining.pop(actor.name, None)
        scope = self._scopes.get(actor)
        if scope is not None:
            scope.cancel()
        await self._hand_over(actor, unsent)
        for session in stranded:
            session.stop(f"MCP server {actor.name!r} {reason}")

    async def _hand_over(self, old: ServerActor, unsent: list[ClientRequest]) -> None:
        """Requests that reached a restarted server's old actor after the reload
        (their session's send waited for room in its inbox) and never reached
        its process go, in order, to the actor that has the server's name now,
        as if sent to it; if a later reload removed the name, the retired
        ``old`` answers them with its error."""
        for item in unsent:
            await self.upstreams.get(old.name, old).send(item)

    # -- shutdown ---------------------------------------------------------------

    async def shut_down(self) -> None:
        """Drain before the tree is cancelled (SIGTERM, SIGINT): new requests are
        refused (a shim that asked is told instead, and holds its host's new
        requests for the next daemon: Session.daemon_stopping), requests in
        flight get ``broker.shutdownTimeout`` to finish,
        then every session answers what is left with an error saying the daemon
        is stopping, and closes (waited for, bounded). The caller then cancels
        :meth:`run`, which stops the servers and removes the socket."""
        if self._stopping is not None:
            return
        self._stopping = STOPPING
        self.notifier.stopping()
        timeout = self.config.broker.shutdown_timeout
        sessions = [s for s in self._sessions if not s.is_control]
        self._log.info(
            "daemon.draining",
            sessions=len(sessions),
            busy=sum(s.busy for s in sessions),
            timeout=timeout,
        )
        for session in list(self._sessions):
            session.daemon_stopping(STOPPING)  # (refused, or told: a shim holds its host's)
        with trio.move_on_after(timeout):
            for session in list(self._sessions):
                await session.wait_idle()
        unfinished = (
            f"{STOPPING} (this request did not finish within "
            f"broker.shutdownTimeout = {timeout:g} s)"
        )
        self._closing = (STOPPING, unfinished)
        for session in list(self._sessions):
            session.stop(STOPPING, unfinished)
        with trio.move_on_after(CLOSE_SESSIONS_TIMEOUT):
            while self._sessions:
                await self._session_ended.wait()
        self._log.info("daemon.drained", sessions_left=len(self._sessions))

    def _current_websocket_policy(self) -> Policy:
        assert self._websocket_policy is not None
        return self._websocket_policy

    def _take_process_origin(self) -> socket.socket | None:
        """Read (and clear) what this process was started with: who started it,
        and the listening socket a service manager handed over, if it did
        (whose path then replaces the configured one)."""
        inherited = take_inherited_listener(os.environ)
        self.socket_activated = inherited is not None
        self.started_by = take_start_mode(os.environ, self.socket_activated)
        self.listeners_from = take_listeners_origin(os.environ)
        self.notifier = Notifier.take_from(os.environ)
        if inherited is not None:
            path = inherited.getsockname()
            if path != self.socket_path:
                self._log.warning(
                    "daemon.socket_handed_over", socket=path, configured=self.socket_path
                )
                self.socket_path = path
        return inherited

    async def _serve_client(self, stream: trio.abc.Stream) -> None:
        connection = StreamConnection(stream, self.config.broker.max_message_bytes)
        await self._serve_session(connection, control=self._control)

    async def _serve_by_url(
        self, connection: Connection, view: tuple[str, ...] | None, transparent: bool
    ) -> None:
        """A session whose view the URL's path chose (WebSocket, HTTP): ``/mcp``
        (None) is every server, and a reload's new servers join it."""
        every = view is None
        view = tuple(self.upstreams) if view is None else view
        await self._serve_session(connection, view=view, transparent=transparent, every=every)

    async def _serve_session(self, connection: Connection, **options: Any) -> None:
        """Run one client's session, over any transport, until it ends."""
        session = Session(
            connection,
            self.upstreams,
            self.registry,
            self.config.broker,
            calls=self.calls,
            audit=self.audit,
            draining=self.draining,
            **options,
        )
        if self._stopping is not None:
            session.daemon_stopping(self._stopping)
        if self._closing is not None:
            # (a client that connects while the last sessions close, socat or
            # a --no-resume shim, which asks for no notice: it kept the drain
            # waiting for CLOSE_SESSIONS_TIMEOUT)
            session.stop(*self._closing)
        self._sessions.add(session)
        # Whatever is logged in this session's tasks says which session it was.
        with structlog.contextvars.bound_contextvars(session=session.handle.id):
            try:
                await session.run()
            except Exception:
                # The session's state dies with it; nothing else shares it.
                self._log.exception("session.crashed")
            finally:
                self._sessions.discard(session)
                self._session_ended.set()
                self._session_ended = trio.Event()


def _url(scheme: str, host: str, port: int, path: str) -> str:
    """A listener's URL (an IPv6 host in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}{path}"


@contextlib.contextmanager
def _listening(kind: str, host: str, port: int) -> Iterator[None]:
    """A listener that cannot bind (its port taken, its address not this
    machine's) is a one-line StartError, not the traceback of an OSError."""
    try:
        yield
    except* OSError as group:
        exc = _first_oserror(group)
        why = exc.strerror or str(exc)
        raise StartError(f"cannot listen for {kind} on {host}:{port}: {why}") from None


def _first_oserror(group: BaseExceptionGroup[OSError]) -> OSError:
    first = group.exceptions[0]
    return _first_oserror(first) if isinstance(first, BaseExceptionGroup) else first


def _no_session() -> None:
    """Unbind, in the calling task, what the task that started it bound to its
    log lines: a server's tasks, started by a reload, were copies of the
    control session's context, and every line of the server named the
    session of ``mcpbroker reload`` (docs/observability.md: ``session`` is
    a client session's own lines only)."""
    structlog.contextvars.clear_contextvars()


def _server(
    name: str, config: ServerConfig, settings: BrokerSettings, ids: ClientIds
) -> ServerActor:
    """The actor for one configured server, by its sharing mode; ``ids``:
    the server's ids for what it asks clients."""
    if config.share == "per-session":
        return PerSessionServer(name, config, settings, ids)
    if config.pool > 1:
        return PooledServer(name, config, settings, ids)
    if config.era == "per-client":
        return EraServer(name, config, settings, ids)
    return Upstream(name, config, settings, lazy=config.startup == "lazy", numbering=ids)
