"""Pairs from per-response scores and ranks, on hand-made prompts."""

import hashlib

import pandas as pd
import pytest

from rlhf_core.annotation.scores import pairs_from_ranks, pairs_from_scores
from rlhf_core.schemas import validate_table


def responses(scores: list[float], column: str = "score", prompt_id: str = "p1") -> pd.DataFrame:
    """One prompt's responses r1, r2, ... ("answer 1", ...) with the given scores (or ranks)."""
    return pd.DataFrame({
        "prompt_id": prompt_id,
        "prompt": "q",
        "response_id": [f"r{i}" for i in range(1, len(scores) + 1)],
        "response": [f"answer {i}" for i in range(1, len(scores) + 1)],
        column: scores,
    })


def triples(pairs: pd.DataFrame) -> list[tuple]:
    return list(zip(pairs["chosen_id"], pairs["rejected_id"], pairs["score_gap"]))


def test_all_pairs_of_three_scores():
    pairs, report = pairs_from_scores(responses([3, 1, 2]))
    assert triples(pairs) == [("r1", "r2", 2.0), ("r1", "r3", 1.0), ("r3", "r2", 1.0)]
    assert pairs["chosen"].tolist() == ["answer 1", "answer 1", "answer 3"]
    assert not pairs["tie"].any()
    assert report == {"n_prompts": 1, "n_pairs": 3, "n_ties": 0, "n_dropped_small_gap": 0}
    validate_table("comparisons", pairs)
    expected_id = "c" + hashlib.sha256(b"p1|r1|r2").hexdigest()[:16]
    assert pairs["pair_id"].iloc[0] == expected_id
    assert (pairs["n_labels"] == 1).all() and (pairs["label_agreement"] == 1.0).all()


def test_min_gap_keeps_only_the_wide_pair():
    pairs, report = pairs_from_scores(responses([3, 1, 2]), min_gap=1.5)
    assert triples(pairs) == [("r1", "r2", 2.0)]
    assert report["n_dropped_small_gap"] == 2


def test_best_vs_worst_is_one_pair_per_prompt():
    two_prompts = pd.concat([responses([3, 1, 2]), responses([0.5, 4.0], prompt_id="p2")])
    pairs, report = pairs_from_scores(two_prompts, mode="best_vs_worst")
    assert list(zip(pairs["prompt_id"], pairs["chosen_id"], pairs["rejected_id"], pairs["score_gap"])) == [
        ("p1", "r1", "r2", 2.0), ("p2", "r2", "r1", 3.5),
    ]  # fmt: skip
    assert report["n_prompts"] == 2


def test_ties_dropped_or_kept():
    dropped, report = pairs_from_scores(responses([2, 2]))
    assert dropped.empty and report["n_ties"] == 1 and report["n_pairs"] == 0
    kept, report = pairs_from_scores(responses([2, 2]), ties="keep")
    assert triples(kept) == [("r1", "r2", 0.0)] and kept["tie"].tolist() == [True]
    assert report == {"n_prompts": 1, "n_pairs": 1, "n_ties": 1, "n_dropped_small_gap": 0}
    kept, _ = pairs_from_scores(responses([2, 2]), mode="best_vs_worst", ties="keep")
    assert triples(kept) == [("r1", "r2", 0.0)]


def test_ranks_expand_to_all_pairs_with_rank_one_chosen():
    pairs, report = pairs_from_ranks(responses([1, 2, 3], column="rank"))
    assert triples(pairs) == [("r1", "r2", 1.0), ("r1", "r3", 2.0), ("r2", "r3", 1.0)]
    assert report["n_pairs"] == 3


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="missing column"):
        pairs_from_scores(responses([1, 2]).drop(columns="score"))
    with pytest.raises(ValueError, match="mode="):
        pairs_from_scores(responses([1, 2]), mode="best")
    with pytest.raises(ValueError, match="min_gap"):
        pairs_from_scores(responses([1, 2]), min_gap=-1)
    with pytest.raises(ValueError, match="no score"):
        pairs_from_scores(responses([1, float("nan")]))
