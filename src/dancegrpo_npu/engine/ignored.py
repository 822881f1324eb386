"""What the work tree holds that is no part of the patched tree: the weights, datasets and
reward models the trainers read there, and what the stock scripts write in their working
directory.  git ignores it (the block fetch writes into ``.git/info/exclude``), so that
neither status, verify nor apply counts it as an edit or an untracked file.

The weights' folders are not listed here: they are the top-level folders of the default
paths of the trainer registry's rows (``data/``, ``hps_ckpt/``, ``videoalign_ckpt/``, ...),
less upstream's own folders (``assets/``), so that a
row's new weights folder is ignored as soon as the row names it.  Every engine command
brings an older tree's block up to date (``keep_ignored``).
"""

from __future__ import annotations

from pathlib import Path

from dancegrpo_npu.vcs.gitutil import git

EXCLUDE_MARK = "# dancegrpo-npu: run outputs and data, never part of the patched tree\n"
# What the stock scripts write in their working directory (run data), beside the weights.
RUN_OUTPUTS = (
    "/images/", "/cache_dir/", "/outputs/", "/wandb/", "/runs/", "/log/", "/logs/",
    "/reward.txt", "/metrics.jsonl", "__pycache__/", "*.py[cod]", "*.egg-info/", ".pytest_cache/",
)


def weights_dirs(upstream_top: set[str]) -> list[str]:
    """The tree's top-level folders the registry's rows read weights, reward models and
    datasets from (their path flags' defaults), less ``upstream_top``: upstream's own."""
    from dancegrpo_npu.registry import REGISTRY

    found: set[str] = set()
    for spec in REGISTRY.values():
        for flag, value in spec.defaults:
            if flag not in spec.path_flags or not value or value.startswith(("/", "~")):
                continue
            parts = [p for p in value.split("/") if p not in ("", ".")]
            if parts and parts[0] != ".." and parts[0] not in upstream_top:
                found.add(parts[0])
    return sorted(found)


def exclude_lines(upstream_top: set[str]) -> list[str]:
    return [f"/{d}/" for d in weights_dirs(upstream_top)] + list(RUN_OUTPUTS)


def top_names(repo: Path, rev: str = "HEAD") -> set[str]:
    """The names at the top of ``rev``'s tree."""
    out = git(repo, "ls-tree", "-z", "--name-only", rev).stdout
    return {n.decode("utf-8", "surrogateescape") for n in out.split(b"\0") if n}


def keep_ignored(repo: Path, rev: str = "HEAD") -> None:
    """Write the block into ``repo``'s .git/info/exclude, or bring an older block up to date
    (lines of its that are no longer the block's are kept: they may be the user's).  The
    file is left alone when it already says it all."""
    exclude = Path(repo) / ".git" / "info" / "exclude"
    text = exclude.read_text() if exclude.exists() else ""
    wanted = exclude_lines(top_names(repo, rev))
    lines = text.splitlines(keepends=True)
    if EXCLUDE_MARK in lines:
        start = lines.index(EXCLUDE_MARK) + 1
        end = start
        while end < len(lines) and lines[end].strip() and not lines[end].startswith("#"):
            end += 1
        block = [line.rstrip("\n") for line in lines[start:end]]
        if set(wanted) <= set(block):
            return
        kept = [line for line in block if line not in wanted]
        new = lines[:start] + [f"{line}\n" for line in wanted + kept] + lines[end:]
    else:
        new = lines + (["\n"] if text and not text.endswith("\n") else []) + [EXCLUDE_MARK] + [f"{line}\n" for line in wanted]
    exclude.parent.mkdir(parents=True, exist_ok=True)
    exclude.write_text("".join(new))
