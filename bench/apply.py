"""Apply speed on the real upstream: the whole series + overlay onto a fetched tree
(target <= 1 s), and the no-op re-apply, measured side by side in one run.

    PYTHONPATH=src python bench/apply.py [--repeat N] [--source URL|PATH]

The project's own series is measured as it is (it may still be small).  A synthetic
series of the same shape as a real port (one patch per upstream module, 30 of them,
plus 20 overlay files) is measured on the same tree, so the figure stays meaningful
whatever the series holds today.  Exits 0 with a message when upstream is unavailable.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.fspath(ROOT / "src"))

from dancegrpo_npu.engine.apply import apply_worktree  # noqa: E402
from dancegrpo_npu.errors import DancegrpoError  # noqa: E402
from dancegrpo_npu.engine.fetch import fetch  # noqa: E402
from dancegrpo_npu.engine.lockfile import refresh_lock  # noqa: E402
from dancegrpo_npu.project import find_project  # noqa: E402
from dancegrpo_npu.engine.status import inspect  # noqa: E402

TARGET_S = 1.0


def copy_project(dest: Path, with_series: bool = True) -> Path:
    dest.mkdir(parents=True)
    shutil.copy2(ROOT / "upstream.lock", dest / "upstream.lock")
    if with_series:
        shutil.copytree(ROOT / "patches", dest / "patches")
        if (ROOT / "overlay").is_dir():
            shutil.copytree(ROOT / "overlay", dest / "overlay", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
        (dest / "patches").mkdir()
        (dest / "patches" / "series").write_text("")
    return dest


def synthetic_series(project: Path, tree: Path, n_patches: int = 30, n_overlay: int = 20) -> None:
    """One small patch per upstream Python module (a line added near the top), made
    with git diff on a scratch copy; plus overlay modules."""
    modules = subprocess.run(["git", "-C", os.fspath(tree), "ls-files", "fastvideo/*.py"], capture_output=True, text=True, check=True).stdout.split()
    modules = [m for m in modules if (tree / m).stat().st_size > 200][:n_patches]
    scratch = Path(tempfile.mkdtemp(prefix="bench-scratch-"))
    try:
        subprocess.run(["git", "clone", "-q", "--no-checkout", os.fspath(tree), os.fspath(scratch / "t")], check=True)
        subprocess.run(["git", "-C", os.fspath(scratch / "t"), "sparse-checkout", "set", "--no-cone", "/*", "!/assets/"], check=True, capture_output=True)
        subprocess.run(["git", "-C", os.fspath(scratch / "t"), "checkout", "-q", "HEAD"], check=True, capture_output=True)
        (project / "patches").mkdir(exist_ok=True)
        names = []
        for i, rel in enumerate(modules, 1):
            f = scratch / "t" / rel
            lines = f.read_text().splitlines(keepends=True)
            lines.insert(min(3, len(lines)), "# npu: benchmark change\n")
            f.write_text("".join(lines))
            diff = subprocess.run(["git", "-C", os.fspath(scratch / "t"), "diff", "--", rel], capture_output=True, check=True).stdout
            subprocess.run(["git", "-C", os.fspath(scratch / "t"), "checkout", "-q", "--", rel], check=True)
            name = f"{i:04d}-bench-{Path(rel).stem}.patch"
            (project / "patches" / name).write_bytes(b"Description: benchmark change\nAuthor: bench\n---\n" + diff)
            names.append(name)
        (project / "patches" / "series").write_text("".join(f"{n}\n" for n in names))
        for i in range(n_overlay):
            dest = project / "overlay" / "fastvideo" / "npu_bench" / f"mod_{i:02d}.py"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(f"VALUE = {i}\n" * 50)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(series_project, pristine_project, repeat: int) -> dict[str, float]:
    first, noop, verify = [], [], []
    for _ in range(repeat):
        apply_worktree(pristine_project)  # back to upstream as fetched
        first.append(timed(lambda: apply_worktree(series_project)))
        noop.append(timed(lambda: apply_worktree(series_project)))
        verify.append(timed(lambda: inspect(series_project)))
        assert inspect(series_project).exact
    return {"apply": statistics.median(first), "noop": statistics.median(noop), "verify": statistics.median(verify)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--source", default=os.environ.get("DANCEGRPO_SOURCE"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-apply-") as tmp:
        tmp = Path(tmp)
        workdir = tmp / "tree"
        own = find_project(copy_project(tmp / "own"), workdir)
        pristine = find_project(copy_project(tmp / "pristine", with_series=False), workdir)
        try:
            t_fetch = timed(lambda: fetch(own, source=args.source))
        except DancegrpoError as e:
            print(f"bench/apply.py: upstream unavailable: {e.one_line()}")
            return 0
        synth = find_project(copy_project(tmp / "synthetic", with_series=False), workdir)
        synthetic_series(synth.root, workdir)
        refresh_lock(synth)
        n_own = len([ln for ln in (own.series_path.read_text().splitlines()) if ln.split("#")[0].strip()])
        n_syn = len((synth.series_path.read_text()).split())
        rows = [("project series", n_own, measure(own, pristine, args.repeat)), ("synthetic series", n_syn, measure(synth, pristine, args.repeat))]
        print(f"fetch (clone + verify + checkout): {t_fetch:.3f} s")
        print(f"{'series':<18} {'patches':>7} {'apply s':>9} {'no-op s':>9} {'verify s':>9} {'apply/target':>13}")
        for label, n, m in rows:
            print(f"{label:<18} {n:>7} {m['apply']:>9.3f} {m['noop']:>9.3f} {m['verify']:>9.3f} {m['apply'] / TARGET_S:>12.2f}x")
        worst = max(m["apply"] for _, _, m in rows)
        print(f"target: apply <= {TARGET_S:.1f} s -> {'met' if worst <= TARGET_S else 'MISSED'} (worst {worst:.3f} s; median of {args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
