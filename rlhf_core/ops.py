"""Tiny pure tensor helpers shared by every loss: masked reductions, log-probs, entropy.

Invariant of the masked helpers: positions where `mask == 0` never influence the result
(their values may be anything finite), so padded tokens can be left as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(x * mask) / sum(mask), over `dim` (all elements when None).

    x, mask: same shape (mask is 0/1, any dtype). A slice with no valid element gives 0,
    not NaN, because the denominator is clamped to 1.
    """
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the valid elements of x: masked_mean((x - mean)^2), times n / (n - 1) if unbiased."""
    mask = mask.to(x.dtype)
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        var = var * n / (n - 1).clamp(min=1.0)  # Bessel's correction; one element keeps var = 0
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the valid elements; shift_mean=False adds the mean back.

    Used for advantage normalisation; the result at masked positions is meaningless (multiply by
    the mask where it matters).
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[labels]: logits (B, T, V), labels (B, T) -> (B, T)."""
    logp = F.log_softmax(logits, dim=-1)  # (B, T, V)
    return torch.gather(logp, -1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) * z over the vocabulary: (B, T, V) -> (B, T)."""
    pd = F.softmax(logits, dim=-1)  # (B, T, V)
    return torch.logsumexp(logits, dim=-1) - (pd * logits).sum(-1)
