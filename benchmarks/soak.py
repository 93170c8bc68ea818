"""``python -m benchmarks.soak``: a long run of mixed traffic with a server
killed every so often; nothing may be lost, and the daemon must not grow.

A daemon (``mcpbroker serve``, from this clone) runs two servers: ``demo``
(tools/demo_server.py), killed with SIGKILL every ``--kill-every`` seconds,
and ``steady`` (the benchmark echo server), never killed. ``--clients``
clients on the daemon's socket each keep ``--depth`` requests in flight, a
mix of: calls of every kind to ``demo`` (echo, add, payloads of 1-64 KiB,
tool errors, slow calls with progress, some of them cancelled), calls to
``steady``, ``tools/list``, ``ping``, and calls of an unknown tool.

Every request must get exactly one answer (a result or an error), except the
ones the client cancelled, which may get one or none (docs/rules/
cancellation-and-timeouts.md); at the end the clients stop sending and wait
for what is in flight. It prints, and writes as JSON with ``--json``:

Clients send ``--rate`` requests a second in all (500 by default: a soak
looks for leaks and losses over time, not for the highest throughput).

- sent, answered, errored (by code), cancelled, **lost** (no answer, never
  cancelled) and duplicated (answered twice): lost and duplicated must be 0;
- the daemon's RSS and open descriptors, sampled every 10 s: at the first
  sample after the warm-up, at the end, and the highest;
- the kills done and the demo server's restarts as ``status`` counts them.

The default is the 30 minutes #14 asks for; ``--duration 60`` is a quick look.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import sys
import time
from collections import Counter
from typing import Any

import attrs
import orjson
import psutil
import trio

from benchmarks.procs import ECHO_SERVER, PYTHON, REPO, daemon, raise_fd_limit, workdir
from cli.status import fetch_status

DEMO = [PYTHON, "-m", "tools.demo_server"]
SAMPLE_EVERY = 10.0
WARM_UP = 30.0
DRAIN_SECONDS = 30.0


@attrs.define
class Tally:
    sent: int = 0
    answered: int = 0
    cancelled: int = 0
    duplicated: int = 0
    errors: Counter[int] = attrs.field(factory=Counter)
    pending: dict[int, bool] = attrs.field(factory=dict)  # id -> cancelled by us

    @property
    def errored(self) -> int:
        return sum(self.errors.values())

    @property
    def lost(self) -> int:
        return sum(1 for cancelled in self.pending.values() if not cancelled)


def request(rng: random.Random, id: int) -> tuple[dict[str, Any], bool]:
    """A request of the mix, and whether the client will cancel it."""
    roll = rng.random()

    def call(name: str, arguments: dict[str, Any], **meta: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if meta:
            params["_meta"] = meta
        return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}

    if roll < 0.25:
        return call("demo__echo", {"text": f"soak {id}"}), False
    if roll < 0.35:
        return call("demo__add", {"a": id, "b": 1}), False
    if roll < 0.42:
        return call("demo__payload", {"size": rng.choice((1024, 16384, 65536))}), False
    if roll < 0.47:
        return call("demo__fail", {"message": "asked to"}), False
    if roll < 0.55:
        slow = {"seconds": 0.2, "steps": 2}
        return call("demo__slow", slow, progressToken=f"p{id}"), rng.random() < 0.3
    if roll < 0.80:
        return call("steady__echo", {"text": "steady"}), False
    if roll < 0.88:
        return {"jsonrpc": "2.0", "id": id, "method": "tools/list"}, False
    if roll < 0.96:
        return {"jsonrpc": "2.0", "id": id, "method": "ping"}, False
    return call("demo__no_such_tool", {}), False


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "soak", "version": "1"},
    },
}


async def client(
    socket_path: str, seed: int, args: argparse.Namespace, stop: trio.Event, tally: Tally
) -> None:
    rng = random.Random(seed)
    depth, interval = args.depth, args.clients / args.rate if args.rate else 0.0
    stream = await trio.open_unix_socket(socket_path)
    ids = itertools.count(1)
    room = trio.Semaphore(depth)
    done_sending, drained = trio.Event(), trio.Event()
    waiting: set[int] = set()  # this client's requests that must still be answered

    async def send(message: dict[str, Any]) -> None:
        await stream.send_all(orjson.dumps(message) + b"\n")

    async def reader() -> None:
        buffer = b""
        while True:
            data = await stream.receive_some(1 << 20)
            if not data:
                return
            *lines, buffer = (buffer + data).split(b"\n")
            for line in lines:
                message = orjson.loads(line)
                id = message.get("id")
                if not isinstance(id, int) or id == 0 or "method" in message:
                    continue  # initialize's answer, a notification, a server request
                if id not in tally.pending:
                    tally.duplicated += 1
                    continue
                del tally.pending[id]
                waiting.discard(id)
                if done_sending.is_set() and not waiting:
                    drained.set()
                if "error" in message:
                    tally.errors[message["error"]["code"]] += 1
                else:
                    tally.answered += 1
                room.release()

    async with stream, trio.open_nursery() as nursery:
        await send(INITIALIZE)
        await send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        nursery.start_soon(reader)
        while not stop.is_set():
            await room.acquire()
            if interval:
                await trio.sleep(rng.expovariate(1 / interval))
            id = next(ids) + seed * 10_000_000
            message, cancel = request(rng, id)
            tally.pending[id] = False
            waiting.add(id)
            tally.sent += 1
            await send(message)
            if cancel:
                await trio.sleep(0.05)
                if id in tally.pending:
                    tally.pending[id] = True
                    waiting.discard(id)
                    tally.cancelled += 1
                    room.release()  # an answer may never come
                    await send(
                        {
                            "jsonrpc": "2.0",
                            "method": "notifications/cancelled",
                            "params": {"requestId": id, "reason": "soak"},
                        }
                    )
        done_sending.set()
        if waiting:
            with trio.move_on_after(DRAIN_SECONDS):
                await drained.wait()
        nursery.cancel_scope.cancel()


def sample(pid: int) -> dict[str, float]:
    process = psutil.Process(pid)
    return {"t": time.monotonic(), "rss": process.memory_info().rss, "fds": process.num_fds()}


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    tally = Tally()
    samples: list[dict[str, float]] = []
    kills = 0
    with workdir() as directory, daemon(directory, {"demo": DEMO, "steady": ECHO_SERVER}) as d:
        stop = trio.Event()
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            for seed in range(args.clients):
                nursery.start_soon(client, d.socket, seed + 1, args, stop, tally)
            next_kill = started + args.kill_every
            while (now := time.monotonic()) < started + args.duration:
                if not samples or now - samples[-1]["t"] >= SAMPLE_EVERY:
                    samples.append(sample(d.pid))
                if now >= next_kill:
                    status = await trio.to_thread.run_sync(fetch_status, d.socket)
                    demo = next(s for s in status["servers"] if s["name"] == "demo")
                    if demo["pid"]:
                        os.kill(demo["pid"], signal.SIGKILL)
                        kills += 1
                    next_kill += args.kill_every
                if args.progress:
                    print(
                        f"\r{now - started:6.0f} s  sent {tally.sent}  lost so far "
                        f"{tally.lost - len(tally.pending)}",
                        end="",
                        file=sys.stderr,
                    )
                await trio.sleep(1)
            stop.set()
        samples.append(sample(d.pid))
        status = await trio.to_thread.run_sync(fetch_status, d.socket)
    warm = next((s for s in samples if s["t"] - started >= WARM_UP), samples[0])
    restarts = {s["name"]: s["restarts"] for s in status["servers"]}
    return {
        "duration": args.duration,
        "clients": args.clients,
        "depth": args.depth,
        "rate": args.rate,
        "sent": tally.sent,
        "answered": tally.answered,
        "errored": tally.errored,
        "errors": {str(code): count for code, count in sorted(tally.errors.items())},
        "cancelled": tally.cancelled,
        "cancelled_unanswered": sum(tally.pending.values()),
        "lost": tally.lost,
        "duplicated": tally.duplicated,
        "kills": kills,
        "restarts": restarts,
        "rss_after_warm_up": warm["rss"],
        "rss_end": samples[-1]["rss"],
        "rss_max": max(s["rss"] for s in samples),
        "fds_after_warm_up": warm["fds"],
        "fds_end": samples[-1]["fds"],
        "fds_max": max(s["fds"] for s in samples),
    }


def render(result: dict[str, Any]) -> str:
    mib = 1024 * 1024
    return "\n".join(
        [
            f"soak: {result['duration']:.0f} s, {result['clients']} clients x "
            f"{result['depth']} in flight at {result['rate']:g} requests/s, "
            f"demo server killed {result['kills']} times "
            f"(restarts counted by status: {result['restarts']})",
            f"requests: sent {result['sent']}, answered {result['answered']}, "
            f"errored {result['errored']} {result['errors']}, cancelled {result['cancelled']} "
            f"({result['cancelled_unanswered']} of them unanswered, as allowed)",
            f"LOST {result['lost']}, DUPLICATED {result['duplicated']}",
            f"daemon RSS: {result['rss_after_warm_up'] / mib:.1f} MiB after warm-up, "
            f"{result['rss_end'] / mib:.1f} at the end, {result['rss_max'] / mib:.1f} at most",
            f"daemon descriptors: {result['fds_after_warm_up']} after warm-up, "
            f"{result['fds_end']} at the end, {result['fds_max']} at most",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds (default 1800)")
    parser.add_argument("--kill-every", type=float, default=30.0, help="seconds (default 30)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--depth", type=int, default=4, help="requests in flight per client")
    parser.add_argument(
        "--rate",
        type=float,
        default=500.0,
        help="requests per second from all clients together (0: as fast as they go)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    parser.add_argument("--progress", action="store_true", help="a running count on stderr")
    args = parser.parse_args(argv)
    raise_fd_limit()
    os.chdir(REPO)
    result = trio.run(soak, args)
    if args.progress:
        print(file=sys.stderr)
    print(render(result))
    if args.json:
        with open(args.json, "wb") as file:
            file.write(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0 if result["lost"] == 0 and result["duplicated"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
