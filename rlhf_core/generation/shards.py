"""Resumable, data-parallel generation: fixed prompt shards, one Parquet file per (generator, shard).

Prompts are sorted by prompt_id and cut into fixed shards of `shard_size` rows (shard k holds rows
k*shard_size .. (k+1)*shard_size - 1). Rank r of W processes shard k when k % W == r. Generator g's
shard k samples with a seed made of (run seed, g.name, k) (and, inside, one per strategy, sample and
batch), so a shard's rows depend on neither the world size nor on which shards ran before, and a
shard file, once present, is final:

    shard_dir/<generator>/shard-00000.parquet          responses; the report (tokens, seconds) in its metadata
    shard_dir/<generator>/.shard-00001.parquet.*.tmp   a write in progress (or killed): ignored, never read

The in-process stage is rank 0 of 1 and the accelerate worker is rank r of W: the same code, the
same files, the same table. Resume = run again: shards whose file exists are skipped.
"""

from __future__ import annotations

import gc
import json
import math
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from rlhf_core.artifacts import atomic_write
from rlhf_core.generation.generators import Generator, load_model, load_tokenizer
from rlhf_core.generation.plan import dedupe, generate_responses, stable_seed
from rlhf_core.progress import progress_bar

REPORT_KEY = b"rlhf.shard_report"  # Parquet schema-metadata key holding the shard's report (JSON)
REPORT_SUMS = ("tokens", "seconds", "n_generated", "duplicates_removed", "n_responses", "n_prompts")

# (prompts of one shard, seed=the shard's seed) -> (responses, report): one generator, its model loaded
GenerateShard = Callable[[pd.DataFrame, int], tuple[pd.DataFrame, dict]]


def n_shards(n_prompts: int, shard_size: int) -> int:
    """Number of fixed shards for n prompts: ceil(n_prompts / shard_size)."""
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    return math.ceil(n_prompts / shard_size)


def shard_path(shard_dir: str | Path, k: int) -> Path:
    return Path(shard_dir) / f"shard-{k:05d}.parquet"


def rank_shards(count: int, rank: int, world_size: int) -> range:
    """The shards rank `rank` of `world_size` generates: k % world_size == rank."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    return range(rank, count, world_size)


def _write_shard(path: Path, responses: pd.DataFrame, report: dict) -> None:
    """Write a shard atomically (a reader or a resumed run never sees half a shard)."""
    table = pa.Table.from_pandas(responses.reset_index(drop=True), preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[REPORT_KEY] = json.dumps(report, sort_keys=True).encode()
    table = table.replace_schema_metadata(meta)
    atomic_write(path, lambda f: pq.write_table(table, f))


def generate_sharded(generate_shard: GenerateShard, prompts: pd.DataFrame, shard_dir: str | Path, seed: int,
                     rank: int = 0, world_size: int = 1, shard_size: int = 256) -> None:
    """Generate this rank's shards that have no file yet, one file per shard, shard k with stable_seed(seed, k)."""
    shard_dir = Path(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    ordered = prompts.sort_values("prompt_id", kind="stable").reset_index(drop=True)
    for k in rank_shards(n_shards(len(ordered), shard_size), rank, world_size):
        path = shard_path(shard_dir, k)
        if path.exists():
            continue  # finished by an earlier (possibly killed) run
        start = time.time()
        shard = ordered.iloc[k * shard_size : (k + 1) * shard_size]
        responses, report = generate_shard(shard, seed=stable_seed(seed, k))
        report = {**report, "shard": k, "n_prompts": len(shard), "seconds": time.time() - start}
        _write_shard(path, responses, report)


def _missing_work(generators: list[Generator], prompts: pd.DataFrame, shard_dir: Path, rank: int,
                  world_size: int, shard_size: int) -> dict[str, int]:
    """Responses still to generate by this rank, per generator (for the progress bar)."""
    count, work = n_shards(len(prompts), shard_size), {}
    for g in generators:
        missing = [k for k in rank_shards(count, rank, world_size) if not shard_path(shard_dir / g.name, k).exists()]
        n_prompts = sum(min(shard_size, len(prompts) - k * shard_size) for k in missing)
        work[g.name] = n_prompts * sum(s.n for s in g.strategies)
    return work


def generate_plan_shards(generators: list[Generator], prompts: pd.DataFrame, shard_dir: str | Path, *, seed: int,
                         batch_size: int, backend: str = "hf", rank: int = 0, world_size: int = 1,
                         shard_size: int = 256, device=None, progress: bool = False) -> None:
    """Every generator's missing shards of this rank, one model loaded at a time, into shard_dir/<generator>/."""
    shard_dir = Path(shard_dir)
    work = _missing_work(generators, prompts, shard_dir, rank, world_size, shard_size)
    bar = progress_bar(total=sum(work.values()), desc="generate", unit="response", disable=not progress)
    for g in generators:
        if work[g.name] == 0:
            continue  # every shard of this generator is on disk: do not even load the model
        run = partial(generate_sharded, prompts=prompts, shard_dir=shard_dir / g.name, seed=stable_seed(seed, g.name),
                      rank=rank, world_size=world_size, shard_size=shard_size)
        if backend == "vllm":
            from rlhf_core.generation import vllm_backend

            llm = vllm_backend.load_vllm(g.path, seed=seed)
            run(partial(vllm_backend.generate_with_vllm, g.path, strategies=g.strategies, generator=g.generator_id,
                        llm=llm, bar=bar))
            vllm_backend.release_vllm(llm)
        else:
            model, tokenizer = load_model(g.path, device), load_tokenizer(g.path)
            run(partial(generate_responses, model, tokenizer, strategies=g.strategies, generator=g.generator_id,
                        batch_size=batch_size, bar=bar))
            del model, tokenizer  # free this model before the next generator's loads
            if torch.cuda.is_available():  # (on CPU the del frees it; a full gc.collect costs ~0.2 s)
                gc.collect()
                torch.cuda.empty_cache()
    bar.close()


def _missing(shard_dir: Path, n: int) -> list[int]:
    return [k for k in range(n) if not shard_path(shard_dir, k).exists()]


def gather_shards(shard_dir: str | Path, n_shards: int) -> pd.DataFrame:
    """One generator's responses, sorted by (prompt_id, response_id); raise naming any missing shard."""
    shard_dir = Path(shard_dir)
    missing = _missing(shard_dir, n_shards)
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} of {n_shards} shard(s) missing in {shard_dir}: "
            f"{[shard_path(shard_dir, k).name for k in missing]}; re-run generation to finish them"
        )
    if n_shards == 0:
        return pd.DataFrame()
    parts = [pd.read_parquet(shard_path(shard_dir, k)) for k in range(n_shards)]
    return pd.concat(parts, ignore_index=True).sort_values(["prompt_id", "response_id"]).reset_index(drop=True)


