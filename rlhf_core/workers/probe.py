"""A worker that only says where it runs, sleeps, and may fail: for testing the launcher (tasks/launch.py)
and for checking a node's launch setup without loading a model.

    accelerate launch ... -m rlhf_core.workers.probe --sleep 30 --fail-rank 1 --exit-code 3

Each rank prints `rank R pid P ppid Q` at once (Q: the launcher's agent), then sleeps; the rank given by
--fail-rank exits with --exit-code after its sleep. --ignore-sigterm makes the ranks outlive a SIGTERM
(a rank stuck in a collective does), so only a SIGKILL stops them. It does not join the process group
(no torch import): it starts in a moment.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sleep", type=float, default=0.0, help="seconds every rank sleeps")
    p.add_argument("--fail-rank", type=int, default=None, help="this rank exits with --exit-code after its sleep")
    p.add_argument("--exit-code", type=int, default=3)
    p.add_argument("--ignore-sigterm", action="store_true")
    args = p.parse_args(argv)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank = int(os.environ.get("RANK", "0"))
    print(f"rank {rank} pid {os.getpid()} ppid {os.getppid()}", flush=True)
    time.sleep(args.sleep)
    if rank == args.fail_rank:
        print(f"rank {rank} fails with exit code {args.exit_code}", flush=True)
        sys.exit(args.exit_code)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
