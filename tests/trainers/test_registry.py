"""The trainer registry is the one place of the tool that knows a trainer.

- No trainer's name and no trainer script's path is a literal in src/ outside trainers/ (the
  files that name each trainer are listed, so that a failure says where).
- A row is keyword-built.
- A copy of a row under a new name is a trainer launch, smoke, plan and doctor know, in their
  --help and in their refusals, with no other edit.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from synthetic_tree import make_project, trust_synthetic_tree

from dancegrpo_npu import registry
from dancegrpo_npu.cli import main
from dancegrpo_npu.project import find_project

SRC = Path(__file__).resolve().parents[2] / "src" / "dancegrpo_npu"
REGISTRY_DIR = SRC / "trainers"
# The registry's names, and those of the trainers still to come.
COMING = ("hunyuan", "skyreels-i2v", "sd")


def trainer_literal() -> re.Pattern:
    names = sorted({*registry.trainers(), *COMING}, key=len, reverse=True)
    return re.compile(r"[\"'](" + "|".join(map(re.escape, names)) + r")[\"']|fastvideo/train_grpo_")


def files_naming(pattern: re.Pattern, root: Path = SRC) -> dict[str, list[str]]:
    """{name (or the script path): the files of ``root`` holding it as a literal}."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix not in (".py", ".json"):
            continue
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            name = match.group(1) or "fastvideo/train_grpo_"
            where = str(path.relative_to(root))
            if where not in found.setdefault(name, []):
                found[name].append(where)
    return found


def outside_registry(found: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: [f for f in files if not f.startswith("trainers/")] for name, files in found.items()
            if any(not f.startswith("trainers/") for f in files)}


def test_no_trainer_is_named_outside_the_registry():
    found = files_naming(trainer_literal())
    assert set(registry.trainers()) <= set(found)  # the registry itself names each one
    assert outside_registry(found) == {}


def test_the_check_finds_a_name_written_elsewhere(tmp_path):
    (tmp_path / "trainers").mkdir()
    (tmp_path / "trainers" / "flux.py").write_text('NAME = "flux"\n')
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "launch.py").write_text('if name == "wan":\n    pass\nSCRIPT = "fastvideo/train_grpo_x.py"\n')
    found = files_naming(trainer_literal(), tmp_path)
    assert outside_registry(found) == {"wan": ["run/launch.py"], "fastvideo/train_grpo_": ["run/launch.py"]}


def registry_aliases(root: Path = SRC) -> list[str]:
    """Module-level names outside trainers/ that hold the registry or a view of it: an import of
    REGISTRY under a module's own name, an assignment from it, or an instance of a class of the
    module that reads it.  Every reader looks rows up through dancegrpo_npu.registry instead."""
    import ast

    def reads_registry(node) -> bool:
        return any(isinstance(n, ast.Name) and n.id == "REGISTRY" or isinstance(n, ast.Attribute) and n.attr == "REGISTRY"
                   for n in ast.walk(node))

    found = []
    for path in sorted(root.rglob("*.py")):
        where = str(path.relative_to(root))
        if where.startswith("trainers/"):
            continue
        module = ast.parse(path.read_text(encoding="utf-8"))
        views = {n.name for n in module.body if isinstance(n, ast.ClassDef) and reads_registry(n)}
        for node in module.body:
            if isinstance(node, ast.ImportFrom) and any(a.name == "REGISTRY" for a in node.names):
                found.append(f"{where}: imports REGISTRY")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                value = node.value
                called = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in views
                if called or reads_registry(value):
                    found.append(f"{where}:{node.lineno}")
    return found


def test_the_registry_is_looked_up_only_through_its_package():
    assert registry_aliases() == []


def test_the_alias_check_finds_an_alias_and_a_view(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "args.py").write_text("from x import registry\nSCRIPTS = registry.REGISTRY\n")
    (tmp_path / "run" / "view.py").write_text(
        "class Smoked:\n    def get(self, k):\n        return registry.REGISTRY[k]\n\n\nTRAINERS = Smoked()\n")
    (tmp_path / "run" / "imported.py").write_text("from dancegrpo_npu.registry import REGISTRY as ROWS\n")
    assert registry_aliases(tmp_path) == ["run/args.py:2", "run/imported.py: imports REGISTRY", "run/view.py:6"]


def test_a_row_is_keyword_built():
    with pytest.raises(TypeError):
        registry.TrainerSpec("x", "fastvideo/x.py", "help", "X", output_in_run_dir=True)  # type: ignore[misc]


def test_every_row_names_what_it_needs():
    for name, spec in registry.REGISTRY.items():
        assert spec.name == name
        if spec.is_trainer:
            assert spec.smoke is not None, name
        if spec.is_trainer and spec.dataset is not None:  # a trainer of an embeddings dataset names its maker
            assert spec.preprocess in registry.preprocessing(), name
            assert registry.get(spec.preprocess).dataset == spec.dataset, name
        hooks = (spec.smoke.fixtures, spec.smoke.arguments, spec.smoke.checkpoint, spec.smoke.check_options,
                 spec.smoke.unchanged_note) if spec.smoke else ()
        for ref in hooks:
            assert not ref or callable(registry.load(ref)), (name, ref)
    assert [s.name for s in registry.REGISTRY.values() if s.default] == [registry.default_trainer().name]


