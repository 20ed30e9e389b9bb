"""Preference strength by voting (Secrets of RLHF Part II, sec. 3.1).

M reward models are trained on the same pairs with different seeds (head init and data order).
For pair i and model m the preference strength is

    d[i, m] = r_m(prompt_i, chosen_i) - r_m(prompt_i, rejected_i)

and the pair's strength is mean_m d[i, m] with spread std_m d[i, m]. A pair whose mean is below 0
is probably mislabelled ("incorrect"), one with 0 <= mean < band is "ambiguous", the rest "normal".
"""

from __future__ import annotations

import time
from itertools import combinations
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm
import pandas as pd

from rlhf_core.config import VotingConfig
from rlhf_core.reward.train import pair_reward_diffs, train_reward_model
from rlhf_core.schemas import validate_table

BUCKETS = ("incorrect", "ambiguous", "normal")


def strength_stats(diffs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (population, ddof=0) std over models of the per-model reward differences.

    diffs: (N, M) with diffs[i, m] = r_m(chosen_i) - r_m(rejected_i).
    Returns mean (N,), std (N,).
    """
    diffs = np.asarray(diffs, dtype=np.float64)
    if diffs.ndim != 2:
        raise ValueError(f"diffs must be (N, M), got shape {diffs.shape}")
    return diffs.mean(axis=1), diffs.std(axis=1)


def bucket(mean: np.ndarray, band: float) -> list[str]:
    """'incorrect' if mean < 0, 'ambiguous' if 0 <= mean < band, else 'normal'. mean: (N,)."""
    return ["incorrect" if m < 0 else "ambiguous" if m < band else "normal" for m in np.asarray(mean)]


def sign_agreement(diffs: np.ndarray) -> float:
    """Mean over model pairs (m, l), m < l, of the share of pairs on which sign(d_m) == sign(d_l). diffs: (N, M)."""
    positive = np.asarray(diffs) > 0  # (N, M)
    M = positive.shape[1]
    if M < 2:
        return 1.0
    return float(np.mean([(positive[:, m] == positive[:, l]).mean() for m, l in combinations(range(M), 2)]))


def model_seed(seed: int, k: int) -> int:
    """Seed of the k-th voter: distinct across k and across round seeds."""
    return seed * 1000 + k


def vote(
    init_dir: str | Path,
    pairs: pd.DataFrame,
    cfg: VotingConfig,
    seed: int,
    progress: bool = False,
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Train cfg.n_models reward models on `pairs` and measure every pair's preference strength.

    pairs: the comparisons table (pair_id, prompt, chosen, rejected, ...). Each model is trained
    with cfg.train and seed `model_seed(seed, k)`, scores every pair, and is then dropped, so only
    one model is in memory at a time.

    Returns the votes table (pair_id, mean, std, diffs: list of M floats, bucket) in the order of
    `pairs`, and metrics: share_incorrect / share_ambiguous / share_normal, mean_std,
    sign_agreement, train_accuracy (mean over models), seconds, seconds_per_model.
    """
    if pairs["pair_id"].duplicated().any():
        raise ValueError("pair_id must be unique in the pairs to vote on")
    t0 = time.perf_counter()
    diffs = np.zeros((len(pairs), cfg.n_models))  # (N, M)
    train_acc = []
    for k in tqdm(range(cfg.n_models), desc="vote", unit="model", disable=not progress):
        model, tokenizer, metrics = train_reward_model(init_dir, pairs, cfg.train, model_seed(seed, k))
        diffs[:, k] = pair_reward_diffs(model, tokenizer, pairs, cfg.train.max_length)
        train_acc.append(metrics["accuracy"])
        del model
    mean, std = strength_stats(diffs)
    buckets = bucket(mean, cfg.ambiguous_band)
    votes = pd.DataFrame(
        {
            "pair_id": pairs["pair_id"].astype(str).tolist(),
            "mean": mean,
            "std": std,
            "diffs": [row.tolist() for row in diffs],
            "bucket": buckets,
        }
    )
    validate_table("votes", votes)
    seconds = time.perf_counter() - t0
    metrics = {f"share_{b}": buckets.count(b) / max(len(buckets), 1) for b in BUCKETS}
    metrics.update(
        mean_std=float(std.mean()) if len(std) else 0.0,
        sign_agreement=sign_agreement(diffs),
        train_accuracy=float(np.mean(train_acc)),
        seconds=seconds,
        seconds_per_model=seconds / cfg.n_models,
    )
    return votes, metrics
