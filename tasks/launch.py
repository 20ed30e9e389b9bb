"""Launching rlhf_core workers as multi-process groups (accelerate), from a task.

On a GPU node: `accelerate launch --multi_gpu --num_processes N -m <worker>`. Without a GPU the same
command with ACCELERATE_USE_CPU=1 gives N gloo ranks (`accelerate launch --cpu --num_processes N`
silently starts ONE process; see ../shared/STACK-NOTES.md). The worker's output goes to a log file
whose tail is put into the error when the group fails.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch


class WorkerError(RuntimeError):
    """A worker group exited non-zero; the message carries the log's tail and where the log is."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_command(module: str, args: list[str], num_processes: int) -> tuple[list[str], dict[str, str]]:
    """(argv, env) that run `python -m module args` as `num_processes` ranks on this node."""
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["ACCELERATE_USE_CPU"] = "1"
        env.setdefault("RLHF_TORCH_THREADS", str(max(1, (os.cpu_count() or 1) // num_processes)))
    accelerate = str(Path(sys.executable).parent / "accelerate")
    argv = [accelerate, "launch", "--multi_gpu", "--num_processes", str(num_processes), "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
            "-m", module, *args]
    return argv, env


def run_worker(module: str, args: list[str], num_processes: int, log_path: Path) -> None:
    """Run the worker group to completion; raise WorkerError with the log's tail if it fails."""
    argv, env = accelerate_command(module, args, num_processes)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        code = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise WorkerError(f"{module} with {num_processes} processes exited {code}; log {log_path}:\n{tail}")
