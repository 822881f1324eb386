"""The patches of group 1 (flash-attn-optional, flux-path-without-mochi, dataset-without-decord):
what the Flux scripts import, imports without flash_attn,
liger_kernel/triton, loguru and decord: none of them is imported (where one is installed,
it stays unimported; where not, the import would fail).  torch may import triton by
itself, so packages are compared with a baseline of torch, diffusers, transformers and peft.

flash-attn-optional.patch's ``flash_attn_no_pad`` without flash_attn is compared with attention written
out by hand (softmax(QK^T * scale) V over each sequence's real tokens, in float64), not with
the overlay function it calls: comparing a function with itself cannot fail."""

from __future__ import annotations

import json

import pytest
from patched_tree_runner import run_in_tree  # noqa: F401  (a fixture)

CUDA_ONLY = ("flash_attn", "liger_kernel", "triton", "loguru", "decord")


@pytest.mark.upstream
def test_flux_path_imports_without_cuda_only_packages(run_in_tree):
    baseline = run_in_tree(
        """
        import json, sys, torch, diffusers, transformers, peft, accelerate
        from diffusers import FluxTransformer2DModel
        print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
        """)
    before = set(json.loads(baseline.stdout.strip().splitlines()[-1]))
    out = run_in_tree(
        """
        import json, sys, torch
        import fastvideo.utils.fsdp_util, fastvideo.utils.load, fastvideo.utils.validation
        import fastvideo.utils.checkpoint, fastvideo.utils.communications_flux, fastvideo.utils.dataset_utils
        import fastvideo.dataset, fastvideo.dataset.latent_flux_rl_datasets
        from fastvideo.models.flash_attn_no_pad import flash_attn_no_pad
        from dancegrpo_port.models.attention_fallback import padded_qkv_attention
        from fastvideo.utils.load import get_no_split_modules, load_transformer
        from diffusers import FluxTransformer2DModel

        flux = FluxTransformer2DModel(num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
                                      joint_attention_dim=8, pooled_projection_dim=8, in_channels=8,
                                      axes_dims_rope=[2, 2, 4])
        blocks = [c.__name__ for c in get_no_split_modules(flux)]
        video = sorted(m for m in sys.modules if m.startswith(("fastvideo.models.mochi", "fastvideo.models.hunyuan")))
        try:
            load_transformer("mochi", None, "nowhere", torch.float32)
            mochi = "no error"
        except ImportError as e:
            mochi = str(e)

        def by_hand(qkv, mask, causal, scale):
            # flash_attn's varlen attention written out: each sequence's real tokens attend
            # to its real tokens (causal: to those not after them); padded rows are zero.
            batch, seqlen, _, heads, head_dim = qkv.shape
            scale = head_dim ** -0.5 if scale is None else scale
            out = torch.zeros(batch, seqlen, heads, head_dim, dtype=torch.float64)
            for b in range(batch):
                real = mask[b].nonzero().flatten()
                q, k, v = (qkv[b, real, i].double().transpose(0, 1) for i in range(3))  # [heads, n, d]
                scores = torch.einsum("hqd,hkd->hqk", q, k) * scale
                if causal:
                    later = torch.ones(len(real), len(real), dtype=torch.bool).triu(1)
                    scores = scores.masked_fill(later, float("-inf"))
                weights = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)
                out[b, real] = torch.einsum("hqk,hkd->hqd", weights, v).transpose(0, 1)
            return out

        gen = torch.Generator().manual_seed(0)
        qkv = torch.randn(3, 6, 3, 2, 4, generator=gen)
        # padding at the end, in the middle (flash_attn unpads any mask), and none
        mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 0, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
        errors = {}
        for causal, scale in ((False, None), (True, None), (False, 0.3)):
            got = flash_attn_no_pad(qkv, mask, causal=causal, dropout_p=0.0, softmax_scale=scale)
            errors[f"causal={causal} scale={scale}"] = (got.double() - by_hand(qkv, mask, causal, scale)).abs().max().item()
        loaded = sorted({m.split(".")[0] for m in sys.modules})
        print(json.dumps({"blocks": blocks, "mochi": mochi, "errors": errors, "loaded": loaded, "video": video}))
        """
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["blocks"] == ["FluxTransformerBlock", "FluxSingleTransformerBlock"]
    assert len(got["errors"]) == 3 and all(err < 1e-5 for err in got["errors"].values()), got["errors"]
    assert got["video"] == []
    assert (set(got["loaded"]) - before) & set(CUDA_ONLY) == set()
    assert "fastvideo.models.mochi_hf.modeling_mochi does not import" in got["mochi"]
    assert "supports the Flux scripts only" in got["mochi"]


@pytest.mark.upstream
def test_caption_list(run_in_tree):
    out = run_in_tree(
        """
        import torch
        from fastvideo.dataset.latent_flux_rl_datasets import latent_collate_function
        item = (torch.zeros(4, 2), torch.zeros(2), torch.zeros(3), "a cat")
        batch = latent_collate_function([item, item])
        print(type(batch[3]).__name__, batch[3])
        """
    )
    assert out.stdout.strip() == "list ['a cat', 'a cat']"
