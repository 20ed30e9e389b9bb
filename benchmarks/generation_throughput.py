"""Tokens/s of the batched generator against a one-prompt-at-a-time loop; writes docs/benchmark-generation.md (and
its .json and .png).

    .venv/bin/python benchmarks/generation_throughput.py [--policy DIR] [--prompts 256] [--out ...]

--policy: a saved policy (e.g. the demo's SFT artifact under rlhf-runs/artifacts/policy/<digest>);
default: a freshly built demo-architecture policy (random weights, so responses run to max length).
Second table: the generation stage's own path (`generate_plan_shards`: shard files, per-batch seeds,
dedupe) at batch 64 against the bare `sample_batch` loop, with and without a repetition penalty.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from rlhf_core import models
from rlhf_core.config import PolicyModelConfig, SamplingStrategy
from rlhf_core.generation.generators import Generator
from rlhf_core.generation.sampler import sample_batch
from rlhf_core.generation.shards import gather_plan, generate_plan_shards
from rlhf_core.sim.world import make_prompt_pool

sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_files import bars, figure_axes, save_figure, write_json  # noqa: E402

NOTES = """\
## How the generation stage runs

- The plan is `generation.generators`: each generator is a model (`policy` = the round's policy, or a
  local Hugging Face directory) with its own strategies. Rows carry `generator = <name>:<digest[:12]>`
  (the policy artifact's digest, or a sha256 of the directory's config, weights and tokenizer files).
- One path for 1 and N processes: prompts are cut into fixed shards (`shard_size`), one Parquet file per
  (generator, shard) under the stage's scratch directory; seeds depend on (run seed, generator, shard,
  strategy, sample, batch), never on the world size, so 1 process and N ranks give the same table, and a
  killed run resumes from the shard files already written.
- Fixed costs per generator: one model load, and for a directory model one hashing pass over its files
  (SmolLM2-135M, 538 MB: 0.8 s here). Per shard: one Parquet write. The table above shows the total.
- Repetition penalty (CTRL, skipping left padding) costs one (batch, vocab) scatter per token.
- vLLM backend (`generation.backend: vllm`, or `auto` on a CUDA machine with vllm installed): not
  measured; this machine has no GPU and no vllm, so that code path has not been executed here.
- Threads: measured with 1 torch thread because other jobs share these 2 cores; with 2 threads under
  that contention batch 1 fell to 29 tokens/s (threads spin waiting for each other).
