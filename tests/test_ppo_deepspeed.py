"""PPO through DeepSpeed (one engine for the policy, one for the critic) on 2 gloo CPU ranks: ZeRO-2 and
ZeRO-3 give the 1-process run's metrics and weights, a killed ZeRO-2 run resumes from the engines' own
checkpoints, bad settings are refused with a clear message.

The first DeepSpeed start on a machine compiles an op (~2 min, cached in ~/.cache/torch_extensions), hence
the `slow` marks on the tests that launch ranks."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from rlhf_core import models
from rlhf_core.config import PPOConfig, parse_config
from rlhf_core.paths import PathNotAllowedError, check_config_paths
from rlhf_core.ppo.learner import DeepSpeedLearner, engine_config
from tasks.launch import INFRA
from test_ppo_workers import (OUTLIER_TOLERANCE, WEIGHT_TOLERANCE, assert_same_run, dirs,  # noqa: F401 - a fixture
                              kill_after_first_checkpoint, run)
from test_reward_workers import max_weight_diff, worker_env  # noqa: F401 - worker_env: a fixture

# 2 iterations of 5 prompts x 2 responses (ranks of 3 and 2 prompts), minibatches of 4, 4 and 2 rows (a rank
# holds none of some: it steps on a stand-in row weighted 0), ptx batches of 3 split 2 / 1, critic warm-up
# 2 steps, a checkpoint every iteration: 12 critic and 10 policy steps.
CFG = PPOConfig(iterations=2, rollout_prompts=5, max_new_tokens=6, mini_batch_size=4, critic_warmup_steps=2,
                policy_lr=1e-2, critic_lr=1e-3, ptx_coef=0.5, ptx_batch_size=3, checkpoint_every=1,
                lr_schedule="cosine")  # a schedule a resume must restore (a constant one hid a lost schedule)
ZERO2 = CFG.model_copy(update={"num_processes": 2, "deepspeed": "zero2"})


@pytest.fixture(scope="module")
def one_process(dirs, tmp_path_factory):
    return run(CFG, dirs, tmp_path_factory.mktemp("one"))


@pytest.mark.slow
def test_zero2_on_two_ranks_gives_the_one_process_run_and_resumes_it(dirs, one_process, worker_env, tmp_path):
    """ZeRO-2 on 2 ranks, its group SIGKILLed once the first checkpoint is written (iteration 1 of 2), then
    re-run: the first iteration (before the kill) and the second (resumed from the engines' checkpoints)
    are the 1-process run's, as are the final weights. One test, so that the file launches two groups,
    not three; a run without DeepSpeed then refuses the partitioned checkpoint."""
    state = kill_after_first_checkpoint(ZERO2, dirs, tmp_path)
    assert len(state["history"]) == 1 and state["zero_ranks"] == 2  # killed after iteration 1 of 2
    assert not (tmp_path / "policy" / "world_size.txt").exists()

    resumed = run(ZERO2, dirs, tmp_path)
    log = (tmp_path / "worker.log").read_text()
    assert "after iteration 0" in log.split("resumed from", 1)[1] and "DeepSpeed" in log  # restored, not restarted
    assert (tmp_path / "policy" / "world_size.txt").read_text() == "2\n"
    # the optimiser state is partitioned: each rank wrote its own, and only the last checkpoint is kept
    engines = tmp_path / "deepspeed"
    assert [p.name for p in engines.iterdir()] == ["iteration-2"]
    for model in ("policy", "critic"):
        assert sorted(p.name for p in (engines / "iteration-2" / model).glob("zero_pp_rank_*")) == [
            "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    diff = assert_same_run(one_process, resumed, CFG.iterations)
    moved = max_weight_diff(one_process[0], models.load_policy(dirs[0]))
    assert diff <= OUTLIER_TOLERANCE < moved / 10 and WEIGHT_TOLERANCE < moved / 100  # PPO moved them far more
    print(f"1 process vs ZeRO-2 on 2 ranks, killed and resumed: max weight diff {diff:.2e}, weights moved "
          f"{moved:.2e}")
    with pytest.raises(ValueError, match="under DeepSpeed ZeRO on 2 ranks; this run trains without DeepSpeed"):
        run(CFG, dirs, tmp_path)


@pytest.mark.slow
def test_zero3_on_two_ranks_gives_the_one_process_run(dirs, worker_env, tmp_path):
    """ZeRO-3 partitions the weights (here every one: persistence threshold 0, where the default would keep this
    tiny model's small tensors whole), so each rollout generates with the policy's weights gathered into a
    plain copy, and that copy is the saved policy. A short run (one iteration, 2 critic steps and 1 policy
    step with ptx): ZeRO-3 gathers the weights at every module's forward and backward, and one iteration of CFG
    took 2.5 min over gloo on the 2-core machine under load (ZeRO-2: seconds)."""
    zero3 = json.loads((INFRA / "deepspeed" / "zero3.json").read_text())
    zero3["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    (tmp_path / "zero3.json").write_text(json.dumps(zero3))  # a DeepSpeed JSON given by its path
    # policy lr 1e-3: Adam's first steps magnify float noise into weight differences that grow with the lr (plain
    # 2-rank data parallelism on this config at lr 1e-2: 6.8e-5)
    short = CFG.model_copy(update={"iterations": 1, "ppo_epochs": 1, "mini_batch_size": 5, "critic_warmup_steps": 1,
                                   "policy_lr": 1e-3})
    one = run(short, dirs, tmp_path / "one")
    partitioned = run(short.model_copy(update={"num_processes": 2, "deepspeed": str(tmp_path / "zero3.json")}),
                      dirs, tmp_path / "zero3")
    assert (tmp_path / "zero3" / "policy" / "world_size.txt").read_text() == "2\n"
    # stage 3 checkpoints the weights as partitions too, one file per rank
    weights = (tmp_path / "zero3" / "deepspeed" / "iteration-1" / "policy").glob("zero_pp_rank_*_model_states.pt")
    assert len(list(weights)) == 2
    diff = assert_same_run(one, partitioned, 1)
    print(f"1 process vs ZeRO-3 on 2 ranks: max weight diff {diff:.2e}")


def test_bad_deepspeed_settings_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="give null, zero2, zero3 or the path of a DeepSpeed JSON config"):
        PPOConfig(deepspeed="zero-2")
    with pytest.raises(PathNotAllowedError, match="ppo.deepspeed"):  # a JSON file is read: allowed roots only
        check_config_paths(parse_config({"ppo": {"deepspeed": "/etc/ds.json"}}))
    zero2 = json.loads((INFRA / "deepspeed" / "zero2.json").read_text())
    fitted = engine_config(zero2, max_grad_norm=0.5)
    assert (fitted["gradient_clipping"], fitted["gradient_accumulation_steps"]) == (0.5, 1)
    # a user's train_batch_size would contradict micro batch 1 x ranks (DeepSpeed refuses the mismatch): dropped
    assert "train_batch_size" not in engine_config(zero2 | {"train_batch_size": 32}, 1.0)
    with pytest.raises(ValueError, match="PPO brings its own AdamW"):
        engine_config(zero2 | {"optimizer": {"type": "Adam"}}, 1.0)
    scalar = nn.Module()
    scalar.weight = nn.Parameter(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"0-dim parameters \(weight\)"):
        DeepSpeedLearner.build(scalar, 1e-3, "constant", 0, 10, fitted)
