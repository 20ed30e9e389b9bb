"""PPO as worker ranks: 2 data-parallel ranks give the 1-process run, and a killed 2-rank run resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import torch

from rlhf_core import models
from rlhf_core.config import PPOConfig
from rlhf_core.ppo.trainer import Checkpoint
from rlhf_core.reward.model import RewardModel
from rlhf_core.sim.world import ideal_response, make_prompt_pool
from tasks.launch import GROUP_ENV, accelerate_command, group_processes
from tasks.ppo import WORKER, train_on_ranks, worker_args
from test_ppo import TINY
from test_reward_workers import max_weight_diff, worker_env  # noqa: F401 - worker_env: a fixture

# 5 prompts x 2 responses = 10 rows per rollout, ranks of 3 and 2 prompts; minibatches of 4, 4 and 2 rows, so
# a rank's share of a minibatch varies (some none); ptx batches of 3 split 2 / 1. Critic warm-up 2 steps.
CFG = PPOConfig(iterations=3, rollout_prompts=5, max_new_tokens=6, mini_batch_size=4, critic_warmup_steps=2,
                policy_lr=1e-2, critic_lr=1e-3, ptx_coef=0.5, ptx_batch_size=3, checkpoint_every=1,
                lr_schedule="cosine")  # a schedule a resume must restore (a constant one hid a lost schedule)
TWO_RANKS = CFG.model_copy(update={"num_processes": 2})
PROMPTS = make_prompt_pool(12, seed=1)["prompt"].tolist()
PTX = [(p, ideal_response(p)) for p in PROMPTS]
SEED = 3
REWARD_MAX_LENGTH = 64
# Weights: every element within WEIGHT_TOLERANCE of the 1-process run but a few (ADAM_OUTLIERS at most), and those
# within OUTLIER_TOLERANCE. Why the few: an element whose summed gradient is float noise (likely the tied embedding
# row of a token no rollout holds, where the terms cancel) gets it summed in another order on 2 ranks, and Adam's
# normalised step turns that noise into a step of its own. On an AMD EPYC without AVX-512: all but 1 of the 17.7k
# elements within 1.3e-5 (ZeRO-2: 1.4e-5), that one (the '@' row) 1.5e-4 (ZeRO-2: 1.8e-4), at lr 1e-2 (PPO moved the
# weights 8e-2); on an AVX-512 CPU every element was within 1.4e-5.
WEIGHT_TOLERANCE = 1e-4
ADAM_OUTLIERS = 3
OUTLIER_TOLERANCE = 1e-3
METRIC_TOLERANCE = dict(rel=1e-4, abs=5e-5)  # measured: 1.8e-4 on a perplexity of ~200, 8.5e-6 on approx_kl


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A tiny policy, a reward model from it (the scores and the critic's start), and another policy as the KL
    reference (a later round's: it starts from the round before's policy, anchored to SFT): a rank that ignored
    the reference would measure KL to its start policy, and the runs would differ."""
    root = tmp_path_factory.mktemp("models")
    tok = models.build_tokenizer()
    models.save_hf(models.build_policy(TINY, tok, seed=0), tok, root / "policy")
    RewardModel.from_policy(root / "policy", seed=5).save(root / "rm", tok)
    models.save_hf(models.build_policy(TINY, tok, seed=1), tok, root / "reference")
    return root / "policy", root / "rm", root / "reference"


def run(cfg: PPOConfig, dirs, scratch: Path):
    seen = []
    policy, _, history = train_on_ranks(cfg, dirs[0], dirs[1], REWARD_MAX_LENGTH, PROMPTS, PTX, SEED, scratch,
                                        seen.append, dirs[2])
    assert seen == history
    return policy, history


@pytest.fixture(scope="module")
def one_process(dirs, tmp_path_factory):
    return run(CFG, dirs, tmp_path_factory.mktemp("one"))


def assert_same_run(one, two, iterations: int = CFG.iterations) -> float:
    """The same metrics every iteration, and the same final weights (ADAM_OUTLIERS elements within
    OUTLIER_TOLERANCE, the others within WEIGHT_TOLERANCE); returns the largest weight difference."""
    (policy_one, history_one), (policy_two, history_two) = one, two
    assert len(history_two) == len(history_one) == iterations
    for a, b in zip(history_one, history_two):
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], nan_ok=True, **METRIC_TOLERANCE), (a["iteration"], k)
    print("largest metric differences:", sorted(((abs(b[k] - a[k]), k) for a, b in zip(history_one, history_two)
                                                for k in a), reverse=True)[:3])
    # parameters(), not state_dict(): the tied embedding is one tensor (state_dict lists it twice, as lm_head too)
    diffs = torch.cat([(x - y).abs().flatten()
                       for x, y in zip(policy_one.parameters(), policy_two.parameters(), strict=True)])
    print("largest weight differences:", diffs.topk(ADAM_OUTLIERS + 2).values.tolist())
    assert int((~(diffs < WEIGHT_TOLERANCE)).sum()) <= ADAM_OUTLIERS  # NaN counts as over
    assert diffs.max().item() < OUTLIER_TOLERANCE
    return diffs.max().item()


