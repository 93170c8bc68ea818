"""Prototypes of proposed hot-path changes, as monkeypatches, to measure them first.

Not used by the daemon. ``python -m benchmarks.prototype serve ARGS...`` runs
``mcpbroker serve ARGS...`` with the patches named in ``$MCPBROKER_PATCHES``
(comma-separated, or ``all``) applied, and ``python -m benchmarks.prototype
compare`` runs the harness's loads against the daemon with and without them.
Each patch is the smallest form of one proposal in benchmarks/README.md; the
real change belongs in the broker's own code, written properly. Patches
follow the code as it was when they were written and may stop applying.

The first round of prototypes (no checkpoint when an fd or channel is ready,
framing with ``bytes.split``, 1 MiB server pipes) landed in the code itself
in commit 2f507a0 and was removed from here.

- ``envelope``: a server's line that starts with the canonical envelope
  ``{"jsonrpc":"2.0","id":<digits>,"result":`` and ends with ``}`` is not
  decoded: the result stays the line's own bytes, wrapped in an
  ``orjson.Fragment``, which ``orjson.dumps`` writes back out as it is. The
  broker still reads and rewrites the id; the payload is never parsed or
  rebuilt. Only for lines of at least :data:`ENVELOPE_MIN` bytes (below
  that, decoding costs a microsecond or two and validates the result).
"""

from __future__ import annotations

import re
import sys
import types
from typing import Any

import orjson

ENVELOPE_MIN = 16 * 1024
_ENVELOPE = re.compile(rb'\{"jsonrpc":"2\.0","id":(\d{1,15}),"result":')


def lazy_decode(decode: Any) -> Any:
    """``jsonrpc.decode`` that leaves a large result undecoded (an orjson.Fragment)."""

    def decode_line(line: bytes) -> Any:
        if len(line) >= ENVELOPE_MIN and line.endswith(b"}"):
            match = _ENVELOPE.match(line)
            if match is not None:
                raw = line[match.end() : -1]
                return {
                    "jsonrpc": "2.0",
                    "id": int(match[1]),
                    "result": orjson.Fragment(raw),
                }
        return decode(line)

    return decode_line


def patch_envelope() -> None:
    from actors import upstream
    from broker import jsonrpc

    proxy = types.ModuleType("jsonrpc_envelope")
    proxy.__dict__.update(jsonrpc.__dict__)
    proxy.decode = lazy_decode(jsonrpc.decode)  # type: ignore[attr-defined]
    upstream.jsonrpc = proxy  # type: ignore[attr-defined]  # the upstream reader only


PATCHES = {"envelope": patch_envelope}


def apply(names: str) -> list[str]:
    chosen = list(PATCHES) if names == "all" else [n for n in names.split(",") if n]
    for name in chosen:
        PATCHES[name]()
    return chosen


def main(argv: list[str]) -> int:
    import os

    if argv[:1] == ["serve"]:
        apply(os.environ.get("MCPBROKER_PATCHES", ""))
        from actors.cli import main as cli

        return cli(argv)
    if argv[:1] == ["compare"]:
        from benchmarks.prototype_compare import compare

        return compare(argv[1:])
    print("usage: python -m benchmarks.prototype serve ARGS... | compare", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
