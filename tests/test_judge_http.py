"""The HTTP judge against a real chat-completions server on 127.0.0.1 that answers from the oracle."""

from __future__ import annotations

import pytest
from judge_server import COMPLETION_TOKENS, PROMPT_TOKENS, JudgeServer

from rlhf_core.judge.cache import JudgementCache
from rlhf_core.judge.http import HTTPJudge, JudgeError
from rlhf_core.judge.prompt import criteria_text, parse_verdict
from rlhf_core.judge.protocol import judge_pair, judge_pairs

KEY = "sk-test-6f1c2a9e-never-log-me"
P = "What is 7+8? Be brief."
GOOD, BAD = " 15", " It is 16."  # gold 2.6 vs 1.0: the oracle prefers GOOD in either order
# win, lose (gold 0.5 vs 2.6), tie (off by three either side); six different (first, second) orders
PAIRS = [(P, GOOD, BAD), (P, " It is 13.", GOOD), (P, " It is 12.", " It is 18.")]


@pytest.fixture
def server():
    with JudgeServer() as s:
        yield s


def make_judge(server, criteria: str = "helpfulness", **kw) -> HTTPJudge:
    options = dict(api_key=KEY, backoff_s=0.01, timeout_s=5.0, max_retries=2) | kw
    return HTTPJudge(server.base_url, "gpt-4", criteria_text(criteria), "pairwise-v1", **options)


def test_oracle_backed_server_judges_both_orders_and_counts_tokens(server):
    judge = make_judge(server, price_input_per_1k=0.03, price_output_per_1k=0.06)
    assert judge_pair(judge, P, GOOD, BAD) == ("win", "win", "win")
    sent = server.requests[0]
    assert sent["body"]["temperature"] == 0 and sent["body"]["model"] == "gpt-4"
    assert sent["headers"]["Authorization"] == f"Bearer {KEY}"
    assert judge.usage["requests"] == 2 and judge.usage["retries"] == 0
    assert (judge.usage["prompt_tokens"], judge.usage["completion_tokens"]) == (2 * PROMPT_TOKENS, 2 * COMPLETION_TOKENS)
    # 200 prompt tokens at $0.03/1k + 40 completion tokens at $0.06/1k = 0.006 + 0.0024
    assert judge.cost_usd == pytest.approx(0.0084)
    assert KEY not in repr(judge)


def test_429_is_retried_after_the_servers_retry_after(server):
    server.script = [("status", 429, {"Retry-After": "0.4"})]
    judge = make_judge(server, backoff_s=0.0)  # without Retry-After the retry would come at once
    assert judge.compare(P, GOOD, BAD)[0] == "first"
    assert judge.usage["requests"] == 2 and judge.usage["retries"] == 1
    assert server.requests[1]["time"] - server.requests[0]["time"] >= 0.4


def test_500_is_retried_with_backoff(server):
    server.script = [("status", 500, {}), ("status", 503, {})]
    judge = make_judge(server, backoff_s=0.1)
    assert judge.compare(P, BAD, GOOD)[0] == "second"
    assert judge.usage["requests"] == 3
    gaps = [b["time"] - a["time"] for a, b in zip(server.requests, server.requests[1:])]
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2  # 0.1 s, then doubled


def test_400_is_not_retried_and_the_error_never_shows_the_key(server):
    server.script = [("status", 400, {})]
    judge = make_judge(server)
    with pytest.raises(JudgeError, match="HTTP 400.*not retried") as err:
        judge.compare(P, GOOD, BAD)
    assert len(server.requests) == 1
    assert KEY not in str(err.value) and "***" in str(err.value)  # the server echoed the header


def test_5xx_until_the_retries_run_out_is_an_error(server):
    server.script = [("status", 502, {})] * 3
    with pytest.raises(JudgeError, match="gave up after 3 attempts: HTTP 502"):
        make_judge(server).compare(P, GOOD, BAD)


