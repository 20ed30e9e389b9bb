"""Win / tie / lose and mean grades with bootstrap confidence intervals, and agreement between judges.

The percentile bootstrap over prompts (Efron 1979): resample the n judged prompts with
replacement B times, take each resample's win/tie/lose shares (or mean grade), and read the
interval from the (1 - level)/2 and (1 + level)/2 quantiles of those B values.
"""

from __future__ import annotations

import numpy as np

from rlhf_core.judge.protocol import VERDICTS, summarize


def bootstrap_rates(verdicts: list[str], n_boot: int = 1000, seed: int = 0,
                    level: float = 0.95) -> dict[str, tuple[float, float, float]]:
    """{"win": (rate, lo, hi), "tie": ..., "lose": ...}: shares of n and their percentile-bootstrap interval.

    Seeded: equal inputs and seed give equal intervals. NaN everywhere when there are no verdicts.
    """
    _check_bootstrap(n_boot, level)
    rates = summarize(list(verdicts))  # also refuses unknown verdicts
    n = rates["n"]
    if n == 0:
        return {v: (float("nan"),) * 3 for v in VERDICTS}
    chosen = np.asarray(verdicts)[_resamples(n, n_boot, seed)]  # (B, n)
    out = {}
    for v in VERDICTS:
        shares = (chosen == v).mean(axis=1)  # (B,)
        lo, hi = np.quantile(shares, [(1 - level) / 2, (1 + level) / 2])
        out[v] = (rates[f"{v}_rate"], float(lo), float(hi))
    return out


def _check_bootstrap(n_boot: int, level: float) -> None:
    if not 0 < level < 1 or n_boot < 1:
        raise ValueError(f"level must be in (0, 1) and n_boot >= 1, got {level}, {n_boot}")


def _resamples(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(B, n) indices into n items: B resamples with replacement, seeded."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def bootstrap_mean(values: list[float], n_boot: int = 1000, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi) of the values that are not NaN (unparsed grades), with the percentile-bootstrap interval
    of the mean over them. Seeded; NaN everywhere when no value is left."""
    _check_bootstrap(n_boot, level)
    kept = np.asarray(values, dtype=float)
    kept = kept[~np.isnan(kept)]
    if kept.size == 0:
        return (float("nan"),) * 3
    means = kept[_resamples(kept.size, n_boot, seed)].mean(axis=1)  # (B,)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(kept.mean()), float(lo), float(hi)


def agreement(verdicts_1: list[str], verdicts_2: list[str]) -> float:
    """Share of pairs on which two judges give the same verdict (NaN when there are none)."""
    if len(verdicts_1) != len(verdicts_2):
        raise ValueError(f"the two judges scored {len(verdicts_1)} and {len(verdicts_2)} pairs: not the same pairs")
    if not verdicts_1:
        return float("nan")
    return float(np.mean([a == b for a, b in zip(verdicts_1, verdicts_2)]))


def verdict_metrics(verdicts: list[str], n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
    """win_rate, win_rate_lo, win_rate_hi (and tie, lose) and n: the headline of a comparison."""
    metrics: dict[str, float] = {"n": float(len(verdicts))}
    for v, (rate, lo, hi) in bootstrap_rates(verdicts, n_boot, seed).items():
        metrics |= {f"{v}_rate": rate, f"{v}_rate_lo": lo, f"{v}_rate_hi": hi}
    return metrics
