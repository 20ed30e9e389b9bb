"""Stage 7: PPO of the policy against the reward model, KL-penalised towards the SFT reference."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE
from torch import nn

from rlhf_core import models
from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import EXECUTION_SETTINGS, RESOLVED, PPOConfig, RewardTrainConfig
from rlhf_core.ppo.scoring import gold_scores, reward_scorer  # noqa: F401 - reward_scorer is also evaluation's
from rlhf_core.ppo.trainer import train_ppo
from rlhf_core.schemas import read_table
from tasks.common import RunContext, StageRun, run_stage
from tasks.launch import group_world_size, run_worker
from tasks.plots import ppo_curves

WORKER = "rlhf_core.workers.ppo"
# 4: the rollout's policy log-probs from generation's logits; 3: each prompt's responses drawn with a seed of its
# rollout index (the same on any number of ranks)
# 5: rollouts stop at the model's own end-of-turn tokens too; lr/* the rates the steps used
VERSION = "6"  # 6: the KL reference is the SFT policy in every round (was the round's start policy from round 2 on)


@task(name="ppo", version=VERSION, cache_policy=NO_CACHE)
def train_policy(ctx: RunContext, cfg: PPOConfig, policy: ArtifactRef, reward_model: ArtifactRef,
                 world: ArtifactRef, sft: ArtifactRef, reward_train: RewardTrainConfig, seed: int,
                 reference: ArtifactRef | None = None) -> ArtifactRef:
    """PPO over the prompt pool; the critic starts from the reward model; curves logged per iteration. The KL
    penalty is to `reference` (default: `sft`, whose demonstrations are also the ptx data)."""
    reference = reference or sft

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        prompts = read_table("prompts", world.file("prompts.parquet"))["prompt"].tolist()
        on_iteration = lambda m: run.log_metrics(m, step=int(m["iteration"]))  # noqa: E731
        ptx = None
        if cfg.ptx_coef > 0:  # PPO-max's pretraining loss, on the demonstrations the SFT policy learned
            demos = pd.read_parquet(sft.file("demonstrations.parquet"))
            ptx = list(zip(demos["prompt"], demos["response"]))
        model, tokenizer, history = train_on_ranks(cfg, policy.path, reward_model.path, reward_train.max_length,
                                                   prompts, ptx, seed, run.scratch, on_iteration, reference.path)
        models.save_hf(model, tokenizer, out)
        run.log_figure(ppo_curves(history), "ppo_curves.png")
        first, last = history[0], history[-1]
        return {"ppo/score_first": first["objective/score"], "ppo/score_last": last["objective/score"],
                "ppo/gold_first": first["objective/gold"], "ppo/gold_last": last["objective/gold"],
                "ppo/kl_last": last["objective/kl"], "ppo/iterations": len(history)}

    config = {"ppo": cfg.model_dump(context=RESOLVED, exclude=EXECUTION_SETTINGS),
              "reward_max_length": reward_train.max_length, "seed": seed}
    inputs = {"policy": policy, "reward_model": reward_model, "world": world, "sft": sft}
    if reference.digest != sft.digest:  # another KL anchor (iteration.kl_reference); the SFT one is keyed as "sft"
        inputs["kl_reference"] = reference
    return run_stage(ctx, stage="ppo", version=VERSION, kind="policy", config=config, inputs=inputs,
                     produce=produce, register_as="rlhf-policy",
                     execution={"num_processes": cfg.num_processes, "deepspeed": cfg.deepspeed})  # the same policy


def train_on_ranks(cfg: PPOConfig, policy_dir: Path, reward_dir: Path, reward_max_length: int, prompts: list[str],
                   ptx: list[tuple[str, str]] | None, seed: int, scratch: Path,
                   on_iteration: Callable[[dict[str, float]], None], reference_dir: Path | None = None
                   ) -> tuple[nn.Module, object, list[dict]]:
    """`train_ppo` in this process, or as cfg.num_processes data-parallel worker ranks (through DeepSpeed when
    cfg.deepspeed) that leave the policy and its history in `scratch`/policy (rank 0 writes). Either way the
    checkpoints live in `scratch`, so a run killed on any number of ranks resumes on any number (under
    DeepSpeed: on as many); with ranks, `on_iteration` sees every iteration once the group is done (their
    lines reach the task's log as they come)."""
    if cfg.num_processes == 1 and cfg.deepspeed is None:
        return train_ppo(policy_dir, reward_scorer(reward_dir, reward_max_length), prompts, cfg, seed=seed,
                         critic_init_dir=reward_dir, on_iteration=on_iteration, progress=True, ptx_examples=ptx,
                         gold_fn=gold_scores, checkpoint_dir=scratch, reference_dir=reference_dir)
    policy_out = scratch / "policy"
    run_worker(WORKER, worker_args(cfg, policy_dir, reward_dir, reward_max_length, prompts, ptx, seed, scratch,
                                   reference_dir),
               cfg.num_processes, scratch / "worker.log", deepspeed=cfg.deepspeed)
    group_world_size(policy_out, cfg.num_processes, "PPO", scratch / "worker.log")
    history = json.loads((policy_out / "history.json").read_text())
    for metrics in history:
        on_iteration(metrics)
    return models.load_policy(policy_out), models.load_tokenizer(policy_out), history


def worker_args(cfg: PPOConfig, policy_dir: Path, reward_dir: Path, reward_max_length: int, prompts: list[str],
                ptx: list[tuple[str, str]] | None, seed: int, scratch: Path, reference_dir: Path | None = None
                ) -> list[str]:
    """The PPO worker's arguments, its input files written into `scratch` (checkpoints there, the policy
    in `scratch`/policy)."""
    scratch.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"prompt": prompts}).to_parquet(scratch / "prompts.parquet", index=False)
    # resolved (the preset's switches as values, not null): the worker's resume check compares this file, and a
    # switch given explicitly at the preset's value is the same config (the same cache key and checkpoint)
    (scratch / "ppo.json").write_text(cfg.model_dump_json(context=RESOLVED))
    optional = [] if reference_dir is None else ["--reference-dir", str(reference_dir)]
    if ptx is not None:
        pd.DataFrame(ptx, columns=["prompt", "response"]).to_parquet(scratch / "ptx.parquet", index=False)
        optional += ["--ptx", str(scratch / "ptx.parquet")]
    return ["--policy-dir", str(policy_dir), "--reward-model", str(reward_dir), "--reward-max-length",
            str(reward_max_length), "--prompts", str(scratch / "prompts.parquet"), *optional, "--config",
            str(scratch / "ppo.json"), "--seed", str(seed), "--checkpoint-dir", str(scratch), "--out",
            str(scratch / "policy"), "--progress"]
