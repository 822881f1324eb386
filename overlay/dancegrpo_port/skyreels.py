"""Where SkyReels-I2V's first-frame pipeline lives between steps (``--flux_placement``).

Upstream's ``train_grpo_skyreels_i2v.py`` makes each step's first frame with a whole FLUX.1-dev
pipeline (``FluxPipeline``, bfloat16: its transformer, T5-XXL and CLIP text encoders and VAE)
that every rank loads.  It puts the pipeline on the device at load, then at every step moves it
to the device for the image and back to the host (``pipe_flux.to(device)`` ... ``.to("cpu")``):
about 34 GB each way a rank a step at FLUX.1-dev's size, and a host copy on every rank.

- ``upstream``: exactly that (the default: upstream's run, for an exact comparison).
- ``device``: on the device from load on, never moved (no host copy, no transfer a step; the
  device holds it through the whole step: ``plan skyreels-i2v`` says where that fits).
- ``offload``: diffusers' model CPU offload (``enable_model_cpu_offload``): each of the
  pipeline's models is moved to the device when it runs and back after, one at a time, so the
  device holds the largest of them only while the first frame is made.  On a CPU run there is
  nothing to offload: the pipeline stays where it is.

The time it costs is the step's ``time_condition`` in metrics.jsonl (the seam's conditioning
phase); :func:`moved_bytes` is what one move carries.
"""

from __future__ import annotations

PLACEMENTS = ("upstream", "device", "offload")


def add_arguments(parser) -> None:
    parser.add_argument(
        "--flux_placement", choices=PLACEMENTS, default="upstream",
        help="where the first frame's FLUX pipeline lives between steps: upstream (on the device for the image, "
        "moved back to the host after it, every step), device (kept on the device), offload (diffusers' model CPU "
        "offload: one model on the device at a time) (default: %(default)s)")


def moved_bytes(pipe) -> int:
    """The bytes one move of the pipeline carries: every parameter and buffer of its models."""
    import torch

    total = 0
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            total += sum(t.numel() * t.element_size() for t in component.parameters())
            total += sum(t.numel() * t.element_size() for t in component.buffers())
    return total


def _accelerator(device) -> bool:
    import torch

    return torch.device(device).type != "cpu"


def place(pipe, placement: str, device) -> None:
    """The pipeline where ``placement`` puts it at load."""
    if placement == "offload":
        if _accelerator(device):
            pipe.enable_model_cpu_offload(device=device)
        return
    pipe.to(device)  # upstream's and "device": on the device


def before_first_frame(pipe, placement: str, device) -> None:
    if placement == "upstream":
        pipe.to(device)


def after_first_frame(pipe, placement: str) -> None:
    if placement == "upstream":
        pipe.to("cpu")
