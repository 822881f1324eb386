"""``patches/series`` and the patches it names, with their DEP-3 headers.

The series file is quilt's: one patch file name a line, in order; ``#`` starts a
comment; blank lines are ignored.  A patch is a DEP-3 header
(https://dep-team.pages.debian.net/deps/dep3/) followed by a unified diff::

    Description: one line saying what the patch does
     Longer text, each continuation line indented by one space, saying why.
    Author: Name <mail>
    Forwarded: not-needed | no | <url>   (not-needed and no: the reason on the next line)
    Last-Update: 2026-11-30
    ---
    diff --git a/fastvideo/utils/load.py b/fastvideo/utils/load.py
    ...

The header ends at the first line that starts a diff (``diff --git``, ``--- ``,
``Index:``) or at a line ``---`` on its own.  A patch without ``Description:``
(or its DEP-3 alias ``Subject:``) is refused.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError

REQUIRED_FIELDS = ("Description",)
_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):(?:\s(.*)|)$")
_DIFF_START = ("diff --git ", "--- ", "Index: ")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class Patch:
    """One patch of the series: its file, DEP-3 header and diff, as bytes on disk."""

    name: str
    path: Path
    header: dict[str, str]  # DEP-3 fields in file order; continuation lines joined with "\n"
    header_text: str  # the header exactly as written (up to the diff)
    diff: bytes  # the unified diff exactly as written

    @property
    def description(self) -> str:
        """The first line of ``Description:`` (the patch's one-line summary)."""
        text = self.header.get("Description") or self.header.get("Subject") or ""
        return text.split("\n", 1)[0].strip()

    @property
    def unfinished(self) -> bool:
        """Its ``Description:`` still starts with ``TODO`` (the stub ``export`` writes)."""
        return is_todo(self.description)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.header_text.encode("utf-8") + self.diff).hexdigest()


def split_patch(data: bytes, name: str) -> tuple[str, bytes]:
    """Split a patch file into (DEP-3 header text, diff bytes)."""
    lines = data.splitlines(keepends=True)
    for i, raw in enumerate(lines):
        line = raw.rstrip(b"\r\n")
        if line == b"---" and i + 1 < len(lines) and lines[i + 1].startswith((b"diff --git ", b"--- ", b"Index: ")):
            return b"".join(lines[:i]).decode("utf-8", "replace"), b"".join(lines[i + 1 :])
        if line.startswith(tuple(s.encode() for s in _DIFF_START)):
            if line.startswith(b"--- ") and not (i + 1 < len(lines) and lines[i + 1].startswith(b"+++ ")):
                continue
            return b"".join(lines[:i]).decode("utf-8", "replace"), b"".join(lines[i:])
    raise DancegrpoError(f"patch {name} contains no unified diff", "regenerate it with `git diff` or `dancegrpo-npu export`")


def parse_header(text: str, name: str) -> dict[str, str]:
    """DEP-3 fields of a header (free text after the fields is ignored, as DEP-3 allows)."""
    fields: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines():
        if not line.strip():
            current = None
            if fields:
                # DEP-3: the first paragraph holds the fields; later text is free-form.
                break
            continue
        m = _FIELD.match(line)
        if m and not line.startswith((" ", "\t")):
            current = m.group(1)
            fields[current] = (m.group(2) or "").strip()
        elif line.startswith((" ", "\t")) and current is not None:
            cont = line.strip()
            fields[current] += "\n" + ("" if cont == "." else cont)
        else:
            current = None
    for key in REQUIRED_FIELDS:
        if not (fields.get(key) or fields.get("Subject")):
            raise DancegrpoError(
                f"patch {name} has no DEP-3 'Description:' in its header",
                "start the patch with 'Description: <what and why>' (see docs/engine.md, Changing the series)",
            )
    return fields


def load_patch(path: Path, name: str | None = None) -> Patch:
    name = name or path.name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DancegrpoError(
            f"patches/series names {name}, but {path} does not exist",
            "add the patch file or remove its line from patches/series",
        ) from None
    except OSError as e:
        raise DancegrpoError(f"patch {name} cannot be read ({e.strerror})", f"make {path} a readable file") from None
    header_text, diff = split_patch(data, name)
    return Patch(name=name, path=path, header=parse_header(header_text, name), header_text=header_text, diff=diff)


