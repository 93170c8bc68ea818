"""End to end: every era of client against every era of server, through the broker.

The official SDK's server (tests/servers/era_server.py) runs legacy only,
modern only, or dual-era, behind the broker: with the default ``era``
(``auto``: the ``server/discover`` probe; a legacy-only server answers it
with an error and is opened with ``initialize``, a modern-only or dual-era
one is used in the modern era), and a dual-era one also with ``"era":
"legacy"`` (opened with ``initialize``). The official SDK's ``Client`` reaches it through
``mcpbroker connect`` in legacy mode and in ``mode="auto"`` (which the
broker answers modern). In every combination a tool that asks for
elicitation, one that asks for sampling and one that lists the client's
roots complete: a modern server's ``input_required`` is put to a
legacy client as requests (broker/eras/bridge.py, ``AskingClients``), or
passed to a modern client as it is; a legacy server's requests become
``input_required`` for a modern client. One daemon per server kind, every
client mode against it.

Then what a legacy client hears of a modern server (its listen, translated),
and that two legacy clients at once are each asked only their own question.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import types
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError

from broker.lifecycle import BROKER_NAME
from tests.conftest import REPO, running_daemon, shim_parameters, text_of
from tests.test_http_upstream_e2e import listening_process
from tests.test_websocket_upstream_e2e import free_port
from tests.ws_transport import websocket_transport

# (a legacy client's resources/subscribe: the SDK warns that 2026-07-28 lacks it)
# (and logging/setLevel: deprecated in it)
pytestmark = [
    pytest.mark.filterwarnings("ignore:resources/.*subscribe is removed"),
    pytest.mark.filterwarnings("ignore:The logging capability is deprecated"),
]

MODERN = "2026-07-28"
HOST = "matrix-host"  # the SDK clients' clientInfo name
HOST_INFO = types.Implementation(name=HOST, version="1.0")
# (the server's kind, its "era" in the config: None for the default)
SERVERS = [("legacy", None), ("modern", None), ("dual", None), ("dual", "legacy")]


def era_server(kind: str, era: str | None = None) -> dict[str, Any]:
    """Config entry for tests/servers/era_server.py."""
    entry = {"command": sys.executable, "args": ["-m", "tests.servers.era_server", kind],
             "cwd": str(REPO)}  # fmt: skip
    return entry if era is None else {**entry, "era": era}


class User:
    """A client's user and model: answers its questions, and remembers them."""

    def __init__(self, answer: str = "blue", model: str = "Paris") -> None:
        self.answer, self.model = answer, model
        self.asked: list[str] = []
        self.heard: list[Any] = []
        self.changed = trio.Event()

    async def elicit(self, context: Any, params: Any) -> types.ElicitResult:
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"answer": self.answer})

    async def sample(self, context: Any, params: types.CreateMessageRequestParams) -> Any:
        self.asked.append(params.messages[0].content.text)  # type: ignore[union-attr]
        text = types.TextContent(type="text", text=self.model)
        return types.CreateMessageResult(role="assistant", model="m", content=text)

    async def roots(self, context: Any) -> types.ListRootsResult:
        self.asked.append("roots")
        return types.ListRootsResult(roots=[types.Root(uri="file:///work")])

    async def hear(self, message: Any) -> None:
        self.heard.append(message)
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, kind: type) -> Any:
        while True:
            found = [m for m in self.heard if isinstance(m, kind)]
            if found:
                return found[0]
            await self.changed.wait()


@asynccontextmanager
async def client(
    socket_path: str, mode: str, user: User | None = None, *, asks: bool = True
) -> AsyncIterator[Client]:
    """An SDK client through the shim; ``asks``: it declares elicitation and sampling."""
    callbacks: dict[str, Any] = {}
    if user is not None:
        callbacks["message_handler"] = user.hear
        if asks:
            callbacks.update(
                elicitation_callback=user.elicit,
                sampling_callback=user.sample,
                list_roots_callback=user.roots,
            )
    async with Client(
        shim_parameters(socket_path, "s"),
        mode=mode,
        client_info=HOST_INFO,
        **callbacks,  # type: ignore[arg-type]
    ) as session:
        yield session


