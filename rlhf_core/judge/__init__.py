"""Pairwise judging: the protocol (both orders, tie on disagreement) and the judges behind it."""

from rlhf_core.judge.oracle import OracleJudge
from rlhf_core.judge.protocol import judge_pair, judge_pair_with_rationale, summarize

__all__ = ["OracleJudge", "judge_pair", "judge_pair_with_rationale", "summarize"]
