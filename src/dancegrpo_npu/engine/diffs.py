"""Unified diffs, read strictly: which files a patch changes, with which hunks, and
whether the hunks apply to a file *exactly* (no fuzz, no offset).

This is the engine's own reading of a patch, mode lines included (a new executable,
a mode change, a new symlink: git's extended headers).  patch-ng, the one applier, writes
the files (see ``stage.py``), but it strips ``../`` and absolute prefixes, follows symlinks,
compares lines without their endings, takes an already patched file as done, ignores modes
and drops "\\ No newline at end of file", so every path (``treepaths``) and every hunk
(``check_hunks``) is checked before it runs, and what it wrote after (``check_result``).

Lines are split on LF only and kept with their endings, so a CRLF file and a CRLF
patch match byte for byte, and a patch whose line endings differ from its target's
is refused with a message saying so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from dancegrpo_npu.engine.treepaths import check_patch_path
from dancegrpo_npu.errors import DancegrpoError

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


def misfit_hint(patch: str) -> str:
    """What to do about a patch that does not fit the locked commit.  Not ``rebase``: it moves a
    series that fits the lock onto another commit (``fetch`` refuses a lock whose commit was
    changed by hand to one the series does not fit, with that advice); here the patch itself
    is off (edited, or written against another base or order)."""
    return (
        f"the patch does not fit upstream.lock's commit exactly (no fuzz is allowed): fix its hunk in patches/{patch}, "
        f"or remake it: take it out of patches/series, run `dancegrpo-npu apply`, redo its change in the tree and "
        f"save it with `dancegrpo-npu export NAME`"
    )


def _already_applied_hint(done: str) -> str:
    return f"drop the patch from patches/series ({done}), then run `dancegrpo-npu apply`"


_UNSUPPORTED = {
    b"GIT binary patch": "a git binary patch",
    b"Binary files ": "a binary change",
    b"rename from ": "a rename",
    b"copy from ": "a copy",
}
# git's file modes, as its extended header lines write them
REGULAR, EXECUTABLE, SYMLINK = 0o100644, 0o100755, 0o120000
_MODE_LINE = re.compile(rb"^(old mode|new mode|new file mode|deleted file mode) ([0-7]+)\r?$")


@dataclass(frozen=True)
class Hunk:
    number: int  # 1-based, within its file
    header: str  # the @@ line as written
    src_start: int
    src_len: int
    tgt_start: int
    tgt_len: int
    old: tuple[bytes, ...]  # the lines it expects, with their endings as in the file
    new: tuple[bytes, ...]  # the lines it leaves
    body: tuple[bytes, ...] = ()  # its lines after the @@ line, as the patch writes them

    @property
    def label(self) -> str:
        return _label(self.number, self.header)


@dataclass(frozen=True)
class FileChange:
    """One file's part of a patch: modify (both paths), create (old None), delete (new None).

    Modes are git's (``REGULAR``, ``EXECUTABLE``, ``SYMLINK``), from the extended header
    lines of a git patch: ``new file mode`` and ``deleted file mode`` of a created or
    deleted file, ``old mode``/``new mode`` of a modified one (None: not stated, the file
    keeps its mode).  A created symlink's one hunk line is its target."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]
    new_mode: int | None = None  # the mode it leaves (a created file's, or a mode change's)
    no_newline: bool = False  # the patch marks a missing final newline
    old_mode: int | None = None  # the mode it expects (a deleted file's, or a mode change's)
    header: tuple[bytes, ...] = ()  # its lines before the first hunk, as the patch writes them

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    @property
    def kind(self) -> str:
        return "create" if self.old_path is None else "delete" if self.new_path is None else "modify"

    @property
    def is_link(self) -> bool:
        return self.new_mode == SYMLINK


def mode_name(mode: int | None) -> str:
    return {REGULAR: "100644 (a regular file)", EXECUTABLE: "100755 (an executable)", SYMLINK: "120000 (a symlink)"}.get(
        mode, f"{mode:o}" if mode is not None else "none"
    )