def gather_report(shard_dir: str | Path, n_shards: int) -> dict:
    """Sum one generator's shard reports: tokens, seconds (summed over shards, not wall time), row counts."""
    shard_dir = Path(shard_dir)
    missing = _missing(shard_dir, n_shards)
    if missing:
        raise FileNotFoundError(f"shard(s) {missing} missing in {shard_dir}; re-run generation to finish them")
    reports = [json.loads(pq.read_schema(shard_path(shard_dir, k)).metadata[REPORT_KEY]) for k in range(n_shards)]
    total = {key: sum(r[key] for r in reports) for key in REPORT_SUMS}
    total["tokens_per_second"] = total["tokens"] / max(total["seconds"], 1e-9)
    total["n_shards"] = n_shards
    return total


def gather_plan(shard_dir: str | Path, generators: list[Generator], n_prompts: int,
                shard_size: int) -> tuple[pd.DataFrame, dict]:
    """The responses table of the whole plan and its report (totals, and `<generator>/...` per generator).

    Identical responses to one prompt from two generators are kept once (the smallest response_id).
    """
    shard_dir, count = Path(shard_dir), n_shards(n_prompts, shard_size)
    tables, report = [], {"tokens": 0, "seconds": 0.0, "n_generated": 0, "n_shards": count, "n_prompts": n_prompts}
    for g in generators:
        tables.append(gather_shards(shard_dir / g.name, count))
        part = gather_report(shard_dir / g.name, count)
        report |= {f"{g.name}/{key}": part[key] for key in ("tokens", "seconds", "tokens_per_second")}
        report["tokens"] += part["tokens"]
        report["seconds"] += part["seconds"]
        report["n_generated"] += part["n_generated"]
    responses = dedupe(pd.concat(tables, ignore_index=True)) if count else pd.DataFrame()
    for g in generators:
        report[f"{g.name}/n_responses"] = int((responses["generator"] == g.generator_id).sum()) if count else 0
    report["n_responses"] = len(responses)
    report["duplicates_removed"] = report["n_generated"] - len(responses)
    report["tokens_per_second"] = report["tokens"] / max(report["seconds"], 1e-9)
    report["mean_distinct_per_prompt"] = (
        float(responses.groupby("prompt_id")["response"].nunique().mean()) if len(responses) else 0.0)
    report["empty_share"] = float((responses["response"].str.strip() == "").mean()) if len(responses) else 0.0
    return responses, report
