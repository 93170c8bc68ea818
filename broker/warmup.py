"""What an instance that warms up offers: its own tools, listed by the broker.

An instance of a per-session server or a pool (``warm_up``) is ready only
once it has answered a ``tools/list`` of the broker's own and offers the
tools the catalog shows (:attr:`WarmUp.expected`), re-listing on each
``notifications/tools/list_changed``, or once the actor gives up waiting
(``UpstreamProtocol.warm_up_expired``). An instance given expected tools (a
per-session one) answers a call for a tool it does not offer with -32602
naming the server and the tool (:meth:`WarmUp.check`).
:class:`~broker.upstream.UpstreamProtocol` moves the connection's state
(WARMING, then READY: broker/states.py); this is what it knows of the tools.
"""

from __future__ import annotations

from typing import Any

from broker.jsonrpc import INVALID_PARAMS, JsonRpcError, Message, RequestId


class WarmUp:
    def __init__(self, expected: frozenset[str] | None) -> None:
        self.expected = expected  # the tools the catalog shows (None: none expected)
        # The names of the tools the instance offers, once listed (None: not
        # known, not checked).
        self.tools: frozenset[str] | None = None
        self.listing: RequestId | None = None  # the id of the broker's own tools/list
        self._listed: set[str] = set()  # its pages so far

    def asked(self, request: Message, cursor: str | None) -> None:
        """The broker asks for the tools (a first page: no ``cursor``)."""
        if cursor is None:
            self._listed = set()
        self.listing = request["id"]

    def listed(self, message: Message) -> str | None:
        """The server's answer to it: the cursor of the next page to ask for;
        None: the list is complete (:attr:`tools`; None if it was refused)."""
        self.listing = None
        result = message.get("result")
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):  # refused: nothing to check against
            self.tools = None
            return None
        for tool in tools:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                self._listed.add(tool["name"])
        cursor = result.get("nextCursor") if isinstance(result, dict) else None
        if isinstance(cursor, str) and cursor:
            return cursor
        self.tools = frozenset(self._listed)
        return None

    def checked(self) -> frozenset[str] | None:
        """What calls are checked against: its tools, if it was expected to offer some."""
        return None if self.expected is None else self.tools

    def complete(self) -> bool:
        """It offers the tools expected (or nothing is known to check)."""
        tools, expected = self.tools, self.expected
        return tools is None or expected is None or expected <= tools

    def missing(self) -> list[str]:
        """The tools expected that it does not offer."""
        return sorted((self.expected or frozenset()) - (self.tools or frozenset()))

    def check(self, server: str, request: Message, name: Any) -> None:
        """A call for a tool this (warmed-up) instance does not offer is refused."""
        tools = self.checked()
        # A name from the client is untrusted: one that is no str (a list is
        # unhashable) is no tool it offers either.
        if tools is not None and (not isinstance(name, str) or name not in tools):
            raise JsonRpcError(
                INVALID_PARAMS,
                f"MCP server {server!r} does not offer a tool {name!r}",
                data={"server": server, "tool": name},
                id=request["id"],
            )
