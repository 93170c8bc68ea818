"""OAuth 2.1 for remote servers: the token store, the flow's I/O, the tokens
on every request.

The rules (what to ask, what an answer means) are ``broker/oauth.py``; this
module does the asking:

- :class:`TokenStore`: one JSON file, mode 0600 in a 0700 directory of the
  user's (``~/.local/state/mcpbroker/oauth.json``, or ``$MCPBROKER_TOKENS``),
  holding per server name its URL, the authorization server's token
  endpoint, the broker's client registration and the tokens. Written whole
  and renamed into place, so a reader never sees half a file.
- :func:`authorize`: ``mcpbroker auth NAME``'s interactive flow: discovery,
  registration, the user's browser sent to the authorization endpoint, the
  code caught on a loopback redirect (:class:`RedirectListener`), the tokens
  stored.
- :class:`BearerTokens`: the ``httpx2.Auth`` an HTTP link uses. It puts the
  stored access token on every request, refreshes it shortly before it
  expires (and once on a 401), and leaves a 401 it cannot cure to the link,
  which reports that the server needs ``mcpbroker auth NAME``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pwd
import secrets
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit

import attrs
import cattrs
import h11
import httpx2
import orjson
import trio

from actors.logs import get_logger
from actors.paths import UnsafePath, ensure_private_dir, open_private
from broker import oauth
from broker.oauth import Challenge, Client, OAuthError, ServerMetadata, Tokens
from broker.redact import shown_url

TOKENS_ENV = "MCPBROKER_TOKENS"
CALLBACK_PATH = "/callback"
# How long ``mcpbroker auth`` waits for the user to finish in the browser.
AUTHORIZE_TIMEOUT = 300.0
HTTP_TIMEOUT = 30.0
# The most of an OAuth party's answer read (metadata, a registration, tokens:
# each a few KiB); a longer one is refused, not held.
MAX_ANSWER = 1 << 20
# After a refresh fails, how long requests go with the token as it is before
# another refresh is asked for (a grant `mcpbroker auth` stores meanwhile is
# still taken at the next 401).
REFRESH_BACKOFF = 30.0
# How often a task waiting for the token store's lock tries again.
LOCK_POLL = 0.05
# The scopes whose 403 a server's tokens remember having logged (then it
# starts again: a server that names a new scope at every call fills no memory).
MAX_SCOPES_TOLD = 16


def default_token_path() -> str:
    """``$MCPBROKER_TOKENS``, else ``oauth.json`` in the user's state directory
    (from the user database, like the daemon's other files: docs/security.md)."""
    explicit = os.environ.get(TOKENS_ENV)
    if explicit:
        return explicit
    home = pwd.getpwuid(os.getuid()).pw_dir
    return os.path.join(home, ".local", "state", "mcpbroker", "oauth.json")


@attrs.frozen
class Grant:
    """What the broker holds for one server: enough to use and refresh its tokens."""

    server_url: str
    resource: str
    token_endpoint: str
    client: Client
    tokens: Tokens
    issuer: str | None = None
    # The scope the server asked for at run time that these tokens lack (its
    # 403 insufficient_scope): the next ``mcpbroker auth`` asks for it too,
    # and ``mcpbroker status`` says so meanwhile (docs/oauth.md, step-up).
    wanted_scope: str | None = None


_converter = cattrs.Converter()


class TokenStore:
    def __init__(self, path: str | None = None) -> None:
        self.path = path or default_token_path()

    def load_all(self) -> dict[str, Grant]:
        try:
            fd = open_private(self.path, os.O_RDONLY, create=False)  # (a read creates nothing)
        except FileNotFoundError:
            return {}
        with os.fdopen(fd, "rb") as file:
            data = file.read()
        if not data:
            return {}
        try:
            raw = orjson.loads(data)
            return {name: _converter.structure(grant, Grant) for name, grant in raw.items()}
        except (ValueError, TypeError, AttributeError, cattrs.BaseValidationError) as exc:
            raise OAuthError(
                f"the token file {self.path} cannot be read ({exc}): remove it"
            ) from exc

    def load(self, name: str) -> Grant | None:
        try:
            return self.load_all().get(name)
        except FileNotFoundError:
            return None

    def save(self, name: str, grant: Grant | None) -> None:
        """Store (or, with None, forget) a server's grant, under the server's
        lock (a refresh of it in progress ends first), then the store's: the
        file is read, changed and written under it, so no writer loses
        another's grant (a daemon's refresh, ``mcpbroker auth`` of another
        server)."""
        with self.locked(name), self.locked():
            self.save_locked(name, grant)

    def save_as_holder(self, name: str, grant: Grant | None) -> None:
        """:meth:`save`, for a caller that holds the server's lock."""
        with self.locked():
            self.save_locked(name, grant)

    def save_locked(self, name: str, grant: Grant | None) -> None:
        """:meth:`save`, for a caller that holds the lock (:meth:`locked`)."""
        grants = self.load_all() if os.path.exists(self.path) else {}
        if grant is None:
            grants.pop(name, None)
        else:
            grants[name] = grant
        temporary = f"{self.path}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(
                orjson.dumps(
                    {key: _converter.unstructure(value) for key, value in grants.items()},
                    option=orjson.OPT_INDENT_2,
                )
            )
        os.replace(temporary, self.path)

    def open_lock(self, name: str | None = None) -> int:
        """A descriptor of a lock file beside the store (0600), to ``flock``:
        the store's (``PATH.lock``), or server ``name``'s (``PATH.lock.`` and
        a hash of the name); the directory is made private first."""
        ensure_private_dir(os.path.dirname(os.path.abspath(self.path)))
        suffix = "" if name is None else "." + hashlib.sha256(name.encode()).hexdigest()[:16]
        return open_private(f"{self.path}.lock{suffix}", os.O_RDWR)

    @contextlib.contextmanager
    def locked(self, name: str | None = None) -> Iterator[None]:
        """The store's lock, held across a read-modify-write; or server
        ``name``'s, held across what uses its refresh token (a refresh, whose
        POST may take :data:`HTTP_TIMEOUT`: the other servers' go on
        meanwhile). One server's lock, then the store's, never the other
        way. Blocks; a process's locks are let go when it exits, however it
        exits."""
        fd = self.open_lock(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextlib.asynccontextmanager
    async def locked_async(self, name: str | None = None) -> AsyncIterator[None]:
        """:meth:`locked` for a Trio task: it polls, so it can be cancelled."""
        fd = await trio.to_thread.run_sync(self.open_lock, name)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await trio.sleep(LOCK_POLL)
            yield
        finally:
            os.close(fd)


# -- the tokens on every request (the daemon's side) ---------------------------


class AuthorizationNeeded(Exception):
    """A server asks for authorization the broker does not hold."""


class BearerTokens(httpx2.Auth):
    """The stored grant of server ``name`` on every request to it (an
    ``httpx2.Auth``, one per server in a daemon: :meth:`of_server`, so the
    instances of a pool share it). With no grant stored, requests go as they
    are (the server may not ask for any).

    The grant is read from the file once, and again only when it may have
    changed: on a 401 (``mcpbroker auth`` may have run since) and before a
    refresh (another daemon may have refreshed it), so that requests cost no
    file read.

    ``url`` is the server's URL as configured now: a grant whose resource does
    not cover it (the name was pointed at another server since ``mcpbroker
    auth`` ran) is not used, so a token only goes to the server it was granted
    for (RFC 8707).

    Refreshes are one at a time per server: in the daemon under its lock
    (one object for every link of the server), across processes under the
    server's lock in the token store (:meth:`TokenStore.locked_async`, held
    across the POST; the store's own only to write); each reads the file
    first and takes a grant refreshed meanwhile as it is, since refresh
    tokens rotate and a second refresh with the old one would fail (or, on
    an authorization server that detects reuse, revoke the grant)."""

    _shared: ClassVar[weakref.WeakValueDictionary[tuple[str, str, str], BearerTokens]] = (
        weakref.WeakValueDictionary()
    )

    def __init__(
        self,
        name: str,
        store: TokenStore,
        clock: Callable[[], float] = time.time,
        url: str | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.name = name
        self._url = url
        self._store = store
        self._clock = clock
        self._transport = transport  # the token endpoint's (tests give a mock)
        self._lock = trio.Lock()  # one refresh at a time: refresh tokens rotate
        self._grant: Grant | None = None
        self._loaded = False
        self._unreadable = False  # (the token file could not be read: said once)
        self._failing: str | None = None  # why the last refresh failed (logged once)
        self._retry_at = 0.0  # no refresh is asked for before this (clock) time
        self._short_of: set[str | None] = set()  # scopes a 403 asked for (logged)

    @classmethod
    def of_server(cls, name: str, url: str, store: TokenStore) -> BearerTokens:
        """The daemon's one object for server ``name`` at ``url`` (a new one
        once the URL changes), shared by every link to it while one lives."""
        key = (name, url, store.path)
        tokens = cls._shared.get(key)
        if tokens is None:
            tokens = cls._shared[key] = cls(name, store, url=url)
        return tokens

    @classmethod
    def reread(cls, name: str) -> None:
        """Server ``name``'s grant changed in the file (``mcpbroker auth``,
        ``--logout``): each of its objects reads it again at its next request."""
        for tokens in list(cls._shared.values()):
            if tokens.name == name:
                tokens._loaded = False
                tokens._retry_at = 0.0
                tokens._short_of.clear()

    @classmethod
    def wanted_scope(cls, name: str) -> str | None:
        """The scope server ``name`` asked for at run time (a 403
        ``insufficient_scope``) that the grant in use lacks; None if none
        (or its grant is not read yet, or was changed since)."""
        for tokens in list(cls._shared.values()):
            grant = tokens._grant
            if tokens.name == name and tokens._loaded and grant is not None and grant.wanted_scope:
                return grant.wanted_scope
        return None

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        if not self._loaded:
            await self._read()
        grant = self._grant
        if grant is not None and oauth.needs_refresh(grant.tokens, self._clock()):
            grant = await self._refresh(grant) or grant
        if grant is not None:
            request.headers["Authorization"] = f"Bearer {grant.tokens.access_token}"
        response = yield request
        if response.status_code == 401:
            if grant is None or grant.tokens.refresh_token is None:
                again = await self._read()  # (a grant stored since?)
            else:
                again = await self._refresh(grant, force=True)
        elif response.status_code == 403:
            again = await self._short_of_scope(grant, response)
        else:
            return
        if again is not None and again != grant:
            request.headers["Authorization"] = f"Bearer {again.tokens.access_token}"
            yield request

    async def _read(self) -> Grant | None:
        """The stored grant, read again. A token file that cannot be read is
        no grant (logged once): a server that asks for nothing works on, and
        one that does answers 401, for which ``mcpbroker auth NAME`` names the
        file and what to do."""
        try:
            grant = await trio.to_thread.run_sync(self._store.load, self.name)
        except (OAuthError, UnsafePath, OSError) as exc:
            if not self._unreadable:
                log = get_logger(server=self.name)
                log.warning("oauth.token_file_unreadable", path=self._store.path, error=str(exc))
            self._unreadable, grant = True, None
        else:
            self._unreadable = False
        return self._take(grant)

    def _take(self, grant: Grant | None) -> Grant | None:
        if grant is not None and self._url and not oauth.grant_covers(grant.resource, self._url):
            grant = None  # (granted for another server: the 401 says to authorize)
        self._grant = grant
        self._loaded = True
        return grant

    async def _short_of_scope(self, seen: Grant | None, response: httpx2.Response) -> Grant | None:
        """A 403. If it is ``insufficient_scope`` (RFC 6750 section 3.1; the
        MCP spec's step-up): a grant stored since the request went
        (``mcpbroker auth`` ran) is returned, to send the request again;
        else the scope the server asks for is noted beside the grant, where
        the next ``mcpbroker auth`` finds it, and logged once. None: the 403
        stands (the link tells the caller what to run)."""
        challenge = oauth.parse_challenge(response.headers.get("www-authenticate"))
        if challenge.error != oauth.INSUFFICIENT_SCOPE:
            return None
        scope, error = oauth.challenged_scope(challenge), None
        try:
            async with self._lock, self._store.locked_async(self.name):
                grant = await self._read()
                if grant is not None and (seen is None or grant.tokens != seen.tokens):
                    return grant  # (stored since the request went: it goes again)
                if (
                    grant is not None
                    and scope
                    and not oauth.scope_covers(grant.wanted_scope, scope)
                ):
                    wanted = oauth.scope_union(grant.wanted_scope, scope)
                    grant = self._grant = attrs.evolve(grant, wanted_scope=wanted)
                    await trio.to_thread.run_sync(self._store.save_as_holder, self.name, grant)
        except (OAuthError, UnsafePath, OSError) as exc:  # (not noted: said in the log)
            error = str(exc)
        self._tell_short_of(scope, error)
        return None

    def _tell_short_of(self, scope: str | None, error: str | None) -> None:
        """Log a 403 ``insufficient_scope`` once per scope (until the grant is
        read anew: ``mcpbroker auth`` may not have granted it)."""
        if scope in self._short_of:
            return
        if len(self._short_of) >= MAX_SCOPES_TOLD:
            self._short_of.clear()
        self._short_of.add(scope)
        extra = {} if error is None else {"not_noted": error}
        get_logger(server=self.name).warning(
            "oauth.insufficient_scope", scope=scope, hint=f"mcpbroker auth {self.name}", **extra
        )

    def _refresh_failed(self, why: str) -> None:
        """No refresh is asked for again within :data:`REFRESH_BACKOFF` (each
        request would cost a failing one, two with its 401); a new reason is logged."""
        self._retry_at = self._clock() + REFRESH_BACKOFF
        if why != self._failing:
            self._failing = why
            get_logger(server=self.name).warning(
                "oauth.refresh_failed", error=why, retry_after=REFRESH_BACKOFF
            )

    async def _refresh(self, seen: Grant, force: bool = False) -> Grant | None:
        """New tokens for the grant (None if it cannot be refreshed). Under the
        locks, a grant another request refreshed meanwhile is taken as it is."""
        if not force and self._clock() < self._retry_at:
            return None  # (one failed lately: the token as it is, no file read)
        async with self._lock, self._store.locked_async(self.name):
            grant = await self._read()
            if grant is None:
                return None
            if grant.tokens != seen.tokens:
                return grant
            if not force and not oauth.needs_refresh(grant.tokens, self._clock()):
                return grant
            if grant.tokens.refresh_token is None or self._clock() < self._retry_at:
                return None
            body = oauth.refresh_request(grant.client, grant.tokens.refresh_token, grant.resource)
            try:
                async with httpx2.AsyncClient(
                    timeout=HTTP_TIMEOUT, transport=self._transport
                ) as client:
                    answer = await _ask(
                        client,
                        "POST",
                        grant.token_endpoint,
                        data=body,
                        headers=oauth.client_headers(grant.client),
                    )
                tokens = oauth.read_tokens(_json(answer), self._clock(), grant.tokens)
            except OAuthError as exc:
                self._refresh_failed(str(exc))
                return None
            self._failing, self._retry_at = None, 0.0
            grant = self._grant = attrs.evolve(grant, tokens=tokens)
            await trio.to_thread.run_sync(self._store.save_as_holder, self.name, grant)
            return grant


@attrs.frozen
class _Answer:
    """An OAuth party's answer, read whole (it is small: :func:`_ask`)."""

    url: str
    status_code: int
    headers: httpx2.Headers
    content: bytes


async def _ask(client: httpx2.AsyncClient, method: str, url: str, **options: Any) -> _Answer:
    """A request to an authorization server or a server's metadata, its
    answer read up to :data:`MAX_ANSWER` bytes within :data:`HTTP_TIMEOUT`
    (an answer is a few KiB; a longer or slower one is not held: an
    ``OAuthError``, as is a request that fails, naming the address)."""
    shown = shown_url(url)
    try:
        with trio.fail_after(HTTP_TIMEOUT):
            async with client.stream(method, url, **options) as response:
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_ANSWER:
                        raise OAuthError(
                            f"{shown} answered with more than {MAX_ANSWER // 1024} KiB: not read"
                        )
                return _Answer(url, response.status_code, response.headers, bytes(body))
    except trio.TooSlowError:
        raise OAuthError(f"{shown} did not answer within {HTTP_TIMEOUT:g} s") from None
    except (httpx2.HTTPError, httpx2.InvalidURL) as exc:
        raise OAuthError(f"cannot reach {shown} ({_words(exc)})") from None


def _words(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _json(answer: _Answer) -> Any:
    try:
        return orjson.loads(answer.content)
    except orjson.JSONDecodeError:
        raise OAuthError(
            f"{shown_url(answer.url)} answered {answer.status_code} without JSON"
        ) from None


# -- the interactive flow (mcpbroker auth NAME) --------------------------------


class RedirectListener:
    """A loopback HTTP listener that catches the authorization server's
    redirect: one GET to ``/callback`` with the code (h11 over a Trio socket).
    Bound to 127.0.0.1 on ``port`` (0: any free port)."""

    def __init__(self, listener: trio.SocketListener) -> None:
        self._listener = listener
        host, port = listener.socket.getsockname()[:2]
        self.redirect_uri = f"http://{host}:{port}{CALLBACK_PATH}"

    @classmethod
    async def open(cls, port: int = 0) -> RedirectListener:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        return cls(listeners[0])

    async def aclose(self) -> None:
        await self._listener.aclose()

    async def wait_callback(self, state: str | None = None) -> dict[str, str]:
        """The query of the first GET to the callback path that carries
        ``state`` (any, if None). Other requests are answered (404 elsewhere,
        400 to a callback with another state or to what is not HTTP) and
        ignored: any local process may connect, and only the browser's
        answer ends the wait."""
        while True:
            stream = await self._listener.accept()
            async with stream:
                query = await _serve_one(stream, state)
            if query is not None:
                return query


async def _serve_one(stream: trio.abc.Stream, state: str | None) -> dict[str, str] | None:
    connection = h11.Connection(h11.SERVER)
    with trio.move_on_after(10):
        try:
            event = await _request_of(connection, stream)
            if event is None:
                return None
            target = urlsplit(event.target.decode("ascii", "replace"))
            query = dict(parse_qsl(target.query))
            if target.path != CALLBACK_PATH or event.method != b"GET":
                await _answer(connection, stream, 404, b"not found\n")
                return None
            if state is not None and query.get("state") != state:
                await _answer(connection, stream, 400, b"not the answer mcpbroker waits for\n")
                return None
            await _answer(
                connection, stream, 200, b"mcpbroker has the answer; you may close this window.\n"
            )
            return query
        except h11.RemoteProtocolError:
            with contextlib.suppress(h11.LocalProtocolError, trio.BrokenResourceError):
                await _answer(connection, stream, 400, b"bad request\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # (the other side went away)
    return None


async def _request_of(connection: h11.Connection, stream: trio.abc.Stream) -> h11.Request | None:
    """The request's head (None: the connection ended first)."""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            connection.receive_data(bytes(data))
            if not data:
                return None
            continue
        return event if isinstance(event, h11.Request) else None


async def _answer(
    connection: h11.Connection, stream: trio.abc.Stream, status: int, text: bytes
) -> None:
    headers = [("content-type", "text/plain"), ("content-length", str(len(text)))]
    for message in (
        h11.Response(status_code=status, headers=headers),
        h11.Data(data=text),
        h11.EndOfMessage(),
    ):
        await stream.send_all(connection.send(message) or b"")


@attrs.frozen
class Settings:
    """What the config says of a server's authorization (its ``oauth`` key)."""

    client_id: str | None = None
    client_secret: str | None = None
    scope: str | None = None
    redirect_port: int = 0


PROBE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": oauth.CLIENT_NAME, "version": "auth"},
    },
}


async def authorize(
    name: str,
    server_url: str,
    headers: dict[str, str],
    store: TokenStore,
    show: Callable[[str], Any],
    settings: Settings | None = None,
    clock: Callable[[], float] = time.time,
    tell: Callable[[str], Any] = lambda _: None,
) -> Grant | None:
    """Run the authorization flow for server ``name`` and store its grant;
    ``show`` is given the URL the user must open, ``tell`` what else the
    user should know (a step-up's scope). None if the server does not ask
    for authorization. An :class:`OAuthError` says what went wrong."""
    settings = settings or Settings()
    async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT, follow_redirects=True) as client:
        challenge = await _probe(client, server_url, headers)
        if challenge is None:
            return None
        resource = await _resource_metadata(client, server_url, challenge)
        server = await _server_metadata(client, resource.authorization_servers[0])
        listener = await RedirectListener.open(settings.redirect_port)
        try:
            registration = await _client(client, name, server, store, settings, listener)
            state, verifier = secrets.token_urlsafe(24), secrets.token_urlsafe(48)
            scope = await _scope(name, server_url, store, settings, challenge, resource, tell)
            show(
                oauth.authorization_url(
                    server,
                    registration,
                    listener.redirect_uri,
                    state=state,
                    verifier=verifier,
                    resource=resource.resource,
                    scope=scope,
                )
            )
            with trio.fail_after(AUTHORIZE_TIMEOUT):
                query = await listener.wait_callback(state)
        except trio.TooSlowError:
            raise OAuthError(
                f"no answer from the browser within {AUTHORIZE_TIMEOUT:.0f} s"
            ) from None
        finally:
            await listener.aclose()
        code = oauth.read_callback(query, state, server)
        body = oauth.code_request(
            registration, code, listener.redirect_uri, verifier, resource.resource
        )
        headers = oauth.client_headers(registration)
        answer = await _ask(client, "POST", server.token_endpoint, data=body, headers=headers)
        tokens = oauth.read_tokens(_json(answer), clock())
    grant = Grant(
        server_url, resource.resource, server.token_endpoint, registration, tokens, server.issuer
    )
    await trio.to_thread.run_sync(store.save, name, grant)
    return grant


async def _scope(
    name: str,
    server_url: str,
    store: TokenStore,
    settings: Settings,
    challenge: Challenge,
    resource: oauth.ResourceMetadata,
    tell: Callable[[str], Any],
) -> str | None:
    """The scope to ask for: ``oauth.scope``, else the spec's choice; with a
    step-up (the stored grant notes a scope the server asked for at run
    time), the union of that, the scope granted before and the challenged
    one (:func:`oauth.step_up_scope`), which ``tell`` says."""
    asked = settings.scope or oauth.choose_scope(challenge, resource)
    known = await trio.to_thread.run_sync(store.load, name)
    if (
        known is None
        or not known.wanted_scope
        or not oauth.grant_covers(known.resource, server_url)
    ):
        return asked
    scope = oauth.step_up_scope(asked, known.tokens.scope, known.wanted_scope)
    tell(
        f"{name!r} asked for scope {known.wanted_scope!r} at run time (403 insufficient_scope): "
        f"asking for {scope!r}, with the scope granted before"
    )
    return scope


def step_up_hint(name: str, scope: str) -> str:
    """What ``mcpbroker status`` says of a server that asked for more scope
    than its grant has."""
    return (
        f"needs more authorization: it asked for scope {scope!r} (403 insufficient_scope): "
        f"run `mcpbroker auth {name}`"
    )


class NoRevocation(OAuthError):
    """The grant's tokens cannot be revoked: its authorization server offers no
    revocation endpoint, or the grant does not name that server."""


async def revoke(grant: Grant, transport: httpx2.AsyncBaseTransport | None = None) -> str:
    """Revoke ``grant``'s tokens at its authorization server (RFC 7009): the
    refresh token first (at most servers that revokes what was issued with
    it), then the access token. Returns the endpoint used; an
    :class:`OAuthError` says why they are not revoked (:class:`NoRevocation`:
    they cannot be)."""
    if grant.issuer is None:
        raise NoRevocation("the grant does not name its authorization server")
    async with httpx2.AsyncClient(
        timeout=HTTP_TIMEOUT, follow_redirects=True, transport=transport
    ) as client:
        server = await _server_metadata(client, grant.issuer)
        endpoint = server.revocation_endpoint
        if endpoint is None:
            raise NoRevocation(f"the authorization server {grant.issuer} offers no revocation")
        tokens = grant.tokens
        for token, hint in (
            (tokens.refresh_token, "refresh_token"),
            (tokens.access_token, "access_token"),
        ):
            if token is None:
                continue
            body = oauth.revocation_request(grant.client, token, hint)
            headers = oauth.client_headers(grant.client)
            # (not redirected: a 307 would send the token and the client's
            # secret on, in the form, to wherever it points)
            answer = await _ask(
                client, "POST", endpoint, data=body, headers=headers, follow_redirects=False
            )
            if answer.status_code != 200:  # (an unknown token is 200 too: RFC 7009, 2.2)
                said = answer.content[:200].decode(errors="replace")
                raise OAuthError(
                    f"{shown_url(endpoint)} refused to revoke the {hint.replace('_', ' ')} "
                    f"({answer.status_code}: {said})"
                )
    return shown_url(endpoint)


async def _probe(client: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> Challenge | None:
    """Whether the server asks for authorization: its challenge, or None.
    (Only the head of its answer is read: a server that asks nothing may
    answer with a stream.)"""
    try:
        with trio.fail_after(HTTP_TIMEOUT):
            async with client.stream(
                "POST",
                url,
                json=PROBE,
                headers={**headers, "Accept": "application/json, text/event-stream"},
            ) as response:
                status, challenge = response.status_code, response.headers.get("www-authenticate")
    except trio.TooSlowError:
        raise OAuthError(f"{shown_url(url)} did not answer within {HTTP_TIMEOUT:g} s") from None
    except (httpx2.HTTPError, httpx2.InvalidURL) as exc:
        raise OAuthError(f"cannot reach {shown_url(url)} ({_words(exc)})") from None
    if status != 401:
        return None
    return oauth.parse_challenge(challenge)


async def _resource_metadata(
    client: httpx2.AsyncClient, server_url: str, challenge: Challenge
) -> oauth.ResourceMetadata:
    for url in oauth.resource_metadata_urls(server_url, challenge):
        response = await _ask(client, "GET", url)
        if response.status_code == 200:
            return oauth.read_resource_metadata(_json(response), server_url)
    raise OAuthError(f"{server_url} asks for authorization but publishes no resource metadata")


async def _server_metadata(client: httpx2.AsyncClient, issuer: str) -> ServerMetadata:
    for url in oauth.server_metadata_urls(issuer):
        response = await _ask(client, "GET", url)
        if response.status_code == 200:
            return oauth.read_server_metadata(_json(response), issuer)
    raise OAuthError(f"the authorization server {issuer} publishes no metadata")


async def _client(
    client: httpx2.AsyncClient,
    name: str,
    server: ServerMetadata,
    store: TokenStore,
    settings: Settings,
    listener: RedirectListener,
) -> Client:
    """The client id to use: the configured one, the one registered before with
    this authorization server for this redirect, or a new registration."""
    if settings.client_id:
        method = oauth.secret_method(server.auth_methods)
        return Client(settings.client_id, settings.client_secret, listener.redirect_uri, method)
    known = await trio.to_thread.run_sync(store.load, name)
    if (
        known is not None
        and known.issuer == server.issuer
        and known.client.redirect_uri == listener.redirect_uri
    ):
        return known.client
    if server.registration_endpoint is None:
        raise OAuthError(
            f"the authorization server {server.issuer} offers no client registration: "
            f'register a client there and give its id as "oauth": {{"clientId": ...}} '
            f"in server {name!r}'s config"
        )
    asked = oauth.registration_request(server, listener.redirect_uri)
    response = await _ask(client, "POST", server.registration_endpoint, json=asked)
    if response.status_code not in (200, 201):
        said = response.content[:200].decode(errors="replace")
        raise OAuthError(
            f"the authorization server refused to register the broker ({response.status_code}: "
            f"{said})"
        )
    method = asked["token_endpoint_auth_method"]
    return oauth.read_registration(_json(response), listener.redirect_uri, method)
