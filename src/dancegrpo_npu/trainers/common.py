"""What every trainer row shares: upstream's path flags and the HPS reward's files."""

from __future__ import annotations

from dancegrpo_npu.registry.spec import Bench, BenchPreset, Input

# The HPS reward files the trainers read.  Upstream hard-codes them relative to the working
# directory (./hps_ckpt/...); the port makes them arguments with these defaults, and since the
# script runs in the run directory, launch passes them resolved against the tree.
HPS_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--hps_open_clip_ckpt", "hps_ckpt/open_clip_pytorch_model.bin"),
    ("--hps_ckpt", "hps_ckpt/HPS_v2.1_compressed.pt"),
)

TRAIN_PATH_FLAGS = (
    "--pretrained_model_name_or_path",
    "--dit_model_name_or_path",
    "--vae_model_path",
    "--cache_dir",
    "--data_json_path",
    "--output_dir",
    "--logging_dir",
    "--resume_from_checkpoint",
    "--resume_from_lora_checkpoint",
    "--hps_open_clip_ckpt",
    "--hps_ckpt",
    "--hps_model",
)

PREPROCESS_PATH_FLAGS = ("--model_path", "--output_dir", "--prompt_dir", "--cache_dir")

HPS_INPUTS = (
    Input(flag="--hps_open_clip_ckpt", kind="file", what="open_clip ViT-H-14 weights for the HPS reward"),
    Input(flag="--hps_ckpt", kind="file", what="HPS_v2.1_compressed.pt reward weights"),
)

PROMPTS_INPUT = Input(flag="--prompt_dir", kind="file",
                      what="prompt file (upstream's is assets/prompts.txt: `dancegrpo-npu fetch --with-assets`)")


def dataset_input(preprocess: str) -> Input:
    return Input(flag="--data_json_path", kind="embeddings",
                 what=f"RL-embeddings dataset: run `dancegrpo-npu launch {preprocess}` first")


def weights_input(what: str) -> Input:
    """The trainer's weights as upstream's README lays them out: transformer/ and vae/."""
    return Input(flag="--pretrained_model_name_or_path", kind="models", models=("transformer", "vae"), what=what,
                 weights=True)


def vae_input(what: str) -> Input:
    """The trainers' --vae_model_path: a directory holding vae/ (the weights' own, in upstream's recipes)."""
    return Input(flag="--vae_model_path", kind="models", models=("vae",), what=what, weights=True)


def pipeline_input(flag: str, what: str, models: tuple[str, ...], folders: tuple[str, ...] = ("tokenizer",),
                   weights: bool = False) -> Input:
    """A whole pipeline as a script loads it: model_index.json, each of ``models`` with its config
    and weights, and ``folders`` (tokenizers, a processor) not empty."""
    return Input(flag=flag, kind="pipeline", what=what, models=models, folders=folders, weights=weights)


# The pipeline of a model with two text encoders (FLUX.1-dev's and HunyuanVideo's diffusers layout)
TWO_ENCODER_PIPELINE = dict(models=("transformer", "vae", "text_encoder", "text_encoder_2"),
                            folders=("tokenizer", "tokenizer_2"))
# and of one with one text encoder
ONE_ENCODER_PIPELINE = dict(models=("transformer", "vae", "text_encoder"), folders=("tokenizer",))


def preprocess_defaults(model_path: str, prompts: str = "./assets/prompts.txt", *more) -> tuple:
    """A preprocessing script's defaults as upstream's scripts/preprocess/*.sh give them."""
    return (("--model_path", model_path), ("--output_dir", "data/rl_embeddings"), ("--prompt_dir", prompts), *more)


# The sampler of the tiny bench presets: those are the tool's own smoke-size shapes, not
# upstream's recipe, so they set every size themselves and resolve without a patched tree.
TINY_SAMPLER = dict(timestep_fraction=0.6, eta=0.3, shift=3.0)


def short_run_bench(why: str, sample_batch_flag: bool = True) -> Bench:
    """The bench of a trainer timed by a short run on its smoke's tiny models (``why``: why not in
    process, which bench says with its results); the other sizes would need the model's weights on
    disk, which only an in-process bench builds from configs."""
    no_weights = ("a short run needs the model's weights on disk, and the tool ships only the smoke's tiny ones; "
                  "`dancegrpo-npu plan` estimates the memory at full size")
    return Bench(presets=(BenchPreset(size="tiny", summary="a short run of the smoke: its tiny models and sizes, "
                                                          "the seam's phase times"),),
                 no_sizes=(("cpu", no_weights), ("full", no_weights)), short_run=why,
                 sample_batch_flag=sample_batch_flag)
