"""Pairs from several annotators' scores (mean, majority) and Krippendorff's alpha, by hand."""

import math

import pandas as pd
import pytest

from rlhf_core.annotation.aggregate import (
    inter_annotator_agreement,
    krippendorff_alpha,
    pairs_from_annotator_scores,
    percent_agreement,
)
from rlhf_core.schemas import validate_table

RESPONSES = pd.DataFrame({
    "prompt_id": ["p1", "p1", "p1", "p2", "p2"],
    "response_id": ["r1", "r2", "r3", "r4", "r5"],
    "prompt": ["q1", "q1", "q1", "q2", "q2"],
    "response": ["one", "two", "three", "four", "five"],
})


def scores_table(rows: list[tuple[str, str, float]]) -> pd.DataFrame:
    """(annotator, response_id, score) -> the scores table."""
    prompt_of = dict(zip(RESPONSES["response_id"], RESPONSES["prompt_id"]))
    return pd.DataFrame([
        {"score_id": f"{who}:{rid}", "annotation_id": f"{who}:{rid}", "prompt_id": prompt_of[rid],
         "response_id": rid, "score": float(score), "annotator": who, "raw": "{}"}
        for who, rid, score in rows
    ])


# u: r1=3 r2=1 r3=2; v: r1=1 r2=2 r3=2 (means: r1=2, r2=1.5, r3=2)
TWO_ANNOTATORS = scores_table([("u", "r1", 3), ("u", "r2", 1), ("u", "r3", 2),
                               ("v", "r1", 1), ("v", "r2", 2), ("v", "r3", 2)])


def summary(pairs: pd.DataFrame) -> list[tuple]:
    return list(pairs[["chosen_id", "rejected_id", "n_labels", "label_agreement", "score_gap", "tie"]]
                .itertuples(index=False, name=None))


def test_mean_aggregation_counts_annotators_who_agree():
    pairs, report = pairs_from_annotator_scores(TWO_ANNOTATORS, RESPONSES, aggregate="mean", ties="keep")
    validate_table("comparisons", pairs)
    # r1 vs r2: u agrees (3 > 1), v does not (1 < 2); r1 vs r3: mean tie, neither annotator ties;
    # r3 vs r2: u agrees (2 > 1), v ties (2 = 2), which counts as disagreeing
    assert summary(pairs) == [("r1", "r2", 2, 0.5, 0.5, False), ("r1", "r3", 2, 0.0, 0.0, True),
                              ("r3", "r2", 2, 0.5, 0.5, False)]
    assert pairs["chosen"].tolist() == ["one", "one", "three"] and pairs["prompt"].tolist() == ["q1"] * 3
    assert report["n_ties"] == 1 and report["n_annotators"] == 2
    assert report["mean_label_agreement"] == pytest.approx(1 / 3)


def test_majority_aggregation_drops_or_keeps_even_splits():
    pairs, report = pairs_from_annotator_scores(TWO_ANNOTATORS, RESPONSES, aggregate="majority")
    # u: r1>r2 (gap 2), r1>r3 (1), r3>r2 (1); v: r2>r1 (1), r3>r1 (1), r2=r3 (a tie vote).
    # r1-r2 and r1-r3 split 1:1 -> tied; r3-r2: one vote for r3 and one tie -> r3, agreement 1/2,
    # score_gap = mean(2 - 1, 2 - 2) = 0.5
    assert summary(pairs) == [("r3", "r2", 2, 0.5, 0.5, False)]
    assert report["tied_pairs"] == 2 and report["n_annotator_pairs"] == 6
    kept, report = pairs_from_annotator_scores(TWO_ANNOTATORS, RESPONSES, aggregate="majority", ties="keep")
    # kept ties in response_id order; nobody tied them, so agreement 0; r1-r2 gap = mean(3-1, 1-2) = 0.5
    assert summary(kept) == [("r1", "r2", 2, 0.0, 0.5, True), ("r1", "r3", 2, 0.0, 0.0, True),
                             ("r3", "r2", 2, 0.5, 0.5, False)]


