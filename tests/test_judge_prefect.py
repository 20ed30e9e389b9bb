"""The evaluate stage's Prefect side on a real Prefect API: the key from a Secret block, the markdown headline."""

from __future__ import annotations

from prefect import flow

from rlhf_core.config import EvalConfig, HTTPJudgeConfig
from tasks.evaluation import _publish_headline, headline, http_api_key

METRICS = {"eval/judge/n": 20.0, "eval/judge/agreement_with_gold": 0.75, "eval/judge/unparsed_share": 0.05,
           "eval/judge/requests": 40.0, "eval/judge/cache_hits": 0.0, "eval/judge/cost_usd": 0.084} | {
    f"eval/judge/{v}_rate{end}": value for v, rates in
    {"win": (0.5, 0.3, 0.7), "tie": (0.3, 0.1, 0.5), "lose": (0.2, 0.05, 0.4)}.items()
    for end, value in zip(("", "_lo", "_hi"), rates)}
CFG = EvalConfig(judge="http", http=HTTPJudgeConfig(base_url="http://127.0.0.1:9/v1", model="gpt-4"))


def test_the_key_comes_from_a_prefect_secret_block(prefect_api, monkeypatch):
    from prefect.blocks.system import Secret

    Secret(value="sk-from-the-block").save("judge-test-key", overwrite=True)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    cfg = HTTPJudgeConfig(base_url="http://x", secret_block="judge-test-key")
    assert http_api_key(cfg) == "sk-from-the-block"  # the block wins over api_key_env
    assert http_api_key(cfg.model_copy(update={"secret_block": None})) == "sk-from-the-environment"


def test_a_secret_block_that_is_not_there_is_named_without_its_name(prefect_api):
    """Prefect's error repeats the name, which may be a key pasted in by mistake (lower case passes the pattern)."""
    import pytest

    cfg = HTTPJudgeConfig(base_url="http://x", secret_block="no-such-block-0a1b")
    with pytest.raises(RuntimeError, match="names no Prefect Secret block") as err:
        http_api_key(cfg)
    assert "no-such-block-0a1b" not in str(err.value)


def test_the_headline_is_a_markdown_artifact_of_the_flow_run(prefect_api):
    from prefect.artifacts import Artifact

    @flow
    def judged():
        _publish_headline(headline(METRICS, CFG), "Round 7")

    judged()
    artifact = Artifact.get("evaluation-round-7")
    assert artifact.type == "markdown" and artifact.flow_run_id is not None
    assert "| win | 50.0% | 30.0% – 70.0% |" in artifact.data
    assert "- agreement with gold (oracle): 75.0%" in artifact.data
    assert "- requests 40, cache hits 0, cost $0.0840" in artifact.data


def test_a_judge_whose_verdicts_mostly_cannot_be_read_is_called_out_in_the_headline():
    """A small local judge gave 100 % unreadable verdicts, each a tie, which decided promotion without a word."""
    unread = METRICS | {"eval/judge/unparsed_share": 0.6}
    assert "**Warning:** the http judge's verdict could not be read in 60% of its replies, each counted as a tie" \
        in headline(unread, CFG)
    assert "Warning" not in headline(METRICS | {"eval/judge/unparsed_share": 0.05}, CFG)
