"""What PPO's data parallelism needs: which rows are this rank's, and the three collectives it uses.

With one rank every collective is the identity, so the trainer has one code path for 1 and N processes
(torch.distributed is initialised by the worker when there are more; see rlhf_core.workers.ppo).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from rlhf_core.reward.train import all_reduce_gradients, rank_shard


@dataclass(frozen=True)
class Ranks:
    """This process's place among the data-parallel ranks."""

    rank: int = 0
    world_size: int = 1

    def shard(self, n: int) -> range:
        """This rank's contiguous share of n items in order (sizes differ by at most one)."""
        rows = rank_shard(np.arange(n), self.rank, self.world_size)
        return range(int(rows[0]), int(rows[-1]) + 1) if len(rows) else range(0)

    def sum_metrics(self, parts: dict[str, float]) -> dict[str, float]:
        """Each metric summed over the ranks (one collective): the ranks' weighted parts make the global value."""
        if self.world_size == 1:
            return parts
        # NCCL reduces GPU tensors only: this rank's own GPU (the launcher sets it current)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        totals = torch.tensor(list(parts.values()), dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        return dict(zip(parts, totals.tolist()))

    def sum_gradients(self, model: torch.nn.Module) -> None:
        """Sum the gradients over the ranks; a parameter this rank's batch did not reach adds zeros."""
        if self.world_size == 1:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        all_reduce_gradients(params)

    def gather(self, part: dict) -> list[dict]:
        """Every rank's `part` (tensors on the CPU), in rank order."""
        if self.world_size == 1:
            return [part]
        parts: list[dict | None] = [None] * self.world_size
        dist.all_gather_object(parts, part)
        return parts


def pad_cat(tensors: list[torch.Tensor], value: float, left: bool = False) -> torch.Tensor:
    """Concatenate (b_i, T_i) tensors along the rows, padded with `value` to the widest T on the right
    (or on the left, as queries are) -> (sum b_i, max T_i); 1-D tensors are concatenated as they are."""
    if tensors[0].dim() == 1:
        return torch.cat(tensors)
    width = max(t.shape[1] for t in tensors)
    padded = []
    for t in tensors:
        pad = t.new_full((t.shape[0], width - t.shape[1]), value)
        padded.append(torch.cat([pad, t] if left else [t, pad], dim=1))
    return torch.cat(padded)
