"""upstream-log: upstream commits between the lock and REF, marking those that hit the series."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import find_project
from dancegrpo_npu.rebase.upstream_log import format_log, upstream_log
from rebase_helpers import (SRC, PatchSpec, base_history, git, make_project, project_state, run_as_printed, run_cli,
                            set_line)


SPECS = [
    PatchSpec("0001-train.patch", "device", {"fastvideo/train.py": set_line(10, "device = pick()")}),
    PatchSpec("0002-both.patch", "train and utils", {"fastvideo/train.py": set_line(30, "x = 1"),
                                                      "fastvideo/utils.py": set_line(5, "y = 2")}),
]


@pytest.fixture()
def world(tmp_path):
    history, base = base_history(tmp_path / "upstream")
    root = make_project(tmp_path / "project", history, base, SPECS)
    return history, base, find_project(root)


def test_marks_commits_touching_patched_files(world):
    history, base, project = world
    history.write("README.md", "docs\n")
    c1 = history.commit("docs only")
    history.edit_line("fastvideo/train.py", 50, "changed = True")
    c2 = history.commit("train change")
    history.rename("fastvideo/utils.py", "fastvideo/common.py")
    c3 = history.commit("move utils")
    before = project_state(project.root)

    log = upstream_log(project)  # default: the remote's default branch (main)

    assert log.ref == "main" and log.new == c3 and log.old == base
    assert [c.commit for c in log.commits] == [c3, c2, c1]
    by_id = {c.commit: c for c in log.commits}
    assert not by_id[c1].touches_series
    assert by_id[c2].touches_series
    assert {f.path: f.patches for f in by_id[c2].files} == {"fastvideo/train.py": ("0001-train.patch", "0002-both.patch")}
    hit = [f for f in by_id[c3].files if f.patches]
    assert [(f.status, f.path, f.patches) for f in hit] == [("D", "fastvideo/utils.py", ("0002-both.patch",))]
    text = format_log(log)
    assert "3 new upstream commit(s); 2 touch files the series patches" in text
    assert "* " + c2[:10] in text and "  " + c1[:10] in text
    assert "M fastvideo/train.py  <- 0001-train.patch, 0002-both.patch" in text
    assert f"next: dancegrpo-npu rebase --onto main -C {project.root} --dry-run" in text  # run here, not in it
    only = format_log(log, touching_only=True)
    assert c1[:10] not in only and c2[:10] in only
    assert project_state(project.root) == before


def test_older_ref_lists_commits_not_in_it(tmp_path):
    history, a = base_history(tmp_path / "upstream")
    history.edit_line("fastvideo/utils.py", 5, "newer = 1")
    b = history.commit("newer utils")
    project = find_project(make_project(tmp_path / "project", history, b, SPECS))
    log = upstream_log(project, a)
    assert len(log.commits) == 1 and not log.commits[0].in_ref
    text = format_log(log)
    assert "0 new upstream commit(s), 1 commit(s) of the locked history not in" in text
    assert "[not in REF]" in text


def test_nothing_new(world):
    history, base, project = world
    assert "nothing to do" in format_log(upstream_log(project, "main"))


def test_unknown_ref(world):
    history, base, project = world
    with pytest.raises(DancegrpoError, match="cannot fetch 'nope' from .*; nothing was changed"):
        upstream_log(project, "nope")


def test_source_override_and_tag(world, tmp_path):
    history, base, project = world
    other = tmp_path / "mirror"
    git(tmp_path, "clone", "-q", "--bare", str(history.path), str(other))
    history.commit("later")
    git(history.path, "tag", "v1")
    git(other, "fetch", "-q", str(history.path), "refs/tags/v1:refs/tags/v1")
    log = upstream_log(project, "v1", source=str(other))
    assert len(log.commits) == 1 and f"fetched from {other}" in log.note


def test_cli(world):
    history, base, project = world
    history.edit_line("fastvideo/train.py", 50, "changed = True")
    history.commit("train change")
    r = run_cli(project.root, "upstream-log")
    assert r.returncode == 0, r.stderr
    assert "1 touch files the series patches" in r.stdout
    r = run_cli(project.root, "upstream-log", "--touching", "main")
    assert r.returncode == 0 and "train change" in r.stdout
    r = run_cli(project.root, "upstream-log", "-x")
    assert r.returncode == 2


def a_fork(tmp_path, history):
    """Another repository: upstream's history plus a commit of its own."""
    fork = tmp_path / "fork"
    git(tmp_path, "clone", "-q", str(history.path), str(fork))
    (fork / "fastvideo/train.py").write_text((fork / "fastvideo/train.py").read_text() + "fork = True\n")
    git(fork, "commit", "-qam", "fork: its own train change")
    return fork, git(fork, "rev-parse", "HEAD")


def test_the_printed_next_command_reaches_the_same_commits(world, tmp_path):
    history, base, project = world
    fork, fork_head = a_fork(tmp_path, history)
    source = f"file://{fork}"
    for cwd in (project.root, tmp_path):  # in the project, and from elsewhere with -C
        r = run_cli(project.root, "upstream-log", "--source", source, "main")
        r = subprocess.run(r.args, capture_output=True, text=True, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(SRC)))
        assert r.returncode == 0, r.stderr
        assert f"-> {fork_head[:12]} (main: fetched from {source})" in r.stdout
        command = r.stdout.splitlines()[-1].removeprefix("next: ")

        dry = run_as_printed(command, cwd)

        assert dry.returncode == 0, (command, dry.stdout, dry.stderr)
        assert re.search(rf"-> {fork_head[:12]} \(main: fetched from {re.escape(source)}\)", dry.stdout), dry.stdout


@pytest.mark.parametrize("ref", ["main", "elsewhere"])
def test_a_failed_source_fetch_refuses_as_the_rebase_does(world, tmp_path, ref):
    history, base, project = world
    history.edit_line("fastvideo/utils.py", 5, "utils_value_5 = 5")
    other = history.commit("upstream moves on")
    git(project.workdir, "fetch", "-q", "origin")
    git(project.workdir, "branch", "-f", "elsewhere", other)
    nowhere = str(tmp_path / "no-such-repository")

    r = run_cli(project.root, "upstream-log", "--source", nowhere, ref)

    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    assert f"cannot fetch '{ref}' from {nowhere}" in r.stderr


def test_a_short_id_is_used_only_where_the_source_holds_it(world, tmp_path):
    """The fork's commit is in the work tree's repository already (fetched once); a short id of
    it with a remote --source is still refused, as that source cannot be asked for it."""
    history, base, project = world
    fork, fork_head = a_fork(tmp_path, history)
    git(project.workdir, "fetch", "-q", str(fork), "main")
    source = f"file://{tmp_path / 'upstream'}"
    for args in (["upstream-log", "--source", source, fork_head[:10]],
                 ["rebase", "--onto", fork_head[:10], "--source", source],
                 ["rebase", "--onto", fork_head[:10], "--source", source, "--dry-run"]):
        r = run_cli(project.root, *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (args, r.stdout, r.stderr)
        assert f"'{fork_head[:10]}' is a short commit id, which cannot be fetched from {source}" in r.stderr
    log = upstream_log(project, fork_head[:10], str(fork))  # a local repository that holds it
    assert log.new == fork_head
