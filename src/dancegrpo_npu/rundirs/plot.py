"""``dancegrpo-npu plot RUN [RUN...]``: reward, loss and GRPO health per step of one or more runs, to a PNG.

Several runs go on one figure (a GPU run beside an NPU run), each curve labelled with the
run's name and the device it ran on.  Figures come from metrics.jsonl (contract 4), or from
upstream's reward.txt when a run has no metrics.jsonl (then there is no loss curve).  The GRPO
health keys (alignment contract: clip fraction, ratios, log-prob difference before the first
update, ...) get a panel each group, when some run has them; so do the phase times (seconds per
step of each phase of the contract: rollout, decode, reward, train, and the condition phase of an
image-to-video trainer's first frame), one line per run and phase, when some run has them.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.rundirs.rundir import TIMED_PHASES, RunInfo, read_metrics

# (panel title, metrics.jsonl keys drawn in it), in the order the panels appear
HEALTH_PANELS = (
    ("grad norm", ("grad_norm",)),
    ("clip fraction (all pairs; before the first update)", ("clip_frac", "clip_frac_first")),
    ("|new - old log-prob| before the first update (0 expected)", ("logprob_diff_max", "logprob_diff_mean")),
    ("ratio new/old", ("ratio_min", "ratio_mean", "ratio_max")),
    ("approx KL", ("approx_kl",)),
    ("advantages", ("adv_min", "adv_max")),
    ("reward std; groups with reward std 0", ("reward_std", "zero_std_groups")),
)


def make_figure(runs: list[RunInfo]):
    """A matplotlib Figure: reward per step on top, loss below when any run has loss."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display (clusters have none)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    metrics = [(run, read_metrics(run.path)) for run in runs]
    plotted = [(run, m) for run, m in metrics if m.reward]
    if not plotted:
        names = ", ".join(run.name for run in runs)
        raise DancegrpoError(
            f"no rewards to plot in {names}", "a run writes reward.txt / metrics.jsonl from its first step on"
        )
    with_loss = [(run, m) for run, m in plotted if m.loss]
    panels = [(title, keys) for title, keys in HEALTH_PANELS if any(k in m.health for _, m in plotted for k in keys)]
    timed = [(run, m) for run, m in plotted if m.phase_time]
    rows = (2 if with_loss else 1) + bool(timed) + len(panels)
    fig, axes = plt.subplots(rows, 1, figsize=(9, 4 * min(rows, 2) + 2.5 * max(rows - 2, 0)), sharex=True,
                             squeeze=False)  # fmt: skip
    reward_ax = axes[0][0]
    for run, m in plotted:
        reward_ax.plot(m.steps, m.reward, marker="." if len(m.steps) < 50 else None, label=run.label)
    reward_ax.set_ylabel("reward (mean per step)")
    reward_ax.set_title("DanceGRPO reward" + (" and loss" if with_loss else ""))
    reward_ax.grid(True, alpha=0.3)
    reward_ax.legend(fontsize="small")
    if with_loss:
        loss_ax = axes[1][0]
        for run, m in with_loss:
            loss_ax.plot(m.steps, m.loss, marker="." if len(m.steps) < 50 else None, label=run.label)
        loss_ax.set_ylabel("loss")
        loss_ax.grid(True, alpha=0.3)
        loss_ax.legend(fontsize="small")
    if timed:
        _phase_panel(axes[rows - len(panels) - 1][0], timed)
    for (title, keys), row in zip(panels, axes[rows - len(panels) :]):
        ax = row[0]
        for run, m in plotted:
            for key in keys:
                if key in m.health:
                    values = [float("nan") if v is None else v for v in m.health[key]]  # null: a gap
                    ax.plot(m.steps, values, marker="." if len(m.steps) < 50 else None, label=f"{run.label}: {key}")
        ax.set_title(title, fontsize="medium")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")
    axes[-1][0].set_xlabel("step")
    axes[-1][0].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def _phase_panel(ax, timed) -> None:
    """Seconds per step of each phase: lines, not a stack, so that several runs can share the panel."""
    # the phase by line style, the run by colour
    styles = dict(zip(TIMED_PHASES, itertools.cycle(("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1))))))
    for i, (run, m) in enumerate(timed):
        for phase in TIMED_PHASES:
            if phase in m.phase_time:
                values = [float("nan") if v is None else v for v in m.phase_time[phase]]
                ax.plot(m.steps, values, linestyle=styles[phase], color=f"C{i}", marker="." if len(m.steps) < 50 else None,
                        label=f"{run.label}: {phase}")  # fmt: skip
    ax.set_title("time per phase (s per step)", fontsize="medium")
    ax.set_ylabel("seconds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")


def plot_runs(runs: list[RunInfo], output: Path) -> Path:
    import matplotlib.pyplot as plt

    fig = make_figure(runs)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output
