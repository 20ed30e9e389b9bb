"""Stage 2: responses to annotate, from the policy under every strategy of the generation plan."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core import models
from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import GenerationConfig
from rlhf_core.generation.plan import generate_responses
from rlhf_core.schemas import read_table, write_table
from tasks.common import RunContext, StageRun, run_stage

VERSION = "1"


@task(name="generate", version=VERSION, cache_policy=NO_CACHE)
def generate(ctx: RunContext, cfg: GenerationConfig, sampled: ArtifactRef, policy: ArtifactRef,
             seed: int) -> ArtifactRef:
    """Sample n responses per prompt per strategy; every row keeps its generator and strategy."""

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        prompts = read_table("sampled_prompts", sampled.file("sampled_prompts.parquet"))
        model, tokenizer = models.load_policy(policy.path), models.load_tokenizer(policy.path)
        responses, report = generate_responses(
            model, tokenizer, prompts, cfg.strategies, generator=f"policy:{policy.digest[:12]}",
            batch_size=cfg.batch_size, seed=seed,
        )
        write_table("responses", responses, out / "responses.parquet")
        return {f"generation/{k}": float(v) for k, v in report.items()}

    return run_stage(ctx, stage="generate", version=VERSION, kind="responses",
                     config={"generation": cfg.model_dump(), "seed": seed},
                     inputs={"sampled_prompts": sampled, "policy": policy}, produce=produce)
