"""Stage 6: the reward model trained on the denoised pairs."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core import models
from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import RewardConfig
from rlhf_core.reward.train import pairwise_accuracy, train_reward_model
from rlhf_core.schemas import read_table
from rlhf_core.sim.metrics import gold_eval_pairs
from tasks.common import RunContext, StageRun, run_stage

VERSION = "1"


@task(name="reward", version=VERSION, cache_policy=NO_CACHE)
def train_reward(ctx: RunContext, cfg: RewardConfig, denoised: ArtifactRef, policy: ArtifactRef,
                 world: ArtifactRef, seed: int, simulated: bool) -> ArtifactRef:
    """Bradley-Terry with soft labels and margins; accuracy against gold on held-out pairs."""

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        pairs = read_table("denoised", denoised.file("denoised.parquet"))
        model, tokenizer, report = train_reward_model(policy.path, pairs, cfg.train, seed=seed, progress=True)
        models.save_hf(model, tokenizer, out)
        metrics = {f"reward/{k}": float(v) for k, v in report.items() if isinstance(v, (int, float))}
        if simulated:
            held_out = read_table("prompts", world.file("eval_prompts.parquet"))
            eval_pairs = gold_eval_pairs(policy.path, held_out["prompt"].tolist(), seed=seed)
            metrics["reward/gold_accuracy_heldout"] = pairwise_accuracy(model, tokenizer, eval_pairs,
                                                                        cfg.train.max_length)
            metrics["reward/n_heldout_pairs"] = len(eval_pairs)
        return metrics

    return run_stage(ctx, stage="reward", version=VERSION, kind="reward_model",
                     config={"reward": cfg.model_dump(), "seed": seed, "simulated": simulated},
                     inputs={"denoised": denoised, "policy": policy, "world": world}, produce=produce,
                     register_as="rlhf-reward-model")
