"""What ``compare`` prints and writes: the table, the ``first divergence:`` and verdict lines,
compare.json (everything in the table, the tolerances with their sources, the verdict) and
compare.png (reward curves and their relative error, loss and grad norm, the image pair that
differs most)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from dancegrpo_npu.align import tolerances as tolerances_mod
from dancegrpo_npu.contract import shown_steps
from dancegrpo_npu.rundirs.records import module_group
from dancegrpo_npu.files import write_atomic

MAX_MODULE_ROWS = 40  # more modules than this (a full-size model): the table shows a summary and the failures
MAX_FAILED_MODULE_ROWS = 20
NOISE_VERDICT = "noise differs: not a like-for-like comparison; use --rng cpu or --replay"


def _num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return f"{x:.6g}"


def _where(row) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in row.where.items())


def value_text(row) -> str:
    if row.extra.get("problem"):
        problem = row.extra["problem"]
        return f"{problem} {row.extra['shapes'][0]} vs {row.extra['shapes'][1]}" if problem == "shape" else problem
    if row.bound == "equal":
        n = int(row.value)
        if n == 0:
            return "equal"
        text = f"{n} of {row.extra.get('elements', '?')} differ"
        return text + (f" (max abs diff {_num(row.extra['max_abs_diff'])})" if "max_abs_diff" in row.extra else "")
    if row.bound == "msprobe":
        e = row.extra
        if "shape" in e:
            return f"shape {e['shape'][0]} vs {e['shape'][1]}"
        text = f"cos {_num(e['cosine'])}, abs {_num(e['max_abs_err'])}, rel {_num(e['max_rel_err'])}"
        if "rel_l2" in e:
            text += f", rel L2 {_num(e['rel_l2'])} ({e['dtype']})"
        return text + ("" if e.get("finite", True) else ", NaN/Inf")
    text = _num(row.value)
    if "max_sample_rel_err_pct" in row.extra:
        text += f" (worst sample {_num(row.extra['max_sample_rel_err_pct'])})"
    if "max_pixel_diff" in row.extra:
        text += f" (max pixel diff {_num(row.extra['max_pixel_diff'])})"
    return text


def tolerance_text(row) -> str:
    if row.bound == "equal":
        return "bit-equal"
    if row.bound == "msprobe":
        return "stands out" if row.extra.get("judged_by") == "stands out" else "msprobe"
    return (">= " if row.bound == "min" else "<= ") + _num(row.tolerance)


def _label(row) -> str:
    return row.module if row.stage == "module" else row.stage


def _table_rows(rows: list) -> list:
    """The rows the table shows: every module when there are few, else a summary per model and
    the modules out of tolerance (compare.json has them all)."""
    modules = [r for r in rows if r.stage == "module"]
    if len(modules) <= MAX_MODULE_ROWS:
        return [(_label(r), str(r.step), r.metric, value_text(r), tolerance_text(r), "ok" if r.ok else "FAIL",
                 _where(r)) for r in rows]  # fmt: skip
    out, shown_groups, failed_shown = [], set(), 0
    for r in rows:
        if r.stage != "module":
            out.append((_label(r), str(r.step), r.metric, value_text(r), tolerance_text(r),
                        "ok" if r.ok else "FAIL", _where(r)))  # fmt: skip
            continue
        group = module_group(r.module or "")
        if group not in shown_groups:
            shown_groups.add(group)
            members = [m for m in modules if module_group(m.module or "") == group]
            bad = [m for m in members if not m.ok]
            worst = min((m.extra.get("cosine", float("nan")) for m in members), key=lambda c: (c == c, c))
            rule = "msprobe" + (", stands out" if any(m.extra.get("judged_by") == "stands out" for m in bad) else "")
            out.append((f"{group}/* ({len(members)} modules)", str(r.step), "worst cosine", _num(worst), rule,
                        f"FAIL ({len(bad)})" if bad else "ok", ""))  # fmt: skip
        if not r.ok and failed_shown < MAX_FAILED_MODULE_ROWS:
            failed_shown += 1
            out.append((_label(r), str(r.step), r.metric, value_text(r), tolerance_text(r), "FAIL", _where(r)))
    return out


def format_table(rows: list) -> str:
    header = ("STAGE", "STEP", "METRIC", "VALUE", "TOLERANCE", "RESULT", "WHERE (worst)")
    lines = [header, *_table_rows(rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def standing_out_text(row, tolerances: dict) -> str:
    """Why a module that passes msprobe's rule is named: its error is over its dtype's threshold
    and jumps over every module before it (align/modules.py)."""
    from dancegrpo_npu.align.modules import REL_TOLERANCE

    e = row.extra
    before = e["largest_before"]
    jump = f"{_num(e['rel_l2'] / before)}x the largest error before it ({_num(before)})" if before else \
        "and no module before it differs"  # fmt: skip
    return (f"rel L2 error {_num(e['rel_l2'])} > {_num(tolerances[REL_TOLERANCE[e['dtype']]])} ({e['dtype']}), "
            f"{jump}: the first module whose error stands out (judged so as the runs are not aligned; "
            f"msprobe's rule passes it: cos {_num(e['cosine'])}, abs {_num(e['max_abs_err'])})")  # fmt: skip


def first_divergence_text(result) -> str:
    row = result.first_divergence
    if row is None:
        return "first divergence: none"
    where = _where(row)
    if row.stage == "module":
        head = f"{row.module} (module output, step {row.step}, {where})"
    else:
        head = f"{row.stage} at step {row.step} ({where})"
    if row.extra.get("judged_by") == "stands out":
        detail = standing_out_text(row, result.tolerances)
    elif row.extra.get("problem") or row.bound in ("equal", "msprobe"):
        detail = value_text(row) + (" (msprobe: not reached)" if row.bound == "msprobe" else "")
    else:
        sign = "<" if row.bound == "min" else ">"
        detail = f"{row.metric} {_num(row.value)} {sign} {_num(row.tolerance)}" if row.value == row.value else \
            f"{row.metric} is NaN"  # fmt: skip
    return f"first divergence: {head}: {detail}"


def verdict_text(result) -> str:
    if result.aligned:
        return f"verdict: aligned: {len(result.rows)} checks over step(s) {shown_steps(result.steps)} within tolerance"
    if not result.noise_equal:
        return f"verdict: not aligned: {NOISE_VERDICT}"
    failed = sum(not r.ok for r in result.rows)
    data = "; the runs read different datasets, the likely cause (dataset: above)" if _datasets_differ(result) else ""
    return f"verdict: not aligned: {failed} of {len(result.rows)} checks out of tolerance{data}"


def _datasets_differ(result) -> bool:
    return result.datasets is not None and result.datasets.same is False


def dataset_lines(result) -> list[str]:
    """Each run's dataset, and whether they are the same (align/dataset.py)."""
    from dancegrpo_npu.align.dataset import describe

    d = result.datasets
    if d is None:
        return []
    return [f"dataset A: {describe(d.a)}", f"dataset B: {describe(d.b)}", f"dataset: {d.text}"]


