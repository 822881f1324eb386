"""Helpers for the rebase / upstream-log / export tests.

* ``install_engine_standin()``: until the engine's ``dancegrpo_npu.apply`` provides
  ``apply_series_to_dir`` and ``touched_files``, minimal stand-ins (patch-ng with
  strip=0, exact, no fuzz) are put in its place.  They live here, in tests/, only.
* ``History``: a synthetic upstream git repository built commit by commit.
* ``make_project``: a project (lock, series, overlay) plus its work tree, a clone of
  the history at the locked commit with the series and overlay applied, the way
  ``dancegrpo-npu fetch`` + ``apply`` leave it.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Upstream Dev", "GIT_AUTHOR_EMAIL": "dev@example.com",
    "GIT_COMMITTER_NAME": "Upstream Dev", "GIT_COMMITTER_EMAIL": "dev@example.com",
    "GIT_AUTHOR_DATE": "2025-08-01T00:00:00Z", "GIT_COMMITTER_DATE": "2025-08-01T00:00:00Z",
}


# --- engine stand-ins (tests only) -------------------------------------------------


def _standin_touched_files(patch) -> list[str]:
    out = []
    for line in patch.diff.splitlines():
        if line.startswith((b"--- ", b"+++ ")):
            path = line[4:].split(b"\t")[0].strip().decode()
            if path != "/dev/null":
                path = path[2:] if path[:2] in ("a/", "b/") else path
                if path not in out:
                    out.append(path)
    return out


def _standin_apply_series_to_dir(root, patches, overlay_dir, upstream_paths=None) -> None:
    import patch_ng

    from dancegrpo_npu.errors import DancegrpoError

    root = Path(root)
    for p in patches:
        ps = patch_ng.fromstring(p.diff)
        if not ps or not ps.apply(strip=0, root=str(root), fuzz=False):
            raise DancegrpoError(f"patch {p.name} does not apply exactly (stand-in)", "rebase")
    if overlay_dir is not None and Path(overlay_dir).is_dir():
        for dirpath, _, files in os.walk(overlay_dir):
            for name in files:
                src = Path(dirpath) / name
                rel = src.relative_to(overlay_dir).as_posix()
                if (upstream_paths is not None and rel in upstream_paths) or (root / rel).exists():
                    raise DancegrpoError(f"overlay path {rel} exists upstream (stand-in)", "move it")
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, root / rel)


def install_engine_standin() -> bool:
    """Put the stand-ins in place of dancegrpo_npu.apply when the engine lacks them."""
    try:
        import dancegrpo_npu.apply as real

        if hasattr(real, "apply_series_to_dir") and hasattr(real, "touched_files"):
            return False
    except ImportError:
        pass
    import dancegrpo_npu

    module = types.ModuleType("dancegrpo_npu.apply")
    module.__spec__ = importlib.machinery.ModuleSpec("dancegrpo_npu.apply", None)
    module.__doc__ = "TEST STAND-IN for the engine's apply module (tests/rebase_helpers.py)"
    module.apply_series_to_dir = _standin_apply_series_to_dir
    module.touched_files = _standin_touched_files
    sys.modules["dancegrpo_npu.apply"] = module
    dancegrpo_npu.apply = module
    return True


def apply_series(root: Path, patches, overlay_dir) -> None:
    install_engine_standin()
    from dancegrpo_npu.apply import apply_series_to_dir

    apply_series_to_dir(root, patches, overlay_dir)


def run_cli(project: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``dancegrpo-npu -C project ARGS`` in a subprocess (the stand-ins installed there too)."""
    code = (
        "import sys; sys.path.insert(0, %r); sys.path.insert(0, %r)\n"
        "import rebase_helpers; rebase_helpers.install_engine_standin()\n"
        "from dancegrpo_npu.cli import main; sys.exit(main(sys.argv[1:]))\n" % (str(SRC), str(TESTS))
    )
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = str(SRC)
    return subprocess.run(
        [sys.executable, "-c", code, "-C", str(project), *args], capture_output=True, text=True, env=full_env
    )


# --- synthetic upstream history -------------------------------------------------------


def git(cwd: Path, *args: str, input: bytes | None = None) -> str:
    env = dict(os.environ, **GIT_ENV)
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(var, None)
    r = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {r.stderr.decode()}")
    return r.stdout.decode().strip()


def code_file(name: str, lines: int) -> str:
    """Text that looks like code, every line distinct."""
    return "".join(f"{name}_value_{i} = compute('{name}', {i})\n" for i in range(1, lines + 1))


