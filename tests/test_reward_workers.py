"""Reward-model training as worker ranks: 2 data-parallel ranks give the 1-process model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from rlhf_core.config import RewardConfig, RewardTrainConfig, load_config
from rlhf_core.reward.model import RewardModel
from rlhf_core.reward.train import pair_reward_diffs, rank_shard, train_reward_model
from tasks.launch import INFRA
from tasks.reward import train_on_ranks
from test_reward import init_dir, make_pairs  # noqa: F401 - init_dir: the tiny policy fixture

ROOT = Path(__file__).resolve().parents[1]
# 30 pairs in batches of 8: the last batch of each epoch has 6 rows, so the ranks' shards differ in size too
CFG = RewardTrainConfig(epochs=2, batch_size=8, lr=3e-3, max_length=64)
WEIGHT_TOLERANCE = 1e-5  # measured largest weight difference to 1 process: 1.1e-6 (2 ranks, and ZeRO-2)


def test_rank_shards_split_a_batch_whole_and_in_order():
    rows = np.array([5, 2, 9, 7, 1])
    assert [rank_shard(rows, r, 2).tolist() for r in range(2)] == [[5, 2, 9], [7, 1]]
    assert [rank_shard(rows[:1], r, 2).tolist() for r in range(2)] == [[5], []]  # a rank may get nothing


PAIRS, HELD_OUT = make_pairs(30, seed=3), make_pairs(20, seed=4)


@pytest.fixture(scope="module")
def one_process(init_dir):
    return train_reward_model(init_dir, PAIRS, CFG, seed=5)


@pytest.fixture
def worker_env(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("RLHF_TORCH_THREADS", "1")


def max_weight_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_two_ranks_train_the_one_process_reward_model(init_dir, one_process, worker_env, tmp_path):
    pairs, held_out = PAIRS, HELD_OUT
    one, tokenizer, one_metrics = one_process
    two, _, two_metrics = train_on_ranks(RewardConfig(train=CFG, num_processes=2), init_dir, pairs, 5, None, tmp_path)
    assert two_metrics["world_size"] == 2  # two ranks, not two lone processes
    assert (tmp_path / "model" / "model.safetensors").exists()  # rank 0 wrote the model (the task reloads it)
    assert two_metrics["steps"] == one_metrics["steps"] == 2 * 4
    weight_diff = max_weight_diff(one, two)
    moved = max_weight_diff(one, RewardModel.from_policy(init_dir, 5, CFG.read))
    assert weight_diff < WEIGHT_TOLERANCE < moved / 100  # equal, while training moved the weights far more
    diffs_one = pair_reward_diffs(one, tokenizer, held_out, CFG.max_length)
    diffs_two = pair_reward_diffs(two, tokenizer, held_out, CFG.max_length)
    np.testing.assert_allclose(diffs_two, diffs_one, atol=1e-4)
    assert two_metrics["loss"] == pytest.approx(one_metrics["loss"], abs=1e-5)
    assert two_metrics["accuracy"] == pytest.approx(one_metrics["accuracy"], abs=1e-6)
    print(f"1 vs 2 ranks: max weight diff {weight_diff:.2e}, max held-out diff "
          f"{np.abs(diffs_two - diffs_one).max():.2e}, weights moved {moved:.2e}")


def test_two_ranks_with_the_prompt_shared_train_the_one_process_plain_model(init_dir, one_process, worker_env,
                                                                           tmp_path):
    """share_prompt changes how a batch is run, not what is learned: 2 ranks, each running its shard's prompts once,
    end where 1 process on the whole rows does. (ZeRO-3 was checked the same way by hand, 2026-11-26: max weight
    difference 9e-7 to 1 process with the prompt shared.)"""
    one, _, one_metrics = one_process
    cfg = RewardConfig(train=CFG.model_copy(update={"share_prompt": True}), num_processes=2)
    two, _, two_metrics = train_on_ranks(cfg, init_dir, PAIRS, 5, None, tmp_path)
    assert two_metrics["world_size"] == 2 and two_metrics["steps"] == one_metrics["steps"]
    # other float rounding than the whole rows' (measured 1.5e-5 after 8 AdamW steps), far below what training moved
    weight_diff, moved = max_weight_diff(one, two), max_weight_diff(one, RewardModel.from_policy(init_dir, 5, CFG.read))
    assert weight_diff < 10 * WEIGHT_TOLERANCE < moved / 10
    assert two_metrics["loss"] == pytest.approx(one_metrics["loss"], abs=1e-5)
    print(f"2 ranks, prompt shared, vs 1 process: max weight diff {weight_diff:.2e}, weights moved {moved:.2e}")


def test_data_parallel_refuses_losses_that_are_not_means_over_pairs(init_dir):
    with pytest.raises(ValueError, match="reward.train.lm_coef 0"):
        RewardConfig(train=CFG.model_copy(update={"lm_coef": 0.5}), num_processes=2)
    with pytest.raises(ValueError, match="reward.train.lm_coef 0"):
        train_reward_model(init_dir, make_pairs(4), CFG.model_copy(update={"lm_coef": 0.5}), seed=0, rank=0,
                           world_size=2)


@pytest.mark.slow  # the first DeepSpeed start on CPU compiles its shm comm op: ~2 min (cached afterwards)
def test_zero2_on_two_cpu_ranks_trains_and_saves_the_one_process_model(init_dir, one_process, worker_env, tmp_path):
    one, tokenizer, _ = one_process
    cfg = RewardConfig(train=CFG, num_processes=2, deepspeed="zero2")
    zero2, _, metrics = train_on_ranks(cfg, init_dir, PAIRS, 5, None, tmp_path)
    assert metrics["world_size"] == 2 and (tmp_path / "model" / "model.safetensors").exists()
    before = RewardModel.from_policy(init_dir, 5, CFG.read)
    bt_loss = {name: float(np.logaddexp(0, -pair_reward_diffs(model, tokenizer, PAIRS, CFG.max_length)).mean())
               for name, model in {"before": before, "zero2": zero2}.items()}
    assert bt_loss["zero2"] < bt_loss["before"] - 0.05  # it trained: the pairs' Bradley-Terry loss went down
    assert max_weight_diff(one, zero2) < WEIGHT_TOLERANCE  # and it is the plain data-parallel model
    print(f"ZeRO-2, 2 ranks: BT loss {bt_loss['before']:.4f} -> {bt_loss['zero2']:.4f}, max weight diff to 1 "
          f"process {max_weight_diff(one, zero2):.2e}")


@pytest.mark.slow  # as the ZeRO-2 test; and ZeRO-3 gathers the weights at every module's forward and backward
def test_zero3_on_two_cpu_ranks_gives_the_one_process_model(init_dir, worker_env, tmp_path):
    """Every weight partitioned (persistence threshold 0: the default would keep this tiny model's tensors whole),
    the tied embeddings that the logprob read multiplies by included. 25 pairs in batches of 8, one epoch: the
    last batch holds 1 pair, so rank 1 steps on the stand-in row weighted 0 there."""
    ds_config = json.loads((INFRA / "deepspeed" / "zero3.json").read_text())
    ds_config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    (tmp_path / "zero3.json").write_text(json.dumps(ds_config))  # a DeepSpeed JSON given by its path
    pairs, cfg = PAIRS.iloc[:25], CFG.model_copy(update={"epochs": 1})
    assert cfg.read == "end_token+logprob"
    one, _, one_metrics = train_reward_model(init_dir, pairs, cfg, seed=5)
    zero3, _, metrics = train_on_ranks(RewardConfig(train=cfg, num_processes=2, deepspeed=str(tmp_path / "zero3.json")),
                                       init_dir, pairs, 5, None, tmp_path / "run")
    assert metrics["world_size"] == 2 and metrics["steps"] == one_metrics["steps"] == 4
    before = RewardModel.from_policy(init_dir, 5, cfg.read)
    weight_diff, moved = max_weight_diff(one, zero3), max_weight_diff(one, before)
    embeddings = [m.trunk().get_input_embeddings().weight for m in (one, zero3, before)]
    embeddings_moved = (embeddings[0] - embeddings[2]).abs().max().item()
    assert weight_diff < WEIGHT_TOLERANCE < embeddings_moved / 100 <= moved / 100  # the tied embeddings trained too
    for name in ("loss", "accuracy", "logprob_weight"):
        assert metrics[name] == pytest.approx(one_metrics[name], abs=1e-5), name
    print(f"ZeRO-3, 2 ranks: max weight diff to 1 process {weight_diff:.2e} (weights moved {moved:.2e}, the "
          f"embeddings {embeddings_moved:.2e}), loss {metrics['loss']:.6f} vs {one_metrics['loss']:.6f}")


def test_deepspeed_settings_are_checked_at_the_boundary():
    with pytest.raises(ValueError, match="give null, zero2, zero3 or the path of a DeepSpeed JSON config"):
        RewardConfig(train=CFG, num_processes=2, deepspeed="zero-3")
    assert RewardConfig(train=CFG, num_processes=2, deepspeed="zero3").deepspeed == "zero3"  # no longer refused
    with pytest.raises(ValueError, match="reward.train.lm_coef 0"):
        RewardConfig(train=CFG.model_copy(update={"lm_coef": 0.5}), deepspeed="zero2")


@pytest.mark.slow  # a whole round up to the reward model (about a minute on 2 cores)
def test_the_reward_stage_trains_on_two_ranks_and_one_rank_reuses_its_model(prefect_api, tmp_path, worker_env):
    from flows.round import rlhf_round

    cfg = load_config(ROOT / "configs" / "mini.yaml", overrides=[f"workdir={tmp_path}", "reward.num_processes=2",
                                                                "reward.compare_baseline=false"])
    summary = rlhf_round(config=cfg, stop_after="reward")
    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    reward = stage_run(client, summary, "reward")
    assert reward.data.metrics["reward/world_size"] == 2 and reward.data.params["execution.num_processes"] == "2"
    assert "num_processes" not in " ".join(k for k in reward.data.params if not k.startswith("execution."))
    # the number of ranks is not part of the cache key: one rank reuses the 2-rank model
    again = rlhf_round(config=cfg.model_copy(update={"reward": cfg.reward.model_copy(update={"num_processes": 1})}),
                       stop_after="reward")
    assert stage_run(client, again, "reward").data.tags["rlhf.cache"] == "hit"
    assert again["artifacts"]["reward"] == summary["artifacts"]["reward"]


def stage_run(client, summary: dict, stage: str):
    """The MLflow run of one stage under the round's parent run."""
    parent = summary["mlflow"]["run_id"]
    runs = client.search_runs([client.get_run(parent).info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    return next(r for r in runs if r.data.tags["rlhf.stage"] == stage)


def test_dropout_probability_reads_every_dropout_field_of_a_config(tmp_path, init_dir):
    """The reward stage keys its cache on the number of ranks only when the backbone has dropout (N ranks draw
    other masks than one process): the tiny world's Qwen2 has none, BERT and GPT-2 configs 0.1."""
    import json

    from rlhf_core.models import dropout_probability

    assert dropout_probability(init_dir) == 0.0
    for name, config in {"bert": {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                                  "classifier_dropout": None},
                         "gpt2": {"resid_pdrop": 0.1, "embd_pdrop": 0.05, "attn_pdrop": 0.1, "use_cache": True},
                         "none": {"hidden_size": 8, "tie_word_embeddings": True}}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    assert [dropout_probability(tmp_path / n) for n in ("bert", "gpt2", "none")] == [0.1, 0.1, 0.0]
