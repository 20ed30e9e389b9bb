"""Cleaning before selection: tag normalisation (InsTag's rules, no embeddings) and duplicate prompts.

InsTag (Lu et al. 2023) normalises open-set tags in steps; the steps done here, in order:

1. cleaning: lower-case and strip (what this project always did);
2. rule aggregation (optional): tags whose spellings differ only in punctuation, whitespace,
   underscores, hyphens or an English suffix (plural, -ing, -ed) share one key and merge,
   so "code-reviews", "Code review" and "code_reviewing" become one tag;
3. frequency filter: tags seen in fewer than `min_count` prompts are dropped (long-tail noise).

InsTag's semantic (embedding) aggregation is not done yet.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pandas as pd

_SEPARATORS = re.compile(r"[\W_]+")  # any run of punctuation, whitespace, underscore or hyphen
# Prose punctuation only: symbols that change a prompt's meaning ("7+8" vs "7-8") are kept.
_PROSE_PUNCTUATION = re.compile(r"[.,;:!?'\"`()\[\]{}]+")
_WHITESPACE = re.compile(r"\s+")


def stem_word(word: str) -> str:
    """Strip one English suffix, deterministically and without a dictionary (a tiny Porter step 1).

    "reviews" -> "review", "reviewing" -> "review", "studies" -> "study", "processes" -> "process",
    "writing" -> "writ", "write" -> "writ" (a final "e" is dropped so -ing/-ed forms meet their base).
    Only a key for merging: the tag shown keeps a real spelling (see `normalize_tags`).
    """
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    if word.endswith("s") and len(word) > 3 and word[-2] not in "siu":  # not "class", "analysis", "status"
        word = word[:-1]
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return word


def tag_key(tag: str) -> str:
    """The rule-aggregation key of a cleaned tag: separators unified to one space, each word stemmed."""
    return " ".join(stem_word(w) for w in _SEPARATORS.split(tag.lower()) if w)


def _clean(tags) -> list[str]:
    """Lower-case and strip one prompt's tags; empty tags dropped."""
    return [c for c in (str(t).strip().lower() for t in tags) if c]


def normalize_tags(
    tags: pd.Series, min_count: int = 1, merge_variants: bool = False
) -> tuple[pd.Series, dict[str, int]]:
    """Normalise every prompt's tags; returns (sorted unique tags per prompt, counts after each step).

    With `merge_variants`, spellings with the same `tag_key` merge into one tag, named by its most
    frequent cleaned spelling (ties: the alphabetically first), so tags stay readable in plots.
    The frequency filter counts prompts, not occurrences (a tag repeated in one prompt counts once).
    """
    cleaned = tags.map(_clean)
    spellings = Counter(t for ts in cleaned for t in set(ts))
    rename = {t: t for t in spellings}
    if merge_variants:
        by_key: dict[str, list[str]] = {}
        for spelling in spellings:
            by_key.setdefault(tag_key(spelling), []).append(spelling)
        for group in by_key.values():
            name = min(group, key=lambda s: (-spellings[s], s))
            rename.update((s, name) for s in group)
    merged = cleaned.map(lambda ts: sorted({rename[t] for t in ts}))
    counts = Counter(t for ts in merged for t in ts)
    kept = {t for t, c in counts.items() if c >= min_count}
    normalized = merged.map(lambda ts: [t for t in ts if t in kept])
    report = {
        "tags_raw": len({t for ts in tags for t in ts}),
        "tags_after_cleaning": len(spellings),
        "tags_after_rules": len(counts),
        "tags_after_frequency_filter": len(kept),
    }
    return normalized, report


def normalize_text(text: str) -> str:
    """Duplicate-detection key of a prompt: lower-case, prose punctuation removed, whitespace collapsed."""
    return _WHITESPACE.sub(" ", _PROSE_PUNCTUATION.sub(" ", str(text).lower())).strip()


def drop_duplicate_prompts(prompts: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Remove prompts whose `normalize_text` repeats an earlier one; returns (kept rows, number removed).

    "Earlier" is prompt_id order, so the survivor does not depend on row order; kept rows keep
    their original order (the selection's seeded tiebreak sees the same pool either way).
    """
    keys = prompts["prompt"].map(normalize_text).to_numpy()
    by_id = np.argsort(prompts["prompt_id"].to_numpy(), kind="stable")
    duplicate = np.zeros(len(prompts), dtype=bool)
    duplicate[by_id] = pd.Series(keys[by_id]).duplicated().to_numpy()
    return prompts[~duplicate], int(duplicate.sum())
