"""What a rebase tells and refuses: the real conflict lines of a hunk, a dry run that counts
the stops a rebase makes, a resolution that must compile and be free of markers, and the
smokes to run after merged patches."""

from __future__ import annotations

import re

import pytest

from dancegrpo_npu.engine.rebase_state import RebasePaths, load_state
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import find_project
from dancegrpo_npu.rebase.dry_run import dry_run
from dancegrpo_npu.rebase.session import continue_rebase, start_rebase
from rebase_helpers import History, PatchSpec, base_history, code_file, git, make_project, project_state, set_line
from test_rebase import DATE, OVERLAY, chain, conflicting_upstream, resolve, take_both, world  # noqa: F401 (world: a fixture)


def a_project(tmp_path, monkeypatch, specs, history=None):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", DATE)
    if history is None:
        history, base = base_history(tmp_path / "upstream")
    else:
        base = git(history.path, "rev-parse", "HEAD")
    return history, base, find_project(make_project(tmp_path / "project", history, base, specs, OVERLAY))


def region_spans(path) -> list[tuple[int, int]]:
    """The (first, last) line of each conflict region of a file, by its markers."""
    spans, start = [], None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("<<<<<<< "):
            start = n
        elif line.startswith(">>>>>>> "):
            spans.append((start, n))
    return spans


def test_a_hunk_is_placed_at_its_own_conflict_region(tmp_path, monkeypatch):
    """Two hunks add the same line, each conflicting in its own region: each hunk's report names
    its own region's lines, not the first region holding that line."""
    specs = [PatchSpec("0001-two.patch", "Set up twice",
                       {"fastvideo/train.py": chain(set_line(10, "common = setup()"), set_line(40, "common = setup()"))})]
    history, base, project = a_project(tmp_path, monkeypatch, specs)
    history.edit_line("fastvideo/train.py", 10, "train_value_10 = upstream(10)")
    history.edit_line("fastvideo/train.py", 40, "train_value_40 = upstream(40)")
    history.commit("upstream changes both lines")

    result = start_rebase(project, "main")

    assert result.status == "stopped"
    spans = region_spans(project.workdir.parent / "DanceGRPO.rebase" / "fastvideo/train.py")
    assert len(spans) == 2
    (a1, a2), (b1, b2) = spans
    assert re.search(rf"hunk 1/2 @@ -7,7 \+7,7 @@.*-- CONFLICT, lines {a1}-{a2}$", result.report, re.M), result.report
    assert re.search(rf"hunk 2/2 @@ -37,7 \+37,7 @@.*-- CONFLICT, lines {b1}-{b2}$", result.report, re.M), result.report


def test_the_dry_run_counts_the_stops_the_rebase_makes(tmp_path, monkeypatch):
    """A patch that builds on a conflicting one is not a second stop: after the first is
    resolved (keeping the patch), the second applies; the dry run says 1, as the rebase does."""
    specs = [
        PatchSpec("0001-npu.patch", "Use the NPU", {"fastvideo/train.py": set_line(40, "use_npu = True")}),
        PatchSpec("0002-detect.patch", "Detect it", {"fastvideo/train.py": set_line(40, "use_npu = detect()")}),
    ]
    history, base, project = a_project(tmp_path, monkeypatch, specs)
    conflicting_upstream(history)

    predicted = dry_run(project, "main")

    assert predicted.status == "stopped"
    assert predicted.message.startswith("a rebase onto main would stop at 1 of 2 patch(es) for you to resolve"), predicted.message
    assert re.search(r"0002-detect.patch\s+applied as is", predicted.report), predicted.report
    stops = 0
    result = start_rebase(project, "main")
    while result.status == "stopped":
        stops += 1
        keep_patch = re.compile(r"<<<<<<< .*?\n.*?=======\n(.*?)>>>>>>> [^\n]*\n", re.S)
        resolve(project, "fastvideo/train.py", lambda t: keep_patch.sub(r"\1", t))
        result = continue_rebase(project)
    assert stops == 1 and result.status == "done"


def stopped_state(project):
    return load_state(RebasePaths(project.workdir / ".git", project.workdir))


