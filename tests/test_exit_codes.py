"""One rule for every verb's exit status (README, `dancegrpo-npu --help`):

0 done, or the check passed; 1 checked and failed, or refused by the state of the project
(a tree that is not exact, local edits, a patch that does not apply, a failed run);
2 could not check: the command line is wrong (usage, a value out of range, a name that names
nothing, options that do not go together, runs that cannot be compared).
"""

from __future__ import annotations

import pytest
from synthetic_upstream import setup

from dancegrpo_npu.cli import main


def _edited(s):
    (s.tree / "README.md").write_text("edited\n")


def _stale_lock(s):
    s.set_series({"0001-readme.patch": s.patch("readme", {"README.md": "# patched\n"})}, refresh_lock=False)


# (what is done to the applied synthetic project first, argv, status)
CASES = {
    "verify passes": (None, ["verify"], 0),
    "series lists": (None, ["series"], 0),
    "verify fails on an edit": (_edited, ["verify"], 1),
    "apply refuses local edits": (_edited, ["apply"], 1),
    "lock --check finds the lock stale": (_stale_lock, ["lock", "--check"], 1),
    "verify without a tree": (None, ["--workdir", "/nonexistent/tree", "verify"], 1),
    "usage: a verb's argument missing": (None, ["compare"], 2),
    "usage: no such verb": (None, ["frobnicate"], 2),
    "not a project (-C)": (None, ["-C", "/", "verify"], 2),
    "--without names no patch": (None, ["apply", "--without", "0099-nope"], 2),
    "export --context out of range": (_edited, ["export", "x", "--context", "99"], 2),
    "rebase --dry-run without --onto": (None, ["rebase", "--continue", "--dry-run"], 2),
    "compare: no such run": (None, ["compare", "nosuch-a", "nosuch-b"], 2),
    "smoke --steps 0": (None, ["smoke", "--steps", "0"], 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_verb_follows_the_exit_status_rule(tmp_path, capsys, case):
    before, argv, status = CASES[case]
    s = setup(tmp_path)
    s.apply()
    if before:
        before(s)
    rc = main(["-C", str(s.project.root), *argv] if argv[0] != "-C" else argv)
    err = capsys.readouterr().err
    assert rc == status, (case, err)
    assert (err == "") == (status == 0) and "Traceback" not in err
    if status:
        assert err.count("\n") == 1 and err.startswith("dancegrpo-npu: error: "), err


def test_the_rule_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Exit status: 0 done, or the check passed; 1 checked and failed" in out and "2 could not check" in out
