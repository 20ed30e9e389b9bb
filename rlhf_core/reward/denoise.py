"""Denoising preference pairs with their voted strength (Secrets of RLHF Part II, sec. 3.2).

Per pair, with mean = the voted mean of r(chosen) - r(rejected):

- flip:    if cfg.flip and mean < 0, swap chosen and rejected; the pair's strength becomes
           -mean (the ensemble's preference now points the way of the label), else it is mean;
- smooth:  soft_label = 1 - cfg.ambiguous_smoothing for the "ambiguous" bucket, else 1.0;
- margin:  margin = cfg.margin_scale * strength if cfg.adaptive_margin, else 0.0.
- ties:    a pair kept as a tie (column `tie`) is never flipped: soft_label 0.5, margin 0.

With flipping on (the default) strength = |mean| for every pair: after the flip every label
agrees with the ensemble, and |mean| is how strongly the ensemble prefers the (now) chosen
response, so the reward model is asked for a larger gap on clear pairs and a small one on
close pairs. With flipping off, a pair with mean < 0 keeps its signed (negative) strength as
margin, the paper's `r_c - r_r - mu` with mu the mean strength: a suspect label is then pushed
less, where |mean| would push a likely-wrong label harder than a clean one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlhf_core.config import DenoiseConfig
from rlhf_core.schemas import validate_table


def denoise(
    comparisons: pd.DataFrame, votes: pd.DataFrame, cfg: DenoiseConfig
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Join comparisons with votes on pair_id and produce the "denoised" training pairs.

    comparisons: the comparisons table; votes: the votes table with the same pair_ids
    (a ValueError names the ones missing on either side). Output is in the order of
    `comparisons`, with the denoised schema plus `strength` (signed, after flipping), `mean`,
    `std`, and chosen_id/rejected_id (swapped with the texts) when the input has them.

    Metrics: n_flipped, share_flipped, n_smoothed, mean_margin.
    """
    only_c = set(comparisons["pair_id"]) - set(votes["pair_id"])
    only_v = set(votes["pair_id"]) - set(comparisons["pair_id"])
    if only_c or only_v:
        raise ValueError(
            f"comparisons and votes differ in pair_id: {len(only_c)} without votes (e.g. {sorted(only_c)[:3]}), "
            f"{len(only_v)} votes without a comparison (e.g. {sorted(only_v)[:3]})"
        )
    df = comparisons.merge(votes[["pair_id", "mean", "std", "bucket"]], on="pair_id", how="left", validate="1:1")
    mean = df["mean"].to_numpy(dtype=np.float64)  # (N,)

    # A pair annotators called a tie (ties="keep") has no direction to flip or widen: P = 0.5, no margin.
    tie = df["tie"].to_numpy(dtype=bool) if "tie" in df.columns else np.zeros(len(df), dtype=bool)  # (N,)
    flipped = (mean < 0) & ~tie if cfg.flip else np.zeros(len(df), dtype=bool)  # (N,)
    strength = np.where(flipped, -mean, mean)  # (N,)
    soft_label = np.where(df["bucket"] == "ambiguous", 1.0 - cfg.ambiguous_smoothing, 1.0)  # (N,)
    soft_label = np.where(tie, 0.5, soft_label)
    margin = cfg.margin_scale * strength if cfg.adaptive_margin else np.zeros(len(df))  # (N,)
    margin = np.where(tie, 0.0, margin)

    out = pd.DataFrame(
        {
            "pair_id": df["pair_id"],
            "prompt_id": df["prompt_id"],
            "prompt": df["prompt"],
            "chosen": df["chosen"].where(~flipped, df["rejected"]),
            "rejected": df["rejected"].where(~flipped, df["chosen"]),
            "flipped": [bool(f) for f in flipped],
            "soft_label": soft_label.astype(float),
            "margin": margin.astype(float),
            "bucket": df["bucket"],
            "strength": strength,
            "mean": mean,
            "std": df["std"].to_numpy(dtype=np.float64),
        }
    )
    if "chosen_id" in df.columns and "rejected_id" in df.columns:
        out["chosen_id"] = df["chosen_id"].where(~flipped, df["rejected_id"])
        out["rejected_id"] = df["rejected_id"].where(~flipped, df["chosen_id"])
    validate_table("denoised", out)
    n = max(len(out), 1)
    metrics = {
        "n_flipped": int(flipped.sum()),
        "share_flipped": float(flipped.sum()) / n,
        "n_smoothed": int((soft_label < 1.0).sum()),
        "mean_margin": float(margin.mean()) if len(margin) else 0.0,
    }
    return out, metrics
