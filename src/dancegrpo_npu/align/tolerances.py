"""The tolerances of ``compare``: each with its default, what it bounds, and where the figure comes
from.  docs/alignment.md carries the same table; ``compare --tol NAME=VALUE`` overrides one.

RUN_A is the reference (the GPU or CPU run), RUN_B the run under test (the NPU run): relative
errors divide by RUN_A's values, as msprobe divides by its golden (``-gp``) dump.

How the defaults were chosen (the field figures are in /work/shared/notes/field-facts.md):

- Rewards and images are what teams porting DanceGRPO to 910B judge a port by: mean rewards within
  0.02% of the GPU run (they report 0.015-0.018%) and images "almost identical", which we take
  as PSNR >= 40 dB (an RMS error of 1% of the pixel range, 2.55 levels of 255).
- Module outputs: msprobe's own rule for "not reached" (cosine < 0.99 and max abs error > 0.001,
  or cosine < 0.9, or max abs error > 1, or NaN/Inf), so our verdict on a module is the one
  Ascend support reads in an msprobe compare CSV.
- The stages between have no field figure; each default is derived from one above, or from
  bf16 (unit roundoff 2^-8 = 0.39%, the precision upstream's transformer runs in), and is
  documented as such.  They are starting points: recalibrate with the first measured CUDA-vs-NPU
  pair (docs/alignment.md says how), and override with --tol meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

from dancegrpo_npu.errors import DancegrpoError


@dataclass(frozen=True)
class Tolerance:
    name: str
    default: float | None  # None: taken from the runs' records index (see `from_index`)
    bound: str  # "max": the value must be <= tolerance; "min": >= tolerance
    unit: str
    what: str
    source: str
    from_index: str | None = None  # the index.json key the default is read from, when default is None


TOLERANCES: tuple[Tolerance, ...] = (
    Tolerance(
        "latents_rel_l2", 0.04, "max", "",
        "relative L2 error ||B-A||/||A|| of each sample's latents, per sampling step",
        "derived from images_psnr_db: 40 dB is an RMS error of 2% of the [-1, 1] image range, i.e. ~4% of "
        "an image whose RMS is ~0.5; a VAE decoder passes relative error through with a gain of ~1, so 4% "
        "on the latents is where the image criterion starts to fail (about 10 bf16 roundoffs)",
    ),
    Tolerance(
        "log_probs_abs", 0.01, "max", "",
        "max absolute error of the sampling log-probs (per sample, sampling step)",
        "estimate: with the same noise the sampling log-prob is -mean(noise^2)/2 + const up to the bf16 "
        "rounding of (prev - mean)/sigma; that rounding moves the mean by ~1e-3 at 64x64 and 720x720; the "
        "default leaves a factor 10",
    ),
    Tolerance(
        "images_psnr_db", 40.0, "min", " dB",
        "PSNR of each decoded image pair (uint8, peak 255); the step's worst image counts",
        "field reports for DanceGRPO on 910B: images 'almost identical' with CPU-drawn noise; 40 dB = RMS "
        "error of 1% of the pixel range",
    ),
    Tolerance(
        "rewards_rel_pct", 0.02, "max", "%",
        "relative error |B-A|/|A| of the step's mean reward (all samples, all ranks), in percent; the "
        "worst sample's error is reported beside it",
        "field reports for DanceGRPO on 910B: reward error 0.015-0.018% against the GPU run (reward "
        "curves); the port's goal is <= 0.02%.  Per sample it cannot apply: upstream's rewards are "
        "bf16 values, one bf16 step being 0.4-0.8% of any reward",
    ),
    Tolerance(
        "advantages_abs", 0.01, "max", "",
        "max absolute error of the advantages",
        "advantages are normalised to unit standard deviation per group, so 0.01 is 1% of their scale",
    ),
    Tolerance(
        "train_log_prob_abs", 0.01, "max", "",
        "max absolute error of the recomputed log-prob of each trained (sample, timestep)",
        "as log_probs_abs: the recompute is the sampling log-prob's formula with the trained policy",
    ),
    Tolerance(
        "train_ratio_abs", None, "max", "",
        "max absolute error of the ratio exp(new - old) of each trained (sample, timestep)",
        "the runs' --clip_range (index.json; upstream's recipe: 1e-4): a larger difference can move a pair "
        "across the clip boundary and change its gradient",
        from_index="clip_range",
    ),
    Tolerance(
        "train_loss_rel", 0.01, "max", "",
        "max absolute error of the per-pair loss, divided by the largest |loss| of RUN_A in the step",
        "the per-pair loss is -advantage * clip(ratio) over a constant; with ratios within 1e-4 its error "
        "is the advantages' (1% of scale)",
    ),
    Tolerance(
        "grad_norm_rel", 0.05, "max", "",
        "relative error of the grad norm of each optimizer step",
        "field reports: loss and grad norm only need the same trend; a backward through the bf16 "
        "transformer, summed over gradient accumulation, is looser than the forward; 5% keeps the trend",
    ),
    Tolerance(
        "module_cos", 0.99, "min", "",
        "module output: cosine below this AND max abs error above module_abs is out of tolerance",
        "msprobe (MindStudio Probe) compare: 'not reached' when cosine < 0.99 and max abs error > 0.001",
    ),
    Tolerance(
        "module_abs", 0.001, "max", "",
        "module output: see module_cos",
        "msprobe compare, as module_cos",
    ),
    Tolerance(
        "module_cos_min", 0.9, "min", "",
        "module output: cosine below this is out of tolerance whatever the error",
        "msprobe compare: 'not reached' when cosine < 0.9",
    ),
    Tolerance(
        "module_abs_max", 1.0, "max", "",
        "module output: max abs error above this is out of tolerance whatever the cosine",
        "msprobe compare: 'not reached' when max abs error > 1",
    ),
    Tolerance(
        "module_rel_bf16", 0.004, "max", "",
        "module output recorded from bf16 values: relative L2 error ||B-A||/||A|| above this (and a jump, "
        "module_jump) makes the module stand out once the runs are not aligned",
        "msprobe's relative-error threshold for bf16 (2^-8, bf16's unit roundoff); the L2 norm of the "
        "error, not its largest element, so that near-zero elements do not count as errors",
    ),
    Tolerance(
        "module_rel_fp16", 0.001, "max", "",
        "as module_rel_bf16, for values recorded from fp16",
        "msprobe's relative-error threshold for fp16 (2^-10)",
    ),
    Tolerance(
        "module_rel_fp32", 0.0002, "max", "",
        "as module_rel_bf16, for values recorded from fp32",
        "msprobe's relative-error threshold for fp32",
    ),
    Tolerance(
        "module_jump", 4.0, "min", "x",
        "a module stands out only if its relative L2 error is at least this many times the largest "
        "error of the modules executed before it",
        "float noise grows from module to module (each bf16 op adds about one roundoff); a factor 4 in "
        "one module is an error that starts there, not one carried in",
    ),
)  # fmt: skip

BY_NAME = {t.name: t for t in TOLERANCES}


def parse_overrides(items: list[str] | None) -> dict[str, float]:
    """``["rewards_rel_pct=0.05", ...]`` -> {name: value}; a one-line error naming the choices."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or name not in BY_NAME:
            raise DancegrpoError(
                f"--tol {item!r}: {'unknown tolerance ' + repr(name) if sep else 'not NAME=VALUE'}",
                f"the names: {', '.join(BY_NAME)}",
                exit_code=2,
            )
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if value != value or value in (float("inf"), float("-inf")) or value < 0:
            raise DancegrpoError(
                f"--tol {item!r}: {text!r} is not a finite non-negative number",
                f"e.g. --tol {name}={BY_NAME[name].default or 1e-4}",
                exit_code=2,
            )
        out[name] = value
    return out


def resolve(overrides: dict[str, float], index_a: dict, index_b: dict) -> dict[str, float]:
    """Every tolerance's value: an override, else the default, else the larger of the two
    runs' index values (else upstream's recipe value)."""
    values: dict[str, float] = {}
    for t in TOLERANCES:
        if t.name in overrides:
            values[t.name] = overrides[t.name]
        elif t.default is not None:
            values[t.name] = t.default
        else:
            found = [float(i[t.from_index]) for i in (index_a, index_b) if isinstance(i.get(t.from_index), (int, float))]
            values[t.name] = max(found) if found else 1e-4
    return values


def describe(values: dict[str, float]) -> list[dict]:
    """The tolerances as compare.json records them."""
    return [
        {"name": t.name, "value": values[t.name], "bound": t.bound, "what": t.what, "source": t.source}
        for t in TOLERANCES
    ]
