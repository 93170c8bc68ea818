"""The OAuth rules (broker/oauth.py): discovery URLs, metadata checks, the
authorization URL, token answers and when to refresh. No event loop."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker import oauth
from broker.oauth import Challenge, Client, OAuthError, ServerMetadata, Tokens

SERVER = ServerMetadata(
    "https://as.example", "https://as.example/authorize", "https://as.example/token"
)


def test_challenge_parameters_quoted_or_bare() -> None:
    header = (
        'Bearer error="invalid_token", error_description="Authentication required", '
        'resource_metadata="https://mcp.example/.well-known/oauth-protected-resource/mcp", '
        "scope=files:read"
    )
    assert oauth.parse_challenge(header) == Challenge(
        "https://mcp.example/.well-known/oauth-protected-resource/mcp",
        "files:read",
        "invalid_token",
    )


@pytest.mark.parametrize("header", [None, "", "Basic realm=x", "Bearer"])
def test_no_bearer_challenge(header: str | None) -> None:
    assert oauth.parse_challenge(header) == Challenge()


def test_escaped_quotes_in_a_challenge() -> None:
    assert oauth.parse_challenge(r'Bearer scope="a \"b\""').scope == 'a "b"'


def test_resource_metadata_from_the_challenge_first() -> None:
    challenge = Challenge(resource_metadata="https://x/meta")
    assert oauth.resource_metadata_urls("https://mcp.example/mcp", challenge) == ["https://x/meta"]


def test_resource_metadata_well_known_path_then_root() -> None:
    assert oauth.resource_metadata_urls("https://mcp.example/public/mcp/", Challenge()) == [
        "https://mcp.example/.well-known/oauth-protected-resource/public/mcp",
        "https://mcp.example/.well-known/oauth-protected-resource",
    ]
    assert oauth.resource_metadata_urls("https://mcp.example", Challenge()) == [
        "https://mcp.example/.well-known/oauth-protected-resource"
    ]


def test_server_metadata_urls_in_the_spec_order() -> None:
    assert oauth.server_metadata_urls("https://auth.example/tenant1") == [
        "https://auth.example/.well-known/oauth-authorization-server/tenant1",
        "https://auth.example/.well-known/openid-configuration/tenant1",
        "https://auth.example/tenant1/.well-known/openid-configuration",
    ]
    assert oauth.server_metadata_urls("https://auth.example/") == [
        "https://auth.example/.well-known/oauth-authorization-server",
        "https://auth.example/.well-known/openid-configuration",
    ]


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("HTTPS://MCP.Example.com/mcp/", "https://mcp.example.com/mcp"),
        ("https://mcp.example.com/", "https://mcp.example.com"),
        ("https://mcp.example.com/mcp#frag", "https://mcp.example.com/mcp"),
    ],
)
def test_canonical_resource(url: str, canonical: str) -> None:
    assert oauth.canonical_resource(url) == canonical


def test_resource_metadata_must_name_this_server() -> None:
    body = {"resource": "https://mcp.example/mcp", "authorization_servers": ["https://as"]}
    assert oauth.read_resource_metadata(body, "https://mcp.example/mcp").resource == (
        "https://mcp.example/mcp"
    )
    with pytest.raises(OAuthError, match=r"not https://mcp\.example/mcp"):
        oauth.read_resource_metadata(
            {**body, "resource": "https://evil.example/mcp"}, "https://mcp.example/mcp"
        )
    with pytest.raises(OAuthError, match="no authorization server"):
        oauth.read_resource_metadata(
            {"resource": "https://mcp.example/mcp"}, "https://mcp.example/mcp"
        )


def test_a_prefix_resource_covers_the_server() -> None:
    body = {"resource": "https://mcp.example", "authorization_servers": ["https://as"]}
    assert oauth.read_resource_metadata(body, "https://mcp.example/mcp").resource == (
        "https://mcp.example"
    )
    with pytest.raises(OAuthError):  # not a path prefix: /mcpx is not under /mc
        oauth.read_resource_metadata(
            {**body, "resource": "https://mcp.example/mc"}, "https://mcp.example/mcpx"
        )


def test_server_metadata_needs_pkce_s256() -> None:
    body = {
        "issuer": "https://as",
        "authorization_endpoint": "https://as/a",
        "token_endpoint": "https://as/t",
        "code_challenge_methods_supported": ["S256"],
        "registration_endpoint": "https://as/r",
        "token_endpoint_auth_methods_supported": ["client_secret_post"],
    }
    metadata = oauth.read_server_metadata(body, "https://as")
    assert metadata.registration_endpoint == "https://as/r"
    assert not metadata.iss_supported
    assert (
        oauth.registration_request(metadata, "http://127.0.0.1:1/callback")[
            "token_endpoint_auth_method"
        ]
        == "client_secret_post"
    )
    for methods in (None, ["plain"]):
        with pytest.raises(OAuthError, match="PKCE"):
            oauth.read_server_metadata(
                {**body, "code_challenge_methods_supported": methods}, "https://as"
            )
    with pytest.raises(OAuthError, match="token_endpoint"):
        oauth.read_server_metadata(
            {k: v for k, v in body.items() if k != "token_endpoint"}, "https://as"
        )
    # The issuer it names must be the one its address was made from, exactly.
    for other in ("https://attacker", "https://as/", "HTTPS://as"):
        with pytest.raises(OAuthError, match="RFC 8414"):
            oauth.read_server_metadata(body, other)
    flagged = {**body, "authorization_response_iss_parameter_supported": True}
    assert oauth.read_server_metadata(flagged, "https://as").iss_supported


def test_registration_is_native_and_sends_its_secret_as_the_server_takes_it() -> None:
    """application_type "native" (MCP 2026-07-28: a client MUST say); a
    secret in the form unless the server takes only HTTP Basic."""
    for methods, asked in (
        (None, "none"),
        (("none", "client_secret_basic"), "none"),
        (("client_secret_post", "client_secret_basic"), "client_secret_post"),
        (("client_secret_basic",), "client_secret_basic"),
        (("private_key_jwt",), "client_secret_post"),
    ):
        server = attrs.evolve(SERVER, auth_methods=methods)
        body = oauth.registration_request(server, "http://127.0.0.1:1/callback")
        assert body["application_type"] == "native"
        assert body["token_endpoint_auth_method"] == asked
    answer = {"client_id": "a b", "client_secret": "s:é"}
    basic = oauth.read_registration(answer, "http://r", "client_secret_basic")
    assert basic.auth_method == "client_secret_basic"
    assert oauth.code_request(basic, "c", "http://r", "v", "https://res") == {
        "grant_type": "authorization_code",
        "code": "c",
        "redirect_uri": "http://r",
        "code_verifier": "v",
        "resource": "https://res",
    }
    # RFC 6749 2.3.1: each form-encoded, then base64 of "id:secret".
    assert oauth.client_headers(basic) == {"Authorization": "Basic YStiOnMlM0ElQzMlQTk="}
    posted = {**answer, "token_endpoint_auth_method": "client_secret_post"}
    granted = oauth.read_registration(posted, "http://r", "client_secret_basic")
    assert granted.auth_method == "client_secret_post" and oauth.client_headers(granted) == {}


def test_public_client_where_the_server_allows_it() -> None:
    assert (
        oauth.registration_request(SERVER, "http://127.0.0.1:1/callback")[
            "token_endpoint_auth_method"
        ]
        == "none"
    )


def test_authorization_url_carries_pkce_state_and_resource() -> None:
    url = oauth.authorization_url(
        SERVER,
        Client("id-1"),
        "http://127.0.0.1:5555/callback",
        state="st",
        verifier="v" * 43,
        resource="https://mcp.example/mcp",
        scope="a b",
    )
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert url.startswith("https://as.example/authorize?")
    assert query == {
        "response_type": "code",
        "client_id": "id-1",
        "redirect_uri": "http://127.0.0.1:5555/callback",
        "state": "st",
        "code_challenge": oauth.pkce_challenge("v" * 43),
        "code_challenge_method": "S256",
        "resource": "https://mcp.example/mcp",
        "scope": "a b",
    }


def test_pkce_challenge_of_rfc7636_appendix_b() -> None:
    verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    assert oauth.pkce_challenge(verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_scope_from_the_challenge_else_the_metadata() -> None:
    metadata = oauth.ResourceMetadata("https://r", ("https://as",), ("a", "b"))
    assert oauth.choose_scope(Challenge(scope="x"), metadata) == "x"
    assert oauth.choose_scope(Challenge(), metadata) == "a b"
    assert oauth.choose_scope(Challenge(), oauth.ResourceMetadata("https://r", ("s",))) is None


def test_the_scope_a_run_time_challenge_asks_for() -> None:
    """A 403 insufficient_scope names the scope its request needs (RFC 6750
    section 3.1); anything else, or a scope that is not one, names none."""
    header = 'Bearer error="insufficient_scope", scope="files:read  files:write"'
    assert oauth.challenged_scope(oauth.parse_challenge(header)) == "files:read files:write"
    for challenge in (
        Challenge(scope="files:write"),  # (no error: a 401's scope guidance)
        Challenge(scope="files:write", error="invalid_token"),
        Challenge(error="insufficient_scope"),  # (names none)
        Challenge(scope='a "b"', error="insufficient_scope"),  # (not scope-tokens)
        Challenge(scope="a\\b", error="insufficient_scope"),
        Challenge(scope="x" * (oauth.MAX_SCOPE + 1), error="insufficient_scope"),
    ):
        assert oauth.challenged_scope(challenge) is None, challenge


def test_a_step_up_asks_for_the_union() -> None:
    """What was asked or granted before, then what the server asked for, each
    once; no step-up: what is asked as before."""
    assert oauth.step_up_scope("mcp:tools", None, None) == "mcp:tools"
    assert oauth.step_up_scope(None, None, None) is None
    assert oauth.step_up_scope("a b", "b c", "d a") == "a b c d"
    assert oauth.step_up_scope(None, None, "w") == "w"
    assert oauth.scope_covers("a b", "b a") and not oauth.scope_covers("a", "a b")
    assert oauth.scope_covers(None, "") and not oauth.scope_covers(None, "a")


def test_a_union_past_the_bound_is_the_challenged_scope() -> None:
    """(A server naming new scopes at every call grows no union without bound.)"""
    many = " ".join(f"s{i}" for i in range(oauth.MAX_SCOPE // 3))
    assert oauth.scope_union(many, "w") == "w"
    assert oauth.scope_union("a", "w") == "a w"


def test_callback_checks_state_and_errors() -> None:
    assert oauth.read_callback({"code": "c", "state": "s"}, "s", SERVER) == "c"
    with pytest.raises(OAuthError, match="state"):
        oauth.read_callback({"code": "c", "state": "other"}, "s", SERVER)
    with pytest.raises(OAuthError, match="access_denied"):
        oauth.read_callback({"error": "access_denied", "state": "s"}, "s", SERVER)


def test_callback_checks_the_issuer_as_rfc_9207_says() -> None:
    """Present: the issuer exactly (no normalization); absent: refused only
    where the server says it always sends one; checked on an error too."""
    said = attrs.evolve(SERVER, iss_supported=True)
    issuer = SERVER.issuer
    for server in (SERVER, said):
        assert oauth.read_callback({"code": "c", "state": "s", "iss": issuer}, "s", server) == "c"
        for wrong in ("https://evil.example", issuer + "/", issuer.upper(), issuer + ":443"):
            with pytest.raises(OAuthError, match="RFC 9207"):
                oauth.read_callback({"code": "c", "state": "s", "iss": wrong}, "s", server)
        with pytest.raises(OAuthError, match="RFC 9207"):
            oauth.read_callback({"error": "access_denied", "state": "s", "iss": "x"}, "s", server)
    assert oauth.read_callback({"code": "c", "state": "s"}, "s", SERVER) == "c"
    with pytest.raises(OAuthError, match="names no issuer"):
        oauth.read_callback({"code": "c", "state": "s"}, "s", said)


def test_token_requests_name_the_resource() -> None:
    client = Client("id", "secret")
    assert oauth.code_request(client, "c", "http://r", "v", "https://res") == {
        "grant_type": "authorization_code",
        "code": "c",
        "redirect_uri": "http://r",
        "code_verifier": "v",
        "resource": "https://res",
        "client_id": "id",
        "client_secret": "secret",
    }
    assert oauth.refresh_request(Client("id"), "rt", "https://res") == {
        "grant_type": "refresh_token",
        "refresh_token": "rt",
        "resource": "https://res",
        "client_id": "id",
    }


def test_tokens_and_expiry() -> None:
    tokens = oauth.read_tokens(
        {"access_token": "a", "token_type": "bearer", "expires_in": 120, "refresh_token": "r"},
        1000.0,
    )
    assert tokens == Tokens("a", "r", 1120.0, issued_at=1000.0)
    assert not oauth.needs_refresh(tokens, 1000.0)
    assert oauth.needs_refresh(tokens, 1060.0)
    # A refresh answer without a new refresh token keeps the old one.
    assert oauth.read_tokens({"access_token": "b"}, 0.0, tokens) == Tokens("b", "r", None, None, 0)
    assert not oauth.needs_refresh(Tokens("b"), 1e12)


@pytest.mark.parametrize(
    "body",
    [
        {"error": "invalid_grant"},
        {"token_type": "bearer"},
        {"access_token": "a", "token_type": "mac"},
        ["access_token"],
    ],
)
def test_token_answers_refused(body: object) -> None:
    with pytest.raises(OAuthError):
        oauth.read_tokens(body, 0.0)


@given(st.text(max_size=200))
def test_any_challenge_header_parses(header: str) -> None:
    assert isinstance(oauth.parse_challenge(header), Challenge)


@pytest.mark.parametrize(
    ("url", "covered"),
    [
        ("https://mcp.example/mcp", True),
        ("HTTPS://MCP.EXAMPLE/mcp/", True),
        ("https://mcp.example/mcp/sub?key=secret", True),
        ("https://mcp.example/mcpx", False),
        ("https://mcp.example:8443/mcp", False),
        ("http://mcp.example/mcp", False),
        ("https://other.example/mcp", False),
    ],
)
def test_a_grant_covers_its_resource_and_paths_under_it(url: str, covered: bool) -> None:
    assert oauth.grant_covers("https://mcp.example/mcp", url) is covered


@pytest.mark.parametrize("token", ["AT\r\nX-Evil: 1", "A T", "Jürgen", "AT\r"])
def test_an_access_token_a_header_cannot_carry_is_refused(token: str) -> None:
    with pytest.raises(OAuthError, match="header"):
        oauth.read_tokens({"access_token": token}, 0.0)


METADATA = {
    "issuer": "https://as.example",
    "authorization_endpoint": "https://as.example/a",
    "token_endpoint": "https://as.example/t",
    "registration_endpoint": "https://as.example/r",
    "revocation_endpoint": "https://as.example/v",
    "code_challenge_methods_supported": ["S256"],
}


@pytest.mark.parametrize(
    "key",
    [
        "issuer",
        "authorization_endpoint",
        "token_endpoint",
        "registration_endpoint",
        "revocation_endpoint",
    ],
)
def test_authorization_server_endpoints_must_be_https(key: str) -> None:
    """The MCP spec's Communication Security: every authorization server
    endpoint over HTTPS; http:// only to a loopback host (never leaves the machine)."""
    body = {**METADATA, key: METADATA[key].replace("https://", "http://")}
    with pytest.raises(OAuthError, match=f"{key}.*not an https://"):
        oauth.read_server_metadata(body, body["issuer"])
    local = {
        key: value.replace("https://as.example", "http://127.0.0.1:9000")
        for key, value in METADATA.items()
        if isinstance(value, str)
    }
    assert oauth.read_server_metadata({**METADATA, **local}, local["issuer"]).token_endpoint == (
        "http://127.0.0.1:9000/t"
    )


