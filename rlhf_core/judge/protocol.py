"""Pairwise judging protocol: ask twice with the positions swapped, tie when the orders disagree.

A judge is any object with

    compare(prompt, first, second) -> (outcome, rationale),  outcome in {"first", "second", "tie"}

so an LLM judge (HTTP), a local model and the simulation oracle are interchangeable. Asking in
both orders cancels position bias: a judge that always prefers whatever it sees first gets a
tie on every pair, not a win for whichever model happened to be shown first.
"""

from __future__ import annotations

from typing import Literal, Protocol

Outcome = Literal["first", "second", "tie"]
Verdict = Literal["win", "tie", "lose"]
VERDICTS = ("win", "tie", "lose")

# What an outcome means for model A, depending on where A was shown.
_A_FIRST = {"first": "win", "second": "lose", "tie": "tie"}
_A_SECOND = {"first": "lose", "second": "win", "tie": "tie"}


class Judge(Protocol):
    def compare(self, prompt: str, first: str, second: str) -> tuple[str, str]:
        """(outcome, rationale): which of two responses to `prompt` is better."""
        ...


def _verdict(outcome: str, mapping: dict[str, str]) -> str:
    if outcome not in mapping:
        raise ValueError(f"judge returned outcome {outcome!r}; expected one of {sorted(mapping)}")
    return mapping[outcome]


def judge_pair_with_rationale(judge: Judge, prompt: str, response_a: str, response_b: str) -> tuple[str, str, str, str]:
    """(verdict, verdict_ab, verdict_ba, rationale) for model A; the rationale joins both orders."""
    outcome_ab, why_ab = judge.compare(prompt, response_a, response_b)  # A shown first
    outcome_ba, why_ba = judge.compare(prompt, response_b, response_a)  # B shown first
    verdict_ab = _verdict(outcome_ab, _A_FIRST)
    verdict_ba = _verdict(outcome_ba, _A_SECOND)  # mapped back to A's perspective
    verdict = verdict_ab if verdict_ab == verdict_ba else "tie"
    rationale = f"[A first] {why_ab} [B first] {why_ba}"
    return verdict, verdict_ab, verdict_ba, rationale


def judge_pair(judge: Judge, prompt: str, response_a: str, response_b: str) -> tuple[str, str, str]:
    """(verdict, verdict_ab, verdict_ba) for model A in {"win", "tie", "lose"}.

    verdict_ab: judged with A shown first; verdict_ba: with B shown first, mapped back to A.
    verdict = verdict_ab if the two orders agree, else "tie".
    """
    return judge_pair_with_rationale(judge, prompt, response_a, response_b)[:3]


def summarize(verdicts: list[str]) -> dict:
    """win_rate, tie_rate, lose_rate (shares of n; NaN when n = 0) and n."""
    unknown = sorted(set(verdicts) - set(VERDICTS))
    if unknown:
        raise ValueError(f"unknown verdict(s) {unknown}; expected {VERDICTS}")
    n = len(verdicts)
    rate = (lambda v: verdicts.count(v) / n) if n else (lambda v: float("nan"))
    return {"win_rate": rate("win"), "tie_rate": rate("tie"), "lose_rate": rate("lose"), "n": n}
