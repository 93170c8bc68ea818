"""How a server connection recovers: restart backoff, crash loops, liveness.

Sans-I/O: the Upstream actor (actors/upstream.py) sleeps, draws the random
numbers and reads the clock; these rules say how long to wait, when to give
up, and when a silent server is dead. docs/rules/restarts.md says the same
for users.

- **Restarts** (:class:`Restarts`): a server whose connection ends (its
  process exits, its WebSocket closes, it fails its handshake, the broker
  stops it as stuck or dead) is started again after an exponential backoff:
  ``restartDelay`` doubling up to ``restartMaxDelay``, each delay drawn
  between half and all of that ("equal jitter", so that servers that died
  together do not all start again in the same instant). A connection that was
  ready for :data:`STABLE_AFTER` seconds resets the backoff: the next end
  counts as the first.
- **Crash loops**: after ``restartAttempts`` restarts in a row, none of which
  stayed ready that long, the server is given up (``failed``): no process is
  started, nothing is spent, until a reload or, if ``retryFailedAfter`` is
  set, that many seconds later (a new round of attempts).
- **Liveness** (:class:`Liveness`): every ``pingInterval`` seconds a ready
  server is sent a ``ping`` of the broker's own; an interval in which the
  server sent nothing at all (no answer to that ping, no other message) is a
  miss, and after ``pingMisses`` misses in a row it is declared dead: its
  requests in flight are failed and it is restarted like a server that
  exited.
"""

from __future__ import annotations

import attrs

from broker.config import BrokerSettings, ServerConfig

STABLE_AFTER = 10.0  # seconds ready that reset the backoff


@attrs.frozen
class RestartPolicy:
    """One server's restart and ping settings (its own keys, else the broker's)."""

    delay: float = 0.5  # seconds before the first restart (before jitter)
    max_delay: float = 30.0  # the longest backoff
    attempts: int = 8  # restarts in a row without a stable run before it fails; 0: never
    retry_failed_after: float = 600.0  # seconds before a failed server is tried again; 0: never
    ping_interval: float = 30.0  # seconds between pings; 0: no pings
    ping_misses: int = 3  # intervals without a word before it is declared dead

    @classmethod
    def for_server(cls, config: ServerConfig, settings: BrokerSettings) -> RestartPolicy:
        return cls(
            delay=_either(config.restart_delay, settings.restart_delay),
            max_delay=_either(config.restart_max_delay, settings.restart_max_delay),
            attempts=int(_either(config.restart_attempts, settings.restart_attempts)),
            retry_failed_after=settings.retry_failed_after,
            ping_interval=_either(config.ping_interval, settings.ping_interval),
            ping_misses=int(_either(config.ping_misses, settings.ping_misses)),
        )


def _either(own: float | None, default: float | None) -> float:
    """A server's own setting, else the broker's (None for both: 0, off)."""
    value = own if own is not None else default
    return 0.0 if value is None else value


class Restarts:
    """The backoff of one server: how many times in a row it ended too soon."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.failures = 0  # ends in a row without a stable run

    def ended(self, ready_for: float | None, jitter: float) -> float | None:
        """The connection ended, having been ready for ``ready_for`` seconds
        (None: it never was). Returns the seconds to wait before starting it
        again, or None: it is in a crash loop, give it up. ``jitter`` is a
        random number in [0, 1) that the caller draws."""
        policy = self.policy
        if ready_for is not None and ready_for >= STABLE_AFTER:
            self.failures = 0
        self.failures += 1
        if policy.attempts and self.failures > policy.attempts:
            return None
        backoff = min(policy.delay * 2.0 ** min(self.failures - 1, 64), policy.max_delay)
        return backoff * (0.5 + jitter / 2)

    def reset(self) -> None:
        """A new round (a failed server is tried again): the next end is the first."""
        self.failures = 0


class Liveness:
    """Whether a server that is sent a ping each interval is still alive."""

    def __init__(self, misses_allowed: int) -> None:
        self.misses_allowed = max(1, misses_allowed)
        self.misses = 0  # intervals in a row that ended without a word from the server
        self._pinged = False  # a ping went out at the start of the interval that ends

    def tick(self, heard: bool) -> bool:
        """An interval ended (``heard``: the server sent something during it);
        True if the server is now taken as dead. Otherwise the caller sends the
        next ping."""
        if heard:
            self.misses = 0
        elif self._pinged:
            self.misses += 1
        self._pinged = True
        return self.misses >= self.misses_allowed


__all__ = ["STABLE_AFTER", "Liveness", "RestartPolicy", "Restarts"]
