"""Unified diffs, read strictly: which files a patch changes, with which hunks, and
what each file is after the hunks apply *exactly* (no fuzz, no offset).

This is the engine's own reading of a patch.  patch-ng writes the files (see
``stage.py``), but it strips ``../`` and absolute prefixes, follows symlinks, applies
fuzzed hunks and drops "\\ No newline at end of file", so every path and every hunk
is checked here first, and patch-ng's output is compared with ``apply_exact``.

Lines are split on LF only and kept with their endings, so a CRLF file and a CRLF
patch match byte for byte, and a patch whose line endings differ from its target's
is refused with a message saying so.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from dancegrpo_npu.errors import DancegrpoError

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
REBASE_HINT = "the patch does not fit the locked upstream exactly (no fuzz is allowed); run `dancegrpo-npu rebase`"
_UNSUPPORTED = {
    b"GIT binary patch": "a git binary patch",
    b"Binary files ": "a binary change",
    b"rename from ": "a rename",
    b"copy from ": "a copy",
    b"old mode ": "a file mode change",
}


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

    @property
    def label(self) -> str:
        return _label(self.number, self.header)


@dataclass(frozen=True)
class FileChange:
    """One file's part of a patch: modify (both paths), create (old None), delete (new None)."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]
    new_mode: int | None = None  # permission bits of a created file (0o644 / 0o755)
    no_newline: bool = False  # the patch marks a missing final newline

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    @property
    def kind(self) -> str:
        return "create" if self.old_path is None else "delete" if self.new_path is None else "modify"


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


def check_patch_path(name: str, patch: str, prefix: str = "") -> str:
    """The repo-relative path a patch names, or a refusal (before anything is written).

    ``prefix`` is git's "a/" or "b/", which git-style diffs carry and patch-ng strips."""
    shown = name
    if name.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", name) or name.startswith("\\"):
        raise _fail(patch, f"refusing absolute path {shown!r}", "patches may only change files inside the upstream tree")
    if prefix:
        if not name.startswith(prefix):
            raise _fail(patch, f"git-style file name {shown!r} lacks its {prefix!r} prefix")
        name = name[len(prefix):]
    parts = name.split("/")
    if "\\" in name or "\0" in name or any(p in ("", ".", "..") for p in parts):
        raise _fail(patch, f"refusing path {shown!r}: it has '..', '.', empty or backslash parts", "patches may only change files inside the upstream tree, by plain relative paths")
    if ".git" in parts:
        raise _fail(patch, f"refusing path {shown!r} inside .git", "patches may only change files of the upstream tree")
    return name


def check_symlinks(path: str, symlinks: dict[str, str], who: str) -> None:
    """Refuse a path that is, or goes through, a symlink of the upstream tree."""
    parts = path.split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        if prefix in symlinks:
            target = symlinks[prefix]
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(prefix), target))
            if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
                raise DancegrpoError(
                    f"{who}: refusing {path}: it goes through the symlink {prefix} -> {target}, which leaves the tree",
                    "patches and the overlay may only change files inside the upstream tree",
                )
            real = posixpath.normpath(posixpath.join(resolved, *parts[i:]))
            raise DancegrpoError(
                f"{who}: refusing {path}: it goes through the symlink {prefix} -> {target}",
                f"write it against the real path {real}",
            )


