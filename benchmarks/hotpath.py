"""A call's sans-I/O path in one process, counted: seconds a figure, not minutes.

``python -m benchmarks.count`` counts what the whole daemon executes, about a
minute a figure under valgrind, a few hundred instructions apart between
runs. This counts only the rules a call crosses (no sockets, no tasks, no
channels), in batches of 16 as the load's clients send them: the client's
lines framed (``LineFramer``), taken by the session (``take_forwards``),
forwarded by the Upstream (``take_requests``) and encoded for the server,
the server's answers framed and taken (``take_answers``), and the session's
lines for the client (``take_outgoing``, ``write_messages``). It builds the
lines the clients and the echo server would write (benchmarks/echo_server.py,
``tools/bench_engine.py``'s modern ``_meta``), so what it counts is the rules'
work plus a fixed share of its own, the same on every path: compare paths
and changes, not the figures with the daemon's.

``python -m benchmarks.hotpath [--path P ...] [--calls N] [--tree DIR]``
prints, for each path, the instructions per call (valgrind's cachegrind,
which must be installed: two runs, of none and of N calls, subtracted) and
its ratios to ``legacy`` and ``legacy-padded`` (those counted before it).
Paths: ``legacy`` (a legacy client at a legacy server), ``legacy-padded``
(the same, each request as long as a modern one: what of a modern call's
cost is its bytes), ``modern`` (both 2026-07-28), ``legacy-at-modern``,
``modern-at-legacy``. ``PYTHONHASHSEED`` is fixed: the same tree gives the
same figure to within a few instructions.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PATHS = ("legacy", "legacy-padded", "modern", "legacy-at-modern", "modern-at-legacy")
BATCH = 16  # calls a client's read and a server's read carry (the load's in-flight)


def run(path: str, calls: int) -> tuple[bytes, bytes]:
    """Carry ``calls`` calls along ``path`` (a batch at least); the last
    batch's lines to the server, and to the client."""
    import orjson

    from broker import jsonrpc
    from broker.catalog import Catalog, ServerEntry
    from broker.eras.session import become_modern
    from broker.eras.versions import (
        CLIENT_CAPABILITIES_KEY,
        CLIENT_INFO_KEY,
        LATEST_MODERN_VERSION,
        PROTOCOL_VERSION_KEY,
    )
    from broker.lifecycle import ServerIdentity
    from broker.session import SessionProtocol
    from broker.states import ServerState
    from broker.upstream import UpstreamProtocol
    from broker.wire import ndjson

    client_modern = path in ("modern", "modern-at-legacy")
    server_modern = path in ("modern", "legacy-at-modern")
    version = LATEST_MODERN_VERSION if server_modern else "2025-11-25"
    identity = ServerIdentity(version, {"tools": {}}, {"name": "echo"})
    tools = {"tools": ({"name": "echo"},)}

    class Catalogs:
        current = Catalog([ServerEntry("echo", ServerState.READY, identity, tools)])

    upstream = UpstreamProtocol("echo", era="auto" if server_modern else "legacy")
    upstream.start()
    opened = {"capabilities": {"tools": {}}, "serverInfo": {"name": "echo"}}
    if server_modern:
        found = {"resultType": "complete", "supportedVersions": [version], **opened}
        upstream.server_message(jsonrpc.result_response("mcpbroker-discover", found))
    else:
        found = {"protocolVersion": version, **opened}
        upstream.server_message(jsonrpc.result_response("mcpbroker-initialize", found))
    # (tools/bench_http.py's CLIENT_INFO and MODERN_META, written out here:
    # --tree counts trees that have neither)
    info = {"name": "mcpbroker-bench", "version": "1"}
    upstream.attach("S", {}, modern=client_modern, client_info=None if client_modern else info)

    session = SessionProtocol(("echo",), Catalogs, transparent=True)
    meta = {
        PROTOCOL_VERSION_KEY: LATEST_MODERN_VERSION,
        CLIENT_CAPABILITIES_KEY: {},
        CLIENT_INFO_KEY: info,
    }
    if client_modern:
        session = become_modern(session, b"k" * 32)
        discover = {"jsonrpc": "2.0", "id": "d", "method": "server/discover"}
        session.receive({**discover, "params": {"_meta": meta}})
    else:
        params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": info}
        session.receive({"jsonrpc": "2.0", "id": "i", "method": "initialize", "params": params})
        session.receive({"jsonrpc": "2.0", "method": "notifications/initialized"})

    call: dict[str, Any] = {"name": "echo", "arguments": {"text": "x"}}
    if client_modern:
        call["_meta"] = meta
    elif path == "legacy-padded":
        # As long as a modern call's line: the bytes' share of its cost.
        pad = len(orjson.dumps({**call, "_meta": meta})) - len(orjson.dumps(call))
        call["arguments"] = {"text": "x", "pad": "x" * (pad - len(b',"pad":""'))}
    request_tail = b',"method":"tools/call","params":' + orjson.dumps(call) + b"}\n"
    result = b'"resultType":"complete",' if server_modern else b""
    answer_tail = b',"result":{' + result + b'"content":[{"type":"text","text":"x"}]}}\n'
    from_client, from_server = ndjson.LineFramer(), ndjson.LineFramer()
    to_server = to_client = b""
    for first in range(0, max(calls, BATCH), BATCH):
        lines = [b'{"jsonrpc":"2.0","id":%d' % (first + n) + request_tail for n in range(BATCH)]
        frames = from_client.feed(b"".join(lines))
        forwards: dict[str, list[Any]] = {}
        if session.take_forwards(frames, 0, forwards) != BATCH:
            raise SystemExit(f"{path}: the session did not take every call")
        requests: list[Any] = []
        upstream.take_requests("S", forwards["echo"], 0, requests, 0.0)
        to_server = b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in requests)
        answers = [b'{"jsonrpc":"2.0","id":%d' % r["id"] + answer_tail for r in requests]
        deliveries: dict[Any, list[Any]] = {}
        if upstream.take_answers(from_server.feed(b"".join(answers)), 0, deliveries, {}) != BATCH:
            raise SystemExit(f"{path}: the upstream did not take every answer")
        out: list[Any] = []
        session.take_outgoing(deliveries["S"], out)
        chunks: list[Any] = []
        ndjson.write_messages(out, chunks)
        to_client = b"".join(chunks)
    return to_server, to_client