def test_two_ranks_give_the_one_process_run(dirs, one_process, worker_env, tmp_path):
    two = run(TWO_RANKS, dirs, tmp_path)
    assert (tmp_path / "policy" / "world_size.txt").read_text() == "2\n"  # two ranks, not two lone processes
    assert (tmp_path / "checkpoint.pt").exists()  # rank 0 checkpointed
    diff = assert_same_run(one_process, two)
    moved = max_weight_diff(one_process[0], models.load_policy(dirs[0]))
    assert diff <= OUTLIER_TOLERANCE < moved / 10 and WEIGHT_TOLERANCE < moved / 100  # PPO moved them far more
    assert all(m["loss/ptx"] > 0 for m in one_process[1])  # the ptx batches were split too
    assert one_process[1][0]["objective/kl"] > 0.1  # to the reference, not to the policy the rollout sampled
    print(f"1 vs 2 ranks: max weight diff {diff:.2e}, weights moved {moved:.2e}")


def kill_after_first_checkpoint(cfg: PPOConfig, dirs, scratch: Path, timeout: float = 300) -> dict:
    """Launch the PPO worker group, SIGKILL all of it (launcher, agent, ranks) once its first checkpoint is
    written, and return that checkpoint. The timeout leaves room for a cold DeepSpeed op cache."""
    args = worker_args(cfg, dirs[0], dirs[1], REWARD_MAX_LENGTH, PROMPTS, PTX, SEED, scratch, dirs[2])
    argv, env = accelerate_command(WORKER, args, cfg.num_processes, cfg.deepspeed)
    tag = env[GROUP_ENV] = uuid.uuid4().hex
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    checkpoint = scratch / "checkpoint.pt"
    deadline = time.monotonic() + timeout
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in group_processes(tag):
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    return torch.load(checkpoint, weights_only=True)


def test_a_killed_two_rank_run_resumes(dirs, one_process, worker_env, tmp_path):
    """SIGKILL of the whole group once its first checkpoint is written; the re-run resumes from it."""
    done = len(kill_after_first_checkpoint(TWO_RANKS, dirs, tmp_path)["history"])
    assert 1 <= done < CFG.iterations and not (tmp_path / "policy" / "world_size.txt").exists()  # killed midway

    resumed = run(TWO_RANKS, dirs, tmp_path)
    resumed_line = (tmp_path / "worker.log").read_text().split("resumed from", 1)[1].splitlines()[0]
    assert resumed_line.endswith(f"after iteration {done - 1}")  # the checkpoint's iterations restored, not rerun
    assert_same_run(one_process, resumed)


def test_the_number_of_ranks_is_checked_and_left_out_of_checkpoints(tmp_path):
    with pytest.raises(ValueError, match=r"ppo.num_processes \(6\) exceeds ppo.rollout_prompts \(5\)"):
        CFG.model_validate(CFG.model_dump() | {"num_processes": 6})
    # a run killed on 2 ranks resumes on 1 (or 4): the checkpoint does not record how many ranks wrote it
    assert Checkpoint(tmp_path, TWO_RANKS, SEED).run == Checkpoint(tmp_path, CFG, SEED).run
    assert PPOConfig.model_validate_json(TWO_RANKS.model_dump_json()) == TWO_RANKS  # the worker's config file


def test_a_switch_given_at_the_presets_value_is_the_same_run_to_the_worker(tmp_path):
    """The worker's resume check compares its config file: a preset's switch given explicitly (the same cache key
    and checkpoint) must write the same file, or a killed multi-rank run is refused as another run."""
    explicit = TWO_RANKS.model_copy(update={"kl_coef": 0.05})
    assert Checkpoint(tmp_path, explicit, SEED).run == Checkpoint(tmp_path, TWO_RANKS, SEED).run
    for cfg, name in ((TWO_RANKS, "preset"), (explicit, "explicit")):
        worker_args(cfg, Path("policy"), Path("rm"), REWARD_MAX_LENGTH, PROMPTS, None, SEED, tmp_path / name)
    assert (tmp_path / "preset" / "ppo.json").read_text() == (tmp_path / "explicit" / "ppo.json").read_text()
    assert PPOConfig.model_validate_json((tmp_path / "preset" / "ppo.json").read_text()).kl_coef == 0.05


@pytest.mark.slow  # a whole round up to PPO (about two minutes on 2 cores)
def test_the_ppo_stage_trains_on_two_ranks_and_one_rank_reuses_its_policy(prefect_api, tmp_path, worker_env):
    from mlflow import MlflowClient

    from flows.round import rlhf_round
    from rlhf_core.config import load_config
    from test_reward_workers import stage_run

    cfg = load_config(Path(__file__).parents[1] / "configs" / "mini.yaml",
                      overrides=[f"workdir={tmp_path}", "ppo.num_processes=2", "reward.compare_baseline=false"])
    summary = rlhf_round(config=cfg, stop_after="ppo")
    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    ppo = stage_run(client, summary, "ppo")
    assert ppo.data.params["execution.num_processes"] == "2" and ppo.data.metrics["ppo/iterations"] == 3
    assert "num_processes" not in " ".join(k for k in ppo.data.params if not k.startswith("execution."))
    gold = client.get_metric_history(ppo.info.run_id, "objective/gold")  # every iteration, logged by the task
    assert sorted(m.step for m in gold) == [0, 1, 2]
    assert ppo.data.metrics["ppo/gold_last"] == pytest.approx(next(m.value for m in gold if m.step == 2))
    # the number of ranks is not part of the cache key: one rank reuses the 2-rank policy
    again = rlhf_round(config=cfg.model_copy(update={"ppo": cfg.ppo.model_copy(update={"num_processes": 1})}),
                       stop_after="ppo")
    assert stage_run(client, again, "ppo").data.tags["rlhf.cache"] == "hit"
    assert again["artifacts"]["ppo"] == summary["artifacts"]["ppo"]
