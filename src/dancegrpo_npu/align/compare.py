"""``dancegrpo-npu compare RUN_A RUN_B``: the recorded stages of two runs, side by side.

For every step both runs recorded, stage by stage in the order a step computes them: the noise
(bit-equal or not), the latents of every sampling step, the sampling log-probs, the decoded
images, the rewards, the advantages, the trained log-probs, ratios and losses, the grad norms;
with module records, the module outputs of step 1 where they happen (transformer before the
latents, VAE before the images, reward model before the rewards), in execution order.  Each
row is the worst over the ranks.  The first row out of tolerance is the first divergence.
Module outputs are judged by msprobe's rule; once the runs are not aligned, a module whose
relative error is above its dtype's threshold and jumps over every module before it "stands out"
and is out of tolerance too, so that the first divergence names a small fault, not its effect
(align/modules.py, docs/alignment.md).

Each run's dataset (its records index's digest: the index file and the tensor files it names) is
shown, and compare says when the two differ: a divergence from step 1's latents with bit-equal
noise is then the data's (align/dataset.py).

Exit 0: aligned.  1: not aligned (noise that differs included: that is no like-for-like
comparison).  2: the runs cannot be compared (a one-line error), a run with itself included.
"""

from __future__ import annotations

from dataclasses import dataclass

from dancegrpo_npu.align import tolerances as tolerances_mod
from dancegrpo_npu.align.dataset import Datasets, compare_datasets
from dancegrpo_npu.align.modules import flag_standing_out, module_checks
from dancegrpo_npu.contract import OPTIONAL_RECORD_NOISE, RECORD_NOISE, parse_step_spec
from dancegrpo_npu.rundirs.records import (
    RunRecords,
    check_comparable,
    common_steps,
    load_records,
    module_group,
    open_pair,
)
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.files import writing

NOISE = (*RECORD_NOISE, *OPTIONAL_RECORD_NOISE)
# stage -> (tensor, metric label, tolerance name); latents are per sampling step, below
SIMPLE = {
    "log_probs": ("log_probs", "max abs error", "log_probs_abs"),
    "images": ("images", "min PSNR (dB)", "images_psnr_db"),
    "rewards": ("rewards", "mean rel error (%)", "rewards_rel_pct"),  # the step's mean: see _reward_row
    "advantages": ("advantages", "max abs error", "advantages_abs"),
    "train.log_prob": ("train.log_prob", "max abs error", "train_log_prob_abs"),
    "train.ratio": ("train.ratio", "max abs error", "train_ratio_abs"),
    "train.loss": ("train.loss", "max abs err / max|A|", "train_loss_rel"),
    "grad_norm": ("grad_norm", "max rel error", "grad_norm_rel"),
}
# what the axes of each tensor are, to say where the worst value is
AXES = {
    "log_probs": ("sample", "sampling_step"),
    "images": ("sample",),
    "rewards": ("sample",),
    "advantages": ("sample",),
    "train.log_prob": ("sample", "trained_timestep"),
    "train.ratio": ("sample", "trained_timestep"),
    "train.loss": ("sample", "trained_timestep"),
    "grad_norm": ("optimizer_step",),
}


@dataclass
class Comparison:
    a: RunRecords
    b: RunRecords
    steps: tuple[int, ...]
    tolerances: dict[str, float]
    rows: list  # metrics.Check, in order
    worst_images: tuple | None  # (psnr, step, rank, sample, image_a, image_b)
    rewards: dict  # step -> (mean reward A, mean reward B) from the records
    notes: tuple[str, ...] = ()
    datasets: Datasets | None = None  # the data each run read (align/dataset.py)

    @property
    def first_divergence(self):
        return next((r for r in self.rows if not r.ok), None)

    @property
    def noise_equal(self) -> bool:
        return all(r.ok for r in self.rows if r.stage.startswith("noise."))

    @property
    def aligned(self) -> bool:
        return self.first_divergence is None


