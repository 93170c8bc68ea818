"""``mcpbroker auth NAME``: authorize the broker at a remote server that asks
for OAuth, once, in the user's browser.

The daemon cannot open a browser for a server that answers 401 (it may run
as a service, with no screen); the user runs this command instead. It finds
the server's authorization server, registers the broker there if need be,
prints the URL to open (and opens it, unless ``--no-browser``), catches the
answer on a loopback redirect and stores the tokens where the daemon reads
them (``actors/oauth.py``). The daemon refreshes them from then on. After
the server asked at run time for a scope its grant lacks (a 403
``insufficient_scope``, noted beside the grant), it asks for that scope
too, with the one granted before, and says so (docs/oauth.md, step-up).
``--logout`` forgets what is stored for the server, and revokes its tokens
at the authorization server where it offers that (RFC 7009).
"""

from __future__ import annotations

import argparse
import sys
import webbrowser
from functools import partial
from typing import Any

USAGE = "mcpbroker auth NAME [--config FILE] [--no-browser] [--logout] [--socket PATH]"
# How long the running daemon may take to answer that the tokens changed.
TELL_TIMEOUT = 5.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="mcpbroker auth",
        description="Authorize the broker at a remote server that asks for OAuth.",
    )
    parser.add_argument("name", metavar="NAME", help="the server's name in the config")
    parser.add_argument("--config", metavar="FILE", default=None, help="the daemon's config file")
    parser.add_argument(
        "--no-browser", action="store_true", help="print the URL to open; do not open a browser"
    )
    parser.add_argument(
        "--logout",
        action="store_true",
        help="forget the server's stored tokens, and revoke them at its authorization server",
    )
    parser.add_argument(
        "--socket", metavar="PATH", default=None, help="the running daemon's socket, to tell it"
    )
    args = parser.parse_args(argv)

    import httpx2
    import trio

    from actors.links.link import LaunchError, configured_headers
    from actors.oauth import NoRevocation, Settings, TokenStore, authorize, revoke
    from actors.paths import UnsafePath, default_config_path, default_socket_path
    from broker.config import ConfigError, load_config
    from broker.oauth import OAuthError

    try:
        config = load_config(args.config or default_config_path())
    except ConfigError as exc:
        print(f"mcpbroker auth: {exc}", file=sys.stderr)
        return 2
    server = config.servers.get(args.name)
    if server is None or server.url is None:
        remote = ", ".join(n for n, s in config.servers.items() if s.url is not None) or "none"
        print(
            f"mcpbroker auth: no remote server {args.name!r} in the config "
            f"(servers reached by url: {remote})",
            file=sys.stderr,
        )
        return 2
    store = TokenStore()
    if args.logout:
        try:
            with store.locked(args.name), store.locked():
                forgotten = store.load(args.name)
                store.save_locked(args.name, None)
        except (OAuthError, UnsafePath, OSError) as exc:  # (a token file that cannot be read)
            print(f"mcpbroker auth: {exc}", file=sys.stderr)
            return 1
        print(f"forgot the tokens of {args.name!r} ({store.path})")
        _tell_daemon(args.socket or default_socket_path(), args.name)
        if forgotten is None:
            return 0
        # Forgotten first (a daemon stops sending them), then revoked: a
        # leaked token is of no use at the server either.
        try:
            endpoint = trio.run(revoke, forgotten)
        except NoRevocation as exc:
            print(f"not revoked at the authorization server: {exc}")
            return 0
        except (OAuthError, OSError, httpx2.HTTPError, httpx2.InvalidURL) as exc:
            print(f"mcpbroker auth: the tokens are not revoked: {exc}", file=sys.stderr)
            return 1
        print(f"revoked them at {endpoint}")
        return 0

    def show(url: str) -> None:
        print(f"Open this address to let mcpbroker use {args.name!r}:\n\n  {url}\n", flush=True)
        if not args.no_browser:
            webbrowser.open(url)

    settings = Settings(
        client_id=server.oauth.get("clientId"),
        client_secret=server.oauth.get("clientSecret"),
        scope=server.oauth.get("scope"),
        redirect_port=int(server.oauth.get("redirectPort", "0")),
    )
    try:
        headers = configured_headers(server.headers)  # (${NAME} as the daemon expands it)
    except LaunchError as exc:
        print(f"mcpbroker auth: server {args.name!r} {exc}", file=sys.stderr)
        return 2
    try:
        grant: Any = trio.run(
            partial(authorize, args.name, server.url, headers, store, show, settings, tell=print)
        )
    except (OAuthError, UnsafePath, OSError, httpx2.HTTPError, httpx2.InvalidURL) as exc:
        print(f"mcpbroker auth: {exc}", file=sys.stderr)
        return 1
    if grant is None:
        print(f"{args.name!r} does not ask for authorization: nothing to do")
        return 0
    print(f"authorized: the daemon uses {args.name!r}'s tokens from {store.path}")
    _tell_daemon(args.socket or default_socket_path(), args.name)
    return 0


def _tell_daemon(socket_path: str, name: str) -> None:
    """A running daemon reads the server's tokens again at its next request
    and tries it again now if it had given up on it (docs/oauth.md). No
    daemon running: nothing to tell (it reads the file when it starts)."""
    from cli.control import ask

    try:
        answer = ask(socket_path, "tokens", TELL_TIMEOUT, [name])
    except (OSError, ValueError):
        return
    if name in (answer.get("tokens") or ()):
        print(f"the daemon on {socket_path} uses them from its next request to {name!r}")