"""


def tokens_per_second(model, tokenizer, queries: list[str], batch_size: int, max_new_tokens: int,
                      repetition_penalty: float = 1.0) -> tuple[float, int]:
    start, n_tokens = time.perf_counter(), 0
    for i in range(0, len(queries), batch_size):
        rollout = sample_batch(model, tokenizer, queries[i : i + batch_size], max_new_tokens, temperature=1.0,
                               generator_seed=i, repetition_penalty=repetition_penalty)
        n_tokens += int(rollout.response_mask.sum())
    return n_tokens / (time.perf_counter() - start), n_tokens


def plan_tokens_per_second(policy_dir: str, prompts: pd.DataFrame, max_new_tokens: int,
                           repetition_penalty: float) -> tuple[float, int]:
    """The stage's in-process path end to end (shard files written and gathered), wall-clock tokens/s."""
    strategy = SamplingStrategy(name="t1.0", temperature=1.0, n=1, max_new_tokens=max_new_tokens,
                                repetition_penalty=repetition_penalty)
    generator = Generator("policy", "policy:bench", policy_dir, (strategy,))
    with tempfile.TemporaryDirectory() as shard_dir:
        start = time.perf_counter()
        generate_plan_shards([generator], prompts, shard_dir, seed=0, batch_size=64, shard_size=256)
        _, report = gather_plan(shard_dir, [generator], len(prompts), shard_size=256)
        return report["tokens"] / (time.perf_counter() - start), report["tokens"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", default=None)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3, help="second table: median of this many runs")
    parser.add_argument("--out", default="docs/benchmark-generation.md")
    args = parser.parse_args(argv)

    workdir = tempfile.TemporaryDirectory()
    if args.policy:
        model, tokenizer, source = models.load_policy(args.policy), models.load_tokenizer(args.policy), args.policy
        policy_dir = args.policy
    else:
        tokenizer = models.build_tokenizer()
        model, source = models.build_policy(PolicyModelConfig(), tokenizer), "demo architecture, random weights"
        policy_dir = str(Path(workdir.name) / "policy")
        models.save_hf(model, tokenizer, policy_dir)
    model.eval()
    pool = make_prompt_pool(args.prompts, seed=0)[["prompt_id", "prompt"]]
    queries = [models.format_query(tokenizer, p) for p in pool["prompt"]]
    rows = []
    for batch_size in (1, 16, 64):
        tps, n = tokens_per_second(model, tokenizer, queries, batch_size, args.max_new_tokens)
        rows.append((batch_size, tps, n))
        print(f"batch {batch_size}: {tps:.0f} tokens/s ({n} tokens)")
    paths = []
    for penalty in (1.0, 1.2):
        # interleaved repeats, median: a shared machine's load then hits both paths alike
        bare, plan = [], []
        for _ in range(args.repeats):
            bare.append(tokens_per_second(model, tokenizer, queries, 64, args.max_new_tokens, penalty))
            plan.append(plan_tokens_per_second(policy_dir, pool, args.max_new_tokens, penalty))
        bare, plan = sorted(bare)[len(bare) // 2], sorted(plan)[len(plan) // 2]
        paths += [("bare `sample_batch` loop", penalty, *bare), ("stage path (`generate_plan_shards`)", penalty, *plan)]
        print(f"penalty {penalty}: bare {bare[0]:.0f} tokens/s, stage path {plan[0]:.0f} tokens/s")
    workdir.cleanup()
    result = {"date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "prompts": args.prompts,
              "max_new_tokens": args.max_new_tokens, "model": source, "cores": os.cpu_count(),
              "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "repeats": args.repeats,
              "batch_sizes": [{"batch_size": b, "tokens_per_s": t, "tokens": n} for b, t, n in rows],
              "paths": [{"path": name, "repetition_penalty": p, "tokens_per_s": t, "tokens": n}
                        for name, p, t, n in paths]}
    write_json(args.out, result)
    fig, (by_batch, by_path) = figure_axes(2)
    bars(by_batch, {f"batch {b}": t for b, t, _ in rows}, "tokens/s", "Batched generation (KV cache)")
    bars(by_path, {f"{name.split(' (')[0].strip('`')}, penalty {p}": t for name, p, t, _ in paths}, "tokens/s",
         f"Stage path vs bare loop, batch 64, median of {args.repeats}")
    figure = save_figure(fig, args.out)
    lines = [
        "# Generation throughput: batched vs one prompt at a time",
        "",
        (f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `benchmarks/generation_throughput.py`: "
         f"{args.prompts} simulated-world prompts, up to {args.max_new_tokens} new tokens, temperature 1, KV cache."),
        (f"Model: {source}. Machine: {os.cpu_count()} cores, torch {torch.__version__} "
         f"({torch.get_num_threads()} thread(s)), no GPU."),
        "",
        figure,
        "",
        "| batch size | tokens/s | tokens | speed-up vs 1 |",
        "|---|---|---|---|",
        *[f"| {b} | {t:.0f} | {n} | {t / rows[0][1]:.1f}x |" for b, t, n in rows],
        "",
        "The generation stage's own path at batch 64 (model loaded from its directory, shard files written",
        ("atomically and gathered, per-batch seeds, dedupe; load time included) against the bare loop, median of "
         f"{args.repeats} interleaved runs:"),
        "",
        "| path | repetition_penalty | tokens/s | tokens |",
        "|---|---|---|---|",
        *[f"| {name} | {p} | {t:.0f} | {n} |" for name, p, t, n in paths],
        "",
        NOTES,
    ]
    Path(args.out).write_text("\n".join(lines))


if __name__ == "__main__":
    main()
