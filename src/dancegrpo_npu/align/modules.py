"""The module rows of ``compare``: each recorded module output of step 1, judged two ways.

1. msprobe's rule (``metrics.msprobe_ok``): "not reached" when cosine < 0.99 and max abs error
   > 0.001, or cosine < 0.9, or max abs error > 1, or NaN/Inf.  It is what Ascend support reads,
   and it is the module verdict of an otherwise aligned comparison.
2. Standing out, applied only once the comparison is not aligned (a stage or a module already
   out of tolerance): a fault of a few percent (a RoPE phase off by 2%: cosine 0.9988) passes
   msprobe's rule in every module and shows only in the rewards, its effect.  A module stands
   out when its relative L2 error ||B-A||/||A|| is above the threshold of its dtype (msprobe's
   relative-error thresholds: bf16 0.004, fp16 0.001, fp32 2e-4) AND at least ``module_jump``
   times the largest error of every module executed before it, in execution order: the error
   jumps there.  Float noise grows from module to module and never jumps like that; runs on
   the same device are bit-equal up to the fault, so the fault's module is the first to differ.

The dtype is read off RUN_A's values (records store float32): values that all fit bfloat16
(the low 16 bits zero) came from bf16, those that fit float16 from fp16, the others are fp32.
"""

from __future__ import annotations

from dancegrpo_npu.rundirs.records import RunRecords, open_pair

# dtype -> the tolerance holding its relative-error threshold
REL_TOLERANCE = {"bf16": "module_rel_bf16", "fp16": "module_rel_fp16", "fp32": "module_rel_fp32"}


def source_dtype(a: np.ndarray) -> str:
    """bf16 | fp16 | fp32: the narrowest float type that holds every value of ``a`` exactly."""
    import numpy as np  # here, not at the top: the CLI imports this module for compare's parser
    x = np.ascontiguousarray(a, dtype=np.float32)
    if x.size == 0 or not np.isfinite(x).all():
        return "fp32"
    if not (x.view(np.uint32) & 0xFFFF).any():
        return "bf16"
    with np.errstate(over="ignore"):
        if np.array_equal(x.astype(np.float16).astype(np.float32), x):
            return "fp16"
    return "fp32"


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    """||b - a|| / ||a|| over the whole tensor, in float64 (0 when equal, inf when only a is 0)."""
    import numpy as np
    d = np.asarray(b, np.float64) - np.asarray(a, np.float64)
    num, den = float(np.linalg.norm(d)), float(np.linalg.norm(np.asarray(a, np.float64)))
    if num == 0 or np.isnan(num):
        return num
    return num / den if den > 0 else float("inf")


def module_checks(a: RunRecords, b: RunRecords, tol: dict) -> list:
    """One row per module of RUN_A's execution order (rank 0's order names the rows), worst over
    the ranks; each row carries whether the module stands out (``extra["stands_out"]``)."""
    from dancegrpo_npu.align import metrics as m

    merged: dict[str, m.Check] = {}
    for rank in range(a.world_size):
        largest_before = 0.0  # the largest relative error of the modules executed so far
        with open_pair(a.module_file(rank), b.module_file(rank)) as (fa, fb):
            for name in a.module_order(rank):
                ta, tb = fa.get(name), fb.get(name)
                where = {"rank": rank}
                if ta is None or tb is None:
                    what = "missing in " + ("RUN_A" if ta is None else "RUN_B")
                    row = m.Check("module", 1, what, float("nan"), None, "msprobe", False, where, name, {"problem": what})
                else:
                    figures = m.module_metrics(ta, tb)
                    if "shape" not in figures:
                        dtype, err = source_dtype(ta), rel_l2(ta, tb)
                        threshold = tol[REL_TOLERANCE[dtype]]
                        figures.update(dtype=dtype, rel_l2=err, largest_before=largest_before,
                                       stands_out=bool(err > threshold and err >= tol["module_jump"] * largest_before))
                        largest_before = max(largest_before, err) if err == err else float("inf")
                    row = m.Check("module", 1, "cosine", figures["cosine"], tol["module_cos"], "msprobe",
                                  m.msprobe_ok(figures, tol), where, name, figures)  # fmt: skip
                if name not in merged or _worse(row, merged[name]):
                    merged[name] = row
    return list(merged.values())


def _worse(row, other) -> bool:
    """Worse over the ranks: out of tolerance first, then standing out, then msprobe's cosine."""
    if row.ok == other.ok and bool(row.extra.get("stands_out")) != bool(other.extra.get("stands_out")):
        return bool(row.extra.get("stands_out"))
    return row.worse_than(other)


def flag_standing_out(rows: list) -> int:
    """In a comparison that is not aligned, the module rows that stand out become out of
    tolerance (``extra["judged_by"] = "stands out"``); returns how many did."""
    if all(r.ok for r in rows):
        return 0
    flagged = 0
    for r in rows:
        if r.stage == "module" and r.ok and r.extra.get("stands_out"):
            r.ok, r.extra["judged_by"] = False, "stands out"
            flagged += 1
    return flagged
