"""OAuth 2.1 for remote servers: the rules of the flow, no I/O.

A remote MCP server may answer 401 with a ``WWW-Authenticate: Bearer
resource_metadata="...", scope="..."`` challenge. The MCP authorization spec
(2025-11-25, basic/authorization) then has the client:

1. find the server's Protected Resource Metadata (RFC 9728): the URL in the
   challenge, else ``/.well-known/oauth-protected-resource/<path>``, else
   the same at the root (:func:`resource_metadata_urls`);
2. take an authorization server from it and find that server's metadata
   (RFC 8414, then OpenID Connect discovery; :func:`server_metadata_urls`),
   which must offer PKCE with S256 (:func:`read_server_metadata`);
3. use a client id: one configured, one registered earlier, or one obtained
   by dynamic client registration (RFC 7591; :func:`registration_request`);
4. send the user to the authorization endpoint with PKCE, a state, the
   scopes (the challenge's, else the metadata's ``scopes_supported``) and
   the ``resource`` (RFC 8707) naming the server (:func:`authorization_url`);
5. exchange the code for tokens, and later refresh them before they expire
   (:func:`code_request`, :func:`refresh_request`, :func:`read_tokens`,
   :func:`needs_refresh`).

Each step's I/O is done by the caller (``actors/oauth.py``); what to ask for
and what an answer means is decided here. Client ID Metadata Documents are
not used: they need an HTTPS URL the broker does not have.
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any
from urllib.parse import quote_plus, urlencode, urlsplit, urlunsplit

import attrs

# Refresh this long before an access token expires, so no request carries a
# token that lapses on its way; at most half the token's lifetime, so a token
# granted for 30 s is not refreshed before every request (needs_refresh).
REFRESH_MARGIN = 60.0

# An access token as a header carries it: visible ASCII (RFC 6749 appendix A.12).
_TOKEN = re.compile(r"[\x21-\x7e]+")
_PARAM = re.compile(r'([A-Za-z_][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')
_PARAM_START = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\s*=")


class OAuthError(Exception):
    """The flow cannot go on; the message says why, for the user."""


@attrs.frozen
class Challenge:
    """What a 401's ``WWW-Authenticate: Bearer ...`` said."""

    resource_metadata: str | None = None
    scope: str | None = None
    error: str | None = None


def parse_challenge(header: str | None) -> Challenge:
    """The Bearer challenge's parameters (RFC 6750 section 3, RFC 9728 section 5.1);
    an empty :class:`Challenge` for a header that is absent or has no Bearer
    challenge. The header may hold several challenges (RFC 9110 section
    11.6.1: ``Basic realm="x", Bearer resource_metadata="..."``, or two
    fields that httpx joined with ", "); the first Bearer one is taken."""
    params = _challenges(header or "").get("bearer")
    if params is None:
        return Challenge()
    return Challenge(params.get("resource_metadata"), params.get("scope"), params.get("error"))


def _challenges(header: str) -> dict[str, dict[str, str]]:
    """Each challenge's parameters by its scheme (lower case; the first of a scheme)."""
    found: dict[str, dict[str, str]] = {}
    params: dict[str, str] = {}
    for element in _elements(header):
        if not _PARAM_START.match(element):  # a scheme, maybe with its first parameter
            scheme, *first = element.split(None, 1)
            params = found.setdefault(scheme.lower(), {}) if scheme.lower() not in found else {}
            element = first[0] if first else ""
        match = _PARAM.fullmatch(element)
        if match:
            quoted, bare = match.group(2), match.group(3)
            value = bare if quoted is None else re.sub(r"\\(.)", r"\1", quoted)
            params.setdefault(match.group(1).lower(), value)
    return found


def _elements(header: str) -> list[str]:
    """The header's comma-separated elements (commas in quoted strings kept), stripped."""
    elements, start, quoted, escaped = [], 0, False, False
    for i, char in enumerate(header):
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            elements.append(header[start:i])
            start = i + 1
    elements.append(header[start:])
    return [element.strip() for element in elements if element.strip()]


def canonical_resource(url: str) -> str:
    """The server's canonical URI (RFC 8707 section 2, as the MCP spec asks): lower-case
    scheme and host, no fragment, no trailing slash unless it is the whole path."""
    parts = urlsplit(url)
    path = parts.path
    if path.endswith("/") and path != "/":
        path = path.rstrip("/")
    if path == "/":
        path = ""
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, parts.query, ""))