def _run_line(role: str, run) -> str:
    i = run.index
    return (f"{role} {run.name}: rng {i.get('rng')}, seed {i.get('seed')}, world size {i.get('world_size')}, "
            f"{i.get('h')}x{i.get('w')}, {i.get('num_generations')} generations, {i.get('sampling_steps')} sampling "
            f"steps, {i.get('script')}")  # fmt: skip


def render(result, written: dict) -> str:
    modules = sum(r.stage == "module" for r in result.rows)
    lines = [
        _run_line("RUN_A (reference):", result.a),
        _run_line("RUN_B (under test):", result.b),
        *dataset_lines(result),
        f"steps compared: {shown_steps(result.steps)}" + (f"; module outputs: {modules}" if modules else ""),
    ]
    lines += [f"wrote {path}" for path in written.get("files", [])]
    lines += [f"note: {note}" for note in (*result.notes, *written.get("notes", []))]
    lines += ["", format_table(result.rows), "", first_divergence_text(result), verdict_text(result)]
    return "\n".join(lines)


# ---------------------------------------------------------------- compare.json and compare.png


def _jsonable(x):
    """Strict JSON: inf and NaN as strings."""
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _row_json(row) -> dict:
    return {"stage": row.stage, "step": row.step, "module": row.module, "metric": row.metric, "value": row.value,
            "tolerance": row.tolerance, "bound": row.bound, "ok": row.ok, "where": row.where, "extra": row.extra}  # fmt: skip


def compare_json(result) -> dict:
    first = result.first_divergence
    return _jsonable({
        "format": 1,
        "run_a": {"name": result.a.name, "path": str(result.a.run_dir), "index": result.a.index},
        "run_b": {"name": result.b.name, "path": str(result.b.run_dir), "index": result.b.index},
        "steps": list(result.steps),
        "tolerances": tolerances_mod.describe(result.tolerances),
        "rows": [_row_json(r) for r in result.rows],
        "first_divergence": None if first is None else {**_row_json(first), "text": first_divergence_text(result)},
        "noise_equal": result.noise_equal,
        "aligned": result.aligned,
        "verdict": verdict_text(result),
        "exit_code": 0 if result.aligned else 1,
        "reward_means": {str(s): list(v) for s, v in result.rewards.items()},
        "notes": list(result.notes),
        "datasets": None if result.datasets is None else {
            "a": result.datasets.a, "b": result.datasets.b, "same": result.datasets.same, "text": result.datasets.text},
    })  # fmt: skip


