"""Time InsTag selection at scale (both modes) on a synthetic pool; write docs/benchmark-sampling.md (and its .json
and .png).

    .venv/bin/python benchmarks/sampling_select.py [--n-prompts 300000] [--n-tags 6600] [--budget 10000] [--fuzzy]

The pool is seeded: tag frequencies follow a Zipf law (p ~ 1 / rank), 1 to 8 tags per prompt,
one tag in ten written in another spelling ("Topic_12", "topics 12") for rule aggregation to merge,
1% of prompts with a one-off noise tag for the frequency filter to drop, 2% of prompts are
re-cased, re-punctuated copies of others for deduplication to remove, and 1% are fuzzy copies
(another prompt + " Thanks!") that only near-duplicate removal (MinHash) catches.
Each timing covers the whole `select_prompts` call: deduplication, tag normalisation, passes, report.

--fuzzy also times near-duplicate removal (MinHash + LSH, alone), the semantic tag merge (alone)
and a whole selection with both on. The semantic merge uses a fake encoder (seeded random
384-d vectors; "topic-2k" and "topic-2k+1" get nearby vectors, cosine ~0.94, so about half of
the topic tags merge): it measures the merge's cost, not an encoder's (MiniLM would add the
time to embed the tags, once).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
import zlib
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from rlhf_core.sampling.dedup import drop_near_duplicate_prompts
from rlhf_core.sampling.instag import select_prompts
from rlhf_core.sampling.normalize import normalize_tags

sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_files import bars, figure_axes, save_figure, write_json  # noqa: E402
from rlhf_core.artifacts import atomic_write_text  # noqa: E402

VARIANTS = ("topic-{}", "Topic_{}", "topics {}")


def synthetic_pool(n_prompts: int, n_tags: int, seed: int) -> pd.DataFrame:
    """A prompts table of n_prompts rows with Zipf-distributed tags and a few duplicate texts."""
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, n_tags + 1)
    sizes = rng.integers(1, 9, size=n_prompts)  # 1..8 tags drawn per prompt (repeats collapse)
    flat = rng.choice(n_tags, size=sizes.sum(), p=zipf / zipf.sum())
    spelling = rng.choice(len(VARIANTS), size=flat.size, p=[0.9, 0.05, 0.05])
    names = [VARIANTS[v].format(t) for t, v in zip(flat.tolist(), spelling.tolist())]
    bounds = np.cumsum(sizes)[:-1]
    tags = [sorted(set(ts)) for ts in np.split(np.array(names, dtype=object), bounds)]
    for i in rng.choice(n_prompts, size=n_prompts // 100, replace=False).tolist():  # 1% one-off noise tags
        tags[i].append(f"typo-{i}")
    texts = [f"Question {i}: explain item {i * 7919 % n_prompts}." for i in range(n_prompts)]
    for i in rng.choice(n_prompts, size=n_prompts // 50, replace=False).tolist():  # 2% near-copies
        texts[i] = texts[(i * 31 + 1) % n_prompts].upper().replace(".", " !")
    for i in rng.choice(n_prompts, size=n_prompts // 100, replace=False).tolist():  # 1% fuzzy copies
        texts[i] = texts[(i * 17 + 3) % n_prompts] + " Thanks!"
    ids = [f"s{i:06d}" for i in range(n_prompts)]
    return pd.DataFrame({"prompt_id": ids, "prompt": texts, "tags": tags, "source": "synthetic"})


def fake_tag_encoder(names: list[str]) -> np.ndarray:
    """Seeded random 384-d vectors; "topic-2k" and "topic-2k+1" share a base vector (cosine ~0.94)."""
    out = np.empty((len(names), 384), dtype=np.float32)
    for i, name in enumerate(names):
        number = int(re.findall(r"\d+", name)[-1]) if re.search(r"\d", name) else 0
        group = number // 2 if name.startswith("topic") else 10**7 + number
        base = np.random.default_rng(group).standard_normal(384)
        out[i] = base + 0.25 * np.random.default_rng(zlib.crc32(name.encode())).standard_normal(384)
    return out


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def fuzzy_section(pool: pd.DataFrame, args) -> tuple[list[str], dict[str, float]]:
    """Time near-duplicate removal and the semantic merge, alone and inside a whole selection: the report's lines
    and each step's seconds."""
    (kept, n_near), near_s = _timed(lambda: drop_near_duplicate_prompts(pool, args.near_duplicate_threshold))
    print(f"near-duplicates: {near_s:.1f} s, {n_near} removed")
    (_, merge_report), merge_s = _timed(lambda: normalize_tags(
        pool["tags"], args.min_tag_count, True, args.semantic_merge_threshold, fake_tag_encoder))
    print(f"semantic merge (with rules, fake encoder): {merge_s:.1f} s", merge_report)
    (_, no_merge_report), rules_s = _timed(lambda: normalize_tags(pool["tags"], args.min_tag_count, True))
    (_, report), whole_s = _timed(lambda: select_prompts(
        pool, args.budget, args.seed, min_tag_count=args.min_tag_count, merge_tag_variants=True,
        drop_duplicates=True, near_duplicate_threshold=args.near_duplicate_threshold,
        semantic_merge_threshold=args.semantic_merge_threshold, tag_encoder=fake_tag_encoder))
    print(f"whole selection with both: {whole_s:.1f} s", report)
    seconds = {"near-duplicate removal": near_s, "tags: rules only": rules_s, "tags: rules + semantic merge": merge_s,
               "whole selection, both on": whole_s}
    return [
        "## Near-duplicate prompts and semantic tag merge (`--fuzzy`)",
        "",
        "Near-duplicate removal: MinHash (128 permutations, 5-character shingles) + LSH, threshold "
        + f"{args.near_duplicate_threshold}, over all {len(pool):,} prompts (before exact deduplication).",
        f"Semantic merge: threshold {args.semantic_merge_threshold}, with a **fake encoder** (seeded random "
        + "384-d vectors, `topic-2k` and `topic-2k+1` close): it measures the merge, not an encoder; with "
        + "all-MiniLM-L6-v2 add the time to embed the tags once.",
        "",
        "| step | seconds | result |",
        "|---|---|---|",
        f"| near-duplicate removal alone | {near_s:.1f} | {n_near:,} prompts removed ({len(kept):,} kept) |",
        f"| tag normalisation, rules only | {rules_s:.1f} | {no_merge_report['tags_after_rules']:,} tags after rules |",
        f"| tag normalisation, rules + semantic merge | {merge_s:.1f} | "
        + f"{merge_report['n_tags_merged_semantic']:,} tags merged, "
        + f"{merge_report['tags_after_semantic_merge']:,} left |",
        f"| whole `select_prompts` (complexity_first), exact + near dedup, rules + semantic merge | {whole_s:.1f} | "
        + f"{report['n_duplicates_removed']:,} exact + {report['n_near_duplicates_removed']:,} near duplicates, "
        + f"{report['tags_after_frequency_filter']:,} tags kept, coverage {report['tag_coverage']:.3f} |",
        "",
    ], seconds


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-prompts", type=int, default=300_000)
    parser.add_argument("--n-tags", type=int, default=6_600)
    parser.add_argument("--budget", type=int, default=10_000)
    parser.add_argument("--max-tag-share", type=float, default=0.3)
    parser.add_argument("--min-tag-count", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="docs/benchmark-sampling.md")
    parser.add_argument("--fuzzy", action="store_true", help="also time near-duplicate removal and semantic merge")
    parser.add_argument("--near-duplicate-threshold", type=float, default=0.7)
    parser.add_argument("--semantic-merge-threshold", type=float, default=0.9)
    args = parser.parse_args(argv)

    load_at_start = os.getloadavg()[0]
    start = time.perf_counter()
    pool = synthetic_pool(args.n_prompts, args.n_tags, args.seed)
    build_s = time.perf_counter() - start

    seconds, reports = {}, {}
    for mode in ("complexity_first", "balanced"):
        start = time.perf_counter()
        _, reports[mode] = select_prompts(
            pool, args.budget, args.seed, mode=mode, max_tag_share=args.max_tag_share,
            min_tag_count=args.min_tag_count, merge_tag_variants=True, drop_duplicates=True,
        )
        seconds[mode] = time.perf_counter() - start
        print(f"{mode}: {seconds[mode]:.1f} s", reports[mode])

    fuzzy_lines, fuzzy_seconds = fuzzy_section(pool, args) if args.fuzzy else ([], {})
    result = {"date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "args": vars(args),
              "load_average_at_start": load_at_start, "pool_build_seconds": build_s, "seconds": seconds,
              "reports": reports, "fuzzy_seconds": fuzzy_seconds}
    write_json(args.out, result)
    fig, axes = figure_axes(2 if fuzzy_seconds else 1)
    bars(axes[0], seconds, "seconds", f"select_prompts on {args.n_prompts:,} prompts, budget {args.budget:,}")
    if fuzzy_seconds:
        bars(axes[1], fuzzy_seconds, "seconds", "Near duplicates and semantic tag merge (--fuzzy)")
    figure = save_figure(fig, args.out)

    keys = list(reports["complexity_first"])
    lines = [
        "# Sampling benchmark: InsTag selection at scale",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `benchmarks/sampling_select.py` (defaults below).",
        f"Machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, Python "
        + f"{platform.python_version()}, numpy {np.__version__}, pandas {pd.__version__}; "
        + f"1-minute load average at the start {load_at_start:.1f} (other processes share the cores: "
        + "compare timings only at similar load).",
        "",
        f"Synthetic pool: {args.n_prompts:,} prompts, {args.n_tags:,} tags with Zipf frequencies (p ~ 1/rank), "
        + "1-8 tags drawn per prompt, 10% of tags in a variant spelling, 1% of prompts with a one-off noise tag, "
        + f"2% re-cased copies and 1% fuzzy copies of prompts; seed {args.seed}; built in {build_s:.1f} s.",
        f"Selection: budget {args.budget:,}, min_tag_count {args.min_tag_count}, merge_tag_variants and "
        + f"drop_duplicates on, balanced max_tag_share {args.max_tag_share}.",
        "Seconds cover the whole `select_prompts` call (deduplication, tag normalisation, passes, report).",
        "",
        figure,
        "",
        "| | complexity_first | balanced |",
        "|---|---|---|",
        f"| **seconds** | **{seconds['complexity_first']:.1f}** | **{seconds['balanced']:.1f}** |",
        *[f"| {k} | {_fmt(reports['complexity_first'][k])} | {_fmt(reports['balanced'][k])} |" for k in keys],
        "",
    ]
    lines += fuzzy_lines
    atomic_write_text(args.out, "\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
