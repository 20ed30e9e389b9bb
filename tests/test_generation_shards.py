"""Sharded generation: 1 rank == 2 ranks, resume regenerates only missing shards, a real 2-process run."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from rlhf_core import models
from rlhf_core.config import GenerationConfig, PolicyModelConfig, SamplingStrategy
from rlhf_core.generation.generators import Generator, save_generators
from rlhf_core.generation.shards import (
    gather_report,
    gather_shards,
    generate_plan_shards,
    n_shards,
    shard_path,
)
from rlhf_core.schemas import validate_table

ROOT = Path(__file__).resolve().parents[1]
TINY = PolicyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1)
PLAN = (SamplingStrategy(name="hot", temperature=1.0, n=2, max_new_tokens=5),
        SamplingStrategy(name="greedy", temperature=0.0, n=1, max_new_tokens=5))
# 20 prompts, given out of prompt_id order on purpose: shards are cut after sorting by prompt_id
PROMPTS = pd.DataFrame({"prompt_id": [f"p{i:02d}" for i in range(20)][::-1],
                        "prompt": [f"What is {i}+{i % 7}?" for i in range(20)]})
SHARD_SIZE = 4
N_SHARDS = n_shards(len(PROMPTS), SHARD_SIZE)  # 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny policy saved as a model directory, as one generator of the plan."""
    tok = models.build_tokenizer()
    path = tmp_path_factory.mktemp("model") / "policy"
    models.save_hf(models.build_policy(TINY, tok, seed=0), tok, path)
    return Generator("tiny", "tiny:000000000000", str(path), PLAN)


def _run(tiny, shard_dir, rank=0, world_size=1):
    generate_plan_shards([tiny], PROMPTS, shard_dir, seed=5, batch_size=3, rank=rank, world_size=world_size,
                         shard_size=SHARD_SIZE)


@pytest.fixture(scope="module")
def single(tiny, tmp_path_factory):
    """The reference: one rank over all shards."""
    shard_dir = tmp_path_factory.mktemp("single")
    _run(tiny, shard_dir)
    return gather_shards(shard_dir / "tiny", N_SHARDS)


def test_one_rank_equals_two_ranks(tiny, single, tmp_path):
    validate_table("responses", single)
    assert set(single["prompt_id"]) == set(PROMPTS["prompt_id"])
    _run(tiny, tmp_path, rank=0, world_size=2)
    names = sorted(p.name for p in (tmp_path / "tiny").glob("shard-*.parquet"))
    assert names == [f"shard-{k:05d}.parquet" for k in (0, 2, 4)]
    _run(tiny, tmp_path, rank=1, world_size=2)
    pd.testing.assert_frame_equal(gather_shards(tmp_path / "tiny", N_SHARDS), single)
    report = gather_report(tmp_path / "tiny", N_SHARDS)
    assert report["n_shards"] == N_SHARDS and report["n_prompts"] == len(PROMPTS)
    assert report["tokens"] > 0 and report["seconds"] > 0 and report["n_responses"] == len(single)


def test_resume_regenerates_only_missing_shards(tiny, single, tmp_path):
    _run(tiny, tmp_path)
    shards = tmp_path / "tiny"
    mtimes = {k: shard_path(shards, k).stat().st_mtime_ns for k in range(N_SHARDS)}
    shard_path(shards, 2).unlink()
    # a write killed half-way leaves a temp file with junk: it must be ignored
    (shards / ".shard-00002.parquet.abc123.tmp").write_bytes(b"PAR1 truncated")
    with pytest.raises(FileNotFoundError, match=r"shard-00002\.parquet"):
        gather_shards(shards, N_SHARDS)
    time.sleep(0.01)
    _run(tiny, tmp_path)
    after = {k: shard_path(shards, k).stat().st_mtime_ns for k in range(N_SHARDS)}
    assert {k for k in mtimes if after[k] != mtimes[k]} == {2}
    pd.testing.assert_frame_equal(gather_shards(shards, N_SHARDS), single)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_under_accelerate_equal_one_rank(tiny, single, tmp_path):
    PROMPTS.to_parquet(tmp_path / "prompts.parquet", index=False)
    (tmp_path / "gen.json").write_text(GenerationConfig(batch_size=3, shard_size=SHARD_SIZE).model_dump_json())
    save_generators([tiny], tmp_path / "generators.json")
    shard_dir = tmp_path / "shards"
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
           "-m", "rlhf_core.workers.generate", "--generators", str(tmp_path / "generators.json"),
           "--prompts", str(tmp_path / "prompts.parquet"), "--config", str(tmp_path / "gen.json"),
           "--seed", "5", "--shard-dir", str(shard_dir)]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "PYTHONPATH": str(ROOT), "RLHF_TORCH_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (shard_dir / "world_size.txt").read_text().strip() == "2"  # two ranks, not two lone processes
    assert f"n_shards={N_SHARDS}" in proc.stdout
    pd.testing.assert_frame_equal(gather_shards(shard_dir / "tiny", N_SHARDS), single)


