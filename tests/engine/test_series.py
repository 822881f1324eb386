"""patches/series and DEP-3 headers."""

import pytest

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.series import format_header, load_series, parse_header, read_series_names, series_sha256, split_patch

DIFF = b"diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
HEADER = (
    "Description: Make x say b\n"
    " Upstream says a, which the NPU cannot run.\n"
    " .\n"
    " Second paragraph.\n"
    "Author: dancegrpo-npu\n"
    "Forwarded: not-needed\n"
    "Last-Update: 2026-11-30\n"
)


def write(tmp_path, names, patches):
    d = tmp_path / "patches"
    d.mkdir()
    (d / "series").write_text("# comment\n\n" + "".join(n + "\n" for n in names))
    for name, data in patches.items():
        (d / name).write_bytes(data)
    return d


def test_load_series_in_order(tmp_path):
    d = write(
        tmp_path,
        ["0002-b.patch", "0001-a.patch"],
        {"0001-a.patch": HEADER.encode() + b"---\n" + DIFF, "0002-b.patch": b"Description: b\n" + DIFF},
    )
    patches = load_series(d)
    assert [p.name for p in patches] == ["0002-b.patch", "0001-a.patch"]
    a = patches[1]
    assert a.description == "Make x say b"
    assert a.header["Description"].split("\n") == [
        "Make x say b",
        "Upstream says a, which the NPU cannot run.",
        "",
        "Second paragraph.",
    ]
    assert a.header["Forwarded"] == "not-needed"
    assert a.diff == DIFF
    assert patches[0].diff == DIFF


def test_series_hash_changes_with_content_and_order(tmp_path):
    d = write(tmp_path, ["a.patch", "b.patch"], {"a.patch": b"Description: a\n" + DIFF, "b.patch": b"Description: b\n" + DIFF})
    h1 = series_sha256(load_series(d))
    (d / "series").write_text("b.patch\na.patch\n")
    h2 = series_sha256(load_series(d))
    (d / "a.patch").write_bytes(b"Description: a2\n" + DIFF)
    h3 = series_sha256(load_series(d))
    assert len({h1, h2, h3}) == 3


def test_patch_without_description_is_refused(tmp_path):
    d = write(tmp_path, ["a.patch"], {"a.patch": b"Author: me\n" + DIFF})
    with pytest.raises(DancegrpoError, match="no DEP-3 'Description:'"):
        load_series(d)


def test_subject_alias_is_accepted():
    assert parse_header("Subject: fix it\n", "p")["Subject"] == "fix it"


def test_missing_patch_file(tmp_path):
    d = write(tmp_path, ["gone.patch"], {})
    with pytest.raises(DancegrpoError, match="gone.patch"):
        load_series(d)


@pytest.mark.parametrize(
    "line, named",
    [("../evil.patch", "not a plain patch file name"), ("a.patch -p1", "options"), ("series", "not a plain")],
)
def test_bad_series_lines(tmp_path, line, named):
    (tmp_path / "series").write_text(line + "\n")
    with pytest.raises(DancegrpoError, match=named):
        read_series_names(tmp_path / "series")


def test_duplicate_series_entry(tmp_path):
    (tmp_path / "series").write_text("a.patch\na.patch\n")
    with pytest.raises(DancegrpoError, match="twice"):
        read_series_names(tmp_path / "series")


def test_patch_without_diff():
    with pytest.raises(DancegrpoError, match="no unified diff"):
        split_patch(b"Description: nothing\n", "p")


def test_header_round_trip():
    fields = parse_header(HEADER, "p")
    assert parse_header(format_header(fields), "p") == fields


def test_unreadable_series_is_a_clear_error(tmp_path):
    (tmp_path / "series").write_bytes(b"\xff\xfe0001.patch\n")
    with pytest.raises(DancegrpoError, match="not UTF-8"):
        read_series_names(tmp_path / "series")
    (tmp_path / "dir").mkdir()
    with pytest.raises(DancegrpoError, match="cannot be read"):
        read_series_names(tmp_path / "dir")


def test_todo_description_is_flagged_not_refused(tmp_path, capsys):
    from dancegrpo_npu.cli import main
    from dancegrpo_npu.engine.series import todo_warning

    stub = "Description: TODO: say in one line what this patch changes\n TODO: say why\nAuthor: x\n---\n"
    d = write(tmp_path, ["0001-done.patch", "0002-stub.patch"], {"0001-done.patch": HEADER.encode() + DIFF, "0002-stub.patch": stub.encode() + DIFF})
    patches = load_series(d)  # loads: a TODO is no error
    assert [p.unfinished for p in patches] == [False, True]
    assert "0002-stub.patch" in todo_warning(patches) and "0001" not in todo_warning(patches)
    assert todo_warning(patches[:1]) is None
    (tmp_path / "upstream.lock").write_text('[upstream]\nurl = "x"\ncommit = "' + "a" * 40 + '"\n')
    assert main(["-C", str(tmp_path), "series"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].endswith("Make x say b")
    assert "0002-stub.patch" in lines[1] and lines[1].endswith("[TODO: write its Description:]")
    assert err.count("\n") == 1 and err.startswith("dancegrpo-npu: warning: 1 patch(es) still have a TODO Description: 0002-stub.patch")


def test_a_patch_is_named_by_its_file_name_without_patch():
    from dancegrpo_npu.engine.series import patch_stem

    assert patch_stem("batched-rollout.patch") == "batched-rollout"
    assert patch_stem("0018-some-fix.patch") == "0018-some-fix"  # digits are part of a name
    assert patch_stem("0007") == "0007"


def test_without_takes_a_patchs_name_or_its_file_name_and_nothing_else():
    from dancegrpo_npu.engine.series import Patch, select_without

    patches = [Patch(n, None, {}, "", b"") for n in
               ("flash-attn-optional.patch", "batched-rollout.patch", "0019-fix.patch", "fix.patch", "x", "x.patch")]
    for given in ("batched-rollout", "batched-rollout.patch"):
        kept, left_out = select_without(patches, [given])
        assert left_out == ("batched-rollout.patch",) and len(kept) == 5, given
    assert select_without(patches, ["fix"])[1] == ("fix.patch",)  # not 0019-fix.patch: its name has the digits
    assert select_without(patches, ["0019-fix"])[1] == ("0019-fix.patch",)
    assert select_without(patches, ["x"])[1] == ("x",) and select_without(patches, ["x.patch"])[1] == ("x.patch",)
    for given in ("rollout", "19", "2", "0019"):  # a position or a number is no name
        with pytest.raises(DancegrpoError) as refused:
            select_without(patches, [given])
        assert refused.value.exit_code == 2 and refused.value.one_line().count("\n") == 0
        assert f"--without {given}: no patch of patches/series" in refused.value.one_line()
