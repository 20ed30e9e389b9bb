"""Comparison pairs from per-annotator judgements."""

from __future__ import annotations

import hashlib

import pandas as pd


def comparison_pair_id(prompt_id: str, chosen_id: str, rejected_id: str) -> str:
    """The id of a comparison formed outside an annotation tool: a hash of its three ids."""
    return "c" + hashlib.sha256(f"{prompt_id}|{chosen_id}|{rejected_id}".encode("utf-8")).hexdigest()[:16]


def aggregate_majority(annotations: pd.DataFrame, responses: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """One comparison per pair of responses: the response most annotators preferred is `chosen`.

    The labels of every task that showed the same two responses of a prompt count together, in either order (a
    pair shown as A|B and again as B|A is one pair, not two that contradict each other). Its `pair_id` is its task
    id when one task showed it and no other pair has that task id, else a hash of the pair
    (`comparison_pair_id` of the prompt and the two ids in sorted order). Each annotator has one vote per pair: the
    response they preferred in most of their labels of it (one whose labels of it split evenly, e.g. A shown as A|B
    and B shown as B|A, has no vote); before, every label counted, so an annotator who saw the
    pair twice outvoted one who saw it once. Pairs whose votes split evenly give no comparison (counted in the
    report as `tied_tasks`). n_labels = the annotators who voted; label_agreement = the share of them that agree
    with the majority. `task_ids_reused`: task ids that named more than one pair.
    """
    text = dict(zip(responses["response_id"], responses["response"]))
    prompt = dict(zip(responses["response_id"], responses["prompt"]))
    labelled = annotations.assign(
        winner=annotations["response_a_id"].where(annotations["label"] == "a", annotations["response_b_id"]),
        first=annotations[["response_a_id", "response_b_id"]].min(axis=1),
        second=annotations[["response_a_id", "response_b_id"]].max(axis=1))
    pairs_of_task = labelled.groupby("task_id")[["prompt_id", "first", "second"]].nunique().max(axis=1)
    reused = set(pairs_of_task[pairs_of_task > 1].index)
    rows, tied = [], 0
    for (prompt_id, first, second), group in labelled.groupby(["prompt_id", "first", "second"], sort=True):
        # one vote per annotator: +1 for `first`, -1 for `second`, summed over their labels of the pair
        leaning = (group["winner"] == first).astype(int).mul(2).sub(1).groupby(group["annotator"]).sum()
        n_first, n_second = int((leaning > 0).sum()), int((leaning < 0).sum())
        if n_first == n_second:
            tied += 1
            continue
        win, lose = (first, second) if n_first > n_second else (second, first)
        task_ids = sorted(set(group["task_id"]))
        one_task = len(task_ids) == 1 and task_ids[0] not in reused
        rows.append(
            {
                "pair_id": task_ids[0] if one_task else comparison_pair_id(prompt_id, first, second),
                "prompt_id": prompt_id,
                "prompt": prompt[win],
                "chosen": text[win],
                "rejected": text[lose],
                "chosen_id": win,
                "rejected_id": lose,
                "n_labels": n_first + n_second,
                "label_agreement": max(n_first, n_second) / (n_first + n_second),
            }
        )
    cols = ["pair_id", "prompt_id", "prompt", "chosen", "rejected", "chosen_id", "rejected_id", "n_labels",
            "label_agreement"]
    # in pair id order, as when a pair was a task: the table (and so its digest) of tasks that each showed one
    # pair is what it was
    comparisons = pd.DataFrame(rows, columns=cols).sort_values("pair_id", kind="stable").reset_index(drop=True)
    report = {
        "n_pairs": len(comparisons),
        "tied_tasks": tied,
        "task_ids_reused": len(reused),
        "mean_label_agreement": float(comparisons["label_agreement"].mean()) if len(comparisons) else 0.0,
    }
    return comparisons, report
