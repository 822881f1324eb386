"""launch's stored defaults are exactly those of upstream's launch scripts at the locked commit.

Needs upstream: read with git from the lock's URL (git's url.<base>.insteadOf applies, as for
`dancegrpo-npu fetch`) or DANCEGRPO_SOURCE; skipped with the reason when it cannot be read.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from dancegrpo_npu.engine.lock import load_lock
from dancegrpo_npu.run.upstream_args import FLUX_DEFAULTS, FLUX_LORA_DEFAULTS, PREPROCESS_DEFAULTS

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def upstream_show(tmp_path_factory):
    lock = load_lock(REPO / "upstream.lock")
    source = os.environ.get("DANCEGRPO_SOURCE") or lock.url
    bare = tmp_path_factory.mktemp("upstream") / "repo.git"
    proc = subprocess.run(["git", "clone", "-q", "--bare", source, str(bare)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"upstream unavailable: {source} cannot be read ({(proc.stderr.strip().splitlines() or ['?'])[-1]})")

    def show(path: str) -> str:
        return subprocess.run(
            ["git", "--git-dir", str(bare), "show", f"{lock.commit}:{path}"], capture_output=True, text=True, check=True
        ).stdout

    return show


def script_args(text: str, script: str) -> list[str]:
    """The arguments after `script` on the torchrun line of an upstream shell script."""
    variables = dict(re.findall(r'^([A-Z_]+)="?([^"#\n]*?)"?\s*(?:#.*)?$', text, re.M))
    text = re.sub(r"\\\s*$", "", text.rstrip())  # finetune_flux_grpo.sh ends in a dangling backslash
    joined = text.replace("\\\n", " ")
    line = next(ln for ln in joined.splitlines() if ln.lstrip().startswith("torchrun"))
    tokens = shlex.split(line)
    rest = tokens[tokens.index(script) + 1 :]
    return [re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], t) for t in rest]


def flat(defaults) -> list[str]:
    return [x for flag, value in defaults for x in ((flag,) if value is None else (flag, value))]


@pytest.mark.parametrize(
    "path, script, defaults",
    [
        ("scripts/finetune/finetune_flux_grpo.sh", "fastvideo/train_grpo_flux.py", FLUX_DEFAULTS),
        ("scripts/finetune/finetune_flux_grpo_8gpus_lora.sh", "fastvideo/train_grpo_flux_lora.py", FLUX_LORA_DEFAULTS),
        (
            "scripts/preprocess/preprocess_flux_rl_embeddings.sh",
            "fastvideo/data_preprocess/preprocess_flux_embedding.py",
            PREPROCESS_DEFAULTS,
        ),
    ],
)
def test_defaults_match_upstream_scripts(upstream_show, path, script, defaults):
    assert flat(defaults) == script_args(upstream_show(path), script)
