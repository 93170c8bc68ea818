"""Upstream links: how an Upstream reaches its server, one module per kind.

- :mod:`link`: the interface every link offers (:class:`link.Link`), and
  what starts one (:data:`link.Launcher`);
- :mod:`stream`: newline-delimited JSON over a pair of byte streams, the
  part every stdio-like link shares;
- :mod:`stdio`: a child process (pid, exit code, stderr are its business);
- :mod:`websocket`: a ``ws://`` or ``wss://`` server, one message per frame;
- :mod:`http`: an ``http://`` or ``https://`` server, Streamable HTTP or HTTP+SSE.

A new kind of server connection is a module here and a line in :func:`launcher_for`.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs

from actors.links.link import Launcher, LaunchError, LinkContext
from broker.config import ServerConfig
from broker.redact import shown_url


def launcher_for(config: ServerConfig, name: str = "") -> Launcher:
    """How to open a link to a configured server (``name`` in the config), by
    what its config names."""
    if config.command is not None:
        from actors.links.stdio import launch_stdio

        return functools.partial(launch_stdio, config)
    url = config.url or ""
    scheme, sep, rest = url.partition("://")
    if sep and scheme != scheme.lower():  # (schemes are case-insensitive: RFC 3986 3.1)
        url = scheme.lower() + sep + rest
        config = attrs.evolve(config, url=url)
    if url.startswith(("ws://", "wss://")):
        from actors.links.websocket import launch_websocket

        return functools.partial(launch_websocket, config)
    if url.startswith(("http://", "https://")):
        from actors.links.http import launch_http
        from actors.oauth import BearerTokens, TokenStore

        # The grant `mcpbroker auth NAME` stored for this URL, if any, on
        # every request (refreshed before it lapses): docs/oauth.md.
        # One per server and URL, so a pool's instances share its refreshes.
        auth = BearerTokens.of_server(name, url, TokenStore())
        return functools.partial(launch_http, config, auth=auth, name=name)
    return functools.partial(_unreachable, url)


async def _unreachable(url: str, context: LinkContext) -> Any:
    raise LaunchError(f"is a remote server mcpbroker cannot reach yet ({shown_url(url)})")
