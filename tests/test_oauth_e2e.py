"""``mcpbroker auth NAME`` end to end, against an MCP server with its own
authorization server (the official SDK's: tests/servers/oauth_server.py):
discovery, dynamic registration, PKCE through a "browser" (httpx following
the redirects to the loopback listener), tokens stored 0600, then used and
refreshed on requests by the daemon's ``BearerTokens``."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import attrs
import httpx2
import pytest
import structlog
import trio

from actors.oauth import (
    MAX_ANSWER,
    REFRESH_BACKOFF,
    BearerTokens,
    Grant,
    RedirectListener,
    TokenStore,
    _resource_metadata,
    _server_metadata,
)
from broker.oauth import (
    Challenge,
    Client,
    OAuthError,
    Tokens,
    client_headers,
    refresh_request,
)
from tests.conftest import MCPBROKER, REPO, running_daemon, shim_client, text_of
from tests.hostile_http import open_hostile_server, status_reply

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
HEADERS = {"Accept": "application/json, text/event-stream"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def oauth_server(log: Path | None = None, *extra: str) -> AsyncIterator[str]:
    """The test server on a free port (its stderr to ``log``; ``extra``: its
    options); yields its MCP endpoint's URL."""
    port = free_port()
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "tests.servers.oauth_server", str(port), *extra],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if log is None else log.open("wb"),
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        async with httpx2.AsyncClient() as client:
            for _ in range(200):
                try:
                    await client.get(
                        f"http://127.0.0.1:{port}/.well-known/oauth-authorization-server"
                    )
                    break
                except httpx2.TransportError:
                    await trio.sleep(0.05)
        yield url
    finally:
        process.terminate()
        with trio.move_on_after(5):
            await process.wait()


def write_config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"mcpServers": {"remote": {"url": url}}}))
    return path


