"""The script's arguments checked by the script's own parser before anything starts
(dancegrpo_npu.run.script_parser): a flag it lacks, an abbreviation of one it has, a value its
parser refuses, and the trainers' --h / --w rule, each refused before a run directory exists."""

from __future__ import annotations

import textwrap

import pytest

from dancegrpo_npu.cli import main
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.run import script_parser

SCRIPT = textwrap.dedent('''\
    import argparse
    import sys

    SIZES = (16, 32)

    def size(text):
        if int(text) not in SIZES:
            raise argparse.ArgumentTypeError(f"not one of {SIZES}")
        return int(text)

    def main(args):
        raise SystemExit("main must not run when the arguments are checked")

    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--max_train_steps", type=int, default=1000)
        parser.add_argument("--max_grad_norm", type=float, default=2.0)
        parser.add_argument("--size", type=size, default=16)
        parser.add_argument("--use_group", action="store_true")
        args = parser.parse_args()
        main(args)
''')


def check(tmp_path, args, typed=None):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    typed = {a.split("=")[0] for a in args if a.startswith("--")} if typed is None else typed
    import sys

    return script_parser.check_script_args(script, tmp_path, sys.executable, list(args), typed)


def test_the_scripts_own_parser_reads_the_arguments(tmp_path):
    parsed = check(tmp_path, ["--max_train_steps", "10", "--size=32", "--use_group"])
    assert parsed.values == {"max_train_steps": 10, "max_grad_norm": 2.0, "size": 32, "use_group": True}
    assert "--max_grad_norm" in parsed.options


def test_with_the_jobs_environment_the_child_probes_its_devices_too(tmp_path):
    import os
    import sys

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    code = script_parser.parser_code(script)
    env = dict(os.environ, DANCEGRPO_DEVICE="cpu")
    parsed = script_parser.run_parser(script, tmp_path, sys.executable, ["--size", "32"], code, env)
    assert parsed.values["size"] == 32  # the check as without it
    assert parsed.devices["requested"] == "cpu" and parsed.devices["kind"] == "cpu" and parsed.devices["count"] == 1
    assert parsed.devices["probed_with"] == "the check of the script's arguments"
    assert script_parser.run_parser(script, tmp_path, sys.executable, [], code).devices is None  # not asked for


@pytest.mark.parametrize("args, words", [
    (["--use_ema"], "--use_ema after -- is not a flag of train.py"),
    (["--max_train_step", "10"], "--max_train_step after -- is an abbreviation of train.py's --max_train_steps"),
    (["--max_", "10"], "--max_ after -- is not a flag of train.py; it starts --max_grad_norm, --max_train_steps"),
    (["--max_train_stepz", "1"], "did you mean --max_train_steps?"),
    (["--size", "24"], "train.py would refuse its arguments: argument --size: not one of (16, 32)"),
    (["--max_train_steps", "ten"], "argument --max_train_steps: invalid int value: 'ten'"),
    (["--use_group", "yes"], "unrecognized arguments: yes"),
])
def test_what_the_parser_would_refuse_is_one_line_naming_it(tmp_path, args, words):
    with pytest.raises(DancegrpoError) as err:
        check(tmp_path, args)
    assert words in err.value.one_line() and "\n" not in err.value.one_line() and err.value.exit_code == 2


def test_a_script_without_a_main_parser_is_not_checked(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import argparse\np = argparse.ArgumentParser()\nargs, _ = p.parse_known_args()\n")
    assert script_parser.parser_code(script) is None


@pytest.mark.upstream
@pytest.mark.parametrize("words, code, says", [
    (["--use_ema"], 2, "--use_ema after -- is not a flag of train_grpo_wan_2_1.py"),
    (["--lora_rank", "64"], 2, "--lora_rank after -- is not a flag of train_grpo_wan_2_1.py"),
    (["--max_train_step", "10"], 2, "--max_train_step after -- is an abbreviation of train_grpo_wan_2_1.py's "
                                    "--max_train_steps"),
    (["--h", "500"], 2, "--h 500 is not a positive multiple of 16"),
])
def test_launch_wan_dry_run_refuses_what_its_trainer_would(dry_run_tree, tmp_path, capsys, words, code, says):
    assert main(["-C", str(dry_run_tree.project.root), "launch", "wan", "--dry-run", "--", *words]) == code
    captured = capsys.readouterr()
    assert says in captured.err + captured.out
    assert not (tmp_path / "runs").exists()  # nothing made, nothing started


@pytest.mark.upstream
def test_the_dry_run_plan_says_the_trainer_parsed_the_arguments(dry_run_tree, capsys):
    main(["-C", str(dry_run_tree.project.root), "launch", "wan", "--dry-run", "--", "--max_train_steps", "10"])
    out = capsys.readouterr().out
    assert "# the script's arguments: checked by train_grpo_wan_2_1.py's own parser" in out
    assert "--max_train_steps 10" in out and "--max_train_steps 1000" not in out
