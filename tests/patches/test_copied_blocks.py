"""Patches hold call sites; the overlay holds the logic: no block of three or more consecutive
added lines of logic is copied into three or more places of the series.

A line of logic is an added line that is not blank, not a comment, not an import and not a call
into the overlay (``hooks.``/``dancegrpo_port.``, or a name the series imports from
``dancegrpo_port`` into that file, called or assigned from).  Three such lines in a row of one
run of added lines, found in three or more places (patches and files), are a block: it belongs in
an overlay module, behind one call.  Fast: reads patches/ only.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

from conftest import PROJECT_ROOT

BLOCK = 3  # consecutive lines of logic
PLACES = 3  # places of the series that hold the same block

IMPORT = re.compile(r"^\s*(import\s|from\s+\S+\s+import\b)")
OVERLAY_IMPORT = re.compile(r"from\s+dancegrpo_port(?:\.[\w.]+)?\s+import\s+(\([^)]*\)|[^\n]+)")
OVERLAY_ATTRIBUTE = re.compile(r"\b(hooks|dancegrpo_port)\.")


def series_names(patches: Path) -> list[str]:
    return [ln.strip() for ln in (patches / "series").read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def added_runs(patches: Path) -> list[tuple[str, str, list[str]]]:
    """(patch, file, lines) for every run of consecutive added lines of the series."""
    runs = []
    for name in series_names(patches):
        diff = (patches / name).read_text().partition("\n---\n")[2]
        path, run = None, []
        for line in diff.splitlines():
            if line.startswith("+++ "):
                path = line[len("+++ b/"):]
            elif line.startswith("+"):
                run.append(line[1:])
                continue
            if run:
                runs.append((name, path, run))
                run = []
        if run:
            runs.append((name, path, run))
    return runs


def overlay_names(lines: list[str]) -> set[str]:
    """The names these lines import from dancegrpo_port (as bound: ``x as y`` binds y)."""
    names = set()
    for match in OVERLAY_IMPORT.finditer("\n".join(lines)):
        for part in match.group(1).strip("()").replace("\n", " ").split(","):
            part = part.split("#")[0].strip()
            if part:
                names.add(part.split(" as ")[-1].strip())
    return names


def copied_blocks(patches: Path) -> dict[tuple[str, ...], list[tuple[str, str]]]:
    """Each block of BLOCK+ lines of logic found in PLACES+ places -> its places (patch, file)."""
    runs = added_runs(patches)
    imported = collections.defaultdict(set)
    for _name, path, lines in runs:
        imported[path] |= overlay_names(lines)

    def logic(line: str, path: str) -> bool:
        text = line.strip()
        if not text or text.startswith("#") or IMPORT.match(line) or OVERLAY_ATTRIBUTE.search(text):
            return False
        return not any(re.match(rf"^(with\s+)?(\w+(\s*,\s*\w+)*\s*=\s*)?{re.escape(n)}\b", text) for n in imported[path])

    def logic_lines(path, lines):
        return [re.sub(r"\s+", " ", ln.strip()) for ln in lines if logic(ln, path)]

    windows = collections.Counter()
    for _name, path, lines in runs:
        found = logic_lines(path, lines)
        windows.update(tuple(found[k:k + BLOCK]) for k in range(len(found) - BLOCK + 1))
    copied = {w for w, n in windows.items() if n >= PLACES}
    blocks = collections.defaultdict(list)
    for name, path, lines in runs:
        found = logic_lines(path, lines)
        covered = [False] * len(found)
        for k in range(len(found) - BLOCK + 1):
            if tuple(found[k:k + BLOCK]) in copied:
                covered[k:k + BLOCK] = [True] * BLOCK
        k = 0
        while k < len(found):
            if covered[k]:
                end = k
                while end < len(found) and covered[end]:
                    end += 1
                blocks[tuple(found[k:end])].append((name, path))
                k = end
            else:
                k += 1
    return {block: places for block, places in blocks.items() if len(places) >= PLACES}


def test_no_block_of_logic_is_copied_into_three_places_of_the_series():
    blocks = copied_blocks(PROJECT_ROOT / "patches")
    assert not blocks, "\n".join(
        f"{len(places)} places ({', '.join(sorted({p for p, _ in places}))}): {' | '.join(block)[:160]}"
        for block, places in blocks.items())


def test_a_block_copied_into_three_trainers_is_found(tmp_path):
    """The rule sees what it is for: the same three lines of logic added to three trainers (as the
    HPSv2 file check once was, in five), and not three overlay calls or imports."""
    logic = ["if args.use_hpsv2:", "    for flag, path in files:", "        parser.error(path)"]
    calls = ["from dancegrpo_port import reward", "reward.check_arguments(parser, args)",
             "hooks.run_start(args, rank, world_size, device)", "reward.add_arguments(parser)"]
    patches = tmp_path / "patches"
    patches.mkdir()
    names = []
    for i, trainer in enumerate(("flux", "wan", "qwenimage")):
        name = f"000{i + 1}-{trainer}.patch"
        body = "".join(f"+{line}\n" for line in calls + logic)
        (patches / name).write_text(
            f"Description: x\n---\ndiff --git a/t_{trainer}.py b/t_{trainer}.py\n--- a/t_{trainer}.py\n"
            f"+++ b/t_{trainer}.py\n@@ -1,0 +1,{len(calls) + len(logic)} @@\n{body}")
        names.append(name)
    (patches / "series").write_text("\n".join(names) + "\n")
    assert list(copied_blocks(patches)) == [tuple(line.strip() for line in logic)]
    (patches / "series").write_text("\n".join(names[:2]) + "\n")  # two places: not copied enough
    assert copied_blocks(patches) == {}
