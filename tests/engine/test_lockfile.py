"""`dancegrpo-npu lock`: [files] from the work tree's git objects; --check for CI;
bad lock fields are one-line errors."""

from __future__ import annotations

import os

import pytest
from synthetic_upstream import refused, setup

from dancegrpo_npu.cli import main
from dancegrpo_npu.engine.lock import load_lock, sha256_bytes
from dancegrpo_npu.engine.lockfile import refresh_lock

TRAIN = "".join(f"line {i}\n" for i in range(1, 41))


def _series(s):
    return {
        "0001-train.patch": s.patch("train", {"fastvideo/train.py": TRAIN.replace("line 9\n", "line 9 npu\n")}),
        "0002-more.patch": s.patch("more", {"fastvideo/npu.py": "N = 1\n", "fastvideo/utils/old.py": None}),
    }


def test_refresh_records_touched_upstream_files_only(tmp_path):
    s = setup(tmp_path)
    s.set_series(_series(s), refresh_lock=False)
    old, new = refresh_lock(s.project)
    assert old == {}
    assert new == {
        "fastvideo/train.py": sha256_bytes(TRAIN.encode()),
        "fastvideo/utils/old.py": sha256_bytes(s.up.blob("fastvideo/utils/old.py")),
    }
    assert load_lock(s.project.lock_path).files == new
    assert load_lock(s.project.lock_path).commit == s.up.commit


def test_refresh_uses_git_objects_not_the_patched_files(tmp_path):
    s = setup(tmp_path, _series)
    s.apply()
    lock_before = s.project.lock_path.read_bytes()
    old, new = refresh_lock(s.project)
    assert old == new and s.project.lock_path.read_bytes() == lock_before
    assert new["fastvideo/train.py"] == sha256_bytes(TRAIN.encode())


def test_check_fails_when_stale(tmp_path, capsys):
    s = setup(tmp_path, _series)
    refresh_lock(s.project, check=True)
    s.set_series({**_series(s), "0003-readme.patch": s.patch("readme", {"README.md": "# x\n"})}, refresh_lock=False)
    before = s.project.lock_path.read_bytes()
    refused(refresh_lock, r"stale \(\+README.md\)", s.project, check=True)
    assert s.project.lock_path.read_bytes() == before
    root = os.fspath(s.project.root)
    assert main(["-C", root, "lock", "--check"]) == 1
    assert "run `dancegrpo-npu lock`" in capsys.readouterr().err
    assert main(["-C", root, "lock"]) == 0
    assert "+README.md" in capsys.readouterr().out
    assert main(["-C", root, "lock", "--check"]) == 0
    s.set_series({}, refresh_lock=False)
    assert main(["-C", root, "lock"]) == 0
    assert load_lock(s.project.lock_path).files == {}


@pytest.mark.parametrize(
    "text,field",
    [
        ("not toml [", "not valid TOML"),
        ('[upstream]\nurl = "x"\ncommit = "abc"\n', "upstream.commit must be a full 40-hex"),
        ('[upstream]\ncommit = "' + "a" * 40 + '"\n', "upstream.url is missing"),
        ('[upstream]\nurl = "x"\ncommit = "' + "a" * 40 + '"\n[files]\n"../x" = "' + "0" * 64 + '"\n', "files.'../x'"),
        ('[upstream]\nurl = "x"\ncommit = "' + "a" * 40 + '"\n[files]\n"x.py" = "nothex"\n', "must be a sha256"),
        ('[upstream]\nurl = "x"\ncommit = "' + "a" * 40 + '"\narchive_sha256 = "1"\n', "archive_sha256 must be 64"),
    ],
)
def test_bad_lock_fields_are_one_line_errors(tmp_path, capsys, text, field):
    s = setup(tmp_path, fetch=False)
    s.project.lock_path.write_text(text)
    for verb in ("fetch", "apply", "status", "verify", "lock"):
        assert main(["-C", os.fspath(s.project.root), verb]) == 1, verb
        err = capsys.readouterr().err
        assert field in err and err.count("\n") == 1 and "Traceback" not in err, (verb, err)
    assert not s.project.workdir.exists()
