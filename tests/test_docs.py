"""The documentation holds together: the README stays a short user's guide; every relative link
in the README, docs/, loadtest/README.md and the reports and READMEs of results/ reaches a file
that exists (and, for a link with an anchor into a markdown page, a heading of that page); and
results/README.md indexes every result file."""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(RESULTS.glob("*.md")),
         *sorted(RESULTS.rglob("README.md")), ROOT / "loadtest" / "README.md"]
PAGES = list(dict.fromkeys(PAGES))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
README_MAX_LINES = 250   # a user's guide of at most about 250 lines (llm.c's README is about 270)


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation other than '-' and '_'
    dropped, spaces turned into '-'."""
    text = FENCE.sub("", page.read_text())
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*$", text, re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        anchors.add(anchor)
    return anchors


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_readme_is_a_short_users_guide():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; topics belong in docs/"


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_link_check_finds_a_missing_file_and_a_missing_anchor_outside_code_blocks(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## The A/B report\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#the-ab-report) [gone](missing.md) [no anchor](other.md#nothing)\n"
                    "[code](other.md#not-a-heading) [web](https://example.com/x.md)\n"
                    "```\n[inside a code block](ignored.md)\n```\n")
    assert broken_links(page) == ["missing.md: no such file", "other.md#nothing: no heading with that anchor",
                                  "other.md#not-a-heading: no heading with that anchor"]


def expand_braces(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    return [expanded for choice in match.group(1).split(",")
            for expanded in expand_braces(pattern[:match.start()] + choice + pattern[match.end():])]


def unindexed(results: Path) -> list[str]:
    """Files under results/ that its README.md names neither by path (a glob, with {a,b}), nor by
    a folder path ending in '/', nor by a link."""
    index = FENCE.sub("", (results / "README.md").read_text())
    names = re.findall(r"`([^`]+)`", index) + [target.partition("#")[0] for target in LINK.findall(index)]
    patterns = [pattern for name in names for pattern in expand_braces(name)]
    missing = []
    for path in sorted(results.rglob("*")):
        relative = path.relative_to(results).as_posix()
        if path.is_dir() or relative == "README.md":
            continue
        if not any(fnmatch.fnmatchcase(relative, pattern) or (pattern.endswith("/") and relative.startswith(pattern))
                   for pattern in patterns):
            missing.append(relative)
    return missing


def test_results_readme_indexes_every_result_file():
    missing = unindexed(RESULTS)
    assert not missing, f"result files not in results/README.md: {missing}"


def test_index_check_finds_a_file_the_index_does_not_name(tmp_path):
    (tmp_path / "history" / "run").mkdir(parents=True)
    for name in ("a.json", "a.md", "b_1.png", "b_2.png", "history/run/x.log", "c.csv"):
        (tmp_path / name).write_text("")
    (tmp_path / "README.md").write_text("[a.md](a.md), `a.json`, `b_{1,2}.png`, `history/run/`\n")
    assert unindexed(tmp_path) == ["c.csv"]
