"""Every patch after the foundation can be left out alone: `apply --without P` builds, and the
smoke runs on the tree without P (slow: one 1-step smoke per patch, on one fetched project).

The foundation is groups 1-3 of patches/series: imports without CUDA-only packages, the device,
and the seam that every feature plugs into.  For every later patch the table says what the
smoke does on the tree without it: it passes (the patch is a feature the smoke does not use, or
a fix the launch already covers), or it stops with the error the patch exists to prevent (or,
for a patch that adds trainer flags, the smoke's use of them).  A patch added to the series
without a row here fails the table test: each new patch says what leaving it out does.
"""

from __future__ import annotations

import pytest
from conftest import PROJECT_ROOT, copy_project, require_video_extra
from snippet import run_snippet

pytest.importorskip("torch")
pytest.importorskip("diffusers")

FOUNDATION_GROUPS = 3  # the `# N.` group comments of patches/series that are the foundation

# patch -> None: the smoke passes without it; a text: the smoke fails, and its error says this
WITHOUT = {
    "caption-list.patch": "Unsupported caption type",
    "resume-assert.patch": None,  # the smoke does not resume; with the assert the seam resumes as well
    "images-dir.patch": None,  # launch makes ./images in the run directory, as upstream's scripts do
    "wandb-disabled.patch": None,  # the smoke runs with WANDB_MODE=disabled
    "sd-unet-checkpoint.patch": None,  # the Stable Diffusion trainer's: SD_WITHOUT
    "sd-latents-without-mixed-precision.patch": None,  # the Stable Diffusion trainer's: SD_WITHOUT
    "hunyuan-noise-per-rank.patch": None,  # the HunyuanVideo trainer's: HUNYUAN_WITHOUT
    # refused before the run starts, by the trainer's own parser (run.script_parser)
    "hps-paths-as-arguments.patch": "--hps_model is not a flag of train_grpo_flux.py",
    "preprocess-model-path.patch": None,  # the smoke builds its embeddings itself
    "allow-tf32-hf32.patch": None,  # no TF32 or HF32 on the CPU
    "attention-from-device.patch": None,  # no NPU processor to replace without torch_npu
    "batched-rollout.patch": None,  # --sample_batch_size 1, upstream's loop
    "rewards-in-batches.patch": None,  # one image a batch: upstream's rewards
    "preprocess-destroy-process-group.patch": None,  # the smoke runs no preprocessing
}
# Group 11, after the trainers' own groups, touches every trainer; its FLUX smoke is run as group 4's
LATER_WITHOUT = {
    # the suite's torch takes ReduceOp.AVG on gloo; torch 2.7.1's refuses it (tests/smoke/test_torch_line.py)
    "gloo-loss-average.patch": None,
}

# Group 12 changes VideoAlign (fastvideo/models/videoalign), the video trainers' reward, which no
# FLUX smoke loads: the tree without it builds and keeps the Flux trainers, and upstream's
# VideoVLMRewardInference on it stops loading a tiny VideoAlign checkpoint on the CPU with this.
VIDEO_WITHOUT = {
    "videoalign-on-every-device.patch": "FlashAttention2 has been toggled on, but it cannot be used",
}

# The HunyuanVideo patches after the foundation (SkyReels-I2V's rows of videoalign-paths-as-arguments and videoalign-rewards too) (its rows of the concern patches aside): the
# tree without each builds and keeps the Flux trainers (below); what the HunyuanVideo smoke does
# on it is this (measured; extended).
HUNYUAN_WITHOUT = {
    "videoalign-paths-as-arguments.patch": "--videoalign_ckpt is not a flag of",
    "videoalign-rewards.patch": None,  # upstream's reward, the mp4 read back; a failure scores -1.0
    "preprocess-hunyuan.patch": None,  # the smoke builds its embeddings itself
}
# The SkyReels-I2V patches of group 14: the tree without each builds and keeps the Flux trainers.
SKYREELS_WITHOUT = {
    # refused before the run starts, by the trainer's own parser (run.script_parser)
    "skyreels-paths-as-arguments.patch": "--empty_embeddings_dir is not a flag of",
    "skyreels-first-frame-placement.patch": None,  # the smoke runs upstream's placement, the default
    "preprocess-skyreels-empty-prompt.patch": None,  # the smoke builds its embeddings itself
    "skyreels-cfg-float16-embeddings.patch": "Unexpected floating ScalarType in at::autocast::prioritize",
}
# Group 15 changes only the preprocessing scripts: the tree without it builds and keeps the Flux trainers.
PREPROCESS_WITHOUT = {
    "preprocess-order-by-prompt.patch": None,  # the smoke builds its embeddings itself
}
# Group 16 touches every flow trainer; its FLUX smoke is run as group 4's (each trainer's smoke without
# it, the flag absent, is compared with the full series' in tests/patches/test_sde_window.py).
WINDOW_WITHOUT = {
    "sde-window.patch": None,  # no --sde_window_size: upstream's sampling step, count and order
}

