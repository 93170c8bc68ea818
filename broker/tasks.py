"""Tasks (2025-11-25, experimental) through a shared server, sans-I/O.

A server that accepts a task-augmented ``tools/call`` answers with a task id
of its own making. Two servers may make the same id, and one server's tasks
belong to whichever sessions created them, so the broker:

- gives the client ``SERVER:ID`` instead of ``ID`` (never the same for two
  servers: a ``:`` or ``%`` in the server's name is written ``%3A`` or
  ``%25``, so the id's first ``:`` ends the server's name), everywhere a task
  id appears: the ``CreateTaskResult``, ``tasks/get`` and ``tasks/cancel``
  results, ``tasks/result``'s related-task ``_meta``, ``tasks/list`` and
  ``notifications/tasks/status``;
- remembers which session created each task, and lets only that session
  get, cancel, list or hear about it.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable
from typing import Any, Final

from broker.jsonrpc import INVALID_PARAMS, JsonRpcError, Message

RELATED_TASK = "io.modelcontextprotocol/related-task"
TASK_METHODS: Final = frozenset({"tasks/get", "tasks/result", "tasks/cancel"})


_ESCAPED = re.compile("%3A|%25")


def _escape(server: str) -> str:
    """The server's name in its task ids: with no ``:``, so the first ends it."""
    return server.replace("%", "%25").replace(":", "%3A")


def outer_id(server: str, task_id: str) -> str:
    return f"{_escape(server)}:{task_id}"


def split_task_id(task_id: Any, servers: Iterable[str]) -> tuple[str, str] | None:
    """(server, the server's own id) for a task id the broker gave out."""
    if not isinstance(task_id, str):
        return None
    head, colon, own = task_id.partition(":")
    server = _ESCAPED.sub(lambda m: ":" if m[0] == "%3A" else "%", head)
    if not colon or server not in servers or _escape(server) != head:
        return None
    return server, own


class TaskTable:
    """One server's tasks: which session owns each (by the server's own id)."""

    def __init__(self, server: str) -> None:
        self.server = server
        self._owners: dict[str, Hashable] = {}

    def owns(self, session: Hashable, task_id: Any) -> bool:
        """Whether ``session`` created the task ``task_id`` on this server."""
        return isinstance(task_id, str) and self._owners.get(task_id) == session

    def check(self, session: Hashable, task_id: Any) -> None:
        """Raise -32602 unless ``session`` created the task ``task_id``."""
        if not self.owns(session, task_id):
            raise JsonRpcError(
                INVALID_PARAMS, f"Unknown task: {outer_id(self.server, str(task_id))}"
            )

    def created(self, session: Hashable, result: Any) -> None:
        """A CreateTaskResult for ``session``: remember the task, rename it in place."""
        task = result.get("task") if isinstance(result, dict) else None
        if isinstance(task, dict) and isinstance(task.get("taskId"), str):
            self._owners[task["taskId"]] = session
            task["taskId"] = outer_id(self.server, task["taskId"])

    def rename(self, result: Any) -> None:
        """Rename the task ids in a tasks/get, tasks/cancel or tasks/result result."""
        if not isinstance(result, dict):
            return
        if isinstance(result.get("taskId"), str):
            result["taskId"] = outer_id(self.server, result["taskId"])
        meta = result.get("_meta")
        # A server's _meta is untrusted: a list or a string has no related task.
        related = meta.get(RELATED_TASK) if isinstance(meta, dict) else None
        if isinstance(related, dict) and isinstance(related.get("taskId"), str):
            related["taskId"] = outer_id(self.server, related["taskId"])

    def listed(self, session: Hashable, result: Any) -> None:
        """Keep only the session's own tasks in a tasks/list result, renamed."""
        if not isinstance(result, dict) or not isinstance(result.get("tasks"), list):
            return
        mine = [
            t
            for t in result["tasks"]
            # Only a str taskId can be the session's (a list one is unhashable).
            if isinstance(t, dict)
            and isinstance(t.get("taskId"), str)
            and self._owners.get(t["taskId"]) == session
        ]
        for task in mine:
            self.rename(task)
        result["tasks"] = mine

    def status(self, message: Message) -> tuple[Hashable, Message] | None:
        """Whom a notifications/tasks/status is for, and the message renamed."""
        params = message.get("params") or {}
        task_id = params.get("taskId")
        session = self._owners.get(task_id) if isinstance(task_id, str) else None
        if session is None:
            return None
        renamed = {**params, "taskId": outer_id(self.server, params["taskId"])}
        return session, {**message, "params": renamed}

    def forget_session(self, session: Hashable) -> None:
        self._owners = {t: s for t, s in self._owners.items() if s != session}