async def asks_every_kind(session: Client, mode: str, user: User, server_era: str) -> None:
    """The client speaks the era its mode picks; the server's tools that ask
    for elicitation, sampling and roots complete, each asking once."""
    assert (session.protocol_version == MODERN) is (mode == "auto")
    assert text_of(await session.call_tool("era", {})) == server_era
    # A server opened modern hears of each call's host (a legacy one's, from
    # its initialize, stamped on); one opened legacy knows the broker alone.
    named = HOST if server_era == "modern" else BROKER_NAME
    assert text_of(await session.call_tool("client_name", {})) == named
    result = await session.call_tool("ask_user", {"question": "Colour?"})
    assert (text_of(result), result.is_error) == ("accept: blue", False)
    result = await session.call_tool("ask_llm", {"prompt": "Capital?"})
    assert (text_of(result), result.is_error) == ("Paris", False)
    result = await session.call_tool("roots", {})
    assert (text_of(result), result.is_error) == ("file:///work", False)
    assert user.asked == ["Colour?", "Capital?", "roots"]  # each asked once


@pytest.mark.parametrize(("kind", "era"), SERVERS)
async def test_every_client_mode_gets_its_questions_from_every_kind_of_server(
    socket_path: str, kind: str, era: str | None
) -> None:
    modern = kind != "legacy" and era != "legacy"  # the era the broker speaks to it
    with trio.fail_after(90):
        async with running_daemon({"s": era_server(kind, era)}, socket_path) as daemon:
            assert (daemon.upstreams["s"].identity.protocol_version == MODERN) is modern
            for mode in ("legacy", "auto"):
                user = User()
                async with client(socket_path, mode, user) as session:
                    await asks_every_kind(session, mode, user, "modern" if modern else "legacy")


@pytest.mark.parametrize("kind", ["legacy", "modern"])
async def test_every_client_mode_gets_its_questions_over_websocket(
    socket_path: str, kind: str
) -> None:
    """The same by WebSocket (``serve --ws``, the SDK's ``Client`` over
    tests/ws_transport.py): a modern client's session is told by its first
    message on any transport (docs/eras.md)."""
    with trio.fail_after(90):
        async with running_daemon(
            {"s": era_server(kind)}, socket_path, broker={"websocket": "127.0.0.1:0"}
        ) as daemon:
            assert daemon.websocket_url is not None
            for mode in ("legacy", "auto"):
                user = User()
                callbacks = dict(elicitation_callback=user.elicit, sampling_callback=user.sample,
                                 list_roots_callback=user.roots, client_info=HOST_INFO)  # fmt: skip
                transport = websocket_transport(daemon.websocket_url + "/s")
                async with Client(transport, mode=mode, **callbacks) as session:  # type: ignore[arg-type]
                    await asks_every_kind(session, mode, user, kind)


async def test_every_client_mode_gets_its_questions_through_two_brokers(socket_path: str) -> None:
    """A broker whose server is another broker (its ``--http``, which it
    opens in the 2026-07-28 era) with a legacy server behind it: the inner
    one's input_required, and its requestState, pass through the outer one
    to a modern client, whose retry takes the state back as it is (the
    outer broker took a token of the same shape for its own, and refused
    it), and the outer one asks a legacy client."""
    config = Path(socket_path).parent / "inner.json"
    config.write_text(json.dumps({"mcpServers": {"s": era_server("legacy")}}))
    port = free_port()
    inner = ["cli.main", "serve", "--config", str(config), "--socket", socket_path + ".inner",
             "--http", f"127.0.0.1:{port}"]  # fmt: skip
    with trio.fail_after(90):
        # (a process of its own, as a broker behind another is: tokens of its own)
        async with listening_process(inner, port, dict(os.environ)):
            url = f"http://127.0.0.1:{port}/mcp/s"
            async with running_daemon({"s": {"url": url}}, socket_path) as outer:
                assert outer.upstreams["s"].identity.protocol_version == MODERN
                for mode in ("legacy", "auto"):
                    user = User()
                    async with client(socket_path, mode, user) as session:
                        await asks_every_kind(session, mode, user, "legacy")