def test_malformed_replies_are_retried_then_uncached_ties_with_a_recorded_parse_status(server, tmp_path):
    server.script = [("body", {"choices": []})] * 3 + [("reply", "Both answers have merit.")]
    judge = make_judge(server, cache=JudgementCache(tmp_path / "judgements.sqlite"))
    row = judge_pairs(judge, [(P, GOOD, BAD)])[0]
    assert (row["verdict_ab"], row["verdict_ba"], row["verdict"]) == ("tie", "tie", "tie")
    assert (row["parse_status_ab"], row["parse_status_ba"]) == ("unparsed", "unparsed")
    assert row["parse_reason_ab"].startswith("malformed response body")
    assert row["parse_reason_ba"] == "no verdict found in the reply: 'Both answers have merit.'"
    assert len(server.requests) == 4 and judge.usage["retries"] == 2  # the body without a reply was asked again
    # a re-run asks again where no reply came (an outage's tie was cached for good before), not where one came
    again = make_judge(server, cache=JudgementCache(tmp_path / "judgements.sqlite"))
    row = judge_pairs(again, [(P, GOOD, BAD)])[0]
    assert (row["verdict_ab"], row["parse_status_ab"], row["parse_status_ba"]) == ("win", "ok", "unparsed")
    assert len(server.requests) == 5 and again.usage["cache_hits"] == 1


def test_cached_replies_are_read_again_by_todays_parser_and_cached_outages_asked_again(server, tmp_path):
    from rlhf_core.judge.cache import judgement_key
    from rlhf_core.judge.protocol import Judgement

    cache = JudgementCache(tmp_path / "judgements.sqlite")
    judge = make_judge(server, cache=cache)
    key = lambda first, second: judgement_key("http", judge.key_model(), "pairwise-v1",  # noqa: E731
                                              criteria_text("helpfulness"), P, first, second)
    misread = "Assistant B cites source [B] wrongly, while A is correct. Final verdict: A"
    cache.put(key(GOOD, BAD), Judgement("second", misread, "fallback", "no [[X]] verdict; read the [X]"))
    cache.put(key(BAD, GOOD), Judgement("tie", "", "unparsed", "malformed response body: '{}'"))  # kept before
    row = judge_pairs(judge, [(P, GOOD, BAD)])[0]
    assert (row["verdict_ab"], row["parse_status_ab"]) == ("win", "fallback")  # the paid reply, read again
    assert (row["verdict_ba"], row["parse_status_ba"]) == ("win", "ok")  # the outage's tie: asked again
    assert len(server.requests) == 1 and judge.usage["cache_hits"] == 1


def test_a_retry_after_that_is_not_a_number_falls_back_to_the_backoff(server):
    server.script = [("status", 503, {"Retry-After": "nan"})]  # time.sleep(nan) raised a bare ValueError before
    judge = make_judge(server, backoff_s=0.0)
    assert judge.compare(P, GOOD, BAD)[0] == "first" and judge.usage["retries"] == 1


def test_a_key_an_http_header_cannot_carry_is_refused_unsent_and_unshown(server):
    # a byte-order mark (a key file saved by Notepad) or a zero-width space failed inside httpx before, with the
    # whole "Bearer <key>" header in the exception that Prefect logs for a failed task
    for bad in ("\ufeffsk-test-abc", "sk-test\u200babc", {"key": "sk-test-abc"}):
        with pytest.raises(ValueError, match="API key") as err:
            make_judge(server, api_key=bad)
        assert "sk-test" not in str(err.value) and "sk-test" not in repr(err.value)
    assert server.requests == []


def test_the_same_pair_asked_by_concurrent_threads_is_paid_for_once(server, tmp_path):
    judge = make_judge(server, cache=JudgementCache(tmp_path / "judgements.sqlite"))
    rows = judge_pairs(judge, [(P, GOOD, BAD)] * 4, concurrency=4)  # 8 requests for 2 distinct keys before
    assert [r["verdict"] for r in rows] == ["win"] * 4
    assert len(server.requests) == 2 and judge.usage["cache_hits"] == 6


def test_a_timeout_is_retried_and_without_retries_is_an_error(server):
    server.script = [("sleep", 1.0)]
    judge = make_judge(server, timeout_s=0.3)
    assert judge.compare(P, GOOD, BAD)[0] == "first"
    assert judge.usage["retries"] == 1
    server.script = [("sleep", 1.0)]
    with pytest.raises(JudgeError, match="gave up after 1 attempts: ReadTimeout"):
        make_judge(server, timeout_s=0.3, max_retries=0).compare(P, GOOD, BAD)


