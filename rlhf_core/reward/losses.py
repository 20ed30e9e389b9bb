"""Losses of reward-model training (Secrets of RLHF Part I and II).

- `preference_loss`: Bradley-Terry with an optional adaptive margin and soft labels.
- `smooth_labels`:   label smoothing of a target probability (Part II, sec. 2.5).
- `imitation_loss`:  the LM loss on the chosen response (Part I, weight beta), from summed log-probs.
- `info_nce`, `contrastive_samples`: SimCSE's contrastive loss (Part II sec. 3.1.1) over two dropout
  views of the responses or of the chosen - rejected differences.
- `difference_loss`: MetaRM's J (Part II sec. 3.2), how far apart the rewards of a prompt's policy
  samples are; the meta step ascends it before the Bradley-Terry descent (rlhf_core/reward/train.py).
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
    p = (torch.ones_like(d) if soft_label is None
         else torch.as_tensor(soft_label, dtype=d.dtype, device=d.device).expand_as(d))
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


def info_nce(view_a: torch.Tensor, view_b: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCSE's InfoNCE: row i of view_b is the positive of row i of view_a, every other row a negative.

        sim_ij = cos(a_i, b_j) / tau
        loss   = mean_i -log( exp(sim_ii) / sum_j exp(sim_ij) )

    view_a, view_b: (N, H), the same N samples encoded twice with dropout.
    """
    if view_a.shape != view_b.shape or view_a.dim() != 2:
        raise ValueError(f"info_nce needs two (N, H) views of the same samples, got {tuple(view_a.shape)} "
                         f"and {tuple(view_b.shape)}")
    sim = F.normalize(view_a, dim=-1) @ F.normalize(view_b, dim=-1).T / temperature  # (N, N)
    return F.cross_entropy(sim, torch.arange(len(sim), device=sim.device))


def contrastive_samples(h_chosen: torch.Tensor, h_rejected: torch.Tensor, positives: str) -> torch.Tensor:
    """The samples SimCSE contrasts (Part II sec. 3.1.1's two choices), from (B, H) representations.

    "responses":   every response on its own, (2B, H): chosen rows then rejected rows;
    "differences": each pair's h_chosen - h_rejected, (B, H).
    """
    if positives == "responses":
        return torch.cat([h_chosen, h_rejected])
    if positives == "differences":
        return h_chosen - h_rejected
    raise ValueError(f"unknown contrastive positives {positives!r}; known: responses, differences")


def difference_loss(rewards: torch.Tensor) -> torch.Tensor:
    """MetaRM's difference loss J of k policy samples per prompt (to be maximised).

        J = mean over prompts of  2 / (k (k - 1)) * sum_{i<j} sigmoid(|r_i - r_j|)

    rewards: (P, k), k >= 2. J lies in [0.5, 1): 0.5 when the model scores a prompt's samples alike.
    The paper writes the sum over i < j; we average it (the 2 / (k (k - 1))) so the meta step size
    does not depend on k.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"difference_loss needs (prompts, k >= 2) rewards, got {tuple(rewards.shape)}")
    i, j = torch.triu_indices(rewards.shape[1], rewards.shape[1], offset=1)
    return torch.sigmoid((rewards[:, i] - rewards[:, j]).abs()).mean()
