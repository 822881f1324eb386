"""Which smoke runs passed, and on what: ``smoke --if-needed`` (what ./scripts/bootstrap.sh runs)
does nothing when a run with the same inputs already passed on this exact tree."""

from __future__ import annotations

import json
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.project import Project
from dancegrpo_npu.smoke.runner import SmokeOptions, SmokeResult, trainer_of

PASSED_NAME = "smoke-passed.json"


def inputs_sha256(project: Project, options: SmokeOptions) -> str | None:
    """What a smoke result depends on: the verified tree (lock, series, overlay - digested
    the way apply records them), the fixtures' parameters, the smoke's own code, its
    options (--steps, --generations and the trainer arguments after -- included) and the tree's path.  None when the tree is not exactly lock + series + overlay (then nothing can
    be reused)."""
    import hashlib

    from dancegrpo_npu.engine.apply import overlay_sha256
    from dancegrpo_npu.smoke.fixtures import params_sha256
    from dancegrpo_npu.engine.series import load_series, series_sha256
    from dancegrpo_npu.engine.stage import read_overlay
    from dancegrpo_npu.engine.status import verify_tree

    try:
        report = verify_tree(project)
        parts = (report.lock.commit, series_sha256(load_series(project.patches_dir)),
                 overlay_sha256(read_overlay(project.overlay_dir)), repr(report.without))  # an ablation tree is another input
    except DancegrpoError:
        return None
    code = [p.read_text() for p in sorted(Path(__file__).parent.glob("*.py"))]  # the smoke's checks too
    name = trainer_of(options)
    settings = (options.nproc, name, options.device, options.steps, options.generations,
                tuple(options.extra_args), str(project.workdir), options.strict)
    h = hashlib.sha256()
    for part in (*parts, params_sha256(), *code, repr(settings)):
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