async def run_auth(config: Path, tokens: Path, *extra: str) -> tuple[int, str, str]:
    """``mcpbroker auth remote``, with the browser played by an HTTP client
    that opens the printed URL and follows its redirects."""
    env = {**os.environ, "MCPBROKER_TOKENS": str(tokens)}
    process = await trio.lowlevel.open_process(
        [MCPBROKER, "auth", "remote", "--config", str(config), "--no-browser", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert process.stdout is not None and process.stderr is not None
    out = b""
    async with httpx2.AsyncClient(follow_redirects=True) as browser:
        while b"\n\n" not in out.partition(b"http")[2] and process.poll() is None:
            out += await process.stdout.receive_some(4096)
        shown = out.decode().partition("Open this address")[2]  # (only what it asks to open)
        for word in shown.split():
            if word.startswith("http"):
                page = await browser.get(word)
                assert page.status_code == 200 and b"you may close this window" in page.content
    rest = b""
    while chunk := await process.stdout.receive_some(4096):
        rest += chunk
    errors = b""
    while chunk := await process.stderr.receive_some(4096):
        errors += chunk
    return await process.wait(), (out + rest).decode(), errors.decode()


async def test_auth_stores_tokens_the_server_accepts(tmp_path: Path) -> None:
    tokens = tmp_path / "state" / "oauth.json"
    with trio.fail_after(60):
        async with oauth_server() as url:
            async with httpx2.AsyncClient() as client:  # without a token: 401
                assert (await client.post(url, json=INITIALIZE, headers=HEADERS)).status_code == 401
            code, out, errors = await run_auth(write_config(tmp_path, url), tokens)
            assert code == 0, errors
            assert "authorized" in out
            assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
            assert stat.S_IMODE(tokens.parent.stat().st_mode) == 0o700
            grant = TokenStore(str(tokens)).load("remote")
            assert grant is not None and grant.resource == url
            assert grant.tokens.refresh_token and grant.client.client_id

            auth = BearerTokens("remote", TokenStore(str(tokens)))
            async with httpx2.AsyncClient(auth=auth) as client:
                answer = await client.post(url, json=INITIALIZE, headers=HEADERS)
                assert answer.status_code == 200, answer.text
                assert b"oauth-test-server" in answer.content


async def test_tokens_are_refreshed_before_they_lapse(tmp_path: Path) -> None:
    tokens, log = tmp_path / "oauth.json", tmp_path / "server.log"
    with trio.fail_after(60):
        async with oauth_server(log) as url:
            code, _, errors = await run_auth(write_config(tmp_path, url), tokens)
            assert code == 0, errors
            store = TokenStore(str(tokens))
            first = store.load("remote")
            assert first is not None and first.tokens.expires_at is not None
            # An hour on: the access token is about to lapse, so the next
            # request refreshes it first (once, though two go at once).
            later = BearerTokens("remote", store, clock=lambda: time.time() + 3590)
            async with httpx2.AsyncClient(auth=later) as client:
                async with trio.open_nursery() as nursery:
                    for _ in range(2):
                        nursery.start_soon(
                            partial(client.post, url, json=INITIALIZE, headers=HEADERS)
                        )
                answer = await client.post(url, json=INITIALIZE, headers=HEADERS)
                assert answer.status_code == 200, answer.text
            second = store.load("remote")
            assert second is not None
            assert second.tokens.access_token != first.tokens.access_token
            assert second.tokens.refresh_token != first.tokens.refresh_token  # rotated
            assert log.read_text().count("issued access") == 2  # the grant, one refresh


async def test_a_grant_the_server_forgot_leaves_the_401(tmp_path: Path) -> None:
    tokens = tmp_path / "oauth.json"
    with trio.fail_after(60):
        async with oauth_server() as url:
            config = write_config(tmp_path, url)
            code, _, errors = await run_auth(config, tokens)
            assert code == 0, errors
        # The server restarts (on another port, say: a new server) and knows
        # nothing of the grant: the refresh fails, the 401 reaches the caller.
        async with oauth_server() as url:
            store = TokenStore(str(tokens))
            grant = store.load("remote")
            assert grant is not None
            async with httpx2.AsyncClient(auth=BearerTokens("remote", store)) as client:
                answer = await client.post(url, json=INITIALIZE, headers=HEADERS)
            assert answer.status_code == 401


async def test_auth_of_a_server_that_asks_nothing(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"mcpServers": {"local": {"command": "true"}}}))
    process = await trio.run_process(
        [MCPBROKER, "auth", "remote", "--config", str(config)],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert process.returncode == 2
    assert b"no remote server 'remote'" in process.stderr


async def test_logout_forgets_and_revokes(tmp_path: Path) -> None:
    """The tokens are forgotten here, and revoked at the authorization server
    (RFC 7009): a copy of them (a leaked one) is of no use there either."""
    tokens = tmp_path / "oauth.json"
    with trio.fail_after(60):
        async with oauth_server() as url:
            config = write_config(tmp_path, url)
            code, _, errors = await run_auth(config, tokens)
            assert code == 0, errors
            grant = TokenStore(str(tokens)).load("remote")
            assert grant is not None
            bearer = {**HEADERS, "Authorization": f"Bearer {grant.tokens.access_token}"}
            async with httpx2.AsyncClient() as client:
                assert (await client.post(url, json=INITIALIZE, headers=bearer)).status_code == 200
            code, out, errors = await run_auth(config, tokens, "--logout")
            assert code == 0 and "forgot" in out, errors
            assert "revoked them at http://127.0.0.1" in out
            assert TokenStore(str(tokens)).load("remote") is None
            async with httpx2.AsyncClient() as client:
                assert (await client.post(url, json=INITIALIZE, headers=bearer)).status_code == 401
                assert grant.tokens.refresh_token is not None
                body = refresh_request(grant.client, grant.tokens.refresh_token, grant.resource)
                refreshed = await client.post(
                    grant.token_endpoint, data=body, headers=client_headers(grant.client)
                )
                assert refreshed.status_code == 400  # (invalid_grant: revoked too)
            code, out, _ = await run_auth(config, tokens, "--logout")
            assert code == 0 and "revoked" not in out  # (nothing stored: nothing to revoke)


async def test_the_daemon_uses_the_grant_on_its_http_link(
    tmp_path: Path, socket_path: str, monkeypatch: Any
) -> None:
    """Before `mcpbroker auth` the server's 401 is reported with what to do;
    after it, shim clients call the server with the broker's token."""
    tokens = tmp_path / "oauth.json"
    monkeypatch.setenv("MCPBROKER_TOKENS", str(tokens))
    with trio.fail_after(90):
        async with oauth_server() as url:
            servers = {"remote": {"url": url, "restartDelay": 0.1, "restartAttempts": 1}}
            async with running_daemon(servers, socket_path, wait=()) as daemon:
                with trio.fail_after(20):
                    while "mcpbroker auth" not in (
                        daemon.upstreams["remote"].statistics().last_error or ""
                    ):
                        await trio.sleep(0.05)
            code, _, errors = await run_auth(write_config(tmp_path, url), tokens)
            assert code == 0, errors
            grant = TokenStore(str(tokens)).load("remote")
            assert grant is not None
            async with (
                running_daemon(servers, socket_path),
                shim_client(socket_path, "remote") as client,
            ):
                whoami = await client.call_tool("whoami", {})
                assert text_of(whoami) == grant.client.client_id


async def test_a_grant_stored_later_is_read_on_the_next_401(tmp_path: Path) -> None:
    """A link made before `mcpbroker auth` ran picks the grant up at the next
    401, without a restart; until then it reads the file no more."""
    tokens = tmp_path / "oauth.json"
    with trio.fail_after(60):
        async with oauth_server() as url:
            store = CountingStore(str(tokens))
            auth = BearerTokens("remote", store)
            async with httpx2.AsyncClient(auth=auth) as client:
                answer = await client.post(url, json=INITIALIZE, headers=HEADERS)
                assert answer.status_code == 401
                code, _, errors = await run_auth(write_config(tmp_path, url), tokens)
                assert code == 0, errors
                answer = await client.post(url, json=INITIALIZE, headers=HEADERS)
                assert answer.status_code == 200, answer.text
                loads = store.loads  # (first use; each 401)
                for _ in range(5):
                    answer = await client.post(url, json=INITIALIZE, headers=HEADERS)
                    assert answer.status_code == 200, answer.text
                assert store.loads == loads == 3


class CountingStore(TokenStore):
    loads = 0

    def load(self, name: str) -> Any:
        self.loads += 1
        return super().load(name)


# -- BearerTokens against a mock transport (no server) --------------------------

RESOURCE = "https://mcp.example/mcp"


def grant_for(
    resource: str = RESOURCE,
    access: str = "AT-1",
    refresh: str | None = "RT-1",
    expires_at: float | None = None,
) -> Grant:
    return Grant(
        resource,
        resource,
        "https://as.example/token",
        Client("client-1"),
        Tokens(access, refresh, expires_at),
    )


def bearers_of(seen: list[httpx2.Request]) -> list[str | None]:
    return [request.headers.get("authorization") for request in seen]


async def test_a_grant_goes_only_to_the_server_it_was_granted_for(tmp_path: Path) -> None:
    """The name was pointed at another server after `mcpbroker auth`: that
    server gets no token (RFC 8707 audience); the granted one, and a path
    under its resource, do."""
    store = TokenStore(str(tmp_path / "oauth.json"))
    store.save("s", grant_for())
    seen: list[httpx2.Request] = []
    transport = httpx2.MockTransport(lambda request: seen.append(request) or httpx2.Response(200))
    for url in (
        "https://other.example/mcp",
        "https://mcp.example/mcpx",
        RESOURCE,
        "https://MCP.example/mcp/?key=1",
    ):
        auth = BearerTokens("s", store, url=url)
        async with httpx2.AsyncClient(auth=auth, transport=transport) as client:
            await client.post(url)
    assert bearers_of(seen) == [None, None, "Bearer AT-1", "Bearer AT-1"]


def test_two_saves_at_once_lose_neither_grant(tmp_path: Path) -> None:
    """A save reads, changes and writes the file under the store's lock: a
    save of another server's grant that comes while one is between its read
    and its write waits, and neither grant is lost."""
    path = str(tmp_path / "oauth.json")
    read_once, other_done = threading.Event(), threading.Event()

    class SlowStore(TokenStore):
        def load_all(self) -> dict[str, Grant]:
            grants = super().load_all()
            if threading.current_thread().name == "a" and not read_once.is_set():
                read_once.set()
                other_done.wait(0.5)  # (without the lock, "b" is saved meanwhile)
            return grants

    store = SlowStore(path)
    store.save("old", grant_for())
    first = threading.Thread(target=store.save, args=("a", grant_for()), name="a")
    first.start()
    assert read_once.wait(5)
    second = threading.Thread(target=lambda: (store.save("b", grant_for()), other_done.set()))
    second.start()
    first.join(5)
    second.join(5)
    assert sorted(TokenStore(path).load_all()) == ["a", "b", "old"]


class TokenEndpoint:
    """A token endpoint (an httpx2 mock transport) that rotates refresh
    tokens: each refresh token is good once."""

    def __init__(self, delay: float = 0.0) -> None:
        self.refreshes: list[str] = []
        self.delay = delay
        self.transport = httpx2.MockTransport(self.handle)

    async def handle(self, request: httpx2.Request) -> httpx2.Response:
        await trio.sleep(self.delay)
        form = dict(parse_qsl(request.content.decode()))
        self.refreshes.append(form["refresh_token"])
        if self.refreshes.count(form["refresh_token"]) > 1:
            return httpx2.Response(400, json={"error": "invalid_grant"})
        n = len(self.refreshes) + 1
        return httpx2.Response(
            200, json={"access_token": f"AT-{n}", "refresh_token": f"RT-{n}", "expires_in": 3600}
        )


async def test_the_links_of_one_server_refresh_once_between_them(tmp_path: Path) -> None:
    """A pool's instances (one link each) share the server's BearerTokens:
    three requests at once with a token about to lapse make one refresh."""
    store = TokenStore(str(tmp_path / "oauth.json"))
    store.save("s", grant_for(expires_at=time.time() + 5))
    endpoint = TokenEndpoint(delay=0.05)
    seen: list[httpx2.Request] = []
    server = httpx2.MockTransport(lambda request: seen.append(request) or httpx2.Response(200))
    links = [BearerTokens.of_server("s", RESOURCE, store) for _ in range(3)]
    assert links[0] is links[1] is links[2]
    links[0]._transport = endpoint.transport
    assert BearerTokens.of_server("s", "https://mcp.example/other", store) is not links[0]

    async def request(auth: BearerTokens) -> None:
        async with httpx2.AsyncClient(auth=auth, transport=server) as client:
            await client.post(RESOURCE)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for auth in links:
                nursery.start_soon(request, auth)
    assert endpoint.refreshes == ["RT-1"]
    assert bearers_of(seen) == ["Bearer AT-2"] * 3


async def test_a_refresh_waits_for_another_process_holding_the_server(tmp_path: Path) -> None:
    """Another process (here: a thread holding the lock) refreshing the same
    grant: this one waits, then takes the grant it stored, without a refresh."""
    store = TokenStore(str(tmp_path / "oauth.json"))
    store.save("s", grant_for(expires_at=time.time() + 5))
    endpoint = TokenEndpoint()
    auth = BearerTokens("s", store, url=RESOURCE, transport=endpoint.transport)
    seen: list[httpx2.Request] = []
    server = httpx2.MockTransport(lambda request: seen.append(request) or httpx2.Response(200))
    holding, release = threading.Event(), threading.Event()

    def other_process() -> None:
        with store.locked("s"):
            holding.set()
            release.wait(5)
            store.save_as_holder("s", grant_for(access="AT-other", refresh="RT-other"))

    thread = threading.Thread(target=other_process)
    thread.start()
    assert holding.wait(5)
    with trio.fail_after(10):
        async with (
            httpx2.AsyncClient(auth=auth, transport=server) as client,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(partial(client.post, RESOURCE))
            await trio.sleep(0.2)
            assert not seen  # (waiting for the lock)
            release.set()
    thread.join(5)
    assert endpoint.refreshes == []
    assert bearers_of(seen) == ["Bearer AT-other"]


async def test_a_slow_refresh_of_one_server_holds_no_other_up(tmp_path: Path) -> None:
    """The lock across a refresh's POST (up to 30 s) is the server's own: one
    held for server "a" (another process refreshing it at a slow
    authorization server) neither delays server "b"'s refresh nor a save."""
    store = TokenStore(str(tmp_path / "oauth.json"))
    store.save("a", grant_for(expires_at=time.time() + 5))
    store.save("b", grant_for(expires_at=time.time() + 5))
    endpoint = TokenEndpoint()
    auth = BearerTokens("b", store, url=RESOURCE, transport=endpoint.transport)
    seen: list[httpx2.Request] = []
    server = httpx2.MockTransport(lambda request: seen.append(request) or httpx2.Response(200))
    holding, release = threading.Event(), threading.Event()

    def other_process() -> None:
        with store.locked("a"):
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=other_process)
    thread.start()
    try:
        assert holding.wait(5)
        with trio.fail_after(3):
            async with httpx2.AsyncClient(auth=auth, transport=server) as client:
                await client.post(RESOURCE)
            await trio.to_thread.run_sync(store.save, "c", grant_for(access="AT-c"))
    finally:
        release.set()
        thread.join(5)
    assert endpoint.refreshes == ["RT-1"] and bearers_of(seen) == ["Bearer AT-2"]
    assert store.load("c") is not None


async def test_a_token_answer_past_the_bound_is_not_read(tmp_path: Path) -> None:
    """A token endpoint answering megabytes (a bug, or hostile): the refresh
    fails after MAX_ANSWER bytes, nothing of it is used."""
    store = TokenStore(str(tmp_path / "oauth.json"))
    store.save("s", grant_for(expires_at=time.time() + 5))
    huge = b'{"access_token": "' + b"A" * (MAX_ANSWER + 1) + b'"}'
    endpoint = httpx2.MockTransport(lambda request: httpx2.Response(200, content=huge))
    auth = BearerTokens("s", store, url=RESOURCE, transport=endpoint)
    seen: list[httpx2.Request] = []
    server = httpx2.MockTransport(lambda request: seen.append(request) or httpx2.Response(200))
    async with httpx2.AsyncClient(auth=auth, transport=server) as client:
        await client.post(RESOURCE)
    assert bearers_of(seen) == ["Bearer AT-1"]  # (the old token, while it lasts)


async def test_an_authorization_server_out_of_reach_is_an_oauth_error() -> None:
    """`mcpbroker auth` says it in a line (cli/auth.py prints OAuthErrors),
    not a traceback: metadata, registration and token requests alike."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    async with httpx2.AsyncClient() as client:
        with pytest.raises(OAuthError, match=rf"cannot reach http://127.0.0.1:{port}/"):
            await _server_metadata(client, f"http://127.0.0.1:{port}")
        with pytest.raises(OAuthError, match="cannot reach"):
            await _resource_metadata(client, RESOURCE, Challenge("http://[::1/meta"))


async def test_the_redirect_listener_waits_for_the_browsers_answer() -> None:
    """Another local process's garbage, a wrong path and a callback with
    another state are answered and ignored; the matching callback ends the wait."""
    listener = await RedirectListener.open()
    port = int(listener.redirect_uri.split(":")[2].split("/")[0])
    answers: list[bytes] = []

    async def send(data: bytes) -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(data)
            answer = b""
            while chunk := await stream.receive_some():
                answer += chunk
            answers.append(answer.split(b"\r\n", 1)[0])

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            query: dict[str, str] = {}

            async def wait() -> None:
                query.update(await listener.wait_callback("S1"))

            nursery.start_soon(wait)
            await send(b"GARBAGE\r\n\r\n")
            await send(b"GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n")
            await send(b"GET /callback?code=evil&state=other HTTP/1.1\r\nHost: x\r\n\r\n")
            assert not query
            await send(b"GET /callback?code=good&state=S1 HTTP/1.1\r\nHost: x\r\n\r\n")
    await listener.aclose()
    assert query == {"code": "good", "state": "S1"}
    assert [answer.split(b" ")[1] for answer in answers] == [b"400", b"404", b"400", b"200"]


async def test_auth_sends_the_headers_as_the_daemon_does(tmp_path: Path) -> None:
    """`${NAME}` in a server's headers is expanded for the probe too (a server
    that wants an API key beside OAuth); one that is not set is named."""
    async with open_hostile_server(lambda request: status_reply(500)) as server:
        config = tmp_path / "config.json"
        headers = {"X-Api-Key": "${MY_KEY}"}
        config.write_text(
            json.dumps({"mcpServers": {"remote": {"url": server.url, "headers": headers}}})
        )
        command = [MCPBROKER, "auth", "remote", "--config", str(config), "--no-browser"]
        env = {**os.environ, "MCPBROKER_TOKENS": str(tmp_path / "oauth.json"), "MY_KEY": "k-1"}
        with trio.fail_after(30):
            done = await trio.run_process(command, env=env, capture_stdout=True, check=False)
            assert done.returncode == 0 and b"nothing to do" in done.stdout
            assert server.requests[0].headers["x-api-key"] == "k-1"
            del env["MY_KEY"]
            done = await trio.run_process(command, env=env, capture_stderr=True, check=False)
        assert done.returncode == 2 and b"MY_KEY is not set" in done.stderr
        assert len(server.requests) == 1


@pytest.mark.parametrize("kind", ["garbage", "list", "badgrant", "directory", "symlink"])
async def test_a_token_file_that_cannot_be_read_is_no_grant(tmp_path: Path, kind: str) -> None:
    """A broken token file breaks no server that asks for nothing (its
    requests go without a token; one that asks answers 401, and `mcpbroker
    auth` names the file); it was an "internal error of the broker"."""
    path = tmp_path / "oauth.json"
    if kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        (tmp_path / "elsewhere.json").write_text("{}")
        path.symlink_to(tmp_path / "elsewhere.json")
    else:
        path.write_text({"garbage": "{not json", "list": "[]", "badgrant": '{"s": 1}'}[kind])
    seen: list[httpx2.Request] = []
    server = httpx2.MockTransport(lambda request: seen.append(request) or httpx2.Response(200))
    auth = BearerTokens("s", TokenStore(str(path)), url=RESOURCE)
    async with httpx2.AsyncClient(auth=auth, transport=server) as client:
        assert (await client.post(RESOURCE)).status_code == 200
    assert bearers_of(seen) == [None]


def test_reading_the_token_store_creates_no_file(tmp_path: Path) -> None:
    path = tmp_path / "oauth.json"
    assert TokenStore(str(path)).load("s") is None
    assert not path.exists()


async def test_a_refresh_that_fails_is_not_asked_for_again_at_once(tmp_path: Path) -> None:
    """The refresh token was revoked: one failing refresh, then requests go
    with the token as it is for REFRESH_BACKOFF (each cost one, two with its
    401); after it, one more try."""
    store = TokenStore(str(tmp_path / "oauth.json"))
    now = [1000.0]
    store.save("s", grant_for(expires_at=1010.0))
    asked: list[httpx2.Request] = []

    def refuse(request: httpx2.Request) -> httpx2.Response:
        asked.append(request)
        return httpx2.Response(400, json={"error": "invalid_grant"})

    endpoint = httpx2.MockTransport(refuse)
    server = httpx2.MockTransport(lambda request: httpx2.Response(401))
    auth = BearerTokens("s", store, clock=lambda: now[0], url=RESOURCE, transport=endpoint)
    async with httpx2.AsyncClient(auth=auth, transport=server) as client:
        for _ in range(5):
            assert (await client.post(RESOURCE)).status_code == 401
        assert len(asked) == 1
        now[0] += REFRESH_BACKOFF
        await client.post(RESOURCE)
        assert len(asked) == 2


# -- step-up: a 403 insufficient_scope at run time ------------------------------


def scope_asked(out: str) -> str | None:
    """The scope in the authorization address `mcpbroker auth` printed."""
    shown = out.partition("Open this address")[2]
    address = next(word for word in shown.split() if word.startswith("http"))
    return dict(parse_qsl(urlsplit(address).query)).get("scope")


async def test_a_scope_asked_for_at_run_time_is_asked_for_by_the_next_auth(
    tmp_path: Path, socket_path: str, monkeypatch: Any
) -> None:
    """The server answers a call 403 insufficient_scope naming a scope the
    grant lacks: the caller's error names the server, the scope and what to
    run; the daemon logs it once and notes it beside the grant; status says
    so; the next plain `mcpbroker auth` asks for the scope granted and the
    challenged one (the challenged alone would lose mcp:tools), and says so;
    the call then works in the same session, without a restart."""
    tokens = tmp_path / "oauth.json"
    monkeypatch.setenv("MCPBROKER_TOKENS", str(tokens))
    nowhere = str(tmp_path / "no-daemon.sock")
    with trio.fail_after(120):
        async with oauth_server(None, "--step-up") as url:
            config = write_config(tmp_path, url)
            code, out, errors = await run_auth(config, tokens, "--socket", nowhere)
            assert code == 0, errors
            assert scope_asked(out) == "mcp:tools"
            with structlog.testing.capture_logs() as captured:
                async with (
                    running_daemon({"remote": {"url": url}}, socket_path) as daemon,
                    shim_client(socket_path, "remote") as client,
                ):
                    for _ in range(3):
                        with pytest.raises(Exception) as refused:
                            await client.call_tool("write", {"text": "x"})
                        said = str(refused.value)
                        assert "'remote'" in said and "403" in said, said
                        assert "'mcp:write'" in said and "`mcpbroker auth remote`" in said, said
                    assert text_of(await client.call_tool("echo", {"text": "hi"})) == "hi"
                    told = [e for e in captured if e["event"] == "oauth.insufficient_scope"]
                    assert [e["scope"] for e in told] == ["mcp:write"]
                    (row,) = daemon.statistics().servers
                    assert "'mcp:write'" in (row.last_error or "")
                    assert "`mcpbroker auth remote`" in (row.last_error or "")
                    grant = TokenStore(str(tokens)).load("remote")
                    assert grant is not None and grant.wanted_scope == "mcp:write"

                    code, out, errors = await run_auth(config, tokens, "--socket", socket_path)
                    assert code == 0, errors
                    assert "asked for scope 'mcp:write' at run time" in out
                    assert scope_asked(out) == "mcp:tools mcp:write"
                    grant = TokenStore(str(tokens)).load("remote")
                    assert grant is not None and grant.wanted_scope is None
                    assert (daemon.statistics().servers[0].last_error or "") == ""
                    wrote = await client.call_tool("write", {"text": "x"})
                    assert text_of(wrote) == "wrote x"
                    assert text_of(await client.call_tool("echo", {"text": "hi"})) == "hi"


STEP_UP = 'Bearer error="insufficient_scope", scope="files:write", error_description="no"'


async def test_a_403_insufficient_scope_is_noted_beside_the_grant(tmp_path: Path) -> None:
    """Noted once per scope (the file written only when the scope is new),
    the union of every scope asked for; status reads it from the daemon's
    tokens; a plain 403 or a malformed scope notes nothing."""
    store = CountingStore(str(tmp_path / "oauth.json"))
    store.save("noted", grant_for())
    headers = {"www-authenticate": STEP_UP}
    answers = [
        httpx2.Response(403, headers=headers),
        httpx2.Response(403, headers=headers),
        httpx2.Response(403),  # (forbidden, not for a scope)
        httpx2.Response(403, headers={"www-authenticate": 'Bearer error="insufficient_scope"'}),
        httpx2.Response(403, headers={"www-authenticate": STEP_UP.replace("files:write", "a:b")}),
    ]
    transport = httpx2.MockTransport(lambda request: answers.pop(0))
    auth = BearerTokens.of_server("noted", RESOURCE, store)
    with structlog.testing.capture_logs() as captured:
        async with httpx2.AsyncClient(auth=auth, transport=transport) as client:
            for _ in range(5):
                assert (await client.post(RESOURCE)).status_code == 403
    told = [e["scope"] for e in captured if e["event"] == "oauth.insufficient_scope"]
    assert told == ["files:write", None, "a:b"]
    grant = store.load("noted")
    assert grant is not None and grant.wanted_scope == "files:write a:b"
    assert grant.tokens == grant_for().tokens
    assert BearerTokens.wanted_scope("noted") == "files:write a:b"
    BearerTokens.reread("noted")  # (`mcpbroker auth` stored a new grant)
    assert BearerTokens.wanted_scope("noted") is None


async def test_a_grant_stored_since_a_403_is_taken_at_the_next_one(tmp_path: Path) -> None:
    """`mcpbroker auth` stored a grant with the scope, and the daemon was not
    told (another socket): the next 403 reads the file and sends the request
    again with the new token, as a 401 does."""
    store = TokenStore(str(tmp_path / "oauth.json"))
    store.save("s", grant_for())
    seen: list[str | None] = []  # (the bearer as sent: a request sent again is the same object)

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers.get("authorization"))
        if request.headers.get("authorization") == "Bearer AT-2":
            return httpx2.Response(200)
        return httpx2.Response(403, headers={"www-authenticate": STEP_UP})

    auth = BearerTokens("s", store, url=RESOURCE)
    async with httpx2.AsyncClient(auth=auth, transport=httpx2.MockTransport(answer)) as client:
        assert (await client.post(RESOURCE)).status_code == 403
        store.save("s", grant_for(access="AT-2"))
        assert (await client.post(RESOURCE)).status_code == 200
        assert (await client.post(RESOURCE)).status_code == 200
    assert seen == ["Bearer AT-1", "Bearer AT-1", "Bearer AT-2", "Bearer AT-2"]


async def test_auth_and_logout_reach_a_running_daemon(
    tmp_path: Path, socket_path: str, monkeypatch: Any
) -> None:
    """The daemon gave up on a server that answered 401: `mcpbroker auth`
    has it tried again at once (not after retryFailedAfter or a reload);
    `--logout` stops its token from the next request on."""
    tokens = tmp_path / "oauth.json"
    monkeypatch.setenv("MCPBROKER_TOKENS", str(tokens))
    with trio.fail_after(90):
        async with oauth_server() as url:
            servers = {"remote": {"url": url, "restartDelay": 0.1, "restartAttempts": 1}}
            config = write_config(tmp_path, url)
            async with running_daemon(servers, socket_path, wait=()) as daemon:
                upstream = daemon.upstreams["remote"]
                while upstream.statistics().state != "failed":
                    await trio.sleep(0.05)
                code, out, errors = await run_auth(config, tokens, "--socket", socket_path)
                assert code == 0, errors
                assert "uses them from its next request" in out
                while upstream.statistics().state != "ready":
                    await trio.sleep(0.05)
                async with shim_client(socket_path, "remote") as client:
                    assert text_of(await client.call_tool("whoami", {}))
                    code, _, errors = await run_auth(
                        config, tokens, "--logout", "--socket", socket_path
                    )
                    assert code == 0, errors
                    with pytest.raises(Exception, match="401"):
                        await client.call_tool("whoami", {})


async def test_logout_with_a_token_file_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    """(It ended in a traceback; docs/oauth.md promises one line.)"""
    tokens = tmp_path / "state" / "oauth.json"
    tokens.parent.mkdir(mode=0o700)
    tokens.write_text("garbage")
    tokens.chmod(0o600)
    config = write_config(tmp_path, "https://example.invalid/mcp")
    with trio.fail_after(30):
        process = await trio.run_process(
            [MCPBROKER, "auth", "remote", "--config", str(config), "--logout",
             "--socket", str(tmp_path / "none.sock")],
            env={**os.environ, "MCPBROKER_TOKENS": str(tokens)},
            capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    assert process.returncode == 1
    lines = process.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcpbroker auth: "), lines


async def test_a_revocation_is_not_redirected_with_the_token() -> None:
    """A revocation endpoint answering 307 elsewhere: the POST (the token
    and the client's secret, in its form) is not sent on; the revocation
    fails. (Found by reading the change again.)"""
    from actors.oauth import revoke

    metadata = {
        "issuer": "https://as.example",
        "authorization_endpoint": "https://as.example/authorize",
        "token_endpoint": "https://as.example/token",
        "revocation_endpoint": "https://as.example/revoke",
        "code_challenge_methods_supported": ["S256"],
    }
    seen: list[str] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(str(request.url))
        if request.url.path.startswith("/.well-known/"):
            return httpx2.Response(200, json=metadata)
        return httpx2.Response(307, headers={"Location": "https://elsewhere.example/take"})

    grant = attrs.evolve(grant_for(), issuer="https://as.example")
    with pytest.raises(OAuthError, match="refused to revoke the refresh token"):
        await revoke(grant, transport=httpx2.MockTransport(answer))
    assert seen[-1] == "https://as.example/revoke"
    assert not any("elsewhere" in url for url in seen)
