"""An MCP server over Streamable HTTP that asks for OAuth, with its own
authorization server, for the tests of ``mcpbroker auth`` and of tokens on
the HTTP link. Built on the official SDK's server-side auth (discovery,
dynamic registration, PKCE, tokens, refresh, bearer checks); the provider
below approves every authorization at once, as a user clicking "allow"
would.

    python -m tests.servers.oauth_server PORT [ACCESS_TOKEN_SECONDS] [--step-up]

Tools: ``whoami`` (the client id the token was issued to) and ``echo``.
Every token issued is logged to stderr as ``issued <kind> <token>``, every
token revoked as ``revoked <token>``.

``--step-up``: a client may also be granted ``mcp:write`` (the first
authorization asks for ``mcp:tools``, the scope the resource metadata
lists), and a call of the tool ``write`` with a token that lacks it is
answered ``403`` with ``WWW-Authenticate: Bearer error="insufficient_scope",
scope="mcp:write"`` (the MCP spec's scope challenge, naming only the scope
that is missing, so a client that asks for it alone loses ``mcp:tools``).
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from typing import Any

import anyio
import uvicorn
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

SCOPE = "mcp:tools"
WRITE = "mcp:write"  # (--step-up: what the tool "write" needs)


class Provider:
    """An in-memory authorization server that says yes to everyone."""

    def __init__(self, access_seconds: int) -> None:
        self.access_seconds = access_seconds
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        code = secrets.token_urlsafe(32)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [SCOPE],
            expires_at=time.time() + 300,
            client_id=client.client_id or "",
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        return self._issue(
            client.client_id or "", authorization_code.scopes, authorization_code.resource
        )

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        if self.refresh.pop(refresh_token.token, None) is None:  # (rotated: once only)
            raise TokenError("invalid_grant", "refresh token already used")
        return self._issue(
            client.client_id or "", scopes or refresh_token.scopes, refresh_token.resource
        )

    async def load_access_token(self, token: str) -> AccessToken | None:
        access = self.access.get(token)
        if access is None or (access.expires_at is not None and access.expires_at < time.time()):
            return None
        return access

    async def revoke_token(self, token: Any) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)
        print(f"revoked {token.token}", file=sys.stderr, flush=True)

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access, refresh = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        expires = int(time.time()) + self.access_seconds
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires, resource=resource
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource
        )
        print(f"issued access {access} resource {resource}", file=sys.stderr, flush=True)
        return OAuthToken(
            access_token=access,
            expires_in=self.access_seconds,
            scope=" ".join(scopes),
            refresh_token=refresh,
        )


class StepUp:
    """ASGI: a call of the tool ``write`` whose token lacks :data:`WRITE` is
    answered 403 ``insufficient_scope`` before the SDK's app sees it."""

    def __init__(self, app: Any, provider: Provider, metadata: str) -> None:
        self.app, self.provider, self.metadata = app, provider, metadata

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages, body = [], b""
        while True:
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        token = dict(scope["headers"]).get(b"authorization", b"").decode()
        access = self.provider.access.get(token.removeprefix("Bearer "))
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        calls_write = (
            isinstance(request, dict)
            and request.get("method") == "tools/call"
            and request.get("params", {}).get("name") == "write"
        )
        if calls_write and access is not None and WRITE not in access.scopes:
            challenge = (
                f'Bearer error="insufficient_scope", scope="{WRITE}", '
                f'resource_metadata="{self.metadata}", error_description="write needs {WRITE}"'
            )
            answer = json.dumps({"error": "insufficient_scope"}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 403,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(answer)).encode()),
                        (b"www-authenticate", challenge.encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": answer})
            return
        pending = iter(messages)

        async def replay() -> Any:
            return next(pending, None) or await receive()

        await self.app(scope, replay, send)


def build(port: int, provider: Provider, step_up: bool = False) -> MCPServer[Any]:
    base = f"http://127.0.0.1:{port}"
    scopes = [SCOPE, WRITE] if step_up else [SCOPE]
    server: MCPServer[Any] = MCPServer(
        "oauth-test-server",
        auth_server_provider=provider,
        auth=AuthSettings(
            issuer_url=base,  # type: ignore[arg-type]
            resource_server_url=f"{base}/mcp",  # type: ignore[arg-type]
            client_registration_options=ClientRegistrationOptions(
                enabled=True, valid_scopes=scopes, default_scopes=scopes
            ),
            revocation_options=RevocationOptions(enabled=True),
            required_scopes=[SCOPE],
            validate_token_resource=True,
        ),
    )

    @server.tool()
    def echo(text: str) -> str:
        return text

    @server.tool()
    def whoami() -> str:
        from mcp.server.auth.middleware.auth_context import get_access_token

        token = get_access_token()
        return token.client_id if token is not None else "nobody"

    if step_up:

        @server.tool()
        def write(text: str) -> str:
            return f"wrote {text}"

    return server


def main() -> None:
    args = [arg for arg in sys.argv[1:] if arg != "--step-up"]
    port = int(args[0])
    access_seconds = int(args[1]) if len(args) > 1 else 3600
    provider = Provider(access_seconds)
    server = build(port, provider, step_up="--step-up" in sys.argv)
    if "--step-up" not in sys.argv:
        anyio.run(lambda: server.run_streamable_http_async(port=port))  # (uvicorn: asyncio)
        return
    metadata = f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp"
    app = StepUp(server.streamable_http_app(), provider, metadata)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    anyio.run(uvicorn.Server(config).serve)


if __name__ == "__main__":
    main()
