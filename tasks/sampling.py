"""Stage 1: tag-balanced prompt sampling (InsTag complexity-first diverse selection)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import SamplingConfig
from rlhf_core.sampling.stage import run_sampling, tag_vocabulary
from rlhf_core.schemas import read_table, write_table
from tasks.common import RunContext, StageRun, run_stage
from tasks.plots import tag_histogram

VERSION = "2"  # 2: taggers (embedding, LLM), semantic tag merge, near-duplicate prompts


@task(name="sample", version=VERSION, cache_policy=NO_CACHE)
def sample_prompts(ctx: RunContext, cfg: SamplingConfig, prompts: ArtifactRef, seed: int) -> ArtifactRef:
    """Choose the prompts to annotate: most-tagged first, each adding an uncovered tag (InsTag)."""

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        pool = read_table("prompts", prompts.file("prompts.parquet"))
        result = run_sampling(pool, cfg, seed, workdir=ctx.workdir, progress=True)
        write_table("sampled_prompts", result.sampled, out / "sampled_prompts.parquet")
        run.log_figure(tag_histogram(result.pool.tags, result.sampled["tags"]), "tag_frequency.png")
        run.log_figure(tag_histogram(result.pool.raw_tags, result.pool.tags, labels=("raw", "normalised"),
                                     title="Tag frequency before/after normalisation"),
                       "tag_frequency_normalisation.png")
        return {f"sampling/{k}": float(v) for k, v in result.report.items()}

    config = {"sampling": cfg.model_dump(), "seed": seed}
    if cfg.tagger.source == "embedding" and cfg.tagger.vocabulary_file:  # the file's content, not its name, is input
        vocabulary = "\n".join(tag_vocabulary(cfg.tagger))
        config["tagger_vocabulary_sha256"] = hashlib.sha256(vocabulary.encode()).hexdigest()
    return run_stage(ctx, stage="sample", version=VERSION, kind="sampled_prompts", config=config,
                     inputs={"prompts": prompts}, produce=produce)