def count(path: str, calls: int, tree: Path) -> float:
    """Instructions per call along ``path`` (cachegrind, none subtracted from ``calls``)."""
    totals = []
    for n in (0, calls):
        with tempfile.TemporaryDirectory() as directory:
            out = os.path.join(directory, "cachegrind.out")
            command = ["valgrind", "--tool=cachegrind", "--cache-sim=no"]
            command += [f"--cachegrind-out-file={out}", sys.executable]
            command += ["-m", "benchmarks.hotpath", "--run", path, "--calls", str(n)]
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            done = subprocess.run(command, cwd=tree, env=env, capture_output=True)
            if done.returncode != 0:
                raise SystemExit(f"{path} failed in {tree}:\n{done.stderr.decode()[-2000:]}")
            found = re.search(r"^summary:\s+(\d+)", Path(out).read_text(), re.MULTILINE)
            if found is None:
                raise SystemExit("cachegrind wrote no summary")
            totals.append(int(found.group(1)))
    return (totals[1] - totals[0]) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hotpath", description=__doc__)
    parser.add_argument("--path", action="append", choices=PATHS, help="(default: all)")
    parser.add_argument("--calls", type=int, default=16_000)
    parser.add_argument("--tree", help="count another checkout (or the compiled copy)")
    parser.add_argument("--run", choices=PATHS, help=argparse.SUPPRESS)  # (what is counted)
    args = parser.parse_args(argv)
    if args.run:
        run(args.run, args.calls)
        return 0
    tree = Path(args.tree).resolve() if args.tree else Path(__file__).resolve().parent.parent
    bases: dict[str, float] = {}  # legacy, legacy-padded: what the others are read against
    for path in args.path or PATHS:
        figure = count(path, args.calls, tree)
        ratios = [f"{figure / n:.3f}x {base}" for base, n in bases.items()]
        if path.startswith("legacy") and "at" not in path:
            bases[path] = figure
        ratio = f" ({', '.join(ratios)})" if ratios else ""
        print(f"{path}: {figure:,.0f} instructions per call{ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
