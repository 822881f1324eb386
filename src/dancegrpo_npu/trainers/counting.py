"""Parameter counts of blocks several families' transformers share, from their diffusers configs
(tests/plan build the real classes on the meta device and check them)."""

from __future__ import annotations


def linear(i: int, o: int, bias: bool = True) -> int:
    return i * o + (o if bias else 0)


def dual_stream_block(d: int, head_dim: int) -> int:
    """A double-stream (MMDiT) block: two 6d modulations, joint attention with q/k/v and out for
    each stream (qk RMSNorm), a 4x GELU MLP for each stream."""
    modulation = 2 * linear(d, 6 * d)
    attention = 8 * linear(d, d) + 4 * head_dim
    mlps = 2 * (linear(d, 4 * d) + linear(4 * d, d))
    return modulation + attention + mlps


def single_stream_block(d: int, head_dim: int) -> int:
    """A single-stream block: 3d modulation, q/k/v (qk RMSNorm), a 4x MLP in, one out over both."""
    return linear(d, 3 * d) + 3 * linear(d, d) + 2 * head_dim + linear(d, 4 * d) + linear(5 * d, d)


def joint_root(cfg: dict, d: int) -> int:
    """What a joint-attention transformer holds outside its blocks in common: the image and text
    input projections, the timestep embedder, the output norm (AdaLayerNormContinuous), proj_out."""
    patch_out = cfg["patch_size"] ** 2 * (cfg.get("out_channels") or cfg["in_channels"])
    timestep = linear(256, d) + linear(d, d)
    return (linear(cfg["in_channels"], d) + linear(cfg["joint_attention_dim"], d) + timestep
            + linear(d, 2 * d) + linear(d, patch_out))


def dual_single_lora(model, rank: int) -> int:
    """LoRA of rank r on upstream's targets (train_grpo_flux_lora.py): to_q, to_k, to_v, to_out.0 of
    a double-stream block, to_q, to_k, to_v of a single-stream one (it has no to_out)."""
    d = model.hidden
    per_dual, per_single = 4 * rank * 2 * d, 3 * rank * 2 * d
    return model.transformer["num_layers"] * per_dual + model.transformer.get("num_single_layers", 0) * per_single
