"""The harness's command line: ``python -m benchmarks [--quick] [--scenarios a,b] [--json FILE]``.

Runs each scenario (see :mod:`benchmarks.scenarios`) in turn, prints its
table as soon as it is done, then every target met or missed. ``--quick``
measures for a moment instead of seconds (a smoke run); ``--tiny`` runs a
fixed, small number of calls per run (what the tests use).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import attrs
import orjson

from benchmarks import compiled, report
from benchmarks.procs import raise_fd_limit, workdir
from benchmarks.scenarios import QUICK, SCENARIOS, TINY, Settings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    speed.add_argument("--tiny", action="store_true", help="a few calls per run (for tests)")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated, from: {', '.join(SCENARIOS)} (default: all)",
    )
    parser.add_argument("--duration", type=float, help="seconds measured per run")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="run the daemon with broker/ compiled, as `pip install .` builds it "
        "(builds a copy of the tree: benchmarks/compiled.py)",
    )
    return parser.parse_args(argv)


def _run_compiled(argv: list[str]) -> NoReturn:
    """Run the harness again from the compiled copy of the tree (its daemon is started
    from the tree the harness runs in)."""
    tree = compiled.build()
    os.chdir(tree)
    rest = [arg for arg in argv if arg != "--compiled"]
    os.execv(sys.executable, [sys.executable, "-m", "benchmarks", *rest])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compiled and not compiled.is_compiled(compiled.REPO):
        _run_compiled(sys.argv[1:] if argv is None else argv)
    names = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        print(f"unknown scenarios: {', '.join(unknown)}", file=sys.stderr)
        return 2
    settings = TINY if args.tiny else QUICK if args.quick else Settings()
    if args.duration:
        settings = attrs.evolve(settings, duration=args.duration)
    raise_fd_limit()
    results: dict[str, Any] = {}
    rules = "compiled (mypyc)" if compiled.is_compiled(compiled.REPO) else "Python"
    print(f"Machine: {report.machine()}\nRules (broker/): {rules}\n", flush=True)
    with workdir() as directory:
        for name in names:
            started = time.monotonic()
            print(f"running {name} ...", file=sys.stderr, flush=True)
            results[name] = SCENARIOS[name](settings, directory)
            print(f"  done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
            print("\n".join(report.render_scenario(name, results[name])) + "\n", flush=True)
    checks = report.check_targets(results)
    if checks:
        print("### Targets\n")
        for check in checks:
            print(f"- {'met' if check.met else 'MISSED'}: {check.target}: {check.measured}")
    if args.json:
        document = {"machine": report.machine(), "rules": rules}
        document |= {"settings": attrs.asdict(settings)}
        document |= {"results": results}
        Path(args.json).write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    return 0
