"""Cleaning before selection: tag normalisation (InsTag's rules, no embeddings) and duplicate prompts.

InsTag (Lu et al. 2023) normalises open-set tags in steps; the steps done here, in order:

1. cleaning: lower-case and strip (what this project always did);
2. rule aggregation (optional): tags whose spellings differ only in punctuation, whitespace,
   underscores, hyphens or an English suffix (plural, -ing, -ed) share one key and merge,
   so "code-reviews", "Code review" and "code_reviewing" become one tag;
3. semantic merge (optional): tags whose embeddings have cosine similarity >= a threshold merge
   into the more frequent one ("math" into "mathematics" when that is the commoner tag);
4. frequency filter: tags seen in fewer than `min_count` prompts are dropped (long-tail noise).

The encoder of step 3 is injected (any callable texts -> (N, D) array), so this module stays free
of model code; `embedding.Encoder` is the real one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

import numpy as np
import pandas as pd

TextEncoder = Callable[[list[str]], np.ndarray]  # texts -> (N, D) embeddings

_SEPARATORS = re.compile(r"[\W_]+")  # any run of punctuation, whitespace, underscore or hyphen
# Prose punctuation only: symbols that change a prompt's meaning are kept: operators ("7+8" vs "7-8"), brackets
# ("(2+3)*4" vs "2+3*4"), and "." "," ":" between digits ("1.5", "3:4") or "!" after one ("5!", a factorial).
_PROSE_PUNCTUATION = re.compile(r"[.,;:!?'\"`]")
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


def semantic_merge(
    counts: dict[str, int], encoder: TextEncoder, threshold: float, block_size: int = 1024
) -> dict[str, str]:
    """Map every tag to the tag it merges into (itself when it stays); cosine >= threshold merges.

    Leader clustering in frequency order (most frequent first, ties alphabetical): a tag joins the
    most similar tag before it that is still a leader, when that similarity is >= threshold, else
    it leads. Every merged tag is thus within the threshold of its new name, and chains
    ("math" ~ "math proof" ~ "proof reading") cannot drift the way a connected-components
    clustering (InsTag's DBSCAN) can. Similarities come from blocked products of unit-normalised
    embeddings: (block_size, T) floats at a time, one vectorised argmax per tag.
    """
    if not -1.0 <= threshold <= 1.0:
        raise ValueError(f"semantic merge threshold must be a cosine similarity in [-1, 1], got {threshold}")
    names = sorted(counts, key=lambda t: (-counts[t], t))
    if not names:
        return {}
    embeddings = np.asarray(encoder(names), dtype=np.float32)
    if embeddings.ndim != 2 or len(embeddings) != len(names):
        raise ValueError(f"the tag encoder returned shape {embeddings.shape} for {len(names)} tags; expected (T, D)")
    norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
    embeddings = embeddings / np.maximum(norms, 1e-12)
    leader = np.arange(len(names))
    is_leader = np.ones(len(names), dtype=bool)
    for start in range(0, len(names), block_size):
        stop = min(start + block_size, len(names))
        similarity = embeddings[start:stop] @ embeddings[:stop].T  # (B, stop): each tag vs itself and earlier tags
        for i in range(start, stop):
            row = np.where(is_leader[:i], similarity[i - start, :i], -np.inf)  # earlier leaders only
            if i and row.max() >= threshold:
                leader[i], is_leader[i] = int(row.argmax()), False  # argmax: first max, the more frequent
    return {name: names[leader[i]] for i, name in enumerate(names)}


def normalize_tags(
    tags: pd.Series,
    min_count: int = 1,
    merge_variants: bool = False,
    semantic_threshold: float | None = None,
    encoder: TextEncoder | None = None,
) -> tuple[pd.Series, dict[str, int]]:
    """Normalise every prompt's tags; returns (sorted unique tags per prompt, counts after each step).

    With `merge_variants`, spellings with the same `tag_key` merge into one tag, named by its most
    frequent cleaned spelling (ties: the alphabetically first), so tags stay readable in plots.
    With `semantic_threshold`, `semantic_merge` with `encoder` runs on the tags left after that.
    Frequencies count prompts, not occurrences (a tag repeated in one prompt counts once).
    """
    if semantic_threshold is not None and encoder is None:
        raise ValueError("semantic tag merging needs an encoder (texts -> embeddings); none was given")
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
    n_after_rules = len(counts)
    if semantic_threshold is not None:
        semantic = semantic_merge(counts, encoder, semantic_threshold)
        merged = merged.map(lambda ts: sorted({semantic[t] for t in ts}))
        counts = Counter(t for ts in merged for t in ts)
    kept = {t for t, c in counts.items() if c >= min_count}
    normalized = merged.map(lambda ts: [t for t in ts if t in kept])
    report = {
        "tags_raw": len({t for ts in tags for t in ts}),
        "tags_after_cleaning": len(spellings),
        "tags_after_rules": n_after_rules,
        "tags_after_semantic_merge": len(counts),
        "n_tags_merged_semantic": n_after_rules - len(counts),
        "tags_after_frequency_filter": len(kept),
    }
    return normalized, report


def normalize_text(text: str) -> str:
    """Duplicate-detection key of a prompt: lower-case, prose punctuation removed, whitespace collapsed."""
    text = str(text).lower()

    def prose_or_kept(match: re.Match) -> str:
        i, mark = match.start(), match.group()
        after_digit = i > 0 and text[i - 1].isdigit()
        before_digit = i + 1 < len(text) and text[i + 1].isdigit()
        return mark if after_digit and (mark == "!" or (mark in ".,:" and before_digit)) else " "

    return _WHITESPACE.sub(" ", _PROSE_PUNCTUATION.sub(prose_or_kept, text)).strip()


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