def resource_metadata_urls(server_url: str, challenge: Challenge) -> list[str]:
    """Where to look for the Protected Resource Metadata, in the spec's order."""
    if challenge.resource_metadata:
        return [challenge.resource_metadata]
    parts = urlsplit(server_url)
    root = urlunsplit((parts.scheme, parts.netloc, "/.well-known/oauth-protected-resource", "", ""))
    path = parts.path.rstrip("/")
    return [root + path, root] if path else [root]


@attrs.frozen
class ResourceMetadata:
    resource: str
    authorization_servers: tuple[str, ...]
    scopes_supported: tuple[str, ...] | None = None


def read_resource_metadata(body: Any, server_url: str) -> ResourceMetadata:
    """The parts of a Protected Resource Metadata document the flow uses; its
    ``resource`` must name this server (RFC 9728 section 3.3), or be a prefix of its URL."""
    if not isinstance(body, dict):
        raise OAuthError("the server's resource metadata is not a JSON object")
    servers = body.get("authorization_servers")
    if not isinstance(servers, list) or not servers or not all(isinstance(s, str) for s in servers):
        raise OAuthError("the server's resource metadata names no authorization server")
    if not any(secure_endpoint(server) for server in servers):
        _refuse_insecure("authorization server", servers[0])
    servers = [server for server in servers if secure_endpoint(server)]
    resource = body.get("resource")
    ours = canonical_resource(server_url)
    if resource is None:
        resource = ours
    elif not isinstance(resource, str) or not _covers(canonical_resource(resource), ours):
        raise OAuthError(f"the server's resource metadata is for {resource!r}, not {server_url}")
    scopes = body.get("scopes_supported")
    if scopes is not None and not (
        isinstance(scopes, list) and all(isinstance(s, str) for s in scopes)
    ):
        scopes = None
    return ResourceMetadata(
        canonical_resource(resource), tuple(servers), None if scopes is None else tuple(scopes)
    )


def _covers(resource: str, url: str) -> bool:
    return url == resource or url.startswith(resource.rstrip("/") + "/")


def grant_covers(resource: str, url: str) -> bool:
    """Whether a grant for ``resource`` may be sent to the server at ``url``
    (RFC 8707 audience: the resource is the server's canonical URI or a path
    prefix of it). Queries are left out of the comparison: a server's URL may
    carry one (an API key) that the resource never names."""

    def bare(address: str) -> str:
        parts = urlsplit(canonical_resource(address))
        return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))

    return _covers(bare(resource), bare(url))


_LOOPBACK = re.compile(r"localhost|127(\.\d{1,3}){3}|\[::1\]")


def secure_endpoint(url: str) -> bool:
    """Whether an authorization server's endpoint may be used: ``https://``
    (the MCP spec's Communication Security: every authorization server
    endpoint MUST be served over HTTPS), or ``http://`` to a loopback host,
    whose traffic never leaves the machine (a local or test authorization
    server, as the conformance suite's): docs/oauth.md."""
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2].lower()
        host = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    except ValueError:
        return False
    if parts.scheme == "https":
        return bool(parts.netloc)
    return parts.scheme == "http" and _LOOPBACK.fullmatch(host) is not None


def _refuse_insecure(what: str, url: str) -> None:
    raise OAuthError(
        f"{what} {url!r} is not an https:// address: not used (the MCP spec: authorization "
        "server endpoints MUST be served over HTTPS; http:// is taken for a loopback host only)"
    )


