"""PPO worker: data parallel over ranks (each rank samples, scores and steps on its share of every rollout).

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \\
        --mixed_precision no --dynamo_backend no --main_process_port P \\
        -m rlhf_core.workers.ppo --policy-dir POLICY [--reference-dir SFT] --reward-model RM --reward-max-length 96 \\
        --prompts PARQUET [--ptx DEMOS.parquet] --config PPO.json --seed N --checkpoint-dir DIR --out DIR

Every rank runs `train_ppo` with its rank and the world size (see rlhf_core.ppo.trainer): the same
rollouts, advantages and steps as one process, up to float summation order. The critic starts from the
reward model; every response also gets the simulated world's gold score (logged, never trained on).
Rank 0 writes the checkpoints in --checkpoint-dir (a killed group resumes from them, with any number of
ranks), then the policy and history.json (one metrics dict per iteration) in --out, and --out/world_size.txt
once all ranks are done. A plain `python -m rlhf_core.workers.ppo ...` runs as one rank. Launched with a
DeepSpeed config (`accelerate launch --use_deepspeed --deepspeed_config_file infra/deepspeed/zero2.json ...`),
the policy and the critic train through DeepSpeed engines (ZeRO-2), and every rank writes its partition
of each checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from accelerate.utils import DistributedType
from transformers.integrations import unset_hf_deepspeed_config

from rlhf_core import models
from rlhf_core.artifacts import atomic_write_text
from rlhf_core.config import PPOConfig
from rlhf_core.ppo.scoring import gold_scores, reward_scorer
from rlhf_core.ppo.trainer import Checkpoint, train_ppo
from rlhf_core.workers.ranks import check_resumable_dir, finish_ranks, start_ranks, worker_parser


def parse_args(argv: list[str] | None = None):
    p = worker_parser(__doc__.splitlines()[0], "PPOConfig as a JSON file (model_dump_json)")
    p.add_argument("--policy-dir", required=True, help="the policy PPO starts from")
    p.add_argument("--reference-dir", default=None,
                   help="the KL penalty's frozen reference (the SFT policy); default: --policy-dir")
    p.add_argument("--reward-model", required=True,
                   help="the reward model directory: the scores and the critic's start")
    p.add_argument("--reward-max-length", type=int, required=True, help="tokens the reward model reads")
    p.add_argument("--prompts", required=True, help="Parquet with a prompt column: the rollout prompt pool")
    p.add_argument("--ptx", default=None, help="Parquet of prompt, response demonstrations for the ptx loss")
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--out", required=True, help="directory the main process saves the policy and history.json in")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    accelerator = start_ranks()
    rank, world_size = accelerator.process_index, accelerator.num_processes
    deepspeed = None
    if accelerator.distributed_type == DistributedType.DEEPSPEED:  # train_ppo builds the engines from its config
        deepspeed = accelerator.state.deepspeed_plugin.deepspeed_config
        # With a ZeRO-3 config accelerate registers it with transformers, whose from_pretrained then partitions
        # every model as it loads (accelerate's zero3_init_context_manager(False) registers it again). The
        # reference and the reward model must stay whole; the engines partition the policy and the critic.
        unset_hf_deepspeed_config()
    check_resumable_dir(args.checkpoint_dir, args, ("policy_dir", "reference_dir", "reward_model", "prompts", "ptx"),
                        accelerator.is_main_process)
    cfg = PPOConfig.model_validate_json(Path(args.config).read_text())
    prompts = pd.read_parquet(args.prompts, columns=["prompt"])["prompt"].tolist()
    ptx = None
    if args.ptx is not None:
        demos = pd.read_parquet(args.ptx, columns=["prompt", "response"])
        ptx = list(zip(demos["prompt"], demos["response"]))

    def report(metrics: dict[str, float]) -> None:
        if accelerator.is_main_process:
            print(f"iteration {int(metrics['iteration'])}: score {metrics['objective/score']:.4f} "
                  f"kl {metrics['objective/kl']:.4f}", flush=True)

    def resumed(done: int) -> None:
        if accelerator.is_main_process:
            print(f"resumed from {Checkpoint(args.checkpoint_dir, cfg, args.seed).path} after iteration {done - 1}",
                  flush=True)
    score = reward_scorer(args.reward_model, args.reward_max_length, accelerator.device)  # scored on the GPU too
    policy, tokenizer, history = train_ppo(
        args.policy_dir, score, prompts, cfg, args.seed,
        critic_init_dir=args.reward_model, on_iteration=report, progress=args.progress and accelerator.is_main_process,
        ptx_examples=ptx, gold_fn=gold_scores, checkpoint_dir=args.checkpoint_dir, rank=rank, world_size=world_size,
        device=accelerator.device, deepspeed=deepspeed, on_resume=resumed, reference_dir=args.reference_dir)
    if accelerator.is_main_process:
        models.save_hf(policy, tokenizer, args.out)
        atomic_write_text(Path(args.out) / "history.json", json.dumps(history))
    finish_ranks(accelerator, args.out)


if __name__ == "__main__":
    main()
