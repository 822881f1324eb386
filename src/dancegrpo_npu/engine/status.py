"""``dancegrpo-npu status`` and ``dancegrpo-npu verify``.

status: the locked commit, each patch (applied / not applied / drifted), the overlay
(present / missing / modified), and every local edit, file by file; and a rebase in
progress, if any, with what to run (verify refuses while one swaps the series in).

A tree made by ``apply --without PATCH`` is meant to be the series less that patch:
status and verify say "series without PATCH" (verify passes when it is exactly that).

verify: exit 0 only when the work tree is exactly lock + series + overlay: at the
locked commit, every file the series and overlay decide byte-identical (and with the
same executable bit) to what they make of upstream, every other tracked file as
upstream has it, and no untracked file that git does not ignore.  It computes the
expected tree afresh (it does not trust applied.json).
"""

from __future__ import annotations

from dataclasses import dataclass

from dancegrpo_npu.engine.apply import check_head, overlay_sha256, upstream_from_git
from dancegrpo_npu.engine.edits import Edit, current_state, find_edits, state_of, target_states
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.vcs.gitutil import ls_tree, status_paths
from dancegrpo_npu.engine.lock import Lock, load_lock
from dancegrpo_npu.engine.lockfile import check_series_against_lock
from dancegrpo_npu.project import Project
from dancegrpo_npu.engine.rebase_state import describe_rebase
from dancegrpo_npu.engine.series import load_series, series_label, series_sha256, todo_warning
from dancegrpo_npu.engine.stage import build, read_overlay, touched_files
from dancegrpo_npu.engine.worktree import Fetched, display_path, load_applied, session, shorten


@dataclass(frozen=True)
class PatchState:
    name: str
    description: str
    state: str  # "applied" | "not applied" | "drifted"
    detail: str = ""


@dataclass(frozen=True)
class Report:
    lock: Lock
    fetched: Fetched
    problem: str | None  # why the tree cannot be exact at all (other commit, bad series)
    patches: tuple[PatchState, ...]
    dropped: tuple[str, ...]  # applied last time, no longer in the series
    overlay: str  # "present" | "missing" | "modified" | "none"
    overlay_detail: tuple[str, ...]
    edits: tuple[Edit, ...]  # differences from what the last apply wrote
    untracked: tuple[str, ...]
    differences: tuple[str, ...]  # differences from the exact tree, "path (how)"
    rebase: str | None = None  # the rebase in progress and what to run
    todo: str | None = None  # warning: patches whose Description: is still a TODO stub
    without: tuple[str, ...] = ()  # patches the tree was applied without (apply --without)
    # what the tree was compared with, digested as apply records them: a verified tree's identity,
    # read by whoever verified it (a smoke's inputs) without reading the series and overlay again
    series_sha256: str | None = None
    overlay_sha256: str | None = None

    @property
    def exact(self) -> bool:
        """The tree is exactly lock + series (without the patches ``without`` names) + overlay."""
        return self.problem is None and not self.differences

    @property
    def what(self) -> str:
        """What the tree is meant to be: "lock + series + overlay", or with "series without X"."""
        return f"lock + {series_label(self.without)} + overlay"


def inspect(project: Project, mid_swap_ok: bool = False) -> Report:
    """The state of the work tree; ``mid_swap_ok`` (status) reads a series that a rebase
    is swapping in, which verify refuses."""
    lock = load_lock(project.lock_path)
    with session(project.workdir, mid_swap_ok=mid_swap_ok) as (wt, fetched):
        patches = load_series(project.patches_dir)
        overlay = read_overlay(project.overlay_dir)
        applied = load_applied(wt)
        rebase = describe_rebase(wt.root)
        without = applied.without if applied else ()
        try:
            head = check_head(wt, fetched, lock)
        except DancegrpoError as e:
            states = tuple(PatchState(p.name, p.description, "not applied") for p in patches)
            return Report(lock, fetched, e.one_line(), states, (), "none" if not overlay else "?", (), (), (), (), rebase,
                          todo_warning(patches), series_sha256=series_sha256(patches),
                          overlay_sha256=overlay_sha256(overlay))
        tree = ls_tree(wt.root, head)
        problem = None
        try:
            check_series_against_lock(lock, patches, tree, wt.root)
            # the tree is meant to be the series less what apply --without left out; the
            # expected files are computed afresh all the same
            kept = _kept(patches, without)
            expected = build(upstream_from_git(wt.root, tree), kept, overlay, None, place=bool(without)).files
        except DancegrpoError as e:
            problem, expected = e.one_line(), {}
        git_status = status_paths(wt.root)  # one `git status` for the edits and the differences
        edits = find_edits(wt, applied, tree, set(), target_states(expected), git_status)
        edited = {e.path for e in edits if e.blocking}
        untracked = tuple(e.path for e in edits if not e.blocking)

        states = []
        applied_patches = dict(applied.patches) if applied else {}

        for p in patches:
            if p.name in without:
                states.append(PatchState(p.name, p.description, "left out", "apply --without; `apply` puts it back"))
            elif p.name not in applied_patches:
                states.append(PatchState(p.name, p.description, "not applied"))
            elif applied_patches[p.name] != p.sha256:
                states.append(PatchState(p.name, p.description, "drifted", "the patch changed since it was applied"))
            else:
                hit = sorted(set(touched_files(p)) & edited)
                if hit:
                    states.append(PatchState(p.name, p.description, "drifted", "edited since: " + ", ".join(hit)))
                else:
                    states.append(PatchState(p.name, p.description, "applied"))
        dropped = tuple(n for n in applied_patches if n not in {p.name for p in patches})

        ov_state, ov_detail = _overlay_state(wt.root, overlay)
        differences = [] if problem else _differences(wt.root, tree, expected, git_status)
        return Report(
            lock, fetched, problem, tuple(states), dropped, ov_state, ov_detail, tuple(edits), untracked,
            tuple(differences), rebase, todo_warning(patches), without,
            series_sha256=series_sha256(patches), overlay_sha256=overlay_sha256(overlay),
        )


