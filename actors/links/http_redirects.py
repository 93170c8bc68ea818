"""The HTTP link's redirects: followed on the url's own origin only, as the
official SDK's client follows them (docs/configuration.md, "Redirects").

A server mounted at ``/mcp/`` answers ``/mcp`` with ``307`` to ``/mcp/``
(Starlette's ``redirect_slashes``). :class:`SameOriginRedirects` wraps the
link's transport and sends the request again where it points if that is
on the same origin (scheme, host, port) and the method stays the same:
``307`` or ``308`` for any request (with its body), ``301``, ``302`` or
``303`` for a GET too; at most :data:`MAX_REDIRECTS` in a row. The
request goes again with its headers as they were (the ``Authorization``
too: the origin is the same). Any other redirect is the answer as it
came, never followed: the configured headers and a token go nowhere else.
:func:`redirect_note` says where it pointed, for the error.

A ``308`` or ``301`` followed is permanent (RFC 9110, 15.4.2 and 15.4.9:
later references ought to use the new url): where it led is remembered
for the transport's life (the link's) and later requests for that url go
there at once, not through the redirect again; ``307``, ``302`` and
``303`` are temporary, followed each time. A response whose request went
elsewhere than asked names the url it came from (:func:`final_url`), to
resolve a relative url it gives (HTTP+SSE's ``endpoint`` event).
"""

from __future__ import annotations

import httpx2

from broker.redact import shown_url

MAX_REDIRECTS = 5
KEEP_METHOD = frozenset({307, 308})  # (the method and body go again as they were)
GET_TOO = frozenset({301, 302, 303})  # (a GET stays a GET)
PERMANENT = frozenset({301, 308})  # (where they lead is remembered)
MAX_MOVED = 16  # urls whose permanent redirect is remembered (the oldest forgotten)
FINAL_URL = "mcpbroker.final_url"  # (the response's extension: the url it came from)


class SameOriginRedirects(httpx2.AsyncBaseTransport):
    """``transport``, with the redirects that stay on their origin followed,
    the permanent ones remembered."""

    def __init__(self, transport: httpx2.AsyncBaseTransport) -> None:
        self._transport = transport
        self._moved: dict[str, httpx2.URL] = {}  # url: where its permanent redirect led

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        asked = request.url
        request = self._moved_on(request)
        response = await self._transport.handle_async_request(request)
        for _ in range(MAX_REDIRECTS):
            target = _followed(request, response)
            if target is None:
                break
            if response.status_code in PERMANENT:
                self._remember(request.url, target)
            await response.aclose()
            request = _sent_to(request, target)
            response = await self._transport.handle_async_request(request)
        if request.url != asked:
            response.extensions[FINAL_URL] = request.url
        return response

    def _moved_on(self, request: httpx2.Request) -> httpx2.Request:
        """``request``, sent where its url's permanent redirects led."""
        url = request.url
        for _ in range(MAX_REDIRECTS):
            target = self._moved.get(str(url))
            if target is None:
                break
            url = target
        return request if url is request.url else _sent_to(request, url)

    def _remember(self, url: httpx2.URL, target: httpx2.URL) -> None:
        if len(self._moved) >= MAX_MOVED and str(url) not in self._moved:
            del self._moved[next(iter(self._moved))]
        self._moved[str(url)] = target

    async def aclose(self) -> None:
        await self._transport.aclose()


def final_url(response: httpx2.Response) -> httpx2.URL:
    """The url ``response`` came from: its request's, or where the request
    was sent instead (a redirect followed, remembered)."""
    url = response.extensions.get(FINAL_URL)
    return url if isinstance(url, httpx2.URL) else response.request.url


def _sent_to(request: httpx2.Request, url: httpx2.URL) -> httpx2.Request:
    """``request`` again, to ``url`` (on its origin), as it was."""
    return httpx2.Request(
        request.method,
        url,
        headers=request.headers,
        stream=request.stream,
        extensions=request.extensions,
    )


def _followed(request: httpx2.Request, response: httpx2.Response) -> httpx2.URL | None:
    """Where ``response`` sends ``request`` again; None: nowhere."""
    status = response.status_code
    if status not in KEEP_METHOD and not (status in GET_TOO and request.method == "GET"):
        return None
    target = _location(request, response)
    if target is None or target.origin != request.url.origin:
        return None
    return target


def _location(request: httpx2.Request, response: httpx2.Response) -> httpx2.URL | None:
    location = response.headers.get("location")
    if not location:
        return None
    try:
        return request.url.join(location)
    except httpx2.InvalidURL:
        return None


def redirect_note(response: httpx2.Response) -> str:
    """For a redirect that was not followed: where it pointed, and why it
    was not followed (``""``: not a redirect)."""
    if not 300 <= response.status_code < 400:
        return ""
    target = _location(response.request, response)
    if target is None:
        return ""
    where = shown_url(str(target))
    if target.origin != response.request.url.origin:
        why = "another origin, where the broker sends no request: put that url in the config"
    elif response.status_code in KEEP_METHOD or response.request.method == "GET":
        why = f"more than {MAX_REDIRECTS} redirects: put the last url in the config"
    else:
        why = "a POST is sent again only on 307 or 308: put that url in the config"
    return f" (to {where}, not followed: {why})"
