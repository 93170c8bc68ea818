"""The lifecycles of the broker's protocol objects: one transition table each.

Theory of operation (h11's ``_state.py`` is the model). Each protocol object
has exactly one state, an enum member held in a plain attribute, and it
changes only by a move: ``(state, trigger) -> new state``, looked up in the
object's table below. A move the table does not hold is a bug of the broker
and raises :class:`LifecycleError`; nothing maps one layer's state onto
another's, everyone reads the same attribute. Reading the state is a plain
attribute compare (``protocol.state is ServerState.READY``); only moves,
which are rare, go through a function.

**A server connection** (:class:`broker.upstream.UpstreamProtocol`; the
Upstream actor, the Registry and the catalog read it) spans the processes
(or connections) of one configured server::

    IDLE --start_requested--> STARTING --launched--> INITIALIZING --handshake_done--> READY
                              ^ |   ^                    |                             ^
                        retry | |   | backoff_elapsed    | warm_up                     |
                              | v   |                    v                             |
             FAILED <-unreachable   RESTARTING         WARMING ---------warmed---------+
               ^                     |   ^
               +------gave_up--------+   +--ended-- STARTING, INITIALIZING, WARMING, READY

    (any state but STOPPED) --stop--> STOPPED

- IDLE: a lazy server nobody has needed yet; nothing runs.
- STARTING: launching its process, or connecting to it.
- INITIALIZING: the link is open and the broker's ``initialize`` is sent.
- WARMING: the handshake is done and the instance lists its own tools
  before it takes calls (instances of per-session servers and pools only;
  broker/upstream.py, "Warm-up"). Any other server goes straight to READY.
- READY: requests go through.
- RESTARTING: the process exited (the connection closed, the handshake
  failed, the broker stopped it as stuck); it is started again once the
  backoff has elapsed. Told again that it ended, it stays so.
- FAILED: it cannot be reached as configured (no command, a url of a kind
  the broker cannot reach), or it is in a crash loop: it ended too soon
  after each of ``restartAttempts`` restarts in a row (broker/recovery.py).
  Nothing runs; it is tried again (``retry``) on a reload, and a crash loop
  also after ``retryFailedAfter`` seconds.
- STOPPED: the actor ended (shutdown, or a per-session instance whose
  session left). Every state may stop; nothing follows.

Requests that arrive while it is :data:`COMING_UP` wait for it; in any of
:data:`DOWN` they are answered at once with an error.

**A client session** (:class:`broker.session.SessionProtocol`; the Session
actor reads it)::

    CONNECTING --initialized--> OPERATING
        |                           |
        +------client_closed--------+--> CLOSING --ended--> CLOSED
        +------ended--------------------------------------> CLOSED
    (any state) --failed--> ERROR

- CONNECTING: before ``initialize``: only ``initialize`` and ``ping`` are
  answered. (The 2026-07-28 era has no handshake: a session whose first
  message is a modern request is handed to a ModernSessionProtocol
  (broker/eras/session.py), which is OPERATING from the start, at the start
  of this table, and never CONNECTING.)
- OPERATING: initialized; requests are routed.
- CLOSING: the client closed its side; nothing more is read, but the
  answers to its requests still in flight are written as they come (for a
  while: actors/session.py, ``LINGER_SECONDS``).
- CLOSED: the session is over; nothing is read or written.
- ERROR: an unexpected exception inside the protocol object (a bug of the
  broker, never something a client did wrong: that is an answer). As in
  h11, it is reached from any state, and the object refuses further use;
  its actor ends that one session, logging the traceback. Ending a failed
  session leaves it failed.
"""

from __future__ import annotations

import enum


class LifecycleError(Exception):
    """A move the lifecycle's table does not allow: a bug of the broker."""


# -- the server connection ---------------------------------------------------


class ServerState(enum.Enum):
    IDLE = "idle"
    STARTING = "starting"
    INITIALIZING = "initializing"
    WARMING = "warming"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


class ServerTrigger(enum.Enum):
    START_REQUESTED = "start_requested"  # a lazy server is needed
    LAUNCHED = "launched"  # its process runs (it is connected): initialize is sent
    WARM_UP = "warm_up"  # initialized; it lists its tools before it is ready
    HANDSHAKE_DONE = "handshake_done"  # initialized: ready
    WARMED = "warmed"  # it offers the tools expected of it (or the wait ran out)
    ENDED = "ended"  # its process exited, its connection closed, or it never started
    BACKOFF_ELAPSED = "backoff_elapsed"  # time to start it again
    UNREACHABLE = "unreachable"  # it cannot be reached as configured
    GAVE_UP = "gave_up"  # a crash loop: it ended too soon after every restart
    RETRY = "retry"  # a failed server is tried again (a reload, retryFailedAfter)
    STOP = "stop"  # the actor ends


