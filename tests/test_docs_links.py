"""Every link in README.md, docs/ and the other READMEs and notes resolves: relative file links to files that
exist, ``#anchors`` to headings.

Anchors are matched against GitHub's heading slugs (lowercase; characters other than letters, digits, ``_``,
``-`` and spaces dropped; each space a ``-``; a repeated slug gets ``-1``, ``-2``, ...). Links inside code
(fenced blocks and inline code spans) are not links and are skipped, as are ``http(s)://`` and ``mailto:`` links.
Each test lists every broken link, not just the first.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def doc_files() -> list[Path]:
    """README.md, everything under docs/, the adapters' and examples' READMEs, and the notes under benchmarks/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted(ROOT.glob("adapters/*/README.md")),
            *sorted(ROOT.glob("examples/README.md")), *sorted((ROOT / "benchmarks").rglob("*.md"))]


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (its markdown: links keep their text, code and emphasis marks go)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a markdown file offers: its headings' slugs (repeats numbered) and explicit ``<a id>`` tags."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose_lines(path.read_text()):
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """``(line, target)`` of every markdown link outside code."""
    return [(number, target) for number, line in _prose_lines(path.read_text())
            for target in LINK.findall(INLINE_CODE.sub("", line))]


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with each link of ``path`` that does not resolve, one line each (paths shown from ``root``)."""
    problems = []
    for number, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        shown = dest.relative_to(root) if dest.is_relative_to(root) else dest
        if not dest.exists():
            problems.append(f"{where} (no file {shown})")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            problems.append(f"{where} (no heading with anchor #{unquote(anchor)} in {shown})")
    return problems


def test_every_link_in_readme_and_docs_resolves() -> None:
    problems = [problem for path in doc_files() for problem in broken_links(path)]
    assert not problems, f"{len(problems)} broken link(s):\n" + "\n".join(problems)


def test_slugs_follow_github() -> None:
    assert slug("Rollouts: `benchmarks/rollout_throughput.py`") == "rollouts-benchmarksrollout_throughputpy"
    assert slug("Choosing γ and λ") == "choosing-γ-and-λ"
    assert slug("Learning grid: γ = λ = 1 (five seeds)") == "learning-grid-γ--λ--1-five-seeds"
    assert slug("The main job's **peak** and [memory](x.md)") == "the-main-jobs-peak-and-memory"


def test_the_checker_catches_a_broken_anchor_and_file(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Title\n\n## Part two\n\n## Part two\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#part-two) [ok](b.md#part-two-1) [bad](b.md#part-three) [gone](c.md)\n"
                    "`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n[self](#title-here)\n# Title here\n")
    problems = broken_links(page, root=tmp_path)
    assert [p.split(" (")[0] for p in problems] == ["a.md:1: b.md#part-three", "a.md:1: c.md"]
