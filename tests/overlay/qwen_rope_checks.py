"""overlay/dancegrpo_port/models/qwen_rope.py: the real-valued Qwen-Image RoPE against diffusers' complex one.

Needs diffusers >= 0.35 (QwenImageTransformer2DModel): not a test_ file, so the suite's
interpreter (diffusers 0.32) does not collect it; tests/overlay/test_qwen_rope.py runs it with
the diffusers-0.35 set's interpreter.
"""

from __future__ import annotations

import pytest
import overlay_runner  # noqa: F401  (puts overlay/ on sys.path)

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
from packaging.version import Version  # noqa: E402

if Version(diffusers.__version__) < Version("0.35"):
    pytest.skip(f"Qwen-Image needs diffusers >= 0.35; {diffusers.__version__} is installed", allow_module_level=True)

from diffusers.models.transformers import transformer_qwenimage as qwen  # noqa: E402

from dancegrpo_port.models import qwen_rope  # noqa: E402
from dancegrpo_port.strict_mode import StrictModeError, strict_mode  # noqa: E402

AXES = (16, 56, 56)
TINY = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=24, axes_dims_rope=(4, 6, 6))  # fmt: skip


@pytest.fixture
def installed(monkeypatch):
    """install_real_rope for one test; diffusers' module is put back after it."""
    monkeypatch.setattr(qwen, "QwenEmbedRope", qwen.QwenEmbedRope)
    monkeypatch.setattr(qwen, "apply_rotary_emb_qwen", qwen.apply_rotary_emb_qwen)
    monkeypatch.setattr(qwen_rope, "_diffusers_apply", None)
    original = (qwen.QwenEmbedRope, qwen.apply_rotary_emb_qwen)
    qwen_rope.install_real_rope()
    qwen_rope.install_real_rope()  # idempotent: the kept function is still diffusers' own
    assert qwen_rope._diffusers_apply is original[1]
    return original


def _rotate(apply, q, tables):
    return apply(q, tables, use_real=False)


@pytest.mark.parametrize("shapes,text", [
    ([(1, 45, 45)], 256),  # Qwen-Image at 720x720 (the recipe), 256 prompt tokens
    ([(1, 32, 32), (1, 32, 32)], 77),  # Qwen-Image-Edit at 512x512: the target and the reference image
    ([(1, 5, 7)], 3),  # odd sides: the negative indices of scale_rope
], ids=["720", "edit-512", "odd"])
def test_real_rope_equals_the_complex_form_within_1e6(installed, shapes, text):
    complex_rope, complex_apply = installed
    torch.manual_seed(0)
    ours = qwen_rope.RealQwenEmbedRope(10000, AXES, scale_rope=True)
    theirs = complex_rope(10000, list(AXES), scale_rope=True)
    image, txt = ours([shapes], [text], device="cpu")
    image_c, txt_c = theirs([shapes], [text], device="cpu")
    assert image.cos.dtype == torch.float32 and not image.cos.is_complex()
    worst = 0.0
    for real, cplx in ((image, image_c), (txt, txt_c)):
        q = torch.randn(2, real.cos.shape[0], 3, sum(AXES))  # [B, S, H, D], float32
        got = qwen_rope.apply_rotary_emb_qwen(q, real, use_real=False)
        want = _rotate(complex_apply, q, cplx)
        worst = max(worst, (got - want).abs().max().item())
    print(f"max |real - complex| = {worst:.3g}")
    assert worst <= 1e-6, worst


def _tiny(seed: int = 0):
    torch.manual_seed(seed)
    return qwen.QwenImageTransformer2DModel(**TINY)


def _inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    height, width, text = 4, 6, 5
    return dict(
        hidden_states=torch.randn(1, height * width, TINY["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(1, text, TINY["joint_attention_dim"], generator=g),
        encoder_hidden_states_mask=torch.ones(1, text, dtype=torch.long),
        timestep=torch.tensor([0.5]),
        img_shapes=[[(1, height, width)]],
        txt_seq_lens=[text],
        return_dict=False,
    )


def test_the_transformer_with_the_real_rope_has_no_complex_op_and_the_same_output(installed):
    """Built after the install, the real Qwen-Image transformer class runs forward and backward under
    strict mode on the CPU (every tensor checked) and gives the complex model's output."""
    complex_rope, _ = installed
    model = _tiny()
    assert isinstance(model.pos_embed, qwen_rope.RealQwenEmbedRope)
    with strict_mode() as _:
        out = model(**_inputs())[0]
        out.square().mean().backward()
    # the same weights with diffusers' complex tables: diffusers' own path, through the new function
    model_c = _tiny()
    model_c.pos_embed = complex_rope(10000, list(TINY["axes_dims_rope"]), scale_rope=True)
    with torch.no_grad():
        want = model_c(**_inputs())[0]
    assert (out.detach() - want).abs().max().item() <= 1e-5
    with strict_mode(raise_on_violation=False) as mode, torch.no_grad():
        model_c(**_inputs())
    assert {v.dtype for v in mode.violations} == {torch.complex64}  # the check sees the complex path


def test_without_the_install_strict_mode_stops_in_the_rope():
    with strict_mode(), pytest.raises(StrictModeError, match="complex64"):
        _tiny()  # QwenEmbedRope.__init__: torch.polar
