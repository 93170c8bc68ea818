"""The broker's own ``requestState`` tokens: opaque, unguessable, one session's.

When the broker answers a modern client ``input_required`` on behalf of a
legacy server (broker/eras/bridge.py), the state it needs on the retry is a
call it keeps waiting, which lives here, not in the token. The token is only
a name for it: the HMAC-SHA256 of a counter under a key the actor draws at
random (``secrets.token_bytes``; this module does no I/O), cut to 144 bits.
A token is redeemed once, only by the session it was minted for; anything
else (another session's token, a spent one, a guess) finds nothing.

Every token starts ``mcpbroker.`` (:data:`PREFIX`: some broker's), then a
tag drawn once per process (:data:`OWN_PREFIX`: this daemon's). A client may
hold another broker's token: one behind this one, as its 2026-07-28 server
(``url`` at its ``--http``), answers ``input_required`` with its own, which
its retry must carry to it as it is; and a daemon that restarted never
minted the token of the one before it. Only this daemon's are its own
(:func:`is_ours`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Hashable
from typing import Any, Final

PREFIX: Final = "mcpbroker."
# (drawn at import, the module's one call out: 48 random bits, this process's)
OWN_PREFIX: Final = f"{PREFIX}{secrets.token_urlsafe(6)}."
DEFAULT_LIMIT = 4096


class TooManyStates(Exception):
    """More tokens outstanding than the limit: the caller answers with an error."""


class RequestStates:
    def __init__(self, key: bytes, limit: int = DEFAULT_LIMIT) -> None:
        if len(key) < 16:
            raise ValueError("the requestState key needs at least 16 bytes")
        self._key = key
        self.limit = limit
        self._counter = 0
        self._held: dict[str, tuple[Hashable, Any]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def mint(self, session: Hashable, value: Any) -> str:
        """A new token for ``value``, which only ``session`` can redeem."""
        if len(self._held) >= self.limit:
            raise TooManyStates(f"{self.limit} requestStates are outstanding")
        self._counter += 1
        digest = hmac.new(self._key, str(self._counter).encode(), hashlib.sha256).digest()
        token = OWN_PREFIX + base64.urlsafe_b64encode(digest[:18]).decode("ascii")
        self._held[token] = (session, value)
        return token

    def peek(self, session: Hashable, token: Any) -> Any:
        """The value of a token this session holds, kept; None for any other."""
        held = self._held.get(token) if isinstance(token, str) else None
        return None if held is None or held[0] != session else held[1]

    def redeem(self, session: Hashable, token: Any) -> Any:
        """The value of a token this session holds, forgotten; None for any other."""
        held = self._held.get(token) if isinstance(token, str) else None
        if held is None or held[0] != session:
            return None
        del self._held[token]
        return held[1]

    def discard(self, token: str) -> Any:
        """Forget a token (it expired); its value, or None."""
        held = self._held.pop(token, None)
        return None if held is None else held[1]

    def session_gone(self, session: Hashable) -> list[Any]:
        """Forget every token of a session that left; their values."""
        gone = [token for token, held in self._held.items() if held[0] == session]
        return [self._held.pop(token)[1] for token in gone]


def is_ours(token: Any) -> bool:
    """Whether a ``requestState`` has the shape of this daemon's tokens."""
    return isinstance(token, str) and token.startswith(OWN_PREFIX)


def is_brokers(token: Any) -> bool:
    """Whether a ``requestState`` has the shape of some mcpbroker's tokens
    (this daemon's, one before a restart, or one this daemon reaches)."""
    return isinstance(token, str) and token.startswith(PREFIX)
