"""The human-labelled pairs held out to measure a reward model trained on real annotations (reward/holdout.py)."""

import hashlib

import numpy as np
import pandas as pd
import pytest

from rlhf_core.reward.holdout import (HoldoutError, agreement_with_labels, held_out, held_out_side,
                                      training_side)


def _side_by_hand(prompt_id: str) -> float:
    digest = hashlib.sha256(f"rlhf-holdout|{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _pairs(prompts, **columns) -> pd.DataFrame:
    n = len(prompts)
    return pd.DataFrame({"pair_id": [f"c{i}" for i in range(n)], "prompt_id": [f"id{i}" for i in range(n)],
                         "prompt": prompts, "chosen": ["a"] * n, "rejected": ["b"] * n} | columns)


def test_a_prompts_side_is_its_hash_below_the_fraction_whatever_the_order_or_company():
    ids = [f"p{i:04d}" for i in range(2000)]
    mask = held_out(ids, 0.1)
    assert mask.tolist() == [_side_by_hand(p) < 0.1 for p in ids]
    assert 0.08 < mask.mean() < 0.12  # a uniform hash: about the fraction asked for
    shuffled = list(reversed(ids[:50])) + ["p0001"]  # order, company and repeats change nothing
    assert held_out(shuffled, 0.1).tolist() == [_side_by_hand(p) < 0.1 for p in shuffled]
    assert not held_out(ids, 0.0).any()
    assert (held_out(ids, 0.1) <= held_out(ids, 0.2)).all()  # a larger fraction only adds prompts


def test_every_pair_of_a_prompt_text_is_on_one_side_whatever_its_prompt_id_and_the_sides_partition_the_pairs():
    """A text asked under several prompt_ids (the simulated pool repeats texts; so does a real prompt log) was split
    by prompt_id: two thirds of the demo's held-out pairs had their prompt text in training."""
    texts = [f"What is {i % 40} plus 1?" for i in range(400)]  # 10 pairs per text, each under its own prompt_id
    pairs = _pairs(texts)
    train = training_side(pairs, 0.25)
    held = held_out_side(pairs, 0.25)
    assert set(train["prompt"]).isdisjoint(held["prompt"])
    assert sorted(train["pair_id"].tolist() + held["pair_id"].tolist()) == sorted(pairs["pair_id"])
    assert held.groupby("prompt").size().eq(10).all()
    assert training_side(pairs, 0.0).equals(pairs)
    composed = [f"Caf\u00e9 {i}?" for i in range(40)]  # one text as exports write it: Unicode form, spaces
    decomposed = [f" Cafe\u0301 {i}?\n" for i in range(40)]
    assert held_out(composed, 0.5).tolist() == held_out(decomposed, 0.5).tolist()


def test_ties_are_never_measured_against_and_an_empty_side_is_refused_with_what_to_change():
    ids = [f"p{i}" for i in range(200)]
    held_ids = [p for p in ids if _side_by_hand(p) < 0.2]
    pairs = _pairs(ids, tie=[p == held_ids[0] for p in ids])
    assert held_out_side(pairs, 0.2)["prompt"].tolist() == held_ids[1:]
    only_ties = _pairs(held_ids[:3], tie=[True] * 3)
    with pytest.raises(HoldoutError, match=r"reward.holdout_fraction 0.2 holds out no pair with a preference "
                                           r"\(3 of 3 pairs, ties included, over 3 prompts\): raise"):
        held_out_side(only_ties, 0.2)
    with pytest.raises(HoldoutError, match="holds out every one of the 3 prompts' 3 pairs: nothing is left to "
                                           "train on; lower reward.holdout_fraction"):
        training_side(_pairs(held_ids[:3]), 0.2)
    assert training_side(_pairs([]), 0.2).empty  # no pairs at all is the import's error to raise, not this


def test_agreement_counts_a_zero_difference_as_no_agreement_and_reads_unanimous_pairs_apart():
    pairs = _pairs(["p1", "p2", "p3", "p4", "p5"], n_labels=[3, 1, 2, 3, 2],
                   label_agreement=[1.0, 1.0, 0.5, 2 / 3, 1.0])
    report = agreement_with_labels(np.array([0.7, -0.2, 0.0, 1.5, -3.0]), pairs)
    # agree: 0.7, 1.5 (2 of 5); unanimous with 2+ labels: rows 0 and 4 -> 1 of 2
    assert report == {"accuracy": 0.4, "n_pairs": 5, "accuracy_unanimous": 0.5, "n_unanimous": 2}
    assert agreement_with_labels(np.array([1.0]), _pairs(["p1"])) == {"accuracy": 1.0, "n_pairs": 1}
