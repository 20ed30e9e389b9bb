"""A worker that only says where it runs, sleeps, and may fail: for testing the launcher (tasks/launch.py)
and for checking a node's launch setup without loading a model.

    accelerate launch ... -m rlhf_core.workers.probe --sleep 30 --fail-rank 1 --exit-code 3

Each rank prints `rank R pid P ppid Q` at once (Q: the launcher's agent), then sleeps; the rank given by
--fail-rank exits with --exit-code after its sleep. --ignore-sigterm makes the ranks outlive a SIGTERM
(a rank stuck in a collective does), so only a SIGKILL stops them. It does not join the process group
(no torch import): it starts in a moment. With --join-ranks it does (`start_ranks` / `finish_ranks`, writing
world_size.txt into --out), and only rank 0 sleeps: a group whose ranks do unequal work.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from rlhf_core.workers import die_with_parent


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sleep", type=float, default=0.0, help="seconds every rank sleeps")
    p.add_argument("--fail-rank", type=int, default=None, help="this rank exits with --exit-code after its sleep")
    p.add_argument("--exit-code", type=int, default=3)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--join-ranks", action="store_true", help="join the process group; only rank 0 sleeps")
    p.add_argument("--out", default=".", help="--join-ranks: where world_size.txt goes")
    p.add_argument("--plain-wait", action="store_true",
                   help="--join-ranks: end with the process group's own barrier instead of finish_ranks")
    args = p.parse_args(argv)
    if args.join_ranks and args.fail_rank is not None:  # a check expecting a failing rank would see success
        p.error("--fail-rank does not combine with --join-ranks (its ranks never fail)")
    die_with_parent()  # as every rank does (rlhf_core.workers.ranks.start_ranks)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank = int(os.environ.get("RANK", "0"))
    print(f"rank {rank} pid {os.getpid()} ppid {os.getppid()}", flush=True)
    if args.join_ranks:
        from rlhf_core.workers.ranks import finish_ranks, start_ranks

        accelerator = start_ranks()
        time.sleep(args.sleep if rank == 0 else 0.0)
        if args.plain_wait:
            accelerator.wait_for_everyone()
        finish_ranks(accelerator, args.out)
        print(f"rank {rank} done", flush=True)
        return
    time.sleep(args.sleep)
    if rank == args.fail_rank:
        print(f"rank {rank} fails with exit code {args.exit_code}", flush=True)
        sys.exit(args.exit_code)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
