"""After a rebase: every trainer's script imported under its own dependency set.

Lines git merged cleanly outside any conflict region, and upstream's own new lines, are
checked by nobody else: a module-level import of a class diffusers 0.32 lacks, in a module
every trainer imports, breaks all the trainers of the diffusers-0.32 set at start, and
a module-level ``import torchtitan`` in a trainer breaks that one.  So once the series has
been replayed and the work tree moved (the tree the trainers run: upstream + series +
overlay), each trainer's script is imported as a module (``__name__`` is not
``"__main__"``, so its main does not run; launch's ``PYTHONPATH``, the tree first, and the
script's own directory first on ``sys.path``, as ``python SCRIPT`` has it), in one child
process per dependency set (``run.depsets.python_for``).  A script that fails names the file
and line of the tree where it failed, the patch of the series nearest to that line, and the
upstream commit that brought the line (``git blame`` of the patched file on the new commit).
A set that is not installed is said, with the trainers it leaves unchecked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.engine.series import Patch
from dancegrpo_npu.rebase.queue import hunks_by_file
from dancegrpo_npu.rebase.report import changed_lines
from dancegrpo_npu.vcs.gitcmd import Git

MARK = "DANCEGRPO-NPU-IMPORT-CHECK "
TIMEOUT = 900  # seconds for one set's child (torch and diffusers imported once)

# Runs in the child: imports each script as a module, reports where it failed.
_CHILD = r"""
import importlib.util, json, os, sys, traceback
request = json.loads(sys.argv[1])
tree = request["tree"]
sys.path.insert(0, tree)
answers = []
def in_tree(path):
    return bool(path) and os.path.abspath(path).startswith(tree + os.sep)