def test_majority_of_three_with_min_gap_and_repeats():
    table = scores_table([("a", "r4", 5), ("a", "r5", 1), ("b", "r4", 4), ("b", "r5", 2),
                          ("c", "r4", 1), ("c", "r5", 2), ("c", "r5", 4),  # c scored r5 twice: mean 3
                          ("d", "r4", 3), ("d", "r5", 3.5)])  # d's gap 0.5 <= min_gap: no vote
    pairs, report = pairs_from_annotator_scores(table, RESPONSES, aggregate="majority", min_gap=0.5)
    # votes on r4-r5 (score(r4) - score(r5)): a +4, b +2, c -2 -> r4 chosen 2:1, gap mean(4, 2, -2) = 4/3
    assert summary(pairs) == [("r4", "r5", 3, pytest.approx(2 / 3), pytest.approx(4 / 3), False)]
    assert report["n_repeated_scores"] == 1
    mean_pairs, _ = pairs_from_annotator_scores(table, RESPONSES, aggregate="mean", mode="best_vs_worst")
    # means r4 = (5+4+1+3)/4 = 3.25, r5 = (1+2+3+3.5)/4 = 2.375; a and b agree, c and d do not
    assert summary(mean_pairs) == [("r4", "r5", 4, 0.5, pytest.approx(0.875), False)]


def rankings_table(rankings: list[tuple[str, str, list[str]]]) -> pd.DataFrame:
    """(annotator, judgement id, ranked ids best first) -> the scores table, as a Ranker import writes it."""
    return pd.DataFrame([
        {"score_id": f"{jid}:{who}:{rid}", "annotation_id": f"{jid}:{who}", "prompt_id": "p1", "response_id": rid,
         "score": -float(position), "annotator": who, "raw": "{}"}
        for who, jid, ranked in rankings for position, rid in enumerate(ranked, start=1)])


def test_two_rankings_of_other_items_are_two_scales_not_one():
    """u ranks r1 > r2 > r3 in one task and r3 > r2 in another. Averaged positions made r3 (-3 and -1: -2) tie r2
    (-2 and -2) and r1 - r3 a gap of 1; each ranking's own order gives r1 > r2, r1 > r3 (gap 2) and r2 vs r3 both
    ways."""
    table = rankings_table([("u", "t1", ["r1", "r2", "r3"]), ("u", "t2", ["r3", "r2"])])
    pairs, report = pairs_from_annotator_scores(table, RESPONSES, aggregate="majority", ties="keep")
    # r2-r3: +1 in t1, -1 in t2 -> u's one vote is their mean, 0: a tie vote
    assert summary(pairs) == [("r1", "r2", 1, 1.0, 1.0, False), ("r1", "r3", 1, 1.0, 2.0, False),
                              ("r2", "r3", 1, 1.0, 0.0, True)]
    assert report["n_repeated_scores"] == 0 and report["n_annotator_pairs"] == 3
    # the reviewer's case: r1 > r2 > r3 in one task, r3 > r4 in another: r3 > r4 (positions made r4 = -2.5 > r3 = -3)
    responses = pd.DataFrame({"prompt_id": "p1", "response_id": ["r1", "r2", "r3", "r4"], "prompt": "q1",
                              "response": ["one", "two", "three", "four"]})
    table = rankings_table([("u", "t1", ["r1", "r2", "r3"]), ("u", "t2", ["r3", "r4"])])
    pairs, _ = pairs_from_annotator_scores(table, responses, aggregate="majority")
    assert sorted(zip(pairs["chosen_id"], pairs["rejected_id"])) == [("r1", "r2"), ("r1", "r3"), ("r2", "r3"),
                                                                     ("r3", "r4")]
    with pytest.raises(ValueError, match="rank different sets of responses.*annotation.aggregate to 'majority'"):
        pairs_from_annotator_scores(table, responses, aggregate="mean")


