"""export NAME: hand edits in the patched tree become patches/NAME.patch, one line appended to the
series; nothing is renamed (the order is the lines of patches/series)."""

from __future__ import annotations

import pytest

from dancegrpo_npu.engine.apply import apply_worktree
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.series import read_series_names
from dancegrpo_npu.rebase.export import export_edits, patch_file_name
from dancegrpo_npu.engine.lock import load_lock
from dancegrpo_npu.project import find_project
from dancegrpo_npu.rebase.session import start_rebase
from dancegrpo_npu.engine.status import inspect
from rebase_helpers import PatchSpec, base_history, make_project, project_state, run_cli, set_line, sha256_at, verified


SPECS = [
    PatchSpec("train.patch", "device", {"fastvideo/train.py": set_line(10, "device = pick()")}),
    PatchSpec("utils.patch", "utils", {"fastvideo/utils.py": set_line(5, "y = 2")}),
]


@pytest.fixture()
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    history, base = base_history(tmp_path / "upstream")
    root = make_project(tmp_path / "project", history, base, SPECS, {"fastvideo/ours.py": "OURS = 1\n"})
    return history, base, find_project(root)


def assert_tree_is_series(tmp_path, history, base, project):
    """`verify` passes, `status` shows every patch applied and no local edit, `apply` is a no-op."""
    assert verified(project.root)
    report = inspect(project)
    assert [p.state for p in report.patches] == ["applied"] * len(report.patches)
    assert not report.edits
    assert apply_worktree(project).noop
    assert not (project.workdir / ".git/dancegrpo-npu/saved").exists()  # export keeps no redundant copy


def test_modified_file_becomes_a_patch(world, tmp_path):
    history, base, project = world
    p = project.workdir / "fastvideo/train.py"
    p.write_text(p.read_text().replace("train_value_30 = compute('train', 30)", "train_value_30 = 30  # hccl fix"))
    lock_before = project.lock_path.read_bytes()

    result = export_edits(project, "fix hccl timeout")

    assert result.patch == project.patches_dir / "fix-hccl-timeout.patch"
    assert result.files == ("M fastvideo/train.py",)
    text = result.patch.read_text()
    assert text.startswith("Description: TODO: say in one line what this patch changes\n TODO: say why")
    assert "Forwarded: not-needed\n TODO: why upstream does not need it" in text  # the rule's reason, to write
    assert "Last-Update: 2026-01-01\n---\ndiff --git a/fastvideo/train.py b/fastvideo/train.py\n" in text
    assert "+train_value_30 = 30  # hccl fix" in text and "index " not in text
    assert "device = pick()" not in text.split("---\n", 1)[1].replace(" device = pick()", "")  # only the new edit
    assert project.series_path.read_text().splitlines()[-1] == "fix-hccl-timeout.patch"
    assert project.lock_path.read_bytes() == lock_before  # train.py was already locked
    assert_tree_is_series(tmp_path, history, base, project)


def test_new_and_deleted_files_and_lock_hashes(world, tmp_path):
    history, base, project = world
    (project.workdir / "fastvideo/npu_patch_helper.py").write_text("HELP = 1\n")
    (project.workdir / "fastvideo/models/flux.py").unlink()
    (project.workdir / "fastvideo/__pycache__").mkdir()
    (project.workdir / "fastvideo/__pycache__/train.cpython-311.pyc").write_bytes(b"\0junk")

    result = export_edits(project, "drop-flux", description="Drop the Flux model file, add a helper",
                          include=("fastvideo/npu_patch_helper.py",))

    assert sorted(result.files) == ["A fastvideo/npu_patch_helper.py", "D fastvideo/models/flux.py"]
    text = result.patch.read_text()
    assert text.startswith("Description: Drop the Flux model file, add a helper\n")
    assert "+++ /dev/null" in text and "--- /dev/null" in text and "pyc" not in text
    lock = load_lock(project.lock_path)
    assert lock.files["fastvideo/models/flux.py"] == sha256_at(history, base, "fastvideo/models/flux.py")
    assert "fastvideo/npu_patch_helper.py" not in lock.files
    assert_tree_is_series(tmp_path, history, base, project)


def test_nothing_to_export(world):
    history, base, project = world
    before = project_state(project.root)
    with pytest.raises(DancegrpoError) as e:
        export_edits(project, "nothing")
    assert "nothing to export" in e.value.one_line() and "edit files in the patched tree first" in e.value.one_line()
    assert project_state(project.root) == before


