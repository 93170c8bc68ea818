"""Build: the broker's rules (broker/) compiled with mypyc where that works.

Everything else about the distribution is in pyproject.toml. The rules are
plain, fully typed Python; mypyc (part of mypy) turns them into a C
extension, which runs them in about three quarters of the instructions
(benchmarks/README.md, "Compiled rules"). The compiled modules are optional
extensions: without a C compiler (or with ``MCPBROKER_PURE=1``) the same
modules install as Python, and nothing else changes. ``mcpbroker status``
says which one a daemon runs.

Editable installs (``pip install -e .``, the developer's set-up) stay pure
Python: an extension module shadows its source, so an edited ``.py`` file
would silently not run. ``python -m benchmarks.compiled`` builds a compiled
copy of the tree for the tests and the benchmarks instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# broker/config.py stays Python: cattrs reads its classes' annotations at run time.
PURE = {"__init__.py", "config.py"}


def compiled_rules() -> list[Extension]:
    editable = "editable_wheel" in sys.argv or "develop" in sys.argv  # (PEP 660, or legacy)
    if os.environ.get("MCPBROKER_PURE") or editable:
        return []
    sources = sorted(str(p) for p in Path("broker").rglob("*.py") if p.name not in PURE)
    try:
        from mypyc.build import mypycify

        extensions: list[Extension] = mypycify(sources, group_name="mcpbroker_rules")
    except (Exception, SystemExit) as exc:  # no mypyc, or it refused: install Python
        print(f"mcpbroker: broker/ stays Python (mypyc: {exc!r})", file=sys.stderr)
        return []
    for extension in extensions:
        extension.optional = True  # no C compiler: install the Python modules instead
    return extensions


class BuildOptionalExtensions(build_ext):
    """An optional extension that fails to build leaves nothing behind: not even
    the module an earlier build put in ``build/``, which would be installed
    beside newer Python sources."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception:
            Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            raise


setup(ext_modules=compiled_rules(), cmdclass={"build_ext": BuildOptionalExtensions})