def test_rank_rows_are_their_annotators_ranking_of_the_prompt():
    """A score table's rank rows (one row per response): u ranks r1 > r2 > r3, v ranks r3 > r2 alone, w scores r1
    and ranks r2 first. Ranks are one scale per annotator and prompt, another than scores: the mean of positions of
    lists of other lengths is refused as a Ranker's is; majority pairs each annotator's ranks among themselves."""
    rows = [("u", "r1", 1), ("u", "r2", 2), ("u", "r3", 3), ("v", "r3", 1), ("v", "r2", 2)]
    table = pd.DataFrame([{"score_id": f"rank:{rid}:{who}:{rid}", "annotation_id": f"rank:{rid}:{who}",
                           "prompt_id": "p1", "response_id": rid, "score": -float(rank), "annotator": who, "raw": "{}"}
                          for who, rid, rank in rows])
    with pytest.raises(ValueError, match="rank different sets of responses"):
        pairs_from_annotator_scores(table, RESPONSES, aggregate="mean")
    pairs, _ = pairs_from_annotator_scores(table, RESPONSES, aggregate="majority", ties="keep")
    # r2-r3: u +1, v -1: a tie; r1 > r2 and r1 > r3 by u alone
    assert summary(pairs) == [("r1", "r2", 1, 1.0, 1.0, False), ("r1", "r3", 1, 1.0, 2.0, False),
                              ("r2", "r3", 2, 0.0, 0.0, True)]
    # w's score 4 of r1 and rank 1 of r2 are two scales: no pair between them (4 > -1 said r1 > r2)
    mixed = pd.concat([scores_table([("w", "r1", 4)]), table.iloc[[1]].assign(
        annotator="w", annotation_id="rank:r2:w", score_id="rank:r2:w:r2", score=-1.0)], ignore_index=True)
    assert pairs_from_annotator_scores(mixed, RESPONSES, aggregate="majority")[0].empty


def test_mean_of_positions_where_they_are_one_scale_and_a_clear_error_where_not():
    # two annotators rank the same three responses: the mean of positions (a Borda count) is one scale
    same = rankings_table([("u", "t1", ["r1", "r2", "r3"]), ("v", "t2", ["r2", "r1", "r3"])])
    pairs, _ = pairs_from_annotator_scores(same, RESPONSES, aggregate="mean", ties="keep")
    # means: r1 = r2 = -1.5, r3 = -3
    assert summary(pairs) == [("r1", "r2", 2, 0.0, 0.0, True), ("r1", "r3", 2, 1.0, 1.5, False),
                              ("r2", "r3", 2, 1.0, 1.5, False)]
    twice = rankings_table([("u", "t1", ["r1", "r2", "r3"]), ("u", "t2", ["r2", "r1", "r3"])])
    with pytest.raises(ValueError, match="prompt p1: .*rank the same responses twice for one annotator"):
        pairs_from_annotator_scores(twice, RESPONSES, aggregate="mean")
    # ... also when another annotator ranked once (u would count twice in the mean)
    with pytest.raises(ValueError, match="twice for one annotator"):
        pairs_from_annotator_scores(pd.concat([twice, rankings_table([("v", "t3", ["r3", "r2", "r1"])])]), RESPONSES,
                                    aggregate="mean")
    rated = pd.concat([same, scores_table([("w", "r1", 4)])], ignore_index=True)
    with pytest.raises(ValueError, match="are mixed with single scores"):
        pairs_from_annotator_scores(rated, RESPONSES, aggregate="mean")


def test_majority_score_gap_is_negative_when_the_minority_saw_the_larger_gaps():
    """u and v prefer r1 by 1, w prefers r2 by 4: r1 wins 2:1 with score_gap mean(1, 1, -4) = -2/3, as documented."""
    table = scores_table([("u", "r1", 2), ("u", "r2", 1), ("v", "r1", 2), ("v", "r2", 1), ("w", "r1", 1), ("w", "r2", 5)])
    pairs, _ = pairs_from_annotator_scores(table, RESPONSES, aggregate="majority")
    assert summary(pairs) == [("r1", "r2", 3, pytest.approx(2 / 3), pytest.approx(-2 / 3), False)]


def test_bad_arguments_and_unknown_responses_raise():
    with pytest.raises(ValueError, match="aggregate="):
        pairs_from_annotator_scores(TWO_ANNOTATORS, RESPONSES, aggregate="median")
    with pytest.raises(ValueError, match="not in the responses table"):
        pairs_from_annotator_scores(TWO_ANNOTATORS, RESPONSES[RESPONSES.response_id != "r2"])


# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 observers, 12 units,
# values 1..5, "." = missing. Unit 12 has a single value and is not pairable.
#   A: 1 2 3 3 2 1 4 1 2 . . .
#   B: 1 2 3 3 2 2 4 1 2 5 . 3
#   C: . 3 3 3 2 3 4 2 2 5 1 .
#   D: 1 2 3 3 2 4 4 1 2 5 1 .
# Coincidences o_ck = sum_u (c-k pairs in u) / (m_u - 1):
#   o11 = 3 (u1) + 2 (u8) + 2 (u11) = 7;  o22 = 2 (u2) + 4 (u5) + 4 (u9) = 10;  o33 = 8;  o44 = 4;  o55 = 3
#   o12 = 1/3 (u6) + 1 (u8) = 4/3;  o23 = 1 (u2) + 1/3 (u6) = 4/3;  o13 = o14 = o24 = o34 = 1/3 (u6)
#   n_1..n_5 = 9, 13, 10, 5, 3;  n = 40
# nominal:  alpha = 1 - (n-1) * (off-diagonal o) / sum_{c!=k} n_c n_k = 1 - 39 * 8 / (1600 - 384) = 1 - 312/1216
#           = 0.743 (the paper's value)
# interval: sum o_ck (c-k)^2 = 2 * (4/3*1 + 1/3*4 + 1/3*9 + 4/3*1 + 1/3*4 + 1/3*1) = 52/3;
#           sum n_c n_k (c-k)^2 = 2 * 2240 = 4480;  alpha = 1 - 39 * (52/3) / 4480 = 1 - 676/4480 = 0.849 (the paper's)
OBSERVERS = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
    [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
]
UNITS = [[v for v in unit if v is not None] for unit in zip(*OBSERVERS)]


def test_alpha_on_krippendorffs_own_example():
    assert krippendorff_alpha(UNITS, "nominal") == pytest.approx(1 - 312 / 1216)
    assert round(krippendorff_alpha(UNITS, "nominal"), 3) == 0.743
    assert krippendorff_alpha(UNITS, "interval") == pytest.approx(1 - 676 / 4480)
    assert round(krippendorff_alpha(UNITS, "interval"), 3) == 0.849


def test_alpha_perfect_none_and_undefined():
    assert krippendorff_alpha([[1, 1], [2, 2, 2], [5, 5], [7]], "interval") == 1.0
    assert krippendorff_alpha([["a", "a"], ["b", "b"]], "nominal") == 1.0
    # two units, two coders swapping values: o_ab = o_ba = 2, n_a = n_b = 2, n = 4 -> 1 - 3 * 4 / 8 = -0.5
    assert krippendorff_alpha([["a", "b"], ["b", "a"]], "nominal") == pytest.approx(-0.5)
    assert math.isnan(krippendorff_alpha([[3, 3], [3, 3]], "interval"))  # no variation: undefined
    assert math.isnan(krippendorff_alpha([[1], [2]], "nominal"))  # nothing pairable
    with pytest.raises(ValueError, match="metric="):
        krippendorff_alpha(UNITS, "ordinal")


def test_agreement_of_label_and_score_tables():
    # the paper's example as pairwise labels: observer k's value v on unit u -> annotator k, task u, label v
    annotations = pd.DataFrame([
        {"task_id": f"t{u}", "annotator": "ABCD"[k], "label": str(v)}
        for k, observer in enumerate(OBSERVERS) for u, v in enumerate(observer) if v is not None
    ])
    report = inter_annotator_agreement(annotations, TWO_ANNOTATORS)
    assert report["labels/alpha_nominal"] == pytest.approx(1 - 312 / 1216)
    # agreeing coder pairs: u1 3/3, u2 3/6, u3-u5 6/6 each, u6 0/6, u7 6/6, u8 3/6, u9 6/6, u10 3/3, u11 1/1
    assert report["labels/percent_agreement"] == pytest.approx(43 / 55)
    assert report["labels/n_items_overlapping"] == 11 and report["labels/n_annotators"] == 4
    # scores: units r1 (3, 1), r2 (1, 2), r3 (2, 2); values 1 x2, 2 x3, 3 x1 in coincidences
    # o_13 = o_31 = 1, o_12 = o_21 = 1, o_22 = 2; D_o sum = 2*(4 + 1) = 10
    # n_1 = 2, n_2 = 3, n_3 = 1, n = 6; sum n_c n_k d2 = 2*(2*3*1 + 2*1*4 + 3*1*1) = 34 -> 1 - 5 * 10 / 34
    assert report["scores/alpha_interval"] == pytest.approx(1 - 50 / 34)
    assert report["scores/n_items_overlapping"] == 3 and report["scores/n_annotators"] == 2
    assert percent_agreement([["a", "a", "b"]]) == pytest.approx(1 / 3)
    empty = inter_annotator_agreement()
    assert math.isnan(empty["labels/alpha_nominal"]) and empty["scores/n_items_overlapping"] == 0


