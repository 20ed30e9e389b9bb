"""Single-answer grading, 1-10 (MT-Bench's "single-v1"): each model's answer rated alone.

A grader is any object with

    grade(prompt, answer) -> Grade

(the LLM judges through the grading prompt, the oracle from gold). Pairwise verdicts say which
answer is better; grades say how good each is on an absolute scale, so two rounds that both win
70 % against SFT can still be told apart. An unparsed reply's rating is NaN: it is left out of
the mean and counted in `grade/unparsed_share`, never read as some number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pandas as pd

from rlhf_core.judge.protocol import map_concurrently
from rlhf_core.judge.stats import bootstrap_mean


@dataclass(frozen=True)
class Grade:
    """One answer's rating in [1, 10] (NaN when the reply could not be parsed), the judge's rationale,
    and whether the reply parsed ("ok", "fallback", "unparsed") and why not."""

    rating: float
    rationale: str
    parse_status: str = "ok"
    parse_reason: str = ""


class Grader(Protocol):
    def grade(self, prompt: str, answer: str) -> Grade:
        """How good `answer` to `prompt` is, 1-10."""
        ...


def grade_judgements(grader: Grader, judgements: pd.DataFrame, prompt_texts: list[str], concurrency: int = 1,
                     n_boot: int = 1000, seed: int = 0) -> tuple[pd.DataFrame, dict[str, float]]:
    """The judgements table with each row's two answers graded, and the mean grade per model.

    Adds grade_a, grade_b, grade_rationale_a/_b, grade_parse_status_a/_b, grade_parse_reason_a/_b
    (`prompt_texts[i]` is row i's prompt). Metrics: <model>/grade (mean over parsed grades),
    <model>/grade_lo, <model>/grade_hi (bootstrap 95 % over prompts), <model>/grade_n (grades parsed),
    and grade/fallback_share, grade/unparsed_share over all answers graded.
    """
    if len(prompt_texts) != len(judgements):
        raise ValueError(f"{len(prompt_texts)} prompts for {len(judgements)} judgements: not the same rows")
    out = judgements.copy()
    metrics: dict[str, float] = {}
    statuses: list[str] = []
    for side in ("a", "b"):
        items = list(zip(prompt_texts, out[f"response_{side}"]))
        grades = map_concurrently(grader.grade, items, concurrency)
        out[f"grade_{side}"] = [g.rating for g in grades]
        out[f"grade_rationale_{side}"] = [g.rationale for g in grades]
        out[f"grade_parse_status_{side}"] = [g.parse_status for g in grades]
        out[f"grade_parse_reason_{side}"] = [g.parse_reason for g in grades]
        statuses += out[f"grade_parse_status_{side}"].tolist()
        model = out[f"model_{side}"].iloc[0] if len(out) else side
        mean, lo, hi = bootstrap_mean(out[f"grade_{side}"].tolist(), n_boot, seed)
        metrics |= {f"{model}/grade": mean, f"{model}/grade_lo": lo, f"{model}/grade_hi": hi,
                    f"{model}/grade_n": float(out[f"grade_{side}"].notna().sum())}
    for status in ("fallback", "unparsed"):
        metrics[f"grade/{status}_share"] = statuses.count(status) / len(statuses) if statuses else float("nan")
    return out, metrics
