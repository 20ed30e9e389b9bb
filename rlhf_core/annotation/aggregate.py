"""Comparison pairs from several annotators' scores, and inter-annotator agreement.

Scores (the scores table) become pairs by one of two aggregations. A ranking (a judgement that
scores several responses: a Label Studio Ranker task, a score table's ranking row) scores its items by position,
which orders its own items only: two rankings of other items are not one scale (r4 last of four and
first of two is not -2.5). So an annotator's scores fall into scales: each of their rankings is one,
their rank rows of a prompt (score tables: one row per response with its rank) are one, and all their
other single scores (ratings, scores) are one. In a scale, an annotator who scored
one response more than once is given the mean of those scores (counted n_repeated_scores).

- aggregate="mean": the mean score of each response over its annotators, then
  scores.pairs_from_scores(min_gap, mode, ties). Per pair, n_labels = the annotators who scored
  both responses, label_agreement = the share of them whose own scores order the pair as chosen
  (for a kept tie: whose own scores tie), an annotator's tie counting as disagreeing; NaN when no
  annotator scored both (counted n_pairs_without_common_annotator). A mean of positions is a
  scale only when every ranking of the prompt ranks the same responses, one ranking per annotator,
  and no single score is mixed in; other prompts raise ValueError (use "majority").
- aggregate="majority": each annotator's own pairs (scores.pairs_from_scores over each of their
  scales alone, with min_gap and mode, ties kept as votes for neither side; a pair ordered in two
  of their scales gets the mean of its gaps there), then per unordered pair the direction most of
  the annotators chose. n_labels = the annotators with a pair there (ties included),
  label_agreement = the majority's share of them. An even split (tie votes only, too) is a tied
  pair: dropped, or with ties="keep" kept as tie=True in response_id order with label_agreement
  = the share of tie votes; tied_pairs counts them either way. score_gap = the mean over those
  annotators of score(chosen) - score(rejected) in their own scores (negative when the minority
  saw the larger gaps).

Output: the comparisons table + score_gap and tie, pair_id = pairs.comparison_pair_id, sorted by
(prompt_id, chosen_id, rejected_id); texts (prompt, response) come from the responses table.

Agreement: Krippendorff's alpha (Krippendorff 2011, "Computing Krippendorff's Alpha-Reliability"),
from the coincidence matrix o_ck = sum over units u of (number of c-k value pairs in u) / (m_u - 1),
m_u = the values of unit u, only units with m_u >= 2 (pairable), n = sum of o:

    alpha = 1 - (n - 1) * sum_ck o_ck delta2(c, k) / sum_ck n_c n_k delta2(c, k)

with delta2 = [c != k] (nominal) or (c - k)^2 (interval). NaN with no pairable unit or no variation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import combinations
from typing import Literal

import numpy as np
import pandas as pd

from rlhf_core.annotation.pairs import comparison_pair_id
from rlhf_core.annotation.score_tables import RANK_ROW
from rlhf_core.annotation.scores import MODES, OUTPUT_COLUMNS, TIES, pairs_from_scores
from rlhf_core.schemas import validate_table

AGGREGATES = ("mean", "majority")


def _per_annotator(scores: pd.DataFrame, responses: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """One score per (annotator, scale, response): the mean of repeats; with the prompt and response texts. The
    column `scale` is the ranking's annotation_id, rank:{annotator}:{prompt_id} for rank rows, or "" for the
    annotator's other single scores (the module docstring)."""
    missing = sorted(set(scores["response_id"]) - set(responses["response_id"]))
    if missing:
        raise ValueError(f"{len(missing)} scored response(s) are not in the responses table, e.g. {missing[:3]}; "
                         "import scores against the same responses table")
    scores = scores.assign(scale=_scales(scores))
    grouped = scores.groupby(["annotator", "scale", "prompt_id", "response_id"], as_index=False, sort=True)["score"]
    n_repeated = int((grouped.size()["size"] > 1).sum())
    texts = responses[["response_id", "prompt", "response"]].drop_duplicates("response_id")
    return grouped.mean().merge(texts, on="response_id", how="left"), n_repeated


def _scales(scores: pd.DataFrame) -> pd.Series:
    """Each score's scale (the module docstring): the ranking's annotation_id, rank:{annotator}:{prompt_id} for
    rank rows, "" for single scores."""
    responses_per_judgement = scores.groupby("annotation_id")["response_id"].transform("nunique")
    scale = scores["annotation_id"].where(responses_per_judgement > 1, "")
    rank_rows = scores["annotation_id"].str.startswith(RANK_ROW)
    return scale.mask(rank_rows, RANK_ROW + scores["annotator"].astype(str) + ":" + scores["prompt_id"])


