"""The local transformers judge on a tiny randomly initialised Qwen2: it runs, and records parse statuses."""

from __future__ import annotations

import pytest

from rlhf_core import models
from rlhf_core.config import EvalConfig, LocalJudgeConfig, PolicyModelConfig
from rlhf_core.judge.cache import JudgementCache
from rlhf_core.judge.local import LocalJudge
from rlhf_core.judge.prompt import criteria_text
from rlhf_core.judge.protocol import judge_pairs
from tasks.evaluation import make_judge

TINY = PolicyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1)
PAIRS = [("What is 2+3?", " 5", " It is 6."), ("What is 4-1?", " 3", " three")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("judge_model")
    tokenizer = models.build_tokenizer()
    models.save_hf(models.build_policy(TINY, tokenizer, seed=0), tokenizer, out)
    return out


def test_a_tiny_random_judge_runs_both_orders_and_records_parse_statuses(model_dir, tmp_path):
    judge = LocalJudge(model_dir, criteria_text("helpfulness"), "pairwise-v1", max_new_tokens=8,
                       max_input_tokens=128, cache=JudgementCache(tmp_path / "cache.sqlite"))
    rows = judge_pairs(judge, PAIRS)
    statuses = {r[f"parse_status_{o}"] for r in rows for o in ("ab", "ba")}
    assert statuses <= {"ok", "fallback", "unparsed"} and all(r["verdict"] in {"win", "tie", "lose"} for r in rows)
    assert judge.usage["requests"] == 4 and judge.usage["completion_tokens"] <= 4 * 8
    assert judge.usage["prompt_tokens"] == 4 * 128  # every judging prompt is longer than 128 bytes: cut to it
    unparsed = [r for r in rows if r["parse_status_ab"] == "unparsed"]
    assert all(r["parse_reason_ab"].startswith("no verdict found") for r in unparsed)

    # greedy: the same model and cache answer again without generating
    again = LocalJudge(model_dir, criteria_text("helpfulness"), "pairwise-v1", max_new_tokens=8,
                       max_input_tokens=128, cache=JudgementCache(tmp_path / "cache.sqlite"))
    assert judge_pairs(again, PAIRS) == rows and again.usage["requests"] == 0


def test_the_evaluate_task_builds_the_local_judge_from_config(model_dir, tmp_path):
    cfg = EvalConfig(judge="local", local=LocalJudgeConfig(model_path=str(model_dir), max_new_tokens=4))
    judge = make_judge(cfg, tmp_path)
    assert isinstance(judge, LocalJudge) and judge.cache.path == tmp_path / "cache" / "judgements.sqlite"
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LocalJudge(tmp_path, "x", "pairwise-v1")


def test_the_evaluation_stage_key_holds_the_local_judges_weights_not_only_their_path(model_dir, tmp_path):
    from rlhf_core.config import RewardTrainConfig
    from tasks.evaluation import stage_config

    judge_dir = tmp_path / "judge"
    tokenizer = models.build_tokenizer()
    models.save_hf(models.build_policy(TINY, tokenizer, seed=0), tokenizer, judge_dir)
    cfg = EvalConfig(judge="local", local=LocalJudgeConfig(model_path=str(judge_dir)))
    before, _ = stage_config(cfg, RewardTrainConfig(), 0, None)
    models.save_hf(models.build_policy(TINY, tokenizer, seed=1), tokenizer, judge_dir)  # new weights, same path
    after, _ = stage_config(cfg, RewardTrainConfig(), 0, None)
    assert before["evaluation"] == after["evaluation"] and before["local_judge_digest"] != after["local_judge_digest"]
    assert "local_judge_digest" not in stage_config(EvalConfig(), RewardTrainConfig(), 0, None)[0]  # the oracle
