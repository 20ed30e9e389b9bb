"""Reward-model training as worker ranks: 2 data-parallel ranks give the 1-process model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlhf_core.config import RewardConfig, RewardTrainConfig
from rlhf_core.reward.model import RewardModel
from rlhf_core.reward.train import pair_reward_diffs, rank_shard, train_reward_model
from tasks.reward import train_on_ranks
from test_reward import init_dir, make_pairs  # noqa: F401 - init_dir: the tiny policy fixture

ROOT = Path(__file__).resolve().parents[1]
# 30 pairs in batches of 8: the last batch of each epoch has 6 rows, so the ranks' shards differ in size too
CFG = RewardTrainConfig(epochs=2, batch_size=8, lr=3e-3, max_length=64)
WEIGHT_TOLERANCE = 1e-5  # measured: largest weight difference 1 vs 2 ranks (see docs/workers.md)


def test_rank_shards_split_a_batch_whole_and_in_order():
    rows = np.array([5, 2, 9, 7, 1])
    assert [rank_shard(rows, r, 2).tolist() for r in range(2)] == [[5, 2, 9], [7, 1]]
    assert [rank_shard(rows[:1], r, 2).tolist() for r in range(2)] == [[5], []]  # a rank may get nothing


def test_two_ranks_train_the_one_process_reward_model(init_dir, tmp_path, monkeypatch):
    pairs, held_out = make_pairs(30, seed=3), make_pairs(20, seed=4)
    one, tokenizer, one_metrics = train_reward_model(init_dir, pairs, CFG, seed=5)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("RLHF_TORCH_THREADS", "1")
    two, _, two_metrics = train_on_ranks(RewardConfig(train=CFG, num_processes=2), init_dir, pairs, 5, None, tmp_path)
    assert two_metrics["world_size"] == 2  # two ranks, not two lone processes
    assert (tmp_path / "model" / "model.safetensors").exists()  # rank 0 wrote the model (the task reloads it)
    assert two_metrics["steps"] == one_metrics["steps"] == 2 * 4
    weight_diff = max((a - b).abs().max().item() for a, b in zip(one.state_dict().values(),
                                                                   two.state_dict().values()))
    moved = max((a - b).abs().max().item() for a, b in zip(one.state_dict().values(),
                                                            RewardModel.from_policy(init_dir, 5).state_dict().values()))
    assert weight_diff < WEIGHT_TOLERANCE < moved / 100  # equal, while training moved the weights far more
    diffs_one = pair_reward_diffs(one, tokenizer, held_out, CFG.max_length)
    diffs_two = pair_reward_diffs(two, tokenizer, held_out, CFG.max_length)
    np.testing.assert_allclose(diffs_two, diffs_one, atol=1e-4)
    assert two_metrics["loss"] == pytest.approx(one_metrics["loss"], abs=1e-5)
    assert two_metrics["accuracy"] == pytest.approx(one_metrics["accuracy"], abs=1e-6)
    print(f"1 vs 2 ranks: max weight diff {weight_diff:.2e}, max held-out diff "
          f"{np.abs(diffs_two - diffs_one).max():.2e}, weights moved {moved:.2e}")


def test_data_parallel_refuses_losses_that_are_not_means_over_pairs(init_dir):
    with pytest.raises(ValueError, match="reward.train.lm_coef 0"):
        RewardConfig(train=CFG.model_copy(update={"lm_coef": 0.5}), num_processes=2)
    with pytest.raises(ValueError, match="reward.train.lm_coef 0"):
        train_reward_model(init_dir, make_pairs(4), CFG.model_copy(update={"lm_coef": 0.5}), seed=0, rank=0,
                           world_size=2)
