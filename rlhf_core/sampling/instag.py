"""InsTag (Lu et al. 2023) complexity-first diverse sampling over tagged prompts.

Prompts are visited most-tagged first (complexity). In each pass a prompt is taken only if it
adds a tag not yet covered in that pass (diversity); passes repeat over what is left until the
budget is met. Prompts without any surviving tag can only enter as "fill" at the end.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd


def normalize_tags(tags: pd.Series, min_count: int = 1) -> tuple[pd.Series, dict[str, int]]:
    """Lower-case and strip tags, drop duplicates within a prompt and tags seen < min_count times."""
    cleaned = tags.map(lambda ts: sorted({str(t).strip().lower() for t in ts if str(t).strip()}))
    counts = Counter(t for ts in cleaned for t in ts)
    kept = {t for t, c in counts.items() if c >= min_count}
    normalized = cleaned.map(lambda ts: [t for t in ts if t in kept])
    report = {
        "tags_raw": len({t for ts in tags for t in ts}),
        "tags_after_cleaning": len(counts),
        "tags_after_frequency_filter": len(kept),
    }
    return normalized, report


def complexity_first_diverse(prompts: pd.DataFrame, budget: int, seed: int, min_tag_count: int = 1):
    """Select `budget` rows of a prompts table. Returns (sampled_prompts table, report dict).

    Order within equal tag counts is a seeded shuffle, so selection is deterministic for a seed.
    """
    if budget > len(prompts):
        raise ValueError(f"budget {budget} exceeds the pool of {len(prompts)} prompts")
    tags, report = normalize_tags(prompts["tags"], min_tag_count)
    rng = np.random.default_rng(seed)
    n_tags = tags.map(len).to_numpy()
    tiebreak = rng.permutation(len(prompts))
    order = np.lexsort((tiebreak, -n_tags))  # most tags first, seeded order among equals

    remaining = [int(i) for i in order]
    chosen: list[tuple[int, str]] = []
    n_passes = 0
    while len(chosen) < budget and remaining:
        n_passes += 1
        covered: set[str] = set()
        left = []
        for i in remaining:
            new = set(tags.iloc[i]) - covered
            if new and len(chosen) < budget:
                chosen.append((i, "complexity-first"))
                covered |= new
            else:
                left.append(i)
        if len(left) == len(remaining):  # nothing adds a tag any more: fill in complexity order
            k = budget - len(chosen)
            chosen.extend((i, "fill") for i in left[:k])
            left = left[k:]
        remaining = left

    idx = [i for i, _ in chosen]
    out = prompts.iloc[idx].copy().reset_index(drop=True)
    out["tags"] = [tags.iloc[i] for i in idx]
    out["n_tags"] = [int(n_tags[i]) for i in idx]
    out["selection_order"] = list(range(len(idx)))
    out["selection_reason"] = [r for _, r in chosen]

    pool_tags = {t for ts in tags for t in ts}
    got_tags = {t for ts in out["tags"] for t in ts}
    report.update(
        n_selected=len(out),
        n_passes=n_passes,
        tag_coverage=len(got_tags) / max(1, len(pool_tags)),
        mean_tags_pool=float(n_tags.mean()),
        mean_tags_selected=float(out["n_tags"].mean()) if len(out) else 0.0,
    )
    return out, report