def _check_one_scale_per_prompt(own: pd.DataFrame) -> None:
    """Mean aggregation's precondition: a prompt's rankings rank the same responses, one per annotator, and no
    single score is mixed in (else positions of different lists would be averaged as one scale)."""
    for prompt_id, group in own.groupby("prompt_id", sort=True):
        rankings = group[group["scale"] != ""]
        if rankings.empty:
            continue
        items = {frozenset(g["response_id"]) for _, g in rankings.groupby("scale")}
        per_annotator = rankings.groupby("annotator")["scale"].nunique().max()
        problem = ("rank different sets of responses" if len(items) > 1 else
                   "rank the same responses twice for one annotator" if per_annotator > 1 else
                   "are mixed with single scores (ratings)" if len(rankings) < len(group) else "")
        if problem:
            raise ValueError(f"prompt {prompt_id}: aggregate='mean' averages scores over annotators, but this "
                             f"prompt's rankings {problem}, and positions in different lists are not one scale; set "
                             "annotation.aggregate to 'majority' (pairs from each ranking's own order)")


def _mean_pairs(own: pd.DataFrame, min_gap: float, mode: str, ties: str) -> tuple[pd.DataFrame, dict]:
    _check_one_scale_per_prompt(own)
    mean = own.groupby(["prompt_id", "response_id", "prompt", "response"], as_index=False)["score"].mean()
    pairs, report = pairs_from_scores(mean, min_gap=min_gap, mode=mode, ties=ties)
    by_response = {rid: dict(zip(g["annotator"], g["score"])) for rid, g in own.groupby("response_id")}
    n_labels, agreement = [], []
    for chosen_id, rejected_id, tie in zip(pairs["chosen_id"], pairs["rejected_id"], pairs["tie"]):
        chosen, rejected = by_response[chosen_id], by_response[rejected_id]
        common = chosen.keys() & rejected.keys()
        agree = sum((chosen[a] == rejected[a]) if tie else (chosen[a] > rejected[a]) for a in common)
        n_labels.append(len(common))
        agreement.append(agree / len(common) if common else float("nan"))
    pairs["n_labels"], pairs["label_agreement"] = n_labels, np.array(agreement, dtype=float)
    report["n_pairs_without_common_annotator"] = n_labels.count(0)
    return pairs, report


def _majority_pairs(own: pd.DataFrame, min_gap: float, mode: str, ties: str) -> tuple[pd.DataFrame, dict]:
    # (prompt_id, a, b), a < b -> annotator -> score(a) - score(b) in each of their scales that orders the pair
    votes: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for (annotator, _), group in own.groupby(["annotator", "scale"], sort=True):
        scale_pairs, _ = pairs_from_scores(group, min_gap=min_gap, mode=mode, ties="keep")
        for prompt_id, chosen_id, rejected_id, gap in scale_pairs[
                ["prompt_id", "chosen_id", "rejected_id", "score_gap"]].itertuples(index=False):
            a, b = sorted((chosen_id, rejected_id))
            votes.setdefault((prompt_id, a, b), {}).setdefault(annotator, []).append(gap if chosen_id == a else -gap)
    texts = own.drop_duplicates("response_id").set_index("response_id")
    rows, tied_pairs = [], 0
    for (prompt_id, a, b), by_annotator in sorted(votes.items()):
        gaps = [float(np.mean(own_gaps)) for own_gaps in by_annotator.values()]  # one vote per annotator
        n_a, n_b, n_tie = sum(g > 0 for g in gaps), sum(g < 0 for g in gaps), sum(g == 0 for g in gaps)
        tie = n_a == n_b
        tied_pairs += tie
        if tie and ties == "drop":
            continue
        chosen, rejected, sign = (b, a, -1.0) if n_b > n_a else (a, b, 1.0)
        rows.append({
            "pair_id": comparison_pair_id(prompt_id, chosen, rejected),
            "prompt_id": prompt_id,
            "prompt": texts.at[chosen, "prompt"],
            "chosen": texts.at[chosen, "response"],
            "rejected": texts.at[rejected, "response"],
            "chosen_id": chosen,
            "rejected_id": rejected,
            "n_labels": len(gaps),
            "label_agreement": (n_tie if tie else max(n_a, n_b)) / len(gaps),
            "score_gap": sign * float(np.mean(gaps)),
            "tie": tie,
        })
    pairs = pd.DataFrame(rows, columns=OUTPUT_COLUMNS).astype({"score_gap": float, "tie": bool})
    report = {"n_prompts": int(own["prompt_id"].nunique()), "n_pairs": len(pairs), "tied_pairs": tied_pairs,
              "n_annotator_pairs": sum(len(g) for g in votes.values())}
    return pairs, report


