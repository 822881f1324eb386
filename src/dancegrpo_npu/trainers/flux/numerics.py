"""The FLUX.1-dev block doctor's numerics check runs on NPU 0 and on the CPU (the rows'
``numerics_block``): a double-stream block at a narrow width, in bfloat16, as the rollout runs it."""

from __future__ import annotations

import copy


def double_block(torch, g):
    """("FLUX.1-dev double block", run(device) -> its image stream's output), its inputs drawn from
    ``g`` on the CPU."""
    from diffusers.models.transformers.transformer_flux import FluxTransformerBlock

    torch.manual_seed(0)
    block = FluxTransformerBlock(dim=64, num_attention_heads=2, attention_head_dim=32).to(torch.bfloat16)
    hidden = (torch.randn(1, 32, 64, generator=g)).to(torch.bfloat16)
    context = (torch.randn(1, 8, 64, generator=g)).to(torch.bfloat16)
    temb = (torch.randn(1, 64, generator=g)).to(torch.bfloat16)
    angles = torch.arange(40, dtype=torch.float32)[:, None] * torch.tensor(
        [10000.0 ** (-i / 32) for i in range(0, 32, 2)])[None, :]
    rotary = (angles.cos().repeat_interleave(2, 1), angles.sin().repeat_interleave(2, 1))

    def run(device):
        b = copy.deepcopy(block).to(device)
        with torch.no_grad():
            _, out = b(hidden.to(device), context.to(device), temb.to(device),
                       image_rotary_emb=tuple(r.to(device) for r in rotary))
        return out

    return "FLUX.1-dev double block", run
