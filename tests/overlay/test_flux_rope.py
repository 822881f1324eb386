"""overlay/dancegrpo_port/models/flux_rope.py: float32 FLUX RoPE against diffusers' float64 one."""

from __future__ import annotations

import pytest
import overlay_runner  # noqa: F401  (puts overlay/ on sys.path)

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from diffusers import FluxTransformer2DModel  # noqa: E402
from diffusers.models.embeddings import FluxPosEmbed  # noqa: E402

from dancegrpo_port.models.flux_rope import Float32FluxPosEmbed, install_float32_rope, inverse_frequencies  # noqa: E402

FLUX_AXES = (16, 56, 56)


def flux_ids(grid: int = 64, text: int = 512, dtype=torch.float32) -> torch.Tensor:
    """FLUX.1 at 1024x1024: 512 text ids (zeros) and a 64x64 grid of packed latent ids."""
    img = torch.zeros(grid, grid, 3)
    img[..., 1] += torch.arange(grid)[:, None]
    img[..., 2] += torch.arange(grid)[None, :]
    return torch.cat([torch.zeros(text, 3), img.reshape(-1, 3)]).to(dtype)


def float64_tables(ids: torch.Tensor, axes=FLUX_AXES, theta=10000.0):
    """The textbook tables, all in float64 (no diffusers involved)."""
    pos = ids.double()
    cos, sin = [], []
    for i, dim in enumerate(axes):
        freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = torch.outer(pos[:, i], freqs)
        cos.append(angles.cos().repeat_interleave(2, dim=1))
        sin.append(angles.sin().repeat_interleave(2, dim=1))
    return torch.cat(cos, dim=1), torch.cat(sin, dim=1)


def test_flux_sized_ids_within_1e5_of_diffusers_float64_result():
    ids = flux_ids()
    ref_cos, ref_sin = FluxPosEmbed(theta=10000, axes_dim=list(FLUX_AXES))(ids)
    cos, sin = Float32FluxPosEmbed(theta=10000, axes_dim=FLUX_AXES)(ids)
    assert cos.dtype == sin.dtype == torch.float32
    assert cos.shape == sin.shape == ref_cos.shape == (512 + 64 * 64, sum(FLUX_AXES))
    assert (cos - ref_cos).abs().max().item() <= 1e-5
    assert (sin - ref_sin).abs().max().item() <= 1e-5
    # and against the tables computed entirely in float64
    cos64, sin64 = float64_tables(ids)
    assert (cos.double() - cos64).abs().max().item() <= 1e-5
    assert (sin.double() - sin64).abs().max().item() <= 1e-5
    # the tolerance is not vacuous: the largest angles (63 rad) are where float32 errs
    assert (cos.double() - cos64).abs().max().item() > 1e-8


def test_bfloat16_ids_as_the_trainer_passes_them():
    ids = flux_ids(grid=16, text=8)
    embed = Float32FluxPosEmbed(theta=10000, axes_dim=FLUX_AXES)
    for a, b in zip(embed(ids.to(torch.bfloat16)), embed(ids)):
        assert torch.equal(a, b)


def test_inverse_frequencies():
    assert inverse_frequencies(4, 10000) == [1.0, 0.01]
    with pytest.raises(ValueError, match="even"):
        inverse_frequencies(5, 10000)
    with pytest.raises(ValueError, match="ids have 2 axes, RoPE has 3"):
        Float32FluxPosEmbed(10000, FLUX_AXES)(torch.zeros(4, 2))


def tiny_flux() -> FluxTransformer2DModel:
    torch.manual_seed(0)
    return FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                                  num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=16,
                                  guidance_embeds=True, axes_dims_rope=[4, 6, 6])


def flux_inputs(tokens=16, text=4):
    torch.manual_seed(1)
    img_ids = flux_ids(grid=4, text=0)
    return dict(hidden_states=torch.randn(1, tokens, 16), encoder_hidden_states=torch.randn(1, text, 16),
                pooled_projections=torch.randn(1, 16), timestep=torch.tensor([0.5]), img_ids=img_ids,
                txt_ids=torch.zeros(text, 3), guidance=torch.tensor([3.5]), return_dict=False)


def test_installed_into_a_flux_transformer_same_output_same_checkpoint_keys():
    model = tiny_flux().eval()
    keys = set(model.state_dict())
    with torch.no_grad():
        before = model(**flux_inputs())[0]
        assert install_float32_rope(model) is model
        after = model(**flux_inputs())[0]
    assert isinstance(model.pos_embed, Float32FluxPosEmbed)
    assert (model.pos_embed.theta, model.pos_embed.axes_dim) == (10000, [4, 6, 6])
    assert torch.allclose(before, after, atol=1e-5)
    assert set(model.state_dict()) == keys  # checkpoints stay loadable both ways
    install_float32_rope(model)  # idempotent
    assert isinstance(model.pos_embed, Float32FluxPosEmbed)


def test_keeps_float32_when_the_model_is_cast():
    model = tiny_flux()
    install_float32_rope(model)
    model.to(torch.bfloat16)
    cos, _ = model.pos_embed(flux_ids(grid=4, text=2))
    assert cos.dtype == torch.float32


def test_refuses_a_model_without_flux_rope():
    with pytest.raises(TypeError, match="Linear has no FLUX pos_embed"):
        install_float32_rope(torch.nn.Linear(2, 2))
