"""upstream.lock: parsing, every field checked and named, atomic writes."""

from pathlib import Path

import pytest

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.lock import Lock, dump_lock, load_lock, parse_lock, save_lock, sha256_bytes

C = "15cc71d53cc2e6e18a68ee607d5fb6ba9a99e344"
H = sha256_bytes(b"x")


def test_round_trip(tmp_path):
    lock = Lock(url="https://example.org/u.git", commit=C, files={"b/y.py": H, "a.py": H}, archive_sha256=H)
    save_lock(lock, tmp_path / "upstream.lock")
    again = load_lock(tmp_path / "upstream.lock")
    assert again == Lock(lock.url, C, {"a.py": H, "b/y.py": H}, H)
    assert list(again.files) == ["a.py", "b/y.py"]  # written sorted: stable diffs


def test_project_lock_parses():
    lock = load_lock(Path(__file__).resolve().parents[2] / "upstream.lock")
    assert lock.url == "https://github.com/XueZeyue/DanceGRPO"
    assert len(lock.commit) == 40


@pytest.mark.parametrize(
    "text, named",
    [
        ("[upstream\nurl='x'", "not valid TOML"),
        ("[files]\n", "no [upstream]"),
        (f"[upstream]\ncommit='{C}'\n", "upstream.url"),
        ("[upstream]\nurl='u'\ncommit='15cc71d'\n", "upstream.commit"),
        (f"[upstream]\nurl='u'\ncommit='{C.upper()}'\n", "upstream.commit"),
        (f"[upstream]\nurl='u'\ncommit='{C}'\narchive_sha256='abc'\n", "upstream.archive_sha256"),
        (f"[upstream]\nurl='u'\ncommit='{C}'\nbranch='main'\n", "unknown field"),
        (f"[upstream]\nurl='u'\ncommit='{C}'\n[files]\n'a.py'='nothex'\n", "files.'a.py'"),
        (f"[upstream]\nurl='u'\ncommit='{C}'\n[files]\n'../a.py'='{H}'\n", "files.'../a.py'"),
        (f"[upstream]\nurl='u'\ncommit='{C}'\n[files]\n'/etc/passwd'='{H}'\n", "files.'/etc/passwd'"),
        (f"[upstream]\nurl='u'\ncommit='{C}'\n[extra]\n", "unknown table"),
    ],
)
def test_bad_lock_names_the_field(text, named):
    with pytest.raises(DancegrpoError) as e:
        parse_lock(text, Path("upstream.lock"))
    assert named in e.value.message
    assert e.value.hint


def test_missing_lock(tmp_path):
    with pytest.raises(DancegrpoError, match="does not exist"):
        load_lock(tmp_path / "upstream.lock")


def test_save_refuses_unreadable_lock_and_keeps_old(tmp_path):
    path = tmp_path / "upstream.lock"
    good = Lock(url="u", commit=C)
    save_lock(good, path)
    before = path.read_bytes()
    with pytest.raises(DancegrpoError):
        save_lock(Lock(url="u", commit="nope"), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["upstream.lock"]  # no temp file left


def test_dump_is_stable():
    lock = Lock(url="u", commit=C, files={"z.py": H, "a.py": H})
    assert dump_lock(lock) == dump_lock(Lock(url="u", commit=C, files={"a.py": H, "z.py": H}))
