"""The id map of one upstream server: the heart of multiplexing.

Many sessions share one upstream connection, and each picks its request ids
on its own, so two sessions may both send id 1 at once. :class:`RequestMap`
gives every forwarded request a fresh upstream id (an int from one counter),
remembers whose request it was, and puts the client's own id back on the
response, exactly as the client sent it (a string stays a string). A
``progressToken`` is swapped the same way (the upstream id doubles as the
upstream token, unique on this upstream), and restored on every
``notifications/progress``.

Sessions are opaque keys here: anything hashable. The map never decides where
a message goes beyond "this session"; the actor delivers.
"""

from __future__ import annotations

from collections.abc import Container, Hashable
from typing import Any

import attrs

from broker.jsonrpc import (
    INVALID_REQUEST,
    LIMIT_REACHED,
    JsonRpcError,
    Message,
    RequestId,
    bad_progress_token,
)
from broker.records import Record

# -- notes: what an in-flight request's answer needs done to it ---------------
#
# Nearly every request needs nothing (its note is None, the fast path's one
# test). The few that do carry one of these records, and the answer is matched
# by the record's type, never by comparing strings: a subscribed URI is data a
# client chose, and may be spelt like anything.


@attrs.frozen
class Subscribing:
    """A ``resources/subscribe`` forwarded upstream: refused, ``uri`` is forgotten."""

    uri: str


@attrs.frozen
class CreatesTask:
    """A task-augmented ``tools/call``: its answer creates a task the session owns."""


@attrs.frozen
class TaskQuery:
    """``tasks/get``, ``tasks/result`` or ``tasks/cancel``: its answer's task ids are renamed."""


@attrs.frozen
class TaskList:
    """``tasks/list``: its answer keeps only the session's own tasks, renamed."""


class InputRound(Record):
    """A legacy client's ``tools/call``, ``prompts/get`` or ``resources/read`` at
    a modern server: the request as the client sent it, and how many rounds of
    questions (``input_required`` answers) it has had. Its answer may be
    another round (broker/eras/bridge.py, ``AskingClients``), which asks the
    client and sends the request again with this note, one round more. (A
    record made per such call: broker/records.py. Never changed once made.)"""

    __slots__ = ("request", "rounds")

    def __init__(self, request: Message, rounds: int = 0) -> None:
        self.request = request
        self.rounds = rounds

    def fields(self) -> tuple[Any, ...]:
        return (self.request, self.rounds)


Note = Subscribing | CreatesTask | TaskQuery | TaskList | InputRound
"""Every kind of note."""


class InFlight(Record):
    """A request forwarded upstream and not yet answered (a record made per
    request: broker/records.py)."""

    __slots__ = ("client_id", "client_token", "method", "note", "session")

    def __init__(
        self,
        session: Hashable,
        client_id: RequestId,
        method: str,
        client_token: Any = None,
        note: Note | None = None,
    ) -> None:
        self.session = session
        self.client_id = client_id
        self.method = method
        self.client_token = client_token  # the client's progressToken, if it sent one
        self.note = note  # what its answer needs done (None: nothing, nearly always)

    def fields(self) -> tuple[Any, ...]:
        return (self.session, self.client_id, self.method, self.client_token, self.note)


