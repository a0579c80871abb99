"""The docs' links land: every relative Markdown link in README.md, docs/ and bench/results/
names a file of the checkout, and an anchor names a heading of its page; the benchmarks' research
log keeps every block that `bench/scheduler_tables.py` refills."""

from __future__ import annotations

import re

import pytest

from bench import scheduler_tables  # bench/, outside the package
from tests.support.paths import REPO

PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "bench" / "results").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def slugs(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of a page (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def test_slugs_follow_githubs_rules():
    assert slugs("# Launch time (`bench/launch.py`)\n## Reproduce\n## Reproduce\n```\n# not a heading\n```\n") == {
        "launch-time-benchlaunchpy",
        "reproduce",
        "reproduce-1",
    }


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_lands(page):
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_file() or REPO.resolve() not in file.parents:
            broken.append(f"{target}: no such file in the checkout")
        elif anchor and file.suffix == ".md" and anchor not in slugs(file.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_the_research_log_keeps_every_generated_block():
    log = REPO / "bench" / "results" / "scheduler.md"
    text = log.read_text(encoding="utf-8")
    for name in scheduler_tables.BLOCKS:
        assert text.count(f"<!-- BEGIN GENERATED: {name} -->") == 1, name
    refilled = scheduler_tables.fill(text, {name: f"(table {name})" for name in scheduler_tables.BLOCKS})
    assert "(table runs)" in refilled and refilled.count("(table ") == len(scheduler_tables.BLOCKS)
    outside = re.sub(r"<!-- BEGIN GENERATED: (\S+) -->\n.*?<!-- END GENERATED: \1 -->", "", text, flags=re.S)
    assert outside == re.sub(
        r"<!-- BEGIN GENERATED: (\S+) -->\n.*?<!-- END GENERATED: \1 -->", "", refilled, flags=re.S
    ), "a refill changed text outside the generated blocks"
