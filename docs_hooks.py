"""MkDocs hooks (mkdocs.yml): pages of the site that live outside docs/.

The repository's README is the site's home page and benchmarks/README.md its
benchmarks page, each kept in one place. Links are written for the repository
(what GitHub shows, and what tests/test_docs.py checks): ``docs/hosts.md``
from the README, ``../benchmarks/README.md`` from a page in docs/. Here each
such link is pointed at the page the site makes of its target; a link to a
file the site does not have is left as it is, for ``mkdocs build --strict``
to refuse.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parent
DOCS = "docs"
# A file outside docs/ (from the repository's root) -> its page in the site.
INCLUDED = {"README.md": "index.md", "benchmarks/README.md": "benchmarks.md"}
LINK = re.compile(r"\]\(([^()\s#]+\.md)(#[^()\s]*)?\)")
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def on_files(files: Files, config: Any) -> Files:
    for source, page in INCLUDED.items():
        files.append(File.generated(config, page, abs_src_path=str(REPO / source)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    here = repository_path(page.file.src_uri)
    site_dir = posixpath.dirname(page.file.src_uri)

    def point(match: re.Match[str]) -> str:
        if match[1].startswith("/") or SCHEME.match(match[1]):
            return match[0]
        target = posixpath.normpath(posixpath.join(posixpath.dirname(here), match[1]))
        page_of_target = site_page(target)
        if page_of_target is None:
            return match[0]
        return f"]({posixpath.relpath(page_of_target, site_dir or '.')}{match[2] or ''})"

    return LINK.sub(point, markdown)


def repository_path(src_uri: str) -> str:
    """Where the page made from ``src_uri`` lives in the repository."""
    for source, page in INCLUDED.items():
        if page == src_uri:
            return source
    return posixpath.join(DOCS, src_uri)


def site_page(path: str) -> str | None:
    """The site's page for a file of the repository, if it makes one."""
    if path in INCLUDED:
        return INCLUDED[path]
    if path.startswith(DOCS + "/"):
        return path[len(DOCS) + 1 :]
    return None
