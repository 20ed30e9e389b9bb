"""Losses of reward-model training (Secrets of RLHF Part I and II).

- `preference_loss`: Bradley-Terry with an optional adaptive margin and soft labels.
- `smooth_labels`:   label smoothing of a target probability (Part II, sec. 2.5).
- `imitation_loss`:  the LM loss on the chosen response (Part I, weight beta), from summed log-probs.
"""

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
    loss = bradley_terry_terms(d, p).mean()
    with torch.no_grad():
        metrics = {
            "accuracy": (gap > 0).float().mean().item(),
            "reward_gap": gap.mean().item(),
            "reward_chosen": r_chosen.mean().item(),
            "reward_rejected": r_rejected.mean().item(),
        }
    return loss, metrics


def bradley_terry_terms(d: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Elementwise -[p log sigmoid(d) + (1 - p) log sigmoid(-d)], any shape (voting's fast mode: (B, M))."""
    return -(p * F.logsigmoid(d) + (1.0 - p) * F.logsigmoid(-d))


def smooth_labels(p: torch.Tensor, eps: float) -> torch.Tensor:
    """Label smoothing of target probabilities: p (1 - eps) + (1 - p) eps.

    A hard label p = 1 becomes 1 - eps (Part II's label smoothing); p = 0.5 (a tie) stays 0.5.
    """
    if not 0.0 <= eps < 0.5:
        raise ValueError(f"label smoothing eps must be in [0, 0.5), got {eps}")
    return p * (1.0 - eps) + (1.0 - p) * eps


def imitation_loss(logprob_sum: torch.Tensor, n_tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token NLL over all tokens of a batch of chosen responses (Part I's LM loss).

        loss = - sum_i logprob_sum_i / sum_i n_tokens_i

    logprob_sum: (B,) summed log p of each response's tokens (and eos); n_tokens: (B,) their counts.
    """
    return -logprob_sum.sum() / n_tokens.sum().clamp(min=1)
