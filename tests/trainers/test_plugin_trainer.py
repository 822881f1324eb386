"""A ninth trainer is a folder and a patch.

The test copies this repository, then plugs a ninth trainer in the way a maintainer adds one:
the FLUX family's folder copied under a new name (``trainers/ninth/``, its rows renamed, its
script ``fastvideo/train_grpo_ninth.py``) and its seam patch (here the patch that adds the
ninth script and its recipes: FLUX's trainer as the series leaves it, seam included, and FLUX's
launch scripts naming it, since upstream has no ninth script to patch), one line appended to
``patches/series``.  Then, run from the copy:

- every ``--help`` names it (the top level's and launch's, smoke's, plan's, doctor's, bench's);
- ``launch ninth --dry-run`` plans its script as it plans FLUX's;
- ``smoke --trainer ninth`` trains it (1 step, 1 rank) and passes the smoke's checks;
- ``plan ninth``, ``doctor --trainer ninth`` and ``bench --trainer ninth --size tiny`` run it;
- and the copy's own diff (git) holds no file outside ``src/dancegrpo_npu/trainers/``,
  ``patches/``, ``overlay/`` and ``tests/``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.upstream, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ALLOWED = ("src/dancegrpo_npu/trainers/", "patches/", "overlay/", "tests/")
SCRIPT = "fastvideo/train_grpo_ninth.py"

# The edits that make the copy of trainers/flux/ the ninth family: (pattern, replacement), each
# of which must match in its __init__.py (a failure names the one that no longer does).
ROW_EDITS = (
    (r"^ORDER = \d+$", "ORDER = 90"),
    (r'name="flux"', 'name="ninth"'),
    (r'name="flux-lora"', 'name="ninth-lora"'),
    (r'lora="flux-lora"', 'lora="ninth-lora"'),
    (r'name="preprocess"', 'name="preprocess-ninth"'),
    (r'preprocess="preprocess"', 'preprocess="preprocess-ninth"'),
    (r'dataset="flux"', 'dataset="ninth"'),
    (r'relpath="fastvideo/train_grpo_flux\.py"', f'relpath="{SCRIPT}"'),
    (r'finetune_flux_grpo\*\.sh', "finetune_ninth_grpo*.sh"),
    (r'run_name="smoke"', 'run_name="smoke-ninth"'),
    (r'run_name="smoke-lora"', 'run_name="smoke-ninth-lora"'),
    (r"default=True,\s*", ""),
)


@dataclass(frozen=True)
class Copy:
    root: Path
    changed: tuple[str, ...]  # the copy's diff: the paths plugging the trainer in changed

    def run(self, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(self.root / "src")}
        return subprocess.run([sys.executable, "-m", "dancegrpo_npu", "-C", str(self.root), *argv], env=env,
                              capture_output=True, text=True, timeout=timeout)


def _git(root: Path, *argv: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(root), *argv], check=True, capture_output=True, text=True, env=env).stdout


def copy_repository(dest: Path) -> None:
    """The repository's files as they are (tracked and not ignored), committed in a new git
    repository at ``dest``."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        source = REPO / rel
        if source.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copy2(source, dest / rel)
            except FileNotFoundError:  # an untracked file another test's run removed meanwhile
                pass
    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-qm", "the repository")


def new_file(path: str, text: str) -> str:
    """``path`` added with ``text``, as a git diff from /dev/null."""
    lines = text.splitlines(keepends=True)
    body = "".join("+" + line for line in lines)
    if not text.endswith("\n"):  # upstream's launch scripts end without one
        body += "\n\\ No newline at end of file\n"
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n" + body)


def seam_patch(tree: Path) -> str:
    """The ninth trainer's patch: FLUX's patched trainer as ``SCRIPT``, and FLUX's recipes as the
    ninth's (``finetune_ninth_grpo*.sh``, naming ``SCRIPT``)."""
    files = {SCRIPT: (tree / "fastvideo/train_grpo_flux.py").read_text()}
    for recipe in sorted((tree / "scripts/finetune").glob("finetune_flux_grpo*.sh")):
        files[f"scripts/finetune/{recipe.name.replace('flux', 'ninth')}"] = recipe.read_text().replace(
            "fastvideo/train_grpo_flux.py", SCRIPT)
    return ("Description: the ninth trainer: FLUX's trainer as the series leaves it, and its recipes, under a\n"
            " name of their own\n"
            "Forwarded: not-needed (a test's trainer)\n"
            "---\n" + "".join(new_file(path, text) for path, text in files.items()))


