"""The documentation (#15.7): the site builds with no broken link, and every
relative link in the Markdown resolves in the repository as GitHub shows it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# The Markdown a reader follows links in: docs/ and the pages the site takes from outside it.
PAGES = sorted(
    [*(REPO / "docs").rglob("*.md"), REPO / "README.md", REPO / "benchmarks" / "README.md"]
)
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def relative_links(text: str) -> list[str]:
    """The link targets of a Markdown text that are paths (no URL, no bare
    anchor), outside code blocks and code spans."""
    text = CODE.sub("", FENCE.sub("", text))
    targets = INLINE_LINK.findall(text) + REFERENCE.findall(text)
    return [t for t in targets if not SCHEME.match(t) and not t.startswith("#")]


def test_relative_links_are_found_in_code_free_text() -> None:
    text = (
        "[a](a.md) [b](../b/README.md#part) [web](https://x.org/y.md) [top](#top)\n"
        "`[not](code.md)`\n```\n[not](fenced.md)\n```\n[ref]: rules/c.md\n"
        '[t](<d e.md> "title") ![img](img/p.png)\n'
    )
    assert relative_links(text) == ["a.md", "../b/README.md#part", "img/p.png", "rules/c.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists() or not path.is_relative_to(REPO):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)} links to what is not there: {broken}"


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_site_builds_with_no_broken_link_or_anchor(tmp_path: Path) -> None:
    done = mkdocs_build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    home = (tmp_path / "site" / "index.html").read_text()
    assert "Quick start" in home and 'href="getting-started/"' in home  # (the README)
    assert "mcpbroker bench" in (tmp_path / "site" / "benchmarks" / "index.html").read_text()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The check above can fail: a copy of the docs with a link to a missing
    page, and one to a missing heading, does not build."""
    copy = tmp_path / "copy"
    for name in ("mkdocs.yml", "docs_hooks.py", "README.md", "benchmarks/README.md"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, copy / name)
    shutil.copytree(REPO / "docs", copy / "docs")
    with (copy / "README.md").open("a") as readme:
        readme.write("\n[gone](docs/no-such-page.md) [nowhere](docs/hosts.md#no-such-heading)\n")
    done = mkdocs_build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr and "no-such-heading" in done.stderr
