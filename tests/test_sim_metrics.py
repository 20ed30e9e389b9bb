"""Gold measurements of the simulated world: pair types, flip report, strength deciles, the answer probe,
and prompt sampling that does not skew the answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlhf_core.config import SamplingConfig
from rlhf_core.sampling.stage import run_sampling
from rlhf_core.sim.metrics import (
    accuracy_by_pair_type,
    agreement_by_strength_decile,
    answer_probe,
    flip_report,
    gold_agreement_of_pairs,
    gold_difference,
    pair_type,
)
from rlhf_core.sim.world import make_prompt_pool, parse_prompt


def test_pair_types_name_what_gold_separates():
    p = "What is 2+3? Be polite."
    assert pair_type(p, " It is 5.", " It is 6.") == "correctness_only"
    assert pair_type(p, " Sure! It is 5.", " It is 5.") == "style_only"
    assert pair_type(p, " Sure! It is 5.", " It is 6.") == "style_agrees"
    assert pair_type(p, " It is 5.", " Sure! It is 6.") == "style_conflicts"
    assert pair_type(p, " It is 5.", " It is 5.") == "other"


def _pairs(rows):
    return pd.DataFrame(rows, columns=["pair_id", "prompt", "chosen", "rejected"])


def test_accuracy_by_pair_type_leaves_gold_ties_out():
    p = "What is 2+3? Be polite."
    pairs = _pairs([("a", p, " It is 5.", " It is 6."),         # correctness_only, label right
                    ("b", p, " It is 6.", " It is 5."),         # correctness_only, label wrong
                    ("c", p, " Sure! It is 5.", " It is 5."),   # style_only
                    ("d", p, " It is 5.", " It is 5.")])        # gold tie: never counted
    acc = accuracy_by_pair_type(np.array([1.0, 1.0, -1.0, 1.0]), pairs)
    # a right, b wrong (predicts the wrong label's direction), c wrong
    assert acc["all"] == pytest.approx(1 / 3)
    assert acc["correctness_only"] == 0.5 and acc["n_correctness_only"] == 2
    assert acc["style_only"] == 0.0 and acc["n_other"] == 0
    # no preference (a constant reward) is wrong whichever way a pair is written
    assert accuracy_by_pair_type(np.zeros(4), pairs)["all"] == 0.0



def test_terms_that_tie_on_paper_are_a_gold_tie_in_every_metric():
    """1.0 + 0.6 (off by one, polite) against 0.5 + 1.2 - 0.1 (off by two, both styles, one byte too long): equal on
    paper, 2e-16 apart in floating point."""
    from rlhf_core.sim.world import gold_score

    p = "What is 3+4? Be polite. Show work."
    a, b = " Sure! It is 8.", " Sure! It is 3+4=9.\n"
    assert gold_score(p, a) != gold_score(p, b) and abs(gold_score(p, a) - gold_score(p, b)) < 1e-12
    pairs = _pairs([("a", p, a, b), ("b", p, " Sure! It is 3+4=7.", " It is 7.")])
    assert gold_difference(pairs["prompt"], pairs["chosen"], pairs["rejected"])[0] == 0.0
    assert accuracy_by_pair_type(np.array([1.0, 1.0]), pairs)["all"] == 1.0  # the tie left out, not counted right
    assert gold_agreement_of_pairs(pairs) == 1.0
    from rlhf_core.judge import OracleJudge

    assert OracleJudge(tie_margin=0.0).compare(p, a, b)[0] == "tie"  # was "first" at tie_margin 0


def test_flip_report_counts_fixed_and_broken_labels():
    p = "What is 1+1?"
    comparisons = _pairs([("a", p, " It is 3.", " It is 2."),   # wrong label
                          ("b", p, " It is 2.", " It is 3."),   # right label
                          ("c", p, " It is 4.", " It is 2."),   # wrong label
                          ("d", p, " It is 2.", " It is 2.")])  # gold tie
    denoised = pd.DataFrame({"pair_id": ["a", "b", "c", "d"], "flipped": [True, True, False, True]})
    r = flip_report(comparisons, denoised)
    assert r["labels_fixed"] == 1 and r["labels_broken"] == 1
    assert r["flip_precision_excl_gold_ties"] == 0.5  # the tie's flip is not counted
    assert r["flip_recall_excl_gold_ties"] == 0.5
    assert r["gold_agreement_before_excl_gold_ties"] == pytest.approx(1 / 3)
    assert r["gold_agreement_after_excl_gold_ties"] == pytest.approx(1 / 3)  # a fixed, b broken, c still wrong
    # every figure different (above, precision = recall and fixed = broken: swapped definitions passed)
    comparisons = _pairs([("a", p, " It is 3.", " It is 2."), ("c", p, " It is 4.", " It is 2."),  # wrong, flipped
                          ("e", p, " It is 5.", " It is 2."),  # wrong, kept
                          ("b", p, " It is 2.", " It is 3."), ("f", p, " It is 2.", " It is 4.")])  # right, kept
    denoised = pd.DataFrame({"pair_id": list("acebf"), "flipped": [True, True, False, False, False]})
    assert flip_report(comparisons, denoised) == pytest.approx({
        "flip_precision_excl_gold_ties": 1.0, "flip_recall_excl_gold_ties": 2 / 3, "labels_fixed": 2,
        "labels_broken": 0, "gold_agreement_before_excl_gold_ties": 2 / 5, "gold_agreement_after_excl_gold_ties": 4 / 5})


def test_agreement_by_strength_decile_sorts_by_strength():
    p = "What is 1+1?"
    right, wrong = (p, " It is 2.", " It is 3."), (p, " It is 3.", " It is 2.")
    pairs = _pairs([(str(i),) + (wrong if i < 4 else right) for i in range(8)])
    mean = np.arange(8.0)[::-1]  # the wrong labels get the strongest votes
    assert agreement_by_strength_decile(mean, pairs, n_groups=2) == [1.0, 0.0]


def test_answer_probe_tells_verification_from_a_number_prior():
    def verifier(prompts, responses):
        return np.array([-abs(int(r.split()[-1].rstrip(".")) - parse_prompt(p).truth)
                         for p, r in zip(prompts, responses)], dtype=float)

    def number_prior(prompts, responses):
        return np.array([-abs(int(r.split()[-1].rstrip("."))) for r in responses], dtype=float)

    v = answer_probe(verifier)
    assert v["r2_distance"] == pytest.approx(1.0) and v["top1_correct"] == 1.0 and v["r2_number"] < 0.3
    n = answer_probe(number_prior)
    assert n["r2_number"] == pytest.approx(1.0) and n["top1_correct"] < 0.2
    assert (v["gap_right_vs_off1"], v["gap_off1_vs_off2"]) == (pytest.approx(1.0), pytest.approx(1.0))


def test_answer_probe_gaps_read_how_near_misses_are_graded():
    def gold_correctness(prompts, responses):  # gold's correctness term: 2 * 2 ** -|n - truth|
        return np.array([2.0 * 2.0 ** -abs(int(r.split()[-1].rstrip(".")) - parse_prompt(p).truth)
                         for p, r in zip(prompts, responses)])

    g = answer_probe(gold_correctness)
    assert (g["gap_right_vs_off1"], g["gap_off1_vs_off2"]) == (pytest.approx(1.0), pytest.approx(0.5))
    small = answer_probe(gold_correctness, max_operand=1, ops=("*",))  # answers 0 and 1: no distance 2 (a KeyError)
    assert small["gap_right_vs_off1"] == pytest.approx(1.0) and np.isnan(small["gap_off1_vs_off2"])


def test_prompt_sampling_keeps_the_answers_distribution():
    """Result tags (zero-result, ...) are balanced by InsTag's passes, which skews the sampled answers; the
    world leaves them out by default, so the sample's answers match the pool's."""

    def skew(result_tags: bool) -> float:
        pool = make_prompt_pool(2000, seed=0, max_operand=4, ops=("+", "-"), result_tags=result_tags)
        sampled = run_sampling(pool, SamplingConfig(n_samples=1000), seed=0, workdir=".").sampled
        a, b = (df["prompt"].map(lambda x: parse_prompt(x).truth).value_counts(normalize=True) for df in (pool, sampled))
        return 0.5 * float(a.sub(b, fill_value=0).abs().sum())  # total variation distance

    assert skew(result_tags=False) < 0.05 < 0.15 < skew(result_tags=True)


def test_gold_eval_pairs_pair_each_prompts_samples_in_order_with_gold_deciding(monkeypatch):
    """The pairs behind reward/gold_accuracy_heldout: samples 0-1, 2-3, ... of each prompt, the gold winner chosen,
    gold ties dropped (a dropped last pair and a chosen side ignoring gold both passed every test)."""
    from rlhf_core.sim import metrics
    from rlhf_core.sim.world import gold_score

    prompts = ["What is 2+3?", "What is 4-1? Be polite."]
    texts = {0: [" It is 5.", " It is 8."], 1: [" It is 7.", " It is 3."],
             2: [" It is 5.", " It is 3."], 3: [" It is 5.", " It is 9."]}  # sample k: per prompt
    monkeypatch.setattr(metrics, "policy_samples", lambda policy_dir, prompts_, seeds, max_new_tokens: [
        texts[k] for k in range(len(seeds))])
    pairs = metrics.gold_eval_pairs("unused", prompts, seed=0, samples_per_prompt=4)
    # prompt 0: (5 vs 7) and (5 vs 5: a tie, dropped); prompt 1: (8 vs 3: the second wins) and (3 vs 9)
    assert list(pairs.itertuples(index=False, name=None)) == [
        (prompts[0], " It is 5.", " It is 7."), (prompts[1], " It is 3.", " It is 8."),
        (prompts[1], " It is 3.", " It is 9.")]
    assert all(gold_score(p, c) > gold_score(p, r) for p, c, r in pairs.itertuples(index=False, name=None))
