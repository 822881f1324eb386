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
- with the recipe's ``--use_ema`` (an 8-rank recipe's), host memory on rank 0: upstream's
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
(tests/plan/test_memory_plan.py, tests/throughput/test_bench.py, docs/memory-plan.md).

What a model is, plan knows from its registry row's ``plan.architecture`` (dancegrpo_npu.registry):
a kind of :data:`KINDS`, and the counts the kind leaves to the model (its blocks' and root's
parameters, the latent values a token carries, LoRA's parameters), functions of :class:`Model`.

A UNet trained under DDP (kind ``unet``, a model entry's ``"parallel": "ddp"``: an accelerate
trainer) is counted otherwise (:func:`unet_estimate`): every rank holds the whole fp32 UNet,
its fp32 gradients, DDP's gradient buckets and AdamW's moments, and autocast's bf16 copy of the
weights; its activations are counted layer by layer from the UNet's config (the tensors each
layer keeps for backward, checked against the real class on the meta device).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GiB = 1 << 30
# The architectures plan counts (a row's ``architecture.kind``): a transformer whose blocks run on
# the image and text tokens in one sequence, one whose blocks cross-attend to the text, a UNet.
KINDS = ("joint-transformer", "cross-transformer", "unet")
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
    frames: int = 1  # --t (a video trainer's frames; the image trainers' recipes give 1)
    guidance_batch: int = 1  # 2 where --cfg_infer > 1: the prompt and the negative prompt in one call
    ema: bool = False  # --use_ema: rank 0 keeps an fp32 copy of the transformer in host memory
    prompts: int = 1  # prompts a rank samples a step, all their trajectories kept for training (a configuration's)
    train_batch_size: int = 1  # samples a training call (a configuration's; CFG doubles it)
    accumulation: int = 1  # training calls an optimizer step accumulates (a configuration's)
    train_guidance_batch: int | None = None  # 2: training runs on the prompt and the empty one (a configuration's cfg); None: guidance_batch

    @property
    def latent_frames(self) -> int:
        return (self.frames - 1) // 4 + 1  # a video VAE's 4x in time, the first frame alone

    @property
    def image_tokens(self) -> int:
        return self.latent_frames * (self.height // 16) * (self.width // 16)  # VAE 8x, then 2x2 patches


# Where a first-frame pipeline can live (the trainer's flag the model names, first_frame["flag"];
# Options.first_frame).
FIRST_FRAME_PLACEMENTS = ("upstream", "device", "offload")


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
    # where a model's first-frame pipeline lives (its first_frame["flag"]): "upstream" (on the device while
    # it runs, on the host between steps), "device" (kept there), "offload" (one of its models at a time)
    first_frame: str = "upstream"


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
    # the row's architecture (trainers.Architecture): its kind and its counts
    architecture: object = None
    # "fsdp": FULL_SHARD over the ranks (the flow trainers); "ddp": every rank holds the whole
    # model in fp32 and computes under bf16 autocast (an accelerate trainer's DDP)
    parallel: str = "fsdp"
    text_encoder: dict | None = None  # a text encoder the trainer keeps on the device ({"parameters": n}), bf16
    checkpointing: bool = True  # whether the trainer has --selective_checkpointing
    # the recipe's sizes held in an absl / ml_collections configuration: {Recipe field: dotted
    # config key}, and the flag that takes "FLAG.KEY=VALUE" overrides (the launch lines)
    config_fields: tuple[tuple[str, str], ...] = ()
    config_flag: str = ""
    # parameters counted on a meta-device build of the class ({"dual_block", "single_block", "root"}),
    # where no formula of the architecture's describes it (the architecture's counts read them)
    counted: dict | None = None
    # a reward other than HPSv2: {"name", "parameters", "bytes", "tokens", "width"}
    reward: dict | None = None
    # a second pipeline every rank holds for the step's conditioning (a first frame's:
    # {"name", "bytes", "flag", "parameters": {model: count}}), placed by Options.first_frame
    first_frame: dict | None = None

    @property
    def kind(self) -> str:
        return self.architecture.kind

    @property
    def unet(self) -> bool:
        """The denoiser is a UNet, not a transformer of blocks: ``transformer`` then holds the
        UNet's diffusers config."""
        return self.kind == "unet"

    @property
    def hidden(self) -> int:
        return self.transformer["num_attention_heads"] * self.transformer["attention_head_dim"]

    @property
    def blocks(self) -> int:
        return len(block_parameters(self))

    @property
    def cross_attention(self) -> bool:
        """The blocks attend to the text by cross-attention (the text's keys and values beside
        the sequence), not in the sequence (joint attention)."""
        return self.kind == "cross-transformer"

    @property
    def latent_per_token(self) -> int:
        """Latent values a token carries, which the trajectory keeps: the architecture's count, or
        the config's input channels (latents packed before the transformer)."""
        count = self.architecture.latent_per_token
        return count(self) if count else self.transformer["in_channels"]


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


# ---- parameter counts: the architecture's, from the config ---------------------------------


def _linear(i: int, o: int, bias: bool = True) -> int:
    return i * o + (o if bias else 0)


def block_parameters(model: Model) -> list[int]:
    """The parameters of each block of the transformer (the row's architecture counts them)."""
    return list(model.architecture.block_parameters(model))


def root_parameters(model: Model) -> int:
    """Everything outside the blocks: input projections, time (and guidance, text) embedders, output."""
    return model.architecture.root_parameters(model)


def transformer_parameters(model: Model) -> int:
    return sum(block_parameters(model)) + root_parameters(model)


def denoiser_parameters(model: Model) -> int:
    """The trained model's parameters: the UNet's or the transformer's."""
    return unet_parameters(model.transformer) if model.unet else transformer_parameters(model)


def lora_parameters(model: Model, rank: int) -> int:
    """LoRA of rank r: the architecture's count of upstream's targets, else one on each block's
    attention projections (to_q, to_k, to_v, to_out.0: d x r and r x d each)."""
    count = model.architecture.lora_parameters
    return count(model, rank) if count else model.blocks * 4 * rank * 2 * model.hidden


def checkpointed_blocks(blocks: int, fraction: float) -> int:
    """How many blocks upstream's ``apply_fsdp_checkpointing(model, ..., p)`` wraps (its rule, verbatim)."""
    cut_off, count = 0.5, 0
    for block_idx in range(1, blocks + 1):
        if block_idx * fraction >= cut_off:
            cut_off += 1
            count += 1
    return count


# ---- a UNet (kind "unet": diffusers' conditional UNet of down, mid and up blocks) ------------
#
# The UNet's layers in the order they run, from its config: ("resnet", in, out, positions),
# ("transformer", channels, positions), ("down", channels, positions in), ("up", channels,
# positions out), ("conv_in" / "conv_out", channels, positions).  The counts below follow
# diffusers' classes (ResnetBlock2D, Transformer2DModel with one BasicTransformerBlock of
# self-attention, cross-attention and a GEGLU feed-forward, Downsample2D, Upsample2D).

UNET_DOWN = {"CrossAttnDownBlock2D": True, "DownBlock2D": False}  # type: has attention
UNET_UP = {"CrossAttnUpBlock2D": True, "UpBlock2D": False}


def unet_layers(cfg: dict, latent_h: int, latent_w: int) -> list[tuple]:
    """The layers of the conditional UNet of ``cfg`` (diffusers' config) at a latent of latent_h x latent_w."""
    for kind in (*cfg["down_block_types"], *cfg["up_block_types"]):
        if kind not in UNET_DOWN and kind not in UNET_UP:
            raise ValueError(f"the plan does not know the UNet block {kind}")
    if cfg.get("mid_block_type", "UNetMidBlock2DCrossAttn") != "UNetMidBlock2DCrossAttn" or cfg.get("use_linear_projection"):
        raise ValueError("the plan knows a UNet with a cross-attention mid block and convolution projections")
    channels, layers_per_block = cfg["block_out_channels"], cfg["layers_per_block"]
    positions = [latent_h * latent_w >> (2 * i) for i in range(len(channels))]  # each level halves h and w
    last = len(channels) - 1
    layers: list[tuple] = [("conv_in", cfg["in_channels"], positions[0])]
    skips = [channels[0]]  # the skip connections' channels, as the down blocks push them
    prev = channels[0]
    for i, kind in enumerate(cfg["down_block_types"]):
        for j in range(layers_per_block):
            layers.append(("resnet", prev if j == 0 else channels[i], channels[i], positions[i]))
            if UNET_DOWN[kind]:
                layers.append(("transformer", channels[i], positions[i]))
            skips.append(channels[i])
        if i < last:
            layers.append(("down", channels[i], positions[i]))
            skips.append(channels[i])
        prev = channels[i]
    c = channels[-1]
    layers += [("resnet", c, c, positions[-1]), ("transformer", c, positions[-1]), ("resnet", c, c, positions[-1])]
    for i, kind in enumerate(cfg["up_block_types"]):
        level, out = last - i, channels[last - i]
        for _ in range(layers_per_block + 1):
            layers.append(("resnet", prev + skips.pop(), out, positions[level]))
            if UNET_UP[kind]:
                layers.append(("transformer", out, positions[level]))
            prev = out
        if i < last:
            layers.append(("up", out, positions[level - 1]))
    layers.append(("conv_out", channels[0], positions[0]))
    return layers


def unet_parameters(cfg: dict) -> int:
    """The conditional UNet's parameter count (tested against the real class on meta)."""
    c0, cross = cfg["block_out_channels"][0], cfg["cross_attention_dim"]
    temb = 4 * c0  # TimestepEmbedding(c0, 4 c0)
    total = 9 * cfg["in_channels"] * c0 + c0 + _linear(c0, temb) + _linear(temb, temb)
    total += 2 * c0 + 9 * c0 * cfg["out_channels"] + cfg["out_channels"]  # conv_norm_out, conv_out
    for layer in unet_layers(cfg, 8, 8):
        kind = layer[0]
        if kind == "resnet":
            i, o = layer[1], layer[2]
            total += 2 * i + 9 * i * o + o + _linear(temb, o) + 2 * o + 9 * o * o + o + (i * o + o if i != o else 0)
        elif kind == "transformer":
            d = layer[1]
            attn1 = 3 * d * d + _linear(d, d)
            attn2 = d * d + 2 * cross * d + _linear(d, d)
            geglu = _linear(d, 8 * d) + _linear(4 * d, d)
            total += 2 * d + 2 * _linear(d, d) + 3 * 2 * d + attn1 + attn2 + geglu  # norm, proj_in/out, 3 LayerNorms
        elif kind in ("down", "up"):
            total += 9 * layer[1] ** 2 + layer[1]
    return total


def unet_saved(cfg: dict, latent_h: int, latent_w: int, text_tokens: int) -> tuple[int, int]:
    """(elements a sample's training forward keeps for backward that a norm keeps in fp32 under
    autocast, all the other elements), counted from the layers:

    - a resnet keeps its GroupNorms' inputs and the SiLUs' inputs (fp32 under autocast: the
      norms run in fp32) and its two convolutions' inputs;
    - a transformer keeps its GroupNorm's and three LayerNorms' inputs (fp32), and proj_in's
      and proj_out's inputs, self-attention's normed input, q, k, v, output and its copy
      (6 d), cross-attention's normed input, q, output and its copy (4 d) and the text's keys
      and values, the GEGLU's normed input, its 8 d projection, the gate's GELU and the
      product (17 d);
    - a down or up sampler keeps its convolution's input.

    The attention keeps no scores (a fused kernel: FlashAttention on CUDA, npu_fusion_attention
    on the NPU); the meta-device check measures the rest against the real class."""
    norm = other = 0
    for layer in unet_layers(cfg, latent_h, latent_w):
        n, o = _layer_saved(layer, text_tokens)
        norm, other = norm + n, other + o
    return norm, other


def _layer_saved(layer: tuple, text_tokens: int) -> tuple[int, int]:
    kind, p = layer[0], layer[-1]
    if kind == "resnet":
        i, o = layer[1], layer[2]
        return 2 * (i + o) * p, (i + o) * p
    if kind == "transformer":
        d = layer[1]
        return 4 * d * p, 29 * d * p + 2 * text_tokens * d
    if kind == "conv_out":  # conv_norm_out's input and its SiLU's, conv_out's input
        return 2 * layer[1] * p, layer[1] * p
    return 0, layer[1] * p  # conv_in, down, up: a convolution's input


def _largest_phase_and_reserve(phases: dict, train_note: str, options) -> list:
    """The plan's last two rows: the largest phase's activations (the phases do not overlap;
    ``train_note`` says what the train phase holds) and the runtime reserve."""
    largest = max(phases, key=phases.get)
    label = f"activations, largest phase: {largest}" + (f" ({train_note})" if largest == "train" else "")
    return [(label, phases[largest]), ("runtime reserve (an assumption, --reserve; in the total)", options.reserve_bytes)]


def _decode_and_reward(recipe, model, a: int) -> tuple[int, int]:
    """The activations of a rollout batch's VAE decode (tiled: one tile at a time; a ``tile`` of
    None decodes whole) and of its HPS reward's ViT, in bytes (``a``: the
    activations' bytes an element)."""
    vae = model.vae
    tile = vae["tile"] or max(recipe.height, recipe.width)
    tile_h, tile_w = min(recipe.height, tile), min(recipe.width, tile)
    latent_pixels = (tile_h // 8) * (tile_w // 8)
    decode = recipe.sample_batch_size * (tile_h * tile_w * vae["first_channels"] * a * 8
                                         + latent_pixels * vae["widest_channels"] * a * 8 + latent_pixels**2 * 4)
    decode *= min(recipe.frames, vae.get("tile_frames", 1))  # a video's tile of frames at once
    if model.reward:  # a video reward: one video at a time, forward only (a layer's tokens x width, a few at once)
        return decode, model.reward["tokens"] * model.reward["width"] * a * 8
    hps = model.hps
    patches = (hps["image_size"] // hps["patch_size"]) ** 2 + 1
    reward = recipe.sample_batch_size * (patches * hps["width"] * 4 * 24 + (hps["width"] // hps["head_width"]) * patches**2 * 4)
    return decode, reward


def reward_part(model: Model) -> tuple[str, int]:
    """The reward model a rank holds: HPSv2 in fp32, or the model's own (bf16)."""
    if model.reward:
        return f"{model.reward['name']} reward (bf16)", model.reward["parameters"] * model.reward["bytes"]
    return "HPSv2 reward (fp32)", model.hps["parameters"] * 4


def vae_part(model: Model, a: int) -> tuple[str, int]:
    size = model.vae.get("bytes", a)
    return "VAE" + (" (bf16)" if size == 2 else " (fp32)"), model.vae["parameters"] * size


def first_frame_bytes(model: Model) -> tuple[int, int]:
    """(the whole first-frame pipeline, its largest model), in bytes."""
    counts = model.first_frame["parameters"].values()
    return sum(counts) * model.first_frame["bytes"], max(counts) * model.first_frame["bytes"]


def unet_estimate(model: Model, recipe: Recipe, options: Options) -> Estimate:
    """A UNet under DDP: nothing sharded.  Per rank: the fp32 UNet, its fp32 gradients, DDP's
    gradient buckets (accelerate's DDP keeps gradient_as_bucket_view off: a second fp32 copy of
    the gradients), AdamW's two moments; autocast's bf16 copy of the weights (cached while a
    forward under autocast runs); the frozen text encoder and VAE (bf16) and the reward (fp32);
    the activations of the largest phase; the reserve.  No activation checkpointing, no
    offload, no LoRA: the trainer has none of them."""
    if model.parallel != "ddp":
        raise ValueError("the plan counts a UNet trained under DDP (an accelerate trainer's) only")
    a, cfg = options.dtype_bytes, model.transformer
    params = unet_parameters(cfg)
    latent_h, latent_w = recipe.height // 8, recipe.width // 8  # the VAE's 8x
    parts = [
        ("fp32 weights (DDP: the whole UNet on every rank)", 4 * params),
        ("fp32 gradients", 4 * params),
        ("DDP gradient buckets (fp32, gradient_as_bucket_view off)", 4 * params),
        ("AdamW moments (2 x fp32)", 8 * params),
    ]
    if a == 2:
        parts.append(("autocast's bf16 copy of the weights", 2 * params))
    parts.append(reward_part(model))
    parts.append(vae_part(model, a))
    if model.text_encoder:
        parts.append(("text encoder" + (" (bf16)" if a == 2 else " (fp32)"), model.text_encoder["parameters"] * a))

    g = recipe.guidance_batch
    g_train = recipe.guidance_batch if recipe.train_guidance_batch is None else recipe.train_guidance_batch
    latent_values = cfg["in_channels"] * latent_h * latent_w
    # every sample a rank draws in a step is kept for training: its latents, one a step (4 bytes a value)
    trajectory = recipe.prompts * recipe.generations * (recipe.sampling_steps + 1) * latent_values * 4
    norm, other = unet_saved(cfg, latent_h, latent_w, recipe.text_tokens)
    per_sample = norm * 4 + other * a
    train = recipe.train_batch_size * g_train * per_sample + trajectory
    # the rollout keeps nothing for backward: what the largest layer keeps stands for what a
    # forward holds at once, beside the skip connections the down blocks hand to the up blocks
    layers = unet_layers(cfg, latent_h, latent_w)
    largest_layer = max(n * 4 + o * a for n, o in (_layer_saved(layer, recipe.text_tokens) for layer in layers))
    channels = cfg["block_out_channels"]
    level = [latent_h * latent_w >> (2 * i) for i in range(len(channels))]
    skips = channels[0] * level[0] + sum(c * level[i] * cfg["layers_per_block"] + (c * level[i + 1] if i + 1 < len(channels) else 0)
                                         for i, c in enumerate(channels))
    rollout = recipe.sample_batch_size * g * (largest_layer + skips * a) + trajectory
    decode, reward = _decode_and_reward(recipe, model, a)
    parts += _largest_phase_and_reserve({"rollout": rollout, "train": train, "decode": decode, "reward": reward},
                                        f"UNet batch {recipe.train_batch_size * g_train}, no checkpointing", options)
    return Estimate(tuple(parts), 0, 0, 0)


# ---- the estimate ----------------------------------------------------------------------------


def estimate(model: Model, recipe: Recipe, options: Options) -> Estimate:
    if model.unet:
        return unet_estimate(model, recipe, options)
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

    parts.append(reward_part(model))
    parts.append(vae_part(model, a))
    phases: dict[str, int] = {}
    if model.first_frame:
        whole, largest = first_frame_bytes(model)
        name = model.first_frame["name"]
        if options.first_frame == "device":
            parts.append((f"{name} (bf16), kept on the device", whole))
        else:  # on the device only while it makes the first frame: that phase's size
            phases["condition"] = whole if options.first_frame == "upstream" else largest
            host += whole  # its host copy, on every rank

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
    decode, reward = _decode_and_reward(recipe, model, a)
    phases.update({"rollout": rollout, "train": train, "decode": decode, "reward": reward})
    parts += _largest_phase_and_reserve(phases, f"{ckpt} of {model.blocks} blocks checkpointed", options)
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
    config: tuple[tuple[str, int], ...] = ()  # recipe sizes it sets in the trainer's configuration (Model.config_fields)


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
    if model.first_frame:  # where the first-frame pipeline lives: upstream's moves, kept on the device, offloaded
        candidates[1:1] = [(f"{model.first_frame['flag']} {where}", replace(options, first_frame=where), recipe)
                           for where in FIRST_FRAME_PLACEMENTS if where != options.first_frame]
    if options.lora_rank:  # asked for LoRA already: not a remedy to offer again at another rank
        candidates = [c for c in candidates if not c[0].startswith("LoRA")]
    if model.parallel != "fsdp":  # FSDP's offload is no option of a trainer without FSDP
        candidates = [c for c in candidates if not c[1].cpu_offload]
    config: dict[str, tuple] = {}
    fields = dict(model.config_fields)
    if recipe.train_batch_size > 1 and {"train_batch_size", "accumulation"} <= set(fields):
        # the same samples an optimizer step, one at a time: the accumulation takes the batch
        one = replace(recipe, train_batch_size=1, accumulation=recipe.accumulation * recipe.train_batch_size)
        label = f"train batch 1, accumulation {one.accumulation}"
        candidates.insert(1, (label, options, one))
        config[label] = (("train_batch_size", 1), ("accumulation", one.accumulation))
    seen, out = set(), []
    for label, opts, rec in candidates:
        key = (opts, rec)
        if key in seen:
            continue
        seen.add(key)
        out.append(Choice(label, opts, rec, estimate(model, rec, opts), config.get(label, ())))
    return out


def fits(est: Estimate, device_bytes: int) -> bool:
    return est.total <= device_bytes
