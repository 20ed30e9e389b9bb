"""Human-labelled pairs kept out of voting, denoising and reward training, to measure the reward model on.

Real annotations have no gold: the one measure of a reward model trained on them is how often it agrees with
labels it never learned from, directly or through the voters that chose its flips and margins. `held_out` picks a
fixed share of the prompts (every pair of a held-out prompt: pairs of one prompt share responses, so a split by
pair would leak them) by a hash of the prompt_id, so a prompt is on the same side in every stage, seed, process
and round, and pairs accumulated over rounds never cross sides.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np
import pandas as pd

SALT = "rlhf-holdout"  # the side of a prompt does not follow any other hash of its id (sampling, response ids)


class HoldoutError(ValueError):
    """The split leaves one side empty; the message says what to change."""


def held_out(prompt_ids: Iterable[str], fraction: float) -> np.ndarray:
    """(N,) bool: the rows whose prompt falls in the held-out share `fraction` of all prompt ids (0 = none).

    A prompt id's side is its hash read as a number in [0, 1) below `fraction`: raising the fraction only adds
    prompts to the held-out side."""
    ids = [str(p) for p in prompt_ids]
    if fraction <= 0:
        return np.zeros(len(ids), dtype=bool)
    u = np.array([int.from_bytes(hashlib.sha256(f"{SALT}|{p}".encode()).digest()[:8], "big") / 2.0**64
                  for p in ids], dtype=np.float64)
    return u < fraction


def training_side(pairs: pd.DataFrame, fraction: float, key: str = "reward.holdout_fraction") -> pd.DataFrame:
    """The pairs of prompts not held out (the same row order); refuses to leave nothing to train on."""
    keep = ~held_out(pairs["prompt_id"], fraction)
    if len(pairs) and not keep.any():
        raise HoldoutError(f"{key} {fraction} holds out every one of the {pairs['prompt_id'].nunique()} prompts' "
                           f"{len(pairs)} pairs: nothing is left to train on; lower {key}")
    return pairs[keep].reset_index(drop=True)


def held_out_side(pairs: pd.DataFrame, fraction: float, key: str = "reward.holdout_fraction") -> pd.DataFrame:
    """The pairs of held-out prompts that carry a preference (annotators' ties left out); refuses an empty side."""
    side = pairs[held_out(pairs["prompt_id"], fraction)]
    decided = side[~_ties(side)].reset_index(drop=True)
    if decided.empty:
        raise HoldoutError(f"{key} {fraction} holds out no pair with a preference ({len(side)} of {len(pairs)} "
                           f"pairs, ties included, over {pairs['prompt_id'].nunique()} prompts): raise {key} or "
                           "set it to 0 (no held-out measure)")
    return decided


def agreement_with_labels(diffs: np.ndarray, pairs: pd.DataFrame) -> dict[str, float]:
    """How often r(chosen) - r(rejected) > 0 on pairs whose label is the annotators' (`held_out_side`'s rows).

    accuracy: over all of them (a difference of exactly 0 is no agreement); accuracy_unanimous and n_unanimous:
    over the pairs that two or more annotators labelled and all agreed on (crowd labels are noisy; these less so),
    present when there are any."""
    diffs = np.asarray(diffs, dtype=np.float64)  # (N,)
    agree = diffs > 0
    report = {"accuracy": float(agree.mean()), "n_pairs": int(len(diffs))}
    if {"n_labels", "label_agreement"} <= set(pairs.columns):
        unanimous = (pairs["n_labels"].to_numpy() >= 2) & (pairs["label_agreement"].to_numpy() >= 1.0)
        if unanimous.any():
            report |= {"accuracy_unanimous": float(agree[unanimous].mean()), "n_unanimous": int(unanimous.sum())}
    return report


def _ties(pairs: pd.DataFrame) -> np.ndarray:
    """(N,) bool: pairs the annotators called a tie (annotation.ties: keep); they have no direction to agree with."""
    if "tie" in pairs.columns:
        return pairs["tie"].fillna(False).to_numpy(dtype=bool)
    return np.zeros(len(pairs), dtype=bool)
