"""Which instance of a pool (``"pool": N``) takes a request, sans-I/O.

A pool runs N instances of one server; instance 0 is the *catalog
instance*, whose tools the aggregated catalog shows. The actor
(actors/sharing.py) tells :class:`PoolRouting` what it can observe of each
instance, as :class:`InstanceFacts` in pool order, and the instances
themselves, to ask what each made (:class:`Maker`); it is told a
:class:`Route`.

- An instance *serves* (takes calls) when it is ready and offers every tool
  the catalog instance offers: one that is down, restarting, or has not yet
  registered a tool the others have gets none. When none serves, the catalog
  instance takes the call (it parks or refuses it as a single server would).
- A request goes to the least loaded instance that serves (the first of
  those, on a tie).
- A session is assigned an instance when it attaches: the serving one with
  the fewest sessions assigned. What is stateful per session on the server
  (:data:`PINNED`: subscriptions) goes to that instance, whatever the load,
  so that a session unsubscribes where it subscribed. A session whose instance
  has failed (given up, its process gone) is assigned another that serves. So do its tasks: a
  task-augmented ``tools/call`` (unless that instance is ready but does not
  serve: it lacks a tool the catalog shows; the call then goes by load) and
  ``tasks/list`` go to that instance, and
  ``tasks/get``, ``tasks/result`` and ``tasks/cancel`` go to the instance that
  made the task (each instance knows its own tasks: :func:`owner` asks),
  since a task lives in exactly one instance's process. So does a 2026-07-28
  client's retry: to the instance that gave the ``requestState`` it carries
  (:func:`owner` asks each instance, a :class:`Maker`, which made it).
- A session attaches once (until it detaches): one already assigned an
  instance when it attaches keeps it (a reload handed it over, or a request
  moved it off a failed one before it attached). :meth:`PoolRouting.route`
  says which instance a session left, so that the actor forgets there what it
  subscribed to.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from broker.eras.modern import INPUT_METHODS
from broker.jsonrpc import Message
from broker.tasks import TASK_METHODS

# Requests whose effect stays on the instance that took them.
PINNED = frozenset({"resources/subscribe", "resources/unsubscribe", "tasks/list"})
# A tools/call that asks for a task (params.task) is pinned too: see pinned().
CATALOG_INSTANCE = 0


@attrs.define(slots=True)
class InstanceFacts:
    """What the rules see of one instance."""

    ready: bool  # up, and warmed up
    load: int  # requests in flight or waiting
    tools: frozenset[str] | None  # the tools it offers; None: not known (not listed)
    failed: bool = False  # given up after a crash loop (until a retry)


def pinned(message: Mapping[str, Any]) -> bool:
    """Whether a request sticks to its session's instance."""
    method = message.get("method")
    if method in PINNED:
        return True
    params = message.get("params")
    asks_task = isinstance(params, dict) and isinstance(params.get("task"), dict)
    return method == "tools/call" and asks_task


def serving(instances: Sequence[InstanceFacts]) -> list[int]:
    """The indices of the instances that take calls now, in pool order; the
    catalog instance's alone if none does."""
    shown = instances[CATALOG_INSTANCE].tools
    ready = [
        index
        for index, instance in enumerate(instances)
        if instance.ready and (shown is None or instance.tools is None or shown <= instance.tools)
    ]
    return ready or [CATALOG_INSTANCE]


def least_loaded(instances: Sequence[InstanceFacts]) -> int:
    """The serving instance with the least load (the first such on a tie)."""
    return min(serving(instances), key=lambda index: instances[index].load)


class Maker(Protocol):
    """What an instance knows of what it made (the actor's Upstream)."""

    def mints(self, state: Any) -> bool: ...

    def owns_task(self, session: Any, task_id: Any) -> bool: ...