def pairs_from_annotator_scores(
    scores: pd.DataFrame,
    responses: pd.DataFrame,
    aggregate: Literal["mean", "majority"] = "mean",
    min_gap: float = 0.0,
    mode: Literal["all", "best_vs_worst"] = "all",
    ties: Literal["drop", "keep"] = "drop",
) -> tuple[pd.DataFrame, dict]:
    """(comparisons + score_gap + tie, report) from the scores table (see the module docstring)."""
    if aggregate not in AGGREGATES or mode not in MODES or ties not in TIES:
        raise ValueError(f"aggregate={aggregate!r}, mode={mode!r}, ties={ties!r}; known: aggregate in {AGGREGATES}, "
                         f"mode in {MODES}, ties in {TIES}")
    if min_gap < 0:
        raise ValueError(f"min_gap must be >= 0, got {min_gap}")
    own, n_repeated = _per_annotator(scores, responses)
    if aggregate == "mean":
        pairs, report = _mean_pairs(own, min_gap, mode, ties)
    else:
        pairs, report = _majority_pairs(own, min_gap, mode, ties)
    pairs = pairs.sort_values(["prompt_id", "chosen_id", "rejected_id"], ignore_index=True)
    validate_table("comparisons", pairs)
    agreement = pairs["label_agreement"].dropna()
    report.update(n_annotators=int(scores["annotator"].nunique()), n_repeated_scores=n_repeated,
                  mean_label_agreement=float(agreement.mean()) if len(agreement) else float("nan"))
    return pairs, report


def krippendorff_alpha(units: Iterable[Sequence], metric: Literal["nominal", "interval"]) -> float:
    """Krippendorff's alpha of `units`, each the values its coders gave (missing values left out)."""
    pairable = [list(u) for u in units if len(u) >= 2]
    values = sorted({v for u in pairable for v in u})
    index = {v: i for i, v in enumerate(values)}
    o = np.zeros((len(values), len(values)))  # coincidence matrix, (V, V)
    for unit in pairable:
        counts = Counter(unit)
        for c, n_c in counts.items():
            for k, n_k in counts.items():
                o[index[c], index[k]] += n_c * (n_k - (c == k)) / (len(unit) - 1)
    n_c = o.sum(axis=1)  # (V,)
    n = n_c.sum()
    if metric == "nominal":
        delta2 = 1.0 - np.eye(len(values))
    elif metric == "interval":
        v = np.asarray(values, dtype=float)
        delta2 = (v[:, None] - v[None, :]) ** 2
    else:
        raise ValueError(f"metric={metric!r}; known: nominal, interval")
    expected = (np.outer(n_c, n_c) * delta2).sum()
    if n == 0 or expected == 0:
        return float("nan")
    return float(1.0 - (n - 1) * (o * delta2).sum() / expected)


def _units(table: pd.DataFrame, unit: str, value: str) -> list[list]:
    """The values per unit, one per annotator (an annotator's first value of a unit)."""
    first = table.drop_duplicates([unit, "annotator"], keep="first")
    return [group[value].tolist() for _, group in first.groupby(unit, sort=True)]


def _score_units(scores: pd.DataFrame) -> pd.Series:
    """Each score's agreement unit: its response among the items of its scale. Single scores (ratings) of a
    response are one unit over annotators; a rank position is comparable only with positions in rankings of the
    same responses (first of two is not first of four), so a ranked response's unit also names what its ranking
    ranked."""
    if scores.empty:
        return pd.Series([], dtype=object, index=scores.index)
    scale = _scales(scores)
    units = scores["response_id"].copy()
    in_ranking = scale != ""  # single scores keep their response id (joining an annotator's ratings grew as n^2)
    if in_ranking.any():
        ranked = (scores[in_ranking].assign(scale=scale[in_ranking]).groupby(["annotator", "scale"])["response_id"]
                  .transform(lambda ids: " ".join(sorted(set(ids)))))
        units[in_ranking] = scores.loc[in_ranking, "response_id"] + " in " + ranked
    return units


def percent_agreement(units: Iterable[Sequence]) -> float:
    """Share of agreeing pairs of values over all pairs of coders on a unit, pooled over units."""
    pairs = [(x == y) for u in units for x, y in combinations(u, 2)]
    return float(np.mean(pairs)) if pairs else float("nan")


def inter_annotator_agreement(annotations: pd.DataFrame | None = None,
                              scores: pd.DataFrame | None = None) -> dict[str, float]:
    """Agreement between annotators on pairwise labels (unit = task_id, nominal alpha and raw percent
    agreement) and on scores (interval alpha; unit = response_id for single scores, the response among the
    responses its ranking ranked for rank positions: `_score_units`). Only units with >= 2 annotators count
    (n_items_overlapping); n_annotators counts every annotator of the table."""
    report: dict[str, float] = {}
    if annotations is None:
        annotations = pd.DataFrame(columns=["task_id", "annotator", "label"])
    units = _units(annotations, "task_id", "label")
    report["labels/alpha_nominal"] = krippendorff_alpha(units, "nominal")
    report["labels/percent_agreement"] = percent_agreement(units)
    report["labels/n_items_overlapping"] = sum(len(u) >= 2 for u in units)
    report["labels/n_annotators"] = int(annotations["annotator"].nunique())
    if scores is None:
        scores = pd.DataFrame(columns=["annotation_id", "prompt_id", "response_id", "annotator", "score"])
    units = _units(scores.assign(unit=_score_units(scores)), "unit", "score")
    report["scores/alpha_interval"] = krippendorff_alpha(units, "interval")
    report["scores/n_items_overlapping"] = sum(len(u) >= 2 for u in units)
    report["scores/n_annotators"] = int(scores["annotator"].nunique())
    return report
