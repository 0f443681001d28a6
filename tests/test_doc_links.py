"""Every link between the docs leads somewhere, and no install line pins a tag the repository
does not have (issue 24: docs/ci.md linked a missing anchor and pinned ``v0.1.0``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", ROOT / "conftest_examples" / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", doc.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(doc: Path) -> list[tuple[int, str]]:
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), doc.read_text())
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


def test_the_slug_rule_matches_githubs() -> None:
    assert slug("Why it is safe under pytest-xdist, and exports once") == "why-it-is-safe-under-pytest-xdist-and-exports-once"
    assert slug("`tfjs:webgl` and **float16**") == "tfjswebgl-and-float16"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(doc: Path) -> None:
    broken = []
    for line, target in links(doc):
        if re.match(r"^[a-z]+:", target):      # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{doc.name}:{line}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{doc.name}:{line}: {target} (no heading #{anchor} in {dest.name})")
    assert not broken, "\n".join(broken)


def test_no_install_line_pins_a_tag_the_repository_lacks() -> None:
    tags = set(subprocess.run(["git", "tag", "--list"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    pinned = {(doc.name, m.group(1)) for doc in DOCS for m in re.finditer(r"pytest-modelparity(?:\.git)?@(v[\w.]+)",
                                                                          doc.read_text())}
    assert not {(d, t) for d, t in pinned if t not in tags}, f"pinned tags the repository does not have: {pinned}"