def _stage_checks(fa, fb, step: int, rank: int, tol: dict, state: dict) -> list:
    """Every stage's row for one rank of one step (before merging over ranks)."""
    from dancegrpo_npu.align import metrics as m

    rows = []
    where = {"rank": rank}

    def pair(name):
        return fa.get(name), fb.get(name)

    def unpaired(stage, a, b) -> bool:
        """A row for a tensor that one run lacks or that has another shape; True when so."""
        if a is not None and b is not None and a.shape == b.shape:
            return False
        what = "missing in " + ("RUN_A" if a is None else "RUN_B") if a is None or b is None else "shape"
        extra = {"problem": what}
        if what == "shape":
            extra["shapes"] = [list(a.shape), list(b.shape)]
        rows.append(m.Check(stage, step, what, float("nan"), None, "equal", False, dict(where), extra=extra))
        return True

    for stage in NOISE:
        a, b = pair(stage)
        if a is None and b is None:
            continue
        if a is None or b is None:
            unpaired(stage, a, b)
            continue
        n = m.differing_elements(a, b)
        extra = {"elements": int(a.size)}
        if n and a.shape == b.shape and a.dtype.kind == "f":
            extra["max_abs_diff"] = m.max_abs(a, b)[0]
        rows.append(m.Check(stage, step, "differing elements", float(n), None, "equal", n == 0, dict(where), extra=extra))

    a, b = pair("latents")
    if a is not None or b is not None:
        if not unpaired("latents", a, b):
            for k in range(a.shape[1]):
                value, i = m.worst(m.rel_l2_per_sample(a[:, k], b[:, k]))
                t = tol["latents_rel_l2"]
                loc = {**where, **({"sample": i[0]} if i else {})}
                rows.append(m.Check(f"latents.{k}", step, "max rel L2 error", value, t, "max", value <= t, loc))

    for stage, (name, label, tol_name) in SIMPLE.items():
        a, b = pair(name)
        if (a is None and b is None) or unpaired(stage, a, b):
            continue
        t = tol[tol_name]
        extra = {}
        if stage == "images":
            psnr, max_diff = m.psnr_per_image(a, b)
            value, i = m.worst(psnr, largest=False)
            extra["max_pixel_diff"] = float(max_diff.max()) if max_diff.size else 0.0
            ok = value >= t
            if i and (state.get("worst_images") is None or not value >= state["worst_images"][0]):
                state["worst_images"] = (value, step, rank, i[0], a[i[0]].copy(), b[i[0]].copy())
        elif stage == "rewards":  # per sample here; the step's mean once every rank is read (_reward_row)
            value, i = m.worst(m.relative(a, b) * 100)
            ok = value <= t
            extra["max_sample_rel_err_pct"] = value
            sums = state.setdefault("rewards", {}).setdefault(step, [0.0, 0.0, 0])
            sums[0] += float(a.astype("float64").sum())
            sums[1] += float(b.astype("float64").sum())
            sums[2] += int(a.size)
        elif stage == "grad_norm":
            value, i = m.worst(m.relative(a, b))
            ok = value <= t
        elif stage == "train.loss":
            value, i = m.scaled_max_abs(a, b)
            ok = value <= t
        else:
            value, i = m.max_abs(a, b)
            ok = value <= t
        loc = {**where, **dict(zip(AXES[stage], i))}
        bound = "min" if stage == "images" else "max"
        rows.append(m.Check(stage, step, label, value, t, bound, ok, loc, extra=extra))
    return rows


def _group(row) -> str:
    return module_group(row.module or "")


def run_compare(a: RunRecords, b: RunRecords, steps: tuple[int, ...], tol: dict[str, float]) -> Comparison:
    from dancegrpo_npu.align import metrics as m

    state: dict = {}
    modules = module_checks(a, b, tol) if a.has_modules() and b.has_modules() else []
    module_step = 1 if 1 in steps else steps[0]
    rows: list[m.Check] = []
    for step in steps:
        merged: dict[str, m.Check] = {}
        for rank in range(a.world_size):
            with open_pair(a.step_file(step, rank), b.step_file(step, rank)) as (fa, fb):
                for row in _stage_checks(fa, fb, step, rank, tol, state):
                    if row.stage not in merged or row.worse_than(merged[row.stage]):
                        merged[row.stage] = row
        if "rewards" in merged:
            merged["rewards"] = _reward_row(merged["rewards"], state["rewards"][step], tol["rewards_rel_pct"])
        rows += _splice_modules(list(merged.values()), modules if step == module_step else [])
    flag_standing_out(rows)  # not aligned: the module where the error jumps is named, not its effect
    rewards = {s: (v[0] / v[2], v[1] / v[2]) for s, v in state.get("rewards", {}).items() if v[2]}
    notes = ()
    if a.has_modules() != b.has_modules():
        notes = (f"module outputs not compared: only {(a if a.has_modules() else b).name} recorded them",)
    return Comparison(a, b, steps, tol, rows, state.get("worst_images"), rewards, notes,
                      compare_datasets(a.index, b.index))


