"""A row's foreign flags (absl's --config of the SD trainer): passed through to the other reader,
not checked by the script's argparse parser; a configuration file found where the command ran,
else in the patched tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from dancegrpo_npu import registry
from dancegrpo_npu.run.upstream_args import build_script_args, without_flags


def test_the_foreign_flags_and_their_key_forms_are_left_out_of_the_parser_check():
    args = ["--config", "/t/dgx.py:hpsv2", "--config.train.batch_size=2", "--seed", "1", "--configure", "x"]
    assert without_flags(args, ("--config",)) == ["--seed", "1", "--configure", "x"]
    assert without_flags(args, ()) == args


@pytest.mark.parametrize("where", ["cwd", "tree"])
def test_a_configuration_file_is_found_where_the_command_ran_else_in_the_tree(tmp_path, where):
    tree, cwd = tmp_path / "tree", tmp_path / "cwd"
    for root in (tree, cwd) if where == "cwd" else (tree,):
        (root / "fastvideo/config_sd").mkdir(parents=True)
        (root / "fastvideo/config_sd/dgx.py").write_text("# a configuration\n")
    cwd.mkdir(exist_ok=True)
    spec = registry.get("sd")
    args = build_script_args(spec, ("--config", "fastvideo/config_sd/dgx.py:hpsv3"), tree=tree, cwd=cwd,
                             run_dir=tmp_path / "run", upstream_defaults=False)
    expected = (cwd if where == "cwd" else tree) / "fastvideo/config_sd/dgx.py"
    assert args[:2] == ["--config", f"{expected.resolve()}:hpsv3"]


def test_launch_passes_the_configuration_flags_through(patched_tree, capsys):
    from dancegrpo_npu.cli import main

    code = main(["-C", str(patched_tree.project.root), "launch", "sd", "--dry-run", "--",
                 "--config.train.learning_rate=3e-5", "--seed", "7"])
    out = capsys.readouterr().out
    assert code == 1  # no SD weights here: the dry run lists them
    assert "--config.train.learning_rate=3e-5" in out and "checked by train_grpo_sd.py's own parser" in out
    assert Path(patched_tree.project.workdir / "fastvideo/config_sd/dgx.py").is_file()


def test_launch_refuses_a_flag_neither_reader_takes(patched_tree, capsys):
    from dancegrpo_npu.cli import main

    code = main(["-C", str(patched_tree.project.root), "launch", "sd", "--dry-run", "--", "--sed", "7"])
    assert code == 2
    assert "--sed after -- is not a flag of train_grpo_sd.py" in capsys.readouterr().err
