"""The sampling stage as one plain function of its config: build the encoder and tagger, prepare, select.

tasks/sampling.py tracks it (MLflow, artifacts); everything it decides is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rlhf_core.config import SamplingConfig, TaggerConfig
from rlhf_core.sampling.instag import check_selection, select_from_pool
from rlhf_core.sampling.pool import PreparedPool, Tagger, prepare_pool


@dataclass(frozen=True)
class SamplingResult:
    sampled: pd.DataFrame  # the sampled_prompts table
    report: dict[str, float]
    pool: PreparedPool  # what selection saw: kept prompts, raw and normalised tags


def tag_vocabulary(cfg: TaggerConfig) -> list[str]:
    """The embedding tagger's vocabulary: the configured list, or the lines of vocabulary_file."""
    from rlhf_core.sampling.embedding import load_vocabulary

    return list(cfg.vocabulary) if cfg.vocabulary else load_vocabulary(cfg.vocabulary_file)


def needs_encoder(cfg: SamplingConfig) -> bool:
    return cfg.tagger.source == "embedding" or cfg.semantic_merge_threshold is not None


def build_tagger(cfg: TaggerConfig, workdir: str | Path, encoder=None) -> Tagger | None:
    """The configured tagger; None when tags come with the data. The LLM cache lives under workdir."""
    if cfg.source == "data":
        return None
    if cfg.source == "embedding":
        from rlhf_core.sampling.embedding import EmbeddingTagger

        if encoder is None:
            raise ValueError("the embedding tagger needs an encoder")
        return EmbeddingTagger(tag_vocabulary(cfg), encoder, threshold=cfg.threshold, max_tags=cfg.max_tags)
    from rlhf_core.sampling.taggers import LLMTagger

    return LLMTagger(cfg.base_url, cfg.model, api_key_env=cfg.api_key_env, cache_path=Path(workdir) / cfg.cache_file,
                     max_tags=cfg.max_tags)


def run_sampling(prompts: pd.DataFrame, cfg: SamplingConfig, seed: int, workdir: str | Path,
                 progress: bool = False) -> SamplingResult:
    """Deduplicate, tag, normalise and select `cfg.n_samples` prompts of the pool (deterministic for a seed)."""
    check_selection(cfg.n_samples, len(prompts), cfg.mode, cfg.max_tag_share)
    encoder = None
    if needs_encoder(cfg):
        from rlhf_core.sampling.embedding import Encoder

        encoder = Encoder(cfg.tagger.model_path)
    pool = prepare_pool(
        prompts,
        min_tag_count=cfg.min_tag_count,
        merge_tag_variants=cfg.merge_tag_variants,
        drop_duplicates=cfg.drop_duplicate_prompts,
        near_duplicate_threshold=cfg.near_duplicate_threshold,
        tagger=build_tagger(cfg.tagger, workdir, encoder),
        untagged=cfg.tagger.untagged,
        semantic_merge_threshold=cfg.semantic_merge_threshold,
        tag_encoder=encoder,
        progress=progress,
    )
    sampled, report = select_from_pool(pool, cfg.n_samples, seed, mode=cfg.mode, max_tag_share=cfg.max_tag_share)
    return SamplingResult(sampled, report, pool)
