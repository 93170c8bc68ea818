"""End to end: 2026-07-28 clients on ``serve --http``, beside legacy ones.

The official SDK client with ``Client(URL, mode="auto")`` (its Streamable HTTP
client: it probes ``server/discover`` with the modern headers and must stay
modern) reaches the daemon's HTTP listener at ``/mcp`` and ``/mcp/NAME``; the
server behind is the SDK test server, a legacy server to the broker. Raw
``httpx2`` requests show the statuses and errors of the transport's rules.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import orjson
import trio
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import running_daemon, sdk_server, shim_client, text_of
from tests.test_http_e2e import events, http_session

MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
}


async def elicit(context: Any, params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"answer": "blue"})


async def sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
    return types.CreateMessageResult(
        role="assistant", model="m", content=types.TextContent(type="text", text="Paris")
    )


@asynccontextmanager
async def modern_client(url: str, **kwargs: Any) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http,
        Client(streamable_http_client(url, http_client=http), mode="auto", **kwargs) as client,
    ):
        yield client


@asynccontextmanager
async def http_daemon(socket_path: str, **servers: Any) -> AsyncIterator[Any]:
    async with running_daemon(
        servers or {"s": sdk_server()}, socket_path, broker={"http": "127.0.0.1:0"}
    ) as daemon:
        assert daemon.http_url is not None
        yield daemon


def post_headers(method: str, name: str | None = None, **extra: str) -> dict[str, str]:
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": MODERN,
        "mcp-method": method,
    }
    if name is not None:
        headers["mcp-name"] = name
    return {**headers, **extra}


def request(method: str, id: int = 1, meta: Any = META, **params: Any) -> dict[str, Any]:
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


async def test_a_modern_sdk_client_over_http_calls_through_both_urls(socket_path: str) -> None:
    with trio.fail_after(60):
        async with http_daemon(socket_path) as d:
            async with modern_client(d.http_url) as client:
                assert client.protocol_version == MODERN
                assert client.server_info is not None and client.server_info.name == "mcpbroker"
                tools = await client.list_tools()
                assert "s__echo" in [tool.name for tool in tools.tools]
                assert text_of(await client.call_tool("s__echo", {"text": "hi"})) == "hi"
                assert (await client.get_prompt("s__review", {"code": "x = 1"})).messages
                assert (await client.read_resource("test://sdk-test-server/hello")).contents
            async with modern_client(d.http_url + "/s") as client:
                assert client.protocol_version == MODERN
                assert client.server_info is not None
                assert client.server_info.name == "sdk-test-server"  # the server as it is
                assert text_of(await client.call_tool("echo", {"text": "one"})) == "one"
            # Each request was its own session, and none is left behind.
            await wait_no_sessions(d)


async def wait_no_sessions(daemon: Any) -> None:
    while daemon.statistics().sessions:
        await trio.sleep(0.02)


async def test_elicitation_and_sampling_complete_across_posts(socket_path: str) -> None:
    """The legacy server asks mid-call; the broker answers the POST
    input_required; the SDK client's retry (a new POST with the broker's
    requestState) finds the waiting call and completes it."""
    with trio.fail_after(60):
        async with (
            http_daemon(socket_path) as d,
            modern_client(
                d.http_url + "/s", elicitation_callback=elicit, sampling_callback=sample
            ) as client,
        ):
            assert client.protocol_version == MODERN
            result = await client.call_tool("ask_user", {"question": "Favourite colour?"})
            assert text_of(result) == "accept: blue"
            result = await client.call_tool("ask_llm", {"prompt": "Capital of France?"})
            assert text_of(result) == "Paris"
            # Twice at once, from the aggregated URL: each retry finds its own call.
            async with modern_client(
                d.http_url, elicitation_callback=elicit, sampling_callback=sample
            ) as other:
                answers: list[str] = []

                async def ask(tool: str, arguments: dict[str, str]) -> None:
                    answers.append(text_of(await other.call_tool(tool, arguments)))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(ask, "s__ask_user", {"question": "?"})
                    nursery.start_soon(ask, "s__ask_llm", {"prompt": "?"})
                assert sorted(answers) == ["Paris", "accept: blue"]
        # The parked calls were taken over by their retries: no session is left.
        await wait_no_sessions(d)


async def test_modern_and_legacy_http_clients_share_the_daemon(socket_path: str) -> None:
    with trio.fail_after(60):
        async with (
            http_daemon(socket_path) as d,
            modern_client(d.http_url) as modern,
            http_session(d.http_url) as legacy,
        ):
            assert modern.protocol_version == MODERN
            assert legacy.initialize_result is not None
            assert legacy.initialize_result.protocol_version != MODERN
            pids = set()
            for _ in range(3):
                pids.add(text_of(await modern.call_tool("s__pid", {})))
                pids.add(text_of(await legacy.call_tool("s__pid", {})))
            assert len(pids) == 1


async def test_closing_the_stream_cancels_the_call_upstream(
    socket_path: str, tmp_path: Path
) -> None:
    marker = tmp_path / "cancelled"
    with trio.fail_after(60):
        async with http_daemon(socket_path) as d:
            body = request(
                "tools/call", name="s__wait_for_cancel", arguments={"marker": str(marker)}
            )
            headers = post_headers("tools/call", "s__wait_for_cancel")
            async with httpx2.AsyncClient(timeout=30) as http:
                with trio.move_on_after(1):
                    await http.post(d.http_url, content=orjson.dumps(body), headers=headers)
            # The broker sent the server notifications/cancelled: its tool saw it.
            while not marker.exists():
                await trio.sleep(0.05)
            assert marker.read_text() == "cancelled"
            await wait_no_sessions(d)


async def test_a_listen_stream_carries_its_subscription_id(socket_path: str) -> None:
    with trio.fail_after(60):
        async with http_daemon(socket_path) as d, httpx2.AsyncClient(timeout=30) as http:
            listen = request("subscriptions/listen", id=7, notifications={"toolsListChanged": True})
            async with http.stream(
                "POST",
                d.http_url,
                content=orjson.dumps(listen),
                headers=post_headers("subscriptions/listen"),
            ) as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"] == "text/event-stream"
                lines = stream.aiter_lines()
                first = await next_message(lines)
                assert first["method"] == "notifications/subscriptions/acknowledged"
                subscription = first["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"]
                call = request("tools/call", id=8, name="s__grow", arguments={"name": "late"})
                grown = await http.post(
                    d.http_url,
                    content=orjson.dumps(call),
                    headers=post_headers("tools/call", "s__grow"),
                )
                assert grown.status_code == 200
                assert grown.json()["result"]["resultType"] == "complete"
                changed = await next_message(lines)
                assert changed["method"] == "notifications/tools/list_changed"
                meta = changed["params"]["_meta"]
                assert meta["io.modelcontextprotocol/subscriptionId"] == subscription
            await wait_no_sessions(d)


async def next_message(lines: Any) -> dict[str, Any]:
    async for line in lines:
        if line.startswith("data:"):
            message: dict[str, Any] = orjson.loads(line[5:])
            return message
    raise AssertionError("the stream ended")


VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
# (the body, headers changed from those it should have (None: left out), status, code)
REFUSALS: list[tuple[dict[str, Any], dict[str, str | None], int, int]] = [
    # a missing or different header: HeaderMismatch
    (request("tools/list"), {"mcp-method": "tools/call"}, 400, -32020),
    (request("tools/list"), {"mcp-method": None}, 400, -32020),
    (request("tools/call", name="s__echo"), {"mcp-name": None}, 400, -32020),
    (request("tools/call", name="s__echo"), {"mcp-name": "s__pid"}, 400, -32020),
    (request("tools/call", name="s__echo"), {"mcp-name": "=?base64?!!?="}, 400, -32020),
    (request("tools/list", meta={**META, VERSION_KEY: "2099-01-01"}), {}, 400, -32020),
    # no MCP-Protocol-Version, or a legacy one, on a modern body: taken for a
    # legacy request, whose _meta then contradicts it (not "initialize first")
    (request("tools/list"), {"mcp-protocol-version": None}, 400, -32020),
    (request("tools/call", name="s__echo"), {"mcp-protocol-version": "2025-11-25"}, 400, -32020),
    # _meta missing, or without the capabilities: invalid params
    (request("tools/list", meta=None), {}, 400, -32602),
    (request("tools/list", meta={VERSION_KEY: MODERN}), {}, 400, -32602),
    # a version the broker does not serve, in header and body alike
    (
        request("tools/list", meta={**META, VERSION_KEY: "2099-01-01"}),
        {"mcp-protocol-version": "2099-01-01"},
        400,
        -32022,
    ),
    # gone in 2026-07-28, or never a method
    (request("ping"), {}, 404, -32601),
    (request("no/such"), {}, 404, -32601),
]


async def test_the_rules_refuse_with_the_spec_status_and_code(socket_path: str) -> None:
    with trio.fail_after(60):
        async with http_daemon(socket_path) as d, httpx2.AsyncClient(timeout=30) as http:
            for body, changes, status, code in REFUSALS:
                headers: dict[str, str] = post_headers(body["method"], body["params"].get("name"))
                for key, value in changes.items():
                    if value is None:
                        headers.pop(key)
                    else:
                        headers[key] = value
                answer = await http.post(d.http_url, content=orjson.dumps(body), headers=headers)
                assert answer.status_code == status, (body, changes, answer.text)
                error = answer.json()
                assert error["id"] == 1 and error["error"]["code"] == code, error
                if code == -32022:
                    assert MODERN in error["error"]["data"]["supported"]
                assert "mcp-session-id" not in answer.headers
            assert not d.statistics().sessions  # refused requests opened nothing
            # A good request goes through, by a base64 Mcp-Name too (of "s__echo").
            good = request("tools/call", id=2, name="s__echo", arguments={"text": "ok"})
            fine = await http.post(
                d.http_url,
                content=orjson.dumps(good),
                headers=post_headers("tools/call", "=?base64?c19fZWNobw==?="),
            )
            assert fine.status_code == 200, fine.text
            assert fine.json()["result"]["resultType"] == "complete"


async def test_no_get_no_delete_no_session_and_notifications_accepted(socket_path: str) -> None:
    with trio.fail_after(60):
        async with http_daemon(socket_path) as d, httpx2.AsyncClient(timeout=30) as http:
            headers = post_headers("tools/list")
            for verb in ("GET", "DELETE"):
                refused = await http.request(verb, d.http_url, headers=headers)
                assert refused.status_code == 405 and refused.headers["allow"] == "POST"
            listen = orjson.dumps(request("subscriptions/listen", notifications={}))
            json_only = post_headers("subscriptions/listen", accept="application/json")
            refused = await http.post(d.http_url, content=listen, headers=json_only)
            assert refused.status_code == 406  # (its answer is a stream)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}
            accepted = await http.post(d.http_url, content=orjson.dumps(cancel), headers=headers)
            assert accepted.status_code == 202 and accepted.content == b""
            batch = orjson.dumps([request("tools/list")])
            assert (await http.post(d.http_url, content=batch, headers=headers)).status_code == 400
            listed = await http.post(
                d.http_url,
                content=orjson.dumps(request("tools/list")),
                headers={**headers, "mcp-session-id": "ignored"},
            )
            assert listed.status_code == 200 and "mcp-session-id" not in listed.headers
            result = listed.json()["result"]
            assert result["resultType"] == "complete"
            assert result["ttlMs"] == 0 and result["cacheScope"] == "private"


async def test_a_retry_with_a_token_nobody_holds_is_refused(socket_path: str) -> None:
    with trio.fail_after(60):
        async with http_daemon(socket_path) as d, httpx2.AsyncClient(timeout=30) as http:
            retry = request(
                "tools/call",
                name="s__ask_user",
                arguments={"question": "?"},
                requestState="mcpbroker.forged",
                inputResponses={},
            )
            answer = await http.post(
                d.http_url,
                content=orjson.dumps(retry),
                headers=post_headers("tools/call", "s__ask_user"),
            )
            assert answer.status_code == 400
            assert answer.json()["error"]["code"] == -32602


async def test_a_refused_retry_leaves_the_call_parked_as_on_a_socket(socket_path: str) -> None:
    """A retry refused before it takes the call over (its token on another
    method) spends nothing: the right retry then completes the call. The
    parked call went with the refused POST (cancelled at the server, and
    the right retry told its token was unknown), where a socket kept it."""
    asks = {**META, "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
    json_only = {"accept": "application/json"}
    with trio.fail_after(60):
        async with http_daemon(socket_path) as d, httpx2.AsyncClient(timeout=30) as http:
            call = request("tools/call", 1, asks, name="s__ask_user",
                           arguments={"question": "Colour?"})  # fmt: skip
            first = await http.post(d.http_url, content=orjson.dumps(call),
                                    headers=post_headers("tools/call", "s__ask_user",
                                                         **json_only))  # fmt: skip
            result = first.json()["result"]
            assert result["resultType"] == "input_required"
            (key,) = result["inputRequests"]
            state = result["requestState"]
            answer = {key: {"action": "accept", "content": {"answer": "blue"}}}
            wrong = request("prompts/get", 2, asks, name="s__greet", inputResponses=answer,
                            requestState=state)  # fmt: skip
            refused = await http.post(d.http_url, content=orjson.dumps(wrong),
                                      headers=post_headers("prompts/get", "s__greet",
                                                           **json_only))  # fmt: skip
            assert refused.json()["error"]["code"] == -32602
            assert "belongs to a tools/call request" in refused.json()["error"]["message"]
            retry = {**call, "id": 3}
            retry["params"] = {**call["params"], "inputResponses": answer, "requestState": state}
            # The first request's id again (in use: the call is still in flight
            # upstream under it): the POST ends with the id-null refusal, where
            # it waited for an answer in an id nothing would answer.
            same = await http.post(d.http_url, content=orjson.dumps({**retry, "id": 1}),
                                   headers=post_headers("tools/call", "s__ask_user",
                                                        **json_only))  # fmt: skip
            assert same.json()["id"] is None and same.json()["error"]["code"] == -32600
            assert same.json()["error"]["data"] == {"id": 1}
            done = await http.post(d.http_url, content=orjson.dumps(retry),
                                   headers=post_headers("tools/call", "s__ask_user",
                                                        **json_only))  # fmt: skip
            assert done.json()["result"]["content"][0]["text"] == "accept: blue"


async def test_progress_comes_on_an_sse_stream_before_the_answer(socket_path: str) -> None:
    with trio.fail_after(60):
        async with http_daemon(socket_path) as d, httpx2.AsyncClient(timeout=30) as http:
            meta = {**META, "progressToken": "p"}
            body = request("tools/call", meta=meta, name="s__slow", arguments={"seconds": 0.3})
            answer = await http.post(
                d.http_url,
                content=orjson.dumps(body),
                headers=post_headers("tools/call", "s__slow"),
            )
            assert answer.status_code == 200
            assert answer.headers["content-type"] == "text/event-stream"
            messages = [orjson.loads(event["data"]) for event in events(answer.text)]
            assert messages[0]["method"] == "notifications/progress"
            assert messages[0]["params"]["progressToken"] == "p"
            assert messages[-1]["id"] == 1 and text_of_result(messages[-1]) == "slept 0.3"


def text_of_result(message: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in message["result"]["content"])


def header_server() -> dict[str, Any]:
    return {**sdk_server(), "args": ["-m", "tests.servers.header_server"]}


async def test_mcp_param_headers_are_checked_against_the_arguments(socket_path: str) -> None:
    """The tool marks ``region`` with x-mcp-header: the SDK client mirrors it
    (and passes); a raw client that leaves it out, or sends another value,
    gets HeaderMismatch."""
    with trio.fail_after(60):
        async with http_daemon(socket_path, h=header_server()) as d:
            async with modern_client(d.http_url) as client:
                result = await client.call_tool("h__where", {"region": "eu", "query": "q"})
                assert text_of(result) == "q in eu"
            async with httpx2.AsyncClient(timeout=30) as http:
                body = orjson.dumps(
                    request("tools/call", name="h__where", arguments={"region": "eu", "query": "q"})
                )
                for extra in ({}, {"mcp-param-region": "us"}):
                    headers = post_headers("tools/call", "h__where", **extra)
                    answer = await http.post(d.http_url, content=body, headers=headers)
                    assert answer.status_code == 400, answer.text
                    assert answer.json()["error"]["code"] == -32020
                # At /mcp/h the server is as it is: its tool is "where".
                arguments = {"region": "eu", "query": "q"}
                body = orjson.dumps(request("tools/call", name="where", arguments=arguments))
                for region, status in (("eu", 200), ("us", 400)):
                    headers = post_headers("tools/call", "where", **{"mcp-param-region": region})
                    answer = await http.post(d.http_url + "/h", content=body, headers=headers)
                    assert answer.status_code == status, answer.text


async def test_a_per_client_server_serves_modern_posts_from_its_modern_instance(
    socket_path: str,
) -> None:
    """``"era": "per-client"`` by ``serve --http``: each modern POST's session
    attaches as a modern client, so its calls reach the instance that speaks
    2026-07-28, never the legacy one the shim's legacy client uses."""
    servers = {"s": {**sdk_server(), "era": "per-client"}}
    with trio.fail_after(60):
        async with (
            http_daemon(socket_path, **servers) as d,
            shim_client(socket_path, "s") as legacy,
        ):
            legacy_pid = text_of(await legacy.call_tool("pid", {}))
            async with modern_client(d.http_url + "/s") as client:
                # (each call its own POST, its own session: one modern instance)
                pids = {text_of(await client.call_tool("pid", {})) for _ in range(3)}
                assert len(pids) == 1 and legacy_pid not in pids
            versions = {i.identity.protocol_version for i in d.upstreams["s"].instances()}
            assert MODERN in versions and len(versions) == 2