def owner(session: Hashable, message: Message, instances: Sequence[Maker]) -> int | None:
    """The instance that made what a request names, if any: the task a
    tasks/get|result|cancel names, or the requestState a 2026-07-28
    client's retry carries (only that instance's process can read it)."""
    method = message["method"]
    params = message.get("params")
    if method in INPUT_METHODS:
        state = params.get("requestState") if isinstance(params, dict) else None
        if state is None:
            return None
        return next((i for i, instance in enumerate(instances) if instance.mints(state)), None)
    if method not in TASK_METHODS:
        return None
    task_id = params.get("taskId") if isinstance(params, dict) else None
    made = (i for i, instance in enumerate(instances) if instance.owns_task(session, task_id))
    return next(made, None)


@attrs.frozen
class Route:
    """Where a request goes, and the failed instance its session was moved
    off, if it was (what it subscribed to there is not renewed for it when
    that one is tried again: the actor forgets it)."""

    index: int
    left: int | None = None


class PoolRouting:
    """The instance each session was assigned, and where each request goes."""

    def __init__(self) -> None:
        self._assigned: dict[Hashable, int] = {}

    def assigned(self, session: Hashable) -> int | None:
        return self._assigned.get(session)

    def attach(self, session: Hashable, instances: Sequence[InstanceFacts]) -> int:
        """Assign a session the serving instance with the fewest sessions (one
        already assigned one keeps it: :meth:`assign` handed it over, or
        :meth:`pick` moved it, before it attached)."""
        if session not in self._assigned:
            self._assigned[session] = self._fewest(instances)
        return self._assigned[session]

    def _fewest(self, instances: Sequence[InstanceFacts]) -> int:
        """The serving instance with the fewest sessions assigned."""
        counts = [0] * len(instances)
        for index in self._assigned.values():
            counts[index] += 1
        return min(serving(instances), key=lambda index: counts[index])

    def assign(self, session: Hashable, index: int) -> None:
        """Assign ``session`` instance ``index`` (what it subscribed to is there:
        a reload handed it over); its attaching keeps it."""
        self._assigned[session] = index

    def swap(self, one: int, other: int) -> None:
        """Instances ``one`` and ``other`` swapped places (a new catalog instance):
        their sessions go with them."""
        places = {one: other, other: one}
        self._assigned = {s: places.get(i, i) for s, i in self._assigned.items()}

    def detach(self, session: Hashable) -> None:
        self._assigned.pop(session, None)

    def route(
        self,
        session: Hashable,
        message: Message,
        facts: Sequence[InstanceFacts],
        instances: Sequence[Maker],
    ) -> Route:
        """Where a request of ``session`` goes (:meth:`pick`, with what the
        instances made: :func:`owner`), and the instance it left if it moved."""
        was = self._assigned.get(session)
        made = owner(session, message, instances)
        index = self.pick(session, message["method"], facts, pinned=pinned(message), owner=made)
        moved = was is not None and self._assigned.get(session) != was
        return Route(index, was if moved else None)

    def pick(
        self,
        session: Hashable,
        method: str,
        instances: Sequence[InstanceFacts],
        *,
        pinned: bool = False,
        owner: int | None = None,
    ) -> int:
        """The instance a request of ``session`` for ``method`` goes to: ``owner``
        if given (the instance that made the task a task request names), the
        session's own if the request is ``pinned`` or in :data:`PINNED`, else
        the least loaded."""
        if owner is not None:
            return owner
        if pinned or method in PINNED:
            assigned = self._assigned.get(session)
            gone = assigned is not None and instances[assigned].failed
            if gone and any(not instances[i].failed for i in serving(instances)):
                # (its process is gone for good: the session moves to one that
                # serves, even if a reload handed it this one)
                assigned = self._assigned[session] = self._fewest(instances)
            if assigned is not None and (method in PINNED or _may_call(instances, assigned)):
                return assigned
        return least_loaded(instances)


def _may_call(instances: Sequence[InstanceFacts], index: int) -> bool:
    """Whether a call may go to instance ``index``: it serves, or it is only
    coming up (it takes the call once ready, or refuses it naming the server)."""
    return not instances[index].ready or index in serving(instances)
