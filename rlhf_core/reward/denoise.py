"""Denoising preference pairs with their voted strength (Secrets of RLHF Part II, sec. 2.5 and 3.2).

Per pair, with mean = the voted mean of r(chosen) - r(rejected), z = mean / scale (scale = the
std of the means over pairs, see voting.strength_scale), p = the annotators' own target
P(chosen > rejected) (column soft_label, 1 when absent) and the vote's bucket:

    method             'incorrect' pairs                       margin
    baseline           as labelled                             0
    flip               label reversed (P(orig. order) = 1 - p)  0
    margin             as labelled                             margin_scale * z
    flip_margin        label reversed                          margin_scale * z', z' = z after the flip (-z if flipped)
    soft_label_margin  p -> p * sigmoid(z) + (1-p) * (1-sigmoid(z))  margin_scale * z

A reversed label is stored with chosen/rejected swapped and the soft label unchanged (p in the
new order is 1 - p in the original one), so the annotators' confidence carries over.
Every method but baseline smooths 'ambiguous' pairs: p -> p (1 - eps) + (1 - p) eps.
A pair kept as a tie (column `tie`) is never flipped: p = 0.5, margin 0.

z is dimensionless, so the margin is `margin_scale` nats of the reward model trained on the pairs
for a pair one standard deviation of strength above zero, whatever the voters' scale. Without a
flip a suspect pair keeps its signed (negative) margin, the paper's r_c - r_r - mu: it is pushed
less, where |mu| would push a likely-wrong label harder than a clean one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlhf_core.config import DenoiseConfig
from rlhf_core.schemas import validate_table

FLIPPING = ("flip", "flip_margin")
WITH_MARGIN = ("margin", "flip_margin", "soft_label_margin")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def denoise(
    comparisons: pd.DataFrame, votes: pd.DataFrame, cfg: DenoiseConfig
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Join comparisons with votes on pair_id and produce the "denoised" training pairs.

    comparisons: the comparisons table; votes: the votes table with the same pair_ids
    (a ValueError names the ones missing on either side). Output is in the order of
    `comparisons`, with the denoised schema plus `strength` (signed, after flipping), `mean`,
    `z`, `std`, and chosen_id/rejected_id (swapped with the texts) when the input has them.

    Metrics: n_flipped, share_flipped, n_smoothed, n_soft_labelled, mean_margin, margin_abs_mean.
    """
    only_c = set(comparisons["pair_id"]) - set(votes["pair_id"])
    only_v = set(votes["pair_id"]) - set(comparisons["pair_id"])
    if only_c or only_v:
        raise ValueError(
            f"comparisons and votes differ in pair_id: {len(only_c)} without votes (e.g. {sorted(only_c)[:3]}), "
            f"{len(only_v)} votes without a comparison (e.g. {sorted(only_v)[:3]})"
        )
    vote_cols = ["pair_id", "mean", "std", "bucket"] + (["z"] if "z" in votes.columns else [])
    df = comparisons.drop(columns=[c for c in ("mean", "std", "bucket", "z") if c in comparisons.columns])
    df = df.merge(votes[vote_cols], on="pair_id", how="left", validate="1:1")
    mean = df["mean"].to_numpy(dtype=np.float64)  # (N,)
    z = df["z"].to_numpy(dtype=np.float64) if "z" in df.columns else mean  # (N,) old votes: unit scale
    n = len(df)

    # A pair annotators called a tie (ties="keep") has no direction to flip or widen: P = 0.5, no margin.
    tie = df["tie"].to_numpy(dtype=bool) if "tie" in df.columns else np.zeros(n, dtype=bool)  # (N,)
    p = df["soft_label"].to_numpy(dtype=np.float64) if "soft_label" in df.columns else np.ones(n)  # (N,)
    p = np.where(np.isnan(p), 1.0, p)
    incorrect = (df["bucket"] == "incorrect").to_numpy() & ~tie  # (N,)
    ambiguous = (df["bucket"] == "ambiguous").to_numpy() & ~tie  # (N,)

    # Flipping reverses the label: the target for the original order becomes 1 - p. Stored with
    # chosen/rejected swapped, that target reads p again, so the column keeps the annotators' value.
    flipped = incorrect if cfg.method in FLIPPING else np.zeros(n, dtype=bool)
    soft_labelled = incorrect if cfg.method == "soft_label_margin" else np.zeros(n, dtype=bool)
    q = _sigmoid(z)  # the ensemble's preference for chosen, read in units of the strength scale (not sigmoid(mean))
    p = np.where(soft_labelled, p * q + (1.0 - p) * (1.0 - q), p)
    smoothed = ambiguous if cfg.method != "baseline" and cfg.ambiguous_smoothing > 0 else np.zeros(n, dtype=bool)
    eps = cfg.ambiguous_smoothing
    p = np.where(smoothed, p * (1.0 - eps) + (1.0 - p) * eps, p)
    p = np.where(tie, 0.5, p)

    strength = np.where(flipped, -z, z)  # (N,) after the flip, in units of scale
    margin = cfg.margin_scale * strength if cfg.method in WITH_MARGIN else np.zeros(n)  # (N,)
    margin = np.where(tie, 0.0, margin)

    out = pd.DataFrame(
        {
            "pair_id": df["pair_id"],
            "prompt_id": df["prompt_id"],
            "prompt": df["prompt"],
            "chosen": df["chosen"].where(~flipped, df["rejected"]),
            "rejected": df["rejected"].where(~flipped, df["chosen"]),
            "flipped": [bool(f) for f in flipped],
            "soft_label": p.astype(float),
            "margin": margin.astype(float),
            "bucket": df["bucket"],
            "strength": strength,
            "mean": mean,
            "z": z,
            "std": df["std"].to_numpy(dtype=np.float64),
        }
    )
    if "chosen_id" in df.columns and "rejected_id" in df.columns:
        out["chosen_id"] = df["chosen_id"].where(~flipped, df["rejected_id"])
        out["rejected_id"] = df["rejected_id"].where(~flipped, df["chosen_id"])
    if "tie" in df.columns:
        out["tie"] = tie
    validate_table("denoised", out)
    denom = max(n, 1)
    metrics = {
        "n_flipped": int(flipped.sum()),
        "share_flipped": float(flipped.sum()) / denom,
        "n_smoothed": int(smoothed.sum()),
        "n_soft_labelled": int(soft_labelled.sum()),
        "mean_margin": float(margin.mean()) if n else 0.0,
        "margin_abs_mean": float(np.abs(margin).mean()) if n else 0.0,
    }
    return out, metrics
