"""The HTTP link alone: what ``actors/links/http.py`` costs per call, without
the daemon around it.

``python -m benchmarks.http_link URL [--clients K] [--calls N] [--profile FILE]``

Opens an ``HttpLink`` to ``URL`` (a Streamable HTTP server with an ``echo``
tool: ``benchmarks/sdk_server.py --http``, or a daemon's ``serve --http``
with the echo server) in this process, initializes, then keeps K
``tools/call`` in flight until N are answered, after a warm-up. Prints
calls/s and this process's CPU per call (user and system): the link, httpx2
and Trio, and a few lines of its driver. ``--profile`` writes a cProfile of
the measured calls (CPU time); ``--tree DIR`` runs another checkout's link
(``git archive`` of a commit, for before/after pairs).
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import os
import sys
import time
from typing import Any


async def measure(args: argparse.Namespace) -> str:
    import orjson
    import structlog
    import trio

    from actors.links.http import launch_http
    from actors.links.link import LinkContext
    from broker.config import ServerConfig

    async with trio.open_nursery() as nursery:
        context = LinkContext(nursery, 4 << 20, structlog.get_logger())
        link = await launch_http(ServerConfig(url=args.url), context)
        waiting: dict[int, trio.Event] = {}
        ids = itertools.count(1)

        async def read() -> None:
            while frames := await link.receive():
                for frame in frames:
                    assert isinstance(frame, bytes), frame
                    event = waiting.pop(orjson.loads(frame).get("id"), None)
                    if event is not None:
                        event.set()

        async def call(message: dict[str, Any]) -> None:
            request = next(ids)
            waiting[request] = done = trio.Event()
            await link.send(link.encode([{"jsonrpc": "2.0", "id": request, **message}]))
            await done.wait()

        async def load(calls: int) -> None:
            left = [calls]

            async def client() -> None:
                while left[0] > 0:
                    left[0] -= 1
                    await call(TOOL)

            async with trio.open_nursery() as clients:
                for _ in range(args.clients):
                    clients.start_soon(client)

        nursery.start_soon(read)
        await call(INITIALIZE)
        await link.send(link.encode([{"jsonrpc": "2.0", "method": "notifications/initialized"}]))
        await load(args.warmup)
        profile = cProfile.Profile(time.process_time) if args.profile else None
        start, before = time.perf_counter(), os.times()
        if profile is not None:
            profile.enable()
        await load(args.calls)
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)
        wall, after = time.perf_counter() - start, os.times()
        await link.close()
        nursery.cancel_scope.cancel()
    user = (after.user - before.user) / args.calls * 1e6
    system = (after.system - before.system) / args.calls * 1e6
    return (
        f"{args.clients} in flight, {args.calls:,} calls: {args.calls / wall:,.0f} calls/s, "
        f"{user + system:,.0f} µs CPU per call (user {user:,.0f}, system {system:,.0f}), "
        f"load average {os.getloadavg()[0]:.1f}"
    )


INITIALIZE = {
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "benchmarks.http_link", "version": "1"},
    },
}
TOOL = {"method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x"}}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_link", description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--clients", type=int, default=64, help="calls in flight")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=300, help="calls before measuring")
    parser.add_argument("--profile", metavar="FILE", help="a cProfile of the measured calls")
    parser.add_argument("--tree", metavar="DIR", help="the link of another checkout")
    args = parser.parse_args(argv)
    if args.profile:
        args.profile = os.path.abspath(args.profile)
    if args.tree:  # (before the link is imported)
        sys.path.insert(0, os.path.abspath(args.tree))
    import trio

    print(trio.run(measure, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