@pytest.mark.parametrize(("kind", "era"), [("modern", None), ("dual", None)])
async def test_a_legacy_client_hears_a_modern_servers_changes(
    socket_path: str, kind: str, era: str | None
) -> None:
    """The broker's listen at the server: a tool added comes as
    notifications/tools/list_changed, a subscribed resource's change as
    notifications/resources/updated (and an unsubscribed one's not at all)."""
    user = User()
    with trio.fail_after(60):
        async with (
            running_daemon({"s": era_server(kind, era)}, socket_path),
            client(socket_path, "legacy", user) as session,
        ):
            await session.subscribe_resource("test://era/doc")
            assert text_of(await session.call_tool("touch", {"uri": "test://era/other"}))
            assert text_of(await session.call_tool("touch", {"uri": "test://era/doc"}))
            updated = await user.wait_for(types.ResourceUpdatedNotification)
            assert str(updated.params.uri) == "test://era/doc"
            assert text_of(await session.call_tool("grow", {"name": "late"})) == "added late"
            await user.wait_for(types.ToolListChangedNotification)
            assert "late" in [tool.name for tool in (await session.list_tools()).tools]
            uris = [str(m.params.uri) for m in user.heard
                    if isinstance(m, types.ResourceUpdatedNotification)]  # fmt: skip
            assert uris == ["test://era/doc"]
            # Unsubscribed: the listen is opened again without it.
            await session.unsubscribe_resource("test://era/doc")
            assert text_of(await session.call_tool("touch", {"uri": "test://era/doc"}))
            assert text_of(await session.call_tool("echo", {"text": "x"})) == "x"
            await trio.sleep(0.2)
            uris = [str(m.params.uri) for m in user.heard
                    if isinstance(m, types.ResourceUpdatedNotification)]  # fmt: skip
            assert uris == ["test://era/doc"]


async def test_a_restarted_modern_server_is_listened_to_again(socket_path: str) -> None:
    """The server is killed: the new process gets a listen with the URIs
    subscribed to before, and the legacy client hears its changes again."""
    user = User()
    with trio.fail_after(60):
        async with (
            running_daemon({"s": era_server("modern")}, socket_path) as daemon,
            client(socket_path, "legacy", user) as session,
        ):
            await session.subscribe_resource("test://era/doc")
            upstream = daemon.upstreams["s"]
            pid = upstream.statistics().pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            while upstream.statistics().pid in (pid, None) or upstream.identity is None:
                await trio.sleep(0.05)
            await upstream.wait_ready()
            assert upstream.identity.protocol_version == MODERN
            assert text_of(await session.call_tool("touch", {"uri": "test://era/doc"}))
            updated = await user.wait_for(types.ResourceUpdatedNotification)
            assert str(updated.params.uri) == "test://era/doc"


async def test_a_modern_client_listens_to_a_modern_server_through_the_broker(
    socket_path: str,
) -> None:
    """The session's stream wants the URI; the broker's one listen at the
    server takes it in its filter."""
    with trio.fail_after(60):
        async with (
            running_daemon({"s": era_server("modern")}, socket_path),
            client(socket_path, "auto", User()) as session,
            session.listen(
                tools_list_changed=True, resource_subscriptions=["test://era/doc"]
            ) as stream,
        ):
            assert stream.honored.resource_subscriptions == ["test://era/doc"]
            assert text_of(await session.call_tool("touch", {"uri": "test://era/doc"}))
            event = await stream.__anext__()
            assert (type(event).__name__, event.uri) == ("ResourceUpdated", "test://era/doc")
            assert text_of(await session.call_tool("grow", {"name": "later"})) == "added later"
            event = await stream.__anext__()
            assert type(event).__name__ == "ToolsListChanged"


