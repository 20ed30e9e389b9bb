"""Comparison tasks sent to annotators: pairs of distinct responses to the same prompt."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd


def task_id(prompt_id: str, a_id: str, b_id: str) -> str:
    return "t" + hashlib.sha256(f"{prompt_id}|{a_id}|{b_id}".encode()).hexdigest()[:16]


def make_comparison_tasks(responses: pd.DataFrame, pairs_per_prompt: int, seed: int) -> pd.DataFrame:
    """Per prompt, shuffle its distinct responses (identical texts kept once) and pair them up
    disjointly, at most `pairs_per_prompt` pairs. Columns: task_id, prompt_id, prompt,
    response_a_id, response_a, response_b_id, response_b."""
    rng = np.random.default_rng(seed)
    rows = []
    for prompt_id, group in responses.groupby("prompt_id", sort=True):
        distinct = group.drop_duplicates("response")
        order = rng.permutation(len(distinct))
        for k in range(min(pairs_per_prompt, len(order) // 2)):
            a = distinct.iloc[int(order[2 * k])]
            b = distinct.iloc[int(order[2 * k + 1])]
            rows.append(
                {
                    "task_id": task_id(prompt_id, a.response_id, b.response_id),
                    "prompt_id": prompt_id,
                    "prompt": a.prompt,
                    "response_a_id": a.response_id,
                    "response_a": a.response,
                    "response_b_id": b.response_id,
                    "response_b": b.response,
                }
            )
    return pd.DataFrame(rows, columns=["task_id", "prompt_id", "prompt", "response_a_id", "response_a",
                                       "response_b_id", "response_b"])


def label_studio_task_data(task) -> dict[str, str]:
    """One comparison task (a row of `make_comparison_tasks`) as a Label Studio task's `data`: the texts the pairwise
    template shows ($prompt, $answer1, $answer2) and the ids the import joins its judgement on."""
    return {"prompt": task.prompt, "answer1": task.response_a, "answer2": task.response_b, "task_id": task.task_id,
            "prompt_id": task.prompt_id, "answer1_id": task.response_a_id, "answer2_id": task.response_b_id}


def label_studio_tasks(tasks: pd.DataFrame) -> list[dict]:
    """Label Studio's import JSON for `make_comparison_tasks`' rows (json.dump it, then import it into a project
    with the pairwise template of rlhf_core/sim/annotators.py's docstring)."""
    return [{"data": label_studio_task_data(task)} for task in tasks.itertuples(index=False)]
