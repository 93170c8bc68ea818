"""An upstream server's era (docs/eras.md): which one it speaks, and what a
modern (2026-07-28) server needs of the broker's side of its connection.

:class:`EraProbe` opens the connection: ``server/discover`` unless the
server is configured legacy, ``initialize`` then; it follows the verdicts on
the probe's answers (broker/eras/probe.py) and a probe that expired or
failed. Each change of the era the connection's requests go in is said with
:class:`~broker.upstream_actions.Speak` before them: the link follows it
(HTTP: a modern request is its own POST), never guessing from a request.

:class:`ModernServer` is the modern side of an
:class:`~broker.upstream.UpstreamProtocol`, made when the probe finds the
server modern (``UpstreamProtocol.modern_server``; None at a legacy server). It
is given the protocol's tables it reads and updates (its sessions, their
fan-out, the in-flight table), never the protocol itself:

- **stamping**: a legacy client's request (and the broker's own) gets the
  ``_meta`` every modern request carries, with the client's log level (the
  modern era has no ``logging/setLevel``); a modern client's goes as it came;
- **the listen**: subscriptions and list changes come through the broker's
  one ``subscriptions/listen`` (:attr:`ModernServer.listen`), whose filter
  is every list the server announces and the URIs its sessions subscribed to;
- **the bridge**: a legacy client's ``tools/call``, ``prompts/get`` or
  ``resources/read`` carries an ``InputRound`` note; an ``input_required``
  answer is put to that client as requests, and the call sent again with
  the answers (:attr:`ModernServer.asking`, broker/eras/bridge.py); the
  protocol records each call sent again (``SendServer``) as a new request.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any, Final

import orjson

from broker import jsonrpc
from broker.eras.bridge import (
    AnswerClient,
    AskClient,
    AskingClients,
    SendServer,
    is_input_required,
    modern_params,
)
from broker.eras.modern import INPUT_METHODS
from broker.eras.probe import (
    Incompatible,
    Legacy,
    Reprobe,
    Verdict,
    discover_request,
    modern_only,
    read_probe_answer,
)
from broker.eras.subscriptions import LIST_FLAGS, Filter, UpstreamListen, offer_of
from broker.eras.versions import (
    HEADER_MISMATCH,
    LATEST_MODERN_VERSION,
    UNSUPPORTED_PROTOCOL_VERSION,
)
from broker.fanout import Fanout
from broker.jsonrpc import INTERNAL_ERROR, METHOD_NOT_FOUND, JsonRpcError, Message, RequestId
from broker.lifecycle import (
    BROKER_CLIENT_CAPABILITIES,
    BROKER_CLIENT_INFO,
    HandshakeError,
    ServerIdentity,
    initialize_request,
)
from broker.requestmap import InputRound, RequestMap
from broker.server_requests import ClientIds
from broker.upstream_actions import (
    Action,
    Deliver,
    ListChanged,
    ListenLater,
    Reconnect,
    SendUpstream,
    Speak,
    Warn,
)
from broker.wire.envelope import Answer

HANDSHAKE_ID = "mcpbroker-initialize"
PROBE_ID = "mcpbroker-discover"
# A listen the server ends within this many seconds of its opening counts as
# ended at once: the next is opened after LISTEN_DELAY, doubled each time.
LISTEN_SETTLE: Final = 5.0
LISTEN_DELAY: Final = 0.5
MAX_LISTEN_DELAY: Final = 30.0
# A modern server that refuses 2026-07-28 on a call is opened again (its era
# found out anew) at most once in this many seconds (EraRefusals).
REPROBE_INTERVAL: Final = 300.0


class EraProbe:
    """Which era a server speaks, found out as the connection opens."""

    def __init__(self, era: str) -> None:
        # "auto", "legacy" or "modern" (broker/config.py)
        self.era = era
        self.probes = 0  # server/discover probes sent, while the era is undecided
        self.speaking: str | None = None  # the era the requests go in (Speak)
        # The server refused initialize as a modern-only server does, and is
        # probed at the version it named: a legacy verdict then ends it.
        self.refusal_probed = False
        # A probe was written on this connection (a server that ends before
        # its handshake may have ended because of it: UpstreamProtocol.restarted).
        self.sent = False

    def opening(self) -> Message:
        """The first message to write to a freshly started server, in the era
        :attr:`speaking` says: the ``server/discover`` probe unless the server
        is configured legacy, ``initialize`` then."""
        if self.era == "legacy":
            return initialize_request(HANDSHAKE_ID)
        self.probes = 1
        self.sent = True
        self.speaking = LATEST_MODERN_VERSION
        return discover_request(PROBE_ID, LATEST_MODERN_VERSION)

    def expired(self) -> list[Action]:
        """The clock ran out on the probe: a server of ``"era": "auto"`` is
        opened with ``initialize`` (a forced modern one waits for the startup
        timeout, the only verdict left)."""
        return self.initialize() if self.era == "auto" else []

    def answered(self, message: Message) -> Verdict:
        """The verdict on the server's answer to the probe."""
        return read_probe_answer(message, first=self.probes == 1)

    def follow(self, verdict: Legacy | Reprobe | Incompatible) -> list[Action]:
        """What a verdict other than modern leads to (raises HandshakeError if
        the server cannot be used as configured)."""
        if isinstance(verdict, Reprobe):
            return self.probe(verdict.version)
        if isinstance(verdict, Incompatible):
            raise HandshakeError(verdict.message)
        self.probes = 0
        if self.era == "modern":
            raise HandshakeError(f'server is not modern ("era": "modern"): {verdict.reason}')
        if self.refusal_probed or self.era == "legacy":  # (probed after it refused initialize)
            raise HandshakeError(f"server refused initialize and is not modern: {verdict.reason}")
        return self.initialize()

    def refused(self, message: Message) -> list[Action] | None:
        """The answer to ``initialize``: if it is a modern-only server's
        refusal, it is probed at the version it names; None: any other answer.

        Under ``"legacy"`` that is how a modern-only server is found. Under
        ``"auto"`` it is how one whose probe timed out is: a server slow to
        start (``npx`` fetching a package) may read the late probe first, and a
        dual-era server fixes its era with the first request it reads (the
        SDK's ``serve_dual_era_loop``), so it then refuses the initialize.
        Once only: a server probed so that answers legacy fails its handshake."""
        version = modern_only(message) if self.era != "modern" else None
        if version is None or self.refusal_probed:
            return None
        self.refusal_probed = True
        self.probes = 0
        return self.probe(version)

    def probe(self, version: str) -> list[Action]:
        self.probes += 1
        self.sent = True
        return [*self._speak(version), SendUpstream(discover_request(PROBE_ID, version))]

    def initialize(self) -> list[Action]:
        self.probes = 0
        return [*self._speak(None), SendUpstream(initialize_request(HANDSHAKE_ID))]

    def modern(self, version: str) -> list[Action]:
        """The server is modern, at ``version``: its requests go so."""
        self.probes = 0
        return self._speak(version)

    def _speak(self, version: str | None) -> list[Action]:
        """The requests go in this era from now on: said if that is a change."""
        if version == self.speaking:
            return []
        self.speaking = version
        return [Speak(version)]


