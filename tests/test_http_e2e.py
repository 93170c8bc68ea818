"""Streamable HTTP clients (``serve --http``), with real sockets, a real server
process and the shim's clients at the same time.

The clients are the official SDK's (``streamable_http_client``) where it
speaks for itself, and raw ``httpx2`` requests where a test needs to see the
statuses and headers.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx2
import orjson
import trio
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from cli.status import render
from tests.conftest import running_daemon, sdk_server, shim_client, text_of
from tests.test_server_requests_e2e import elicitor, sampler

LATEST = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


@asynccontextmanager
async def http_session(
    url: str, headers: dict[str, str] | None = None, **kwargs: Any
) -> AsyncIterator[ClientSession]:
    """An official SDK client over Streamable HTTP, initialized."""
    async with (
        httpx2.AsyncClient(headers=headers or {}, timeout=httpx2.Timeout(30, read=60)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, **kwargs) as session,
    ):
        await session.initialize()
        yield session


async def test_http_and_shim_clients_share_one_server(socket_path: str) -> None:
    servers = {"sdk": sdk_server()}
    with trio.fail_after(60):
        async with running_daemon(servers, socket_path, broker={"http": "127.0.0.1:0"}) as d:
            url = d.http_url
            assert url is not None and url.startswith("http://127.0.0.1:")
            pids: set[str] = set()
            transports: list[set[str]] = []

            async def over_http(path: str, prefix: str) -> None:
                async with http_session(url + path) as session:
                    tools = await session.list_tools()
                    assert f"{prefix}echo" in {tool.name for tool in tools.tools}
                    if path:  # one server, as it is: its own identity
                        result = session.initialize_result
                        assert result is not None
                        assert result.server_info.name == "sdk-test-server"
                    for n in range(5):
                        answer = await session.call_tool(f"{prefix}echo", {"text": f"h{n}"})
                        assert text_of(answer) == f"h{n}"
                    pids.add(text_of(await session.call_tool(f"{prefix}pid", {})))
                    status = d.statistics()
                    transports.append({s.transport for s in status.sessions})

            async def over_the_shim() -> None:
                async with shim_client(socket_path, "sdk") as session:
                    for n in range(5):
                        assert (
                            text_of(await session.call_tool("echo", {"text": f"s{n}"})) == f"s{n}"
                        )
                    pids.add(text_of(await session.call_tool("pid", {})))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(over_http, "", "sdk__")
                nursery.start_soon(over_http, "/sdk", "")
                nursery.start_soon(over_the_shim)
            assert len(pids) == 1  # one process served the three clients
            assert any("http" in seen for seen in transports)
            assert d.statistics().http == url
            assert f"HTTP: {url}" in render(attrs.asdict(d.statistics()))
            assert d.upstreams["sdk"].statistics().restarts == 0


async def test_progress_and_server_requests_reach_the_client_that_caused_them(
    socket_path: str,
) -> None:
    """Two HTTP clients at once on one server: A can sample, B can elicit;
    each one's progress and each server request reach that one only."""
    servers = {"s": {**sdk_server(), "serverRequests": "exclusive"}}
    results: dict[str, list[str]] = {"a": [], "b": []}
    progress: dict[str, list[float]] = {"a": [], "b": []}
    with trio.fail_after(60):
        async with running_daemon(servers, socket_path, broker={"http": "127.0.0.1:0"}) as d:
            url = d.http_url
            assert url is not None
            async with (
                http_session(url + "/s", sampling_callback=sampler("a")) as a,
                http_session(url + "/s", elicitation_callback=elicitor("b")) as b,
            ):

                async def ask_a(i: int) -> None:
                    answer = await a.call_tool("ask_llm", {"prompt": f"q{i}"})
                    results["a"].append(text_of(answer))

                async def ask_b(i: int) -> None:
                    results["b"].append(text_of(await b.call_tool("ask_user", {"question": "?"})))

                async def slow(client: ClientSession, name: str) -> None:
                    async def note(done: float, total: float | None, message: str | None) -> None:
                        progress[name].append(done)

                    answer = await client.call_tool(
                        "slow", {"seconds": 0.3}, progress_callback=note
                    )
                    assert text_of(answer) == "slept 0.3"

                async with trio.open_nursery() as nursery:
                    for i in range(4):
                        nursery.start_soon(ask_a, i)
                        nursery.start_soon(ask_b, i)
                    nursery.start_soon(slow, a, "a")
                    nursery.start_soon(slow, b, "b")
    assert sorted(results["a"]) == [f"a answers q{i}" for i in range(4)]
    assert results["b"] == ["accept: b"] * 4
    assert progress["a"] == [1, 2, 3] and progress["b"] == [1, 2, 3]