def _kept(patches, without: tuple[str, ...]):
    """The series less the patches an ``apply --without`` left out (all still in it)."""
    gone = [n for n in without if n not in {p.name for p in patches}]
    if gone:
        raise DancegrpoError(
            f"the tree was applied without {', '.join(gone)}, which patches/series no longer has",
            "run `dancegrpo-npu apply` (with --without for what to leave out of the series as it is now)",
        )
    return [p for p in patches if p.name not in without]


def _overlay_state(root, overlay) -> tuple[str, tuple[str, ...]]:
    if not overlay:
        return "none", ()
    missing, modified = [], []
    for rel, fs in sorted(overlay.items()):
        full = root / rel
        if not full.is_file() or full.is_symlink():
            missing.append(rel)
        elif full.read_bytes() != fs.data or bool(full.stat().st_mode & 0o100) != fs.executable:
            modified.append(rel)
    if modified:
        return "modified", tuple(f"{r} (modified)" for r in modified) + tuple(f"{r} (missing)" for r in missing)
    if missing:
        return "missing", tuple(f"{r} (missing)" for r in missing)
    return "present", ()


def _differences(root, tree, expected, git_status: dict[str, str]) -> list[str]:
    """Every way the work tree differs from the exact tree ("path (how)")."""
    out = []
    for rel, fs in sorted(expected.items()):
        have = current_state(root, rel)
        if fs is None:
            if have is not None:
                out.append(f"{rel} (should be deleted)")
            continue
        want = state_of(fs)
        if have == want:
            continue
        entry = tree.get(rel)
        if have is None:
            out.append(f"{rel} (missing)")
        elif entry is not None and have == ("file", (entry.blob, entry.mode == "100755")):
            out.append(f"{rel} (not patched)")
        elif want[0] == "link":
            out.append(f"{rel} (should be a symlink to {fs.data.decode('utf-8', 'replace')})")
        elif have[0] == "link":
            out.append(f"{rel} (a symlink, should be a file)")
        elif have[0] == "file" and have[1][0] == want[1][0]:
            out.append(f"{rel} (mode differs: should be {'100755' if fs.executable else '100644'})")
        else:
            out.append(f"{rel} (differs)")
    for rel in sorted(git_status):
        if rel in expected:
            continue
        entry = tree.get(rel)
        have = current_state(root, rel)
        if entry is None:
            out.append(f"{rel} (untracked)")
        elif have is None:
            out.append(f"{rel} (deleted)")
        elif have != ("file", (entry.blob, entry.mode == "100755")) and have != ("link", entry.blob):
            out.append(f"{rel} (modified)")
    return out


DIFFERS_HINT = "`dancegrpo-npu status` shows details; `dancegrpo-npu apply` (with --force to save local edits) makes it exact"


class TreeDiffers(DancegrpoError):
    """The tree is not exactly what it is meant to be: files differ (apply puts them right), or
    untracked files that git does not ignore are in it (apply leaves those alone)."""


def untracked_hint(where: str) -> str:
    """What to do with untracked files: apply leaves them alone, so they go, or git ignores them."""
    return (f"move the untracked files out of the tree, or have git ignore them: add their paths to {where}/.git/info/exclude"
            " (the weights' folders docs/weights.md names are ignored already)")


def differences_hint(differences, where: str) -> str:
    untracked = [d for d in differences if d.endswith(" (untracked)")]
    if len(untracked) == len(differences):
        return untracked_hint(where)
    return DIFFERS_HINT + (f"; {untracked_hint(where)}" if untracked else "")


def verify_tree(project: Project) -> Report:
    """The tree's report when it is exactly lock + series + overlay; DancegrpoError otherwise
    (TreeDiffers when the tree is readable but differs, its hint what makes it exact).

    Launch and doctor call this before starting anything on the tree.
    """
    r = inspect(project)
    where = display_path(project.workdir)
    if r.problem:
        raise DancegrpoError(f"verify: {where}: {r.problem}")
    if r.differences:
        raise TreeDiffers(f"verify: {where} is not exactly {r.what}: {shorten(r.differences, 6)}",
                          differences_hint(r.differences, where))
    return r
