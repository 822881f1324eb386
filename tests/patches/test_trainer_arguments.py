"""Bad trainer arguments stop the stock trainers at start, with one line that says what is wrong,
before any model is loaded: the seam's check of upstream's own arguments (dancegrpo_port/
upstream_args.py) and hps-paths-as-arguments.patch's missing HPS file.  The scripts run as torchrun starts them (its
rank variables set)."""

from __future__ import annotations

import pytest
from patched_tree_runner import run_in_tree  # noqa: F401  (a fixture)

SCRIPT = "fastvideo/train_grpo_flux.py"
LORA = "fastvideo/train_grpo_flux_lora.py"
RUN_SCRIPT = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
TORCHRUN_ENV = {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}


@pytest.mark.upstream
@pytest.mark.parametrize("script", [SCRIPT, LORA])
def test_samples_per_step_not_a_multiple_of_accumulation(run_in_tree, patched_tree, script):
    proc = run_in_tree(RUN_SCRIPT, check=False, env=TORCHRUN_ENV, args=(
        str(patched_tree.tree / script), "--data_json_path", "x.json", "--train_batch_size", "1",
        "--num_generations", "3", "--use_group", "--gradient_accumulation_steps", "2"))
    assert proc.returncode == 2
    assert ("error: 3 samples per step (--train_batch_size x --num_generations) is not a multiple of "
            "--gradient_accumulation_steps 2") in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.upstream
def test_missing_hps_checkpoint_names_the_path(run_in_tree, patched_tree, tmp_path):
    config = tmp_path / "tiny.json"
    config.write_text("{}")
    proc = run_in_tree(RUN_SCRIPT, check=False, args=(
        str(patched_tree.tree / SCRIPT), "--data_json_path", "x.json", "--use_hpsv2", "--hps_model", str(config),
        "--hps_open_clip_ckpt", str(config), "--hps_ckpt", str(tmp_path / "nope" / "HPS_v2.1_compressed.pt")))
    assert proc.returncode == 2
    assert f"error: HPSv2 file not found: {tmp_path / 'nope' / 'HPS_v2.1_compressed.pt'} (pass --hps_ckpt PATH)" in proc.stderr
    assert "Traceback" not in proc.stderr