def test_the_revocation_endpoint_and_its_request() -> None:
    """RFC 7009: the endpoint from the metadata (none: None), and a form with
    the token, its kind, and the client proved as at the token endpoint."""
    assert oauth.read_server_metadata(METADATA, METADATA["issuer"]).revocation_endpoint == (
        "https://as.example/v"
    )
    without = {key: value for key, value in METADATA.items() if key != "revocation_endpoint"}
    assert oauth.read_server_metadata(without, METADATA["issuer"]).revocation_endpoint is None
    public = Client("id", None, "http://127.0.0.1:1/cb")
    assert oauth.revocation_request(public, "t", "refresh_token") == {
        "token": "t",
        "token_type_hint": "refresh_token",
        "client_id": "id",
    }
    basic = Client("id", "secret", "http://127.0.0.1:1/cb", oauth.BASIC)
    assert oauth.revocation_request(basic, "t", "access_token") == {
        "token": "t",
        "token_type_hint": "access_token",
    }
    assert oauth.client_headers(basic)["Authorization"].startswith("Basic ")


def test_a_cleartext_authorization_server_is_not_asked() -> None:
    body = {"resource": RESOURCE_URL, "authorization_servers": ["http://as.example"]}
    with pytest.raises(OAuthError, match="not an https://"):
        oauth.read_resource_metadata(body, RESOURCE_URL)
    body["authorization_servers"] = ["http://as.example", "https://as.example", "javascript:x"]
    assert oauth.read_resource_metadata(body, RESOURCE_URL).authorization_servers == (
        "https://as.example",
    )