class ModernServer:
    """The modern side of one server connection (see the module's text)."""

    def __init__(
        self,
        identity: ServerIdentity,
        name: str,
        ids: ClientIds,
        *,
        sessions: dict[Hashable, dict[str, Any]],
        modern_sessions: set[Hashable],
        fanout: Fanout,
        client_infos: dict[Hashable, Any],
        requests: RequestMap,
    ) -> None:
        self.identity = identity
        self.offer = offer_of(identity.capabilities)
        self.name = name
        # The protocol's tables it reads and updates (the same for the
        # connection's life): sessions -> their capabilities, the modern
        # ones among them, the legacy ones' clientInfo, their log levels and
        # subscriptions, requests in flight.
        self._sessions = sessions
        self._modern_sessions = modern_sessions
        self._client_infos = client_infos
        self._fanout = fanout
        self._requests = requests
        # Each legacy session's stamp, as the bytes orjson writes for it
        # (made on its first request, forgotten when what it says changes:
        # :meth:`forget_stamp`).
        self.stamps: dict[Hashable, orjson.Fragment] = {}
        # Its questions put to legacy clients (docs/eras.md).
        self.asking = AskingClients(name, ids)  # (ids: the instance's, its requests' too)
        # The broker's one subscriptions/listen at the server.
        self.listen = UpstreamListen(BROKER_CLIENT_CAPABILITIES)
        self._listens = 0
        self._relistened = -math.inf  # when a listen was last opened again
        self._quick_ends = 0  # listens in a row that ended soon after they were
        self._lists_missed: frozenset[str] = frozenset()  # (to fetch on the next listen)

    def asks_legacy(self, session: Hashable, method: str) -> bool:
        """A legacy client's call, which the server may answer
        ``input_required``: the broker puts the questions (AskingClients)."""
        return method in INPUT_METHODS and session not in self._modern_sessions

    def stamp(self, request: Message, session: Hashable | None) -> None:
        """Give a request, in place, the ``_meta`` every modern request
        carries: the version, and the capabilities and clientInfo of the
        client it is for (the broker's own for its own requests, ``None``),
        with the log level that client set, if it set one.

        A session's stamp is the same on every request until its log level
        (or what it attached with) changes: the first request whose params
        carry no ``_meta`` of the client's own makes it once, as the bytes
        orjson writes for it (an ``orjson.Fragment``, written as it is:
        encoding the value again cost 1,300 instructions a call), and later
        ones take those. A request with a ``_meta`` of its own (a
        ``progressToken``) has the stamp merged into it, as a value."""
        params = request.get("params")
        stamp = self.stamps.get(session)
        if stamp is not None and type(params) is dict and "_meta" not in params:
            request["params"] = {**params, "_meta": stamp}
            return
        capabilities = None if session is None else self._sessions.get(session)
        info: Any = BROKER_CLIENT_INFO
        level = None
        if capabilities is None:  # the broker's own request
            capabilities = BROKER_CLIENT_CAPABILITIES
        else:
            info, level = self._client_infos.get(session), self._fanout.level_of(session)
        version = self.identity.protocol_version
        stamped = modern_params(params, version, capabilities, info, level)
        request["params"] = stamped
        own = type(params) is dict and "_meta" in params  # (merged: not the session's stamp)
        # (the HTTP link reads a Fragment's version as 2026-07-28: kept for no other)
        if session is not None and not own and version == LATEST_MODERN_VERSION:
            self.stamps[session] = orjson.Fragment(orjson.dumps(stamped["_meta"]))

    def forget_stamp(self, session: Hashable) -> None:
        """What a session's stamp says changed (its log level, or what it
        attached with), or it went: the next request makes it again."""
        self.stamps.pop(session, None)

    def logs_to(self, admitted: list[Hashable]) -> list[Hashable]:
        """Of the sessions a log message admits, those it is for: the server
        logs for requests that asked (a level in ``_meta``), so sessions with
        one in flight that set a level."""
        busy = self._requests.sessions()
        return [s for s in admitted if s in busy and self._fanout.level_of(s)]

    # -- the listen (the protocol asks only while the connection is up) ---------

    def subscribe(self, session: Hashable, request: Message, uri: str) -> list[Action]:
        """A client's ``resources/(un)subscribe``: the server has none, the
        URIs subscribed to are its listen's filter."""
        if not self.offer.subscribe:
            raise JsonRpcError(
                METHOD_NOT_FOUND,
                f"MCP server {self.name!r} takes no resource subscriptions",
                data={"server": self.name},
                id=request["id"],
            )
        if request["method"] == "resources/subscribe":
            self._fanout.subscribe(session, uri)
        else:
            self._fanout.unsubscribe(session, uri)
        return self.listen_actions()

    def listen_actions(self) -> list[Action]:
        """Listen for what the sessions want now: every list the server offers
        to announce, and the URIs subscribed to (nothing if that is what it
        already listens for)."""
        offer = self.offer
        uris = frozenset(self._fanout.subscribed_uris()) if offer.subscribe else frozenset()
        self._listens += 1
        id = f"mcpbroker-listen-{self._listens}"
        return [SendUpstream(m) for m in self.listen.want(Filter(offer.lists, uris), id)]

    def is_listen(self, request: Any) -> bool:
        """Whether ``request`` is the id of the broker's listen."""
        return self.listen.id is not None and request == self.listen.id

    def listen_failed(self, detail: str, now: float = 0.0) -> list[Action]:
        """The link lost the answer to the listen (HTTP: its stream broke):
        listen again if it had worked, and fetch the lists again."""
        again = self.listen.dropped()
        warn = Warn("server.listen_lost", f"subscriptions/listen ended: {detail}")
        return [warn] if again is None else [warn, *self._listen_again(again, now)]

    def listen_ended(self, message: Message, now: float = 0.0) -> list[Action]:
        """The server answered the listen: a refusal is said; a stream ended is
        opened again, and its lists are fetched again (what changed in the gap
        was not told: 2026-07-28 has no replay)."""
        again = self.listen.ended(message)
        if again is None:
            error = message.get("error")
            said = error.get("message") if isinstance(error, dict) else error
            return [Warn("server.listen_refused", f"subscriptions/listen was refused: {said}")]
        return self._listen_again(again, now)

    def _listen_again(self, ended: Filter, now: float) -> list[Action]:
        """A stream that ended (at ``now``): listen again, and fetch its
        lists again; at once, unless the last one was opened again less than
        ``LISTEN_SETTLE`` seconds before, when it waits, twice as long each
        time (up to ``MAX_LISTEN_DELAY``). (A server that ended every listen
        at once had the broker listen, and list its tools, hundreds of
        times a second.)"""
        if now - self._relistened < LISTEN_SETTLE:
            self._quick_ends += 1
        else:
            self._quick_ends = 0
        delay = (
            0.0
            if not self._quick_ends
            else min(LISTEN_DELAY * 2 ** (self._quick_ends - 1), MAX_LISTEN_DELAY)
        )
        self._relistened = now + delay
        self._lists_missed |= ended.lists
        if delay:
            return [ListenLater(delay)]
        return self.listen_now()

    def listen_now(self) -> list[Action]:
        """Listen again, and fetch the lists a stream that ended asked for."""
        missed, self._lists_missed = self._lists_missed, frozenset()
        changed = [ListChanged(jsonrpc.notification(LIST_FLAGS[f])) for f in sorted(missed)]
        return [*self.listen_actions(), *changed]

    # -- the bridge: a legacy client's input_required rounds ---------------------
    # (Each gives questions and answers for clients, and the calls to send
    # again, which the protocol records anew: SendServer.)

    def round_answered(
        self, session: Hashable, note: InputRound, message: Message, now: float, timeout: float
    ) -> list[Deliver | SendServer]:
        """The server answered a legacy client's call: ``input_required`` is
        put to the client, who has ``timeout`` from ``now`` to answer; any
        other answer goes to it as the server wrote it (docs/eras.md)."""
        result = message.get("result")
        if is_input_required(result):
            assert isinstance(result, dict)
            capabilities = self._sessions.get(session, {})
            asked = self.asking.input_required(session, capabilities, note, result, now, timeout)
            return self.bridged(asked)
        return [Deliver(session, message)]

    def client_answered(
        self, session: Hashable, response: Message
    ) -> list[Deliver | SendServer] | None:
        """A client's answer to one of the server's questions (which, once all
        are answered, sends the call again); None: not one of them."""
        asked = self.asking.client_answered(session, response)
        return None if asked is None else self.bridged(asked)

    def withdraw(self, session: Hashable, request: RequestId | None) -> list[Deliver | SendServer]:
        """A client cancelled a call that waits for its own answers (between
        the server's rounds): the questions still open are withdrawn."""
        return self.bridged(self.asking.cancel(session, request))

    def bridged(self, actions: list[Any]) -> list[Deliver | SendServer]:
        """AskingClients' actions: questions and answers to clients delivered,
        calls to send again as they are."""
        out: list[Deliver | SendServer] = []
        for action in actions:
            if isinstance(action, AskClient | AnswerClient):
                out.append(Deliver(action.session, action.message))
            elif isinstance(action, SendServer):
                out.append(action)
        return out


