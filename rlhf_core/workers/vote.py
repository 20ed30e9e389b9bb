"""Voting worker: the faithful voters spread over ranks (voter k on rank k mod world size).

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \\
        --mixed_precision no --dynamo_backend no --main_process_port P \\
        -m rlhf_core.workers.vote --init-dir POLICY --pairs PARQUET --config VOTING.json --seed N --voter-dir DIR

Each voter is a whole reward model trained by one rank (no gradient is shared), so N ranks train
N voters at a time. Every finished voter is a file in DIR (see `rlhf_core.reward.voting.run_voters`),
so a re-run resumes and the collected votes are the same for any number of ranks. A plain
`python -m rlhf_core.workers.vote ...` runs as one rank. The main process writes DIR/world_size.txt
once all ranks are done.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from rlhf_core.config import VotingConfig
from rlhf_core.reward.voting import run_voters
from rlhf_core.workers.ranks import check_resumable_dir, finish_ranks, start_ranks, worker_parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = worker_parser(__doc__.splitlines()[0], "VotingConfig as a JSON file")
    p.add_argument("--init-dir", required=True, help="the policy directory the voters start from")
    p.add_argument("--pairs", required=True, help="Parquet comparisons table (pair_id, prompt, chosen, rejected, ...)")
    p.add_argument("--voter-dir", required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    accelerator = start_ranks()
    rank, world_size = accelerator.process_index, accelerator.num_processes

    check_resumable_dir(args.voter_dir, args, ("init_dir", "pairs"), accelerator.is_main_process)
    cfg = VotingConfig.model_validate_json(Path(args.config).read_text())
    pairs = pd.read_parquet(args.pairs)
    trained = run_voters(args.init_dir, pairs, cfg, args.seed, args.voter_dir, rank=rank, world_size=world_size,
                         progress=args.progress and accelerator.is_main_process, device=accelerator.device)
    print(f"rank {rank}/{world_size} trained voters {trained}", flush=True)
    finish_ranks(accelerator, args.voter_dir)


if __name__ == "__main__":
    main()
