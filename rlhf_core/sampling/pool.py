"""The pool as selection sees it: duplicates removed, prompts tagged (optionally), tags normalised.

Order of the steps, and why:
1. exact duplicate prompts, then fuzzy near-duplicates (MinHash): first, so no tagger is paid for
   a prompt that is dropped anyway, and tag frequencies count each prompt once;
2. tagging, when a tagger is given (its tags replace the data's);
3. tag normalisation: cleaning, rule aggregation, semantic merge, frequency filter (`normalize.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import pandas as pd

from rlhf_core.sampling.dedup import drop_near_duplicate_prompts
from rlhf_core.sampling.normalize import TextEncoder, drop_duplicate_prompts, normalize_tags

Untagged = Literal["error", "fill"]


class Tagger(Protocol):
    """What prepare_pool needs of a tagger (LLMTagger, EmbeddingTagger): tags per prompt, in order."""

    def tag(self, prompts: list[str], progress: bool = False) -> list[list[str]]: ...


@dataclass(frozen=True)
class PreparedPool:
    """Rows kept (original order and index), their tags before and after normalisation, and the counts."""

    prompts: pd.DataFrame
    raw_tags: pd.Series  # the data's or the tagger's tags, aligned with prompts
    tags: pd.Series  # normalised: sorted, unique, frequent enough
    report: dict[str, float]


def prepare_pool(
    prompts: pd.DataFrame,
    *,
    min_tag_count: int = 1,
    merge_tag_variants: bool = False,
    drop_duplicates: bool = False,
    near_duplicate_threshold: float | None = None,
    tagger: Tagger | None = None,
    untagged: Untagged = "error",
    semantic_merge_threshold: float | None = None,
    tag_encoder: TextEncoder | None = None,
    progress: bool = False,
) -> PreparedPool:
    """Deduplicate, tag and normalise a prompts table; see the module docstring for the order.

    With a tagger and untagged="error", a prompt left without tags raises, naming it; with
    "fill" it stays in the pool and can only be selected as fill.
    """
    if untagged not in ("error", "fill"):
        raise ValueError(f"untagged must be 'error' or 'fill', got {untagged!r}")
    n_pool, n_duplicates, n_near_duplicates = len(prompts), 0, 0
    if drop_duplicates:
        prompts, n_duplicates = drop_duplicate_prompts(prompts)
    if near_duplicate_threshold is not None:
        prompts, n_near_duplicates = drop_near_duplicate_prompts(prompts, near_duplicate_threshold)
    raw_tags = prompts["tags"]
    if tagger is not None:
        raw_tags = pd.Series(tagger.tag(prompts["prompt"].tolist(), progress=progress), index=prompts.index,
                             name="tags", dtype=object)
        if untagged == "error":
            _check_all_tagged(prompts["prompt_id"], raw_tags)
    tags, counts = normalize_tags(raw_tags, min_tag_count, merge_tag_variants, semantic_merge_threshold, tag_encoder)
    report = {
        "n_pool": n_pool,
        "n_duplicates_removed": n_duplicates,
        "n_near_duplicates_removed": n_near_duplicates,
        **counts,
        "mean_tags_raw": float(raw_tags.map(len).mean()) if len(raw_tags) else 0.0,
        "prompt_tag_coverage": float((tags.map(len) > 0).mean()) if len(tags) else 0.0,  # prompts with a tag
    }
    return PreparedPool(prompts, raw_tags, tags, report)


def _check_all_tagged(prompt_ids: pd.Series, tags: pd.Series) -> None:
    untagged = prompt_ids[(tags.map(len) == 0).to_numpy()].tolist()
    if untagged:
        raise ValueError(
            f"the tagger gave no tags to {len(untagged)} of {len(tags)} prompts, first prompt_id {untagged[0]!r} "
            f"(all: {untagged[:10]}{' ...' if len(untagged) > 10 else ''}): lower the tagger threshold, widen "
            "the vocabulary, or set sampling.tagger.untagged to 'fill' to keep them as fill-only prompts"
        )
