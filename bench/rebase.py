"""How long a rebase takes across 100 upstream commits with a series like the real one.

    PYTHONPATH=src python bench/rebase.py [--commits 100] [--patches 15] [--files 10]

A synthetic upstream (10 files of ~600 lines, Python-like text) gets a series of 15
patches touching all 10 files (2-3 hunks each, -U2 like the real series), then 100
upstream commits that move context (lines inserted above the hunks), change lines
inside the patches' context (3-way merges) and touch unrelated files: no conflicts.
It times `upstream-log`, `rebase --dry-run` and `rebase --onto main` (all in this
process), checks the rebase went through and the new series applies, and prints the
figures next to the target (<= 30 s on 2 cores).  The work tree is made by the
engine (fetch + apply), and the engine verifies the regenerated series.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "src"))

from rebase_helpers import History, PatchSpec, make_project  # noqa: E402

TARGET_S = 30.0


def build(tmp: Path, n_commits: int, n_patches: int, n_files: int):
    rng = random.Random(0)
    files = [f"fastvideo/module_{i:02d}.py" for i in range(n_files)]
    history = History(tmp / "upstream")
    for k, rel in enumerate(files):
        history.write(rel, "".join(f"def f{k}_{j}(x):  # line {j}\n" for j in range(1, 601)))
    history.write("README.md", "upstream\n")
    base = history.commit("initial")

    # each patch edits 2-3 lines in one or two files, spread so hunks never overlap
    slots = {rel: list(range(60, 560, 40)) for rel in files}
    specs, touched = [], {rel: [] for rel in files}
    for p in range(n_patches):
        rels = [files[p % n_files]] + ([files[(p + 3) % n_files]] if p % 2 else [])
        edits = {}
        for rel in rels:
            lines = [slots[rel].pop(0) for _ in range(2 if len(rels) > 1 else 3)]
            touched[rel] += lines

            def edit(old, lines=lines, p=p):
                out = old.splitlines(keepends=True)
                for ln in lines:
                    out[ln - 1] = f"npu_fix_{p}_{ln} = True  # the port\n"
                return "".join(out)

            edits[rel] = edit
        specs.append(PatchSpec(f"{p + 1:04d}-concern-{p + 1}.patch", f"concern {p + 1}", edits))
    root = make_project(tmp / "project", history, base, specs, {"fastvideo/npu_overlay.py": "OURS = 1\n"}, context=2)

    def index_of(text: list[str], rel: str, j: int) -> int:
        k = files.index(rel)
        return next(i for i, t in enumerate(text) if t.startswith(f"def f{k}_{j}(x):"))

    for c in range(n_commits):
        kind = c % 4
        rel = rng.choice(files)
        text = history.read(rel).splitlines(keepends=True)
        if kind == 0:  # context moves: a line inserted at the top
            text.insert(0, f"# upstream {c}\n")
        elif kind in (1, 2) and touched[rel]:
            # 4 lines below a patched line: outside its -U2 context (applies, maybe moved);
            # 2 lines below: inside it, so git apply fails and the 3-way merge succeeds
            i = index_of(text, rel, rng.choice(touched[rel]) + (4 if kind == 1 else 2))
            text[i] = text[i].rstrip("\n") + f"  # upstream {c}\n"
        else:  # elsewhere in the tree
            history.write(f"docs/note_{c}.md", f"note {c}\n")
        history.write(rel, "".join(text))
        history.commit(f"upstream change {c}")
    return history, root


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=100)
    ap.add_argument("--patches", type=int, default=15)
    ap.add_argument("--files", type=int, default=10)
    args = ap.parse_args()
    os.environ.setdefault("SOURCE_DATE_EPOCH", "1767225600")

    from dancegrpo_npu.project import find_project
    from dancegrpo_npu.rebase.session import start_rebase
    from dancegrpo_npu.rebase.dry_run import dry_run
    from dancegrpo_npu.engine.series import load_series
    from dancegrpo_npu.rebase.upstream_log import upstream_log

    with tempfile.TemporaryDirectory(prefix="dancegrpo-npu-bench-rebase-") as tmp:
        t0 = time.perf_counter()
        history, root = build(Path(tmp), args.commits, args.patches, args.files)
        t1 = time.perf_counter()
        project = find_project(root)
        log = upstream_log(project, "main")
        t2 = time.perf_counter()
        dry = dry_run(project, "main")
        t3 = time.perf_counter()
        result = start_rebase(project, "main")
        t4 = time.perf_counter()
        if result.status != "done":
            print(result.report)
            print("FAILED: the rebase did not go through")
            return 1
        outcomes = {}
        for line in result.report.splitlines():
            for key in ("applied as is", "context moved", "3-way merged"):
                if key in line:
                    outcomes[key] = outcomes.get(key, 0) + 1
        n = len(load_series(project.patches_dir))
        hits = sum(c.touches_series for c in log.commits)
        print(f"history               {len(log.commits)} upstream commits ({hits} touch patched files), "
              f"{args.files} patched files, {n} patches (built in {t1 - t0:.1f} s)")
        print(f"patch outcomes        {', '.join(f'{v} {k}' for k, v in sorted(outcomes.items()))}")
        print(f"upstream-log          {t2 - t1:6.2f} s")
        print(f"rebase --dry-run      {t3 - t2:6.2f} s  ({dry.status})")
        print(f"rebase --onto main    {t4 - t3:6.2f} s  (target <= {TARGET_S:.0f} s on 2 cores: "
              f"{'met' if t4 - t3 <= TARGET_S else 'MISSED'}, {TARGET_S / (t4 - t3):.0f}x under)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
