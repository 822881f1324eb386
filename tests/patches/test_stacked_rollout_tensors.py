"""The tensors a rollout collects keep the values they had when collected.

Upstream's open pull request "Fix checkpoints leakage issues in GRPO training" (SD-GRPO's
trainer) adds ``.detach().clone()`` where the per-step latents and log-probs are stacked,
``.detach()`` to the rewards and advantages, and ``.clone()`` to every use of the initial
latents.  Those copies change a run only if something writes in place into a tensor after it
is collected (through the same storage: ``+=``, ``.copy_``, ``x[...] =``, an in-place scheduler
step) or if a collected tensor carries an autograd graph.  These tests measure both on the
real upstream functions of the patched tree, tiny models on the CPU:

- SD (``pipeline_with_logprob`` and ``ddim_step_with_logprob``): every step's latents and
  log-prob, copied the moment the scheduler step returns them, equal what the trainer stacks;
  the initial latents the trainer reuses for a group's later batches come out of a rollout
  unchanged; the training step's forward and backward on views of the stacked rollout leave it
  unchanged; nothing collected requires grad.
- Flux and Wan2.1 (``run_sample_step``, ``flux_step``, ``grpo_one_step`` of train_grpo_flux.py
  and train_grpo_wan_2_1.py, Wan2.1 in the diffusers-0.35 set): the same, at upstream's batch
  of one and the port's batched rollout (the shared --init_same_noise draw expanded over the
  batch, ``dancegrpo_port/rollout.py``).
- The whole Flux trainer for one step: every tensor reported at the seam (the rollout's
  latents and log-probs, rewards, advantages, every training sample's tensors) has, at the
  step's end, its version counter and its values as when reported.
- Every trainer's data path (SD, Flux, Flux-LoRA, Wan2.1, Qwen-Image, Qwen-Image-Edit): the
  in-place writes there are, by name, none of them into a collected tensor.

Each check is a copy taken when the tensor is collected plus the tensor's version counter (it
counts in-place writes through any view of its storage).  The ``tamper`` runs make one such
write, as aliasing would, and the same check must see it: the check is not one that cannot fail.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess

import pytest
from patched_tree_runner import run_in_tree  # noqa: F401  (a fixture)

pytest.importorskip("torch")
pytest.importorskip("diffusers")

pytestmark = pytest.mark.upstream

# Tensors as they were when collected: the tensor, its version counter, a copy.
WATCH = '''
import json, sys, torch

class Watch:
    def __init__(self):
        self.items = []

    def add(self, name, tensor):
        self.items.append((name, tensor, tensor._version, tensor.detach().clone()))

    def changed(self):
        return [name for name, t, version, copy in self.items
                if t._version != version or not torch.equal(t.detach(), copy)]

    def with_grad(self):
        return [name for name, t, _, _ in self.items if t.requires_grad or t.grad_fn is not None]

watch = Watch()
tamper = sys.argv[1] == "tamper"
'''

# The end of the SD, Flux and Wan snippets: what the watch saw, as one JSON line.
REPORT = '''
out["changed"] = watch.changed()
out["with_grad"] = watch.with_grad()
print("RESULT " + json.dumps(out))
'''

SD = WATCH + '''
from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
import fastvideo.models.stable_diffusion.pipeline_with_logprob as P

torch.manual_seed(0)
unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
                            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
                            attention_head_dim=2, norm_num_groups=4)
vae = AutoencoderKL(down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                    block_out_channels=[8, 8], latent_channels=4, norm_num_groups=4, sample_size=16)
pipe = StableDiffusionPipeline(vae=vae, text_encoder=None, tokenizer=None, unet=unet, scheduler=DDIMScheduler(),
                               safety_checker=None, feature_extractor=None, requires_safety_checker=False)
pipe.set_progress_bar_config(disable=True)
B, STEPS, ETA, CFG = 2, 4, 1.0, 5.0
embeds, negative = torch.randn(B, 3, 16), torch.randn(B, 3, 16)

# the pipeline's scheduler step, wrapped: what it returns is copied as it returns it
ddim_step = P.ddim_step_with_logprob
steps = []
def step(*args, **kwargs):
    prev_sample, log_prob = ddim_step(*args, **kwargs)
    if tamper and steps:
        steps[-1][0].add_(1.0)  # the previous step's latents written in place after they were collected
    steps.append((prev_sample, log_prob, prev_sample.clone(), log_prob.clone()))
    watch.add(f"step {len(steps)} latents", prev_sample)
    watch.add(f"step {len(steps)} log_prob", log_prob)
    return prev_sample, log_prob
P.ddim_step_with_logprob = step

out = {"sampling": [], "starts_equal": None}
input_latents = torch.randn(B, 4, 8, 8)
watch.add("input latents", input_latents)  # the trainer reuses it, uncloned, for a group's later batches
starts = []
for run in range(2):
    steps.clear()
    with torch.no_grad():
        _, _, latents, log_probs = P.pipeline_with_logprob(
            pipe, prompt_embeds=embeds, negative_prompt_embeds=negative, num_inference_steps=STEPS,
            guidance_scale=CFG, eta=ETA, output_type="pt", latents=input_latents)
    watch.add(f"run {run} first latents", latents[0])
    first = latents[0].clone()
    latents = torch.stack(latents, dim=1).detach()  # upstream's lines
    log_probs = torch.stack(log_probs, dim=1).detach()
    starts.append(first)
    expected = torch.stack([first] + [s[2] for s in steps], dim=1)
    if not torch.equal(latents, expected):
        out["sampling"].append(f"run {run}: stacked latents differ from the copies taken at each step")
    if not torch.equal(log_probs, torch.stack([s[3] for s in steps], dim=1)):
        out["sampling"].append(f"run {run}: stacked log-probs differ from the copies taken at each step")
out["starts_equal"] = torch.equal(starts[0], starts[1])

# training on views of the stacked rollout: upstream's samples dict, then its training step
timesteps = pipe.scheduler.timesteps.repeat(B, 1)
watch.add("rollout latents (stacked)", latents)
watch.add("rollout log_probs (stacked)", log_probs)
samples = {"timesteps": timesteps[:, :-1], "latents": latents[:, :-1][:, :-1], "next_latents": latents[:, 1:][:, :-1],
           "log_probs": log_probs[:, :-1]}
unet.train()
for j in range(2):
    noise_pred = unet(torch.cat([samples["latents"][:, j]] * 2), torch.cat([samples["timesteps"][:, j]] * 2),
                      torch.cat([negative, embeds])).sample
    uncond, text = noise_pred.chunk(2)
    _, log_prob = ddim_step(pipe.scheduler, uncond + CFG * (text - uncond), samples["timesteps"][:, j],
                            samples["latents"][:, j], eta=ETA, prev_sample=samples["next_latents"][:, j])
    ratio = torch.exp(log_prob - samples["log_probs"][:, j])
    torch.mean(-torch.tensor([1.0, -1.0]) * ratio).backward()
    if tamper:
        samples["next_latents"][:, j].mul_(2.0)
out["trained"] = all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in unet.parameters() if p.requires_grad)
''' + REPORT

FLUX = WATCH + '''
import os, types
os.environ.setdefault("RANK", "0")
from diffusers import FluxTransformer2DModel
import fastvideo.train_grpo_flux as T
from dancegrpo_port import rollout

config = json.loads(sys.argv[2])
torch.manual_seed(0)
transformer = FluxTransformer2DModel(**config)
G, C, LH, LW, STEPS = 2, 16, 8, 8, 4
args = types.SimpleNamespace(eta=0.3)
sigmas = T.sd3_time_shift(3.0, torch.linspace(1, 0, STEPS + 1))
text = torch.randn(G, 5, 16)
pooled = torch.randn(G, 16)
text_ids = torch.zeros(G, 3)

flux_step = T.flux_step
steps = []
def step(*a, **k):
    out = flux_step(*a, **k)
    if k.get("prev_sample") is None:  # a sampling step: its z and log-prob are collected
        z, _, log_prob = out
        if tamper and steps:
            steps[-1][0].add_(1.0)  # the previous step's latents written in place after they were collected
        steps.append((z, log_prob, z.clone(), log_prob.clone()))
        watch.add(f"batch {batch} step {len(steps)} latents", z)
        watch.add(f"batch {batch} step {len(steps)} log_prob", log_prob)
    return out
T.flux_step = step

out = {"sampling": []}
shared = torch.randn(1, C, LH, LW, dtype=torch.bfloat16)  # --init_same_noise: one draw, every batch
watch.add("shared initial latents", shared)
batch = 0
for n in (1, G):  # upstream's batch of one; the port's batched rollout of the whole group
    for first in range(0, G, n):
        batch += 1
        steps.clear()
        z0 = T.pack_latents(rollout.per_sample(shared, n), n, C, LH, LW)  # the patched trainer's line
        z0_copy = z0.clone()
        watch.add(f"batch {batch} packed initial latents", z0)
        image_ids = T.prepare_latent_image_ids(n, LH // 2, LW // 2, "cpu", torch.bfloat16)
        rows = slice(first, first + n)
        with torch.no_grad():
            _, _, latents, log_probs = T.run_sample_step(args, z0, range(STEPS), sigmas, transformer, text[rows],
                                                         pooled[rows], text_ids[rows], image_ids, True)
        watch.add(f"batch {batch} latents (stacked)", latents)
        watch.add(f"batch {batch} log_probs (stacked)", log_probs)
        if not torch.equal(latents, torch.stack([z0_copy] + [s[2] for s in steps], dim=1)):
            out["sampling"].append(f"batch {batch}: stacked latents differ from the copies taken at each step")
        if not torch.equal(log_probs, torch.stack([s[3] for s in steps], dim=1)):
            out["sampling"].append(f"batch {batch}: stacked log-probs differ from the copies taken at each step")

# training on views of the last (batched) rollout: upstream's samples dict, then grpo_one_step
timesteps = torch.tensor([[int(s * 1000) for s in sigmas][:STEPS]] * G)
samples = {"latents": latents[:, :-1][:, :-1], "next_latents": latents[:, 1:][:, :-1], "log_probs": log_probs[:, :-1],
           "timesteps": timesteps[:, :-1]}
for i in range(G):
    for j in range(2):
        new = T.grpo_one_step(args, samples["latents"][i:i + 1, j], samples["next_latents"][i:i + 1, j], text[i:i + 1],
                              pooled[i:i + 1], text_ids[i:i + 1], image_ids.unsqueeze(0), transformer,
                              samples["timesteps"][i:i + 1, j], j, sigmas)
        ratio = torch.exp(new - samples["log_probs"][i:i + 1, j])
        torch.mean(-(1.0 if i else -1.0) * ratio).backward()
        if tamper:
            samples["latents"][i:i + 1, j].mul_(2.0)
out["trained"] = any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in transformer.parameters())
''' + REPORT

WAN = WATCH + '''
import os, types
os.environ.setdefault("RANK", "0")
from diffusers import WanTransformer3DModel
import fastvideo.train_grpo_wan_2_1 as T
from dancegrpo_port import rollout

config = json.loads(sys.argv[2])
torch.manual_seed(0)
transformer = WanTransformer3DModel(**config)
G, C, LT, LH, LW, STEPS = 2, 16, 1, 8, 8, 4
args = types.SimpleNamespace(eta=0.3, cfg_infer=5.0)  # upstream's Wan recipe samples with guidance
sigmas = T.sd3_time_shift(3.0, torch.linspace(1, 0, STEPS + 1))
text = torch.randn(G, 5, config["text_dim"])
negative = torch.randn(G, 5, config["text_dim"])

flux_step = T.flux_step
steps = []
def step(*a, **k):
    out = flux_step(*a, **k)
    if k.get("prev_sample") is None:
        z, _, log_prob = out
        if tamper and steps:
            steps[-1][0].add_(1.0)
        steps.append((z, log_prob, z.clone(), log_prob.clone()))
        watch.add(f"batch {batch} step {len(steps)} latents", z)
        watch.add(f"batch {batch} step {len(steps)} log_prob", log_prob)
    return out
T.flux_step = step

out = {"sampling": []}
shared = torch.randn(1, C, LT, LH, LW, dtype=torch.bfloat16)  # --init_same_noise
watch.add("shared initial latents", shared)
batch = 0
for n in (1, G):
    for first in range(0, G, n):
        batch += 1
        steps.clear()
        z0 = rollout.per_sample(shared, n).clone()  # the patched trainer's line
        z0_copy = z0.clone()
        rows = slice(first, first + n)
        with torch.no_grad():
            _, _, latents, log_probs = T.run_sample_step(args, z0, range(STEPS), sigmas, transformer, text[rows],
                                                         negative[rows], True)
        watch.add(f"batch {batch} latents (stacked)", latents)
        watch.add(f"batch {batch} log_probs (stacked)", log_probs)
        if not torch.equal(latents, torch.stack([z0_copy] + [s[2] for s in steps], dim=1)):
            out["sampling"].append(f"batch {batch}: stacked latents differ from the copies taken at each step")
        if not torch.equal(log_probs, torch.stack([s[3] for s in steps], dim=1)):
            out["sampling"].append(f"batch {batch}: stacked log-probs differ from the copies taken at each step")

timesteps = torch.tensor([[int(s * 1000) for s in sigmas][:STEPS]] * G)
samples = {"latents": latents[:, :-1][:, :-1], "next_latents": latents[:, 1:][:, :-1], "log_probs": log_probs[:, :-1],
           "timesteps": timesteps[:, :-1]}
for i in range(G):
    for j in range(2):
        new = T.grpo_one_step(args, samples["latents"][i:i + 1, j], samples["next_latents"][i:i + 1, j],
                              text[i:i + 1], negative[i:i + 1], transformer, samples["timesteps"][i:i + 1, j], j, sigmas)
        ratio = torch.exp(new - samples["log_probs"][i:i + 1, j])
        torch.mean(-(1.0 if i else -1.0) * ratio).backward()
        if tamper:
            samples["latents"][i:i + 1, j].mul_(2.0)
out["trained"] = any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in transformer.parameters())
''' + REPORT

# FLUX.1-dev's shapes shrunk as the smoke's fixtures shrink them (src/dancegrpo_npu/trainers/flux/tiny_models.py)
TINY_FLUX = {"patch_size": 1, "in_channels": 64, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16,
             "num_attention_heads": 2, "joint_attention_dim": 16, "pooled_projection_dim": 16, "guidance_embeds": True,
             "axes_dims_rope": [4, 6, 6]}


def result(run) -> dict:
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, run.stdout[-2000:] + run.stderr[-2000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_sd_rollout_and_training_step_leave_collected_tensors_alone(run_in_tree):
    got = result(run_in_tree(SD, args=("measure",)))
    assert got["sampling"] == [], got["sampling"]
    assert got["changed"] == [], "written in place after being collected: " + ", ".join(got["changed"])
    assert got["with_grad"] == []  # the PR's .detach(): nothing to cut
    assert got["starts_equal"]  # a reused input_latents starts the next batch where the first started
    assert got["trained"]

    control = result(run_in_tree(SD, args=("tamper",)))
    assert control["sampling"] == [f"run {run}: stacked latents differ from the copies taken at each step"
                                   for run in (0, 1)]
    assert "input latents" not in control["changed"] and "rollout latents (stacked)" in control["changed"]
    assert any(name.endswith("latents") and name.startswith("step") for name in control["changed"])


def test_flux_rollout_and_training_step_leave_collected_tensors_alone(run_in_tree):
    got = result(run_in_tree(FLUX, args=("measure", json.dumps(TINY_FLUX))))
    assert got["sampling"] == [], got["sampling"]
    assert got["changed"] == [], "written in place after being collected: " + ", ".join(got["changed"])
    assert got["with_grad"] == []
    assert got["trained"]

    control = result(run_in_tree(FLUX, args=("tamper", json.dumps(TINY_FLUX))))
    assert any("stacked latents differ" in line for line in control["sampling"])
    assert "batch 3 latents (stacked)" in control["changed"]


def run_with_diffusers_035(tree, tmp_path, code: str, *args: str):
    """``code`` in the diffusers-0.35 set's interpreter (Wan2.1's classes) over the patched tree."""
    from depset_035 import diffusers_035_python

    python = diffusers_035_python()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DANCEGRPO_", "WANDB_"))}
    env.update(PYTHONPATH=str(tree), OMP_NUM_THREADS="1", DANCEGRPO_DEVICE="cpu", WANDB_MODE="disabled")
    script = tmp_path / "snippet.py"
    script.write_text(code)
    proc = subprocess.run([python, str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


@pytest.mark.slow
@pytest.mark.extended  # the same code path as Flux's, in the second dependency set
def test_wan_rollout_and_training_step_leave_collected_tensors_alone(patched_tree, tmp_path):
    from dancegrpo_npu.trainers.wan.fixtures import TRANSFORMER_CONFIG

    config = json.dumps(TRANSFORMER_CONFIG)
    got = result(run_with_diffusers_035(patched_tree.tree, tmp_path, WAN, "measure", config))
    assert got["sampling"] == [], got["sampling"]
    assert got["changed"] == [], "written in place after being collected: " + ", ".join(got["changed"])
    assert got["with_grad"] == []
    assert got["trained"]

    control = result(run_with_diffusers_035(patched_tree.tree, tmp_path, WAN, "tamper", config))
    assert any("stacked latents differ" in line for line in control["sampling"])
    assert "batch 3 latents (stacked)" in control["changed"]


# ---------------------------------------------------------------- the whole Flux trainer, one step

# Runs the patched trainer as __main__ with the seam's hooks wrapped: every tensor the trainer
# reports is watched from the moment it is reported to the end of its step.
TRAINER_STEP = WATCH + '''
import runpy
from dancegrpo_port import hooks

script, out_path = sys.argv[2:4]
sys.argv = [script, *sys.argv[4:]]
steps = []

def wrap(name, before):
    call = getattr(hooks, name)
    def wrapped(*args, **kwargs):
        before(*args, **kwargs)
        return call(*args, **kwargs)
    setattr(hooks, name, wrapped)

rollouts = []

def sampled(latents, log_probs):
    rollouts.append(latents)
    watch.add(f"rollout {len(rollouts)} latents", latents)
    watch.add(f"rollout {len(rollouts)} log_probs", log_probs)

def advantages(rewards, advantages):
    watch.add("rewards", rewards)
    watch.add("advantages", advantages)

def training(items):
    for i, sample in items:
        for key, value in sample.items():
            if torch.is_tensor(value):
                watch.add(f"sample {i} {key}", value)

def trained_pair(new_log_prob, old_log_prob, ratio, loss):
    if tamper:
        old_log_prob.add_(1.0)  # a stored log-prob written in place after it was trained on

def step_end(step, **figures):
    steps.append({"step": step, "watched": len(watch.items), "changed": watch.changed(), "with_grad": watch.with_grad()})
    watch.items.clear()
    rollouts.clear()

for name, before in (("sampled", sampled), ("advantages", advantages), ("training", training),
                     ("trained_pair", trained_pair), ("step_end", step_end)):
    wrap(name, before)
try:
    runpy.run_path(script, run_name="__main__")
finally:
    with open(out_path, "w") as f:
        json.dump(steps, f)
'''


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.slow
# upstream's rollout, one generation at a time (CI); the port's batched one (extended)
@pytest.mark.parametrize("batch", [1, pytest.param(2, marks=pytest.mark.extended)])
def test_flux_trainer_step_leaves_reported_tensors_alone(run_in_tree, patched_tree, shared_runs, tmp_path, batch):
    from shared_runs import flux_fixtures

    from dancegrpo_npu.trainers.flux.smoke import trainer_args

    fixtures = flux_fixtures(shared_runs, patched_tree.project)  # the smoke's, built once a test run
    args = trainer_args(fixtures, False, steps=1, generations=2) + (
        "--output_dir", str(tmp_path / "outputs"), "--sample_batch_size", str(batch))
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": _free_port(), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    script = str(patched_tree.tree / "fastvideo/train_grpo_flux.py")

    def step_of(mode):
        out = tmp_path / f"{mode}.json"
        run_in_tree(TRAINER_STEP, env=env, timeout=600, args=(mode, script, str(out), *args))
        steps = json.loads(out.read_text())
        print(mode, json.dumps(steps))
        assert [s["step"] for s in steps] == [1]
        return steps[0]

    got = step_of("measure")
    # 2 // batch rollouts x 2 + rewards, advantages + 2 samples x (timesteps, latents, next_latents, log_probs, rewards,
    # advantages, image_ids, text_ids, encoder_hidden_states, pooled_prompt_embeds)
    assert got["watched"] == 2 // batch * 2 + 2 + 2 * 10
    assert got["changed"] == [], "written in place after being reported: " + ", ".join(got["changed"])
    assert got["with_grad"] == []

    if batch == 1:  # the check sees a write, once
        control = step_of("tamper")
        assert control["changed"] == ["sample 0 log_probs", "sample 1 log_probs"]


# ---------------------------------------------------------------- every trainer's data path, read

# The functions a trainer's rollout tensors go through, from sampling to the update (SD-GRPO's
# all live in main()).  Hunyuan and SkyReels are not run by the port.
DATA_PATH = ("flux_step", "run_sample_step", "grpo_one_step", "sample_reference_model", "train_one_step", "main")
TRAINERS = ("train_grpo_sd.py", "train_grpo_flux.py", "train_grpo_flux_lora.py", "train_grpo_wan_2_1.py",
            "train_grpo_qwenimage.py", "train_grpo_qwenimage_edit.py")
# Functions that write into their first argument.
WRITES_ARGUMENT = ("all_reduce", "all_reduce_mean", "all_gather", "broadcast", "reduce")

# Every in-place write on the data path, and why it does not reach a collected tensor.  The
# check reads names, not types: a dict entry rebound (``samples[key] = ...``) is listed too.
WRITES_ALLOWED = {
    "advantages[]": "the step's advantages, written group by group into the torch.zeros_like made for them",
    "samples[]": "samples[key] = samples[key][rows, perms]: the entry rebound to a permuted copy (indexing copies)",
    "samples['advantages']": "a dict entry bound",
    "samples['final_advantages']": "a dict entry bound (SD: the same tensor as samples['advantages'], never written)",
    "avg_loss": "the logged loss, reduced in its own loss.detach().clone()",
    "total_loss": "a Python float",
    "global_step": "a Python int",
    "gathered_tensors": "the torch.zeros_like buffers all_gather fills",
    "info": "SD's logged figures (accelerator.reduce returns reduced copies)",
    "transformer.clip_grad_norm_": "the gradients",
    "accelerator.clip_grad_norm_": "the gradients",
}
# SD-GRPO's main() also sets the run up: its configuration, pipeline parts and flags.
SD_SETUP = {"config.resume_from", "config.run_name", "lora_attn_procs[]", "model_dict['model']",
            "model_dict['preprocess_val']", "pipeline.safety_checker", "pipeline.scheduler",
            "pipeline.text_encoder.requires_grad_", "pipeline.unet.requires_grad_", "pipeline.vae.requires_grad_",
            "torch.backends.cuda.matmul.allow_tf32"}


def in_place_writes(source: str) -> set:
    """(function, target) of every in-place write in the data-path functions: item assignment
    (``x[i] = ...``, shown ``x[]``; a constant key as ``x['key']``), augmented assignment,
    a trailing-underscore method (``x.add_``), an attribute assignment, and the collectives
    that write into their first argument."""
    writes = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name in DATA_PATH:
            for inner in ast.walk(node):
                for target in _targets(inner):
                    writes.add((node.name, target))
    return writes


def _targets(node):
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            if isinstance(target, ast.Subscript):
                key = target.slice
                shown = f"[{key.value!r}]" if isinstance(key, ast.Constant) else "[]"
                yield ast.unparse(target.value) + shown
            elif isinstance(target, ast.Attribute) or isinstance(node, ast.AugAssign):
                yield ast.unparse(target)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        name = node.func.attr
        if name.endswith("_") and not name.startswith("_"):
            yield ast.unparse(node.func)
        elif name in WRITES_ARGUMENT and node.args:
            yield ast.unparse(node.args[0])
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in WRITES_ARGUMENT and node.args:
        yield ast.unparse(node.args[0])


@pytest.mark.parametrize("trainer", TRAINERS)
def test_data_path_writes_in_place_only_into_its_own_buffers(patched_tree, trainer):
    sd = trainer == "train_grpo_sd.py"
    writes = {target for function, target in in_place_writes((patched_tree.tree / "fastvideo" / trainer).read_text())
              if function != "main" or sd}  # a flow trainer's main() sets the run up; SD's holds the loop
    unknown = writes - set(WRITES_ALLOWED) - (SD_SETUP if sd else set())
    assert not unknown, (f"{trainer}: in-place writes on the data path not known to stay out of the collected "
                         f"tensors: {sorted(unknown)}")
    assert "advantages[]" in writes  # the check reads the functions it means to
