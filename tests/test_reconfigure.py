"""Settings that apply without a restart (broker/configdiff.py, LIVE), handed
to what runs: servers, sessions, the Registry, the WebSocket listener.

Actor tests over scripted servers on ``autojump_clock``; one daemon test for
the listener's token.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.testing
import trio_websocket

from broker import jsonrpc
from broker.config import BrokerSettings, ServerConfig, parse_config
from tests.conftest import running_daemon, sdk_server
from tests.scripted import ScriptedServer
from tests.test_actors import SETTINGS, call, open_client, start_broker

SLOW = attrs.evolve(SETTINGS, request_timeout=600.0)


async def test_a_shorter_timeout_holds_for_the_next_request(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery)
    broker = await start_broker(nursery, {"s": script}, settings=SLOW)
    client = await open_client(nursery, broker)
    await client.initialize()
    # The timeout task is asleep for the old 600 s; the new 5 s must wake it.
    broker.upstreams["s"].reconfigure(
        ServerConfig(command="scripted"), attrs.evolve(SLOW, request_timeout=5.0)
    )
    started = trio.current_time()
    response = await client.request("tools/call", call("sleep", seconds=60))
    assert response["error"]["code"] == jsonrpc.REQUEST_TIMEOUT
    assert trio.current_time() - started == pytest.approx(5)
    # A server's own timeout wins over the broker's, live as well.
    broker.upstreams["s"].reconfigure(ServerConfig(command="scripted", timeout=2.0), SLOW)
    started = trio.current_time()
    response = await client.request("tools/call", call("sleep", seconds=60))
    assert trio.current_time() - started == pytest.approx(2)


async def test_lower_limits_hold_for_what_comes_next(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    script = ScriptedServer(nursery)
    broker = await start_broker(nursery, {"s": script})
    client = await open_client(nursery, broker)
    await client.initialize()

    async def two_calls() -> dict[str, Any]:
        for id in ("a", "b"):
            params = call("sleep", seconds=5)
            await client.send(
                {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}
            )
        answers = {}
        while len(answers) < 2:
            answer = await client.receive()
            answers[answer["id"]] = answer
        return answers

    broker.upstreams["s"].reconfigure(
        ServerConfig(command="scripted"), attrs.evolve(SETTINGS, max_server_in_flight=1)
    )
    answers = await two_calls()
    assert "result" in answers["a"]
    assert answers["b"]["error"]["code"] == jsonrpc.LIMIT_REACHED
    assert "broker.maxServerInFlight" in answers["b"]["error"]["message"]

    broker.upstreams["s"].reconfigure(ServerConfig(command="scripted"), SETTINGS)
    client.session.reconfigure(attrs.evolve(SETTINGS, max_in_flight=1))
    answers = await two_calls()
    assert "result" in answers["a"]
    assert answers["b"]["error"]["code"] == jsonrpc.LIMIT_REACHED
    assert "broker.maxInFlight" in answers["b"]["error"]["message"]


async def test_a_new_separator_renames_the_tools_and_says_so(nursery: trio.Nursery) -> None:
    script = ScriptedServer(nursery)
    broker = await start_broker(nursery, {"s": script})
    client = await open_client(nursery, broker, servers=())
    await client.send({"mcpbroker": {}})
    await client.initialize()
    before = await client.request("tools/list")
    assert "s__echo" in {tool["name"] for tool in before["result"]["tools"]}
    broker.registry.reconfigure(attrs.evolve(SETTINGS, separator="."))
    after = await client.request("tools/list")
    assert "s.echo" in {tool["name"] for tool in after["result"]["tools"]}
    with trio.fail_after(5):
        while not any(m.get("method") == "notifications/tools/list_changed" for m in client.others):
            client.others.append(await client.receive())
    answer = await client.request("tools/call", {"name": "s.echo", "arguments": {"x": 1}})
    assert "result" in answer


async def test_a_new_separator_is_said_once_to_each_session_whose_names_carry_it(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    # (one tools/ and one prompts/list_changed per server reached every session,
    # and a transparent one too, whose names carry no separator)
    scripts = {name: ScriptedServer(nursery) for name in ("a", "b", "c")}
    broker = await start_broker(nursery, scripts)
    every = await open_client(nursery, broker, servers=())
    await every.send({"mcpbroker": {}})
    await every.initialize()
    alone = await open_client(nursery, broker, servers=("a",))
    await alone.initialize()
    for client in (every, alone):
        await client.request("tools/list")
        client.others.clear()
    broker.registry.reconfigure(attrs.evolve(SETTINGS, separator="."))
    for client in (every, alone):
        with trio.move_on_after(5):
            while True:
                client.others.append(await client.receive())
    told = [m.get("method") for m in every.others]
    assert sorted(told) == [
        "notifications/prompts/list_changed",
        "notifications/tools/list_changed",
    ]
    assert alone.others == []


async def test_the_daemon_applies_what_is_live_and_reports_the_rest(
    socket_path: str, tmp_path: Any
) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    broker = {"websocket": "127.0.0.1:0", "tokenFile": str(token)}
    servers = {"sdk": sdk_server()}
    with trio.fail_after(60):
        async with running_daemon(servers, socket_path, broker=broker) as daemon:
            url = daemon.websocket_url
            assert url is not None
            token.write_text("two\n")
            new = parse_config(
                {
                    "mcpServers": {**servers, "new": sdk_server("n")},
                    "broker": {**broker, "requestTimeout": 30},
                }
            )
            change = daemon.reconfigure(new)
            assert list(change.added) == ["new"]  # left to the reload (#14)
            assert daemon.config.broker.request_timeout == 30
            assert "new" not in daemon.config.servers
            async with trio_websocket.open_websocket_url(
                url, extra_headers=[(b"Authorization", b"Bearer two")]
            ):
                pass
            with pytest.raises(trio_websocket.HandshakeError):
                async with trio_websocket.open_websocket_url(
                    url, extra_headers=[(b"Authorization", b"Bearer one")]
                ):
                    pass
            # An unchanged config changes nothing.
            assert daemon.reconfigure(daemon.config).empty


async def test_a_refused_reload_leaves_every_listener_as_it_was(
    socket_path: str, tmp_path: Any
) -> None:
    # (the WebSocket listener's policy was replaced, without a token, before the
    # metrics one refused the file: it then admitted anyone until a restart)
    from actors.downstream.unix import StartError

    token = tmp_path / "token"
    token.write_text("one\n")
    broker = {"websocket": "127.0.0.1:0", "metrics": "0.0.0.0:0", "tokenFile": str(token)}
    servers = {"sdk": sdk_server()}
    with trio.fail_after(60):
        async with running_daemon(servers, socket_path, broker=broker) as daemon:
            url = daemon.websocket_url
            assert url is not None
            without = {key: value for key, value in broker.items() if key != "tokenFile"}
            with pytest.raises(StartError, match="metrics listener on 0"):
                daemon.reload(parse_config({"mcpServers": servers, "broker": without}))
            with pytest.raises(trio_websocket.HandshakeError):
                async with trio_websocket.open_websocket_url(url):
                    pass
            assert daemon.config.broker.token_file == str(token)


def test_settings_are_values() -> None:
    assert BrokerSettings() == BrokerSettings()
    assert attrs.evolve(BrokerSettings(), separator=".") != BrokerSettings()
