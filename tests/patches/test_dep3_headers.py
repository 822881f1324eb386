"""The rules every patch of patches/ follows (docs/rebasing.md, "Patch names, numbers and
headers"): its number is its position in the series, and its DEP-3 header has one form.

Marked ``series_rules``: ``pytest -m series_rules tests/patches/test_dep3_headers.py`` shows
each rule with every patch that breaks it, in one failure message per rule.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dancegrpo_npu.engine.series import load_series, numbered_name, read_series_names

PATCHES = Path(__file__).resolve().parents[2] / "patches"

AUTHOR = re.compile(r"^[^<>\s][^<>]*[^<>\s] <[^<>\s@]+@[^<>\s@]+\.[^<>\s@]+>$")  # Name <mail@domain.tld>
URL = re.compile(r"^https://\S+$")
LAST_UPDATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

pytestmark = pytest.mark.series_rules


def header_problems(header: dict[str, str]) -> list[str]:
    """What in one patch's DEP-3 fields breaks the rules (empty when nothing does)."""
    problems = []
    author = header.get("Author", "")
    if not AUTHOR.match(author):
        problems.append(f"Author: {author!r} is not 'Name <mail>'")
    forwarded, *why = header.get("Forwarded", "").split("\n")
    reason = " ".join(line for line in why if line.strip())
    if forwarded in ("no", "not-needed"):
        if not reason:
            problems.append(f"Forwarded: {forwarded} says no reason on its next line")
    elif not URL.match(forwarded):
        problems.append(f"Forwarded: {forwarded!r} is none of no, not-needed (each with its reason) or an https:// URL")
    if not LAST_UPDATE.match(header.get("Last-Update", "")):
        problems.append(f"Last-Update: {header.get('Last-Update')!r} is not YYYY-MM-DD")
    return problems


def test_the_rules_accept_what_they_should_and_refuse_the_rest():
    good = {"Author": "Ada Lovelace <ada@example.org>", "Forwarded": "not-needed\nOnly the NPU needs it.",
            "Last-Update": "2026-12-02"}
    assert header_problems(good) == []
    assert header_problems({**good, "Forwarded": "no\nEvery device fails without it: worth sending."}) == []
    assert header_problems({**good, "Forwarded": "https://github.com/XueZeyue/DanceGRPO/pull/1"}) == []
    assert header_problems({**good, "Author": "dancegrpo-npu"}) == ["Author: 'dancegrpo-npu' is not 'Name <mail>'"]
    assert header_problems({**good, "Author": "<ada@example.org>"})
    assert header_problems({**good, "Forwarded": "not-needed"}) == ["Forwarded: not-needed says no reason on its next line"]
    assert header_problems({**good, "Forwarded": "yes"})
    assert header_problems({**good, "Last-Update": "2 Dec 2026"})


def test_every_patch_header_follows_the_rules():
    broken = {p.name: header_problems(p.header) for p in load_series(PATCHES)}
    broken = {name: problems for name, problems in broken.items() if problems}
    assert not broken, f"{len(broken)} patch(es) break the DEP-3 rules of docs/rebasing.md:\n" + "\n".join(
        f"  {name}: {'; '.join(problems)}" for name, problems in broken.items())


def test_every_patch_number_is_its_position_in_the_series():
    names = read_series_names(PATCHES / "series")
    drifted = [(name, numbered_name(i, name)) for i, name in enumerate(names, 1) if numbered_name(i, name) != name]
    assert not drifted, f"{len(drifted)} patch(es) not numbered by their position (`dancegrpo-npu export --renumber`):\n" + \
        "\n".join(f"  {old} -> {new}" for old, new in drifted)
