"""overlay/fastvideo/utils/strict_mode.py: complex/float64 ops on the model path."""

from __future__ import annotations

import pytest
import overlay_runner  # noqa: F401  (puts overlay/ on sys.path)

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from diffusers.models.embeddings import FluxPosEmbed  # noqa: E402

from fastvideo.models.flux_rope import install_float32_rope  # noqa: E402
from fastvideo.utils.strict_mode import StrictModeError, strict_mode  # noqa: E402

from test_flux_rope import flux_ids, flux_inputs, tiny_flux  # noqa: E402


class Inner(torch.nn.Module):
    def forward(self, x):
        return torch.polar(torch.ones_like(x), x)  # complex64


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x * 2)


def test_diffusers_flux_pos_embed_makes_54_float64_ops_a_call():
    with strict_mode(raise_on_violation=False) as mode:
        FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])(flux_ids(grid=8, text=4))
    assert len(mode.violations) == 54
    assert {v.dtype for v in mode.violations} == {torch.float64}
    assert {v.module for v in mode.violations} == {"FluxPosEmbed (FluxPosEmbed)"}


def test_stops_at_the_first_one_naming_op_and_module():
    with pytest.raises(StrictModeError) as err:
        with strict_mode():
            FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])(flux_ids(grid=8, text=4))
    assert str(err.value).startswith("strict mode: aten.arange.start_step made a torch.float64 tensor in FluxPosEmbed")


def test_complex_ops_are_caught_with_the_module_path():
    with pytest.raises(StrictModeError, match=r"aten\.polar\.default made a torch\.complex64 tensor in Outer\.inner \(Inner\)"):
        with strict_mode():
            Outer()(torch.ones(3))


def test_ops_outside_modules_are_not_the_model_path():
    with strict_mode(raise_on_violation=False) as mode:
        torch.arange(3, dtype=torch.float64) * 2
    assert mode.violations == []


def test_the_module_stack_unwinds_after_an_error():
    with strict_mode(raise_on_violation=False) as mode:
        class Fails(torch.nn.Module):
            def forward(self, x):
                raise KeyError("boom")
        with pytest.raises(KeyError):
            Fails()(torch.ones(1))
        torch.ones(2, dtype=torch.float64)  # outside any module again
    assert mode.violations == []


def test_stock_flux_transformer_fails_strict_and_the_float32_rope_fixes_it():
    model = tiny_flux().eval()
    with torch.no_grad(), strict_mode(raise_on_violation=False) as mode:
        model(**flux_inputs())
    assert len(mode.violations) == 54
    assert {v.module for v in mode.violations} == {"FluxTransformer2DModel.pos_embed (FluxPosEmbed)"}
    install_float32_rope(model)
    with torch.no_grad(), strict_mode(raise_on_violation=False) as mode:
        model(**flux_inputs())
    assert mode.violations == []
    # and the backward pass too
    with strict_mode():
        model.train()
        model(**flux_inputs())[0].square().mean().backward()


def test_bf16_autocast_forward_is_clean():
    model = install_float32_rope(tiny_flux())
    with strict_mode(), torch.autocast("cpu", torch.bfloat16):
        out = model(**flux_inputs())[0]
    assert out.dtype == torch.bfloat16