def may_refuse_era(answer: Answer) -> bool:
    """Whether an error answer, unparsed, may be one :class:`EraRefusals`
    rewrites (its bytes name either code: the parser tells)."""
    line = answer.written()
    return line.find(b"-32022") >= 0 or line.find(b"-32020") >= 0


class EraRefusals:
    """A 2026-07-28 server's refusals of the broker's side of the era on a
    call, as errors naming the server, and whether one leads to finding out
    its era again (docs/eras.md, "A server opened modern that refuses the
    era"). One per server connection's actor: carried across its connections
    (``UpstreamProtocol.restarted``), so the bound holds across them."""

    def __init__(self, server: str, era: str) -> None:
        self.server = server
        self.era = era  # as configured: "modern" is never probed again
        self.reprobed_at: float | None = None  # when a refusal last reopened it

    def refused(self, message: Message, now: float) -> tuple[Message, list[Action]] | None:
        """The error answer rewritten (-32603, naming the server) and what it
        leads to (a warning; :class:`Reconnect` for a -32022 at most once per
        :data:`REPROBE_INTERVAL`), or None: not a refusal of the era.

        Relayed as it came, the refusal told the client that the broker
        refused its own version or headers: a legacy client never asked for
        2026-07-28, and a modern one's were right (basic/versioning)."""
        error = message.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        if code != UNSUPPORTED_PROTOCOL_VERSION and code != HEADER_MISMATCH:
            return None
        assert isinstance(error, dict)
        what = "2026-07-28" if code == UNSUPPORTED_PROTOCOL_VERSION else "the broker's HTTP headers"
        text = (
            f"MCP server {self.server!r} refused {what} ({code}: {error.get('message')}), "
            "though it was opened in that era (its server/discover named it)"
        )
        data: dict[str, Any] = {"server": self.server, "code": code}
        if "data" in error:
            data["data"] = error["data"]
        set_era = 'set its "era" to "legacy" if it no longer speaks 2026-07-28'
        actions: list[Action] = []
        since = None if self.reprobed_at is None else now - self.reprobed_at
        if code == HEADER_MISMATCH or self.era == "modern":
            # (-32020 is the 2026-07-28 revision's own check: the server is modern)
            text += f": {set_era}"
        elif since is not None and since < REPROBE_INTERVAL:  # (a server that flips)
            text += (
                f"; it was opened again to find out its era {since:.0f} s ago, and is not "
                f"before {REPROBE_INTERVAL - since:.0f} s from now: {set_era}"
            )
        else:
            self.reprobed_at = now
            text += ": mcpbroker opens it again to find out its era; call again"
            data["retryable"] = True
            actions.append(
                Reconnect(
                    "refused 2026-07-28 on a call though its server/discover named it: "
                    "opened again to find out its era"
                )
            )
        refusal = jsonrpc.error_response(message.get("id"), INTERNAL_ERROR, text, data=data)
        return refusal, [Warn("server.era_refused", text), *actions]
