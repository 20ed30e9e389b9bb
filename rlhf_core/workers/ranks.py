"""What every worker shares: the common arguments, joining the ranks accelerate started (sharing the
cores), and leaving them with the world-size marker the launching task reads."""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

from rlhf_core.artifacts import atomic_write_text, sha256_file
from rlhf_core.config import EXECUTION_SETTINGS
from rlhf_core.workers import die_with_parent

# How long a rank that has finished its share waits for the others at the end. Ranks do unequal work (voter k on rank
# k mod N, generation shard k on rank k mod N, fewer still after a resume), and the process group's own timeout
# (NCCL 10 min, gloo 30 min) would fail a rank that waits longer than that in the final barrier. So the final wait
# is a barrier of its own gloo group with this timeout; the collectives of the work keep the group's timeout
# (RLHF_DIST_TIMEOUT_S sets it, in seconds; unset = torch's default), so a real hang still fails.
FINISH_TIMEOUT = timedelta(days=7)
_finish_group = None  # that gloo group, made by start_ranks when there is more than one rank


def start_ranks() -> Accelerator:
    """The Accelerator of this rank (CPU when no GPU is present), with torch threads set.

    The ranks of one machine share its cores; torch's default would oversubscribe them, so each
    takes cores / world size threads (RLHF_TORCH_THREADS overrides). RLHF_DIST_BACKEND (set by the
    launcher for DeepSpeed without a GPU) names the process group's backend.
    """
    global _finish_group
    die_with_parent()  # its agent SIGKILLed: this rank stops too, rather than write on into a scratch dir
    group = {}
    if os.environ.get("RLHF_DIST_TIMEOUT_S"):
        group["timeout"] = timedelta(seconds=float(os.environ["RLHF_DIST_TIMEOUT_S"]))
    backend = os.environ.get("RLHF_DIST_BACKEND")
    if backend:  # DeepSpeed on CPU: it cannot take cpu=True, and without gloo its batch-size check fails
        accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend=backend, **group)])
    else:
        accelerator = Accelerator(cpu=not torch.cuda.is_available(),
                                  kwargs_handlers=[InitProcessGroupKwargs(**group)] if group else None)
    if accelerator.num_processes > 1:  # every rank makes it, at the same point (new_group is collective)
        _finish_group = torch.distributed.new_group(backend="gloo", timeout=FINISH_TIMEOUT)
    threads = int(os.environ.get("RLHF_TORCH_THREADS", "0")) or max(1, (os.cpu_count() or 1)
                                                                   // accelerator.num_processes)
    torch.set_num_threads(threads)
    return accelerator


def worker_parser(description: str, config_help: str) -> argparse.ArgumentParser:
    """An argument parser with what every worker takes: --config (a JSON file), --seed, --progress."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", required=True, help=config_help)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--progress", action="store_true", help="a progress bar on the main process")
    return p


RUN_FILE = "run.json"  # in a worker's resumable directory: which run's work it holds


def check_resumable_dir(directory: str | Path, args: argparse.Namespace, inputs: tuple[str, ...],
                        main_process: bool, identities: dict[str, str] | None = None) -> None:
    """Refuse to resume in `directory` (checkpoints, voters, shards) the work of another run: its config (but the
    number of ranks), seed or inputs (the `args` named in `inputs`: a store artifact by its digest, a file by its
    bytes, another directory by its path and newest file's time). The main process notes this run's in
    `directory/run.json` on first use. Before, a worker run by hand, or a GPU check, with new inputs in an old
    directory resumed the old run's PPO checkpoint or voters without a word. (A stage's scratch directory is named
    by its cache key, which covers all of this.) `identities`: inputs the worker names itself, by what they compute
    rather than where they lie (a moved workdir resumes)."""
    config = {k: v for k, v in json.loads(Path(args.config).read_text()).items() if k not in EXECUTION_SETTINGS}
    run = {"config": config, "seed": args.seed,
           "inputs": {name: _identity(getattr(args, name)) for name in inputs if getattr(args, name) is not None}
           | (identities or {})}
    path = Path(directory) / RUN_FILE
    if path.is_file():
        noted = json.loads(path.read_text())
        if noted != run:
            changed = sorted(k for k in ("config", "seed") if noted.get(k) != run[k]) + sorted(
                name for name in set(noted.get("inputs", {})) | set(run["inputs"])
                if noted.get("inputs", {}).get(name) != run["inputs"].get(name))
            raise ValueError(f"{directory} holds the work of another run (another {', '.join(changed)}): give "
                             "this run a directory of its own, or delete that one to start over")
    elif main_process:
        Path(directory).mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(run, indent=2, sort_keys=True))


def _identity(path: str) -> str:
    p = Path(path).resolve()
    if (p / "manifest.json").is_file():  # an artifact of the store: its digest names its content
        return "digest:" + json.loads((p / "manifest.json").read_text())["digest"]
    if p.is_file():
        return "sha256:" + sha256_file(p)
    newest = max((f.stat().st_mtime_ns for f in p.rglob("*") if f.is_file()), default=0)
    return f"{p}@{newest}"


def finish_ranks(accelerator: Accelerator, out_dir: str | Path) -> None:
    """Wait for every rank (as long as FINISH_TIMEOUT: the others may still have work); the main process then
    writes out_dir/world_size.txt (so the task can tell a real group from lone processes); then leave the process
    group cleanly."""
    if _finish_group is not None:
        torch.distributed.barrier(group=_finish_group)
    else:
        accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        atomic_write_text(Path(out_dir) / "world_size.txt", f"{accelerator.num_processes}\n")
    accelerator.end_training()
