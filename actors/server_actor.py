"""What sessions, the Registry and the daemon use of a server.

The face of an Upstream (actors/upstream.py) or a group of them
(actors/sharing.py): the items its inbox takes, its status and the events it
reports, its statistics, and :class:`ServerActor`, the protocol both kinds
implement.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs
import trio

from actors.mailbox import SessionHandle
from broker.config import BrokerSettings, ServerConfig
from broker.fanout import Fanout
from broker.jsonrpc import Message
from broker.states import ServerState


@attrs.define  # not frozen: one per chunk read on the hot path (benchmarks/README.md)
class ClientRequest:
    """Requests from one session, in the order it sent them, and the bytes they
    are counted as (at most what the read that produced them held)."""

    session: SessionHandle
    messages: list[Message]
    size: int = 0


@attrs.frozen
class ClientCancelled:
    session: SessionHandle
    params: dict[str, Any]


@attrs.frozen
class Attach:
    """A session now uses this server: it gets the server's notifications and requests."""

    session: SessionHandle
    capabilities: dict[str, Any] = attrs.field(factory=dict)
    modern: bool = False  # a 2026-07-28 client: its requests carry their own _meta
    client_info: Any = None  # a legacy client's clientInfo (a modern server is told it per request)


@attrs.frozen
class ClientResponse:
    """A client's answer to a request this server sent it."""

    session: SessionHandle
    message: Message


@attrs.frozen
class ClientLogLevel:
    session: SessionHandle
    level: str | None  # None: it wants none now (a 2026-07-28 session's requests ended)


@attrs.frozen
class ClientNotification:
    session: SessionHandle
    message: Message


@attrs.frozen
class Detach:
    """A session went away: cancel what it had in flight here."""

    session: SessionHandle


InboxItem = (
    ClientRequest
    | ClientCancelled
    | ClientResponse
    | ClientNotification
    | ClientLogLevel
    | Attach
    | Detach
)


@attrs.frozen
class ServerEvent:
    """What the Registry hears from an Upstream: its new state (broker/states.py),
    or a list_changed."""

    server: str
    status: ServerState | None = None
    list_changed: str | None = None


@attrs.frozen
class UpstreamStatistics:
    name: str
    status: str  # what mcpbroker status has always said: idle, starting, ready, down
    state: str  # the state itself (broker/states.py)
    pid: int | None
    restarts: int
    sessions: int
    in_flight: int
    inbox: int
    last_error: str | None
    requests: int = 0  # sent to this server since the daemon started (catalog fetches too)
    timeouts: int = 0  # of those, answered -32001 by the broker
    instances: int = 1
    # Errors the broker answered for this server (timeouts, requests failed when
    # it went down, refused over a limit, answers too large); the server's own
    # error answers pass unparsed and are not counted.
    errors: int = 0
    share: str = "shared"  # "shared", "per-session", "pool" or "per-era"
    uptime: float | None = None  # seconds since the current connection became ready
    cpu: float | None = None  # seconds of CPU its process(es) used (user + system)
    rss: int | None = None  # bytes of memory its process(es) hold
    backlog_bytes: int = 0  # written to the server and not taken by it yet
    parked: int = 0  # requests waiting for it to finish starting
    waiting: int = 0  # requests held for their session's turn (broker/turns.py): not sent yet
    url: str | None = None  # where a remote server is reached (its link's info)
    # Every instance's process (``pid`` is a serving instance's: see
    # ServerGroup.statistics): a pool's, a per-session or per-era server's
    # others too, for what watches them all.
    pids: tuple[int, ...] = ()


class ServerActor(Protocol):
    """What sessions, the Registry and the daemon use of a server: an Upstream,
    or a group of them (actors/sharing.py)."""

    name: str
    events: Any

    @property
    def status(self) -> ServerState: ...
    @property
    def identity(self) -> Any: ...
    async def send(self, item: InboxItem) -> None: ...
    def request_start(self) -> None: ...
    def retry(self) -> None: ...
    def reconfigure(self, config: ServerConfig, settings: BrokerSettings) -> None: ...
    async def wait_ready(self) -> None: ...
    def retire(self, reason: str, *, retryable: bool = False) -> None: ...
    def take_unsent(self) -> list[ClientRequest]: ...
    def take_over(self, unsent: list[ClientRequest]) -> None: ...
    def statistics(self) -> UpstreamStatistics: ...
    def asked(self) -> Fanout: ...
    def modern_sessions(self) -> set[Any]: ...
    def inherit(self, old: ServerActor) -> None: ...
    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...
