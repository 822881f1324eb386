"""The child-process build of the diffusers-0.35 fixtures (Wan2.1, Qwen-Image): it never replaces
a directory that is not its own, reports a failed build in one line and leaves nothing behind,
and reuses a directory whose stamp matches."""

from __future__ import annotations

import sys

import pytest

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.smoke.child_build import STAMP_NAME, build_in_child

# A builder that succeeds: ``python -m venv STAGING --without-pip`` writes a directory.
BUILDER = ("venv", ["--without-pip"])


def test_a_directory_that_is_not_fixtures_is_not_replaced(tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep")
    with pytest.raises(DancegrpoError) as e:
        build_in_child(dest, "want", sys.executable, *BUILDER, "Qwen-Image")
    assert f"{dest} exists and is not a Qwen-Image fixtures directory" in e.value.message
    assert (dest / "notes.txt").read_text() == "keep"


def test_a_failed_build_is_one_line_and_leaves_nothing(tmp_path):
    dest = tmp_path / "fixtures"
    with pytest.raises(DancegrpoError) as e:
        build_in_child(dest, "want", sys.executable, "dancegrpo_npu.no_such_builder", [], "Qwen-Image")
    assert e.value.message.startswith("building the Qwen-Image fixtures with ")
    assert "No module named dancegrpo_npu.no_such_builder" in e.value.message and "\n" not in e.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_current_stamp_is_reused_and_a_stale_one_rebuilt(tmp_path):
    dest = tmp_path / "fixtures"
    dest.mkdir()
    (dest / STAMP_NAME).write_text("want\n")
    assert build_in_child(dest, "want", sys.executable, "dancegrpo_npu.no_such_builder", [], "Wan") == dest
    with pytest.raises(DancegrpoError):  # stale, and this builder fails: the old one stays
        build_in_child(dest, "other", sys.executable, "dancegrpo_npu.no_such_builder", [], "Wan")
    assert (dest / STAMP_NAME).read_text() == "want\n"
    assert build_in_child(dest, "other", sys.executable, *BUILDER, "Wan") == dest  # stale: rebuilt, swapped in
    assert (dest / STAMP_NAME).read_text() == "other\n" and (dest / "pyvenv.cfg").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixtures"]  # no staging directory left
