"""fetch: the locked commit, verified, from git or a checked .tar.gz, never half-written."""

from __future__ import annotations

import io
import os
import tarfile

import pytest
from synthetic_upstream import add_commit, make_archive, make_project, make_upstream, refused, run_git, setup, snapshot

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.apply import apply_worktree
from dancegrpo_npu.engine.fetch import fetch
from dancegrpo_npu.engine.lock import Lock, load_lock, save_lock, sha256_file
from dancegrpo_npu.engine.status import inspect
from dancegrpo_npu.engine.worktree import WorkTree, load_fetched

TRAIN = "".join(f"line {i}\n" for i in range(1, 41))


def _series(s):
    return {"0001-train.patch": s.patch("train", {"fastvideo/train.py": TRAIN.replace("line 9\n", "line 9 npu\n")})}


def _nothing_left(project):
    parent = project.workdir.parent
    assert not project.workdir.exists()
    if parent.exists():  # no staging directory of a failed fetch beside it
        assert not [p for p in parent.iterdir() if ".fetch-" in p.name]


def test_fresh_fetch_from_git_directory(tmp_path):
    s = setup(tmp_path, _series, fetch=False)
    add_commit(s.up, {"later.txt": "after the locked commit\n"})  # HEAD of upstream moves on
    out = s.fetch()
    assert out.action == "fetched"
    head = run_git(s.tree, "rev-parse", "HEAD").decode().strip()
    assert head == s.up.commit == out.fetched.head == out.fetched.commit
    assert not (s.tree / "later.txt").exists()
    # full history, so rebase can work
    assert run_git(s.tree, "rev-list", "--count", "--all").decode().strip() == "2"
    assert (s.tree / "fastvideo/train.py").read_text() == TRAIN
    assert not (s.tree / "assets").exists(), "assets/ is left out by default"
    assert run_git(s.tree, "status", "--porcelain").decode() == ""
    assert load_fetched(WorkTree(s.tree)).kind == "git"