def test_score_agreement_compares_rank_positions_within_rankings_of_the_same_responses():
    """u and v rank r1 > r2 > r3 alike; w ranks r3 > r2 alone, x rates r3 and y rates it too. w's positions (-1, -2)
    are of another list: pooled with u's and v's (-3, -2) they made r3's unit (-3, -3, -1) disagree. Units: r1, r2,
    r3 in {r1 r2 r3} (u, v), r2 and r3 in {r2 r3} (w alone) and the ratings' r3 (x, y)."""
    table = rankings_table([("u", "t1", ["r1", "r2", "r3"]), ("v", "t2", ["r1", "r2", "r3"]),
                            ("w", "t3", ["r3", "r2"])])
    ratings = scores_table([("x", "r3", 4), ("y", "r3", 4)])
    report = inter_annotator_agreement(scores=pd.concat([table, ratings], ignore_index=True))
    assert report["scores/alpha_interval"] == 1.0
    assert report["scores/n_items_overlapping"] == 4 and report["scores/n_annotators"] == 5
    # a disagreement inside the shared list is still seen: v swaps r2 and r3; units (-1, -1), (-2, -3), (-3, -2):
    # o_-2-3 = o_-3-2 = 2, n_c = 2 each, n = 6; D_o 4, sum n_c n_k d2 = 4 * 2 * (1 + 4 + 1) = 48 -> 1 - 5 * 4 / 48
    table = rankings_table([("u", "t1", ["r1", "r2", "r3"]), ("v", "t2", ["r1", "r3", "r2"])])
    assert inter_annotator_agreement(scores=table)["scores/alpha_interval"] == pytest.approx(1 - 20 / 48)


def test_an_annotator_who_labelled_a_task_twice_counts_with_the_first_label():
    labels = pd.DataFrame({"task_id": ["t1", "t1", "t1", "t2", "t2"], "annotator": ["a", "a", "b", "a", "b"],
                           "label": ["A", "B", "A", "B", "B"]})  # a: "A" then "B" on t1; b agrees with a's first
    report = inter_annotator_agreement(labels)
    assert report["labels/percent_agreement"] == 1.0 and report["labels/alpha_nominal"] == 1.0


def test_a_pair_no_annotator_scored_both_sides_of_is_counted_and_left_out_of_the_agreement():
    """u scored r1 and r2, v scored r2 and r3: the mean makes r1 > r3 > r2, and nobody compared r1 with r3."""
    responses = pd.DataFrame({"prompt_id": ["p1"] * 3, "response_id": ["r1", "r2", "r3"], "prompt": ["q"] * 3,
                              "response": ["one", "two", "three"]})
    scores = pd.DataFrame([{"score_id": f"{w}{r}", "annotation_id": f"{w}{r}", "prompt_id": "p1", "response_id": r,
                            "score": float(s), "annotator": w, "raw": "{}"}
                           for w, r, s in (("u", "r1", 5), ("u", "r2", 1), ("v", "r2", 1), ("v", "r3", 3))])
    pairs, report = pairs_from_annotator_scores(scores, responses, aggregate="mean")
    by_pair = {(c, r): (n, a) for c, r, n, a in pairs[["chosen_id", "rejected_id", "n_labels", "label_agreement"]]
               .itertuples(index=False)}
    assert by_pair[("r1", "r3")][0] == 0 and math.isnan(by_pair[("r1", "r3")][1])
    assert report["n_pairs_without_common_annotator"] == 1 and report["mean_label_agreement"] == 1.0