def read_series_names(series_path: Path) -> list[str]:
    """Patch names in order, as written in ``series``; checks the names themselves."""
    try:
        text = series_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DancegrpoError(f"{series_path} does not exist", "create patches/series (it may be empty)") from None
    except UnicodeDecodeError:
        raise DancegrpoError(f"{series_path} is not UTF-8 text", "write one patch file name a line") from None
    except OSError as e:
        raise DancegrpoError(f"{series_path} cannot be read ({e.strerror})", "make it a readable file") from None
    names: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        parts = entry.split()
        if len(parts) != 1:
            raise DancegrpoError(
                f"{series_path}:{lineno}: options after the patch name are not supported ({entry!r})",
                "write one patch file name a line; patches are applied with -p0 on git-style a/ b/ paths",
            )
        name = parts[0]
        if not _SAFE_NAME.match(name) or name == "series":
            raise DancegrpoError(
                f"{series_path}:{lineno}: {name!r} is not a plain patch file name",
                "name patches like what-it-does.patch, directly under patches/",
            )
        if name in names:
            raise DancegrpoError(f"{series_path}:{lineno}: {name} is listed twice", "list each patch once")
        names.append(name)
    return names


def load_series(patches_dir: Path) -> list[Patch]:
    """Every patch named by ``patches_dir/series``, in order, headers checked."""
    names = read_series_names(patches_dir / "series")
    return [load_patch(patches_dir / n, n) for n in names]


def series_sha256(patches: list[Patch]) -> str:
    """One digest for the whole series (names, order, headers and diffs)."""
    h = hashlib.sha256()
    for p in patches:
        h.update(p.name.encode() + b"\0" + p.sha256.encode() + b"\n")
    return h.hexdigest()


def patch_stem(file_name: str) -> str:
    """A patch's name, what a user types: its file name without ``.patch``
    (``batched-rollout.patch`` -> ``batched-rollout``).  The series' order is the lines of
    ``series`` alone: a name that starts with digits is a name like any other."""
    return file_name.removesuffix(".patch")


def select_without(patches: list[Patch], names) -> tuple[list[Patch], tuple[str, ...]]:
    """The series minus the patches ``names`` gives (each a patch's name, ``batched-rollout``,
    or its file name, ``batched-rollout.patch``): (the patches kept, in order; the names left
    out, in series order).  A name that is no patch of the series is a one-line error."""
    chosen: set[str] = set()
    for given in names:
        given = given.strip()
        found = next((p.name for p in patches if p.name == given), None) or \
            next((p.name for p in patches if patch_stem(p.name) == given), None)
        if found is None:
            raise DancegrpoError(f"--without {given}: no patch of patches/series",
                                 "name a patch as `dancegrpo-npu series` lists it: its name (batched-rollout) or its "
                                 "file name (batched-rollout.patch)", exit_code=2)
        chosen.add(found)
    return [p for p in patches if p.name not in chosen], tuple(p.name for p in patches if p.name in chosen)


def series_label(without: tuple[str, ...]) -> str:
    """"series", or "series without A, B" for a tree applied with ``apply --without``."""
    return f"series without {', '.join(without)}" if without else "series"


TODO_MARK = "[TODO: write its Description:]"


def is_todo(description: str) -> bool:
    return description.startswith("TODO")


def todo_warning(patches: list[Patch]) -> str | None:
    """A warning naming the patches whose Description: is still a TODO stub (they apply
    like any other; the why of a patch is what a reviewer and a rebase need)."""
    todo = [p.name for p in patches if p.unfinished]
    if not todo:
        return None
    return (
        f"warning: {len(todo)} patch(es) still have a TODO Description: {', '.join(todo)}; "
        "say what each changes and why (DEP-3 header in patches/) before committing"
    )


def format_header(fields: dict[str, str]) -> str:
    """A DEP-3 header from fields (multi-line values indented; empty lines as ' .')."""
    out = []
    for key, value in fields.items():
        first, *rest = value.split("\n")
        out.append(f"{key}: {first}".rstrip())
        out += [f" {line}" if line.strip() else " ." for line in rest]
    return "\n".join(out) + "\n"
