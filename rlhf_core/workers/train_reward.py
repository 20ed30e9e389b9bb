"""Reward-model training worker: data parallel over ranks (each rank trains on its shard of every batch).

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \\
        --mixed_precision no --dynamo_backend no --main_process_port P \\
        -m rlhf_core.workers.train_reward --init-dir POLICY --pairs PARQUET --config TRAIN.json --seed N --out DIR

Every rank runs `train_reward_model` with its rank and the world size: the same global batches as one
process, gradients summed over ranks, so every rank ends with the same weights. Launched with a DeepSpeed
config (`accelerate launch --use_deepspeed --deepspeed_config_file infra/deepspeed/zero2.json ...`), the
step goes through DeepSpeed's engine (ZeRO-2: optimizer state and gradients partitioned over the ranks;
ZeRO-3 with zero3.json: the weights too, gathered into a whole model on every rank after training).
Only the main process writes DIR (the model, metrics.json) and then DIR/world_size.txt once all ranks
are done. A plain `python -m rlhf_core.workers.train_reward ...` runs as one rank.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
from accelerate.utils import DistributedType
from transformers.integrations import unset_hf_deepspeed_config

from rlhf_core.artifacts import atomic_write_text
from rlhf_core.config import RewardTrainConfig
from rlhf_core.reward.train import train_reward_model
from rlhf_core.workers.ranks import finish_ranks, start_ranks, worker_parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = worker_parser(__doc__.splitlines()[0], "RewardTrainConfig as a JSON file")
    p.add_argument("--init-dir", required=True, help="the policy directory the reward model starts from")
    p.add_argument("--pairs", required=True, help="Parquet table of pairs (prompt, chosen, rejected, ...)")
    p.add_argument("--out", required=True, help="directory the main process saves the model and metrics.json in")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    accelerator = start_ranks()
    cfg = RewardTrainConfig.model_validate_json(Path(args.config).read_text())
    pairs = pd.read_parquet(args.pairs)
    deepspeed = accelerator if accelerator.distributed_type == DistributedType.DEEPSPEED else None
    if deepspeed is not None:
        # With a ZeRO-3 config accelerate registers it with transformers, whose from_pretrained would then
        # partition the model as it loads; the model loads whole and the engine partitions it (as the PPO worker).
        unset_hf_deepspeed_config()
    model, tokenizer, metrics = train_reward_model(
        args.init_dir, pairs, cfg, args.seed, progress=args.progress and accelerator.is_main_process,
        rank=accelerator.process_index, world_size=accelerator.num_processes, deepspeed=deepspeed,
        device=accelerator.device)
    print(f"rank {accelerator.process_index}/{accelerator.num_processes} trained {metrics['steps']} steps, "
          f"loss {metrics['loss']:.4f}", flush=True)
    if accelerator.is_main_process:
        model.save(args.out, tokenizer)
        atomic_write_text(Path(args.out) / "metrics.json", json.dumps(metrics))
    finish_ranks(accelerator, args.out)


if __name__ == "__main__":
    main()
