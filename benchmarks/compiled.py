"""A copy of the tree with broker/ compiled, as ``pip install .`` builds it.

``pip install .`` compiles the rules with mypyc (setup.py); the editable
install developers use does not, so that an edited module is the one that
runs. To test and measure the compiled rules without touching the working
tree, this copies the tracked files to ``DEST`` (default
``build/compiled``), builds the extensions in place there, and prints
``DEST``::

    python -m benchmarks.compiled                 # copy; compile again if broker/ changed
    cd build/compiled && python -m pytest ...     # the tests, on the compiled rules
    python -m benchmarks --compiled               # the harness, on the compiled rules

Needs what the build needs: a C compiler, and mypy (a test dependency).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / "build" / "compiled"
STAMP = ".compiled-from"


def build(dest: Path = DEFAULT) -> Path:
    """The compiled copy at ``dest``: the tree's files copied again, broker/
    compiled again only if it (or setup.py) changed."""
    files = _tracked_files()
    digest = _digest([name for name in files if name.startswith("broker/") or name == "setup.py"])
    stamp = dest / STAMP
    fresh = stamp.exists() and stamp.read_text() == digest
    if not fresh and dest.exists():
        shutil.rmtree(dest)
    for name in files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    if fresh:
        return dest
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=dest,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    if not is_compiled(dest):
        raise SystemExit(f"mypyc did not compile broker/ in {dest} (is there a C compiler?)")
    stamp.write_text(digest)
    return dest


def is_compiled(tree: Path) -> bool:
    return any((tree / "broker").glob("upstream.*.so"))


def _tracked_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit("benchmarks.compiled copies a git checkout's tracked files") from None
    return sorted(name for name in out.decode().split("\0") if name and (REPO / name).is_file())


def _digest(files: list[str]) -> str:
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + (REPO / name).read_bytes())
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(build(Path(args[0]).resolve() if args else DEFAULT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
