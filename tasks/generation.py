"""Stage 2: responses to annotate, from every generator of the plan under each of its strategies."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core.artifacts import ArtifactRef, held_content_digest
from rlhf_core.config import GenerationConfig
from rlhf_core.generation.generators import (
    Generator,
    check_prompts_fit,
    resolve_generators,
    save_generators,
)
from rlhf_core.generation.shards import gather_plan, generate_plan_shards
from rlhf_core.generation.vllm_backend import resolve_backend
from rlhf_core.schemas import read_table, write_table
from tasks.common import RunContext, StageRun, run_stage
from tasks.launch import group_world_size, run_worker

VERSION = "4"  # 2: several generators, shard files for 1 and N processes, per-(generator, shard) seeds; 3: stops
# at the model's own end-of-turn tokens (generation_config.eos_token_id) too; 4: a response_id names its sampling
# parameters and its text, not only the strategy's name


@task(name="generate", version=VERSION, cache_policy=NO_CACHE)
def generate(ctx: RunContext, cfg: GenerationConfig, sampled: ArtifactRef, policy: ArtifactRef,
             seed: int) -> ArtifactRef:
    """Sample n responses per prompt per (generator, strategy); every row keeps its generator and strategy."""
    # Before any work and before the cache key: every model is checked, and its content digest names
    # its rows, so a cache hit never serves responses of other weights. The policy's is the digest of its files,
    # not of the execution that made them (its provenance): the same weights name their responses alike.
    generators = resolve_generators(cfg.generators, policy_path=policy.path,
                                    policy_digest=held_content_digest(policy))
    backend = resolve_backend(cfg.backend, cfg.num_processes)

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        prompts = read_table("sampled_prompts", sampled.file("sampled_prompts.parquet"))
        check_prompts_fit(generators, prompts)
        # Shards live in the scratch dir, which survives a killed run: a re-run resumes from them.
        shard_dir = run.scratch / "shards"
        if cfg.num_processes == 1:
            generate_plan_shards(generators, prompts, shard_dir, seed=seed, batch_size=cfg.batch_size,
                                 backend=backend, shard_size=cfg.shard_size, progress=True)
            world_size = 1
        else:
            world_size = _launch_workers(prompts, generators, run.scratch, shard_dir)
        responses, report = gather_plan(shard_dir, generators, len(prompts), cfg.shard_size)
        write_table("responses", responses, out / "responses.parquet")
        report |= {"world_size": world_size, "backend_vllm": backend == "vllm"}
        return {f"generation/{k}": float(v) for k, v in report.items()}

    def _launch_workers(prompts: pd.DataFrame, generators: list[Generator], scratch: Path, shard_dir: Path) -> int:
        """cfg.num_processes accelerate ranks write the shards; returns the world size they ran with."""
        scratch.mkdir(parents=True, exist_ok=True)
        prompts[["prompt_id", "prompt"]].to_parquet(scratch / "prompts.parquet", index=False)
        (scratch / "generation.json").write_text(cfg.model_dump_json())
        save_generators(generators, scratch / "generators.json")
        args = ["--generators", str(scratch / "generators.json"), "--prompts", str(scratch / "prompts.parquet"),
                "--config", str(scratch / "generation.json"), "--seed", str(seed), "--shard-dir", str(shard_dir),
                "--progress"]
        run_worker("rlhf_core.workers.generate", args, cfg.num_processes, scratch / "worker.log")
        return group_world_size(shard_dir, cfg.num_processes, "generation", scratch / "worker.log")

    config = {"generation": cfg.model_dump(exclude={"num_processes"}), "seed": seed, "backend": backend,
              "generators": {g.name: g.generator_id for g in generators}}
    return run_stage(ctx, stage="generate", version=VERSION, kind="responses", config=config,
                     inputs={"sampled_prompts": sampled, "policy": policy}, produce=produce,
                     execution={"num_processes": cfg.num_processes})  # 1 and N ranks give the same responses
