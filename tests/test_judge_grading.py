"""Single-answer grading 1-10 (MT-Bench single-v1): rating parsing, the oracle's map of gold, the HTTP judge
against a real oracle-backed server on 127.0.0.1, the cache, and the mean grade with its bootstrap interval."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from judge_server import JudgeServer

from rlhf_core.judge.cache import JudgementCache
from rlhf_core.judge.grading import grade_judgements
from rlhf_core.judge.http import HTTPJudge
from rlhf_core.judge.oracle import OracleJudge, gold_rating
from rlhf_core.judge.prompt import criteria_text, grading_criteria_text, grading_messages, parse_rating
from rlhf_core.judge.stats import bootstrap_mean

P = "What is 7+8? Be brief."  # the ideal answer " 15" has gold 2 + 0.6 (brief) = 2.6
GOOD, BAD = " 15", " It is 16."  # gold 2.6 -> 10; gold 1.0 -> 1 + 9 * (1 + 1) / (2.6 + 1) = 6.0


def make_judge(server, **kw) -> HTTPJudge:
    return HTTPJudge(server.base_url, "gpt-4", criteria_text("helpfulness"), "pairwise-v1", api_key=None,
                     backoff_s=0.01, timeout_s=5.0, max_retries=1,
                     grading_criteria=grading_criteria_text("helpfulness"), **kw)


def test_ratings_parse_strictly_then_by_fallbacks_and_record_failures():
    assert (parse_rating("[[7]]").rating, parse_rating("[[7]]").status) == (7.0, "ok")
    assert (parse_rating("Concise and right. Rating: [[10]]").rating, parse_rating("Rating: [[10]]").status) == (10.0, "ok")
    assert parse_rating("[[7.5]]").rating == 7.5 and parse_rating("[[5]] ... Rating: [[5.0]]").status == "ok"
    garbage = parse_rating("The answer is fine, I suppose.")
    assert math.isnan(garbage.rating) and garbage.status == "unparsed"
    assert garbage.reason == "no rating found in the reply: 'The answer is fine, I suppose.'"
    conflict = parse_rating("First [[3]], then [[8]]")
    assert math.isnan(conflict.rating) and conflict.reason == "conflicting ratings [[3]], [[8]]"
    assert parse_rating("[[11]]").reason == "rating 11 is outside 1-10" and math.isnan(parse_rating("[[0]]").rating)
    assert (parse_rating("Rating: [6]").rating, parse_rating("Rating: [6]").status) == (6.0, "fallback")
    assert (parse_rating("Rating: 8").rating, parse_rating("I give it 4/10").rating) == (8.0, 4.0)
    assert parse_rating("[[A]]").status == "unparsed"  # a pairwise verdict is no rating
    # a rating line outranks a bracketed citation before it ([2] was read before), and the last line counts
    assert parse_rating("Reference [2] in the answer is outdated, otherwise solid. Rating: 8").rating == 8.0
    assert parse_rating("Score: 4 at first; on reflection, rating: 6").rating == 6.0


def test_the_grading_prompt_is_mt_benchs_single_v1_and_other_criteria_change_one_sentence():
    system, user = grading_messages("Q?", "Ans", grading_criteria_text("helpfulness"))
    assert system == {"role": "system", "content": "You are a helpful assistant."}
    assert user["content"].startswith("[Instruction]\nPlease act as an impartial judge and evaluate the quality of the "
                                      "response provided by an AI assistant to the user question displayed below. "
                                      "Your evaluation should consider factors such as the helpfulness")
    assert user["content"].endswith('for example: "Rating: [[5]]".\n\n[Question]\nQ?\n\n'
                                    "[The Start of Assistant's Answer]\nAns\n[The End of Assistant's Answer]")
    harmless = grading_messages("Q?", "Ans", grading_criteria_text("harmlessness"))[1]["content"]
    assert "how harmless the response is" in harmless and "creativity" not in harmless
    assert "consider this: counts the primes right." in grading_criteria_text("custom", "counts the primes right.")
    with pytest.raises(ValueError, match="unknown grading template 'single-v9'"):
        grading_messages("Q?", "Ans", "x", "single-v9")


def test_oracle_grades_are_monotone_in_gold():
    oracle = OracleJudge(tie_margin=0.25)
    q = "What is 7+8?"  # no style instruction: the ideal " It is 15." has gold 2.0; floor gold -1 (no number)
    answers = [" It is 15.", " It is 15.\x01\x02\x03", " It is 16.", " It is 17.", " I do not know.", "\x01" * 30]
    # gold 2.0, 1.7 (3 garbage bytes), 1.0, 0.5, -1.0 (no number), below -1 -> 1 + 9 * (gold + 1) / 3, clipped
    assert [oracle.grade(q, a).rating for a in answers] == pytest.approx([10.0, 9.1, 7.0, 5.5, 1.0, 1.0])
    assert oracle.grade(P, GOOD).rating == 10.0 and oracle.grade(P, BAD).rating == pytest.approx(6.0)
    golds = [-3.0, -1.0, 0.0, 0.5, 1.0, 2.6, 4.0]
    ratings = [gold_rating(g, gold_ideal=2.6) for g in golds]
    assert ratings == sorted(ratings) and (ratings[0], ratings[-1]) == (1.0, 10.0)
    assert ratings[2] == pytest.approx(1 + 9 * 1 / 3.6)


def test_http_judge_grades_from_the_oracle_server_and_records_a_garbage_reply(server):
    judge = make_judge(server)
    good, bad = judge.grade(P, GOOD), judge.grade(P, BAD)
    assert (good.rating, good.parse_status) == (10.0, "ok") and bad.rating == 6.0  # the server writes one decimal
    assert "Rating: [[6.0]]" in bad.rationale
    sent = server.requests[0]["body"]
    assert sent["temperature"] == 0 and sent["messages"][1]["content"].startswith("[Instruction]")
    server.always = "Both fine, really."
    garbage = judge.grade(P, " 14")
    assert math.isnan(garbage.rating) and garbage.parse_status == "unparsed"
    assert judge.usage["requests"] == 3 and judge.usage["unparsed"] == 1


def test_the_cache_makes_a_regrading_send_no_request(server, tmp_path):
    server.script = [("reply", "Unclear. Rating: [[maybe]]")]  # the first request gets an unparsable reply
    first = make_judge(server, cache=JudgementCache(tmp_path / "judgements.sqlite"))
    grades = [first.grade(P, a) for a in (" 14", GOOD, BAD)]
    assert math.isnan(grades[0].rating) and [g.rating for g in grades[1:]] == [10.0, 6.0]
    assert len(server.requests) == 3

    again = make_judge(server, cache=JudgementCache(tmp_path / "judgements.sqlite"))
    regraded = [again.grade(P, a) for a in (" 14", GOOD, BAD)]
    assert len(server.requests) == 3 and again.usage["requests"] == 0 and again.usage["cache_hits"] == 3
    assert math.isnan(regraded[0].rating) and regraded[0].parse_status == "unparsed"  # kept as unparsed
    assert regraded[1:] == grades[1:]
    assert again.judgement(P, GOOD, BAD).outcome == "first" and len(server.requests) == 4  # grades are not verdicts


def test_grade_judgements_adds_both_answers_grades_and_means_with_intervals():
    table = pd.DataFrame({"prompt_id": ["p1", "p2", "p3"], "model_a": "policy", "model_b": "sft",
                          "response_a": [" 15", " 15", " It is 16."], "response_b": [" It is 16."] * 3})
    out, metrics = grade_judgements(OracleJudge(0.25), table, [P, P, "What is 7+8?"], n_boot=200)
    # policy: 10, 10, 7.0 (no style asked: 1 + 9 * 2/3); sft: 6.0, 6.0, 7.0
    assert out["grade_a"].tolist() == pytest.approx([10.0, 10.0, 7.0])
    assert out["grade_b"].tolist() == pytest.approx([6.0, 6.0, 7.0])
    assert metrics["policy/grade"] == pytest.approx(9.0) and metrics["sft/grade"] == pytest.approx(19 / 3)
    assert 7.0 <= metrics["policy/grade_lo"] <= 9.0 <= metrics["policy/grade_hi"] <= 10.0
    assert (metrics["policy/grade_n"], metrics["grade/unparsed_share"]) == (3.0, 0.0)
    assert set(out["grade_parse_status_a"]) == {"ok"} and out["grade_rationale_b"][0].startswith("gold=1.000")


def test_bootstrap_mean_leaves_unparsed_grades_out():
    nan = float("nan")
    assert bootstrap_mean([7.0, nan, 7.0, 7.0]) == (7.0, 7.0, 7.0)  # constant: a zero-width interval
    mean, lo, hi = bootstrap_mean([2.0, 4.0, nan, 6.0, 8.0], n_boot=2000, seed=1)
    assert mean == 5.0 and 2.0 < lo < 5.0 < hi < 8.0
    assert bootstrap_mean([2.0, 4.0, 6.0, 8.0], seed=1) == bootstrap_mean([2.0, 4.0, 6.0, 8.0], seed=1)
    assert all(math.isnan(x) for x in bootstrap_mean([nan, nan]))


@pytest.fixture
def server():
    with JudgeServer() as s:
        yield s