def parse_diff(diff: bytes, patch: str) -> list[FileChange]:
    """Every file change of a unified diff, with hunks, paths checked (syntactically)."""
    lines = split_lines(diff)
    changes: list[FileChange] = []
    seen: set[str] = set()
    i, git_header, new_mode, section = 0, False, None, ""
    while i < len(lines):
        line = lines[i]
        if line.startswith(b"diff --git "):
            if git_header:
                raise _no_hunks(patch, section)
            git_header, new_mode, section = True, None, line.rstrip(b"\r\n").decode("utf-8", "replace")
            i += 1
            continue
        for marker, what in _UNSUPPORTED.items():
            if line.startswith(marker) and (git_header or marker == b"Binary files "):
                raise _fail(patch, f"diff line {i + 1}: {what} is not supported", "put binary or renamed files in overlay/, and keep patches to text hunks")
        m = re.match(rb"^new file mode (\d+)", line)
        if m:
            new_mode = 0o755 if int(m.group(1), 8) & 0o111 else 0o644
        if line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
            old = _name(line[4:], patch, i + 1)
            new = _name(lines[i + 1][4:], patch, i + 2)
            if old is None and new is None:
                raise _fail(patch, f"diff line {i + 1}: both sides are /dev/null")
            old = check_patch_path(old, patch, "a/" if git_header else "") if old is not None else None
            new = check_patch_path(new, patch, "b/" if git_header else "") if new is not None else None
            if old is not None and new is not None and old != new:
                raise _fail(patch, f"diff line {i + 1}: {old} is renamed to {new}; renames are not supported", "regenerate with `git diff --no-renames`")
            i, hunks, no_newline = _parse_hunks(lines, i + 2, patch, new or old)
            path = new or old
            if path in seen:
                raise _fail(patch, f"changes {path} twice", "merge the two parts into one diff of the file")
            seen.add(path)
            if not hunks:
                raise _fail(patch, f"{path} has no hunks")
            changes.append(FileChange(old, new, tuple(hunks), new_mode if old is None else None, no_newline))
            git_header, new_mode = False, None
            continue
        if line.startswith(b"@@ "):
            raise _fail(patch, f"diff line {i + 1}: a hunk without ---/+++ file names before it")
        i += 1
    if git_header:
        raise _no_hunks(patch, section)
    if not changes:
        raise _fail(patch, "contains no file changes (an empty file? a mode-only change?)", "add the diff, or drop the patch from patches/series")
    return changes


def _no_hunks(patch: str, section: str) -> DancegrpoError:
    return _fail(patch, f"'{section}' has no hunks (an empty new file, or a mode-only change): not supported", "put empty or executable new files in overlay/")


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
        hunks.append(Hunk(number, header, src_start, src_len, tgt_start, tgt_len, tuple(old), tuple(new)))
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


def apply_exact(content: bytes | None, change: FileChange, patch: str) -> bytes | None:
    """The file after ``change`` applies exactly to ``content`` (None: absent), or a
    DancegrpoError naming the patch, file and hunk; "already applied" is said as such."""
    path = change.path
    if change.kind == "create":
        if content is not None:
            if content == b"".join(change.hunks[0].new):
                raise _fail(patch, f"is already applied: {path} already exists with the content it creates", "drop the patch from patches/series (upstream or an earlier patch has it), or run `dancegrpo-npu rebase`")
            raise _fail(patch, f"creates {path}, which already exists", REBASE_HINT)
        if len(change.hunks) != 1 or change.hunks[0].src_len != 0:
            raise _fail(patch, f"creates {path} but its hunks are not a single '@@ -0,0 ...' hunk")
        return b"".join(change.hunks[0].new)
    if content is None:
        if change.kind == "delete":
            raise _fail(patch, f"is already applied: it deletes {path}, which does not exist", "drop the patch from patches/series (upstream or an earlier patch did it), or run `dancegrpo-npu rebase`")
        raise _fail(patch, f"changes {path}, which does not exist", REBASE_HINT)
    lines = split_lines(content)
    out: list[bytes] = []
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
        out += lines[pos:start]
        out += h.new
        pos = start + len(h.old)
    if problems:
        if _already_applied(lines, change):
            raise _fail(patch, f"is already applied to {path} (the file already has its changes)", "drop the patch from patches/series (upstream or an earlier patch has it), or run `dancegrpo-npu rebase`")
        hint = REBASE_HINT
        if "line endings differ" in problems[0]:
            hint = "regenerate the patch with `git diff` against the locked tree, which keeps the file's line endings"
        more = f" (and {len(problems) - 1} more hunk(s))" if len(problems) > 1 else ""
        raise _fail(patch, problems[0] + more, hint)
    out += lines[pos:]
    result = b"".join(out)
    if change.kind == "delete":
        if result:
            raise _fail(patch, f"deletes {path} but its hunks do not cover the whole file", REBASE_HINT)
        return None
    return result


def _already_applied(lines: list[bytes], change: FileChange) -> bool:
    """True when every hunk's result is already in place (the reverse would apply)."""
    return all(_mismatch(lines, _start(h, src=False), h.new, change.path) is None for h in change.hunks)
