"""Docs link checker: every relative link and every repository path the docs name exists.

Checks README.md and docs/**/*.md: markdown links ``[text](target)`` (web links and pure anchors
are skipped; ``#anchor`` suffixes are dropped) and back-quoted paths that look like repository files
(``docs/...``, ``recipes/...``, ``benchmarks/...``, ... ending in a known extension).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: back-quoted repository paths, e.g. `docs/backends/native.md` or `benchmarks/quickstart.py`
REPO_PATH = re.compile(
    r"`((?:docs|recipes|benchmarks|backends|algorithms|rlzoo|plugins|tests|scripts|\.ci)/[\w./-]+"
    r"\.(?:md|py|yaml|sh|toml))`"
)


def _targets(doc: Path) -> list[tuple[str, Path]]:
    text = doc.read_text()
    out: list[tuple[str, Path]] = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # web links, mailto:, in-page anchors
        out.append((target, (doc.parent / target.split("#", 1)[0]).resolve()))
    for m in REPO_PATH.finditer(text):
        out.append((m.group(1), (ROOT / m.group(1)).resolve()))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(doc: Path) -> None:
    dead = [f"{target} -> {path}" for target, path in _targets(doc) if not path.exists()]
    assert not dead, f"{doc.relative_to(ROOT)} links to missing files:\n" + "\n".join(dead)


def test_checker_sees_links() -> None:
    """The checker is not vacuous: the README links into docs/ and names benchmark files."""
    targets = [t for t, _ in _targets(ROOT / "README.md")]
    assert any(t.startswith("docs/") for t in targets)
    assert any(t.startswith("benchmarks/") for t in targets)
