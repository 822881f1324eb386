"""The rules every patch of patches/ follows (docs/rebasing.md, "Patch names and headers"): the
series' order is the lines of ``series`` alone, so every patch file is listed there and its name
carries no number; the repository names a patch by its name, never by a number; and its DEP-3
header has one form.

Marked ``series_rules``: ``pytest -m series_rules tests/patches/test_dep3_headers.py`` shows
each rule with every patch that breaks it, in one failure message per rule.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dancegrpo_npu.engine.series import load_series, patch_stem, read_series_names

ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "patches"

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


def test_every_patch_file_is_in_the_series_and_its_name_carries_no_number():
    names = read_series_names(PATCHES / "series")
    files = sorted(p.name for p in PATCHES.glob("*.patch"))
    assert sorted(names) == files, f"in patches/ but not in series: {sorted(set(files) - set(names))}; " \
        f"in series but not in patches/: {sorted(set(names) - set(files))}"
    numbered = [n for n in names if re.match(r"\d+-", n)]
    assert not numbered, "the order is patches/series' lines; name these without their number: " + ", ".join(numbered)


def numbered_mentions(text: str, stems: list[str]) -> list[str]:
    """Where ``text`` names a patch of the series by a number: ``NNNN-<its name>``, or a bare
    ``patch NNNN``, ``--without N``, ``without NNNN`` (a patch's number says nothing once a patch
    is added or moved).  A test's own series may carry any names: only the real patches' count."""
    pattern = re.compile(rf"\b\d{{4}}-(?:{'|'.join(map(re.escape, stems))})\b|\bpatch(?:es)? \d{{4}}\b"
                         rf"|--without \d+\b(?!-[A-Za-z])|\bwithout \d{{4}}\b(?!-[A-Za-z])")
    return [m.group(0) for m in pattern.finditer(text)]


def stems() -> list[str]:
    return [patch_stem(n) for n in read_series_names(PATCHES / "series")]


def test_a_number_for_a_patch_is_found():
    names = stems()
    assert "batched-rollout" in names
    without = "--" + "without"  # written apart, so that this file does not plant what it looks for
    planted = f"see {30:04d}-batched-rollout.patch, patch {16:04d}, apply {without} 18, the tree without {19:04d}"
    assert numbered_mentions(planted, names) == [f"{30:04d}-batched-rollout", f"patch {16:04d}", f"{without} 18",
                                                 f"without {19:04d}"]
    # a test's own series, a refused name, numbers that are no patch's
    others = "0001-train.patch, --without 0099-nope.patch, 0.0001, step_000012, 2025-01-01, without 1 file(s)"
    assert numbered_mentions(others, names) == []


SCANNED = ("src", "overlay", "tests", "bench", "docs", "scripts")
TEXT = (".py", ".md", ".sh", ".toml", ".txt", ".cfg", ".yaml", ".yml")


def test_the_repository_names_patches_by_name_not_by_number():
    names = stems()
    paths = [ROOT / "README.md", PATCHES / "series", *PATCHES.glob("*.patch")]
    paths += [p for top in SCANNED for p in (ROOT / top).rglob("*")
              if p.is_file() and p.suffix in TEXT and "__pycache__" not in p.parts]
    found = [f"{path.relative_to(ROOT)}:{n}: {hit}" for path in paths
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             for hit in numbered_mentions(line, names)]
    assert not found, "patches named by number (name them by name, e.g. batched-rollout):\n" + "\n".join(found)