def test_the_cache_makes_a_second_run_send_no_request(server, tmp_path):
    first = make_judge(server, cache=JudgementCache(tmp_path / "judgements.sqlite"))
    rows = judge_pairs(first, PAIRS, concurrency=3)
    assert [r["verdict"] for r in rows] == ["win", "lose", "tie"]
    assert len(server.requests) == 6  # three pairs, both orders

    again = make_judge(server, cache=JudgementCache(tmp_path / "judgements.sqlite"))  # a new process would
    assert judge_pairs(again, PAIRS) == rows
    assert len(server.requests) == 6 and again.usage["requests"] == 0 and again.usage["cache_hits"] == 6

    other_criteria = make_judge(server, criteria="harmlessness", cache=JudgementCache(tmp_path / "judgements.sqlite"))
    judge_pairs(other_criteria, PAIRS[:1])
    assert len(server.requests) == 8  # the criteria are part of the key

    cut_short = make_judge(server, max_tokens=16, cache=JudgementCache(tmp_path / "judgements.sqlite"))
    judge_pairs(cut_short, PAIRS[:1])
    assert len(server.requests) == 10  # a reply limit other than the default is part of the key
    default_limits = make_judge(server, max_tokens=1024)
    assert default_limits.key_model() == f"gpt-4@{default_limits.url}"  # the default limits add nothing

    with JudgeServer() as other:  # another server under the same model name: judged afresh, not from the cache
        elsewhere = make_judge(other, cache=JudgementCache(tmp_path / "judgements.sqlite"))
        judge_pairs(elsewhere, PAIRS[:1])
        assert len(other.requests) == 2 and elsewhere.usage["cache_hits"] == 0
    openai = HTTPJudge("https://api.openai.com/v1", "gpt-4", criteria_text("helpfulness"), "pairwise-v1")
    assert openai.key_model() == "gpt-4"  # OpenAI's own endpoint adds nothing: its caches written before hold


def test_a_judge_that_always_prefers_the_first_answer_yields_only_ties(server):
    server.always = "Assistant A is clearly better. [[A]]"
    rows = judge_pairs(make_judge(server), PAIRS, concurrency=2)
    assert [(r["verdict"], r["verdict_ab"], r["verdict_ba"]) for r in rows] == [("tie", "win", "lose")] * 3


def test_verdict_parsing_strict_then_fallbacks():
    assert parse_verdict("A explains more. [[A]]") == parse_verdict("[[a]]")
    assert (parse_verdict("[[B]]").outcome, parse_verdict("[[B]]").status) == ("second", "ok")
    assert (parse_verdict("[[C]]").outcome, parse_verdict("[[C]]").status) == ("tie", "ok")
    conflict = parse_verdict("At first [[A]], on reflection [[B]]")
    assert (conflict.outcome, conflict.status, conflict.reason) == ("tie", "unparsed", "conflicting verdicts [[A]], [[B]]")
    assert (parse_verdict("Final verdict: [B]").outcome, parse_verdict("Final verdict: [B]").status) == ("second", "fallback")
    assert parse_verdict("Final verdict: **Assistant A**").outcome == "first"
    for tie in ("My verdict is a tie", "Final verdict: A tie.", "Verdict: A tie - both equally correct",
                "Verdict: a draw"):  # "a" / "A" is the article, not assistant A
        assert (parse_verdict(tie).outcome, parse_verdict(tie).status) == ("tie", "fallback"), tie
    assert parse_verdict("Verdict: A is better").outcome == "first"
    assert parse_verdict("").reason == "no verdict found in the reply: '<empty reply>'"
    # a verdict line outranks a bracket quoted in the explanation, and the last line counts (each read wrong before)
    assert parse_verdict("Assistant B cites source [B] wrongly, while A is correct. Final verdict: A").outcome == "first"
    assert parse_verdict("Initial verdict: A. On reflection, my final verdict is a tie.").outcome == "tie"
    both = parse_verdict("My verdict: A and B are equally good.")  # names no winner
    assert (both.outcome, both.status) == ("tie", "unparsed")
    assert parse_verdict("Verdict: Assistant A or Assistant B, hard to say").status == "unparsed"
