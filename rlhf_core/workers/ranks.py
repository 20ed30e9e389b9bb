"""What every worker shares: the common arguments, joining the ranks accelerate started (sharing the
cores), and leaving them with the world-size marker the launching task reads."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

from rlhf_core.artifacts import atomic_write_text


def start_ranks() -> Accelerator:
    """The Accelerator of this rank (CPU when no GPU is present), with torch threads set.

    The ranks of one machine share its cores; torch's default would oversubscribe them, so each
    takes cores / world size threads (RLHF_TORCH_THREADS overrides). RLHF_DIST_BACKEND (set by the
    launcher for DeepSpeed without a GPU) names the process group's backend.
    """
    backend = os.environ.get("RLHF_DIST_BACKEND")
    if backend:  # DeepSpeed on CPU: it cannot take cpu=True, and without gloo its batch-size check fails
        accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend=backend)])
    else:
        accelerator = Accelerator(cpu=not torch.cuda.is_available())
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


def finish_ranks(accelerator: Accelerator, out_dir: str | Path) -> None:
    """Wait for every rank; the main process then writes out_dir/world_size.txt (so the task can tell
    a real group from lone processes); then leave the process group cleanly."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        atomic_write_text(Path(out_dir) / "world_size.txt", f"{accelerator.num_processes}\n")
    accelerator.end_training()