def test_lock_url_with_insteadof_mirror(tmp_path, monkeypatch):
    up = make_upstream(tmp_path / "mirror")
    project = make_project(tmp_path / "project", up)
    lock = load_lock(project.lock_path)
    save_lock(Lock("https://example.invalid/Upstream", lock.commit, {}), project.lock_path)
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text(f'[url "{up.path}"]\n\tinsteadOf = https://example.invalid/Upstream\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.fspath(gitconfig))
    monkeypatch.delenv("DANCEGRPO_SOURCE", raising=False)
    out = fetch(project)
    assert out.fetched.source == "https://example.invalid/Upstream"
    assert (project.workdir / "README.md").exists()


def test_source_from_environment(tmp_path, monkeypatch):
    s = setup(tmp_path, fetch=False)
    monkeypatch.setenv("DANCEGRPO_SOURCE", s.up.url())
    lock = load_lock(s.project.lock_path)
    save_lock(Lock("https://example.invalid/nowhere", lock.commit, {}), s.project.lock_path)
    assert fetch(s.project).fetched.source == os.fspath(s.up.path)


def test_with_assets_and_adding_them_later(tmp_path):
    s = setup(tmp_path, fetch=False)
    s.fetch(with_assets=True)
    assert (s.tree / "assets/prompts.txt").read_text() == "a cat\na dog\n"
    s2 = setup(tmp_path / "second")
    assert not (s2.tree / "assets").exists()
    assert s2.fetch(with_assets=True).action == "assets added"
    assert (s2.tree / "assets/prompts.txt").exists()
    assert load_fetched(WorkTree(s2.tree)).with_assets


def _assets_upstream_lacking_one(tmp_path):
    """Like the mirror here, which lacks assets/prompts.txt: one asset's blob is absent."""
    up = make_upstream(tmp_path / "up", files={"README.md": "x\n", "fastvideo/train.py": TRAIN,
                                                "assets/big.txt": "big\n" * 1000, "assets/video_prompts.txt": "a fox\n"})
    blob = run_git(up.path, "rev-parse", f"{up.commit}:assets/big.txt").decode().strip()
    os.unlink(up.path / ".git" / "objects" / blob[:2] / blob[2:])
    return up, make_project(tmp_path / "project", up)


def test_source_missing_an_assets_blob_fetches_the_rest_of_assets(tmp_path):
    up, project = _assets_upstream_lacking_one(tmp_path)
    out = fetch(project, source=up.url(), with_assets=True)
    assert out.action == "fetched" and out.left_out == ("assets/big.txt",) and out.fetched.with_assets
    assert (project.workdir / "assets/video_prompts.txt").read_text() == "a fox\n"
    assert not (project.workdir / "assets/big.txt").exists()
    assert inspect(project).exact, inspect(project).differences
    # the note's advice: upstream's copy put in by hand makes the tree whole, and it still verifies
    (project.workdir / "assets/big.txt").write_text("big\n" * 1000)
    assert inspect(project).exact, inspect(project).differences


def test_source_missing_an_assets_blob_when_adding_assets_later(tmp_path):
    up, project = _assets_upstream_lacking_one(tmp_path)
    fetch(project, source=up.url())
    assert (project.workdir / "README.md").exists() and not (project.workdir / "assets").exists()
    out = fetch(project, source=up.url(), with_assets=True)
    assert out.action == "assets added" and out.left_out == ("assets/big.txt",)
    assert (project.workdir / "assets/video_prompts.txt").exists() and not (project.workdir / "assets/big.txt").exists()
    assert load_fetched(WorkTree(project.workdir)).with_assets
    assert inspect(project).exact, inspect(project).differences


def test_fetch_cli_names_the_assets_the_source_lacks(tmp_path, capsys):
    from dancegrpo_npu.cli import main

    up, project = _assets_upstream_lacking_one(tmp_path)
    assert main(["-C", os.fspath(project.root), "fetch", "--source", up.url(), "--with-assets"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "without 1 file(s) the source lacks: assets/big.txt" in notes[0], notes
    assert f"show {up.commit[:12]}:assets/big.txt >" in notes[0], notes


def test_apply_force_with_an_edit_beside_a_left_out_asset(tmp_path):
    """An edit in assets/ makes git rebuild assets/' tree, whose left-out file has no blob here."""
    up, project = _assets_upstream_lacking_one(tmp_path)
    fetch(project, source=up.url(), with_assets=True)
    (project.workdir / "assets/video_prompts.txt").write_text("a wolf\n")
    out = apply_worktree(project, force=True)
    assert out.saved is not None and "+a wolf" in (out.saved / "local-edits.patch").read_text()
    assert (project.workdir / "assets/video_prompts.txt").read_text() == "a fox\n"
    assert inspect(project).exact, inspect(project).differences


def test_apply_force_on_a_left_out_asset_put_in_by_hand(tmp_path):
    """Upstream's copy is not in the clone: no diff of it can be made, and apply cannot write it
    back; the edit is saved as a copy and the file is left out again, as fetch left it."""
    up, project = _assets_upstream_lacking_one(tmp_path)
    fetch(project, source=up.url(), with_assets=True)
    (project.workdir / "assets/big.txt").write_text("not upstream's\n")
    run_git(project.workdir, "status")  # git writes the index: the file is no longer marked left out
    assert not inspect(project).exact
    out = apply_worktree(project, force=True)
    assert (out.saved / "files/assets/big.txt").read_text() == "not upstream's\n"
    assert "Not in this patch" in (out.saved / "local-edits.patch").read_text()
    assert not (project.workdir / "assets/big.txt").exists()
    assert run_git(project.workdir, "status", "--porcelain", "--", "assets").decode() == ""
    assert inspect(project).exact, inspect(project).differences
    assert apply_worktree(project).noop


def _drop_blob(up, rev: str, rel: str) -> None:
    """Remove ``rel``'s blob at ``rev`` from the synthetic upstream, as a mirror or a
    partial clone lacks large files (the mirror here lacks dancegrpo.pdf)."""
    blob = run_git(up.path, "rev-parse", f"{rev}:{rel}").decode().strip()
    os.unlink(up.path / ".git" / "objects" / blob[:2] / blob[2:])


def test_source_missing_a_blob_outside_assets_is_left_out(tmp_path):
    """A file the series does not touch whose blob the source lacks: git would check the
    commit out with an error and the file missing, and verify would report it deleted."""
    up = make_upstream(tmp_path / "up", files={"README.md": "x\n", "paper.pdf": "%PDF big\n" * 1000, "fastvideo/train.py": TRAIN})
    _drop_blob(up, up.commit, "paper.pdf")
    project = make_project(tmp_path / "project", up)
    out = fetch(project, source=up.url())
    assert out.left_out == ("paper.pdf",)
    assert not (project.workdir / "paper.pdf").exists() and (project.workdir / "README.md").exists()
    assert inspect(project).exact


def test_lock_moved_to_a_commit_whose_blob_the_source_lacks(tmp_path):
    """Like `rebase --onto 2149f36` here: the older commit has a file the mirror lacks."""
    up = make_upstream(tmp_path / "up", files={"README.md": "x\n", "paper.pdf": "%PDF big\n" * 1000, "fastvideo/train.py": TRAIN})
    old = up.commit
    up = add_commit(up, {"paper.pdf": None, "NEW.md": "new\n"})
    _drop_blob(up, old, "paper.pdf")
    s_project = make_project(tmp_path / "project", up, patches={})
    fetch(s_project, source=up.url())
    assert inspect(s_project).exact
    lock = load_lock(s_project.lock_path)
    save_lock(lock.with_commit(old, {}), s_project.lock_path)
    out = fetch(s_project, source=up.url())
    assert out.action == "moved" and out.left_out == ("paper.pdf",)
    assert run_git(s_project.workdir, "rev-parse", "HEAD").decode().strip() == old
    assert not (s_project.workdir / "NEW.md").exists() and not (s_project.workdir / "paper.pdf").exists()
    assert inspect(s_project).exact, inspect(s_project).differences


def test_lock_moved_with_an_untracked_file_in_the_way_is_refused(tmp_path):
    """An untracked file where the new commit has a file would be overwritten by the checkout."""
    s = setup(tmp_path, _series)
    s.apply()
    (s.tree / "NEW.md").write_text("my notes, untracked\n")
    new = add_commit(s.up, {"NEW.md": "upstream's new file\n"})
    lock = load_lock(s.project.lock_path)
    save_lock(lock.with_commit(new.commit, lock.files), s.project.lock_path)
    before = snapshot(s.tree)
    refused(s.fetch, r"local edits: NEW.md \(in the way\)")
    assert snapshot(s.tree) == before


def test_commit_not_in_source(tmp_path):
    up = make_upstream(tmp_path / "up")
    project = make_project(tmp_path / "project", up, commit="1" * 40, lock_files={})
    with pytest.raises(DancegrpoError, match="commit 1111111111111111111111111111111111111111 is not in"):
        fetch(project, source=up.url())
    _nothing_left(project)


def test_unreachable_source(tmp_path):
    up = make_upstream(tmp_path / "up")
    project = make_project(tmp_path / "project", up)
    with pytest.raises(DancegrpoError, match="cannot fetch upstream from file:///nonexistent"):
        fetch(project, source="file:///nonexistent/repo")
    _nothing_left(project)


def test_wrong_file_hash_nothing_written(tmp_path):
    up = make_upstream(tmp_path / "up")
    project = make_project(tmp_path / "project", up, lock_files={"README.md": "f" * 64})
    with pytest.raises(DancegrpoError, match="upstream file README.md has sha256") as refusal:
        fetch(project, source=up.url())
    # both hashes whole: cut short, two different ones can look the same
    actual = sha256_file(up.path / "README.md")
    assert f"has sha256 {actual}, upstream.lock records {'f' * 64}" in refusal.value.message
    _nothing_left(project)
    save_lock(Lock(up.url(), up.commit, {"nope.py": "f" * 64}), project.lock_path)
    with pytest.raises(DancegrpoError, match="records nope.py, which upstream"):
        fetch(project, source=up.url())
    _nothing_left(project)


def test_refetch_is_a_noop_and_keeps_the_applied_series(tmp_path):
    s = setup(tmp_path, _series, overlay={"fastvideo/npu_compat.py": "X = 1\n"})
    assert s.fetch().action == "up to date"
    s.apply()
    before = snapshot(s.tree)
    assert s.fetch().action == "up to date"
    assert snapshot(s.tree) == before
    assert inspect(s.project).exact


def test_workdir_that_is_not_ours_is_refused(tmp_path):
    s = setup(tmp_path, fetch=False)
    s.tree.mkdir(parents=True)
    (s.tree / "precious.txt").write_text("mine\n")
    with pytest.raises(DancegrpoError, match="not a work tree made by dancegrpo-npu fetch"):
        s.fetch()
    assert (s.tree / "precious.txt").read_text() == "mine\n"


def test_empty_workdir_and_custom_workdir(tmp_path):
    s = setup(tmp_path, fetch=False)
    s.tree.mkdir(parents=True)
    s.fetch()
    assert (s.tree / "README.md").exists()
    from dancegrpo_npu.project import find_project

    other = find_project(s.project.root, tmp_path / "elsewhere" / "tree")
    fetch(other, source=s.up.url())
    assert (tmp_path / "elsewhere" / "tree" / "README.md").exists()


def test_stale_staging_from_a_killed_fetch_is_cleaned(tmp_path):
    s = setup(tmp_path, fetch=False)
    stale = s.tree.parent / f".{s.tree.name}.fetch-dead"
    (stale / "half").mkdir(parents=True)
    s.fetch()
    assert not stale.exists()


def test_lock_moved_moves_a_clean_patched_tree(tmp_path):
    s = setup(tmp_path, _series, overlay={"fastvideo/npu/compat.py": "X = 1\n"})
    s.apply()
    (s.tree / "data").mkdir()
    (s.tree / "data" / "cache.bin").write_bytes(b"ignored run data")
    (s.tree / "notes.txt").write_text("untracked, not in the way\n")
    new = add_commit(s.up, {"fastvideo/train.py": TRAIN + "line 41\n", "NEW.md": "new\n"})
    lock = load_lock(s.project.lock_path)
    save_lock(lock.with_commit(new.commit, {}), s.project.lock_path)
    out = s.fetch()
    assert out.action == "moved"
    assert run_git(s.tree, "rev-parse", "HEAD").decode().strip() == new.commit
    assert (s.tree / "fastvideo/train.py").read_text() == TRAIN + "line 41\n"
    assert not (s.tree / "fastvideo/npu").exists(), "overlay files of the old apply are removed"
    assert (s.tree / "data" / "cache.bin").read_bytes() == b"ignored run data"
    assert (s.tree / "notes.txt").exists()
    assert not WorkTree(s.tree).applied_path.exists()
    s.set_series(_series(s))  # the patch still applies exactly at the new commit
    s.apply()
    (s.tree / "notes.txt").unlink()
    assert inspect(s.project).exact


def test_lock_moved_with_local_edits_is_refused(tmp_path):
    s = setup(tmp_path, _series)
    s.apply()
    with open(s.tree / "fastvideo/train.py", "a") as f:
        f.write("my edit\n")
    (s.tree / "LICENSE-NOT").write_text("untracked is fine\n")
    new = add_commit(s.up, {"NEW.md": "new\n"})
    lock = load_lock(s.project.lock_path)
    save_lock(lock.with_commit(new.commit, lock.files), s.project.lock_path)
    before = snapshot(s.tree)
    with pytest.raises(DancegrpoError, match=r"local edits: fastvideo/train.py \(modified\)"):
        s.fetch()
    assert snapshot(s.tree) == before


def test_head_moved_by_hand_is_refused(tmp_path):
    s = setup(tmp_path)
    add_commit(s.up, {"NEW.md": "new\n"})
    run_git(s.tree, "fetch", "-q", "origin")
    run_git(s.tree, "checkout", "-q", "origin/main")
    with pytest.raises(DancegrpoError, match="moved by hand"):
        s.fetch()


def test_tarball_source(tmp_path):
    up = make_upstream(tmp_path / "up")
    archive = make_archive(up, tmp_path / "DanceGRPO.tar.gz")
    project = make_project(tmp_path / "project", up, archive_sha256=sha256_file(archive))
    s_patch = setup(tmp_path / "helper", fetch=False)
    patches = {"0001-train.patch": s_patch.patch("train", {"fastvideo/train.py": TRAIN.replace("line 9\n", "line 9 npu\n")})}
    from synthetic_upstream import Setup

    s = Setup(tmp_path, up, project)
    s.set_series(patches)
    out = fetch(project, source=os.fspath(archive))
    f = out.fetched
    assert f.kind == "archive" and f.commit == up.commit and f.head != up.commit
    assert load_fetched(WorkTree(project.workdir)).commit == up.commit
    assert not (project.workdir / "assets").exists()
    assert (project.workdir / "fastvideo/train.py").read_text() == TRAIN
    assert os.access(project.workdir / "scripts/run.sh", os.X_OK)
    assert run_git(project.workdir, "status", "--porcelain").decode() == ""
    # fixed identity and date: the same archive gives the same commit
    again = make_project(tmp_path / "project2", up, archive_sha256=sha256_file(archive))
    assert fetch(again, source=os.fspath(archive)).fetched.head == f.head
    s.apply()
    assert inspect(project).exact
    assert fetch(project, source=os.fspath(archive)).action == "up to date"


def test_tarball_with_bad_sha_or_none_recorded(tmp_path):
    up = make_upstream(tmp_path / "up")
    archive = make_archive(up, tmp_path / "up.tar.gz")
    project = make_project(tmp_path / "project", up, archive_sha256="0" * 64)
    with pytest.raises(DancegrpoError, match="up.tar.gz has sha256") as refusal:
        fetch(project, source=os.fspath(archive))
    assert f"has sha256 {sha256_file(archive)}, upstream.lock's archive_sha256 is {'0' * 64}" in refusal.value.message
    _nothing_left(project)
    project = make_project(tmp_path / "project2", up)
    refused(fetch, f'add archive_sha256 = "{sha256_file(archive)}"', project, source=os.fspath(archive))
    _nothing_left(project)


def test_tarball_that_is_not_upstream_is_not_advised_into_the_lock(tmp_path):
    """A lock without archive_sha256 and a .tar.gz of something else (no commit id in it): its
    [files] show it is not upstream, and the advice is another archive, not a lock edit."""
    s = setup(tmp_path, _series, fetch=False)
    other = tmp_path / "other"
    (other / "fastvideo").mkdir(parents=True)
    (other / "fastvideo/train.py").write_text("print('not upstream')\n")
    (other / "README.md").write_text("# something else\n")
    archive = tmp_path / "other.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(other, arcname="other")
    text = refused(fetch, r"other.tar.gz is not upstream [0-9a-f]{12}: its fastvideo/train.py is not the file", s.project,
                   source=os.fspath(archive))
    assert "archive_sha256" not in text and "git archive" in text
    (other / "fastvideo/train.py").unlink()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(other, arcname="other")
    text = refused(fetch, r"is not upstream [0-9a-f]{12}: it has no fastvideo/train.py", s.project, source=os.fspath(archive))
    assert "archive_sha256" not in text
    _nothing_left(s.project)
    # upstream's own archive, unrecorded: the hash to record, and why it is believed
    archive = make_archive(s.up, tmp_path / "up.tar.gz")
    refused(fetch, f'holds the 1 file\\(s\\) the series patches .* add archive_sha256 = "{sha256_file(archive)}"',
            s.project, source=os.fspath(archive))


def test_tarball_of_another_commit(tmp_path):
    up = make_upstream(tmp_path / "up")
    first = up.commit
    up = add_commit(up, {"NEW.md": "x\n"})
    archive = make_archive(up, tmp_path / "up.tar.gz")  # git archive records the commit id
    project = make_project(tmp_path / "project", up, commit=first, archive_sha256=sha256_file(archive))
    with pytest.raises(DancegrpoError, match="is an archive of upstream"):
        fetch(project, source=os.fspath(archive))
    _nothing_left(project)


@pytest.mark.parametrize(
    "member,kind",
    [("top/../../evil.txt", "file"), ("/abs/evil.txt", "file"), ("top/link", "symlink-out"), ("top/dev", "fifo")],
)
def test_unsafe_tarball_is_refused(tmp_path, member, kind):
    up = make_upstream(tmp_path / "up")
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("top/README.md")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"hi\n"))
        info = tarfile.TarInfo(member)
        if kind == "symlink-out":
            info.type, info.linkname = tarfile.SYMTYPE, "../../outside"
        elif kind == "fifo":
            info.type = tarfile.FIFOTYPE
        else:
            info.size = 5
        tar.addfile(info, io.BytesIO(b"evil\n") if kind == "file" else None)
    project = make_project(tmp_path / "project", up, archive_sha256=sha256_file(archive))
    with pytest.raises(DancegrpoError, match="not a safe archive"):
        fetch(project, source=os.fspath(archive))
    _nothing_left(project)
    assert not (tmp_path / "evil.txt").exists()


def test_bad_source_path(tmp_path):
    up = make_upstream(tmp_path / "up")
    project = make_project(tmp_path / "project", up)
    (tmp_path / "plain").mkdir()
    with pytest.raises(DancegrpoError, match="neither a git repository nor a .tar.gz"):
        fetch(project, source=os.fspath(tmp_path / "plain"))
    with pytest.raises(DancegrpoError, match="does not exist"):
        fetch(project, source=os.fspath(tmp_path / "missing.tar.gz"))


def test_info_exclude_keeps_run_data_out(tmp_path):
    s = setup(tmp_path, _series)
    for rel in ("data/flux/model.bin", "images/flux_0_0.png", "reward.txt", "hps_ckpt/x.pt", "fastvideo/__pycache__/a.pyc"):
        (s.tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (s.tree / rel).write_bytes(b"x")
    s.apply()
    assert inspect(s.project).exact
    assert s.apply().noop