# The Wan2.1 patches of group 9 change the Wan trainer and its preprocessing (wan-fsdp also adds a Wan
# branch after the Flux one in fastvideo/utils/load.py): the FLUX smoke runs none of it, so a FLUX
# smoke per patch would measure nothing.  The tree without each builds (below); what the Wan
# smoke does without it is this (measured; docs/port.md), and for wan-fsdp tested in
# tests/smoke/test_smoke_wan.py::test_without_the_fsdp_patch_the_ranks_train_separate_copies.
WAN_WITHOUT = {
    "wan-float32-rope.patch": "strict mode: aten.arange.start_step made a torch.float64 tensor on cpu",
    "wan-fsdp.patch": "after training, rank 1 holds other weights than rank 0",
    "preprocess-wan.patch": None,  # the smoke builds its embeddings itself
}

# The Qwen-Image patches change only Qwen-Image's files, which no FLUX smoke runs: the tree
# without each builds and keeps the Flux trainers (below), and the Qwen-Image smoke on it does
# this (extended: CI runs the Qwen-Image smokes on the full series).
QWEN_WITHOUT = {
    "qwenimage-real-rope.patch": "strict mode: aten.polar.default made a torch.complex64 tensor",
    "qwenimage-kernels-from-device.patch": None,  # no torch_npu: diffusers' RMSNorm takes torch's path
    "qwenimage-cpu-offload.patch": None,  # a CPU run offloads nothing either way
    # the smokes build their embeddings themselves; the scripts without them: tests/smoke/test_qwen_fixtures.py
    "preprocess-qwenimage.patch": None,
    "preprocess-qwenimage-edit.patch": None,
}
QWEN_IN_CI = ()  # the Qwen-Image smokes of CI run the full series; the trees without a patch are extended

# The patches after the foundation that change the Stable Diffusion trainer (its own, and its rows
# of the concern patches): what the SD smoke (2 steps, 1 rank) does on the tree without each
# (measured; extended).
SD_WITHOUT = {
    "images-dir.patch": None,  # the rewards are scored from memory: no JPEG goes to ./images_same
    "wandb-disabled.patch": None,  # the smoke runs with WANDB_MODE=disabled
    "sd-unet-checkpoint.patch": "the trainer wrote no checkpoint",  # upstream's go to ./my_checkpoints
    "sd-latents-without-mixed-precision.patch": None,  # the smoke runs upstream's bf16: the same latents
    "hps-paths-as-arguments.patch": "data/stable-diffusion-v1-4",  # upstream's path, in the run directory
    "allow-tf32-hf32.patch": None,  # no TF32 or HF32 on the CPU
    "attention-from-device.patch": None,  # no torch_npu: diffusers' GEGLU takes torch's path
    "rewards-in-batches.patch": None,  # upstream's JPEG round trip, one image at a time
}


def test_the_sd_table_names_every_later_patch_that_changes_the_sd_trainer():
    sd_files = ("fastvideo/train_grpo_sd.py", "fastvideo/config_sd/", "fastvideo/models/stable_diffusion/")
    assert [p for p in after_foundation() if any(f.startswith(sd_files) for f in touched(p))] == list(SD_WITHOUT)


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.upstream
@pytest.mark.parametrize("patch", list(SD_WITHOUT))
def test_the_tree_without_a_patch_runs_the_sd_smoke(project, patch):
    assert_smoke_without(project, patch, SD_WITHOUT[patch], trainer="sd", steps=2)


# A concern patch spans every trainer it touches; `apply --without` takes it out of each.  The
# FLUX smoke on the tree without it is WITHOUT's row; each other trainer's smoke on that tree
# does this (measured; extended: a smoke a trainer a patch).
OTHER_TRAINERS = ("flux-lora", "wan", "qwenimage", "qwenimage-edit")
CONCERN_WITHOUT = {
    "caption-list.patch": "Unsupported caption type",
    "resume-assert.patch": None,
    "images-dir.patch": None,
    "wandb-disabled.patch": None,
    "hps-paths-as-arguments.patch": "--hps_model is not a flag of",
    "allow-tf32-hf32.patch": None,
    "batched-rollout.patch": None,  # upstream's loop, one generation at a time
    "rewards-in-batches.patch": None,  # upstream's rewards (Wan2.1: the first frame read back from the mp4)
    "gloo-loss-average.patch": None,
    "sde-window.patch": None,  # no --sde_window_size: upstream's sampling step, count and order
}


