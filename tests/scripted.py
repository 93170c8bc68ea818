"""A scripted MCP server on memory streams, for actor tests.

:class:`MemoryLink` is a :class:`actors.links.link.Link` whose far end is a
:class:`ScriptedServer` task instead of a process: it answers ``initialize``,
``ping`` (``server/discover`` too, as a 2026-07-28 server, if ``modern``)
and a few tools (``echo`` returns its arguments, ``sleep`` waits ``seconds``
first, ``die`` makes the "process" exit, ``raw`` writes its
``line`` argument as it is, with ``ID`` replaced by the request's id and ``PAD``
by ``pad`` x's), answers nothing while ``silent``, and records everything
it received so a test can assert on what crossed the wire. Its catalog
(``tools``, ``prompts``, ``resources``, ``templates``) is plain lists a test
may change, and every result names the server (``label``) that produced it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import trio
import trio.testing

from actors.links.link import LinkContext
from actors.links.stream import StreamLink
from broker import jsonrpc
from broker.wire import ndjson
from broker.wire.ndjson import LineFramer


class ListError:
    """A list request's answer that is an error (see ``ScriptedServer.list_answer``)."""

    def __init__(self, message: str) -> None:
        self.message = message


TOOL_NAMES = ("echo", "sleep", "die", "progress", "ticks", "raw")


class ScriptedServer:
    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        answer_initialize: bool = True,
        label: str = "scripted",
        initialize_delay: float = 0.0,
        stop_reading: bool = False,
        modern: bool = False,
    ) -> None:
        self.nursery = nursery
        self.answer_initialize = answer_initialize
        self.label = label
        self.initialize_delay = initialize_delay  # seconds before it answers initialize
        # Stop reading its input after its first tools/call (a wedged server): its
        # link is then a lockstep pair, so the broker's writes block as on a full pipe.
        self.stop_reading = stop_reading
        # Answer nothing while set (as a process that was SIGSTOPped: it reads
        # nothing either, but memory streams need no reader to take bytes).
        self.silent = False
        # Answer server/discover as a 2026-07-28 server (its one version).
        self.modern = modern
        # What its initialize says it offers (a test may add to it first).
        self.capabilities: dict[str, Any] = {
            "tools": {},
            "prompts": {},
            "resources": {},
            "completions": {},
        }
        self.tools: list[dict[str, Any]] = [
            {"name": name, "inputSchema": {"type": "object"}} for name in TOOL_NAMES
        ]
        self.prompts: list[dict[str, Any]] = [{"name": "greet"}]
        self.resources: list[dict[str, Any]] = [{"uri": f"mem://{label}/readme", "name": "readme"}]
        self.templates: list[dict[str, Any]] = [
            {"uriTemplate": f"mem://{label}/notes/{{id}}", "name": "note"}
        ]
        # What it answers a list request with instead, if set: called with the
        # method and params, it returns the result, or a ListError to answer
        # with an error (a paginating, failing or broken server).
        self.list_answer: Callable[[str, dict[str, Any]], Any] | None = None
        self.received: list[Any] = []
        self.lines: list[bytes] = []  # what was received, as the bytes of each line
        self.launches = 0
        self.links: list[MemoryLink] = []

    async def launch(self, context: LinkContext) -> StreamLink:
        self.launches += 1
        link = MemoryLink(self, context.max_message_bytes)
        self.links.append(link)
        self.nursery.start_soon(link.serve)
        return link.broker_side

    def requests(self, method: str) -> list[Any]:
        return [m for m in self.received if isinstance(m, dict) and m.get("method") == method]


LISTS = {
    "tools/list": ("tools", "tools"),
    "prompts/list": ("prompts", "prompts"),
    "resources/list": ("resources", "resources"),
    "resources/templates/list": ("resourceTemplates", "templates"),
}