def test_the_readmes_list_of_trainers_is_the_registrys():
    """The README's sentence that lists the ported trainers names each one the registry has."""
    readme = (SRC.parents[1] / "README.md").read_text()
    listed = " ".join(next(p for p in readme.split("\n\n") if "trainers are ported" in p).split())
    assert all(f"`{name}`" in listed for name in registry.trainers()), listed


def test_an_unknown_name_is_refused_in_one_line_with_the_nearest():
    with pytest.raises(Exception) as e:
        registry.get("wam")
    assert e.value.exit_code == 2 and "did you mean wan?" in e.value.one_line()


# ------------------------------------------------------------------ a trainer added as a row

NEW = "flux-copy"


@pytest.fixture
def plugged(monkeypatch):
    """The default trainer's row again under a new name, and nothing else changed."""
    row = replace(registry.default_trainer(), name=NEW, default=False, lora=None, help="a copy of the default trainer")
    monkeypatch.setitem(registry.REGISTRY, NEW, row)
    return row


@pytest.mark.parametrize("verb", [["launch"], ["smoke"], ["plan"], ["doctor"], ["bench"]])
def test_a_new_row_is_in_every_verbs_help(plugged, verb, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse would wrap a hyphenated name
    with pytest.raises(SystemExit) as e:
        main([*verb, "--help"])
    assert e.value.code == 0
    assert NEW in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["launch", "nonesuch", "--dry-run"],
    ["smoke", "--trainer", "nonesuch"],
    ["plan", "nonesuch"],
    ["doctor", "--trainer", "nonesuch"],
    ["bench", "--trainer", "nonesuch"],
], ids=["launch", "smoke", "plan", "doctor", "bench"])
def test_a_new_row_is_in_every_verbs_refusal(plugged, argv, capsys, tmp_path, monkeypatch):
    trust_synthetic_tree(monkeypatch)
    monkeypatch.chdir(make_project(tmp_path / "proj"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "'nonesuch'" in err and NEW in err, err


def test_a_new_row_launches(plugged, tmp_path, monkeypatch, capsys):
    trust_synthetic_tree(monkeypatch)
    project = find_project(make_project(tmp_path / "proj"))
    assert main(["launch", "-C", str(project.root), NEW, "--dry-run", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert plugged.relpath in out and "--hps_ckpt" in out  # its script, with its row's defaults


@pytest.mark.upstream
def test_a_new_row_plans(plugged, patched_tree, capsys):
    """plan reads the copied row's recipe sizes from upstream's script in the patched tree."""
    assert main(["-C", str(patched_tree.project.root), "plan", NEW]) == 0
    assert f"dancegrpo-npu launch {NEW} " in capsys.readouterr().out


def test_doctor_checks_a_new_row_by_default(plugged, tmp_path, monkeypatch):
    from dancegrpo_npu.doctor import trainers as doctor_trainers

    trust_synthetic_tree(monkeypatch)
    project = find_project(make_project(tmp_path / "proj"))
    installed = doctor_trainers.installed(project, dict(__import__("os").environ))
    assert NEW in installed and registry.default_trainer().name in installed
    assert doctor_trainers.trainer_problems(project, NEW, dict(__import__("os").environ)) == \
        doctor_trainers.trainer_problems(project, registry.default_trainer().name, dict(__import__("os").environ))


@pytest.mark.parametrize("first", ["dancegrpo_npu.trainers.common", "dancegrpo_npu.trainers.flux.architecture",
                                   "dancegrpo_npu.registry.spec"])
def test_a_module_of_a_family_imported_first_imports(first):
    """The registry walks the families when a row is first asked for, not when it is imported: a
    family's module imported before anything else (its imports reach ``registry.spec``) does not
    set the walk off half-way through its own import."""
    code = f"import {first}\nfrom dancegrpo_npu import registry\nprint(' '.join(registry.names()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=SRC.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == registry.names()


def test_two_rows_of_one_name_are_refused_in_one_line():
    """A family folder copied under a new name with its rows' names kept: every command stops at
    its first look at the registry (whose walk this is), saying which name and what to do."""
    from types import SimpleNamespace

    from dancegrpo_npu.errors import DancegrpoError

    row = registry.get("flux")
    twins = [SimpleNamespace(__name__=f"dancegrpo_npu.trainers.{name}", ROWS=(row,)) for name in ("flux", "ninth")]
    with pytest.raises(DancegrpoError, match="two trainer rows are named 'flux' \\(dancegrpo_npu.trainers.ninth"):
        registry.rows_of(twins)
    assert list(registry.rows_of(twins[:1])) == ["flux"]
