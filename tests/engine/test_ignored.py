"""Weights where docs/weights.md puts them, in the tree: git ignores them, so the tree verifies
exactly and launch's tree check passes; a tree fetched before gets the same on its next engine
command; an untracked file that is not ignored is refused with advice that works."""

from __future__ import annotations

import os
import re
from pathlib import Path

from synthetic_upstream import setup

from dancegrpo_npu.cli import main
from dancegrpo_npu.engine import treecheck
from dancegrpo_npu.engine.ignored import EXCLUDE_MARK, weights_dirs
from dancegrpo_npu.engine.status import inspect
from dancegrpo_npu.registry import REGISTRY

WEIGHTS_DOC = Path(__file__).resolve().parents[2] / "docs" / "weights.md"
# The block trees were fetched with before the weights' folders came from the trainers' rows.
OLD_BLOCK = EXCLUDE_MARK + "".join(
    f"{p}\n" for p in ("/data/", "/hps_ckpt/", "/images/", "/cache_dir/", "/outputs/", "/wandb/", "/runs/", "/log/",
                       "/logs/", "/reward.txt", "/metrics.jsonl", "__pycache__/", "*.py[cod]", "*.egg-info/", ".pytest_cache/")
)


def documented_places() -> list[str]:
    """Every place docs/weights.md puts something in the tree: its table's last column and its
    tree's lines (assets/, upstream's own, left out)."""
    text = WEIGHTS_DOC.read_text()
    places = set()
    for line in text.splitlines():
        if line.startswith("|") and line.count("|") >= 4:
            places.update(re.findall(r"`([^`\s]+)`", line.rstrip(" |").rsplit("|", 1)[1]))
        m = re.match(r"^[├└]── (\S+)", line)
        if m:
            places.add(m.group(1))
    return sorted(p for p in places if not p.startswith("assets/"))


def row_places() -> list[str]:
    """Every default path of every registry row's path flags (weights, reward models, datasets),
    but upstream's own prompt files."""
    return sorted({v.removeprefix("./") for spec in REGISTRY.values() for f, v in spec.defaults
                   if f in spec.path_flags and v and not v.removeprefix("./").startswith("assets/")})


def _place(tree: Path, rel: str) -> None:
    path = tree / rel
    if Path(rel).suffix not in (".pt", ".bin", ".json", ".txt"):  # a folder: a weights file in it
        path = path / "model.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"weights")


def test_the_docs_and_the_rows_name_the_weights_folders():
    docs, rows = documented_places(), row_places()
    for name in ("videoalign_ckpt/", "Qwen2-VL-2B-Instruct/", "hps_ckpt/HPS_v2.1_compressed.pt", "data/flux/",
                 "data/HunyuanVideo/", "data/SkyReels-I2V/", "data/stable-diffusion-v1-4/", "data/Wan2.1-T2V-1.3B/",
                 "data/qwenimage/", "data/qwenimage_edit/", "data/empty/"):
        assert name in docs, docs
    assert {"videoalign_ckpt", "Qwen2-VL-2B-Instruct", "data/empty", "data/stable-diffusion-v1-4"} <= set(rows), rows
    assert set(weights_dirs({"assets", "fastvideo", "scripts"})) == {"Qwen2-VL-2B-Instruct", "data", "hps_ckpt", "videoalign_ckpt"}


def test_a_tree_with_every_weights_folder_in_place_verifies_and_launches(tmp_path, capsys):
    s = setup(tmp_path)
    s.apply()
    for rel in documented_places() + row_places():
        _place(s.tree, rel)
    report = inspect(s.project)
    assert report.exact and not report.untracked, report.differences
    assert main(["-C", os.fspath(s.project.root), "verify"]) == 0, capsys.readouterr().err
    # launch's tree check (every launch, --dry-run too, and every smoke)
    assert treecheck.require_tree(s.project, "fastvideo/train.py")["state"] == "verified"
    assert s.apply().noop


def test_a_tree_fetched_before_gets_the_weights_ignored(tmp_path):
    s = setup(tmp_path)
    s.apply()
    exclude = s.tree / ".git" / "info" / "exclude"
    exclude.write_text("# git's own comment\n" + OLD_BLOCK + "/mine/\n")  # a line of the user's after the block
    for rel in ("videoalign_ckpt/", "Qwen2-VL-2B-Instruct/", "mine/notes.txt"):
        _place(s.tree, rel)
    assert inspect(s.project).exact, inspect(s.project).differences
    lines = exclude.read_text().splitlines()
    assert lines[0] == "# git's own comment" and lines.count(EXCLUDE_MARK.strip()) == 1
    assert {"/videoalign_ckpt/", "/Qwen2-VL-2B-Instruct/", "/mine/", "/data/", "/wandb/"} <= set(lines)
    before = exclude.read_text()
    inspect(s.project)
    assert exclude.read_text() == before  # up to date: left alone


def test_an_untracked_file_is_refused_with_advice_that_works(tmp_path, capsys):
    s = setup(tmp_path)
    s.apply()
    _place(s.tree, "notes/mine.txt")
    assert main(["-C", os.fspath(s.project.root), "verify"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "notes/mine.txt (untracked)" in err and "apply" not in err, err
    exclude = re.search(r"add their paths to (\S+/\.git/info/exclude)", err).group(1)
    state = treecheck.tree_state(s.project)
    assert state["state"] == "unverified" and "info/exclude" in treecheck.unverified_fix(state)
    # as the advice says
    with open(exclude if os.path.isabs(exclude) else s.project.root / exclude, "a") as f:
        f.write("/notes/\n")
    assert main(["-C", os.fspath(s.project.root), "verify"]) == 0, capsys.readouterr().err