def after_foundation() -> list[str]:
    group, names = 0, []
    for line in (PROJECT_ROOT / "patches" / "series").read_text().splitlines():
        text = line.strip()
        if text.startswith("#") and text[1:].strip()[:1].isdigit() and "." in text[:6]:
            group = int(text[1:].strip().split(".")[0])
        elif text and not text.startswith("#") and group > FOUNDATION_GROUPS:
            names.append(text)
    return names


def test_the_table_names_every_patch_after_the_foundation():
    assert after_foundation() == (list(WITHOUT) + list(WAN_WITHOUT) + list(QWEN_WITHOUT) + list(LATER_WITHOUT)
                                  + list(VIDEO_WITHOUT) + list(HUNYUAN_WITHOUT) + list(SKYREELS_WITHOUT)
                                  + list(PREPROCESS_WITHOUT) + list(WINDOW_WITHOUT))


def assert_smoke_without(project, patch: str, expected: str | None, **options) -> None:
    """The smoke of ``options`` on the tree without ``patch``: it passes, every step of it run
    (``expected`` None), or it stops with an error saying ``expected``."""
    from dancegrpo_npu.engine.apply import apply_worktree
    from dancegrpo_npu.errors import DancegrpoError
    from dancegrpo_npu.smoke import runner as smoke

    apply_worktree(project, without=(patch,), force=True)
    options = smoke.SmokeOptions(device="cpu", **options)
    if expected is None:
        assert len(smoke.run_smoke(project, options).steps) == options.steps
    else:
        with pytest.raises(DancegrpoError) as failed:
            smoke.run_smoke(project, options)
        assert expected in str(failed.value), failed.value


@pytest.fixture(scope="module")
def project(upstream_source, tmp_path_factory):
    from dancegrpo_npu.engine.fetch import fetch
    from dancegrpo_npu.project import find_project

    project = find_project(copy_project(tmp_path_factory.mktemp("each-alone") / "project"))
    fetch(project, source=upstream_source)
    return project


@pytest.mark.upstream
@pytest.mark.parametrize("patch", after_foundation())
def test_the_tree_without_it_builds(project, patch):
    """Every later patch applies without any one of them (a later patch whose context is another's
    added lines would be refused: "no longer applies without it"); the full series builds again."""
    from dancegrpo_npu.engine.apply import apply_worktree
    from dancegrpo_npu.engine.status import verify_tree

    apply_worktree(project, without=(patch,), force=True)
    report = verify_tree(project)
    assert report.without == (patch,) and report.exact, report.differences


@pytest.mark.slow
@pytest.mark.upstream
# CI runs the patches whose absence fails the smoke; the trees whose smoke passes are the extended tier
@pytest.mark.parametrize("patch", [pytest.param(p, marks=() if v else pytest.mark.extended)
                                   for p, v in {**WITHOUT, **LATER_WITHOUT, **WINDOW_WITHOUT}.items()])
def test_the_tree_without_it_builds_and_runs_the_smoke(project, patch):
    assert_smoke_without(project, patch, {**WITHOUT, **LATER_WITHOUT, **WINDOW_WITHOUT}[patch], steps=1)


@pytest.mark.upstream
@pytest.mark.parametrize("patch", list(WAN_WITHOUT) + list(QWEN_WITHOUT) + list(HUNYUAN_WITHOUT)
                         + list(SKYREELS_WITHOUT) + list(PREPROCESS_WITHOUT))
def test_the_tree_without_a_model_patch_builds_and_keeps_the_flux_trainers(project, patch):
    from dancegrpo_npu.engine.apply import apply_worktree
    from dancegrpo_npu.engine.status import verify_tree

    apply_worktree(project, without=(patch,), force=True)
    assert patch in verify_tree(project).without
    tree = project.workdir
    touched = {line.split(" b/", 1)[1] for line in (PROJECT_ROOT / "patches" / patch).read_text().splitlines()
               if line.startswith("diff --git ")}
    assert not touched & {"fastvideo/train_grpo_flux.py", "fastvideo/train_grpo_flux_lora.py"}
    assert all((tree / path).is_file() for path in touched)


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.parametrize("patch", [pytest.param(p, marks=() if p in QWEN_IN_CI else pytest.mark.extended)
                                   for p in QWEN_WITHOUT])