class Raw:
    """Raw HTTP for one MCP session: the statuses and headers as they come."""

    def __init__(self, http: httpx2.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url
        self.session_id: str | None = None
        self._ids = 0

    def headers(self, **extra: str) -> dict[str, str]:
        headers = {"accept": ACCEPT, "content-type": "application/json"}
        if self.session_id:
            headers["mcp-session-id"] = self.session_id
            headers["mcp-protocol-version"] = LATEST
        return {**headers, **extra}

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._ids += 1
        return {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params or {}}

    async def post(self, message: Any, **headers: str) -> httpx2.Response:
        body = message if isinstance(message, bytes) else orjson.dumps(message)
        return await self.http.post(self.url, content=body, headers=self.headers(**headers))

    async def initialize(self, version: str = LATEST, **capabilities: Any) -> httpx2.Response:
        params = {
            "protocolVersion": version,
            "capabilities": capabilities,
            "clientInfo": {"name": "raw", "version": "1"},
        }
        answer = await self.post(self.request("initialize", params), accept="application/json")
        assert answer.status_code == 200, answer.text
        self.session_id = answer.headers["mcp-session-id"]
        notified = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert notified.status_code == 202 and notified.content == b""
        return answer

    async def call(self, tool: str, **arguments: Any) -> Any:
        answer = await self.post(
            self.request("tools/call", {"name": tool, "arguments": arguments}),
            accept="application/json",
        )
        assert answer.status_code == 200, answer.text
        return answer.json()


def events(text: str) -> list[dict[str, str]]:
    """The events of an SSE body, each as its fields (data lines joined)."""
    found = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            fields[name] = fields[name] + "\n" + value if name in fields else value
        if fields:
            found.append(fields)
    return found


@asynccontextmanager
async def raw_daemon(socket_path: str, **broker: Any) -> AsyncIterator[tuple[Any, str]]:
    with trio.fail_after(60):
        async with running_daemon(
            {"s": sdk_server()}, socket_path, broker={"http": "127.0.0.1:0", **broker}
        ) as d:
            assert d.http_url is not None
            yield d, d.http_url


async def test_a_server_request_travels_on_the_stream_of_the_post_that_caused_it(
    socket_path: str,
) -> None:
    """Even while another request of the same session (at another server) is open."""
    servers = {"s": sdk_server("s"), "t": sdk_server("t")}
    with trio.fail_after(60):
        async with (
            running_daemon(servers, socket_path, broker={"http": "127.0.0.1:0"}) as d,
            httpx2.AsyncClient(timeout=30) as http,
            trio.open_nursery() as nursery,
        ):
            assert d.http_url is not None
            client = Raw(http, d.http_url)
            await client.initialize(sampling={})
            slow = client.request("tools/call", {"name": "s__slow", "arguments": {"seconds": 2}})
            nursery.start_soon(client.post, slow)
            await sample_on_the_callers_stream(http, client, "t__ask_llm")


async def sample_on_the_callers_stream(http: httpx2.AsyncClient, client: Raw, tool: str) -> None:
    """A server request reaches the client on the stream of its tools/call."""
    call = client.request("tools/call", {"name": tool, "arguments": {"prompt": "hi"}})
    seen: list[dict[str, str]] = []
    async with http.stream(
        "POST", client.url, content=orjson.dumps(call), headers=client.headers()
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"] == "text/event-stream"
        buffer = ""
        async for chunk in stream.aiter_text():
            buffer += chunk
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                (event,) = events(block + "\n\n") or [{}]
                seen.append(event)
                message = orjson.loads(event["data"]) if event.get("data") else None
                if message and message.get("method") == "sampling/createMessage":
                    answer = {
                        "jsonrpc": "2.0",
                        "id": message["id"],
                        "result": {
                            "role": "assistant",
                            "model": "m",
                            "content": {"type": "text", "text": "hello back"},
                        },
                    }
                    posted = await client.post(answer)
                    assert posted.status_code == 202
    # a priming event (2025-11-25), the server's request, then the answer; all with ids
    assert seen[0]["data"] == "" and "id" in seen[0]
    messages = [orjson.loads(e["data"]) for e in seen[1:]]
    assert [m.get("method") for m in messages] == ["sampling/createMessage", None]
    assert messages[-1]["id"] == call["id"]
    assert messages[-1]["result"]["content"][0]["text"] == "hello back"
    assert all("id" in e for e in seen)


async def test_refusals_and_their_statuses_leave_other_sessions_undisturbed(
    socket_path: str, tmp_path: Any
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    os.chmod(token_file, 0o600)
    good = {"authorization": "Bearer s3cret-token"}
    broker = {"tokenFile": str(token_file), "maxMessageBytes": 32768}
    async with (
        raw_daemon(socket_path, **broker) as (d, url),
        http_session(url, headers=good) as bystander,
        httpx2.AsyncClient(headers=good) as http,
        httpx2.AsyncClient() as anonymous,
    ):
        client = Raw(http, url)
        await client.initialize()

        async def still_fine() -> None:
            assert text_of(await bystander.call_tool("s__echo", {"text": "ok"})) == "ok"
            assert (await client.call("s__echo", text="ok"))["result"]["content"][0]["text"] == "ok"

        ping = client.request("ping")
        # no token, a wrong one
        refused = await Raw(anonymous, url).post(client.request("initialize"))
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert (await client.post(ping, authorization="Bearer wrong")).status_code == 401
        # a foreign Origin, a foreign Host (DNS rebinding)
        assert (await client.post(ping, origin="https://evil.example")).status_code == 403
        assert (await client.post(ping, host="rebound.example")).status_code == 403
        # no session id on a request that is not initialize; an unknown one
        no_session = await http.post(url, content=orjson.dumps(ping), headers={"accept": ACCEPT})
        assert no_session.status_code == 400
        unknown = await client.post(ping, **{"mcp-session-id": "not-a-session"})
        assert unknown.status_code == 404
        # a protocol version the broker does not speak
        bad = await client.post(ping, **{"mcp-protocol-version": "1999-01-01"})
        assert bad.status_code == 400 and "1999-01-01" in bad.json()["error"]["message"]
        # a body over maxMessageBytes, and one that is not JSON
        big = client.request("tools/call", {"name": "s__echo", "arguments": {"text": "x" * 40_000}})
        assert (await client.post(big)).status_code == 413
        garbage = await client.post(b"{not json")
        assert garbage.status_code == 400 and garbage.json()["error"]["code"] == -32700
        # a path that is not an endpoint, a verb it does not take
        assert (
            await http.post(url + "/nope", content=b"{}", headers=client.headers())
        ).status_code == 404
        assert (await http.put(url, content=b"{}", headers=client.headers())).status_code == 405
        await still_fine()
        # a session ended by DELETE is gone (404), and only that one
        other = Raw(http, url)
        await other.initialize()
        assert (await http.delete(url, headers=other.headers())).status_code == 204
        assert (await other.post(other.request("ping"))).status_code == 404
        assert (await http.delete(url, headers=other.headers())).status_code == 404
        await still_fine()
        assert len([s for s in d.statistics().sessions if s.transport == "http"]) == 2


async def test_a_broken_stream_resumes_with_last_event_id(socket_path: str) -> None:
    async with raw_daemon(socket_path) as (_, url), httpx2.AsyncClient() as http:
        client = Raw(http, url + "/s")
        await client.initialize()
        call = client.request(
            "tools/call",
            {"name": "slow", "arguments": {"seconds": 1.0}, "_meta": {"progressToken": "p"}},
        )
        first: list[dict[str, str]] = []
        async with http.stream(
            "POST", client.url, content=orjson.dumps(call), headers=client.headers()
        ) as stream:
            buffer = ""
            async for chunk in stream.aiter_text():
                buffer += chunk
                first = events(buffer.rpartition("\n\n")[0] + "\n\n")
                if len(first) >= 3:  # the priming event and two progress notifications
                    break
        # the connection is gone; the rest waits, and a GET picks it up
        last = first[-1]["id"]
        resumed = await http.get(client.url, headers=client.headers(**{"last-event-id": last}))
        assert resumed.status_code == 200
        rest = events(resumed.text)
        messages = [orjson.loads(e["data"]) for e in first[1:] + rest if e.get("data")]
        progress = [m["params"]["progress"] for m in messages if m.get("method")]
        assert progress == list(range(1, len(progress) + 1))  # none lost, none twice
        assert progress[-1] == 10
        assert messages[-1]["id"] == call["id"] and "result" in messages[-1]
        # the standalone stream's own id cannot resume another session's stream
        bogus = await http.get(client.url, headers=client.headers(**{"last-event-id": "99-1"}))
        assert bogus.status_code == 400


async def test_batches_on_2025_03_26_only(socket_path: str) -> None:
    async with raw_daemon(socket_path) as (_, url), httpx2.AsyncClient() as http:
        old = Raw(http, url + "/s")
        await old.initialize("2025-03-26")
        batch = [
            old.request("tools/call", {"name": "echo", "arguments": {"text": "one"}}),
            {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
            old.request("tools/call", {"name": "echo", "arguments": {"text": "two"}}),
        ]
        answer = await old.post(batch, accept="application/json")
        assert answer.status_code == 200
        answers = answer.json()
        assert sorted(a["id"] for a in answers) == [batch[0]["id"], batch[2]["id"]]
        texts = {a["id"]: a["result"]["content"][0]["text"] for a in answers}
        assert texts == {batch[0]["id"]: "one", batch[2]["id"]: "two"}
        streamed = await old.post([old.request("ping"), old.request("ping")])
        assert streamed.headers["content-type"] == "text/event-stream"
        (only,) = [orjson.loads(e["data"]) for e in events(streamed.text) if e.get("data")]
        assert len(only) == 2 and all(a["result"] == {} for a in only)
        # An item that is no message gets its error in the answer, beside the others'.
        mixed = await old.post([old.request("ping"), 5], accept="application/json")
        assert mixed.status_code == 200
        ((error,), (ok,)) = ([a for a in mixed.json() if a["id"] is None],
                             [a for a in mixed.json() if a["id"] is not None])  # fmt: skip
        assert error["error"]["code"] == -32600 and ok["result"] == {}

        new = Raw(http, url + "/s")
        await new.initialize()
        refused = await new.post([new.request("ping")])
        assert refused.status_code == 400 and "2025-03-26" in refused.json()["error"]["message"]
        assert (await new.call("echo", text="fine"))["result"]["content"][0]["text"] == "fine"


async def test_a_call_is_answered_in_json_and_one_with_progress_as_sse(socket_path: str) -> None:
    """The client accepts both: JSON unless something must go before the answer."""
    async with raw_daemon(socket_path) as (_, url), httpx2.AsyncClient(timeout=30) as http:
        client = Raw(http, url + "/s")
        await client.initialize()
        plain = client.request("tools/call", {"name": "slow", "arguments": {"seconds": 0.3}})
        answer = await client.post(plain)
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "application/json"
        assert answer.json()["id"] == plain["id"] and "result" in answer.json()

        meta = {"progressToken": "p"}
        arguments = {"seconds": 0.3}
        call = client.request("tools/call", {"name": "slow", "arguments": arguments, "_meta": meta})
        streamed = await client.post(call)
        assert streamed.status_code == 200
        assert streamed.headers["content-type"].startswith("text/event-stream")
        found = events(streamed.text)
        assert found[0]["data"] == "" and "id" in found[0]  # the priming event (2025-11-25)
        messages = [orjson.loads(e["data"]) for e in found[1:]]
        assert messages[0]["method"] == "notifications/progress"
        assert messages[0]["params"]["progressToken"] == "p"
        assert messages[-1]["id"] == call["id"] and "result" in messages[-1]
        assert all(m.get("method") == "notifications/progress" for m in messages[:-1])
