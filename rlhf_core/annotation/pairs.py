"""Comparison pairs from per-annotator judgements."""

from __future__ import annotations

import hashlib

import pandas as pd


def comparison_pair_id(prompt_id: str, chosen_id: str, rejected_id: str) -> str:
    """The id of a comparison formed outside an annotation tool: a hash of its three ids."""
    return "c" + hashlib.sha256(f"{prompt_id}|{chosen_id}|{rejected_id}".encode("utf-8")).hexdigest()[:16]


def aggregate_majority(annotations: pd.DataFrame, responses: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """One comparison per task: the response most annotators preferred is `chosen`.

    Tasks whose labels split evenly give no pair (counted in the report as `tied_tasks`).
    label_agreement = share of the task's labels that agree with the majority.
    """
    text = dict(zip(responses["response_id"], responses["response"]))
    prompt = dict(zip(responses["response_id"], responses["prompt"]))
    rows, tied = [], 0
    for task_id, group in annotations.groupby("task_id", sort=True):
        n_a = int((group["label"] == "a").sum())
        n_b = int((group["label"] == "b").sum())
        if n_a == n_b:
            tied += 1
            continue
        first = group.iloc[0]
        win, lose = (first.response_a_id, first.response_b_id) if n_a > n_b else (first.response_b_id, first.response_a_id)
        rows.append(
            {
                "pair_id": task_id,
                "prompt_id": first.prompt_id,
                "prompt": prompt[win],
                "chosen": text[win],
                "rejected": text[lose],
                "chosen_id": win,
                "rejected_id": lose,
                "n_labels": n_a + n_b,
                "label_agreement": max(n_a, n_b) / (n_a + n_b),
            }
        )
    cols = ["pair_id", "prompt_id", "prompt", "chosen", "rejected", "chosen_id", "rejected_id", "n_labels",
            "label_agreement"]
    comparisons = pd.DataFrame(rows, columns=cols)
    report = {
        "n_pairs": len(comparisons),
        "tied_tasks": tied,
        "mean_label_agreement": float(comparisons["label_agreement"].mean()) if len(comparisons) else 0.0,
    }
    return comparisons, report
