"""Data-parallel, resumable generation worker: every rank generates its shards of every generator.

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
        --mixed_precision no --dynamo_backend no --main_process_port P \
        -m rlhf_core.workers.generate --generators GENERATORS.json --prompts PARQUET --config GEN.json \
        --seed N --shard-dir DIR

(`accelerate launch --cpu --num_processes 2` silently starts one process; see STACK-NOTES.) A plain
`python -m rlhf_core.workers.generate ...` runs as a single rank. Re-running skips finished shards.
GENERATORS.json is the resolved plan (`generators.save_generators`: name, generator id, model
directory, strategies). The main process writes shard_dir/world_size.txt and prints
`n_shards=<N>` once all ranks are done.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from rlhf_core.config import GenerationConfig
from rlhf_core.generation.generators import generators_identity, read_generators
from rlhf_core.generation.shards import generate_plan_shards, n_shards
from rlhf_core.workers.ranks import check_resumable_dir, finish_ranks, start_ranks, worker_parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = worker_parser(__doc__.splitlines()[0], "GenerationConfig as a JSON file (batch_size, shard_size)")
    p.add_argument("--generators", required=True, help="the resolved generators as JSON (save_generators)")
    p.add_argument("--prompts", required=True, help="Parquet with prompt_id and prompt columns")
    p.add_argument("--shard-dir", required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    accelerator = start_ranks()
    rank, world_size = accelerator.process_index, accelerator.num_processes

    check_resumable_dir(args.shard_dir, args, ("prompts",), accelerator.is_main_process,
                        identities={"generators": generators_identity(Path(args.generators))})
    cfg = GenerationConfig.model_validate_json(Path(args.config).read_text())
    prompts = pd.read_parquet(args.prompts, columns=["prompt_id", "prompt"])
    shard_dir = Path(args.shard_dir)
    # Data-parallel ranks use the transformers backend (vLLM runs in one process; see vllm_backend).
    generate_plan_shards(read_generators(Path(args.generators)), prompts, shard_dir, seed=args.seed,
                         batch_size=cfg.batch_size, backend="hf", rank=rank, world_size=world_size,
                         shard_size=cfg.shard_size, device=accelerator.device,
                         progress=args.progress and accelerator.is_main_process)
    if accelerator.is_main_process:
        print(f"n_shards={n_shards(len(prompts), cfg.shard_size)} world_size={world_size}", flush=True)
    finish_ranks(accelerator, shard_dir)


if __name__ == "__main__":
    main()