def split_lines(data: bytes) -> list[bytes]:
    """Lines split on LF only, each keeping its ending (the last may have none)."""
    lines = data.split(b"\n")
    out = [ln + b"\n" for ln in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _fail(patch: str, what: str, hint: str = "regenerate the patch with `git diff` or `dancegrpo-npu export`") -> DancegrpoError:
    return DancegrpoError(f"patch {patch}: {what}", hint)


def _name(raw: bytes, patch: str, lineno: int) -> str | None:
    """A file name from a ---/+++ line (date and trailing tab cut); None for /dev/null."""
    name = raw.split(b"\t", 1)[0].rstrip(b"\r\n")
    if name.startswith(b'"'):
        raise _fail(patch, f"diff line {lineno}: quoted file name {name.decode('utf-8', 'replace')} (special characters in paths are not supported)")
    if name == b"/dev/null":
        return None
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(patch, f"diff line {lineno}: file name is not UTF-8") from None


def parse_diff(diff: bytes, patch: str) -> list[FileChange]:
    """Every file change of a unified diff, with hunks and modes, paths checked (syntactically)."""
    lines = split_lines(diff)
    changes: list[FileChange] = []
    seen: set[str] = set()
    i, section, modes = 0, None, {}  # section: the open "diff --git" line, whose change is still to come
    start = 0  # where the open file's header lines begin

    def add(change: FileChange, end: int) -> None:
        if change.path in seen:
            raise _fail(patch, f"changes {change.path} twice", "merge the two parts into one diff of the file")
        seen.add(change.path)
        changes.append(_checked_modes(replace(change, header=tuple(lines[start:end])), patch))

    while i < len(lines):
        line = lines[i]
        if line.startswith(b"diff --git "):
            if section is not None:
                add(_headers_only(section, modes, patch), i)
            section, modes, start = line.rstrip(b"\r\n"), {}, i
            i += 1
            continue
        for marker, what in _UNSUPPORTED.items():
            if line.startswith(marker) and (section is not None or marker == b"Binary files "):
                raise _fail(patch, f"diff line {i + 1}: {what} is not supported", "put binary or renamed files in overlay/, and keep patches to text hunks")
        m = _MODE_LINE.match(line) if section is not None else None
        if m:
            modes[m.group(1).decode()] = int(m.group(2), 8)
        if line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
            git_style = section is not None
            if not git_style:
                start = i
            old = _name(line[4:], patch, i + 1)
            new = _name(lines[i + 1][4:], patch, i + 2)
            if old is None and new is None:
                raise _fail(patch, f"diff line {i + 1}: both sides are /dev/null")
            # a plain diff with git's a/ and b/ names (git's output without its header lines, or
            # `diff -ruN a b`) is read as git's, as patch-ng reads it: not as paths under a/ and b/
            prefixed = git_style or dvcs_names(old, new)
            old = check_patch_path(old, patch, "a/" if prefixed else "") if old is not None else None
            new = check_patch_path(new, patch, "b/" if prefixed else "") if new is not None else None
            if old is not None and new is not None and old != new:
                raise _fail(patch, f"diff line {i + 1}: {old} is renamed to {new}; renames are not supported", "regenerate with `git diff --no-renames`")
            end = i + 2
            i, hunks, no_newline = _parse_hunks(lines, end, patch, new or old)
            if not hunks:
                raise _fail(patch, f"{new or old} has no hunks")
            add(_change(old, new, tuple(hunks), modes, no_newline, patch), end)
            section, modes = None, {}
            continue
        if line.startswith(b"@@ "):
            raise _fail(patch, f"diff line {i + 1}: a hunk without ---/+++ file names before it")
        i += 1
    if section is not None:
        add(_headers_only(section, modes, patch), i)
    if not changes:
        raise _fail(patch, "contains no file changes (an empty file?)", "add the diff, or drop the patch from patches/series")
    return changes


def dvcs_names(old: str | None, new: str | None) -> bool:
    """Whether a diff's two names (None: /dev/null) are git's ``a/P`` and ``b/P``, the rule
    patch-ng reads a plain diff's names by."""
    return (old is None or old.startswith("a/")) and (new is None or new.startswith("b/"))


def _change(old: str | None, new: str | None, hunks: tuple, modes: dict, no_newline: bool, patch: str) -> FileChange:
    """A change from its paths and its extended header lines (``modes``: line kind -> mode)."""
    if old is None:
        return FileChange(None, new, hunks, modes.get("new file mode", REGULAR), no_newline)
    if new is None:
        return FileChange(old, None, hunks, None, no_newline, modes.get("deleted file mode"))
    return FileChange(old, new, hunks, modes.get("new mode"), no_newline, modes.get("old mode"))


def _headers_only(section: bytes, modes: dict, patch: str) -> FileChange:
    """A git section without ---/+++ lines: a mode change, an empty new file, or the
    deletion of an empty file (git writes no hunk for these)."""
    path = _section_path(section, patch)
    if "old mode" in modes or "new mode" in modes:
        if "old mode" not in modes or "new mode" not in modes:
            raise _fail(patch, f"'{section.decode('utf-8', 'replace')}' has an 'old mode' or a 'new mode' line without the other")
        return _change(path, path, (), modes, False, patch)
    if "new file mode" in modes:
        return _change(None, path, (), modes, False, patch)
    if "deleted file mode" in modes:
        return _change(path, None, (), modes, False, patch)
    raise _no_hunks(patch, section.decode("utf-8", "replace"))


def _section_path(section: bytes, patch: str) -> str:
    """The path of a ``diff --git a/P b/P`` line (the same P on both sides: no renames)."""
    rest = section[len(b"diff --git "):].decode("utf-8", "replace")
    half = (len(rest) - 1) // 2
    a, b = rest[:half], rest[half + 1:]
    if rest[half:half + 1] != " " or not a.startswith("a/") or not b.startswith("b/") or a[2:] != b[2:]:
        raise _fail(patch, f"cannot read the file name of '{section.decode('utf-8', 'replace')}' (a rename, or a quoted name?)")
    return check_patch_path(a, patch, "a/")


def _checked_modes(change: FileChange, patch: str) -> FileChange:
    """Modes the engine can reproduce: regular files, executables, and new symlinks."""
    path = change.path
    for mode in (change.old_mode, change.new_mode):
        if mode is not None and mode not in (REGULAR, EXECUTABLE, SYMLINK):
            raise _fail(patch, f"{path}: file mode {mode:o} is not supported (only 100644, 100755 and new 120000 symlinks)")
    if change.kind == "modify" and SYMLINK in (change.old_mode, change.new_mode):
        raise _fail(patch, f"{path}: turns a file into a symlink or back; not supported", "patches may add new symlinks, not change existing ones")
    if change.kind == "delete" and change.old_mode == SYMLINK:
        raise _fail(patch, f"deletes the symlink {path}; not supported", "patches may add new symlinks, not change existing ones")
    if change.kind == "modify" and change.old_mode is not None and change.old_mode == change.new_mode:
        raise _fail(patch, f"{path}: its 'old mode' and 'new mode' are the same")
    if change.is_link:
        new = change.hunks[0].new if len(change.hunks) == 1 else ()
        if len(new) != 1 or not change.no_newline or not new[0] or b"\0" in new[0]:
            raise _fail(patch, f"creates the symlink {path}, but its hunk is not one target line without a final newline", "regenerate the patch with `git diff`")
    return change


def _no_hunks(patch: str, section: str) -> DancegrpoError:
    return _fail(patch, f"'{section}' has no hunks and no mode line", "regenerate the patch with `git diff`")


def _parse_hunks(lines: list[bytes], i: int, patch: str, path: str) -> tuple[int, list[Hunk], bool]:
    hunks: list[Hunk] = []
    no_newline = False
    while i < len(lines):
        m = _HUNK.match(lines[i].rstrip(b"\r\n"))
        if not m:
            break
        header = lines[i].rstrip(b"\r\n").decode("utf-8", "replace")
        src_start, tgt_start = int(m.group(1)), int(m.group(3))
        src_len = int(m.group(2)) if m.group(2) is not None else 1
        tgt_len = int(m.group(4)) if m.group(4) is not None else 1
        number = len(hunks) + 1
        first = i + 1
        old: list[bytes] = []
        new: list[bytes] = []
        last: str | None = None
        i += 1
        while i < len(lines) and (len(old) < src_len or len(new) < tgt_len or lines[i].startswith(b"\\")):
            body = lines[i]
            if body.startswith(b"\\"):
                if last is None:
                    raise _fail(patch, f"{path} {_label(number, header)}: a '\\' line with no line before it")
                for side, name in ((old, "-"), (new, "+")):
                    if last in (" ", name) and side and side[-1].endswith(b"\n"):
                        side[-1] = side[-1][:-1]
                no_newline = True
            elif body in (b"\n", b"\r\n") or body[:1] == b" ":
                text = body[1:] if body[:1] == b" " else body
                old.append(text)
                new.append(text)
                last = " "
            elif body[:1] in (b"-", b"+"):
                (old if body[:1] == b"-" else new).append(body[1:])
                last = body[:1].decode()
            else:
                break
            i += 1
        if len(old) != src_len or len(new) != tgt_len:
            raise _fail(patch, f"{path} {_label(number, header)} is malformed: it has {len(old)} old and {len(new)} new lines, its header says {src_len} and {tgt_len}")
        hunks.append(Hunk(number, header, src_start, src_len, tgt_start, tgt_len, tuple(old), tuple(new), tuple(lines[first:i])))
    return i, hunks, no_newline


def _label(number: int, header: str) -> str:
    return f"hunk #{number} ({header})"


def _describe(expected: bytes, actual: bytes | None, lineno: int, path: str) -> str:
    if actual is None:
        return f"{path} ends before line {lineno}"
    if expected.replace(b"\r\n", b"\n") == actual.replace(b"\r\n", b"\n"):
        theirs = "CRLF" if actual.endswith(b"\r\n") else "LF"
        ours = "CRLF" if expected.endswith(b"\r\n") else "LF"
        return f"line endings differ at line {lineno}: {path} has {theirs}, the patch {ours} (a patch must keep the file's line endings)"
    if expected.rstrip(b"\r\n") == actual.rstrip(b"\r\n"):
        return f"line {lineno} of {path} differs in its final newline"

    def show(b: bytes) -> str:
        s = b.rstrip(b"\r\n").decode("utf-8", "replace")
        return repr(s if len(s) <= 60 else s[:57] + "...")

    return f"line {lineno} of {path} is {show(actual)}, the patch expects {show(expected)}"


def _mismatch(lines: list[bytes], start: int, expected: tuple[bytes, ...], path: str) -> str | None:
    """Why ``expected`` is not at index ``start`` of ``lines`` (None when it is)."""
    for k, want in enumerate(expected):
        have = lines[start + k] if start + k < len(lines) else None
        if have != want:
            return _describe(want, have, start + k + 1, path)
    return None


def _start(hunk: Hunk, src: bool) -> int:
    start, length = (hunk.src_start, hunk.src_len) if src else (hunk.tgt_start, hunk.tgt_len)
    return start if length == 0 else start - 1


def place_hunks(content: bytes, change: FileChange) -> tuple[FileChange, tuple[tuple[Hunk, int], ...]]:
    """``change`` with each hunk moved to where its lines are in ``content``: at its stated
    line if they are there, else at the nearest line where all of them are (each hunk
    after the one before it, carrying that one's offset, as ``git apply`` places hunks;
    never fuzz: the context must match in full).  For a tree the series makes without
    some of its patches (``apply --without``): what a left-out patch added above a later
    hunk moves it.  Returns the placed change and the (hunk, offset) of each moved hunk;
    a hunk found nowhere stays, and ``check_hunks`` says why it does not apply."""
    lines = split_lines(content)
    placed: list[Hunk] = []
    moved: list[tuple[Hunk, int]] = []
    pos, delta = 0, 0
    for h in change.hunks:
        stated = _start(h, src=True)
        where = _nearest(lines, h.old, stated + delta, pos) if h.old else None
        if where is None or where == stated:
            placed.append(h)
            pos = stated + len(h.old)
            continue
        offset = where - stated
        delta = offset
        placed.append(replace(h, src_start=h.src_start + offset, tgt_start=h.tgt_start + offset))
        moved.append((h, offset))
        pos = where + len(h.old)
    return replace(change, hunks=tuple(placed)), tuple(moved)


def _nearest(lines: list[bytes], old: tuple[bytes, ...], want: int, lowest: int) -> int | None:
    """The index nearest to ``want`` (not below ``lowest``) where ``old`` is in ``lines``."""
    n = len(old)
    for k in range(len(lines) + 1):
        for start in ((want + k, want - k) if k else (want,)):
            if lowest <= start <= len(lines) - n and tuple(lines[start:start + n]) == old:
                return start
    return None


def check_hunks(content: bytes | None, change: FileChange, patch: str) -> None:
    """Refuse, naming the patch, file and hunk, a ``change`` that does not apply *exactly* to
    ``content`` (None: absent): every hunk's lines at its stated line, byte for byte with their
    endings, in order, a deletion covering the whole file, a creation of a path that is not
    there; "already applied" is said as such.  patch-ng compares lines without their endings,
    treats an already patched file as done and deletes without looking: this is what it
    does not check.  The content itself is patch-ng's to write (``stage.py``)."""
    path = change.path
    if change.kind == "create":
        created = b"".join(change.hunks[0].new) if change.hunks else b""  # no hunk: an empty file
        if content is not None:
            if content == created:
                raise _fail(patch, f"is already applied: {path} already exists with the content it creates", _already_applied_hint("upstream or an earlier patch has it"))
            raise _fail(patch, f"creates {path}, which already exists", misfit_hint(patch))
        if change.hunks and (len(change.hunks) != 1 or change.hunks[0].src_len != 0):
            raise _fail(patch, f"creates {path} but its hunks are not a single '@@ -0,0 ...' hunk")
        return
    if content is None:
        if change.kind == "delete":
            raise _fail(patch, f"is already applied: it deletes {path}, which does not exist", _already_applied_hint("upstream or an earlier patch did it"))
        raise _fail(patch, f"changes {path}, which does not exist", misfit_hint(patch))
    lines = split_lines(content)
    pos = 0
    problems: list[str] = []
    for h in change.hunks:
        start = _start(h, src=True)
        if h.src_len == 0 and lines:
            raise _fail(patch, f"{path} {h.label} has no context lines", "regenerate the patch with context (git diff's default -U3)")
        if start < pos:
            raise _fail(patch, f"{path} {h.label} overlaps the hunk before it or is out of order")
        why = _mismatch(lines, start, h.old, path)
        if why:
            problems.append(f"{h.label} does not apply to {path}: {why}")
            continue
        pos = start + len(h.old)
    if problems:
        if _already_applied(lines, change):
            raise _fail(patch, f"is already applied to {path} (the file already has its changes)", _already_applied_hint("upstream or an earlier patch has it"))
        hint = misfit_hint(patch)
        if "line endings differ" in problems[0]:
            hint = "regenerate the patch with `git diff` against the locked tree, which keeps the file's line endings"
        more = f" (and {len(problems) - 1} more hunk(s))" if len(problems) > 1 else ""
        raise _fail(patch, problems[0] + more, hint)
    if change.kind == "delete" and (sum(len(h.old) for h in change.hunks) != len(lines) or any(h.new for h in change.hunks)):
        raise _fail(patch, f"deletes {path} but its hunks do not cover the whole file", misfit_hint(patch))


def check_result(content: bytes, before: bytes, change: FileChange) -> str | None:
    """Why ``content`` is not what ``change`` makes of ``before`` (None: it is): each hunk's
    new lines at its target line, and the lines outside the hunks, as many as before."""
    lines = split_lines(content)
    for h in change.hunks:
        why = _mismatch(lines, _start(h, src=False), h.new, change.path)
        if why:
            return f"{h.label}: {why}"
    kept = len(split_lines(before)) - sum(len(h.old) for h in change.hunks)
    if len(lines) != kept + sum(len(h.new) for h in change.hunks):
        return f"{change.path} has {len(lines)} lines, the patch leaves {kept + sum(len(h.new) for h in change.hunks)}"
    return None


def _already_applied(lines: list[bytes], change: FileChange) -> bool:
    """True when every hunk's result is already in place (the reverse would apply)."""
    return all(_mismatch(lines, _start(h, src=False), h.new, change.path) is None for h in change.hunks)
