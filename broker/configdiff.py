"""What a new configuration changes in a running daemon, sans-I/O.

The daemon is built from a :class:`~broker.config.Config` value; a reload
reads the file again and asks :func:`diff` what to do about the difference:

- servers to **add** (in the new config only, or enabled again) and to
  **remove** (gone, or now ``disabled``): ``disabled`` is never a change of
  its own, a disabled server is simply not there;
- servers to **restart**: a key changed that the running process or
  connection was made with (its command, its URL, its sharing...), so the
  reload replaces the server's actor with one built from the new entry;
- servers to **update in place**: only keys that the reload can hand to the
  running actor changed (its ``timeout``, its ``startup``);
- ``broker`` **settings** that changed, each either applied live or needing
  a restart of the daemon (the WebSocket listener's address, the message
  size every open connection was framed with).

Which key does what is decided once, per key, in :data:`SERVER_EFFECTS` and
:data:`BROKER_EFFECTS`; docs/configuration.md ("What a reload changes") says
why for each, and the tests fail when a field of ``ServerConfig`` or
``BrokerSettings`` is in neither (a field missing here is taken as the
safest effect: restart the server, or the daemon).

Compare like with like: a daemon started with ``serve --ws`` or
``--token-file`` runs ``with_listeners(config, ...)``, so the reload must
apply the same options to the new file's config before diffing, or the
command line's own listener looks like a change.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from broker.config import BROKER_KEY_OF, SERVER_KEY_OF, BrokerSettings, Config, ServerConfig


class Effect(enum.Enum):
    """What applying a changed key takes."""

    RESTART_SERVER = "restart server"  # a new actor (process, connection) from the new entry
    LIVE = "apply live"  # handed to what runs; applies to what comes next
    RESTART_DAEMON = "restart daemon"  # read once, when the daemon starts
    ADD_REMOVE = "remove / add"  # ``disabled``: the server is left out, or put in


# Every ServerConfig field (docs/configuration.md, "What a reload changes", says why).
SERVER_EFFECTS: dict[str, Effect] = {
    # What the process is started with, or the connection opened with.
    "command": Effect.RESTART_SERVER,
    "args": Effect.RESTART_SERVER,
    "env": Effect.RESTART_SERVER,
    "cwd": Effect.RESTART_SERVER,
    "url": Effect.RESTART_SERVER,
    "headers": Effect.RESTART_SERVER,
    # Read by ``mcpbroker auth`` only; the daemon uses the grant it stored.
    "oauth": Effect.LIVE,
    # Which HTTP transport a url server's connection speaks (actors/links/http.py).
    "type": Effect.RESTART_SERVER,
    "disabled": Effect.ADD_REMOVE,
    # Only when the actor waits for its first start: eager starts it now, lazy
    # leaves a running server running.
    "startup": Effect.LIVE,
    # Which actor runs the server (one process, a pool, one per session), and
    # how a pool numbers its requests to clients.
    "share": Effect.RESTART_SERVER,
    "pool": Effect.RESTART_SERVER,
    # Read as a per-session server starts a session's instance: the running stay.
    "max_instances": Effect.LIVE,
    # The deadline of requests sent from now on.
    "timeout": Effect.LIVE,
    # The gate's state (the holder, held requests, what auto learnt) is the
    # running process's; switching modes under it would be a guess.
    "server_requests": Effect.RESTART_SERVER,
    # The era is decided when the connection opens (docs/eras.md).
    "era": Effect.RESTART_SERVER,
    # Restarts and pings (broker/recovery.py): read at each end of a connection
    # and each ping, so the next one follows the new value.
    "restart_delay": Effect.LIVE,
    "restart_max_delay": Effect.LIVE,
    "restart_attempts": Effect.LIVE,
    "ping_interval": Effect.LIVE,
    "ping_misses": Effect.LIVE,
}

# Every BrokerSettings field.
BROKER_EFFECTS: dict[str, Effect] = {
    # Every open connection (clients', servers', the WebSocket listener) frames
    # messages with it: old and new limits would meet on one message's way.
    "max_message_bytes": Effect.RESTART_DAEMON,
    # The catalog is rebuilt and sessions told (list_changed).
    "separator": Effect.LIVE,
    "page_size": Effect.LIVE,  # cursors are offsets: a listing under way goes on
    # Limits checked at each request or message.
    "request_timeout": Effect.LIVE,
    "max_request_timeout": Effect.LIVE,
    "input_timeout": Effect.LIVE,  # for the calls parked from now on
    "max_queued_bytes": Effect.LIVE,
    "max_in_flight": Effect.LIVE,
    "max_server_in_flight": Effect.LIVE,
    "max_waiting_requests": Effect.LIVE,
    # The listener binds once (and `serve --ws` overrides it).
    "websocket": Effect.RESTART_DAEMON,
    # Checked at each handshake: the next one follows the new policy.
    "allowed_origins": Effect.LIVE,
    "allowed_hosts": Effect.LIVE,
    "token_file": Effect.LIVE,
    # The Streamable HTTP listener binds once too (and `serve --http` overrides it).
    "http": Effect.RESTART_DAEMON,
    # The metrics listener binds once (and `serve --metrics` overrides it).
    "metrics": Effect.RESTART_DAEMON,
    # The audit log's file is opened once; whether calls' arguments go in it
    # is asked at each call.
    "audit_log": Effect.RESTART_DAEMON,
    "audit_arguments": Effect.LIVE,
    # Restarts and pings: the same as the servers' own keys.
    "restart_delay": Effect.LIVE,
    "restart_max_delay": Effect.LIVE,
    "restart_attempts": Effect.LIVE,
    "retry_failed_after": Effect.LIVE,
    "ping_interval": Effect.LIVE,
    "ping_misses": Effect.LIVE,
    # Read when a reload or a shutdown begins to wait.
    "shutdown_timeout": Effect.LIVE,
}

SERVER_FIELDS: tuple[str, ...] = tuple(field.name for field in attrs.fields(ServerConfig))
BROKER_FIELDS: tuple[str, ...] = tuple(field.name for field in attrs.fields(BrokerSettings))


@attrs.frozen
class ServerChange:
    """A server in both configs (enabled in both) whose entry changed."""

    old: ServerConfig
    new: ServerConfig
    fields: tuple[str, ...]  # the ServerConfig fields that differ, in declaration order

    @property
    def keys(self) -> tuple[str, ...]:
        """The changed keys as the file spells them (``serverRequests``)."""
        return tuple(SERVER_KEY_OF.get(field, field) for field in self.fields)


@attrs.frozen
class SettingChange:
    """One ``broker`` setting that changed."""

    field: str  # the BrokerSettings field
    old: Any  # (not `object`: compiled, the annotations are looked up in this module)
    new: Any
    effect: Effect  # LIVE or RESTART_DAEMON

    @property
    def key(self) -> str:
        """The setting as the file spells it (``broker.requestTimeout``)."""
        return "broker." + BROKER_KEY_OF.get(self.field, self.field)


@attrs.frozen
class ConfigDiff:
    """What turns a daemon running ``old`` into one running ``new``.

    Every server enabled in either config is in at most one of ``added``,
    ``removed``, ``restarted`` and ``updated``; servers enabled in both and
    unchanged, and servers disabled in both, are in none."""

    added: dict[str, ServerConfig]  # name -> its entry, in the new config's order
    removed: tuple[str, ...]  # in the old config's order
    restarted: dict[str, ServerChange]  # some changed key needs a new actor
    updated: dict[str, ServerChange]  # every changed key applies live
    settings: tuple[SettingChange, ...]  # in BrokerSettings' field order

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.restarted or self.updated or self.settings)

    @property
    def restarts_daemon(self) -> bool:
        """Whether some setting only takes effect in a new daemon."""
        return any(change.effect is Effect.RESTART_DAEMON for change in self.settings)


def diff(old: Config, new: Config) -> ConfigDiff:
    """What changed from ``old`` to ``new``, and what applying each change takes."""
    before = old.enabled_servers
    after = new.enabled_servers
    added = {name: server for name, server in after.items() if name not in before}
    removed = tuple(name for name in before if name not in after)
    restarted: dict[str, ServerChange] = {}
    updated: dict[str, ServerChange] = {}
    for name, server in after.items():
        was = before.get(name)
        if was is None or was == server:
            continue
        fields = tuple(
            field for field in SERVER_FIELDS if getattr(was, field) != getattr(server, field)
        )
        change = ServerChange(was, server, fields)
        if all(server_effect(field) is Effect.LIVE for field in fields):
            updated[name] = change
        else:
            restarted[name] = change
    settings = tuple(
        SettingChange(
            field, getattr(old.broker, field), getattr(new.broker, field), broker_effect(field)
        )
        for field in BROKER_FIELDS
        if getattr(old.broker, field) != getattr(new.broker, field)
    )
    return ConfigDiff(added, removed, restarted, updated, settings)


def server_effect(field: str) -> Effect:
    """What a change of this ServerConfig field takes (unknown: a restart)."""
    return SERVER_EFFECTS.get(field, Effect.RESTART_SERVER)


def broker_effect(field: str) -> Effect:
    """What a change of this BrokerSettings field takes (unknown: a daemon restart)."""
    return BROKER_EFFECTS.get(field, Effect.RESTART_DAEMON)
