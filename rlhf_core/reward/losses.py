"""Pairwise preference loss of the reward model: Bradley-Terry, adaptive margin, soft labels."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def preference_loss(
    r_chosen: torch.Tensor,
    r_rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    soft_label: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bradley-Terry loss with an optional margin and soft label (Secrets of RLHF Part II).

        d    = r_chosen - r_rejected - margin                      # (B,)
        loss = mean( -[ p * log sigmoid(d) + (1 - p) * log sigmoid(-d) ] )

    p = soft_label is the target P(chosen > rejected) (default 1: plain Bradley-Terry,
    p = 1 - eps is label smoothing); margin defaults to 0. With p = 1 and margin = 0 this is
    `-logsigmoid(r_chosen - r_rejected).mean()`.

    Args:
        r_chosen, r_rejected: (B,) scalar rewards.
        margin: (B,) or scalar, the required reward gap; None means 0.
        soft_label: (B,) or scalar in [0, 1]; None means 1.

    Returns:
        loss: scalar tensor.
        metrics: accuracy (share of pairs with r_chosen > r_rejected, margin not subtracted),
            reward_gap (mean r_chosen - r_rejected), reward_chosen, reward_rejected (means).
    """
    gap = r_chosen - r_rejected  # (B,)
    d = gap if margin is None else gap - margin  # (B,)
    p = torch.ones_like(d) if soft_label is None else torch.as_tensor(soft_label, dtype=d.dtype).expand_as(d)
    loss = -(p * F.logsigmoid(d) + (1.0 - p) * F.logsigmoid(-d)).mean()
    with torch.no_grad():
        metrics = {
            "accuracy": (gap > 0).float().mean().item(),
            "reward_gap": gap.mean().item(),
            "reward_chosen": r_chosen.mean().item(),
            "reward_rejected": r_rejected.mean().item(),
        }
    return loss, metrics