class History:
    """A synthetic upstream repository; ``commit`` returns the new commit id."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True)
        git(path, "init", "-q", "-b", "main")

    def write(self, rel: str, text: str) -> "History":
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return self

    def read(self, rel: str) -> str:
        return (self.path / rel).read_text()

    def edit_line(self, rel: str, lineno: int, new: str) -> "History":
        lines = self.read(rel).splitlines(keepends=True)
        lines[lineno - 1] = new + "\n"
        return self.write(rel, "".join(lines))

    def insert_lines(self, rel: str, before: int, new: list[str]) -> "History":
        lines = self.read(rel).splitlines(keepends=True)
        lines[before - 1 : before - 1] = [n + "\n" for n in new]
        return self.write(rel, "".join(lines))

    def delete(self, rel: str) -> "History":
        git(self.path, "rm", "-q", rel)
        return self

    def rename(self, old: str, new: str) -> "History":
        (self.path / new).parent.mkdir(parents=True, exist_ok=True)
        git(self.path, "mv", old, new)
        return self

    def commit(self, message: str) -> str:
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "--allow-empty", "-m", message)
        return git(self.path, "rev-parse", "HEAD")


def base_history(path: Path) -> tuple[History, str]:
    h = History(path)
    h.write("README.md", "# upstream\n\nSome words.\n")
    h.write("fastvideo/train.py", code_file("train", 60))
    h.write("fastvideo/utils.py", code_file("utils", 40))
    h.write("fastvideo/models/flux.py", code_file("flux", 30))
    return h, h.commit("initial upstream")


# --- a project on top of it -------------------------------------------------------------


@dataclass(frozen=True)
class PatchSpec:
    name: str
    description: str
    edits: dict  # path -> callable(old text or None) -> new text, or None to delete


def make_series(history: History, base: str, specs: list[PatchSpec], dest: Path, context: int = 3) -> list[str]:
    """Write each spec as a patch (made with git diff, DEP-3 header) into ``dest``; returns names."""
    scratch = dest.parent / (dest.name + ".scratch")
    git(dest.parent, "clone", "-q", str(history.path), str(scratch))
    git(scratch, "checkout", "-q", "--detach", base)
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    for spec in specs:
        for rel, fn in spec.edits.items():
            p = scratch / rel
            if fn is None:
                p.unlink()
            else:
                old = p.read_text() if p.exists() else None
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(fn(old))
        git(scratch, "add", "-A")
        diff = git(scratch, "diff", "--cached", f"-U{context}", "--src-prefix=a/", "--dst-prefix=b/", "--no-renames")
        diff = "\n".join(ln for ln in diff.splitlines() if not ln.startswith("index ")) + "\n"
        git(scratch, "commit", "-q", "-m", spec.name)
        header = (
            f"Description: {spec.description}\n Why: tests.\nAuthor: Test <t@example.com>\n"
            "Forwarded: not-needed\nLast-Update: 2025-01-01\n"
        )
        (dest / spec.name).write_text(header + "---\n" + diff)
        names.append(spec.name)
    (dest / "series").write_text("# test series\n" + "".join(n + "\n" for n in names))
    shutil.rmtree(scratch)
    return names


def sha256_at(history: History, commit: str, rel: str) -> str | None:
    r = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=history.path, capture_output=True)
    return hashlib.sha256(r.stdout).hexdigest() if r.returncode == 0 else None


def make_project(root: Path, history: History, commit: str, specs: list[PatchSpec], overlay: dict | None = None,
                 context: int = 3) -> Path:
    """Project at ``root`` (lock, patches, overlay) and its work tree ``root/build/DanceGRPO``."""
    install_engine_standin()
    from dancegrpo_npu.apply import touched_files
    from dancegrpo_npu.series import load_series

    root.mkdir(parents=True)
    make_series(history, commit, specs, root / "patches", context)
    for rel, text in (overlay or {}).items():
        (root / "overlay" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "overlay" / rel).write_text(text)
    patches = load_series(root / "patches")
    files = {}
    for p in patches:
        for rel in touched_files(p):
            digest = sha256_at(history, commit, rel)
            if digest:
                files[rel] = digest
    lock = [f'[upstream]\nurl = "{history.path}"\ncommit = "{commit}"\n\n[files]\n']
    lock += [f'"{k}" = "{v}"\n' for k, v in sorted(files.items())]
    (root / "upstream.lock").write_text("".join(lock))
    work = root / "build" / "DanceGRPO"
    work.parent.mkdir(parents=True)
    git(root, "clone", "-q", str(history.path), str(work))
    git(work, "checkout", "-q", "--detach", commit)
    apply_series(work, patches, root / "overlay")
    return root


def tree_state(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` except .git, as bytes (to compare trees exactly)."""
    out = {}
    for dirpath, dirnames, files in os.walk(path):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in files:
            p = Path(dirpath) / name
            out[p.relative_to(path).as_posix()] = p.read_bytes()
    return out


def project_state(root: Path) -> dict[str, bytes]:
    """The project files a rebase may change: upstream.lock and patches/."""
    out = {"upstream.lock": (root / "upstream.lock").read_bytes()}
    for p in sorted((root / "patches").iterdir()):
        out[f"patches/{p.name}"] = p.read_bytes()
    return out