def test_shards_are_cut_in_prompt_id_order_so_a_resume_given_another_row_order_completes(tiny, single, tmp_path):
    """A run killed after shard 0 and resumed with the same prompts in another row order: every prompt once."""
    _run(tiny, tmp_path)  # PROMPTS come in reverse id order
    first = pd.read_parquet(shard_path(tmp_path / "tiny", 0))
    assert sorted(first["prompt_id"].unique()) == ["p00", "p01", "p02", "p03"]
    for k in range(1, N_SHARDS):
        shard_path(tmp_path / "tiny", k).unlink()
    generate_plan_shards([tiny], PROMPTS.iloc[::-1], tmp_path, seed=5, batch_size=3, shard_size=SHARD_SIZE)
    resumed = gather_shards(tmp_path / "tiny", N_SHARDS)
    assert resumed.sort_values("response_id").reset_index(drop=True).equals(
        single.sort_values("response_id").reset_index(drop=True))


def _fake_shard(texts):
    """A stand-in for a model's shard: two responses per prompt, `texts(prompt_id, k)`, and the report
    generate_responses makes (counts before and after deduplication)."""
    def generate(shard, seed):
        rows = pd.DataFrame([{"prompt_id": p, "response_id": f"r-{p}-{k}", "prompt": q, "response": texts(p, k),
                              "generator": "g:0", "strategy": "{}"}
                             for p, q in zip(shard["prompt_id"], shard["prompt"]) for k in range(2)])
        kept = rows.drop_duplicates(["prompt_id", "response"])
        return kept, {"n_generated": len(rows), "duplicates_removed": len(rows) - len(kept),
                      "n_responses": len(kept), "tokens": 10, "seconds": 1.0}
    return generate


def test_the_plans_report_counts_before_and_after_deduplication_and_a_finished_plan_loads_no_model(tmp_path):
    from rlhf_core.generation.shards import _missing_work, gather_plan, generate_sharded

    prompts = PROMPTS.head(10)
    generator = Generator("g", "g:0", str(tmp_path / "model-deleted-since"), PLAN)
    assert _missing_work([generator], prompts, tmp_path, 0, 1, SHARD_SIZE) == {"g": 10 * 3}  # 4 + 4 + 2 prompts
    # every prompt's two samples the same text: 20 made, 10 kept
    generate_sharded(_fake_shard(lambda p, k: "same"), prompts, tmp_path / "g", seed=0, shard_size=SHARD_SIZE)
    _, report = gather_plan(tmp_path, [generator], n_prompts=10, shard_size=SHARD_SIZE)
    assert (report["n_generated"], report["n_responses"], report["duplicates_removed"]) == (20, 10, 10)
    blank = tmp_path / "blank"  # every second sample whitespace only
    generate_sharded(_fake_shard(lambda p, k: "   " if k else "an answer"), prompts, blank / "g", seed=0,
                     shard_size=SHARD_SIZE)
    _, report = gather_plan(blank, [generator], n_prompts=10, shard_size=SHARD_SIZE)
    assert report["empty_share"] == 0.5
    # every shard on disk: resuming has nothing to do and loads no model (its directory is gone)
    generate_plan_shards([generator], prompts, tmp_path, seed=0, batch_size=2, shard_size=SHARD_SIZE)