class RequestMap:
    def __init__(self, server: str = "", limit: int = 1 << 62) -> None:
        """``limit``: the most requests in flight at once (-32005 past it)."""
        self.server = server
        self.limit = limit
        self._next_id = 1
        self._by_upstream: dict[int, InFlight] = {}
        # (session, client id) -> upstream id. Client ids are int or str (never
        # bool or float, which would alias ints), so they are keys as they are.
        self._by_client: dict[tuple[Hashable, RequestId], int] = {}

    def __len__(self) -> int:
        return len(self._by_upstream)

    def sessions(self, skip: Container[int] = ()) -> list[Hashable]:
        """The sessions with requests in flight (but those in ``skip``), once
        each, in the order of their oldest request."""
        found = (entry.session for uid, entry in self._by_upstream.items() if uid not in skip)
        return list(dict.fromkeys(found))

    def sole_requests(self, skip: Container[int] = ()) -> dict[Hashable, RequestId]:
        """For each session with exactly one request in flight (but those in
        ``skip``), that request's client id (broker/related.py says why)."""
        found: dict[Hashable, RequestId | None] = {}
        for uid, entry in self._by_upstream.items():
            if uid not in skip:
                found[entry.session] = None if entry.session in found else entry.client_id
        return {session: id for session, id in found.items() if id is not None}

    def count(self, session: Hashable) -> int:
        return sum(1 for entry in self._by_upstream.values() if entry.session == session)

    def open(self, session: Hashable, request: Message) -> int:
        """Record a client's request and rewrite it, in place, for upstream.

        Returns the upstream id. Raises -32600 if the session already has a
        request in flight with the same id (MCP forbids reusing one), -32005
        if the map is full.
        """
        client_id = request["id"]
        if type(client_id) is not int and type(client_id) is not str:
            raise JsonRpcError(INVALID_REQUEST, f"Invalid request id: {client_id!r}")
        key = (session, client_id)
        if key in self._by_client:
            # Answered with id null: the id's one answer belongs to the request in flight.
            raise JsonRpcError(
                INVALID_REQUEST,
                f"Invalid Request: id {client_id!r} is already in use by a request in flight",
                data={"id": client_id},
            )
        if len(self._by_upstream) >= self.limit:
            raise JsonRpcError(
                LIMIT_REACHED,
                f"MCP server {self.server!r} already has {self.limit} requests in flight "
                f"(the limit is broker.maxServerInFlight)",
                data={"server": self.server},
                id=client_id,
            )
        params = request.get("params")
        meta = params.get("_meta") if type(params) is dict else None  # (a modern call's: all)
        if isinstance(meta, dict) and "progressToken" in meta:
            token = meta["progressToken"]
            if type(token) is not int and bad_progress_token(token) is not None:
                # (kept in the table below: not any value, of any size. Raised
                # unnamed: an error in a local of this frame would hold it, and
                # the request with it, in a cycle until the garbage collector)
                raise bad_progress_token(token, client_id)  # type: ignore[misc]
        else:
            meta = None  # (no token to swap)
        upstream_id = self._next_id
        self._next_id += 1
        entry = InFlight(session, client_id, request["method"])
        if meta is not None:
            entry.client_token = meta["progressToken"]
            request["params"]["_meta"] = {**meta, "progressToken": upstream_id}
        request["id"] = upstream_id
        self._by_upstream[upstream_id] = entry
        self._by_client[key] = upstream_id
        return upstream_id

    def close_plain(self, upstream_id: int) -> InFlight | None:
        """Forget the request with this (int) id, answered, if it has no note
        (nearly every one); None, and nothing changed, otherwise. Unlike
        :meth:`close`, the caller puts the client's id on the answer."""
        entry = self._by_upstream.get(upstream_id)
        if entry is None or entry.note is not None:
            return None
        del self._by_upstream[upstream_id]
        del self._by_client[(entry.session, entry.client_id)]
        return entry

    def close_round(self, upstream_id: int) -> InFlight | None:
        """:meth:`close_plain` for a request whose note is an :class:`InputRound`
        (a legacy client's call at a modern server), once its answer is known
        to be final; None, and nothing changed, for any other."""
        entry = self._by_upstream.get(upstream_id)
        if entry is None or type(entry.note) is not InputRound:
            return None
        del self._by_upstream[upstream_id]
        del self._by_client[(entry.session, entry.client_id)]
        return entry

    def close(self, response: Message) -> InFlight | None:
        """Match a server's response, restoring the client's id in place.

        Returns the entry it answered, or None for an id nobody waits for (a
        request that was cancelled, or a server's mistake): such a response
        is dropped.
        """
        upstream_id = response.get("id")
        if not isinstance(upstream_id, int) or isinstance(upstream_id, bool):
            return None
        entry = self._pop(upstream_id)
        if entry is not None:
            response["id"] = entry.client_id
        return entry

    def progress(self, notification: Message) -> InFlight | None:
        """Match ``notifications/progress``, restoring the client's token in place.

        Progress for a request already answered (or never made) gives None and
        is dropped.
        """
        params = notification.get("params")
        if not isinstance(params, dict):
            return None
        token = params.get("progressToken")
        if not isinstance(token, int) or isinstance(token, bool):
            return None
        entry = self._by_upstream.get(token)
        if entry is None or entry.client_token is None:
            return None
        notification["params"] = {**params, "progressToken": entry.client_token}
        return entry

    def cancel(self, session: Hashable, client_id: Any) -> int | None:
        """Forget a request the client cancelled; returns its upstream id.

        Its late response, if the server still sends one, will be dropped.
        """
        if type(client_id) is not int and type(client_id) is not str:
            return None
        upstream_id = self._by_client.get((session, client_id))
        if upstream_id is not None:
            self._pop(upstream_id)
        return upstream_id

    def drop_session(self, session: Hashable) -> list[int]:
        """Forget every request of a session that went away; their upstream ids."""
        gone = [uid for uid, entry in self._by_upstream.items() if entry.session == session]
        for upstream_id in gone:
            self._pop(upstream_id)
        return gone

    def rebind(self, upstream_id: int, session: Hashable, client_id: RequestId) -> bool:
        """A request in flight now answers another request of its session (a
        modern client's retry takes over the call it asked: broker/eras/bridge.py).
        False, and nothing changed, if it is gone or the new id is in use."""
        entry = self._by_upstream.get(upstream_id)
        key = (session, client_id)
        if entry is None or entry.session != session or key in self._by_client:
            return False
        del self._by_client[(session, entry.client_id)]
        entry.client_id = client_id
        self._by_client[key] = upstream_id
        return True

    def get(self, upstream_id: int | str) -> InFlight | None:
        """The request in flight with this upstream id, if there is one."""
        return self._by_upstream.get(upstream_id) if type(upstream_id) is int else None

    def note(self, upstream_id: int, note: Note) -> None:
        self._by_upstream[upstream_id].note = note

    def forget(self, upstream_id: int) -> InFlight | None:
        """Drop one request (it timed out); its late response will be dropped."""
        return self._pop(upstream_id)

    def drain(self) -> list[InFlight]:
        """Forget everything (the server died): the requests to fail."""
        entries = list(self._by_upstream.values())
        self._by_upstream.clear()
        self._by_client.clear()
        return entries

    def _pop(self, upstream_id: int) -> InFlight | None:
        entry = self._by_upstream.pop(upstream_id, None)
        if entry is not None:
            del self._by_client[(entry.session, entry.client_id)]
        return entry
