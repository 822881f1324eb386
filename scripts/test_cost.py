"""What the tests cost in CPU time, from the log tests/conftest.py writes under $DANCEGRPO_TEST_CPU_LOG.

    DANCEGRPO_TEST_CPU_LOG=build/cpu ./scripts/test.sh      # CI's run, each test's CPU logged
    .venv/bin/python scripts/test_cost.py build/cpu [--files N]

Prints the whole run's test CPU time, the N costliest test files, and each trainer family's share:
the tests whose id names the family (its folder under src/dancegrpo_npu/trainers/) or one of its
trainers (`launch` names), a test naming several split evenly between them; the tests naming none
are the default trainer's and the tool's.  CPU time, not the wall clock: CI on this project's
machines is bound by the CPU, so CPU time is what a test takes from the others, and it moves less
with the load beside it than the wall clock does (two whole CI runs here: 36.8 and 36.9 min in all,
while a file's moved by up to 15 %: compare totals, or files with a margin).  A run that several
tests share (tests/shared_runs.py) is counted where it was made, in the first test that asked for it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

NONE = "none named (the default trainer's and the tool's)"


def read_log(directory: Path) -> list[dict]:
    """Every test's line of every worker's file in ``directory``."""
    files = sorted(directory.glob("*.jsonl"))
    if not files:
        raise SystemExit(f"test_cost.py: error: no *.jsonl in {directory}; run the tests with "
                         f"DANCEGRPO_TEST_CPU_LOG={directory} first")
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def named_families(test_id: str, known: dict[str, list[str]]) -> list[str]:
    """The families ``test_id`` names: a word of it (split at _ / . : [ ] and spaces) that is a
    family's folder or one of its trainers (``test_smoke_sd.py`` names sd, ``[skyreels-i2v]``
    hunyuan; ``test_sde_window`` names none)."""
    words = set(re.split(r"[_/.:\[\]\s]+", test_id))
    return [family for family, trainers in known.items() if family in words or words & set(trainers)]


def cost(lines: list[dict], known: dict[str, list[str]]) -> dict:
    by_file: dict[str, float] = defaultdict(float)
    by_family: dict[str, float] = defaultdict(float)
    slow = 0.0
    for line in lines:
        slow += line["cpu_s"] if line.get("slow") else 0.0
        by_file[line["test"].split("::")[0]] += line["cpu_s"]
        named = named_families(line["test"], known) or [NONE]
        for family in named:
            by_family[family] += line["cpu_s"] / len(named)
    return {"tests": len(lines), "cpu_s": sum(line["cpu_s"] for line in lines),
            "wall_s": sum(line["wall_s"] for line in lines), "slow_cpu_s": slow, "by_file": dict(by_file),
            "by_family": dict(by_family)}


def report(totals: dict, files: int) -> list[str]:
    out = [f"{totals['tests']} tests: {totals['cpu_s'] / 60:.1f} min of CPU, {totals['wall_s'] / 60:.1f} min of test "
           "time (summed over the workers)",
           f"the slow tests (the training runs and their kin, left out by -m 'not slow'): {totals['slow_cpu_s'] / 60:.1f} min",
           "", f"the {files} costliest files (CPU s):"]
    for name, s in sorted(totals["by_file"].items(), key=lambda kv: -kv[1])[:files]:
        out.append(f"  {s:7.1f}  {name}")
    out += ["", "by trainer family (CPU min):"]
    for name, s in sorted(totals["by_family"].items(), key=lambda kv: -kv[1]):
        out.append(f"  {s / 60:6.1f}  {name}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="the directory $DANCEGRPO_TEST_CPU_LOG named")
    parser.add_argument("--files", type=int, default=15, metavar="N", help="how many files to list (default 15)")
    args = parser.parse_args(argv)
    from dancegrpo_npu import registry

    print("\n".join(report(cost(read_log(args.log), registry.families()), args.files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
