"""Tokens/s of the batched generator against a one-prompt-at-a-time loop; writes docs/benchmark-generation.md.

    .venv/bin/python benchmarks/generation_throughput.py [--policy DIR] [--prompts 256] [--out ...]

--policy: a saved policy (e.g. the demo's SFT artifact under rlhf-runs/artifacts/policy/<digest>);
default: a freshly built demo-architecture policy (random weights, so responses run to max length).
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from rlhf_core import models
from rlhf_core.config import PolicyModelConfig
from rlhf_core.generation.sampler import sample_batch
from rlhf_core.sim.world import make_prompt_pool


def tokens_per_second(model, tokenizer, queries: list[str], batch_size: int, max_new_tokens: int) -> tuple[float, int]:
    start, n_tokens = time.perf_counter(), 0
    for i in range(0, len(queries), batch_size):
        rollout = sample_batch(model, tokenizer, queries[i : i + batch_size], max_new_tokens, temperature=1.0,
                               generator_seed=i)
        n_tokens += int(rollout.response_mask.sum())
    return n_tokens / (time.perf_counter() - start), n_tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", default=None)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--out", default="docs/benchmark-generation.md")
    args = parser.parse_args()

    if args.policy:
        model, tokenizer, source = models.load_policy(args.policy), models.load_tokenizer(args.policy), args.policy
    else:
        tokenizer = models.build_tokenizer()
        model, source = models.build_policy(PolicyModelConfig(), tokenizer), "demo architecture, random weights"
    model.eval()
    prompts = make_prompt_pool(args.prompts, seed=0)["prompt"].tolist()
    queries = [models.format_query(tokenizer, p) for p in prompts]
    rows = []
    for batch_size in (1, 16, 64):
        tps, n = tokens_per_second(model, tokenizer, queries, batch_size, args.max_new_tokens)
        rows.append((batch_size, tps, n))
        print(f"batch {batch_size}: {tps:.0f} tokens/s ({n} tokens)")
    lines = [
        "# Generation throughput: batched vs one prompt at a time",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `benchmarks/generation_throughput.py`: "
        f"{args.prompts} simulated-world prompts, up to {args.max_new_tokens} new tokens, temperature 1, KV cache.",
        f"Model: {source}. Machine: {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), no GPU.",
        "",
        "| batch size | tokens/s | tokens | speed-up vs 1 |",
        "|---|---|---|---|",
        *[f"| {b} | {t:.0f} | {n} | {t / rows[0][1]:.1f}x |" for b, t, n in rows],
        "",
    ]
    Path(args.out).write_text("\n".join(lines))


if __name__ == "__main__":
    main()
