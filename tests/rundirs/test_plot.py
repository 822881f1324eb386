"""plot: one curve per run, labelled with the run and its device, reward and loss panels."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_runs import fake_run

from dancegrpo_npu.cli import main
from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.rundirs.plot import make_figure
from dancegrpo_npu.rundirs.rundir import load_run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def runs(tmp_path):
    (tmp_path / "upstream.lock").write_text((REPO / "upstream.lock").read_text())
    runs = tmp_path / "runs"
    gpu = fake_run(
        runs,
        "20260101-100000-gpu",
        metrics=[{"step": s, "loss": 1 / s, "reward_mean": 0.30 + s / 100} for s in (1, 2, 3)],
        environment={"devices": {"kind": "cuda", "names": ["NVIDIA H200"]}},
    )
    npu = fake_run(
        runs,
        "20260101-110000-npu",
        metrics=[{"step": s, "loss": 2 / s, "reward_mean": 0.29 + s / 100} for s in (1, 2)],
        environment={"devices": {"kind": "npu", "names": ["Ascend910B3"]}},
    )
    old = fake_run(
        runs, "20260101-120000-old", rewards=[0.2, 0.25, 0.3, 0.32], environment={"devices": {"kind": "cpu"}}
    )
    return tmp_path, [gpu, npu, old]


def test_figure_has_one_curve_per_run_with_device_labels(runs):
    _, dirs = runs
    fig = make_figure([load_run(d) for d in dirs])
    reward_ax, loss_ax = fig.axes
    assert [line.get_label() for line in reward_ax.get_lines()] == [
        "20260101-100000-gpu (cuda: NVIDIA H200 ×8)",
        "20260101-110000-npu (npu: Ascend910B3 ×8)",
        "20260101-120000-old (cpu ×8)",
    ]
    assert list(reward_ax.get_lines()[0].get_ydata()) == pytest.approx([0.31, 0.32, 0.33])
    assert list(reward_ax.get_lines()[2].get_xdata()) == [1, 2, 3, 4]  # reward.txt: one reward a step
    # the run without loss (reward.txt) has no loss curve
    assert [line.get_label() for line in loss_ax.get_lines()] == [
        "20260101-100000-gpu (cuda: NVIDIA H200 ×8)",
        "20260101-110000-npu (npu: Ascend910B3 ×8)",
    ]
    assert list(loss_ax.get_lines()[1].get_ydata()) == pytest.approx([2.0, 1.0])
    assert [t.get_text() for t in reward_ax.get_legend().get_texts()][1] == "20260101-110000-npu (npu: Ascend910B3 ×8)"


def test_cli_writes_a_png(runs, capsys):
    root, _ = runs
    out = root / "cmp.png"
    assert main(["-C", str(root), "plot", "gpu", "npu", "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    import matplotlib.image

    img = matplotlib.image.imread(out)
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 500


def test_cli_default_output_for_one_run(runs, capsys):
    root, dirs = runs
    assert main(["-C", str(root), "plot", "old"]) == 0
    assert (dirs[2] / "reward.png").is_file()


def test_plot_refuses_runs_without_rewards_and_bad_names(runs, capsys):
    root, _ = runs
    fake_run(root / "runs", "20260101-130000-empty")
    with pytest.raises(DancegrpoError, match="no rewards to plot"):
        make_figure([load_run(root / "runs" / "20260101-130000-empty")])
    assert main(["-C", str(root), "plot", "nosuchrun"]) == 2
    assert main(["-C", str(root), "plot", "gpu", "-o", str(root / "x.jpg")]) == 2
    err = capsys.readouterr().err
    assert "no run 'nosuchrun'" in err and "not a .png" in err


def test_health_panels_for_runs_that_have_the_keys(runs):
    root, dirs = runs
    health = fake_run(
        root / "runs",
        "20260101-130000-health",
        metrics=[
            {"step": 1, "loss": 1.0, "reward_mean": 0.3, "clip_frac": 0.0, "clip_frac_first": 0.0,
             "logprob_diff_max": 0.0, "ratio_min": 1.0, "ratio_max": 1.0},
            {"step": 2, "loss": 0.5, "reward_mean": 0.4, "clip_frac": 0.5, "clip_frac_first": None,
             "logprob_diff_max": 3e-5, "ratio_min": 0.99, "ratio_max": 1.02},
        ],
    )  # fmt: skip
    fig = make_figure([load_run(dirs[0]), load_run(health)])
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[2:] == [
        "clip fraction (all pairs; before the first update)",
        "|new - old log-prob| before the first update (0 expected)",
        "ratio new/old",
    ]
    clip = fig.axes[2]
    assert [line.get_label() for line in clip.get_lines()] == [
        "20260101-130000-health (npu: Ascend910B3 ×8): clip_frac",
        "20260101-130000-health (npu: Ascend910B3 ×8): clip_frac_first",
    ]
    first = clip.get_lines()[1].get_ydata()
    assert first[0] == 0.0 and first[1] != first[1]  # null is a gap, not a zero
    assert list(fig.axes[3].get_lines()[0].get_ydata()) == [0.0, 3e-5]
