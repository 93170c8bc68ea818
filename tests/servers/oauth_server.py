"""An MCP server over Streamable HTTP that asks for OAuth, with its own
authorization server, for the tests of ``mcpbroker auth`` and of tokens on
the HTTP link. Built on the official SDK's server-side auth (discovery,
dynamic registration, PKCE, tokens, refresh, bearer checks); the provider
below approves every authorization at once, as a user clicking "allow"
would.

    python -m tests.servers.oauth_server PORT [ACCESS_TOKEN_SECONDS]

Tools: ``whoami`` (the client id the token was issued to) and ``echo``.
Every token issued is logged to stderr as ``issued <kind> <token>``, every
token revoked as ``revoked <token>``.
"""

from __future__ import annotations

import secrets
import sys
import time
from typing import Any

import anyio
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


def build(port: int, access_seconds: int) -> MCPServer[Any]:
    base = f"http://127.0.0.1:{port}"
    provider = Provider(access_seconds)
    server: MCPServer[Any] = MCPServer(
        "oauth-test-server",
        auth_server_provider=provider,
        auth=AuthSettings(
            issuer_url=base,  # type: ignore[arg-type]
            resource_server_url=f"{base}/mcp",  # type: ignore[arg-type]
            client_registration_options=ClientRegistrationOptions(
                enabled=True, valid_scopes=[SCOPE], default_scopes=[SCOPE]
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

    return server


def main() -> None:
    port = int(sys.argv[1])
    access_seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 3600
    server = build(port, access_seconds)
    anyio.run(lambda: server.run_streamable_http_async(port=port))  # (uvicorn: asyncio)


if __name__ == "__main__":
    main()