def test_the_tree_without_a_qwen_patch_runs_the_qwenimage_smoke(project, patch):
    from depset_035 import diffusers_035_python

    diffusers_035_python()
    assert_smoke_without(project, patch, QWEN_WITHOUT[patch], trainer="qwenimage", steps=1)


def test_the_concern_table_names_every_patch_that_spans_the_trainers():
    """A patch after the foundation that changes the training code of more than one model family
    (FLUX, Wan2.1, Qwen-Image: their trainers and datasets) has a row here: each trainer's smoke
    without it is measured, not only the FLUX one."""
    def families(patch):
        return {family for path in touched(patch) if "data_preprocess" not in path
                for family in ("flux", "wan", "qwenimage") if family in path}

    assert [p for p in after_foundation() if len(families(p)) > 1] == list(CONCERN_WITHOUT)


def touched(patch: str) -> set[str]:
    return {line.split(" b/", 1)[1] for line in (PROJECT_ROOT / "patches" / patch).read_text().splitlines()
            if line.startswith("diff --git ")}


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.upstream
@pytest.mark.parametrize("trainer", OTHER_TRAINERS)
@pytest.mark.parametrize("patch", list(CONCERN_WITHOUT))
def test_the_tree_without_a_concern_patch_runs_every_trainer(project, patch, trainer):
    if trainer != "flux-lora":
        from depset_035 import diffusers_035_python

        diffusers_035_python()
    steps = 3 if trainer == "qwenimage-edit" else 1
    assert_smoke_without(project, patch, CONCERN_WITHOUT[patch], trainer=trainer, steps=steps)


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.upstream
@pytest.mark.parametrize("trainer", ["wan", "qwenimage"])
def test_without_the_batched_rollout_a_batch_is_refused_at_its_first_batch(project, trainer):
    """Without batched-rollout the Wan2.1 and Qwen-Image trainers run upstream's loop, one
    generation at a time, as the Flux trainers do: a run asked for --sample_batch_size 2 stops at
    its first batch, naming why (the seam checks the batches it sees), not a silent batch of one."""
    from depset_035 import diffusers_035_python

    from dancegrpo_npu.engine.apply import apply_worktree
    from dancegrpo_npu.errors import DancegrpoError
    from dancegrpo_npu.smoke import runner as smoke

    diffusers_035_python()
    apply_worktree(project, without=("batched-rollout.patch",), force=True)
    options = smoke.SmokeOptions(trainer=trainer, steps=1, device="cpu", extra_args=("--sample_batch_size", "2"))
    with pytest.raises(DancegrpoError) as failed:
        smoke.run_smoke(project, options)
    assert "this trainer sampled a batch of 1 (its rollout is not batched" in str(failed.value), failed.value


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.upstream
@pytest.mark.parametrize("trainer, patch", [*(("hunyuan", p) for p in HUNYUAN_WITHOUT),
                                            *(("skyreels-i2v", p) for p in SKYREELS_WITHOUT)])
def test_the_tree_without_a_video_patch_runs_its_smoke(project, trainer, patch):
    require_video_extra()
    assert_smoke_without(project, patch, {**HUNYUAN_WITHOUT, **SKYREELS_WITHOUT}[patch], trainer=trainer, steps=1)


LOAD_VIDEOALIGN = """
from pathlib import Path
import torch
from dancegrpo_npu.trainers.hunyuan.videoalign import build
_, ckpt = build(Path("."))
from fastvideo.models.videoalign.inference import VideoVLMRewardInference
VideoVLMRewardInference(str(ckpt), device="cpu", dtype=torch.bfloat16)
print("loaded")
"""


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.parametrize("patch", list(VIDEO_WITHOUT))
def test_the_tree_without_a_videoalign_patch_keeps_the_flux_trainers_and_loads_no_videoalign(project, patch,
                                                                                           tmp_path):
    from dancegrpo_npu.engine.apply import apply_worktree
    from dancegrpo_npu.engine.status import verify_tree

    require_video_extra()
    apply_worktree(project, without=(patch,), force=True)
    assert patch in verify_tree(project).without
    touched = {line.split(" b/", 1)[1] for line in (PROJECT_ROOT / "patches" / patch).read_text().splitlines()
               if line.startswith("diff --git ")}
    assert touched and all(path.startswith("fastvideo/models/videoalign/") for path in touched)
    proc = run_snippet(LOAD_VIDEOALIGN, tmp_path, [str(PROJECT_ROOT / "src"), str(project.workdir)],
                       {"DANCEGRPO_DEVICE": "cpu"}, check=False, timeout=600)
    assert proc.returncode != 0 and "loaded" not in proc.stdout
    assert VIDEO_WITHOUT[patch] in proc.stderr, proc.stderr[-2000:]
