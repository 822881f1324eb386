"""compare on synthetic records (tests/recorded_runs.py): verdicts, first divergence, exit codes,
tolerance overrides, compare.json and compare.png."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from recorded_runs import MODULES, make_run

from dancegrpo_npu.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path):
    (tmp_path / "upstream.lock").write_text((REPO / "upstream.lock").read_text())
    return tmp_path


def compare(project, capsys, *argv) -> tuple[int, str, str]:
    rc = main(["-C", str(project), "compare", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def first_divergence(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("first divergence:")]
    assert len(lines) == 1, out
    return lines[0]


def verdict(out: str) -> str:
    return out.strip().splitlines()[-1]


# ------------------------------------------------------------------ aligned


def test_identical_runs_are_aligned(project, capsys):
    make_run(project / "runs", "20260101-100000-cpu", modules=True)
    b = make_run(project / "runs", "20260101-110000-npu", modules=True)
    rc, out, err = compare(project, capsys, "cpu", "npu")
    assert rc == 0, out + err
    assert first_divergence(out) == "first divergence: none"
    assert verdict(out).startswith("verdict: aligned")
    report = json.loads((b / "compare.json").read_text())
    assert report["aligned"] is True and report["exit_code"] == 0 and report["first_divergence"] is None
    assert report["steps"] == [1, 2]
    stages = [(r["stage"], r["step"], r["module"]) for r in report["rows"]]
    # step 1 in the order a step computes it, with the module outputs where they happen
    step1 = [s if s != "module" else m for s, step, m in stages if step == 1]
    assert step1 == [
        "noise.init", "noise.sde", "noise.perms", *MODULES[:8], "latents.0", "latents.1", "latents.2", "latents.3",
        "log_probs", *MODULES[8:11], "images", *MODULES[11:], "rewards", "advantages", "train.log_prob",
        "train.ratio", "train.loss", "grad_norm",
    ]  # fmt: skip
    assert sum(step == 2 for _, step, _ in stages) == 15  # no module rows at step 2
    assert {t["name"] for t in report["tolerances"]} >= {"rewards_rel_pct", "images_psnr_db", "module_cos"}
    assert all(t["source"] for t in report["tolerances"])


def test_compare_png_has_the_panels(project, capsys):
    import matplotlib.image

    make_run(project / "runs", "a")

    def darker(step, rank, t):
        t["images"][0] //= 2

    b = make_run(project / "runs", "b", perturb=darker)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 1 and f"wrote {b / 'compare.png'}" in out
    img = matplotlib.image.imread(b / "compare.png")
    assert img.shape[0] > 600 and img.shape[1] > 800


# ------------------------------------------------------------------ divergences


def test_perturbed_reward_is_the_first_divergence(project, capsys):
    """The row holds the error of the step's mean reward (the field's figure), and the worst sample."""
    make_run(project / "runs", "a")

    def reward(step, rank, t):
        if step == 2:
            t["rewards"][1] *= np.float32(1.001)  # 0.1% on one sample of two

    b = make_run(project / "runs", "b", perturb=reward)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 1
    report = json.loads((b / "compare.json").read_text())
    first = report["first_divergence"]
    mean_a, mean_b = first["extra"]["mean_a"], first["extra"]["mean_b"]
    expected = abs(mean_b - mean_a) / mean_a * 100
    assert 0.02 < expected < 0.1 and first["value"] == pytest.approx(expected)
    assert first["extra"]["max_sample_rel_err_pct"] == pytest.approx(0.1, rel=1e-3)
    line = first_divergence(out)
    assert line == f"first divergence: rewards at step 2 (rank 0, sample 1): mean rel error (%) {expected:.6g} > 0.02"
    assert verdict(out) == "verdict: not aligned: 1 of 30 checks out of tolerance"
    assert first["stage"] == "rewards" and first["step"] == 2
    assert report["exit_code"] == 1 and first["text"] == line
    assert "(worst sample 0.1" in out


def test_a_sample_off_by_less_than_the_mean_tolerance_is_aligned(project, capsys):
    """One sample of 2x2 (two ranks) off by 0.05%: the mean of the four moves by less than 0.02%."""
    make_run(project / "runs", "a", world_size=2)

    def reward(step, rank, t):
        if rank == 1:
            t["rewards"][0] *= np.float32(1.0005)

    b = make_run(project / "runs", "b", world_size=2, perturb=reward)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 0, out
    rows = [r for r in json.loads((b / "compare.json").read_text())["rows"] if r["stage"] == "rewards"]
    assert [r["where"] for r in rows] == [{"rank": 1, "sample": 0}] * 2
    for r in rows:
        assert r["extra"]["max_sample_rel_err_pct"] == pytest.approx(0.05, rel=1e-3)
        assert 0 < r["value"] < 0.02 and r["ok"]


def test_reward_within_the_field_tolerance_is_aligned_and_tol_flips_it(project, capsys):
    make_run(project / "runs", "a")

    def reward(step, rank, t):
        t["rewards"] *= np.float32(1.0001)  # 0.01%: inside the field's 0.02%

    make_run(project / "runs", "b", perturb=reward)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 0 and first_divergence(out) == "first divergence: none"
    rc, out, _ = compare(project, capsys, "a", "b", "--tol", "rewards_rel_pct=0.005")
    assert rc == 1 and first_divergence(out).startswith("first divergence: rewards at step 1")
    assert "<= 0.005" in out


def test_image_pair_below_40_db(project, capsys):
    make_run(project / "runs", "a")

    def image(step, rank, t):
        if step == 1:
            t["images"][1, :4, :4] = 255 - t["images"][1, :4, :4]

    make_run(project / "runs", "b", perturb=image)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 1
    assert first_divergence(out).startswith("first divergence: images at step 1 (rank 0, sample 1): min PSNR (dB)")


def test_earliest_divergence_wins_by_step_then_stage(project, capsys):
    make_run(project / "runs", "a")

    def several(step, rank, t):
        if step == 1:
            t["grad_norm"][1] *= 2  # step 1, late stage
            t["rewards"][0] *= 1.01
        if step == 2:
            t["latents"][0, 1] += 1  # step 2, early stage

    make_run(project / "runs", "b", perturb=several)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 1 and first_divergence(out).startswith("first divergence: rewards at step 1 (rank 0, sample 0)")
    assert "3 of 30 checks out of tolerance" in verdict(out)
    rc, out, _ = compare(project, capsys, "a", "b", "--steps", "2")
    assert rc == 1 and first_divergence(out).startswith("first divergence: latents.1 at step 2 (rank 0, sample 0)")


def test_perturbed_module_is_named_and_beats_later_stages(project, capsys):
    make_run(project / "runs", "a", modules=True)

    def attention(rank, m):  # the attention output and everything after it in the transformer
        for name in MODULES[3:8]:
            m[name] *= 3

    def latents(step, rank, t):
        if step == 1:
            t["latents"][:, 1:] += 1

    make_run(project / "runs", "b", modules=True, perturb_modules=attention, perturb=latents)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 1
    line = first_divergence(out)
    assert line.startswith(
        "first divergence: transformer/transformer_blocks.0.attn.0 (module output, step 1, rank 0): cos 1, abs"
    ), line
    assert line.endswith("(msprobe: not reached)")


def test_module_rule_is_msprobes(project, capsys):
    """A small scale error passes (cosine 1, max abs <= 1); noise as large as the output fails
    (cosine < 0.9) unless the tolerances say otherwise."""
    make_run(project / "runs", "a", modules=True)

    def small_scale(rank, m):
        m["vae/decoder.mid_block"] *= np.float32(1.0001)

    make_run(project / "runs", "b", modules=True, perturb_modules=small_scale)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 0, out

    def noisy(rank, m):  # as large again, in another direction: cosine ~0.7
        m["vae/decoder.mid_block"] += np.random.default_rng(5).standard_normal((2, 8)).astype(np.float32)

    make_run(project / "runs", "c", modules=True, perturb_modules=noisy)
    rc, out, _ = compare(project, capsys, "a", "c")
    assert rc == 1 and first_divergence(out).startswith("first divergence: vae/decoder.mid_block (module output")
    rc, out, _ = compare(project, capsys, "a", "c", "--tol", "module_cos_min=0", "--tol", "module_abs=100",
                         "--tol", "module_abs_max=100")  # fmt: skip
    assert rc == 0, out


def _rewards_off(step, rank, t):  # the effect a small fault has: rewards 0.3% off (tolerance 0.02%)
    t["rewards"] *= np.float32(1.003)


@pytest.mark.parametrize("fault", [0, 2, 3, 8], ids=lambda k: MODULES[k])  # RoPE, a norm, attention, the VAE
def test_a_small_fault_is_named_where_its_error_stands_out(project, capsys, fault):
    """A 2% error from the faulty module on (it carries through to every later one) passes
    msprobe's rule everywhere (cosine 1); once the rewards show it, the module it starts in is
    named, and the line says how it was chosen."""
    make_run(project / "runs", "a", modules=True)

    def two_percent(rank, m):
        for name in MODULES[fault:]:
            m[name] *= np.float32(1.02)

    make_run(project / "runs", "b", modules=True, perturb_modules=two_percent, perturb=_rewards_off)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 1
    assert first_divergence(out) == (
        f"first divergence: {MODULES[fault]} (module output, step 1, rank 0): rel L2 error 0.02 > 0.0002 (fp32), "
        "and no module before it differs: the first module whose error stands out (judged so as the runs are not "
        "aligned; msprobe's rule passes it: cos 1, abs " + first_divergence(out).rsplit(" abs ", 1)[1]
    )
    table = [line for line in out.splitlines() if "stands out" in line and "first divergence" not in line]
    assert len(table) == 1 and table[0].startswith(MODULES[fault] + " "), out  # only where it starts


def test_a_small_fault_under_float_noise_is_named_by_its_jump(project, capsys):
    make_run(project / "runs", "a", modules=True)

    def noise_then_fault(rank, m):
        rng = np.random.default_rng(3)
        for k, name in enumerate(MODULES):
            m[name] *= (1 + 5e-5 * rng.standard_normal(m[name].shape) + (0.02 if k >= 3 else 0)).astype(np.float32)

    make_run(project / "runs", "b", modules=True, perturb_modules=noise_then_fault, perturb=_rewards_off)
    rc, out, _ = compare(project, capsys, "a", "b")
    line = first_divergence(out)
    assert rc == 1 and line.startswith(f"first divergence: {MODULES[3]} (module output, step 1, rank 0): rel L2 error ")
    assert "x the largest error before it (" in line and "stands out" in line


@pytest.mark.parametrize("rewards_off", [False, True], ids=["aligned", "rewards-off"])
def test_float_noise_that_grows_stands_out_nowhere(project, capsys, rewards_off):
    """Noise growing 1.5x from module to module, past the fp32 threshold, is noise: it does not
    jump.  Aligned stages stay aligned; with the rewards off, the rewards are the divergence."""
    make_run(project / "runs", "a", modules=True)

    def growing_noise(rank, m):
        rng = np.random.default_rng(4)
        for k, name in enumerate(MODULES):
            m[name] *= (1 + 1e-4 * 1.5**k * rng.standard_normal(m[name].shape)).astype(np.float32)

    make_run(project / "runs", "b", modules=True, perturb_modules=growing_noise,
             perturb=_rewards_off if rewards_off else None)  # fmt: skip
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == (1 if rewards_off else 0), out
    assert "stands out" not in out
    assert first_divergence(out).startswith("first divergence: rewards at step 1" if rewards_off else "first divergence: none")


def test_the_dtype_of_a_module_output_is_read_off_its_values():
    from dancegrpo_npu.align.modules import source_dtype

    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    bf16 = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)
    assert source_dtype(bf16) == "bf16" and source_dtype(x.astype(np.float16).astype(np.float32)) == "fp16"
    assert source_dtype(x) == "fp32" and source_dtype(np.array([np.nan], np.float32)) == "fp32"


def test_two_ranks_name_the_rank(project, capsys):
    make_run(project / "runs", "a", world_size=2)

    def rank1(step, rank, t):
        if rank == 1 and step == 2:
            t["advantages"][0] += 0.5

    make_run(project / "runs", "b", world_size=2, perturb=rank1)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 1
    assert first_divergence(out) == "first divergence: advantages at step 2 (rank 1, sample 0): max abs error 0.5 > 0.01"


def test_nan_in_run_b_fails_and_a_run_against_itself_is_aligned(project, capsys):
    make_run(project / "runs", "a")

    def nan(step, rank, t):
        t["train.loss"][0, 0] = np.nan

    make_run(project / "runs", "b", perturb=nan)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 1 and first_divergence(out).startswith("first divergence: train.loss at step 1")
    assert "is NaN" in first_divergence(out)
    shutil.copytree(project / "runs" / "b", project / "runs" / "b-copy")
    rc, out, _ = compare(project, capsys, "b", "b-copy")  # identical bits, NaN included
    assert rc == 0


def test_a_run_compared_with_itself_says_so_and_checks_nothing(project, capsys):
    a = make_run(project / "runs", "20260101-100000-cpu")
    for ref_b in ("20260101-100000-cpu", "cpu", str(a)):  # the same run, however it is named
        rc, out, err = compare(project, capsys, "20260101-100000-cpu", ref_b)
        assert rc == 2 and out == "" and err.count("\n") == 1, err
        assert "compare: RUN_A and RUN_B are the same run, 20260101-100000-cpu" in err
        assert "no evidence of alignment; nothing was checked" in err and "--replay 20260101-100000-cpu" in err
    assert not (a / "compare.json").exists()


@pytest.mark.parametrize("damage, line", [
    (lambda text: text[:-20], "line 2 is not a JSON record with a step (after step 1; a truncated write?)"),
    (lambda text: "garbage\n" + text, "line 1 is not a JSON record with a step (before any step; a truncated write?)"),
    (None, "cannot be read ("),
])  # fmt: skip
def test_a_truncated_or_unreadable_metrics_file_is_named(project, capsys, damage, line):
    make_run(project / "runs", "a")
    b = make_run(project / "runs", "b")
    jsonl = b / "metrics.jsonl"
    if damage:
        jsonl.write_text(damage(jsonl.read_text()))
    else:
        jsonl.unlink()
        jsonl.mkdir()  # unreadable as a file, for root too
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 0, out  # the records are the evidence, and they are aligned
    notes = [n for n in out.splitlines() if n.startswith("note: ") and "metrics.jsonl" in n]
    assert len(notes) == 1 and notes[0].startswith(f"note: {jsonl}") and line in notes[0], out


def test_noise_that_differs_is_reported_first_and_is_not_like_for_like(project, capsys):
    make_run(project / "runs", "a", rng="device")

    def noise(step, rank, t):
        t["noise.sde"][0, 0, 0, 0] += 1e-7 if t["noise.sde"][0, 0, 0, 0] > 1 else 1e-3

    make_run(project / "runs", "b", rng="device", perturb=noise)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 1
    assert first_divergence(out).startswith("first divergence: noise.sde at step 1 (rank 0): 1 of ")
    assert verdict(out) == (
        "verdict: not aligned: noise differs: not a like-for-like comparison; use --rng cpu or --replay"
    )


def test_module_records_of_one_run_only_are_noted_not_compared(project, capsys):
    make_run(project / "runs", "a", modules=True)
    make_run(project / "runs", "b")
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 0 and "note: module outputs not compared: only a recorded them" in out


def test_a_stage_one_run_lacks_is_a_divergence(project, capsys):
    make_run(project / "runs", "a")

    def drop(step, rank, t):
        del t["advantages"]

    make_run(project / "runs", "b", perturb=drop)
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 1 and first_divergence(out) == "first divergence: advantages at step 1 (rank 0): missing in RUN_B"


# ------------------------------------------------------------------ cannot compare: exit 2, one line


@pytest.mark.parametrize(
    "b_index, message",
    [
        ({"world_size": 2}, "differ in world size 1 vs 2"),
        ({"h": 32, "w": 32}, "differ in resolution (h) 16 vs 32, resolution (w) 16 vs 32"),
        ({"num_generations": 4}, "differ in generations 2 vs 4"),
        ({"steps": [3, 4]}, "no common recorded step (a: 1-2, b: 3-4)"),
    ],
)
def test_mismatched_runs_cannot_be_compared(project, capsys, b_index, message):
    make_run(project / "runs", "a")
    b = make_run(project / "runs", "b", **b_index)
    rc, out, err = compare(project, capsys, "a", "b")
    assert rc == 2 and out == ""
    assert err.startswith("dancegrpo-npu: error: compare") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (b / "compare.json").exists() and not (b / "compare.png").exists()


def test_no_records_missing_run_and_steps_outside(project, capsys):
    make_run(project / "runs", "a")
    make_run(project / "runs", "a2")
    (project / "runs" / "plain").mkdir()
    (project / "runs" / "plain" / "summary.json").write_text("{}")
    for argv, message in (
        (("a", "plain"), "compare: run plain has no records"),
        (("a", "nosuch"), "no run 'nosuch'"),
        (("a", "a2", "--steps", "5-6"), "no common recorded step (a: 1-2, a2: 1-2; --steps 5-6)"),
        (("a", "a", "--steps", "2-1"), "--steps '2-1'"),
        (("a", "a", "--tol", "reward=1"), "unknown tolerance 'reward'; the names: latents_rel_l2, log_probs_abs"),
        (("a", "a", "--tol", "rewards_rel_pct=much"), "'much' is not a finite non-negative number"),
        (("a", "a", "--tol", "rewards_rel_pct"), "not NAME=VALUE"),
    ):
        rc, out, err = compare(project, capsys, *argv)
        assert rc == 2 and out == "", argv
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    assert not (project / "runs" / "a" / "compare.json").exists()


def test_compare_png_says_identical_images_were_compared(project, capsys, monkeypatch):
    """Not "no recorded images" when the images were compared and every pair is bit-identical."""
    from matplotlib.axes import Axes

    shown = []
    real_text = Axes.text
    monkeypatch.setattr(Axes, "text", lambda self, x, y, s, *a, **k: shown.append(s) or real_text(self, x, y, s, *a, **k))
    make_run(project / "runs", "a")
    make_run(project / "runs", "b")
    rc, out, _ = compare(project, capsys, "a", "b")
    assert rc == 0 and "compare.png" in out
    assert "no recorded images" not in shown
    assert "images compared at 2 steps: every pair bit-identical (PSNR inf), no difference to show" in shown
