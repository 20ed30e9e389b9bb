"""Stage 8: the new policy judged against the SFT policy, both orders, win/tie/lose."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core import models
from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import EvalConfig, RewardTrainConfig
from rlhf_core.evaluation import compare_policies
from rlhf_core.judge.oracle import OracleJudge
from rlhf_core.schemas import read_table, write_table
from rlhf_core.sim.world import gold_score
from tasks.common import RunContext, StageRun, run_stage
from tasks.plots import verdict_bars
from tasks.ppo import reward_scorer

VERSION = "1"


@task(name="evaluate", version=VERSION, cache_policy=NO_CACHE)
def evaluate(ctx: RunContext, cfg: EvalConfig, candidate: ArtifactRef, baseline: ArtifactRef,
             reward_model: ArtifactRef, world: ArtifactRef, reward_train: RewardTrainConfig, seed: int) -> ArtifactRef:
    """Pairwise judging on held-out prompts, plus reward, gold and KL of both policies."""

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        prompts = read_table("prompts", world.file("eval_prompts.parquet"))
        tokenizer = models.load_tokenizer(candidate.path)
        judge = OracleJudge(tie_margin=cfg.tie_margin)
        judgements, metrics = compare_policies(
            models.load_policy(candidate.path), models.load_policy(baseline.path), tokenizer, prompts, judge, cfg,
            seed=seed, score_fn=reward_scorer(reward_model.path, reward_train.max_length), gold_fn=gold_score,
            names=("policy", "sft"),
        )
        write_table("judgements", judgements, out / "judgements.parquet")
        run.log_figure(verdict_bars({k.split("/")[-1]: v for k, v in metrics.items()}, "new policy vs SFT"),
                       "win_tie_lose.png")
        return {f"eval/{k}": v for k, v in metrics.items()}

    config = {"evaluation": cfg.model_dump(), "reward_max_length": reward_train.max_length, "seed": seed}
    return run_stage(ctx, stage="evaluate", version=VERSION, kind="judgements", config=config,
                     inputs={"candidate": candidate, "baseline": baseline, "reward_model": reward_model,
                             "world": world}, produce=produce)
