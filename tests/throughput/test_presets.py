"""``bench``'s input checks: presets, sizes and sample batch sizes, refused before anything is built.

The CLI tests run ``dancegrpo-npu bench`` in a child process and expect exit 2 with exactly one
line on stderr; they finish before torch is imported (no patched tree needed).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.throughput import presets

ROOT = Path(__file__).resolve().parents[2]


def resolve(**options):
    return presets.resolve(options)


def test_full_is_upstreams_recipe():
    config = resolve()
    s = config.sizes
    assert config.preset.name == "full" and config.sample_batch_sizes == (1,)
    assert (s.height, s.width, s.sampling_steps, s.generations) == (720, 720, 16, 12)
    assert (s.timestep_fraction, s.eta, s.shift, s.text_tokens) == (0.6, 0.3, 3.0, 512)
    assert (s.steps, s.warmup_steps) == (2, 1)
    # the trainer drops the last timestep, then trains int(15 * 0.6) of them
    assert s.train_timesteps == 9


def test_explicit_sizes_win_over_the_preset():
    config = resolve(preset="cpu", height=256, generations=8, steps=3, sample_batch_sizes="8,1,8")
    assert (config.sizes.height, config.sizes.width, config.sizes.generations, config.sizes.steps) == (256, 128, 8, 3)
    assert config.sample_batch_sizes == (8, 1)
    assert config.decode_chunk(8) == 8 and resolve(vae_decode_chunk=3).decode_chunk(12) == 3


@pytest.mark.parametrize("options, message", [
    ({"preset": "huge"}, "unknown preset 'huge'; choose one of: full, cpu, tiny"),
    ({"sample_batch_sizes": "1,5"}, "5 does not divide the 12 generations of a prompt; use divisors of 12: 1, 2, 3, 4, 6, 12"),
    ({"sample_batch_sizes": "0"}, "0 samples per transformer call is fewer than 1"),
    ({"sample_batch_sizes": "4,-1"}, "-1 samples per transformer call is fewer than 1"),
    ({"sample_batch_sizes": "1,x"}, "'x' is not a whole number"),
    ({"preset": "tiny", "generations": 6, "sample_batch_sizes": "4"}, "4 does not divide the 6 generations"),
    ({"height": 100}, "--height 100 is not a multiple of 16"),
    ({"sampling_steps": 1}, "needs 2 or more"),
    ({"timestep_fraction": 0.01}, "trains none"),
    ({"generations": 6}, "--generations 6 is not a multiple of --gradient-accumulation-steps 4"),
    ({"vae_decode_chunk": 0}, "--vae-decode-chunk 0 is below 1"),
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"dtype": "fp16"}, "unknown dtype 'fp16'"),
])  # fmt: skip
def test_bad_input_is_refused(options, message):
    with pytest.raises(DancegrpoError) as err:
        resolve(**options)
    assert err.value.exit_code == 2
    assert message in err.value.one_line()


def bench(*args):
    return subprocess.run(
        [sys.executable, "-m", "dancegrpo_npu", "-C", str(ROOT), "bench", *args],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("args, message", [
    (("--preset", "huge"), "unknown preset 'huge'"),
    (("--preset", "tiny", "--sample-batch-sizes", "1,3"), "3 does not divide the 4 generations"),
    (("--sample-batch-sizes", "0"), "fewer than 1"),
])  # fmt: skip
def test_cli_bad_input_is_one_line_exit_2(args, message):
    r = bench(*args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert message in r.stderr and r.stdout == ""
