"""The simulation's oracle judge: compares the hidden gold scores of two responses."""

from __future__ import annotations

from rlhf_core.sim.world import gold_score


class OracleJudge:
    """outcome = "first" if gold(first) - gold(second) >= tie_margin,
    "second" if it is <= -tie_margin, else "tie" (a zero difference is always a tie)."""

    def __init__(self, tie_margin: float):
        if tie_margin < 0:
            raise ValueError(f"tie_margin must be >= 0, got {tie_margin}")
        self.tie_margin = tie_margin

    def compare(self, prompt: str, first: str, second: str) -> tuple[str, str]:
        g_first, g_second = gold_score(prompt, first), gold_score(prompt, second)
        diff = g_first - g_second
        if diff >= self.tie_margin and diff > 0:
            outcome = "first"
        elif diff <= -self.tie_margin and diff < 0:
            outcome = "second"
        else:
            outcome = "tie"
        rationale = (
            f"gold(first)={g_first:.3f}, gold(second)={g_second:.3f}, "
            f"difference {diff:+.3f} vs tie margin {self.tie_margin:.3f}: {outcome}"
        )
        return outcome, rationale