SERVER_TRANSITIONS: dict[tuple[ServerState, ServerTrigger], ServerState] = {
    (ServerState.IDLE, ServerTrigger.START_REQUESTED): ServerState.STARTING,
    (ServerState.STARTING, ServerTrigger.LAUNCHED): ServerState.INITIALIZING,
    (ServerState.STARTING, ServerTrigger.ENDED): ServerState.RESTARTING,
    (ServerState.STARTING, ServerTrigger.UNREACHABLE): ServerState.FAILED,
    (ServerState.INITIALIZING, ServerTrigger.HANDSHAKE_DONE): ServerState.READY,
    (ServerState.INITIALIZING, ServerTrigger.WARM_UP): ServerState.WARMING,
    (ServerState.INITIALIZING, ServerTrigger.ENDED): ServerState.RESTARTING,
    (ServerState.WARMING, ServerTrigger.WARMED): ServerState.READY,
    (ServerState.WARMING, ServerTrigger.ENDED): ServerState.RESTARTING,
    (ServerState.READY, ServerTrigger.ENDED): ServerState.RESTARTING,
    # The same end told twice changes nothing (as h11's ConnectionClosed in CLOSED).
    (ServerState.RESTARTING, ServerTrigger.ENDED): ServerState.RESTARTING,
    (ServerState.RESTARTING, ServerTrigger.BACKOFF_ELAPSED): ServerState.STARTING,
    (ServerState.RESTARTING, ServerTrigger.GAVE_UP): ServerState.FAILED,
    (ServerState.FAILED, ServerTrigger.RETRY): ServerState.STARTING,
    **{
        (state, ServerTrigger.STOP): ServerState.STOPPED
        for state in ServerState
        if state is not ServerState.STOPPED
    },
}

# A request for a server in one of these waits until it is ready (or down).
COMING_UP = (ServerState.IDLE, ServerState.STARTING, ServerState.INITIALIZING, ServerState.WARMING)
# A server in one of these is not running: its catalog entry is empty, and a
# request for it is answered with an error at once.
DOWN = (ServerState.RESTARTING, ServerState.FAILED, ServerState.STOPPED)

# What ``mcpbroker status`` says of each state (``status``): the four words it
# said before the states were one table, which scripts may read. The state
# itself is shown beside it (``state``).
STATUS: dict[ServerState, str] = {
    ServerState.IDLE: "idle",
    ServerState.STARTING: "starting",
    ServerState.INITIALIZING: "starting",
    ServerState.WARMING: "starting",
    ServerState.READY: "ready",
    ServerState.RESTARTING: "down",
    ServerState.FAILED: "down",
    ServerState.STOPPED: "down",
}


def next_server_state(state: ServerState, trigger: ServerTrigger) -> ServerState:
    """The state a server connection in ``state`` moves to on ``trigger``."""
    new = SERVER_TRANSITIONS.get((state, trigger))
    if new is None:
        raise LifecycleError(f"a server connection that is {state.value} cannot {trigger.value}")
    return new


# -- the client session ------------------------------------------------------


class SessionState(enum.Enum):
    CONNECTING = "connecting"
    OPERATING = "operating"
    CLOSING = "closing"
    CLOSED = "closed"
    ERROR = "error"


class SessionTrigger(enum.Enum):
    INITIALIZED = "initialized"  # the broker answered the client's initialize
    CLIENT_CLOSED = "client_closed"  # the client closed its side
    ENDED = "ended"  # the session's actor stops (nothing more in or out)
    FAILED = "failed"  # an unexpected exception in the protocol object


SESSION_TRANSITIONS: dict[tuple[SessionState, SessionTrigger], SessionState] = {
    (SessionState.CONNECTING, SessionTrigger.INITIALIZED): SessionState.OPERATING,
    (SessionState.CONNECTING, SessionTrigger.CLIENT_CLOSED): SessionState.CLOSING,
    (SessionState.OPERATING, SessionTrigger.CLIENT_CLOSED): SessionState.CLOSING,
    (SessionState.CONNECTING, SessionTrigger.ENDED): SessionState.CLOSED,
    (SessionState.OPERATING, SessionTrigger.ENDED): SessionState.CLOSED,
    (SessionState.CLOSING, SessionTrigger.ENDED): SessionState.CLOSED,
    (SessionState.ERROR, SessionTrigger.ENDED): SessionState.ERROR,
    **{(state, SessionTrigger.FAILED): SessionState.ERROR for state in SessionState},
}


def next_session_state(state: SessionState, trigger: SessionTrigger) -> SessionState:
    """The state a client session in ``state`` moves to on ``trigger``."""
    new = SESSION_TRANSITIONS.get((state, trigger))
    if new is None:
        raise LifecycleError(f"a client session that is {state.value} cannot {trigger.value}")
    return new


__all__ = [
    "COMING_UP",
    "DOWN",
    "SERVER_TRANSITIONS",
    "SESSION_TRANSITIONS",
    "STATUS",
    "LifecycleError",
    "ServerState",
    "ServerTrigger",
    "SessionState",
    "SessionTrigger",
    "next_server_state",
    "next_session_state",
]
