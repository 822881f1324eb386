"""overlay/dancegrpo_port/strict_mode.py: complex/float64 ops anywhere in the training step.

Each test plants one float64 (or complex) op in one place a training step runs code -
a module's forward, plain tensor math between modules, the loss, a backward formula, a
custom Function's backward, a tensor hook, ``clip_grad_norm_``, the optimizer - and
checks that strict mode names the op and where it ran.  A clean step reports nothing.
"""

from __future__ import annotations

import inspect
import math
import sys

import pytest
import overlay_runner  # noqa: F401  (puts overlay/ on sys.path)

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from diffusers.models.embeddings import FluxPosEmbed  # noqa: E402

from dancegrpo_port.models.flux_rope import install_float32_rope  # noqa: E402
from dancegrpo_port.strict_mode import StrictModeError, strict_mode  # noqa: E402

from test_flux_rope import flux_ids, flux_inputs, tiny_flux  # noqa: E402


def next_line(function: str | None = None) -> str:
    """``file:line (function)`` of the line after the caller's: where a planted op sits."""
    frame = sys._getframe(1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno + 1} ({function or frame.f_code.co_name})"


def planted_line(obj, function: str) -> str:
    """``file:line (function)`` of the line marked ``# the planted op`` in ``obj``'s source."""
    lines, first = inspect.getsourcelines(obj)
    offset = next(i for i, text in enumerate(lines) if "# the planted op" in text)
    return f"{__file__}:{first + offset} ({function})"


class Inner(torch.nn.Module):
    def forward(self, x):
        return torch.polar(torch.ones_like(x), x)  # complex64


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x * 2)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


# ---- inside a module's forward ----------------------------------------------------------------


def test_diffusers_flux_pos_embed_makes_54_float64_ops_a_call():
    with strict_mode(raise_on_violation=False) as mode:
        FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])(flux_ids(grid=8, text=4))
    assert len(mode.violations) == 54
    assert {v.dtype for v in mode.violations} == {torch.float64}
    assert {v.where for v in mode.violations} == {"FluxPosEmbed (FluxPosEmbed)"}


def test_stops_at_the_first_one_naming_op_and_module():
    with pytest.raises(StrictModeError) as err:
        with strict_mode():
            FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])(flux_ids(grid=8, text=4))
    assert str(err.value).startswith(
        "strict mode: aten.arange.start_step made a torch.float64 tensor on cpu in FluxPosEmbed (FluxPosEmbed); ")
    assert "unset it, or launch without --strict" in str(err.value)  # how to switch it off


def test_complex_ops_are_caught_with_the_module_path():
    with pytest.raises(StrictModeError, match=r"aten\.polar\.default made a torch\.complex64 tensor on cpu in Outer\.inner \(Inner\)"):
        with strict_mode():
            Outer()(torch.ones(3))


# ---- outside modules: the math between them, the loss, clip_grad_norm_, the optimizer ----------


def test_plain_tensor_math_between_modules_is_reported_at_its_line():
    model = Tiny()
    with strict_mode(raise_on_violation=False) as mode:
        out = model(torch.ones(2, 4))
        where = next_line()
        scaled = out.to(torch.float64) * 0.5
        model(scaled.float().expand(2, 4))
    assert [(v.op, v.where) for v in mode.violations] == [
        ("aten._to_copy.default", f"outside modules: {where}"),
        ("aten.mul.Tensor", f"outside modules: {where}"),
    ]


def test_a_float64_0_dim_tensor_is_reported_where_it_is_made():
    out = torch.ones(2, 1)
    with strict_mode(raise_on_violation=False) as mode:
        where = next_line()
        half = torch.tensor(0.5, dtype=torch.float64)
        scaled = out * half  # float32: a 0-dim tensor does not promote a dimensioned one
    assert scaled.dtype == torch.float32
    assert [(v.op, v.where) for v in mode.violations] == [("aten.lift_fresh.default", f"outside modules: {where}")]


def test_a_float64_loss_is_reported_at_the_callers_line_not_inside_torch():
    model = Tiny()
    target = torch.zeros(2, 1, dtype=torch.float64)  # made before strict mode: host data
    with pytest.raises(StrictModeError) as err:
        with strict_mode():
            out = model(torch.ones(2, 4))
            where = next_line()
            torch.nn.functional.mse_loss(out, target)  # promotes to float64 in torch/nn/functional.py
    assert f"made a torch.float64 tensor on cpu outside modules: {where};" in str(err.value)


def test_clip_grad_norm_of_float64_gradients_is_reported_at_the_call():
    weight = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))  # a float64 master weight
    weight.grad = torch.full((3,), 2.0, dtype=torch.float64)
    with strict_mode(raise_on_violation=False) as mode:
        where = next_line()
        torch.nn.utils.clip_grad_norm_([weight], max_norm=1.0)
    assert mode.violations and {v.where for v in mode.violations} == {f"outside modules: {where}"}
    assert {v.dtype for v in mode.violations} == {torch.float64}


