"""What a rebase tells, taken at its word: the stop report's commands run as printed from where
it says to run them; a patch whose only change is its ``index`` lines is kept, header and date;
a patch upstream absorbed is named so."""

from __future__ import annotations

import hashlib
import os
import re

from dancegrpo_npu.engine.series import load_series
from dancegrpo_npu.rebase.session import skip_patch, start_rebase
from rebase_helpers import git, run_as_printed
from test_rebase import conflicting_upstream, take_both, world  # noqa: F401 (world: a fixture)


def test_the_stop_report_s_commands_run_as_printed_from_the_rebase_tree(world, tmp_path):
    history, base, project = world
    conflicting_upstream(history)
    result = start_rebase(project, "main")
    assert result.status == "stopped"
    todo = result.report.split("What to do:\n", 1)[1].splitlines()
    cd = todo[0].strip()
    assert cd.startswith("cd ")
    tree = cd[3:]
    commands = {line.split()[2]: line.split("   ")[0] for line in todo if line.strip().startswith("dancegrpo-npu ")}
    assert set(commands) == {"--continue", "--skip", "--abort"}, todo
    path = os.path.join(tree, "fastvideo/train.py")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(take_both(text))

    r = run_as_printed(commands["--continue"], tree)

    assert r.returncode == 0, (r.stdout, r.stderr)
    assert re.search(r"0001-train-device.patch\s+resolved by hand", r.stdout)
    assert "+use_npu = True" in (project.patches_dir / "0001-train-device.patch").read_text()


def test_skip_and_abort_run_from_a_directory_inside_the_rebase_tree(world):
    history, base, project = world
    conflicting_upstream(history)
    assert start_rebase(project, "main").status == "stopped"
    inside = project.workdir.parent / "DanceGRPO.rebase" / "fastvideo"
    r = run_as_printed("dancegrpo-npu rebase --abort", inside)
    assert r.returncode == 0 and "rebase aborted" in r.stdout, (r.stdout, r.stderr)
    r = run_as_printed("dancegrpo-npu rebase --continue", project.workdir.parent)  # not a rebase tree
    assert r.returncode == 2 and "is not a dancegrpo-npu project" in r.stderr and r.stderr.count("\n") == 1


def without_index(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("index "))


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_a_patch_changed_only_in_its_index_lines_is_kept_and_dated_as_kept(world):
    """Upstream changes utils.py far from 0002's hunk: the hunk is the same, only the blob ids
    of its index line move; 0003's file is untouched."""
    history, base, project = world
    for p in load_series(project.patches_dir):
        if p.name != "0002-utils.patch":
            continue
        text = p.path.read_text()
        head, diff = text.split("\n---\n", 1)
        rel = "fastvideo/utils.py"
        old = blob_id(git(history.path, "show", f"{base}:{rel}").encode() + b"\n")
        new = blob_id((project.workdir / rel).read_bytes())
        diff = diff.replace(f"diff --git a/{rel} b/{rel}\n", f"diff --git a/{rel} b/{rel}\nindex {old[:12]}..{new[:12]} 100644\n")
        p.path.write_text(head + "\n---\n" + diff)
    before = (project.patches_dir / "0002-utils.patch").read_text()
    history.edit_line("fastvideo/utils.py", 38, "utils_value_38 = later(38)")
    history.commit("utils: a change far from the patch")

    result = start_rebase(project, "main")

    assert result.status == "done", result.report
    after = (project.patches_dir / "0002-utils.patch").read_text()
    assert after != before and "Last-Update: 2025-01-01" in after  # the index line refreshed, the date kept
    assert without_index(after) == without_index(before)
    assert "patches/: 0 rewritten" in result.report, result.report
    assert "3 kept (same diff and header): 2 byte for byte, 1 with only their index lines refreshed: 0002-utils.patch" \
        in result.report


def test_a_patch_upstream_absorbed_in_part_is_named_with_its_header_to_review(world):
    """Upstream makes 0001's first hunk itself (line 10); its second (line 40) stays the patch's."""
    history, base, project = world
    history.edit_line("fastvideo/train.py", 10, "device = pick_device()")
    history.commit("upstream picks the device itself")

    result = start_rebase(project, "main")

    assert result.status == "done", result.report
    assert re.search(r"0001-train-device.patch\s+3-way merged \(hunk 1/2 of fastvideo/train.py already upstream "
                     r"\(absorbed\): review its header\)", result.report), result.report
    assert ("absorbed by upstream in part: 0001-train-device.patch; review the header of each (its Description: "
            "may still say it makes what upstream now makes)") in result.report
    diff = (project.patches_dir / "0001-train-device.patch").read_text()
    assert "+use_npu = True" in diff and "+device = pick_device()" not in diff


def test_a_patch_upstream_absorbed_whole_is_named_when_skipped(world):
    history, base, project = world
    history.edit_line("fastvideo/models/flux.py", 15, "dtype = torch.float32")
    history.commit("upstream fixes RoPE dtype itself")
    result = start_rebase(project, "main")
    assert result.status == "stopped" and result.stop == "empty" and "(absorbed)" in result.report

    result = skip_patch(project)

    assert result.status == "done"
    assert "absorbed by upstream whole, dropped from the series: 0003-flux-rope.patch" in result.report