def server_metadata_urls(issuer: str) -> list[str]:
    """Where an authorization server's metadata may be, in the spec's order:
    RFC 8414 then OpenID Connect, with the issuer's path inserted or appended."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")

    def at(well_known: str) -> str:
        return urlunsplit((parts.scheme, parts.netloc, well_known, "", ""))

    if not path:
        return [
            at("/.well-known/oauth-authorization-server"),
            at("/.well-known/openid-configuration"),
        ]
    return [
        at("/.well-known/oauth-authorization-server" + path),
        at("/.well-known/openid-configuration" + path),
        at(path + "/.well-known/openid-configuration"),
    ]


@attrs.frozen
class ServerMetadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    registration_endpoint: str | None = None
    # How a client may prove itself at the token endpoint (None: not said).
    auth_methods: tuple[str, ...] | None = None
    # It puts ``iss`` in its authorization responses (RFC 9207).
    iss_supported: bool = False
    revocation_endpoint: str | None = None  # where tokens are revoked (RFC 7009)


def read_server_metadata(body: Any, issuer: str) -> ServerMetadata:
    """The endpoints of the authorization server ``issuer`` (the identifier
    its metadata's address was made from); refused unless the metadata names
    that issuer exactly (RFC 8414 section 3.3: a document that names another
    is not used, as the MCP spec of 2026-07-28 requires) and it offers PKCE
    with S256 (a client MUST refuse to proceed otherwise)."""
    if not isinstance(body, dict):
        raise OAuthError("the authorization server's metadata is not a JSON object")
    missing = [
        key
        for key in ("issuer", "authorization_endpoint", "token_endpoint")
        if not isinstance(body.get(key), str)
    ]
    if missing:
        raise OAuthError(f"the authorization server's metadata lacks {', '.join(missing)}")
    registration, revocation = body.get("registration_endpoint"), body.get("revocation_endpoint")
    for key in (
        "issuer",
        "authorization_endpoint",
        "token_endpoint",
        "registration_endpoint",
        "revocation_endpoint",
    ):
        if isinstance(body.get(key), str) and not secure_endpoint(body[key]):
            _refuse_insecure(f"the authorization server's {key}", body[key])
    if body["issuer"] != issuer:
        raise OAuthError(
            f"the authorization server's metadata names the issuer {body['issuer']!r}, not "
            f"{issuer!r} whose address it came from: not used (RFC 8414, section 3.3)"
        )
    methods = body.get("code_challenge_methods_supported")
    if not isinstance(methods, list) or "S256" not in methods:
        raise OAuthError(
            "the authorization server does not offer PKCE with S256, so it is not used"
        )
    auth_methods = body.get("token_endpoint_auth_methods_supported")
    return ServerMetadata(
        body["issuer"],
        body["authorization_endpoint"],
        body["token_endpoint"],
        registration if isinstance(registration, str) else None,
        tuple(m for m in auth_methods if isinstance(m, str))
        if isinstance(auth_methods, list)
        else None,
        body.get("authorization_response_iss_parameter_supported") is True,
        revocation if isinstance(revocation, str) else None,
    )


def choose_scope(challenge: Challenge, resource: ResourceMetadata) -> str | None:
    """The scopes to ask for: the challenge's, else every scope the server
    lists, else none (the spec's scope selection strategy)."""
    if challenge.scope:
        return challenge.scope
    if resource.scopes_supported:
        return " ".join(resource.scopes_supported)
    return None


# A run-time 403's error code: the token lacks a scope (RFC 6750 section 3.1).
INSUFFICIENT_SCOPE = "insufficient_scope"
# The longest scope taken from a server's challenge (a real one is a few
# words; a longer one is not a scope the broker notes, shows or asks for).
MAX_SCOPE = 1024
# A scope-token (RFC 6749 section 3.3): visible ASCII but '"' and '\\'.
_SCOPE_TOKEN = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")


def challenged_scope(challenge: Challenge) -> str | None:
    """The scope a run-time ``insufficient_scope`` challenge asks for (the
    MCP spec's scope challenge: the scopes the current request needs,
    authoritative for it), its scope-tokens joined by single spaces; None if
    the challenge is not one, names no scope, or names something that is not
    a scope (a server's words go into errors, the log and the token file)."""
    if challenge.error != INSUFFICIENT_SCOPE or not challenge.scope:
        return None
    if len(challenge.scope) > MAX_SCOPE:
        return None
    tokens = challenge.scope.split()
    if not tokens or not all(_SCOPE_TOKEN.fullmatch(token) for token in tokens):
        return None
    return " ".join(tokens)


def scope_union(*scopes: str | None) -> str | None:
    """The scope-tokens of ``scopes``, each once, in the order they first
    come (None if there are none): what a step-up asks for, so that a new
    grant loses nothing the old one had. A union past :data:`MAX_SCOPE` is
    the last scope alone (the challenged one: authoritative for the request
    that failed; a server that names new scopes at every call grows no
    union without bound)."""
    tokens = dict.fromkeys(token for scope in scopes if scope for token in scope.split())
    union = " ".join(tokens) or None
    return union if union is None or len(union) <= MAX_SCOPE else scopes[-1]


def scope_covers(held: str | None, wanted: str) -> bool:
    """Whether scope ``held`` has every scope-token of ``wanted``."""
    return set(wanted.split()) <= set((held or "").split())


def step_up_scope(asked: str | None, granted: str | None, wanted: str | None) -> str | None:
    """The scope ``mcpbroker auth`` asks for: ``asked`` (``oauth.scope``, else
    the first authorization's choice: :func:`choose_scope`), and, if the
    server asked at run time for a scope the grant lacks (``wanted``), the
    union of that, the scope granted before and the challenged one (the
    spec's step-up: a new grant that dropped what the old one had would
    trade one 403 for another)."""
    return scope_union(asked, granted, wanted) if wanted else asked


def pkce_challenge(verifier: str) -> str:
    """The S256 code challenge of a verifier (RFC 7636 section 4.2)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


CLIENT_NAME = "mcpbroker"


BASIC = "client_secret_basic"
POST = "client_secret_post"


def secret_method(methods: tuple[str, ...] | None) -> str:
    """How to send a client secret to a token endpoint that lists ``methods``:
    in the form (``client_secret_post``) unless it lists only HTTP Basic."""
    return BASIC if methods is not None and BASIC in methods and POST not in methods else POST


def registration_request(server: ServerMetadata, redirect_uri: str) -> dict[str, Any]:
    """The body of a dynamic client registration (RFC 7591): a native
    application (the MCP spec of 2026-07-28: a client MUST say which; one
    that redirects to a loopback listener is native) that redirects to the
    broker's loopback listener; public ("none") unless the server lists only
    methods with a secret (then :func:`secret_method`'s)."""
    methods = server.auth_methods
    method = "none" if methods is None or "none" in methods else secret_method(methods)
    return {
        "client_name": CLIENT_NAME,
        "application_type": "native",
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": method,
    }


@attrs.frozen
class Client:
    """The broker's registration with one authorization server."""

    client_id: str
    client_secret: str | None = None
    redirect_uri: str | None = None  # the one registered (dynamic registration)
    # How its secret goes to the token endpoint: in the form, or as HTTP Basic.
    auth_method: str = POST


def read_registration(body: Any, redirect_uri: str, asked: str = POST) -> Client:
    """The registration the server made (``asked``: the method the request
    asked for; the server's answer says which it granted)."""
    if not isinstance(body, dict) or not isinstance(body.get("client_id"), str):
        raise OAuthError("the authorization server's registration answer has no client_id")
    secret = body.get("client_secret")
    granted = body.get("token_endpoint_auth_method")
    method = granted if granted in (BASIC, POST) else asked if asked in (BASIC, POST) else POST
    return Client(
        body["client_id"], secret if isinstance(secret, str) else None, redirect_uri, method
    )


def authorization_url(
    server: ServerMetadata,
    client: Client,
    redirect_uri: str,
    *,
    state: str,
    verifier: str,
    resource: str,
    scope: str | None,
) -> str:
    """Where the user's browser goes to grant access (authorization code with PKCE)."""
    params = {
        "response_type": "code",
        "client_id": client.client_id,
        "redirect_uri": redirect_uri,
        "state": state,
        "code_challenge": pkce_challenge(verifier),
        "code_challenge_method": "S256",
        "resource": resource,
    }
    if scope:
        params["scope"] = scope
    separator = "&" if urlsplit(server.authorization_endpoint).query else "?"
    return server.authorization_endpoint + separator + urlencode(params)


def read_callback(query: dict[str, str], state: str, server: ServerMetadata) -> str:
    """The code the authorization server sent back to the redirect URI, after
    checking its issuer (RFC 9207, as the MCP spec of 2026-07-28 requires: an
    ``iss`` that is there must be the server's issuer, byte for byte, with no
    normalization; one that is not there is refused if the server says it
    sends one) and the state; an :class:`OAuthError` if it refused, or the
    issuer or the state is wrong."""
    iss = query.get("iss")
    if iss is not None and iss != server.issuer:
        raise OAuthError(
            f"the answer names the issuer {iss!r}, not {server.issuer!r}: not used "
            "(RFC 9207: it may come from another authorization server)"
        )
    if iss is None and server.iss_supported:
        raise OAuthError(
            "the answer names no issuer, which the authorization server says it always "
            "does: not used (RFC 9207)"
        )
    if "error" in query:
        description = query.get("error_description")
        raise OAuthError(
            f"the authorization server refused: {query['error']}"
            + (f" ({description})" if description else "")
        )
    if query.get("state") != state:
        raise OAuthError("the answer's state does not match the request's: not used")
    code = query.get("code")
    if not code:
        raise OAuthError("the authorization server's answer carries no code")
    return code


def _client_fields(client: Client) -> dict[str, str]:
    """What proves the client in a token request's form (nothing when its
    secret goes as HTTP Basic: :func:`client_headers`)."""
    if client.client_secret and client.auth_method == BASIC:
        return {}
    fields = {"client_id": client.client_id}
    if client.client_secret:
        fields["client_secret"] = client.client_secret
    return fields


def client_headers(client: Client) -> dict[str, str]:
    """The headers of a token request: HTTP Basic with the client's id and
    secret, each form-encoded first (RFC 6749 section 2.3.1), if it
    authenticates so."""
    if not client.client_secret or client.auth_method != BASIC:
        return {}
    pair = f"{quote_plus(client.client_id)}:{quote_plus(client.client_secret)}"
    return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode("ascii")}


def code_request(
    client: Client, code: str, redirect_uri: str, verifier: str, resource: str
) -> dict[str, str]:
    """The form body that exchanges an authorization code for tokens."""
    return {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": redirect_uri,
        "code_verifier": verifier,
        "resource": resource,
        **_client_fields(client),
    }


def revocation_request(client: Client, token: str, hint: str) -> dict[str, str]:
    """The form body that revokes ``token`` (RFC 7009; ``hint``:
    ``refresh_token`` or ``access_token``), proving the client as a token
    request does (:func:`client_headers` for HTTP Basic)."""
    return {"token": token, "token_type_hint": hint, **_client_fields(client)}


def refresh_request(client: Client, refresh_token: str, resource: str) -> dict[str, str]:
    """The form body that exchanges a refresh token for new tokens."""
    return {
        "grant_type": "refresh_token",
        "refresh_token": refresh_token,
        "resource": resource,
        **_client_fields(client),
    }


@attrs.frozen
class Tokens:
    access_token: str
    refresh_token: str | None = None
    expires_at: float | None = None  # seconds since the epoch; None: not said
    scope: str | None = None
    issued_at: float | None = None  # seconds since the epoch (None: stored before it was kept)


def read_tokens(body: Any, now: float, previous: Tokens | None = None) -> Tokens:
    """The tokens in a token endpoint's answer. A refresh answer that carries
    no new refresh token keeps the previous one (RFC 6749 section 6)."""
    if not isinstance(body, dict):
        raise OAuthError("the token endpoint's answer is not a JSON object")
    if "error" in body:
        description = body.get("error_description")
        raise OAuthError(
            f"the token endpoint refused: {body['error']}"
            + (f" ({description})" if description else "")
        )
    access = body.get("access_token")
    if not isinstance(access, str) or not access:
        raise OAuthError("the token endpoint's answer has no access_token")
    if not _TOKEN.fullmatch(access):
        # (it goes in a header: CR, LF or a space there would break or forge
        # the request, and an HTTP library's error would quote it)
        raise OAuthError("the token endpoint's access_token has characters a header cannot carry")
    kind = body.get("token_type", "Bearer")
    if not isinstance(kind, str) or kind.lower() != "bearer":
        raise OAuthError(f"the token endpoint gave a {kind!r} token, not a bearer token")
    refresh = body.get("refresh_token")
    if not isinstance(refresh, str):
        refresh = previous.refresh_token if previous is not None else None
    expires_in = body.get("expires_in")
    expires_at = (
        now + float(expires_in)
        if isinstance(expires_in, (int, float)) and not isinstance(expires_in, bool)
        else None
    )
    scope = body.get("scope")
    return Tokens(access, refresh, expires_at, scope if isinstance(scope, str) else None, now)


def needs_refresh(tokens: Tokens, now: float, margin: float = REFRESH_MARGIN) -> bool:
    """Whether to refresh before the next request: the access token lapses
    within ``margin`` seconds, or within half its lifetime if that is less
    (never, if the server did not say when)."""
    if tokens.expires_at is None:
        return False
    if tokens.issued_at is not None:
        margin = min(margin, (tokens.expires_at - tokens.issued_at) / 2)
    return tokens.expires_at - now <= margin
