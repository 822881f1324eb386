"""The memory one rank needs for a GRPO run, estimated from shapes before anything is built.

Plain Python (no torch): the plan answers in milliseconds on a login node.  What it counts,
per rank, in bytes:

- the transformer's fp32 master weights, their fp32 gradients and AdamW's two fp32
  moments (16 bytes a parameter), sharded over the ranks by FSDP's FULL_SHARD; with FSDP's
  CPU offload (``CPUOffload(offload_params=True)``) all three live in host memory instead;
  with LoRA the frozen base is bf16 and only the adapters carry gradients and moments;
- FSDP's working copies: the bf16 weights of the blocks it has gathered (the block that
  runs and the one prefetched), the unsharded bf16 gradients of a block in backward, and
  the root unit (embeddings, the output layers);
- the reward (HPSv2's ViT-H-14, loaded in float32: about 3.9 GB) and the VAE (bf16);
- with the recipe's ``--use_ema`` (FLUX's 8-rank recipe), host memory on rank 0: upstream's
  FSDP_EMA keeps a full fp32 copy of the transformer there, and each update gathers the full
  state dict there once more;
- the activations of the largest phase: rollout (no grad, N samples a transformer call,
  the trajectories kept for training), decode, reward, and training, where a
  checkpointed block keeps only its input and any other block all it saved for backward
  (upstream's ``--selective_checkpointing`` fraction picks which);
- a runtime reserve (the device runtime, collective buffers, the allocator's slack):
  an assumption (``--reserve``), not derived from shapes; it is part of the total, and the
  table says both.

The constants that are not counts (hidden-sized tensors a block saves) are the bench's
own (:mod:`dancegrpo_npu.throughput.models`), checked against the peaks it measures
(tests/plan/test_against_bench.py, docs/memory-plan.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GiB = 1 << 30
# Hidden-sized activation tensors one block keeps per token for its backward, and the ones a
# forward without grad holds at once (the bench's estimate uses the first for both).
SAVED_PER_TOKEN = 24
# FSDP gathers the block that runs and prefetches the next one (BACKWARD_PRE).
GATHERED_BLOCKS = 2
# The resident memory of a process with torch, diffusers and open_clip loaded, before any
# model: the bench's tiny preset (4 MB of models) peaks at 0.89 GiB RSS on the CPU.
CPU_RUNTIME_BYTES = int(0.85 * GiB)


@dataclass(frozen=True)
class Recipe:
    """The sizes of one GRPO step (upstream's flag names in the comments)."""

    height: int  # --h
    width: int  # --w
    generations: int  # --num_generations
    sampling_steps: int  # --sampling_steps
    text_tokens: int  # prompt-embedding tokens the transformer sees
    selective_checkpointing: float  # --selective_checkpointing (fraction of blocks checkpointed)
    sample_batch_size: int = 1  # --sample_batch_size (the port's batched rollout; 1 = upstream)
    frames: int = 1  # --t (Wan: video frames; the image trainers' recipes give 1)
    guidance_batch: int = 1  # 2 where --cfg_infer > 1: the prompt and the negative prompt in one call (Wan)
    ema: bool = False  # --use_ema: rank 0 keeps an fp32 copy of the transformer in host memory

    @property
    def latent_frames(self) -> int:
        return (self.frames - 1) // 4 + 1  # Wan's VAE: 4x in time, the first frame alone

    @property
    def image_tokens(self) -> int:
        return self.latent_frames * (self.height // 16) * (self.width // 16)  # VAE 8x, then 2x2 patches


@dataclass(frozen=True)
class Options:
    world_size: int
    cpu_offload: bool = False  # FSDP CPUOffload(offload_params=True): weights, grads, AdamW on the host
    lora_rank: int = 0  # 0: full fine-tuning
    dtype_bytes: int = 2  # compute dtype of activations and gathered weights (bf16; 4 for fp32 on CPU)
    fsdp: bool = True  # False: one process with plain modules (the bench)
    attention_scores: bool = False  # the attention backend materialises the S x S scores (CPU math path)
    reserve_bytes: int = 3 * GiB
    ema: bool = True  # the recipe's --use_ema applies (the LoRA trainer's recipe has none)


def bench_on_cpu() -> "Options":
    """What ``bench --device cpu`` runs: one process, no FSDP, float32, the math attention
    (it materialises the scores), every block checkpointed; its runtime is the reserve."""
    return Options(world_size=1, fsdp=False, dtype_bytes=4, attention_scores=True, reserve_bytes=CPU_RUNTIME_BYTES)


@dataclass(frozen=True)
class Model:
    name: str
    trainer: str
    transformer: dict
    vae: dict
    hps: dict
    reference_image_tokens: bool = False

    @property
    def hidden(self) -> int:
        return self.transformer["num_attention_heads"] * self.transformer["attention_head_dim"]

    @property
    def blocks(self) -> int:
        return self.transformer["num_layers"] + self.transformer.get("num_single_layers", 0)

    @property
    def cross_attention(self) -> bool:
        """Wan's blocks attend to the text by cross-attention; FLUX's and Qwen-Image's run it in
        the sequence (joint attention)."""
        return self.transformer["_class_name"] == "WanTransformer3DModel"

    @property
    def latent_per_token(self) -> int:
        """Latent values a token carries: 64 for all three (FLUX and Qwen-Image pack 16 channels
        x 2x2 before the transformer; Wan's patch embedding takes 16 channels x its 1x2x2 patch)."""
        patch = self.transformer.get("patch_size")
        if isinstance(patch, list):
            return self.transformer["in_channels"] * patch[0] * patch[1] * patch[2]
        return self.transformer["in_channels"]


@dataclass(frozen=True)
class Estimate:
    parts: tuple[tuple[str, int], ...]  # (what, bytes per rank), in print order
    host_bytes_per_rank: int  # what CPU offload puts in host memory
    checkpointed_blocks: int
    blocks: int
    rank0_host: tuple[tuple[str, int], ...] = ()  # host memory rank 0 holds besides (upstream's EMA)

    @property
    def total(self) -> int:
        return sum(b for _, b in self.parts)


# ---- parameter counts from the config (the real classes' layers; tests build them on meta) ----


def _linear(i: int, o: int, bias: bool = True) -> int:
    return i * o + (o if bias else 0)


def _dual_stream_block(d: int, head_dim: int) -> int:
    """A FLUX double block or a Qwen-Image block: two 6d modulations, joint attention with
    q/k/v and out for each stream (qk RMSNorm), a 4x GELU MLP for each stream."""
    modulation = 2 * _linear(d, 6 * d)
    attention = 8 * _linear(d, d) + 4 * head_dim
    mlps = 2 * (_linear(d, 4 * d) + _linear(4 * d, d))
    return modulation + attention + mlps


def _single_stream_block(d: int, head_dim: int) -> int:
    """A FLUX single block: 3d modulation, q/k/v (qk RMSNorm), a 4x MLP in, one out over both."""
    return _linear(d, 3 * d) + 3 * _linear(d, d) + 2 * head_dim + _linear(d, 4 * d) + _linear(5 * d, d)


def _wan_block(d: int, ffn: int) -> int:
    """A Wan block: self- and cross-attention (q/k/v/out each, RMSNorm over q and k across heads),
    the cross-attention's affine LayerNorm, a GELU FFN of ffn_dim, the 6d scale-shift table."""
    attention = 4 * _linear(d, d) + 2 * d
    return 2 * attention + 2 * d + _linear(d, ffn) + _linear(ffn, d) + 6 * d


def block_parameters(model: Model) -> list[int]:
    cfg, d = model.transformer, model.hidden
    h = cfg["attention_head_dim"]
    if model.cross_attention:
        return [_wan_block(d, cfg["ffn_dim"])] * cfg["num_layers"]
    return [_dual_stream_block(d, h)] * cfg["num_layers"] + [_single_stream_block(d, h)] * cfg.get("num_single_layers", 0)


def root_parameters(model: Model) -> int:
    """Everything outside the blocks: input projections, time (and guidance, text) embedders, output."""
    cfg, d = model.transformer, model.hidden
    if model.cross_attention:  # Wan: patch embedding, time and text embedders, the time projection, output
        patch = cfg["patch_size"][0] * cfg["patch_size"][1] * cfg["patch_size"][2]
        embedders = _linear(cfg["freq_dim"], d) + _linear(d, d) + _linear(d, 6 * d) + _linear(cfg["text_dim"], d) + _linear(d, d)
        return cfg["in_channels"] * patch * d + d + embedders + _linear(d, cfg["out_channels"] * patch) + 2 * d
    patch_out = cfg["patch_size"] ** 2 * (cfg.get("out_channels") or cfg["in_channels"])
    timestep = _linear(256, d) + _linear(d, d)
    common = _linear(cfg["in_channels"], d) + _linear(cfg["joint_attention_dim"], d) + timestep
    common += _linear(d, 2 * d) + _linear(d, patch_out)  # AdaLayerNormContinuous, proj_out
    if cfg["_class_name"] == "QwenImageTransformer2DModel":
        return common + cfg["joint_attention_dim"]  # txt_norm (RMSNorm)
    guidance = timestep if cfg.get("guidance_embeds") else 0
    return common + guidance + _linear(cfg["pooled_projection_dim"], d) + _linear(d, d)


def transformer_parameters(model: Model) -> int:
    return sum(block_parameters(model)) + root_parameters(model)


def lora_parameters(model: Model, rank: int) -> int:
    """LoRA of rank r on upstream's targets (train_grpo_flux_lora.py): to_q, to_k, to_v, to_out.0
    (a single block has no to_out)."""
    d = model.hidden
    per_dual, per_single = 4 * rank * 2 * d, 3 * rank * 2 * d
    return model.transformer["num_layers"] * per_dual + model.transformer.get("num_single_layers", 0) * per_single


def checkpointed_blocks(blocks: int, fraction: float) -> int:
    """How many blocks upstream's ``apply_fsdp_checkpointing(model, ..., p)`` wraps (its rule, verbatim)."""
    cut_off, count = 0.5, 0
    for block_idx in range(1, blocks + 1):
        if block_idx * fraction >= cut_off:
            cut_off += 1
            count += 1
    return count


# ---- the estimate ----------------------------------------------------------------------------


def estimate(model: Model, recipe: Recipe, options: Options) -> Estimate:
    a, n = options.dtype_bytes, max(1, options.world_size)
    shard = n if options.fsdp else 1
    d, heads = model.hidden, model.transformer["num_attention_heads"]
    params = transformer_parameters(model)
    image_tokens = recipe.image_tokens * (2 if model.reference_image_tokens else 1)
    # the sequence a block runs on: joint attention carries the text in it; cross-attention keeps
    # the text's keys and values beside it (two hidden-sized tensors a text token)
    tokens = image_tokens if model.cross_attention else image_tokens + recipe.text_tokens
    text_kv = 2 * recipe.text_tokens * d * a if model.cross_attention else 0

    parts: list[tuple[str, int]] = []
    host = 0
    if options.lora_rank:
        trainable = lora_parameters(model, options.lora_rank)
        resident = params * a // shard  # the frozen base in the compute dtype
        parts.append(("transformer base weights, frozen (bf16)", resident))
    else:
        trainable = params
        resident = 0
    master, grads, moments = 4 * trainable // shard, 4 * trainable // shard, 8 * trainable // shard
    if options.cpu_offload:
        host = master + grads + moments + resident
        parts += [("transformer weights, gradients, AdamW: on the host (CPU offload)", 0)]
        if resident:
            parts[0] = (parts[0][0], 0)
    else:
        parts += [
            ("fp32 master weights" + (" (LoRA)" if options.lora_rank else ""), master),
            ("fp32 gradients", grads),
            ("AdamW moments (2 x fp32)", moments),
        ]
    if options.fsdp:
        largest_block = max(block_parameters(model))
        gathered = (GATHERED_BLOCKS * largest_block + root_parameters(model)) * a + largest_block * a
        parts.append((f"FSDP gathered blocks ({GATHERED_BLOCKS} + root, bf16) and a block's gradients", gathered))

    parts.append(("HPSv2 reward (fp32)", model.hps["parameters"] * 4))
    parts.append(("VAE" + (" (bf16)" if a == 2 else " (fp32)"), model.vae["parameters"] * a))

    def scores(batch: int) -> int:
        return batch * heads * tokens * tokens * 4 if options.attention_scores else 0

    per_block = tokens * d * a * SAVED_PER_TOKEN + text_kv
    trajectory = recipe.generations * (recipe.sampling_steps + 1) * image_tokens * model.latent_per_token * 4
    calls = recipe.sample_batch_size * recipe.guidance_batch  # samples a transformer call holds
    rollout = calls * per_block + scores(calls) + trajectory
    ckpt = checkpointed_blocks(model.blocks, recipe.selective_checkpointing)
    kept = model.blocks - ckpt
    g = recipe.guidance_batch
    train = g * (kept * (per_block + scores(1)) + ckpt * tokens * d * a + per_block + scores(1)) + trajectory
    vae = model.vae
    tile = vae["tile"] or max(recipe.height, recipe.width)  # None: decoded whole (Wan's VAE)
    tile_h, tile_w = min(recipe.height, tile), min(recipe.width, tile)
    latent_pixels = (tile_h // 8) * (tile_w // 8)
    decode = recipe.sample_batch_size * (tile_h * tile_w * vae["first_channels"] * a * 8
                                         + latent_pixels * vae["widest_channels"] * a * 8 + latent_pixels**2 * 4)
    hps = model.hps
    patches = (hps["image_size"] // hps["patch_size"]) ** 2 + 1
    reward = recipe.sample_batch_size * (patches * hps["width"] * 4 * 24 + (hps["width"] // hps["head_width"]) * patches**2 * 4)
    phases = {"rollout": rollout, "train": train, "decode": decode, "reward": reward}
    largest = max(phases, key=phases.get)
    label = f"activations, largest phase: {largest}"
    if largest == "train":
        label += f" ({ckpt} of {model.blocks} blocks checkpointed)"
    parts.append((label, phases[largest]))
    parts.append(("runtime reserve (an assumption, --reserve; in the total)", options.reserve_bytes))
    rank0_host: tuple[tuple[str, int], ...] = ()
    if recipe.ema and options.ema and not options.lora_rank:
        full = params * 4  # get_model_state_dict(full_state_dict=True, cpu_offload=True): fp32, on rank 0
        rank0_host = (("EMA copy (fp32, the recipe's --use_ema)", full),
                      ("the state dict each EMA update gathers (fp32)", full))
    return Estimate(tuple(parts), host, ckpt, model.blocks, rank0_host)


@dataclass(frozen=True)
class Choice:
    """A way to run: the options changed from the asked ones, and what it needs."""

    label: str
    options: Options
    recipe: Recipe
    estimate: Estimate


def alternatives(model: Model, recipe: Recipe, options: Options) -> list[Choice]:
    """The asked configuration first, then each remedy alone and in the combinations that
    a user would try next (cheapest in speed first)."""
    full_ckpt = replace(recipe, selective_checkpointing=1.0)
    more_ranks = max(16, options.world_size * 2)
    offload = replace(options, cpu_offload=True)
    ranked = replace(options, world_size=more_ranks)
    lora = replace(options, lora_rank=64)
    candidates = [
        ("as asked", options, recipe),
        ("selective checkpointing 1.0", options, full_ckpt),
        (f"{more_ranks} ranks", ranked, recipe),
        (f"{more_ranks} ranks, selective checkpointing 1.0", ranked, full_ckpt),
        ("FSDP CPU offload", offload, recipe),
        ("FSDP CPU offload, selective checkpointing 1.0", offload, full_ckpt),
        ("LoRA rank 64", lora, recipe),
        ("LoRA rank 64, selective checkpointing 1.0", lora, full_ckpt),
    ]
    if options.lora_rank:  # asked for LoRA already: not a remedy to offer again at another rank
        candidates = [c for c in candidates if not c[0].startswith("LoRA")]
    seen, out = set(), []
    for label, opts, rec in candidates:
        key = (opts, rec)
        if key in seen:
            continue
        seen.add(key)
        out.append(Choice(label, opts, rec, estimate(model, rec, opts)))
    return out


def fits(est: Estimate, device_bytes: int) -> bool:
    return est.total <= device_bytes
