"""Stage 7: PPO of the policy against the reward model, KL-penalised towards the SFT reference."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core import models
from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import RESOLVED, PPOConfig, RewardTrainConfig
from rlhf_core.ppo.trainer import train_ppo
from rlhf_core.reward.model import RewardModel, score_texts
from rlhf_core.schemas import read_table
from rlhf_core.sim.world import gold_score
from tasks.common import RunContext, StageRun, run_stage
from tasks.plots import ppo_curves

VERSION = "2"  # 2: gold per iteration, checkpoints, critic warm-up in optimiser steps


def reward_scorer(reward_dir: str, max_length: int):
    """(prompts, responses) -> scores, from a saved reward model."""
    model, tokenizer = RewardModel.load(reward_dir), models.load_tokenizer(reward_dir)
    return lambda prompts, responses: score_texts(model, tokenizer, prompts, responses, max_length=max_length)


def gold_scores(prompts: list[str], responses: list[str]) -> list[float]:
    """The simulated world's true reward of each response: logged per iteration, never trained on."""
    return [gold_score(p, r) for p, r in zip(prompts, responses)]


@task(name="ppo", version=VERSION, cache_policy=NO_CACHE)
def train_policy(ctx: RunContext, cfg: PPOConfig, policy: ArtifactRef, reward_model: ArtifactRef,
                 world: ArtifactRef, sft: ArtifactRef, reward_train: RewardTrainConfig, seed: int) -> ArtifactRef:
    """PPO over the prompt pool; the critic starts from the reward model; curves logged per iteration."""

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        prompts = read_table("prompts", world.file("prompts.parquet"))["prompt"].tolist()
        scorer = reward_scorer(reward_model.path, reward_train.max_length)
        on_iteration = lambda m: run.log_metrics(m, step=int(m["iteration"]))  # noqa: E731
        ptx = None
        if cfg.ptx_coef > 0:  # PPO-max's pretraining loss, on the demonstrations the SFT policy learned
            demos = pd.read_parquet(sft.file("demonstrations.parquet"))
            ptx = list(zip(demos["prompt"], demos["response"]))
        model, tokenizer, history = train_ppo(policy.path, scorer, prompts, cfg, seed=seed,
                                              critic_init_dir=reward_model.path, on_iteration=on_iteration,
                                              progress=True, ptx_examples=ptx, gold_fn=gold_scores,
                                              checkpoint_dir=run.scratch)
        models.save_hf(model, tokenizer, out)
        run.log_figure(ppo_curves(history), "ppo_curves.png")
        first, last = history[0], history[-1]
        return {"ppo/score_first": first["objective/score"], "ppo/score_last": last["objective/score"],
                "ppo/gold_first": first["objective/gold"], "ppo/gold_last": last["objective/gold"],
                "ppo/kl_last": last["objective/kl"], "ppo/iterations": len(history)}

    config = {"ppo": cfg.model_dump(context=RESOLVED), "reward_max_length": reward_train.max_length, "seed": seed}
    return run_stage(ctx, stage="ppo", version=VERSION, kind="policy", config=config,
                     inputs={"policy": policy, "reward_model": reward_model, "world": world, "sft": sft}, produce=produce,
                     register_as="rlhf-policy")
