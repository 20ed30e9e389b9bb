"""InsTag (Lu et al. 2023) complexity-first diverse sampling over tagged prompts.

Prompts are ranked most-tagged first (complexity), ties broken by a seeded shuffle. In each pass
a prompt is taken only if it adds a tag not yet covered in that pass (diversity); passes repeat
over what is left until the budget is met. Prompts without any surviving tag can only enter as
"fill" at the end.

Two modes:
- "complexity_first": the algorithm above, as in the paper.
- "balanced": the same passes, but no tag may be held by more than floor(max_tag_share * budget)
  selected prompts; a prompt holding a tag at that cap is skipped for good, fill included, so the
  budget may not be met (the report says so with budget_met = 0).

Scale: a pass is not a scan of the pool. A prompt can only be taken if it is the first usable
prompt of one of its uncovered tags (any earlier prompt holding that tag was taken, covering it,
or skipped because the tag was already covered). So each pass pops, from a heap keyed by rank, the
first usable prompt of every live tag; per-tag pointers only move forward over the whole run.
Cost: O(tag occurrences + budget * tags-per-prompt * log(tags)), not O(pool * passes).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from itertools import chain, islice
from typing import Literal

import numpy as np
import pandas as pd

from rlhf_core.sampling.pool import PreparedPool, prepare_pool

Mode = Literal["complexity_first", "balanced"]
PASS_REASON = {"complexity_first": "complexity-first", "balanced": "balanced"}


def _prompts_by_tag(prompt_tags: list[list[int]], n_tags: int) -> list[list[int]]:
    """Invert prompt -> tag ids into tag id -> prompt ranks, each list ascending."""
    lengths = [len(ts) for ts in prompt_tags]
    flat_tags = np.fromiter(chain.from_iterable(prompt_tags), dtype=np.int64, count=sum(lengths))
    flat_ranks = np.repeat(np.arange(len(prompt_tags)), lengths)
    by_tag = np.argsort(flat_tags, kind="stable")  # stable: ranks stay ascending within a tag
    bounds = np.cumsum(np.bincount(flat_tags, minlength=n_tags))[:-1]
    return [ranks.tolist() for ranks in np.split(flat_ranks[by_tag], bounds)]


def instag_passes(prompt_tags: list[list[int]], n_tags: int, budget: int, cap: int | None = None):
    """Run the InsTag passes over prompts already in rank order; returns (chosen ranks, n_passes, n_fill).

    prompt_tags[r] holds the tag ids (0..n_tags-1, no repeats) of the prompt ranked r. `cap`, if
    given, is the most selected prompts any tag may be in. The last n_fill chosen ranks are fill.
    """
    tag_prompts = _prompts_by_tag(prompt_tags, n_tags)
    head = [0] * n_tags  # next position to look at in each tag's prompt list; never moves back
    taken = [False] * len(prompt_tags)
    count = [0] * n_tags  # selected prompts holding each tag
    capped = [cap is not None and cap <= 0] * n_tags  # tags no further prompt may bring in

    def usable(r: int) -> bool:
        return not taken[r] and not any(capped[t] for t in prompt_tags[r])

    def first_usable(t: int) -> int | None:
        ranks = tag_prompts[t]
        while head[t] < len(ranks) and not usable(ranks[head[t]]):
            head[t] += 1
        return ranks[head[t]] if head[t] < len(ranks) else None

    chosen: list[int] = []
    live = list(range(n_tags))  # tags that may still bring a prompt in
    n_passes = 0
    while len(chosen) < budget:
        heap = [(r, t) for t in live if (r := first_usable(t)) is not None]
        live = [t for _, t in heap]
        if not heap:
            break
        n_passes += 1
        heapq.heapify(heap)
        covered = [False] * n_tags
        while heap and len(chosen) < budget:
            r, t = heapq.heappop(heap)
            if covered[t]:
                continue
            if not usable(r):  # blocked by a cap reached earlier in this pass
                if (r := first_usable(t)) is not None:
                    heapq.heappush(heap, (r, t))
                continue
            chosen.append(r)
            taken[r] = True
            for u in prompt_tags[r]:
                covered[u] = True
                count[u] += 1
                capped[u] = cap is not None and count[u] >= cap

    fill = list(islice((r for r in range(len(prompt_tags)) if usable(r)), budget - len(chosen)))
    return chosen + fill, n_passes, len(fill)


def tag_cap(budget: int, max_tag_share: float) -> int:
    """Balanced mode's cap: prompts per tag, of the budget (+ 1e-9: 0.29 * 100 is 28.99..)."""
    return int(max_tag_share * budget + 1e-9)


def check_selection(budget: int, n_pool: int, mode: str, max_tag_share: float = 0.3) -> None:
    """Fail before any work (deduplication, paid tagging) on a bad mode, a budget over the pool, or a balanced
    cap of 0 prompts per tag."""
    if mode not in PASS_REASON:
        raise ValueError(f"unknown sampling mode {mode!r}; expected one of {sorted(PASS_REASON)}")
    if budget > n_pool:
        raise ValueError(f"budget {budget} exceeds the pool of {n_pool} prompts")
    check_tag_cap(budget, mode, max_tag_share)