for name, rel in request["scripts"]:
    path = os.path.join(tree, rel)
    here = os.path.dirname(path)
    sys.path.insert(0, here)
    answer = {"name": name, "script": rel}
    try:
        spec = importlib.util.spec_from_file_location("_dancegrpo_npu_import_check_" + name.replace("-", "_"), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except BaseException as e:
        answer["error"] = (type(e).__name__ + ": " + str(e)).splitlines()[0][:300]
        where = [(f.filename, f.lineno, f.line) for f in traceback.extract_tb(e.__traceback__) if in_tree(f.filename)]
        if isinstance(e, SyntaxError) and in_tree(e.filename):
            where.append((e.filename, e.lineno, (e.text or "").strip()))
        if where:
            filename, lineno, text = where[-1]
            answer.update(file=os.path.relpath(os.path.abspath(filename), tree), line=lineno or 0, text=text or "")
    finally:
        sys.path.remove(here)
    answers.append(answer)
sys.stdout.write("\n" + MARK + json.dumps(answers) + "\n")
""".replace("MARK", repr(MARK))


@dataclass(frozen=True)
class Failure:
    trainers: tuple[str, ...]  # the trainers it breaks
    depset: str
    error: str  # "ImportError: cannot import name ..."
    file: str = ""  # tree-relative; "" when no frame of the tree was found
    line: int = 0
    text: str = ""
    patch: str = ""  # the patch nearest to the line (or why none)
    origin: str = ""  # the upstream commit that brought the line (or where it comes from)

    def where(self) -> str:
        if not self.file:
            return f"{', '.join(self.trainers)}: {self.error}"
        code = f" `{self.text.strip()}`" if self.text.strip() else ""
        return f"{self.file}:{self.line}{code}: {self.error}"

    def one_line(self) -> str:
        breaks = f"breaks {', '.join(self.trainers)} ({self.depset})"
        if not self.file:
            return f"{self.where()} ({breaks})"
        return f"{self.where()}; {breaks}; nearest patch: {self.patch}; the line: {self.origin}"


@dataclass(frozen=True)
class ImportCheck:
    checked: tuple[str, ...]  # the trainers imported
    failures: tuple[Failure, ...]
    notes: tuple[str, ...]  # sets not installed, scripts absent, a child that died

    def lines(self) -> list[str]:
        out = []
        if self.checked:
            ok = len(self.checked) - len({t for f in self.failures for t in f.trainers})
            out.append(f"trainer imports: {ok} of {len(self.checked)} trainer script(s) import under their dependency set"
                       + ("" if self.failures else f" ({', '.join(self.checked)})"))
        out += [f"  IMPORT FAILS: {f.one_line()}" for f in self.failures]
        out += [f"  {n}" for n in self.notes]
        return out

    def problem(self) -> str:
        """The one line a failed check ends the rebase with ("" when none failed)."""
        if not self.failures:
            return ""
        more = f" (and {len(self.failures) - 1} more, listed above)" if len(self.failures) > 1 else ""
        return f"the rebase is done, but trainers fail at import: {self.failures[0].one_line()}{more}"


def trainer_scripts() -> dict[str, list[tuple[str, str]]]:
    """Dependency set -> [(trainer, script)] of the registry's GRPO trainers."""
    from dancegrpo_npu import registry
    out: dict[str, list[tuple[str, str]]] = {}
    for name in registry.trainers():
        spec = registry.get(name)
        out.setdefault(spec.depset, []).append((name, spec.relpath))
    return out


def start_child(python: str, tree: Path, scripts: list[tuple[str, str]], environ: dict[str, str]) -> subprocess.Popen:
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + ([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else []))
    env.setdefault("WANDB_MODE", "offline")
    request = json.dumps({"tree": str(tree), "scripts": scripts})
    return subprocess.Popen([python, "-c", _CHILD, request], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tree)


def child_answers(child: subprocess.Popen, scripts: list[tuple[str, str]]) -> list[dict]:
    try:
        out, err = child.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise DancegrpoError(f"importing {', '.join(n for n, _ in scripts)} took over {TIMEOUT} s", "") from None
    for line in reversed(out.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    last = (err.strip().splitlines() or [f"exit {child.returncode}"])[-1]
    raise DancegrpoError(f"the import check's child process died ({last})", "")


def check_trainer_imports(tree: Path, patches: list[Patch], main: Git, old_commit: str,
                          overlay: list[str], environ: dict[str, str] | None = None) -> ImportCheck:
    """Import every trainer script of ``tree`` under its set; see the module doc."""
    from dancegrpo_npu.run.depsets import python_for

    environ = dict(os.environ if environ is None else environ)
    checked: list[str] = []
    failures: dict[tuple, dict] = {}
    notes: list[str] = []
    children = []
    for depset, rows in trainer_scripts().items():
        present = [(n, rel) for n, rel in rows if (tree / rel).is_file()]
        absent = [n for n, rel in rows if not (tree / rel).is_file()]
        if absent and present:
            notes.append(f"not in the tree, not imported: {', '.join(absent)}")
        if not present:
            continue
        try:
            python = python_for(depset, environ)
        except DancegrpoError as e:
            notes.append(f"NOT CHECKED: {', '.join(n for n, _ in present)}: {e.one_line()}")
            continue
        children.append((depset, present, start_child(python, tree, present, environ)))  # the sets run side by side
    for depset, present, child in children:
        try:
            answers = child_answers(child, present)
        except DancegrpoError as e:
            notes.append(f"NOT CHECKED: {', '.join(n for n, _ in present)} ({depset}): {e.message}")
            continue
        checked += [n for n, _ in present]
        for a in answers:
            if "error" not in a:
                continue
            key = (depset, a.get("file", ""), a.get("line", 0), a["error"])
            entry = failures.setdefault(key, {"trainers": [], "answer": a})
            entry["trainers"].append(a["name"])
    found = [
        explain(Failure(tuple(v["trainers"]), depset, v["answer"]["error"], v["answer"].get("file", ""),
                        v["answer"].get("line", 0), v["answer"].get("text", "")), patches, main, old_commit, overlay)
        for (depset, *_), v in failures.items()
    ]
    return ImportCheck(tuple(checked), tuple(found), tuple(notes))


def explain(f: Failure, patches: list[Patch], main: Git, old_commit: str, overlay: list[str]) -> Failure:
    """The failure with its nearest patch and the origin of its line."""
    if not f.file:
        return f
    from dataclasses import replace

    return replace(f, patch=nearest_patch(patches, f.file, f.line), origin=line_origin(main, f.file, f.line, old_commit, overlay))


def nearest_patch(patches: list[Patch], rel: str, line: int) -> str:
    """The patch of the series whose hunk's changed lines are nearest to ``line`` of ``rel``
    (line numbers of the file the patch leaves), or what says that no patch touches the file."""
    best = None
    for p in patches:
        for hunk in hunks_by_file(p).get(rel, []):
            removed, added = changed_lines(hunk)
            m = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)", hunk.header)
            marks = added or ({int(m.group(1))} if m else set())
            if not marks:
                continue
            distance = min(abs(line - n) for n in marks)
            if best is None or distance < best[0]:
                best = (distance, p.name, hunk)
    if best is None:
        return f"none (no patch touches {rel})"
    distance, name, hunk = best
    at = "its own line" if distance == 0 else f"{distance} line(s) from its change"
    return f"{name} (hunk {hunk.number}/{hunk.of} {hunk.header.split('@@')[1].strip()}, {at})"


def line_origin(main: Git, rel: str, line: int, old_commit: str, overlay: list[str]) -> str:
    """Where line ``line`` of the patched file ``rel`` comes from: the upstream commit that
    brought it (blame of the work tree's file on its HEAD, the new upstream commit), the series,
    or the overlay."""
    if rel in overlay:
        return "an overlay file (overlay/" + rel + ")"
    r = main.run("blame", "--porcelain", "-L", f"{line},{line}", "--", rel, check=False)
    if r.returncode != 0 or not r.stdout:
        return "unknown (git blame found no upstream history for it)"
    lines = r.stdout.decode("utf-8", "replace").splitlines()
    commit = lines[0].split()[0]
    if set(commit) == {"0"}:
        return "added by the series, not upstream"
    fields = dict(ln.split(" ", 1) for ln in lines[1:] if " " in ln and not ln.startswith("\t"))
    new = "new since the locked commit" if not main.is_ancestor(commit, old_commit) else "already in the locked commit"
    return (f"upstream {commit[:12]} {fields.get('summary', '')!r} ({new}); "
            f"see: git -C {main.cwd} show {commit[:12]} -- {rel}")


__all__ = ["check_trainer_imports", "ImportCheck", "Failure"]