def write_reports(result) -> dict:
    out = result.b.run_dir
    write_atomic(out / "compare.json", json.dumps(compare_json(result), indent=1, allow_nan=False) + "\n")
    written = {"files": [out / "compare.json"], "notes": []}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        written["notes"].append("compare.png not written: matplotlib is not installed (the train or test extra)")
        return written
    write_png(result, out / "compare.png")
    written["files"].append(out / "compare.png")
    return written


def _curves(run, key: str, fallback: dict | None = None):
    from dancegrpo_npu.rundirs.rundir import read_metrics

    m = read_metrics(run.run_dir)
    column = {"reward_mean": m.reward, "loss": m.loss}.get(key) or m.health.get(key) or ()
    if column:
        return list(m.steps), [float("nan") if v is None else v for v in column]
    if fallback:
        steps = sorted(fallback)
        return steps, [fallback[s] for s in steps]
    return [], []


def images_panel_text(result) -> str:
    """What the image panel says when there is no pair to show: the images were compared and
    every pair is bit-identical, or neither run recorded images."""
    rows = [r for r in result.rows if r.stage == "images"]
    if not rows:
        return "no recorded images"
    unpaired = [r for r in rows if r.extra.get("problem")]
    if unpaired:
        return f"images not compared at step {unpaired[0].step}: {unpaired[0].extra['problem']}"
    steps = sorted({r.step for r in rows})
    return (f"images compared at {len(steps)} step{'s' if len(steps) > 1 else ''}: every pair bit-identical "
            "(PSNR inf), no difference to show")


def write_png(result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: clusters have no display
    import matplotlib.pyplot as plt
    import numpy as np

    fig = plt.figure(figsize=(13, 11))
    grid = fig.add_gridspec(3, 3)
    runs = (("A", result.a, 0), ("B", result.b, 1))
    ax = fig.add_subplot(grid[0, :2])
    for role, run, i in runs:
        ax.plot(*_curves(run, "reward_mean", {s: v[i] for s, v in result.rewards.items()}), marker=".",
                label=f"{role}: {run.name}")  # fmt: skip
    ax.set(title="reward (mean per step)", xlabel="step")
    ax.legend(fontsize="small")
    ax = fig.add_subplot(grid[0, 2])
    rel = [(r.step, r.value, r.extra.get("max_sample_rel_err_pct")) for r in result.rows if r.stage == "rewards"]
    if rel:
        ax.plot([s for s, _, _ in rel], [v for _, v, _ in rel], marker="o", label="mean reward")
        ax.plot([s for s, _, _ in rel], [w for _, _, w in rel], marker=".", linestyle=":", label="worst sample")
        ax.set_yscale("symlog", linthresh=1e-4)
    ax.axhline(result.tolerances["rewards_rel_pct"], color="red", linestyle="--", label="tolerance")
    ax.set(title="reward relative error (%)", xlabel="step")
    ax.legend(fontsize="small")
    for col, (key, title) in enumerate((("loss", "loss"), ("grad_norm", "grad norm"))):
        ax = fig.add_subplot(grid[1, col])
        for role, run, _ in runs:
            ax.plot(*_curves(run, key), marker=".", label=role)
        ax.set(title=f"{title} (metrics.jsonl)", xlabel="step")
        ax.legend(fontsize="small")
    ax = fig.add_subplot(grid[1, 2])
    lat = [(r.step, r.value) for r in result.rows if r.stage.startswith("latents.")]
    steps = sorted({s for s, _ in lat})
    ax.plot(steps, [max(v for s2, v in lat if s2 == s) for s in steps], marker="o")
    ax.axhline(result.tolerances["latents_rel_l2"], color="red", linestyle="--")
    ax.set(title="latents: worst relative L2 error", xlabel="step")
    worst = result.worst_images
    if worst is None:
        ax = fig.add_subplot(grid[2, :])
        ax.axis("off")
        ax.text(0.5, 0.5, images_panel_text(result), ha="center", va="center")
    else:
        psnr, step, rank, sample, img_a, img_b = worst
        diff = np.abs(img_a.astype(np.int16) - img_b.astype(np.int16)).max(axis=-1)
        gain = 255.0 / max(int(diff.max()), 1)
        for col, (image, title) in enumerate(((img_a, f"A: step {step}, rank {rank}, sample {sample}"),
                                              (img_b, f"B: PSNR {psnr:.2f} dB"),
                                              (diff * gain, f"|A-B| x{gain:.0f} (max {int(diff.max())})"))):  # fmt: skip
            ax = fig.add_subplot(grid[2, col])
            ax.imshow(image, cmap="magma" if image.ndim == 2 else None, vmin=0, vmax=255)
            ax.set_title(title, fontsize="small")
            ax.axis("off")
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes[:5]:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"compare {result.a.name} (A) vs {result.b.name} (B): {verdict_text(result)[9:]}", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