async def test_a_legacy_clients_log_level_goes_on_its_requests_to_a_modern_server(
    socket_path: str,
) -> None:
    """A modern server logs only for a request that asks (``_meta`` logLevel):
    the level a legacy client set with logging/setLevel is stamped on its calls."""
    quiet, chatty = User(), User()
    with trio.fail_after(60):
        async with (
            running_daemon({"s": era_server("modern")}, socket_path),
            client(socket_path, "legacy", quiet) as first,
            client(socket_path, "legacy", chatty) as second,
        ):
            await second.set_logging_level("info")
            assert text_of(await first.call_tool("log", {})) == "logged"
            assert text_of(await second.call_tool("log", {})) == "logged"
            await trio.sleep(0.2)  # (notifications come before the answer; a margin)
            logged = [m.params.data for m in chatty.heard
                      if isinstance(m, types.LoggingMessageNotification)]  # fmt: skip
            assert logged == ["at info", "at warning"]
            assert not [m for m in quiet.heard if isinstance(m, types.LoggingMessageNotification)]


async def test_two_legacy_clients_are_each_asked_their_own_question(socket_path: str) -> None:
    alice, bob = User("red", "Rome"), User("green", "Oslo")
    with trio.fail_after(60):
        async with (
            running_daemon({"s": era_server("modern")}, socket_path),
            client(socket_path, "legacy", alice) as first,
            client(socket_path, "legacy", bob) as second,
        ):
            results: dict[str, str] = {}

            async def ask(name: str, session: Client, question: str, prompt: str) -> None:
                answer = await session.call_tool("ask_user", {"question": question})
                sampled = await session.call_tool("ask_llm", {"prompt": prompt})
                results[name] = f"{text_of(answer)} / {text_of(sampled)}"

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask, "alice", first, "Alice's colour?", "Alice's city?")
                nursery.start_soon(ask, "bob", second, "Bob's colour?", "Bob's city?")
            assert results == {"alice": "accept: red / Rome", "bob": "accept: green / Oslo"}
            assert alice.asked == ["Alice's colour?", "Alice's city?"]
            assert bob.asked == ["Bob's colour?", "Bob's city?"]


async def test_a_pools_modern_clients_retries_reach_the_instance_that_asked(
    socket_path: str,
) -> None:
    """The SDK's server reads only the requestStates its own process made:
    with ``pool``, each retry goes to the instance whose input_required it
    answers (before, one in two went to the other and was refused -32602)."""
    alice, bob = User("red"), User("green")
    with trio.fail_after(60):
        async with (
            running_daemon({"s": {**era_server("modern"), "pool": 2}}, socket_path) as daemon,
            client(socket_path, "auto", alice) as first,
            client(socket_path, "auto", bob) as second,
        ):
            await daemon.upstreams["s"].wait_ready()  # type: ignore[attr-defined]
            results: dict[str, str] = {}

            async def ask(name: str, session: Client) -> None:
                results[name] = text_of(await session.call_tool("ask_user", {"question": "?"}))

            for _ in range(4):  # (without the rule, a round could go to the wrong one)
                async with trio.open_nursery() as nursery:  # (at once: one on each instance)
                    nursery.start_soon(ask, "alice", first)
                    nursery.start_soon(ask, "bob", second)
                assert results == {"alice": "accept: red", "bob": "accept: green"}


async def test_a_legacy_client_is_never_asked_what_it_did_not_declare(socket_path: str) -> None:
    """The call is answered -32021 naming the capability; the client is not asked."""
    user = User()
    with trio.fail_after(60):
        async with (
            running_daemon({"s": era_server("modern")}, socket_path),
            client(socket_path, "legacy", user, asks=False) as session,
        ):
            with pytest.raises(MCPError, match="elicitation") as caught:
                await session.call_tool("ask_user", {"question": "?"})
            assert caught.value.error.code == -32021
            assert user.asked == []
            assert text_of(await session.call_tool("echo", {"text": "on"})) == "on"