def test_overlay_edits_are_copied_back(world, tmp_path):
    history, base, project = world
    (project.workdir / "fastvideo/ours.py").write_text("OURS = 2\n")
    result = export_edits(project, "whatever")
    assert result.patch is None and result.overlay == ("fastvideo/ours.py",)
    assert (project.overlay_dir / "fastvideo/ours.py").read_text() == "OURS = 2\n"
    assert "whatever" not in project.series_path.read_text()
    assert_tree_is_series(tmp_path, history, base, project)


def test_exported_edits_survive_a_rebase(world):
    history, base, project = world
    p = project.workdir / "fastvideo/utils.py"
    p.write_text(p.read_text().replace("utils_value_30 = compute('utils', 30)", "utils_value_30 = 0"))
    history.insert_lines("fastvideo/utils.py", 1, ["# new upstream header"])
    history.commit("header")
    with pytest.raises(DancegrpoError, match="edits that are in no patch"):
        start_rebase(project, "main")
    export_edits(project, "utils-zero")
    result = start_rebase(project, "main")
    assert result.status == "done"
    assert "utils-zero.patch  applied, context moved" in result.report


def test_names():
    assert patch_file_name("Fix HCCL timeout!", ["a.patch", "b.patch"]) == "fix-hccl-timeout.patch"
    assert patch_file_name("x", []) == "x.patch"
    assert patch_file_name("my.patch", ["a.patch"]) == "my.patch"
    assert patch_file_name("0007-my.patch", ["a.patch"]) == "0007-my.patch"  # digits are part of the name
    with pytest.raises(DancegrpoError, match="already lists a.patch"):
        patch_file_name("a", ["a.patch"])
    with pytest.raises(DancegrpoError):
        patch_file_name("!!!", [])


def reorder(project, order):
    """Rewrite patches/series in ``order`` (its patches keep their files and names)."""
    text = project.series_path.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("#")] + ["# a comment kept"] + order
    project.series_path.write_text("\n".join(lines) + "\n")


def numbered_out_of_order(project):
    """The series as train.patch and utils.patch renamed 0002-train.patch and 0001-utils.patch,
    listed train first: names whose digits say nothing of the order."""
    for old, new in (("train.patch", "0002-train.patch"), ("utils.patch", "0001-utils.patch")):
        (project.patches_dir / old).rename(project.patches_dir / new)
    reorder(project, ["0002-train.patch", "0001-utils.patch"])
    apply_worktree(project)


def test_export_renames_nothing_in_a_series_whose_names_carry_numbers(world, tmp_path):
    history, base, project = world
    numbered_out_of_order(project)
    before = project_state(project.root)
    series = project.series_path.read_text()
    p = project.workdir / "fastvideo/train.py"
    p.write_text(p.read_text().replace("train_value_30 = compute('train', 30)", "train_value_30 = 30"))

    result = export_edits(project, "fix")

    assert result.patch == project.patches_dir / "fix.patch"
    after = project_state(project.root)
    assert set(after) - set(before) == {"patches/fix.patch"}
    unchanged = [k for k in before if k != "patches/series"]
    assert [after[k] for k in unchanged] == [before[k] for k in unchanged]  # the lock and every patch, byte for byte
    assert project.series_path.read_text() == series + "fix.patch\n"  # one line appended
    assert_tree_is_series(tmp_path, history, base, project)


def test_a_patch_inserted_in_the_middle_changes_one_line_of_series_and_adds_one_file(world, tmp_path):
    """Exported (appended), then its line moved up in patches/series: the series applies with it
    there, and the change is one line of series and one new file; no other patch is renamed or
    rewritten."""
    history, base, project = world
    before = project_state(project.root)
    series_before = project.series_path.read_text().splitlines()
    p = project.workdir / "fastvideo/utils.py"
    p.write_text(p.read_text().replace("utils_value_40 = compute('utils', 40)", "utils_value_40 = 40"))
    export_edits(project, "utils-forty")
    lines = project.series_path.read_text().splitlines()
    assert lines[-1] == "utils-forty.patch"
    lines.insert(lines.index("utils.patch"), lines.pop())  # before utils.patch, after train.patch
    project.series_path.write_text("\n".join(lines) + "\n")

    outcome = apply_worktree(project)

    assert outcome.patches == 3 and verified(project.root)
    series_after = project.series_path.read_text().splitlines()
    assert series_after == series_before[:series_before.index("utils.patch")] + ["utils-forty.patch"] + \
        series_before[series_before.index("utils.patch"):]
    after = project_state(project.root)
    assert set(after) - set(before) == {"patches/utils-forty.patch"}
    changed = {k for k in before if after[k] != before[k]}
    assert changed == {"patches/series"}, changed  # the lock too: utils.py was locked already


