"""The simulation's oracle judge: compares the hidden gold scores of two responses, and grades one 1-10.

The grade is a monotone map of gold, per prompt (`gold_rating`): 1 for an answer no better than
one with no number at all (gold MISSING_ANSWER = -1), 10 for one as good as the world's ideal
answer to that prompt (the right number, every style instruction followed), linear between:

    rating = 1 + 9 * clip((gold - MISSING_ANSWER) / (gold(ideal) - MISSING_ANSWER), 0, 1)
"""

from __future__ import annotations

from rlhf_core.judge.grading import Grade
from rlhf_core.sim.world import GOLD_TIE, MISSING_ANSWER, gold_score, ideal_response


def gold_rating(gold: float, gold_ideal: float) -> float:
    """1-10 from gold: 1 at or below MISSING_ANSWER, 10 at or above gold_ideal, linear between."""
    share = (gold - MISSING_ANSWER) / (gold_ideal - MISSING_ANSWER)  # gold_ideal >= 2 > MISSING_ANSWER
    return 1.0 + 9.0 * min(max(share, 0.0), 1.0)


class OracleJudge:
    """outcome = "first" if gold(first) - gold(second) >= tie_margin,
    "second" if it is <= -tie_margin, else "tie" (a difference within GOLD_TIE, float rounding of equal gold, is
    always a tie, as every gold tie of the pipeline)."""

    def __init__(self, tie_margin: float):
        if tie_margin < 0:
            raise ValueError(f"tie_margin must be >= 0, got {tie_margin}")
        self.tie_margin = tie_margin

    def compare(self, prompt: str, first: str, second: str) -> tuple[str, str]:
        g_first, g_second = gold_score(prompt, first), gold_score(prompt, second)
        diff = g_first - g_second
        if diff >= self.tie_margin and diff > GOLD_TIE:
            outcome = "first"
        elif diff <= -self.tie_margin and diff < -GOLD_TIE:
            outcome = "second"
        else:
            outcome = "tie"
        rationale = (
            f"gold(first)={g_first:.3f}, gold(second)={g_second:.3f}, "
            f"difference {diff:+.3f} vs tie margin {self.tie_margin:.3f}: {outcome}"
        )
        return outcome, rationale

    def grade(self, prompt: str, answer: str) -> Grade:
        gold, gold_ideal = gold_score(prompt, answer), gold_score(prompt, ideal_response(prompt))
        rating = gold_rating(gold, gold_ideal)
        return Grade(rating, f"gold={gold:.3f}, ideal answer's gold={gold_ideal:.3f}: rating {rating:.2f}")