class Float64SGD(torch.optim.SGD):
    """An optimizer that keeps its update in float64: what a port must not do on the NPU."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                update = p.grad.double() * group["lr"]  # the planted op
                p.sub_(update.to(p.dtype))


def test_an_optimizer_step_is_reported_inside_the_optimizer():
    model = Tiny()
    optimizer = Float64SGD(model.parameters(), lr=0.1)
    with strict_mode(raise_on_violation=False) as mode:
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
    assert mode.violations, "the planted float64 update was not seen"
    assert {v.where for v in mode.violations} == {f"outside modules: {planted_line(Float64SGD, 'step')}"}


# ---- the backward pass ------------------------------------------------------------------------


def test_a_backward_formula_is_named_by_its_autograd_node():
    weight = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))  # made before: no forward report
    with pytest.raises(StrictModeError) as err:
        with strict_mode():
            loss = (weight.float() * 2).sum()  # the forward makes only float32 tensors
            loss.backward()  # ToCopyBackward0 hands the float64 weight a float64 gradient
    assert "aten._to_copy.default made a torch.float64 tensor on cpu in backward of ToCopyBackward0;" in str(err.value)


class Float64Backward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return (grad.double() * 2).float()  # the planted op


def test_a_custom_functions_backward_is_named_with_its_code():
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(StrictModeError) as err:
        with strict_mode():
            Float64Backward.apply(x).sum().backward()
    assert (f"aten._to_copy.default made a torch.float64 tensor on cpu in backward of Float64BackwardBackward "
            f"at {planted_line(Float64Backward, 'backward')};") in str(err.value)


def test_a_tensor_hook_in_backward_is_named_with_its_code():
    model = Tiny()
    with strict_mode(raise_on_violation=False) as mode:
        out = model(torch.ones(2, 4))
        where = next_line("<lambda>")
        out.register_hook(lambda grad: grad.double().float())
        out.sum().backward()
    # a hook on `out` runs when its grad_fn (the last Linear's addmm) receives the gradient
    assert [v.where for v in mode.violations] == [f"backward of AddmmBackward0 at {where}"]


def test_a_module_re_run_by_activation_checkpointing_is_named_as_the_module():
    class Doubles(torch.nn.Module):
        def forward(self, x):
            return x.double().sin().float()

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Doubles()

        def forward(self, x):
            return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)

    x = torch.ones(3, requires_grad=True)
    with strict_mode(raise_on_violation=False) as mode:
        Checkpointed()(x).sum().backward()
    wheres = [v.where for v in mode.violations]
    assert wheres[:2] == ["Checkpointed.block (Doubles)"] * 2  # the forward: to float64, sin
    # the recomputation, under the path the block had in the forward
    assert "Checkpointed.block (Doubles), re-run in backward of SinBackward0" in wheres
    assert "backward of SinBackward0" in wheres  # sin's own backward formula (cos, mul) in float64


# ---- what is not reported ---------------------------------------------------------------------


def test_a_clean_training_step_reports_nothing():
    """Forward (bf16 autocast, activation checkpointing), the GRPO math written as
    upstream's flux_step and train_one_step write it, backward, clip_grad_norm_ and AdamW."""
    model = Tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    with strict_mode(raise_on_violation=False) as mode:
        for _ in range(2):
            with torch.autocast("cpu", torch.bfloat16):
                out = torch.utils.checkpoint.checkpoint(model, torch.ones(2, 4), use_reentrant=False)
            sigma, sigma_next, eta = torch.tensor(0.75), torch.tensor(0.5), 0.3
            std_dev_t = eta * math.sqrt(sigma - sigma_next)  # python floats stay python
            mean = out.float() + (sigma_next - sigma) * out.float()
            log_prob = (-((mean.detach() + 0.1 - mean) ** 2) / (2 * (std_dev_t**2))
                        - math.log(std_dev_t) - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi))))
            ratio = torch.exp(log_prob.mean(dim=1) - log_prob.mean(dim=1).detach())
            advantages = torch.clamp(torch.tensor([1.0, -1.0]), -5.0, 5.0)
            loss = torch.mean(torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - 1e-4, 1 + 1e-4)))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    assert mode.violations == []
    assert all(p.grad is None for p in model.parameters()) and optimizer.state  # it did run


def test_only_the_runs_device_is_checked():
    """An NPU run checks NPU tensors: float64 on the host is allowed there.  Here the
    'device' is meta, so CPU float64 passes and a meta float64 tensor is reported."""
    with strict_mode(raise_on_violation=False, device_type="meta") as mode:
        torch.arange(3, dtype=torch.float64) * 2
        torch.ones(2, device="meta", dtype=torch.float64)
    assert [(v.op, v.device) for v in mode.violations] == [("aten.ones.default", "meta")]


def test_the_module_stack_unwinds_after_an_error():
    with strict_mode(raise_on_violation=False) as mode:
        class Fails(torch.nn.Module):
            def forward(self, x):
                raise KeyError("boom")
        with pytest.raises(KeyError):
            Fails()(torch.ones(1))
        where = next_line()
        torch.ones(2, dtype=torch.float64)  # outside any module again
    assert [v.where for v in mode.violations] == [f"outside modules: {where}"]


# ---- the FLUX transformer ---------------------------------------------------------------------


def test_stock_flux_transformer_fails_strict_and_the_float32_rope_fixes_it():
    model = tiny_flux().eval()
    with torch.no_grad(), strict_mode(raise_on_violation=False) as mode:
        model(**flux_inputs())
    assert len(mode.violations) == 54
    assert {v.where for v in mode.violations} == {"FluxTransformer2DModel.pos_embed (FluxPosEmbed)"}
    install_float32_rope(model)
    with torch.no_grad(), strict_mode(raise_on_violation=False) as mode:
        model(**flux_inputs())
    assert mode.violations == []
    # and the backward pass too (strict mode now checks backward ops: see the tests above)
    with strict_mode(raise_on_violation=False) as mode:
        model.train()
        model(**flux_inputs())[0].square().mean().backward()
    assert mode.violations == []
    assert model.proj_out.weight.grad is not None


def test_bf16_autocast_forward_and_backward_are_clean():
    model = install_float32_rope(tiny_flux())
    with strict_mode(), torch.autocast("cpu", torch.bfloat16):
        out = model(**flux_inputs())[0]
    assert out.dtype == torch.bfloat16
    with strict_mode():
        out.float().square().mean().backward()