def plug_in(root: Path, tree: Path) -> None:
    family = root / "src/dancegrpo_npu/trainers"
    shutil.copytree(family / "flux", family / "ninth", ignore=shutil.ignore_patterns("__pycache__"))
    for path in (family / "ninth").rglob("*.py"):
        path.write_text(path.read_text().replace("dancegrpo_npu.trainers.flux", "dancegrpo_npu.trainers.ninth"))
    rows = family / "ninth" / "__init__.py"
    text = rows.read_text()
    for pattern, replacement in ROW_EDITS:
        text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        assert count, f"the FLUX family's rows no longer hold {pattern!r}: update ROW_EDITS"
    rows.write_text(text)
    (root / "patches" / "seam-train-grpo-ninth.patch").write_text(seam_patch(tree))
    with open(root / "patches" / "series", "a") as series:
        series.write("# A ninth trainer, FLUX's script under its own name.\nseam-train-grpo-ninth.patch\n")


@pytest.fixture(scope="module")
def ninth(patched_tree, upstream_source, tmp_path_factory) -> Copy:
    root = tmp_path_factory.mktemp("plugin") / "repo"
    copy_repository(root)
    plug_in(root, patched_tree.tree)
    changed = tuple(line[3:] for line in _git(root, "status", "--porcelain", "--untracked-files=all").splitlines())
    copy = Copy(root, changed)
    for argv in (("fetch", "--source", upstream_source), ("apply",)):
        done = copy.run(*argv)
        assert done.returncode == 0, done.stdout + done.stderr
    return copy


def test_the_copy_needed_no_file_outside_the_trainer_folder_the_patches_the_overlay_and_the_tests(ninth):
    assert ninth.changed  # the plug-in made a diff, and the test sees it
    assert "patches/series" in ninth.changed and "patches/seam-train-grpo-ninth.patch" in ninth.changed
    assert any(path.startswith("src/dancegrpo_npu/trainers/ninth/") for path in ninth.changed)
    assert [path for path in ninth.changed if not path.startswith(ALLOWED)] == []


def test_the_diff_check_sees_a_file_outside(tmp_path):
    """What the test above asks of the diff, on a diff holding a file outside."""
    root = tmp_path / "repo"
    (root / "src/dancegrpo_npu/plan").mkdir(parents=True)
    (root / "src/dancegrpo_npu/plan/memory.py").write_text("x = 1\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "r")
    (root / "src/dancegrpo_npu/plan/memory.py").write_text("x = 2\n")
    changed = [line[3:] for line in _git(root, "status", "--porcelain").splitlines()]
    assert [path for path in changed if not path.startswith(ALLOWED)] == ["src/dancegrpo_npu/plan/memory.py"]


@pytest.mark.parametrize("argv", [(), ("launch",), ("smoke",), ("plan",), ("doctor",), ("bench",)])
def test_every_help_names_it(ninth, argv):
    done = ninth.run(*argv, "--help")
    assert done.returncode == 0, done.stderr
    assert re.search(r"\bninth\b", done.stdout), done.stdout


def test_its_dry_run_plans_its_script_as_flux_is_planned(ninth):
    flux, new = ninth.run("launch", "flux", "--dry-run"), ninth.run("launch", "ninth", "--dry-run")
    assert SCRIPT in new.stdout and "train_grpo_flux.py" not in new.stdout
    assert new.returncode == flux.returncode  # the same inputs missing here (weights), nothing else
    problems = [line.replace("ninth", "flux") for line in new.stdout.splitlines() if "could not start" in line]
    assert problems == [line for line in flux.stdout.splitlines() if "could not start" in line]


def test_its_smoke_trains_it(ninth):
    done = ninth.run("smoke", "--trainer", "ninth", "--steps", "1", "--nproc", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = [p for p in (ninth.root / "runs").iterdir() if p.name.endswith("smoke-ninth")]
    assert "train_grpo_ninth.py" in (run / "launch.json").read_text()


def test_plan_doctor_and_bench_take_it(ninth):
    plan = ninth.run("plan", "ninth", "--world-size", "8", "--device-memory", "64")
    assert plan.returncode in (0, 1) and "ninth" in plan.stdout + plan.stderr, plan.stdout + plan.stderr
    doctor = ninth.run("doctor", "--trainer", "ninth")
    assert "ninth" in doctor.stdout and "unknown" not in doctor.stdout + doctor.stderr, doctor.stdout + doctor.stderr
    bench = ninth.run("bench", "--trainer", "ninth", "--size", "tiny")
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert "ninth" in bench.stdout
