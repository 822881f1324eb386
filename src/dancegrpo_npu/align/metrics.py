"""The numbers ``compare`` puts in its table, computed in float64 from the recorded tensors.

Each function takes RUN_A's tensor ``a`` (the reference) and RUN_B's ``b`` and returns the value
that is held against a tolerance, with the index of the worst element (sample, sampling step),
so that the report can say where.  Bit-identical tensors give an error of exactly 0 (PSNR inf),
NaN included: a run compared with itself is aligned even if it diverged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

INF = float("inf")


@dataclass
class Check:
    """One row of the table: a stage of a step (or a module), the worst over the ranks."""

    stage: str  # noise.init, latents.3, images, rewards, module, ...
    step: int
    metric: str  # what `value` is
    value: float  # for "bit-equal": the number of differing elements
    tolerance: float | None  # None: bit-equal
    bound: str  # "max" | "min" | "equal" | "msprobe"
    ok: bool
    where: dict = field(default_factory=dict)  # rank, sample, sampling_step
    module: str | None = None
    extra: dict = field(default_factory=dict)  # further figures (module cosine/abs/rel, max pixel diff)

    def worse_than(self, other: Check) -> bool:
        """Whether this rank's row should replace ``other`` (the same stage on another rank)."""
        if self.ok != other.ok:
            return not self.ok
        if self.bound == "min":
            return _key(self.value, -1) < _key(other.value, -1)
        if self.bound == "msprobe":
            return _key(self.extra.get("cosine"), -1) < _key(other.extra.get("cosine"), -1)
        return _key(self.value, 1) > _key(other.value, 1)


def _key(x, sign: int) -> float:
    """NaN sorts as the worst value."""
    return sign * INF if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def identical(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def differing_elements(a: np.ndarray, b: np.ndarray) -> int:
    """Elements whose bits differ (a NaN equals the same NaN: the same bits were drawn); every
    element when shape or dtype differ."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.size, b.size, 1)
    if a.size == 0:
        return 0
    bytes_a = np.ascontiguousarray(a).reshape(-1).view(np.uint8).reshape(a.size, -1)
    bytes_b = np.ascontiguousarray(b).reshape(-1).view(np.uint8).reshape(b.size, -1)
    return int(np.count_nonzero((bytes_a != bytes_b).any(axis=1)))


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def rel_l2_per_sample(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """||b_i - a_i|| / ||a_i|| for each sample i (axis 0); 0 when both are 0, inf when only a is."""
    if identical(a, b):
        return np.zeros(a.shape[0])
    d = _f64(b) - _f64(a)
    num = np.sqrt((d.reshape(d.shape[0], -1) ** 2).sum(axis=1))
    den = np.sqrt((_f64(a).reshape(a.shape[0], -1) ** 2).sum(axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(den > 0, num / np.where(den > 0, den, 1), np.where(num > 0, INF, 0.0))
    return np.where(np.isnan(num), np.nan, out)


def max_abs(a: np.ndarray, b: np.ndarray) -> tuple[float, tuple]:
    """(max |b - a|, index of it); NaN if any difference is NaN."""
    if identical(a, b) or a.size == 0:
        return 0.0, ()
    d = np.abs(_f64(b) - _f64(a))
    if np.isnan(d).any():
        return float("nan"), tuple(int(i) for i in np.argwhere(np.isnan(d))[0])
    i = np.unravel_index(int(np.argmax(d)), d.shape)
    return float(d[i]), tuple(int(x) for x in i)


def relative(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|b - a| / |a| elementwise (0 where both are 0, inf where only a is)."""
    fa, d = _f64(a), np.abs(_f64(b) - _f64(a))
    if identical(a, b):
        return np.zeros(a.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(fa != 0, d / np.where(fa != 0, np.abs(fa), 1), np.where(d > 0, INF, 0.0))
    return np.where(np.isnan(d), np.nan, out)


def worst(values: np.ndarray, largest: bool = True) -> tuple[float, tuple]:
    """The worst element (NaN first) and its index."""
    if values.size == 0:
        return 0.0, ()
    if np.isnan(values).any():
        return float("nan"), tuple(int(i) for i in np.argwhere(np.isnan(values))[0])
    flat = int(np.argmax(values) if largest else np.argmin(values))
    i = np.unravel_index(flat, values.shape)
    value = float(values[i])
    if value == (0.0 if largest else INF):  # nothing differs: no place to name
        return value, ()
    return value, tuple(int(x) for x in i)


def psnr_per_image(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(PSNR in dB, max |pixel difference|) of each uint8 image pair (axis 0); inf when equal."""
    d = _f64(b) - _f64(a)
    n = d.shape[0]
    mse = (d.reshape(n, -1) ** 2).mean(axis=1)
    with np.errstate(divide="ignore"):
        psnr = np.where(mse > 0, 10 * np.log10(255.0**2 / np.where(mse > 0, mse, 1)), INF)
    return psnr, np.abs(d).reshape(n, -1).max(axis=1) if d.size else np.zeros(n)


def scaled_max_abs(a: np.ndarray, b: np.ndarray) -> tuple[float, tuple]:
    """max |b - a| / max |a|: an error relative to the tensor's scale (loss values near 0 would
    make an elementwise relative error meaningless)."""
    err, where = max_abs(a, b)
    scale = float(np.abs(_f64(a)).max()) if a.size else 0.0
    if err == 0 or math.isnan(err):
        return err, where
    return (err / scale if scale > 0 else INF), where


def module_metrics(a: np.ndarray, b: np.ndarray) -> dict:
    """msprobe's three figures: cosine, max abs error, max relative error; and finiteness."""
    if a.shape != b.shape:
        return {"cosine": float("nan"), "max_abs_err": float("nan"), "max_rel_err": float("nan"),
                "finite": False, "shape": [list(a.shape), list(b.shape)]}  # fmt: skip
    fa, fb = _f64(a).ravel(), _f64(b).ravel()
    finite = bool(np.isfinite(fa).all() and np.isfinite(fb).all())
    if identical(a, b):
        return {"cosine": 1.0, "max_abs_err": 0.0, "max_rel_err": 0.0, "finite": finite}
    na, nb = float(np.linalg.norm(fa)), float(np.linalg.norm(fb))
    if na == 0 and nb == 0:
        cos = 1.0
    elif na == 0 or nb == 0:
        cos = 0.0
    else:
        cos = float(np.dot(fa, fb) / (na * nb))
    abs_err, _ = max_abs(a, b)
    rel, _ = worst(relative(a, b))
    return {"cosine": cos, "max_abs_err": abs_err, "max_rel_err": rel, "finite": finite}


def msprobe_ok(m: dict, tol: dict) -> bool:
    """Not "not reached" by msprobe's rule: (cosine < module_cos and max abs > module_abs), or
    cosine < module_cos_min, or max abs > module_abs_max, or NaN/Inf, fail."""
    cos, err = m["cosine"], m["max_abs_err"]
    if not m["finite"] or math.isnan(cos) or math.isnan(err):
        return False
    if cos < tol["module_cos"] and err > tol["module_abs"]:
        return False
    return cos >= tol["module_cos_min"] and err <= tol["module_abs_max"]