class MemoryLink:
    """The far end of a link: the scripted server's side (``broker_side`` is
    the :class:`~actors.links.link.Link` the Upstream gets)."""

    def __init__(self, script: ScriptedServer, max_message_bytes: int) -> None:
        self.script = script
        pair = (
            trio.testing.lockstep_stream_pair
            if script.stop_reading
            else trio.testing.memory_stream_pair
        )
        self._ours, self._theirs = pair()
        self.broker_side = _BrokerSide(self, max_message_bytes)
        self.exited = trio.Event()
        self.exit_code: int | None = None
        self._write_lock = trio.StrictFIFOLock()

    async def serve(self) -> None:
        """The far end: run until the broker closes the link or ``die`` is called."""
        framer = LineFramer()
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    data = await self._theirs.receive_some()
                except trio.ClosedResourceError:
                    data = b""
                if not data:
                    break
                for line in framer.feed(data):
                    assert isinstance(line, bytes)
                    self.script.lines.append(line)
                    message = jsonrpc.decode(line)
                    self.script.received.append(message)
                    if "id" in message and "method" in message and not self.script.silent:
                        nursery.start_soon(self._answer, message, nursery)
                    if self.script.stop_reading and message.get("method") == "tools/call":
                        await trio.sleep_forever()  # (its answers still go out)
            nursery.cancel_scope.cancel()

    async def die(self, code: int = 1) -> None:
        self.exit_code = code
        await self._theirs.aclose()
        self.exited.set()

    async def send(self, message: Any) -> None:
        async with self._write_lock:
            await self._theirs.send_all(ndjson.encode(message))

    async def _answer(self, request: dict[str, Any], nursery: trio.Nursery) -> None:
        method, params = request["method"], request.get("params") or {}
        if method == "initialize":
            if not self.script.answer_initialize:
                return
            await trio.sleep(self.script.initialize_delay)
            result: Any = {
                "protocolVersion": "2025-11-25",
                "capabilities": self.script.capabilities,
                "serverInfo": {"name": self.script.label, "version": "1"},
                "instructions": f"I am {self.script.label}.",
            }
        elif method == "server/discover" and self.script.modern:
            result = {
                "resultType": "complete",
                "supportedVersions": ["2026-07-28"],
                "capabilities": {"tools": {}},
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": self.script.label}},
            }
        elif method == "tools/call" and params.get("name") == "die":
            await self.die()
            return
        elif method == "tools/call" and params.get("name") == "raw":
            line = params["arguments"]["line"].replace("ID", str(request["id"]))
            line = line.replace("PAD", "x" * params["arguments"].get("pad", 0))
            async with self._write_lock:
                await self._theirs.send_all(line.encode() + b"\n")
            return
        elif method == "tools/call":
            arguments = params.get("arguments") or {}
            if params.get("name") == "sleep":
                await trio.sleep(arguments.get("seconds", 1))
            token = (params.get("_meta") or {}).get("progressToken")
            if params.get("name") == "ticks" and token is not None:
                for step in range(arguments["count"]):
                    await trio.sleep(arguments["every"])
                    progress = {"progressToken": token, "progress": step + 1}
                    await self.send(jsonrpc.notification("notifications/progress", progress))
            if params.get("name") == "progress" and token is not None:
                for step in (1, 2):
                    progress = {"progressToken": token, "progress": step, "total": 2}
                    await self.send(jsonrpc.notification("notifications/progress", progress))
            result = {
                "content": [{"type": "text", "text": str(arguments)}],
                "echo": arguments,
                "name": params.get("name"),
                "server": self.script.label,
            }
        elif method in LISTS and self.script.list_answer is not None:
            result = self.script.list_answer(method, params)
            if isinstance(result, ListError):
                error = jsonrpc.error_response(request["id"], -32603, result.message)
                with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                    await self.send(error)
                return
        elif method in LISTS:
            key, attribute = LISTS[method]
            result = {key: getattr(self.script, attribute)}
        else:
            result = {"server": self.script.label, "params": params}
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            await self.send(jsonrpc.result_response(request["id"], result))


class _BrokerSide(StreamLink):
    def __init__(self, far: MemoryLink, max_message_bytes: int) -> None:
        super().__init__(far._ours, far._ours, max_message_bytes, info={"pid": 4242})
        self.far = far

    async def ended(self) -> str:
        with trio.move_on_after(0.5):
            await self.far.exited.wait()
            code = self.far.exit_code
            return f" with code {code}" if code is not None else ""
        return ""

    async def close(self) -> None:
        await self.far._ours.aclose()
        self.far.exited.set()
