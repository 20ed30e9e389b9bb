"""Stage 1: tag-balanced prompt sampling (InsTag complexity-first diverse selection)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core.artifacts import ArtifactRef, content_digest
from rlhf_core.config import SamplingConfig
from rlhf_core.sampling.stage import needs_encoder, run_sampling, tag_vocabulary
from rlhf_core.schemas import read_table, write_table
from tasks.common import RunContext, StageRun, run_stage
from tasks.plots import tag_histogram

VERSION = "3"  # 2: taggers (embedding, LLM), semantic tag merge, near-duplicate prompts; 3: near-duplicate
# shingles of characters (were UTF-8 bytes), the balanced cap of the budget (was of the pool after deduplication)


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

    return run_stage(ctx, stage="sample", version=VERSION, kind="sampled_prompts", config=stage_config(cfg, seed),
                     inputs={"prompts": prompts}, produce=produce)


def stage_config(cfg: SamplingConfig, seed: int) -> dict:
    """What the sampling stage's cache key holds: the config, and the content of the files it names."""
    config = {"sampling": cfg.model_dump(), "seed": seed}
    if cfg.tagger.source == "embedding" and cfg.tagger.vocabulary_file:  # the file's content, not its name, is input
        vocabulary = "\n".join(tag_vocabulary(cfg.tagger))
        config["tagger_vocabulary_sha256"] = hashlib.sha256(vocabulary.encode()).hexdigest()
    if needs_encoder(cfg):  # the encoder's weights (the MiniLM package's, or model_path's), not their path
        from rlhf_core.sampling.embedding import encoder_path

        config["encoder_digest"] = content_digest(encoder_path(cfg.tagger.model_path))[0]
    return config
