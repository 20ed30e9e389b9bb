"""Stage 1: tag-balanced prompt sampling (InsTag complexity-first diverse selection)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import SamplingConfig
from rlhf_core.sampling.instag import select_prompts
from rlhf_core.schemas import read_table, write_table
from tasks.common import RunContext, StageRun, run_stage
from tasks.plots import tag_histogram

VERSION = "1"


@task(name="sample", version=VERSION, cache_policy=NO_CACHE)
def sample_prompts(ctx: RunContext, cfg: SamplingConfig, prompts: ArtifactRef, seed: int) -> ArtifactRef:
    """Choose the prompts to annotate: most-tagged first, each adding an uncovered tag (InsTag)."""

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        pool = read_table("prompts", prompts.file("prompts.parquet"))
        sampled, report = select_prompts(
            pool, cfg.n_samples, seed=seed, mode=cfg.mode, max_tag_share=cfg.max_tag_share,
            min_tag_count=cfg.min_tag_count, merge_tag_variants=cfg.merge_tag_variants,
            drop_duplicates=cfg.drop_duplicate_prompts,
        )
        write_table("sampled_prompts", sampled, out / "sampled_prompts.parquet")
        run.log_figure(tag_histogram(pool["tags"], sampled["tags"]), "tag_frequency.png")
        return {f"sampling/{k}": float(v) for k, v in report.items()}

    return run_stage(ctx, stage="sample", version=VERSION, kind="sampled_prompts",
                     config={"sampling": cfg.model_dump(), "seed": seed}, inputs={"prompts": prompts},
                     produce=produce)
