"""Comparison pairs from per-response scores or ranks.

The Qwen report forms preference pairs from annotators' scores of several responses to one
prompt; InstructGPT expands a ranking of k responses into its k(k-1)/2 pairs. Both come down
to: for each prompt, pair its responses and let the higher score be chosen.

Input: one row per response, columns prompt_id, prompt, response_id, response, score (higher is
better; `pairs_from_ranks` takes a `rank` column instead, 1 = best, and scores it -rank).

Which pairs (score_gap = |score_a - score_b|):
- mode="all": every two responses to a prompt; mode="best_vs_worst": one pair per prompt, the
  highest against the lowest score (the lowest response_id among equals).
- a pair with score_gap > min_gap is kept, chosen = the higher score; 0 < score_gap <= min_gap
  is dropped (counted n_dropped_small_gap).
- a tie (score_gap == 0) is dropped with ties="drop" and kept with ties="keep", whatever
  min_gap, as a row with tie=True, chosen/rejected in response_id order.

Output: the comparisons table columns (n_labels = 1, label_agreement = 1.0,
pair_id = pairs.comparison_pair_id(...)) plus score_gap and tie, sorted by
(prompt_id, chosen_id, rejected_id). Report: n_prompts, n_pairs, n_ties (tied pairs met, kept
or not), n_dropped_small_gap.
"""

from __future__ import annotations

from itertools import combinations
from typing import Literal

import pandas as pd

from rlhf_core.annotation.pairs import comparison_pair_id
from rlhf_core.schemas import TABLES, validate_table

SCORE_COLUMNS = ["prompt_id", "prompt", "response_id", "response", "score"]
OUTPUT_COLUMNS = [*(c.name for c in TABLES["comparisons"].columns), "score_gap", "tie"]
MODES = ("all", "best_vs_worst")
TIES = ("drop", "keep")


def _candidates(responses: list, mode: str) -> list[tuple]:
    """Pairs (a, b) of one prompt's responses, each pair in response_id order."""
    if mode == "all":
        return list(combinations(responses, 2))
    if len(responses) < 2:
        return []
    best = max(responses, key=lambda r: r.score)  # the first, so the lowest response_id, of equals
    worst = min(responses, key=lambda r: r.score)
    if best is worst:  # every score equal: a tie between the first two
        return [(responses[0], responses[1])]
    return [tuple(sorted((best, worst), key=lambda r: r.response_id))]


def _pair(chosen, rejected, score_gap: float, tie: bool) -> dict:
    return {
        "pair_id": comparison_pair_id(chosen.prompt_id, chosen.response_id, rejected.response_id),
        "prompt_id": chosen.prompt_id,
        "prompt": chosen.prompt,
        "chosen": chosen.response,
        "rejected": rejected.response,
        "chosen_id": chosen.response_id,
        "rejected_id": rejected.response_id,
        "n_labels": 1,  # one score (or ranking) per response
        "label_agreement": 1.0,
        "score_gap": score_gap,
        "tie": tie,
    }


def pairs_from_scores(
    df: pd.DataFrame,
    min_gap: float = 0.0,
    mode: Literal["all", "best_vs_worst"] = "all",
    ties: Literal["drop", "keep"] = "drop",
) -> tuple[pd.DataFrame, dict]:
    """(pairs, report) from one row per scored response (see the module docstring)."""
    missing = [c for c in SCORE_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"missing column(s) {missing}; present: {list(df.columns)}")
    if mode not in MODES or ties not in TIES:
        raise ValueError(f"mode={mode!r}, ties={ties!r}; known: mode in {MODES}, ties in {TIES}")
    if min_gap < 0:
        raise ValueError(f"min_gap must be >= 0, got {min_gap}")
    if df["score"].isna().any():
        raise ValueError(f"{int(df['score'].isna().sum())} response(s) have no score")
    if df.duplicated(["prompt_id", "response_id"]).any():
        raise ValueError("a (prompt_id, response_id) appears more than once")

    rows, n_ties, n_dropped_small_gap = [], 0, 0
    ordered = df[SCORE_COLUMNS].sort_values(["prompt_id", "response_id"])
    for _, group in ordered.groupby("prompt_id", sort=True):
        for a, b in _candidates(list(group.itertuples(index=False)), mode):
            score_gap = float(abs(a.score - b.score))
            if score_gap == 0:
                n_ties += 1
                if ties == "keep":
                    rows.append(_pair(a, b, score_gap, tie=True))
            elif score_gap <= min_gap:
                n_dropped_small_gap += 1
            else:
                chosen, rejected = (a, b) if a.score > b.score else (b, a)
                rows.append(_pair(chosen, rejected, score_gap, tie=False))

    pairs = pd.DataFrame(rows, columns=OUTPUT_COLUMNS).astype({"score_gap": float, "tie": bool})
    pairs = pairs.sort_values(["prompt_id", "chosen_id", "rejected_id"], ignore_index=True)
    validate_table("comparisons", pairs)
    report = {
        "n_prompts": int(df["prompt_id"].nunique()),
        "n_pairs": len(pairs),
        "n_ties": n_ties,
        "n_dropped_small_gap": n_dropped_small_gap,
    }
    return pairs, report


def pairs_from_ranks(
    df: pd.DataFrame,
    min_gap: float = 0.0,
    mode: Literal["all", "best_vs_worst"] = "all",
    ties: Literal["drop", "keep"] = "drop",
) -> tuple[pd.DataFrame, dict]:
    """pairs_from_scores with score = -rank (rank 1 = best); score_gap is then a rank difference."""
    if "rank" not in df.columns:
        raise ValueError(f"no 'rank' column; present: {list(df.columns)}")
    return pairs_from_scores(df.assign(score=-df["rank"]), min_gap=min_gap, mode=mode, ties=ties)