@pytest.mark.parametrize(
    "spoil, refusal",
    [
        # a marker left in the middle of a line (in a comment, so the file still compiles)
        (lambda t: t.replace("train_value_20 = compute('train', 20)\n",
                             "train_value_20 = compute('train', 20)  # >>>>>>> 0001-train-device.patch\n"),
         r"conflict markers are still in fastvideo/train.py:20; edit them away in "),
        # a resolution that is not Python any more
        (lambda t: t.replace("train_value_30 = compute('train', 30)\n", "def broken(:\n"),
         r"the resolution does not compile: fastvideo/train.py:30: .*; fix it in .*DanceGRPO.rebase"),
    ],
    ids=["marker-mid-line", "does-not-compile"],
)
def test_continue_refuses_a_resolution_with_a_marker_or_that_does_not_compile(world, spoil, refusal):  # noqa: F811
    history, base, project = world
    conflicting_upstream(history)
    assert start_rebase(project, "main").status == "stopped"
    resolve(project, "fastvideo/train.py", lambda t: spoil(take_both(t)))
    tree = project.workdir.parent / "DanceGRPO.rebase"
    before = (project_state(project.root), (tree / "fastvideo/train.py").read_bytes(),
              git(tree, "ls-files", "-s"), git(tree, "rev-parse", "HEAD"), stopped_state(project))

    with pytest.raises(DancegrpoError) as e:
        continue_rebase(project)

    text = e.value.one_line()
    assert re.search(refusal, text) and "\n" not in text, text
    assert before == (project_state(project.root), (tree / "fastvideo/train.py").read_bytes(),
                      git(tree, "ls-files", "-s"), git(tree, "rev-parse", "HEAD"), stopped_state(project))
    assert stopped_state(project).phase == "stopped"


def test_continue_takes_a_file_that_did_not_compile_before_the_resolution_either(world):  # noqa: F811
    """Upstream's file is not Python this interpreter compiles (a Python 2 line): the resolution
    did not break it, so it is no reason to refuse."""
    history, base, project = world
    history.insert_lines("fastvideo/train.py", 1, ["print 'legacy'"])
    conflicting_upstream(history)
    assert start_rebase(project, "main").status == "stopped"
    resolve(project, "fastvideo/train.py", take_both)
    assert continue_rebase(project).status == "done"


def trainer_history(path):
    """An upstream with two trainer scripts, one importing a shared module, and a third that does not."""
    h = History(path)
    h.write("README.md", "# upstream\n")
    h.write("fastvideo/__init__.py", "")
    h.write("fastvideo/utils/__init__.py", "")
    h.write("fastvideo/utils/common.py", code_file("common", 30))
    h.write("fastvideo/train_grpo_flux.py", "import fastvideo.utils.common\n" + code_file("flux", 30))
    h.write("fastvideo/train_grpo_wan_2_1.py", code_file("wan", 40))
    h.write("fastvideo/train_grpo_qwenimage.py", "from fastvideo import utils\n" + code_file("qwen", 30))
    h.commit("initial upstream")
    return h


def test_merged_patches_end_with_the_smoke_of_each_trainer_they_touch(tmp_path, monkeypatch):
    specs = [
        PatchSpec("0001-wan.patch", "Wan on the NPU", {"fastvideo/train_grpo_wan_2_1.py": set_line(20, "wan_npu = True")}),
        PatchSpec("0002-common.patch", "Shared helper", {"fastvideo/utils/common.py": set_line(10, "helper = None")}),
        PatchSpec("0003-readme.patch", "Docs", {"README.md": lambda old: old + "Ported.\n"}),
    ]
    history, base, project = a_project(tmp_path, monkeypatch, specs, trainer_history(tmp_path / "upstream"))
    history.write("NEWS", "nothing that touches a patch\n")
    history.commit("news")
    result = start_rebase(project, "main")  # every patch applies as is: nothing to smoke
    assert result.status == "done" and "smoke" not in result.report, result.report

    history.edit_line("fastvideo/train_grpo_wan_2_1.py", 23, "wan_value_23 = faster(23)")
    history.edit_line("fastvideo/utils/common.py", 13, "common_value_13 = faster(13)")
    history.commit("upstream edits next to both patches")
    result = start_rebase(project, "main")

    assert result.status == "done", result.report
    assert re.search(r"0001-wan.patch\s+3-way merged", result.report) and re.search(r"0002-common.patch\s+3-way merged", result.report)
    assert result.report.splitlines()[-1] == (
        "next: the merged or hand-resolved patches touch what these trainers run; smoke them: "
        "`dancegrpo-npu smoke --trainer flux`; `dancegrpo-npu smoke --trainer wan`"
    )


def test_a_hand_resolved_patch_gets_the_smoke_line_too(tmp_path, monkeypatch):
    specs = [PatchSpec("0001-wan.patch", "Wan on the NPU", {"fastvideo/train_grpo_wan_2_1.py": set_line(20, "wan_npu = True")})]
    history, base, project = a_project(tmp_path, monkeypatch, specs, trainer_history(tmp_path / "upstream"))
    history.edit_line("fastvideo/train_grpo_wan_2_1.py", 20, "wan_cuda = True")
    history.commit("upstream's own line 20")
    assert start_rebase(project, "main").status == "stopped"
    tree = project.workdir.parent / "DanceGRPO.rebase"
    path = tree / "fastvideo/train_grpo_wan_2_1.py"
    path.write_text(take_both(path.read_text()))

    result = continue_rebase(project)

    assert result.status == "done" and re.search(r"0001-wan.patch\s+resolved by hand", result.report)
    assert result.report.splitlines()[-1].endswith("smoke them: `dancegrpo-npu smoke --trainer wan`")