# When step 1 computes each stage, module outputs included: the transformer runs after the noise is
# drawn, the VAE before the images exist, the reward model before the rewards.
_WHEN = ("noise.", "module:transformer", "latents.", "log_probs", "module:vae", "images", "module:reward",
         "rewards", "advantages", "train.", "grad_norm")  # fmt: skip


def _when(row) -> int:
    key = f"module:{_group(row)}" if row.stage == "module" else row.stage
    return next((i for i, prefix in enumerate(_WHEN) if key.startswith(prefix)), len(_WHEN))


def _reward_row(worst_sample, sums: list, tolerance: float):
    """The rewards row holds the relative error of the step's mean reward over every sample of
    every rank: the field's 0.02% is a reward-curve figure, and per sample it could not be met
    (upstream's rewards are bf16 values: one bf16 step is 0.4-0.8% of any reward).
    The worst sample's error and place stay in the row (extra, where)."""
    import math

    if worst_sample.extra.get("problem"):
        return worst_sample
    mean_a, mean_b = sums[0] / sums[2], sums[1] / sums[2]
    if worst_sample.value == 0:
        value = 0.0  # bit-identical rewards (NaN included)
    elif math.isnan(mean_a) or math.isnan(mean_b):
        value = float("nan")
    else:
        diff = abs(mean_b - mean_a)
        value = diff / abs(mean_a) * 100 if mean_a != 0 else (float("inf") if diff else 0.0)
    worst_sample.value, worst_sample.ok = value, value <= tolerance
    worst_sample.extra.update(mean_a=mean_a, mean_b=mean_b)
    return worst_sample


def _splice_modules(stage_rows: list, modules: list) -> list:
    """Step 1's rows and the module rows in the order step 1 computes them (a stable sort: the
    modules keep their execution order, the latents their sampling order)."""
    return sorted(stage_rows + modules, key=_when)


def compare(project, ref_a: str, ref_b: str, tol_items: list[str] | None, steps_spec: str | None) -> int:
    from dancegrpo_npu.align import report

    overrides = tolerances_mod.parse_overrides(tol_items)
    wanted = parse_step_spec(steps_spec, what="--steps") if steps_spec is not None else None
    a = load_records(project.runs_dir, ref_a)
    b = load_records(project.runs_dir, ref_b)
    if a.run_dir.resolve() == b.run_dir.resolve():
        raise DancegrpoError(
            f"compare: RUN_A and RUN_B are the same run, {a.name} ({ref_a!r}, {ref_b!r}): a run compared with itself "
            "is bit-equal whatever it holds, which is no evidence of alignment; nothing was checked",
            f"compare it with another run: a reference from another device, or a replay of it (--replay {a.name})",
            exit_code=2,
        )
    check_comparable(a, b)
    steps = common_steps(a, b, wanted)
    tol = tolerances_mod.resolve(overrides, a.index, b.index)
    result = run_compare(a, b, steps, tol)
    result.notes += metrics_notes(a, b)
    with writing(result.b.run_dir / "compare.json", "free space or fix the permissions in the run under test"):
        written = report.write_reports(result)
    print(report.render(result, written))
    return 0 if result.aligned else 1


def metrics_notes(*runs: RunRecords) -> tuple[str, ...]:
    """What compare.png's curves lack: a metrics.jsonl that stops at a line that is no record, or
    that cannot be read (the records, which the verdict is made of, are read separately)."""
    from dancegrpo_npu.rundirs.rundir import read_metrics

    notes = []
    for run in runs:
        problem = read_metrics(run.run_dir).problem
        if problem:
            notes.append(f"{problem}; compare.png's curves of {run.name} miss what it does not hold")
    return tuple(notes)
