"""Judge protocol (position swap, tie on disagreement) and the gold-backed oracle judge."""

from __future__ import annotations

import math

import pytest

from rlhf_core.judge import OracleJudge, judge_pair, judge_pair_with_rationale, summarize


class AlwaysFirst:
    """A maximally position-biased judge."""

    def compare(self, prompt, first, second):
        return "first", "the first one reads better"


class PrefersLonger:
    """An order-independent judge with a consistent taste."""

    def compare(self, prompt, first, second):
        if len(first) == len(second):
            return "tie", "same length"
        return ("first" if len(first) > len(second) else "second"), "longer is better"


class Broken:
    def compare(self, prompt, first, second):
        return "A", "unparsed"


def test_position_biased_judge_gives_only_ties():
    verdicts = [judge_pair(AlwaysFirst(), "q", a, b) for a, b in [("x", "yy"), ("yy", "x"), ("z", "z")]]
    assert verdicts == [("tie", "win", "lose")] * 3
    assert summarize([v for v, _, _ in verdicts]) == {"win_rate": 0.0, "tie_rate": 1.0, "lose_rate": 0.0, "n": 3}


def test_consistent_judge_verdicts_are_mapped_back_to_a():
    assert judge_pair(PrefersLonger(), "q", "long answer", "short") == ("win", "win", "win")
    assert judge_pair(PrefersLonger(), "q", "short", "long answer") == ("lose", "lose", "lose")
    assert judge_pair(PrefersLonger(), "q", "same", "SAME") == ("tie", "tie", "tie")


def test_unknown_outcome_is_an_error():
    with pytest.raises(ValueError, match="'A'"):
        judge_pair(Broken(), "q", "a", "b")


def test_oracle_on_hand_examples():
    judge = OracleJudge(tie_margin=0.25)
    p = "What is 7+8? Be brief."
    # right and brief (gold 2.6) vs off by one with filler (gold 1.0)
    assert judge_pair(judge, p, " 15", " It is 16.") == ("win", "win", "win")
    assert judge_pair(judge, p, " It is 16.", " 15") == ("lose", "lose", "lose")
    # off by two vs off by three: gold 0.5 vs 0.25, exactly at the margin -> still a win
    assert judge_pair(judge, p, " It is 13.", " It is 18.") == ("win", "win", "win")
    # off by three on either side: equal gold -> tie
    assert judge_pair(judge, p, " It is 12.", " It is 18.") == ("tie", "tie", "tie")
    # a difference below the margin is a tie
    assert judge_pair(OracleJudge(tie_margin=0.5), p, " It is 13.", " It is 18.") == ("tie", "tie", "tie")


def test_oracle_rationale_states_both_gold_scores():
    outcome, rationale = OracleJudge(0.25).compare("What is 2*3?", " It is 6.", " It is 7.")
    assert outcome == "first"
    assert "gold(first)=2.000" in rationale and "gold(second)=1.000" in rationale
    *_, joined = judge_pair_with_rationale(OracleJudge(0.25), "What is 2*3?", " It is 6.", " It is 7.")
    assert "[A first]" in joined and "[B first]" in joined


def test_oracle_zero_margin_ties_only_on_equal_gold():
    judge = OracleJudge(tie_margin=0.0)
    assert judge.compare("What is 1+1?", " It is 2.", " It is 2.")[0] == "tie"
    assert judge.compare("What is 1+1?", " It is 2.", " It is 3.")[0] == "first"
    with pytest.raises(ValueError):
        OracleJudge(tie_margin=-1)


def test_summarize():
    s = summarize(["win", "win", "tie", "lose"])
    assert s == {"win_rate": 0.5, "tie_rate": 0.25, "lose_rate": 0.25, "n": 4}
    empty = summarize([])
    assert empty["n"] == 0 and math.isnan(empty["win_rate"])
    with pytest.raises(ValueError, match="draw"):
        summarize(["win", "draw"])
