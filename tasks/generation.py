"""Stage 2: responses to annotate, from the policy under every strategy of the generation plan."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core import models
from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import GenerationConfig
from rlhf_core.generation.plan import generate_responses
from rlhf_core.generation.shards import gather_report, gather_shards, n_shards
from rlhf_core.schemas import read_table, write_table
from tasks.common import RunContext, StageRun, run_stage
from tasks.launch import run_worker

VERSION = "1"


@task(name="generate", version=VERSION, cache_policy=NO_CACHE)
def generate(ctx: RunContext, cfg: GenerationConfig, sampled: ArtifactRef, policy: ArtifactRef,
             seed: int) -> ArtifactRef:
    """Sample n responses per prompt per strategy; every row keeps its generator and strategy."""

    generator = f"policy:{policy.digest[:12]}"

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        prompts = read_table("sampled_prompts", sampled.file("sampled_prompts.parquet"))
        if cfg.num_processes == 1:
            model, tokenizer = models.load_policy(policy.path), models.load_tokenizer(policy.path)
            responses, report = generate_responses(model, tokenizer, prompts, cfg.strategies, generator=generator,
                                                   batch_size=cfg.batch_size, seed=seed)
        else:
            responses, report = _generate_with_workers(prompts, run.scratch, generator)
        write_table("responses", responses, out / "responses.parquet")
        return {f"generation/{k}": float(v) for k, v in report.items()}

    def _generate_with_workers(prompts, scratch: Path, generator: str):
        """cfg.num_processes ranks write shards under scratch; a killed run resumes from finished ones."""
        scratch.mkdir(parents=True, exist_ok=True)
        prompts[["prompt_id", "prompt"]].to_parquet(scratch / "prompts.parquet", index=False)
        (scratch / "generation.json").write_text(cfg.model_dump_json())
        shard_dir = scratch / "shards"
        args = ["--policy", policy.path, "--prompts", str(scratch / "prompts.parquet"), "--config",
                str(scratch / "generation.json"), "--generator", generator, "--seed", str(seed),
                "--shard-dir", str(shard_dir), "--shard-size", str(cfg.shard_size)]
        run_worker("rlhf_core.workers.generate", args, cfg.num_processes, scratch / "worker.log")
        count = n_shards(len(prompts), cfg.shard_size)
        report = gather_report(shard_dir, count)
        report["world_size"] = int((shard_dir / "world_size.txt").read_text())
        return gather_shards(shard_dir, count), report

    return run_stage(ctx, stage="generate", version=VERSION, kind="responses",
                     config={"generation": cfg.model_dump(), "seed": seed},
                     inputs={"sampled_prompts": sampled, "policy": policy}, produce=produce)
