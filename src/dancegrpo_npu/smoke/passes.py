"""Which smoke runs passed, and on what: ``smoke --if-needed`` (what ./scripts/bootstrap.sh runs)
does nothing when a run with the same inputs already passed on this exact tree."""

from __future__ import annotations

import json
from pathlib import Path

from dancegrpo_npu.project import Project
from dancegrpo_npu.smoke.runner import SmokeOptions, SmokeResult, trainer_of

PASSED_NAME = "smoke-passed.json"


def inputs_sha256(project: Project, options: SmokeOptions, verified: dict | None = None) -> str | None:
    """What a smoke result depends on: the verified tree (lock, series, overlay - the digests its
    verification carries, ``engine.treecheck``), the reward fixtures' parameters, the smoke's own
    code and the code of the row's family (its fixtures and checks), its options (--steps,
    --generations and the trainer arguments after -- included) and the tree's path.  ``verified``: the
    command's verification of the tree (None: verified here).  None when the tree is not exactly
    lock + series + overlay (then nothing can be reused)."""
    import hashlib
    import importlib.util

    from dancegrpo_npu import registry
    from dancegrpo_npu.engine import treecheck
    from dancegrpo_npu.smoke.fixtures import reward_params_sha256

    name = trainer_of(options)
    spec = registry.smoke_spec(name)
    tree = verified if verified is not None else treecheck.tree_state(project, spec.relpath)
    digests = [tree.get(key) for key in treecheck.DIGESTS]
    if tree.get("state") != "verified" or not all(digests):
        return None
    parts = (*digests, repr(tuple(tree.get("without") or ())))  # an ablation tree is another input
    family = Path(importlib.util.find_spec(spec.smoke.fixtures.partition(":")[0]).origin).parent
    code = [p.read_text() for folder in (Path(__file__).parent, family) for p in sorted(folder.glob("*.py"))]
    settings = (options.nproc, name, options.device, options.steps, options.generations,
                tuple(options.extra_args), str(project.workdir), options.strict)
    h = hashlib.sha256()
    for part in (*parts, reward_params_sha256(), *code, repr(settings)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def _passes(project: Project) -> dict[str, str]:
    """inputs_sha256 -> run directory of each remembered pass (a damaged record is empty)."""
    try:
        record = json.loads((project.build_dir / PASSED_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in record.items() if isinstance(v, str)} if isinstance(record, dict) else {}


def previous_pass(project: Project, key: str | None) -> Path | None:
    """The run directory of an earlier pass with the same inputs, if it is still there."""
    run_dir = _passes(project).get(key) if key else None
    return Path(run_dir) if run_dir and Path(run_dir, "summary.json").is_file() else None


def record_pass(project: Project, key: str | None, result: SmokeResult) -> None:
    """Remember a pass (one entry per set of inputs: full, LoRA, 1 or 2 ranks...)."""
    from dancegrpo_npu.files import write_atomic

    if key:
        passes = {k: v for k, v in _passes(project).items() if Path(v, "summary.json").is_file()}
        passes[key] = str(result.run_dir)
        write_atomic(project.build_dir / PASSED_NAME, json.dumps(passes, indent=1))
