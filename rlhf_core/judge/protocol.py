"""Pairwise judging protocol: ask twice with the positions swapped, tie when the orders disagree.

A judge is any object with

    compare(prompt, first, second) -> (outcome, rationale),  outcome in {"first", "second", "tie"}

so an LLM judge (HTTP), a local model and the simulation oracle are interchangeable. Asking in
both orders cancels position bias: a judge that always prefers whatever it sees first gets a
tie on every pair, not a win for whichever model happened to be shown first.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

Outcome = Literal["first", "second", "tie"]
Verdict = Literal["win", "tie", "lose"]
VERDICTS = ("win", "tie", "lose")
T = TypeVar("T")

# What an outcome means for model A, depending on where A was shown.
_A_FIRST = {"first": "win", "second": "lose", "tie": "tie"}
_A_SECOND = {"first": "lose", "second": "win", "tie": "tie"}


class Judge(Protocol):
    def compare(self, prompt: str, first: str, second: str) -> tuple[str, str]:
        """(outcome, rationale): which of two responses to `prompt` is better."""
        ...


@dataclass(frozen=True)
class Judgement:
    """One judge answer for one order; LLM judges also say whether their reply parsed ("ok",
    "fallback", "unparsed": an unparsed reply counts as a tie) and why not."""

    outcome: str
    rationale: str
    parse_status: str = "ok"
    parse_reason: str = ""


def ask(judge: Judge, prompt: str, first: str, second: str) -> Judgement:
    """The judge's `judgement(...)` where it has one (LLM judges), else its `compare(...)` as parsed."""
    detailed = getattr(judge, "judgement", None)
    if detailed is not None:
        return detailed(prompt, first, second)
    return Judgement(*judge.compare(prompt, first, second))


def _verdict(outcome: str, mapping: dict[str, str]) -> str:
    if outcome not in mapping:
        raise ValueError(f"judge returned outcome {outcome!r}; expected one of {sorted(mapping)}")
    return mapping[outcome]


def judge_pair_row(judge: Judge, prompt: str, response_a: str, response_b: str) -> dict[str, str]:
    """Both orders of one pair, for the judgements table: verdict (for model A), verdict_ab, verdict_ba,
    rationale (both orders), rationale_ab, rationale_ba, parse_status_ab/_ba, parse_reason_ab/_ba."""
    ab = ask(judge, prompt, response_a, response_b)  # A shown first
    ba = ask(judge, prompt, response_b, response_a)  # B shown first
    verdict_ab = _verdict(ab.outcome, _A_FIRST)
    verdict_ba = _verdict(ba.outcome, _A_SECOND)  # mapped back to A's perspective
    return {"verdict": verdict_ab if verdict_ab == verdict_ba else "tie", "verdict_ab": verdict_ab,
            "verdict_ba": verdict_ba, "rationale": f"[A first] {ab.rationale} [B first] {ba.rationale}",
            "rationale_ab": ab.rationale, "rationale_ba": ba.rationale,
            "parse_status_ab": ab.parse_status, "parse_status_ba": ba.parse_status,
            "parse_reason_ab": ab.parse_reason, "parse_reason_ba": ba.parse_reason}


def map_concurrently(fn: Callable[..., T], items: list[tuple], concurrency: int = 1) -> list[T]:
    """[fn(*item) for item in items], in order, `concurrency` at once (a thread pool: LLM judges wait on
    the network, and their rate limit is the API's)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if concurrency == 1:
        return [fn(*item) for item in items]
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="judge") as pool:
        return list(pool.map(lambda item: fn(*item), items))


def judge_pairs(judge: Judge, pairs: list[tuple[str, str, str]], concurrency: int = 1) -> list[dict[str, str]]:
    """`judge_pair_row` of every (prompt, response_a, response_b), in order; `concurrency` pairs at once."""
    return map_concurrently(lambda *pair: judge_pair_row(judge, *pair), pairs, concurrency)


def judge_pair_with_rationale(judge: Judge, prompt: str, response_a: str, response_b: str) -> tuple[str, str, str, str]:
    """(verdict, verdict_ab, verdict_ba, rationale) for model A; the rationale joins both orders."""
    row = judge_pair_row(judge, prompt, response_a, response_b)
    return row["verdict"], row["verdict_ab"], row["verdict_ba"], row["rationale"]


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