def check_tag_cap(budget: int, mode: str, max_tag_share: float) -> None:
    """A balanced cap of 0 prompts per tag selects nothing (every tagged prompt is over it): a ValueError."""
    if mode == "balanced" and tag_cap(budget, max_tag_share) < 1:
        least_share, least_budget = math.ceil(1e4 / budget) / 1e4, math.ceil(1 / max_tag_share - 1e-9)
        raise ValueError(f"balanced sampling's tag cap int(max_tag_share x n_samples) = int({max_tag_share} x "
                         f"{budget}) is 0 prompts per tag, so no tagged prompt can be selected; raise "
                         f"sampling.max_tag_share to at least {least_share:g} or sampling.n_samples to at least "
                         f"{least_budget}")


def select_prompts(
    prompts: pd.DataFrame,
    budget: int,
    seed: int,
    *,
    mode: Mode = "complexity_first",
    max_tag_share: float = 0.3,
    **prepare_options,
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Select up to `budget` rows of a prompts table. Returns (sampled_prompts table, report dict).

    Steps: `prepare_pool` (deduplication, tagging, tag normalisation; `prepare_options` are its
    keyword arguments: min_tag_count, merge_tag_variants, drop_duplicates, ...), then
    `select_from_pool`. Deterministic for a seed.
    """
    check_selection(budget, len(prompts), mode, max_tag_share)
    return select_from_pool(prepare_pool(prompts, **prepare_options), budget, seed, mode=mode,
                            max_tag_share=max_tag_share)


def select_from_pool(
    pool: PreparedPool, budget: int, seed: int, *, mode: Mode = "complexity_first", max_tag_share: float = 0.3
) -> tuple[pd.DataFrame, dict[str, float]]:
    """InsTag passes in `mode`, then fill, over a prepared pool; returns (sampled_prompts table, report).

    Selects min(budget, pool after deduplication) prompts, fewer only in balanced mode when the
    cap leaves too few usable prompts. The report holds the pool's counts and the selection's.
    """
    check_selection(budget, int(pool.report["n_pool"]), mode, max_tag_share)
    prompts, tags = pool.prompts, pool.tags
    target = min(budget, len(prompts))

    rng = np.random.default_rng(seed)
    n_tags = tags.map(len).to_numpy()
    order = np.lexsort((rng.permutation(len(prompts)), -n_tags))  # most tags first, seeded among equals
    vocab = {t: i for i, t in enumerate(sorted({t for ts in tags for t in ts}))}
    tag_lists = tags.tolist()
    ranked_tags = [[vocab[t] for t in tag_lists[i]] for i in order]
    # of the budget, as documented (of the pool left after deduplication, when smaller, it shrank with each copy
    # removed)
    cap = tag_cap(budget, max_tag_share) if mode == "balanced" else None
    chosen, n_passes, n_fill = instag_passes(ranked_tags, len(vocab), target, cap)

    idx = order[chosen]
    out = prompts.iloc[idx].copy().reset_index(drop=True)
    out["tags"] = [tag_lists[i] for i in idx]
    out["n_tags"] = [int(n_tags[i]) for i in idx]
    out["selection_order"] = list(range(len(idx)))
    out["selection_reason"] = [PASS_REASON[mode]] * (len(idx) - n_fill) + ["fill"] * n_fill
    report = dict(pool.report)
    report.update(
        n_selected=len(out),
        budget_met=float(len(out) == budget),
        n_passes=n_passes,
        n_fill=n_fill,
        **_coverage_report(tags, out["tags"], cap),
    )
    return out, report


def _coverage_report(pool_tags: pd.Series, selected_tags: pd.Series, cap: int | None) -> dict[str, float]:
    """Tag coverage, mean tags per prompt, the largest tag share, and unselected prompts blocked by the cap."""
    selected_counts = Counter(t for ts in selected_tags for t in ts)
    at_cap = {t for t, c in selected_counts.items() if cap is not None and c >= cap}

    def holding_capped(tag_lists: pd.Series) -> int:
        return sum(any(t in at_cap for t in ts) for ts in tag_lists) if at_cap else 0

    return {
        "tag_coverage": len(selected_counts) / max(1, len({t for ts in pool_tags for t in ts})),
        "mean_tags_pool": float(pool_tags.map(len).mean()) if len(pool_tags) else 0.0,
        "mean_tags_selected": float(selected_tags.map(len).mean()) if len(selected_tags) else 0.0,
        "max_tag_share_selected": max(selected_counts.values(), default=0) / max(1, len(selected_tags)),
        "tag_cap": float(cap if cap is not None else len(selected_tags)),  # complexity_first: no cap
        "n_blocked_by_cap": holding_capped(pool_tags) - holding_capped(selected_tags),
    }