@pytest.mark.parametrize(
    "url",
    ["http://localhost:8080/t", "http://127.0.0.1/t", "http://[::1]:9/t", "https://as.example/t"],
)
def test_loopback_and_https_endpoints_are_taken(url: str) -> None:
    assert oauth.secure_endpoint(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://as.example/t",
        "http://localhost.evil.example/t",
        "http://127.0.0.1.evil/t",
        "ftp://x",
    ],
)
def test_other_endpoints_are_not(url: str) -> None:
    assert not oauth.secure_endpoint(url)


RESOURCE_URL = "https://mcp.example/mcp"


@pytest.mark.parametrize(
    "header",
    [
        'Basic realm="api", Bearer resource_metadata="https://x/meta", scope="a b"',
        'DPoP algs="ES256", Bearer resource_metadata="https://x/meta", scope="a b"',
        # two WWW-Authenticate fields, joined by httpx; a comma in a quoted value
        'Negotiate YWJj==, Bearer\tscope="a b", resource_metadata="https://x/meta"',
    ],
)
def test_the_bearer_challenge_among_others(header: str) -> None:
    """RFC 9110 section 11.6.1: a WWW-Authenticate may list several challenges."""
    assert oauth.parse_challenge(header) == Challenge("https://x/meta", "a b")


def test_a_comma_in_a_quoted_value_does_not_split_it() -> None:
    challenge = oauth.parse_challenge('Bearer scope="a, b", error=invalid_token')
    assert challenge == Challenge(None, "a, b", "invalid_token")


def test_a_short_lived_token_is_refreshed_at_half_its_life() -> None:
    """A token granted for 30 s (under REFRESH_MARGIN) is used for 15 s, not
    refreshed before every request."""
    tokens = oauth.read_tokens({"access_token": "a", "expires_in": 30}, 1000.0)
    assert not oauth.needs_refresh(tokens, 1000.0)
    assert not oauth.needs_refresh(tokens, 1014.0)
    assert oauth.needs_refresh(tokens, 1015.0)
    # (one stored before its lifetime was kept: the fixed margin)
    assert oauth.needs_refresh(Tokens("a", expires_at=1030.0), 1000.0)
