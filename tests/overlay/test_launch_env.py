"""overlay/dancegrpo_port/launch_env.py: what upstream's launch scripts do around a trainer."""

from __future__ import annotations

import pytest
from overlay_runner import OVERLAY  # noqa: F401  (puts overlay/ on sys.path)

from dancegrpo_port import launch_env  # noqa: E402


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "On"])
def test_wandb_disabled_disables_wandb(value):
    assert launch_env.wandb_mode({"WANDB_DISABLED": value}) == "disabled"


@pytest.mark.parametrize("env", [{}, {"WANDB_DISABLED": ""}, {"WANDB_DISABLED": "false"}, {"WANDB_DISABLED": "0"},
                                 {"WANDB_MODE": "offline"}])
def test_otherwise_wandb_reads_its_own_settings(env):
    assert launch_env.wandb_mode(env) is None


def test_wandb_mode_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv("WANDB_DISABLED", "true")
    assert launch_env.wandb_mode() == "disabled"
    monkeypatch.delenv("WANDB_DISABLED")
    assert launch_env.wandb_mode() is None


def test_make_sample_dirs_makes_each_and_keeps_what_is_there(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "kept.png").write_bytes(b"x")
    launch_env.make_sample_dirs("./videos", "./images")
    assert (tmp_path / "videos").is_dir() and (tmp_path / "images" / "kept.png").read_bytes() == b"x"
