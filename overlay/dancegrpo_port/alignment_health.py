"""GRPO health figures of a step, over all ranks, for metrics.jsonl (every run).

- reward_std: std (unbiased, as upstream normalises) of all ranks' rewards gathered
- adv_min, adv_max: over all ranks' advantages (before upstream's clamp)
- zero_std_groups: groups whose rewards are all equal (std 0, advantages 0): with
  --use_group a prompt's generations, without it the whole gathered batch
- ratio_min, ratio_max, ratio_mean, clip_frac (ratio changed by upstream's clamp to
  [1 - clip_range, 1 + clip_range]), approx_kl (mean of 0.5 * (new - old log-prob)^2):
  over every trained (sample, timestep) of the step
- logprob_diff_max, logprob_diff_mean (|new - old log-prob|), clip_frac_first: over the
  pairs trained before the step's first optimizer update, where the policy still is the
  sampling policy and the ratio should be exactly 1 (upstream issue #57)
A figure with nothing to go over is None (JSON null).

Reductions are all_reduce MIN/MAX/SUM of float32 tensors on the training device (what
every backend - gloo, NCCL, HCCL - reduces), the rewards an all_gather.

Self-contained: torch and the standard library only.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from dancegrpo_port.contract import HEALTH_KEYS


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _reduce(values: list, op, device) -> list:
    if not _distributed():
        return values
    tensor = torch.tensor(values, dtype=torch.float32, device=device)
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


def _gather(tensor: torch.Tensor, device) -> torch.Tensor:
    tensor = tensor.detach().reshape(-1).to(device=device, dtype=torch.float32)
    if not _distributed():
        return tensor
    parts = [torch.zeros_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return torch.cat(parts)


class Health:
    def __init__(self, clip_range: float, group_size: int | None):
        self.clip_range, self.group_size = clip_range, group_size
        self.reset()

    def reset(self) -> None:
        self.rewards = self.advantages = None
        self.new, self.old, self.ratio, self.first = [], [], [], []
        self.updated = False

    def observe(self, name: str, tensor: torch.Tensor) -> None:
        if name in ("rewards", "advantages"):
            setattr(self, name, tensor.detach().reshape(-1).to(torch.float32))

    def pair(self, new_log_prob, old_log_prob, ratio) -> None:
        for store, value in ((self.new, new_log_prob), (self.old, old_log_prob), (self.ratio, ratio)):
            store.append(value.detach().reshape(-1).to(torch.float32))
        self.first.append(not self.updated)

    def stepped(self) -> None:
        self.updated = True

    def local(self) -> tuple[list, list, list]:
        """This rank's partial figures: (sums, minima, maxima), each a list of floats."""
        inf = math.inf
        sums, mins, maxs = [0.0] * 8, [inf, inf], [-inf, -inf, -inf]
        if self.ratio:
            new, old, ratio = torch.cat(self.new), torch.cat(self.old), torch.cat(self.ratio)
            first = torch.cat([torch.full_like(r, bool(f), dtype=torch.bool) for r, f in zip(self.ratio, self.first)])
            clip = self.clip_range
            clipped = ratio != torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
            diff = (new - old).abs()
            sums[:4] = [ratio.numel(), ratio.sum().item(), clipped.sum().item(), (0.5 * (new - old) ** 2).sum().item()]
            mins[0], maxs[0] = ratio.min().item(), ratio.max().item()
            if first.any():
                sums[4:7] = [first.sum().item(), diff[first].sum().item(), clipped[first].sum().item()]
                maxs[2] = diff[first].max().item()
        if self.advantages is not None and self.advantages.numel():
            mins[1], maxs[1] = self.advantages.min().item(), self.advantages.max().item()
        if self.group_size and self.rewards is not None and self.rewards.numel():
            groups = self.rewards.reshape(-1, self.group_size)
            sums[7] = (groups.max(dim=1).values == groups.min(dim=1).values).sum().item()
        return sums, mins, maxs

    def metrics(self, device=None) -> dict:
        """The figures over all ranks (a collective when torch.distributed is up)."""
        device = device if device is not None else "cpu"
        sums, mins, maxs = self.local()
        sums = _reduce(sums, dist.ReduceOp.SUM if _distributed() else None, device)
        mins = _reduce(mins, dist.ReduceOp.MIN if _distributed() else None, device)
        maxs = _reduce(maxs, dist.ReduceOp.MAX if _distributed() else None, device)
        rewards = _gather(self.rewards if self.rewards is not None else torch.zeros(0), device)
        n, ratio_sum, clipped, kl_sum, n_first, diff_sum, clipped_first, zero_groups = sums

        def per(total, count):
            return total / count if count else None

        def finite(value):
            return value if math.isfinite(value) else None

        if not self.group_size:
            zero_groups = int(rewards.numel() > 0 and bool(rewards.max() == rewards.min()))
        figures = {
            "reward_std": rewards.std().item() if rewards.numel() > 1 else None,
            "adv_min": finite(mins[1]), "adv_max": finite(maxs[1]),
            "zero_std_groups": int(zero_groups),
            "ratio_min": finite(mins[0]), "ratio_max": finite(maxs[0]), "ratio_mean": per(ratio_sum, n),
            "clip_frac": per(clipped, n), "approx_kl": per(kl_sum, n),
            "logprob_diff_max": finite(maxs[2]), "logprob_diff_mean": per(diff_sum, n_first),
            "clip_frac_first": per(clipped_first, n_first),
        }
        return {key: figures[key] for key in HEALTH_KEYS}  # the shared names, in their order