def test_a_rebase_renames_nothing(world):
    history, base, project = world
    numbered_out_of_order(project)
    history.edit_line("fastvideo/train.py", 30, "train_value_30 = 'moved upstream'")
    history.commit("upstream moves on")
    result = start_rebase(project, "main")
    assert result.status == "done", result.report
    assert read_series_names(project.series_path) == ["0002-train.patch", "0001-utils.patch"]
    assert sorted(p.name for p in project.patches_dir.glob("*.patch")) == ["0001-utils.patch", "0002-train.patch"]
    assert verified(project.root)


def test_cli_needs_a_name_and_has_no_renumbering(world):
    history, base, project = world
    r = run_cli(project.root, "export")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "NAME" in r.stderr
    r = run_cli(project.root, "export", "--renumber")
    assert r.returncode == 2 and "--renumber" in r.stderr


def test_refused_during_a_rebase(world):
    history, base, project = world
    history.edit_line("fastvideo/train.py", 10, "device = 'cuda'")
    history.commit("conflict")
    assert start_rebase(project, "main").status == "stopped"
    (project.workdir / "fastvideo/train.py").write_text("x\n")
    with pytest.raises(DancegrpoError, match="a rebase is in progress"):
        export_edits(project, "x")


def test_cli(world):
    history, base, project = world
    (project.workdir / "fastvideo/utils.py").write_text("changed\n")
    r = run_cli(project.root, "export", "rewrite-utils", env={"SOURCE_DATE_EPOCH": "1767225600"})
    assert r.returncode == 0, r.stderr
    assert "exported 1 file(s) to patches/rewrite-utils.patch" in r.stdout
    assert "edit the TODO lines" in r.stdout
    r = run_cli(project.root, "export", "again")
    assert r.returncode == 1 and "nothing to export" in r.stderr and "Traceback" not in r.stderr


def test_ignored_files_stay_out(world):
    history, base, project = world
    exclude = project.workdir / ".git" / "info" / "exclude"
    exclude.write_text(exclude.read_text() + "/outputs/\n")
    (project.workdir / "outputs").mkdir()
    (project.workdir / "outputs" / "model.bin").write_bytes(b"\0" * 64)
    with pytest.raises(DancegrpoError, match="nothing to export"):
        export_edits(project, "x")


def test_untracked_new_files_are_listed_and_left_out_unless_included(world, tmp_path):
    """A scratch file that neither upstream, the series nor the overlay has is not swept into
    the patch: it is listed, stays in the tree, and --include takes it."""
    history, base, project = world
    p = project.workdir / "fastvideo/train.py"
    p.write_text(p.read_text().replace("train_value_30 = compute('train', 30)", "train_value_30 = 30"))
    (project.workdir / "scratch.py").write_text("print('debugging')\n")
    (project.workdir / "notes").mkdir()
    (project.workdir / "notes" / "a.txt").write_text("a\n")

    result = export_edits(project, "fix")

    assert result.files == ("M fastvideo/train.py",)
    assert result.left_out == ("notes/a.txt", "scratch.py")
    text = result.patch.read_text()
    assert "scratch.py" not in text and "notes/a.txt" not in text
    assert (project.workdir / "scratch.py").read_text() == "print('debugging')\n"  # still there, untouched

    with pytest.raises(DancegrpoError) as e:
        export_edits(project, "nope", include=("nosuch.py",))
    assert "--include nosuch.py: the tree has no new file there" in e.value.one_line() and e.value.exit_code == 2

    result = export_edits(project, "helper", include=("notes",))
    assert result.files == ("A notes/a.txt",) and result.left_out == ("scratch.py",)


def test_only_untracked_files_is_nothing_to_export(world):
    history, base, project = world
    (project.workdir / "scratch.py").write_text("x = 1\n")
    with pytest.raises(DancegrpoError) as e:
        export_edits(project, "x")
    assert "only new files nothing owns: scratch.py; pass --include PATH" in e.value.one_line()


def test_cli_lists_what_it_left_out(world):
    history, base, project = world
    (project.workdir / "fastvideo/utils.py").write_text("changed\n")
    (project.workdir / "scratch.py").write_text("x = 1\n")
    r = run_cli(project.root, "export", "utils-rewrite", env={"SOURCE_DATE_EPOCH": "1767225600"})
    assert r.returncode == 0, r.stderr
    assert "exported 1 file(s)" in r.stdout and "  ? scratch.py" in r.stdout and "--include PATH" in r.stdout
