"""A bad SDE window is refused by launch before anything starts, a dry run too, in one line: the
contract's check (the one the trainer runs at start) on the arguments the script's own parser
gives.  The Stable Diffusion trainer's own check says why it takes none."""

from __future__ import annotations

import pytest

from dancegrpo_npu.cli import main


@pytest.mark.upstream
@pytest.mark.parametrize("trainer, words, says", [
    # upstream's FLUX recipe: 16 sampling steps, steps 0..14 trained
    ("flux", ["--sde_window_size", "16"], "train_grpo_flux.py would refuse its arguments: --sde_window_size 16 "
                                          "--sde_window_start 0: the window [0, 16) ends past the last trainable "
                                          "step 14 of --sampling_steps 16"),
    ("flux", ["--sde_window_size", "-1"], "--sde_window_size -1 must be 0 (no window"),
    ("flux", ["--sde_window_shift_every", "2"], "--sde_window_shift_every needs --sde_window_size W"),
    ("flux", ["--sde_window_size", "4", "--sde_window_stride", "2"], "--sde_window_stride needs "
                                                                      "--sde_window_shift_every K"),
    # Wan's recipe: 20 sampling steps, 0..18 trained
    ("wan", ["--sde_window_size", "4", "--sde_window_start", "16"], "train_grpo_wan_2_1.py would refuse its "
                                                                    "arguments: --sde_window_size 4 --sde_window_start "
                                                                    "16: the window [16, 20) ends past the last "
                                                                    "trainable step 18"),
    ("sd", ["--sde_window_size", "2"], "--sde_window_size 2: the SD trainer takes no SDE window: its DDIM pipeline "
                                       "passes one eta to every step"),
])  # fmt: skip
def test_a_bad_window_is_refused_before_anything_starts_in_one_line(dry_run_tree, tmp_path, capsys, trainer, words,
                                                                   says):
    assert main(["-C", str(dry_run_tree.project.root), "launch", trainer, "--dry-run", "--", *words]) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and says in errors[0] and "Traceback" not in captured.err, captured.err
    assert not (tmp_path / "runs").exists()  # nothing made, nothing started


@pytest.mark.upstream
def test_a_window_that_fits_reaches_the_plan(dry_run_tree, capsys):
    # 1: the bare test tree has no weights or dataset, which the plan lists; the window is not among them
    assert main(["-C", str(dry_run_tree.project.root), "launch", "flux", "--dry-run", "--", "--sde_window_size", "4",
                 "--sde_window_start", "11", "--sde_window_shift_every", "25"]) == 1
    out = capsys.readouterr().out
    problems = out[out.index("# could not start here"):].split("\nset -euo pipefail")[0]
    assert "window" not in problems and "sde" not in problems, problems
    assert "# the script's arguments: checked by train_grpo_flux.py's own parser" in out
    assert "--sde_window_size 4" in out and "--sde_window_start 11" in out
