"""Human-labelled pairs kept out of voting, denoising and reward training, to measure the reward model on.

Real annotations have no gold: the one measure of a reward model trained on them is how often it agrees with
labels it never learned from, directly or through the voters that chose its flips and margins. `held_out` picks a
fixed share of the prompts (every pair of a held-out prompt: pairs of one prompt share responses, so a split by
pair would leak them) by a hash of the prompt's text, so a prompt is on the same side in every stage, seed, process
and round, pairs accumulated over rounds never cross sides, and a text asked twice under two prompt_ids (a pool
that repeats prompts, a real prompt log) is on one side: split by prompt_id, two thirds of the demo's held-out
pairs had their prompt text in training, and one in sixteen was a training pair itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np
import pandas as pd

from rlhf_core.annotation.label_studio import comparable_text

SALT = "rlhf-holdout"  # the side of a prompt does not follow any other hash of it (sampling, ids)


class HoldoutError(ValueError):
    """The split leaves one side empty; the message says what to change."""


def held_out(prompts: Iterable[str], fraction: float) -> np.ndarray:
    """(N,) bool: the rows whose prompt text falls in the held-out share `fraction` of all prompts (0 = none).

    A prompt's side is the hash of its text as a reader compares it (NFC, trimmed), read as a number in [0, 1),
    below `fraction`: raising the fraction only adds prompts to the held-out side."""
    texts = [comparable_text(str(p)) for p in prompts]
    if fraction <= 0:
        return np.zeros(len(texts), dtype=bool)
    u = np.array([int.from_bytes(hashlib.sha256(f"{SALT}|{t}".encode()).digest()[:8], "big") / 2.0**64
                  for t in texts], dtype=np.float64)
    return u < fraction


def training_side(pairs: pd.DataFrame, fraction: float, key: str = "reward.holdout_fraction") -> pd.DataFrame:
    """The pairs of prompts not held out (the same row order); refuses to leave nothing to train on."""
    keep = ~held_out(pairs["prompt"], fraction)
    if len(pairs) and not keep.any():
        raise HoldoutError(f"{key} {fraction} holds out every one of the {pairs['prompt'].nunique()} prompts' "
                           f"{len(pairs)} pairs: nothing is left to train on; lower {key}")
    return pairs[keep].reset_index(drop=True)


def held_out_side(pairs: pd.DataFrame, fraction: float, key: str = "reward.holdout_fraction") -> pd.DataFrame:
    """The pairs of held-out prompts that carry a preference (annotators' ties left out); refuses an empty side."""
    side = pairs[held_out(pairs["prompt"], fraction)]
    decided = side[~_ties(side)].reset_index(drop=True)
    if decided.empty:
        raise HoldoutError(f"{key} {fraction} holds out no pair with a preference ({len(side)} of {len(pairs)} "
                           f"pairs, ties included, over {pairs['prompt'].nunique()} prompts): raise {key} or "
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
    unanimous = unanimous_labels(pairs)
    if unanimous.any():
        report |= {"accuracy_unanimous": float(agree[unanimous].mean()), "n_unanimous": int(unanimous.sum())}
    return report


def unanimous_labels(pairs: pd.DataFrame) -> np.ndarray:
    """(N,) bool: pairs that two or more annotators labelled and all agreed on (none without those columns)."""
    if not {"n_labels", "label_agreement"} <= set(pairs.columns):
        return np.zeros(len(pairs), dtype=bool)
    return (pairs["n_labels"].to_numpy() >= 2) & (pairs["label_agreement"].to_numpy() >= 1.0)


def _ties(pairs: pd.DataFrame) -> np.ndarray:
    """(N,) bool: pairs the annotators called a tie (annotation.ties: keep); they have no direction to agree with."""
    if "tie" in pairs.columns:
        return pairs["tie"].fillna(False).to_numpy(dtype=bool)
    return np.zeros(len(pairs), dtype=bool)
