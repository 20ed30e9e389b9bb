"""PPO-max as pure functions of tensors: KL penalty (fixed or adaptive), token rewards, reward
normalisation or scaling, GAE, running moments, losses.

Shapes: B sequences, T response tokens. `mask` (B, T) is the response mask: 1 on the response
tokens up to and including eos, 0 on the padding after it. Every function here ignores masked
positions, so nothing beyond the response ever reaches a loss.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from rlhf_core.ops import masked_mean, masked_var

KLEstimator = Literal["k1", "k3"]


# ---------------------------------------------------------------- rewards


def kl_penalty(logp: torch.Tensor, logp_ref: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL").

    k1: log pi - log pi_ref                          unbiased, can be negative per token
    k3: (r - 1) - log r, with r = pi_ref / pi        unbiased, always >= 0, lower variance
    logp, logp_ref: (B, T) -> (B, T).
    """
    if estimator == "k1":
        return logp - logp_ref
    if estimator == "k3":
        log_ratio = logp_ref - logp
        return (log_ratio.exp() - 1) - log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}: expected 'k1' or 'k3'")


def token_rewards(
    score: torch.Tensor,
    logp: torch.Tensor,
    logp_ref: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    estimator: KLEstimator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """r_t = -kl_coef * KL_t on every response token, plus the sequence score at the last one.

    score (B,), logp / logp_ref / mask (B, T) -> (rewards (B, T), kl (B, T)), both 0 where mask is 0.
    The KL is a dense per-token penalty (InstructGPT / PPO-max); the reward model only judges
    the whole response, so its score lands on the final token (eos, or the last one if truncated).
    """
    valid = mask.bool()
    mask = mask.to(logp.dtype)
    # zeros at padding, not a mask multiplied in after: k3 exponentiates, and inf * 0 would be NaN (the KL of two
    # zeros is 0 with either estimator)
    kl = kl_penalty(logp.where(valid, 0), logp_ref.where(valid, 0), estimator)  # (B, T)
    rewards = -kl_coef * kl  # (B, T)
    last = mask.sum(1).long() - 1  # (B,) index of the last response token
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    rewards[rows, last] += score.to(rewards.dtype)
    return rewards, kl


class RunningMoments:
    """Running mean and (population) std of every value seen so far, for reward normalisation.

    Batches are merged with Chan et al.'s parallel update of (count, mean, M2), which is exact
    and numerically stable: the result equals numpy's mean/std over the concatenated batches.
    """

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean

    @property
    def var(self) -> float:
        return self.m2 / self.count if self.count else 0.0

    @property
    def std(self) -> float:
        return self.var**0.5

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().double().flatten()
        n_b = x.numel()
        if n_b == 0:
            return
        mean_b = x.mean().item()
        m2_b = ((x - mean_b) ** 2).sum().item()
        n = self.count + n_b
        delta = mean_b - self.mean
        self.mean += delta * n_b / n
        self.m2 += m2_b + delta**2 * self.count * n_b / n
        self.count = n


def normalize_and_clip(
    scores: torch.Tensor, moments: RunningMoments, clip: float, eps: float = 1e-8
) -> torch.Tensor:
    """Update the running moments with `scores`, then clip((s - mean) / std, -clip, clip). (B,) -> (B,).

    PPO-max: the reward model's scale drifts and outliers dominate the advantages; normalising
    with statistics over the whole history (not per batch) keeps the scale stable.
    """
    moments.update(scores)
    normalized = (scores - moments.mean) / max(moments.std, eps)
    return normalized.clamp(-clip, clip)


def scale_and_clip(scores: torch.Tensor, moments: RunningMoments, clip: float, eps: float = 1e-8) -> torch.Tensor:
    """Reward scaling (Engstrom et al., "Implementation matters"; Part I's alternative to
    normalisation): update the running moments, then clip(s / std, -clip, clip), not centred. (B,) -> (B,)."""
    moments.update(scores)
    return (scores / max(moments.std, eps)).clamp(-clip, clip)


class AdaptiveKLController:
    """The adaptive KL coefficient of Ziegler et al. 2019 (InstructGPT itself kept a fixed one): steer the KL
    towards a target.

        error = clip(KL / target - 1, -0.2, 0.2)
        coef  = coef * (1 + error * n_steps / horizon)

    KL is the batch's mean per-sequence KL to the reference, n_steps the number of sequences.
    """

    def __init__(self, init_coef: float, target: float, horizon: int) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs target > 0 and horizon > 0, got {target} and {horizon}")
        self.value, self.target, self.horizon = init_coef, target, horizon

    def update(self, current_kl: float, n_steps: int) -> float:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value


# ---------------------------------------------------------------- learning rates


def lr_factor(step: int, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """The multiplier of a model's base learning rate at its optimiser step `step` (0-based).

    Linear warm-up from 1/warmup_steps to 1 over the first warmup_steps steps, then "constant"
    (1), "linear" (to 0 at total_steps) or "cosine" (half a cosine to 0 at total_steps).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {schedule!r}: expected constant, linear or cosine")


# ---------------------------------------------------------------- advantages


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation over response tokens (Schulman et al. 2016).

    delta_t = r_t + gamma * V_{t+1} * nonterminal_{t+1} - V_t
    A_t     = delta_t + gamma * lam * nonterminal_{t+1} * A_{t+1}
    returns = A + V
    rewards, values, mask (B, T) -> (advantages, returns), (B, T), 0 where mask is 0.
    The episode ends after the last response token: the value after it is 0.
    """
    mask = mask.to(values.dtype)
    B, T = rewards.shape
    lastgaelam = torch.zeros(B, dtype=values.dtype, device=values.device)  # (B,)
    advantages_reversed = []
    for t in reversed(range(T)):
        if t + 1 < T:
            nextnonterminal, nextvalues = mask[:, t + 1], values[:, t + 1]
        else:
            nextnonterminal, nextvalues = torch.zeros_like(lastgaelam), torch.zeros_like(lastgaelam)
        delta = rewards[:, t] + gamma * nextvalues * nextnonterminal - values[:, t]  # (B,)
        lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1) * mask  # (B, T)
    returns = (advantages + values) * mask  # (B, T)
    return advantages, returns


# ---------------------------------------------------------------- losses


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_coef: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate: mean_t max(-A * ratio, -A * clip(ratio, 1 - c, 1 + c)), ratio = pi / pi_old.

    All inputs (B, T); the mean is over valid tokens. Metrics: approx_kl (k3 estimate of
    KL(pi_old || pi), CleanRL's) and clipfrac (CleanRL's: the fraction of tokens whose ratio lies outside
    [1 - c, 1 + c]; the clip takes their gradient away only on the side their advantage pushes towards).
    """
    logratio = (logp - old_logp).where(mask.bool(), 0)  # (B, T); 0 at padding, so exp cannot overflow there
    ratio = logratio.exp()
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    loss = masked_mean(torch.max(pg_loss1, pg_loss2), mask)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1) - logratio, mask)
        clipfrac = masked_mean(((ratio - 1).abs() > clip_coef).float(), mask)
    return loss, {"approx_kl": approx_kl.item(), "clipfrac": clipfrac.item()}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float,
    clip_vloss: bool,
) -> tuple[torch.Tensor, dict[str, float]]:
    """0.5 * mean_t (V - R)^2, or with clipping 0.5 * mean_t max((V - R)^2, (V_clipped - R)^2).

    V_clipped = V_old + clip(V - V_old, -value_clip, value_clip) keeps the critic near the values
    the advantages were computed with. All inputs (B, T). Metrics: error (mean squared error,
    unclipped) and clipfrac (fraction of tokens where |V - V_old| > value_clip).
    """
    v_loss_unclipped = (values - returns) ** 2  # (B, T)
    if clip_vloss:
        v_clipped = old_values + torch.clamp(values - old_values, -value_clip, value_clip)
        v_loss_clipped = (v_clipped - returns) ** 2
        loss = 0.5 * masked_mean(torch.max(v_loss_unclipped, v_loss_clipped), mask)
    else:
        loss = 0.5 * masked_mean(v_loss_unclipped, mask)
    with torch.no_grad():
        error = masked_mean(v_loss_unclipped, mask)
        clipfrac = masked_mean(((values - old_values).abs() > value_clip).float(), mask)
    return loss, {"error": error.item(), "clipfrac": clipfrac.item()}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var[R - V] / Var[R] over valid tokens: 1 is a perfect critic, <= 0 no better than a constant.

    NaN when the returns have no variance (nothing to explain).
    """
    var_returns = masked_var(returns, mask)
    if var_returns.item() == 0:
        return float("nan")
    return (1 - masked_var(returns - values, mask) / var_returns).item()
