"""Launching rlhf_core workers as multi-process groups (accelerate), from a task.

On a GPU node: `accelerate launch --multi_gpu --num_processes N -m <worker>`. Without a GPU the same
command with ACCELERATE_USE_CPU=1 gives N gloo ranks (`accelerate launch --cpu --num_processes N`
silently starts ONE process; see ../shared/STACK-NOTES.md). With DeepSpeed, `--use_deepspeed
--deepspeed_config_file infra/deepspeed/<zero2|zero3>.json` replaces --multi_gpu (see `deepspeed_config`).

The group runs in its own session (process group), so the launcher can always stop all of it: on any
exception in the task (a Prefect cancellation or shutdown arrives as Prefect's TerminationSignal, a task
timeout as TimeoutError, Ctrl-C as KeyboardInterrupt; outside Prefect a SIGTERM is turned into
`LauncherTerminated`) the group gets SIGTERM, then SIGKILL after a grace period: no orphan holds a GPU.
The workers' lines go to a log file and, as they come, to the task's logger (the Prefect run log).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import torch

from rlhf_core.workers import die_with_parent
from tasks.common import stage_logger

GROUP_ENV = "RLHF_WORKER_GROUP"  # tags every process of one launch (see group_processes)
GRACE_SECONDS = 10.0  # SIGTERM to SIGKILL: time for the ranks to leave their process group
POLL_SECONDS = 0.2  # the launcher sleeps in slices this long, so an exception raised into its thread lands promptly
TAIL_LINES = 20
INFRA = Path(__file__).resolve().parent.parent / "infra"
DEEPSPEED_PRESETS = ("zero2", "zero3")


class WorkerError(RuntimeError):
    """A worker group exited non-zero; the message names the failing rank when the log does, the exit
    code, the log's tail and where the whole log is."""


class LauncherTerminated(BaseException):
    """SIGTERM reached a launcher that runs outside Prefect (Prefect raises its own TerminationSignal)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deepspeed_config(choice: str | None) -> Path | None:
    """The DeepSpeed JSON of a stage's `deepspeed` setting: None (off), zero2 / zero3 (infra/deepspeed/), a path."""
    if choice is None:
        return None
    path = INFRA / "deepspeed" / f"{choice}.json" if choice in DEEPSPEED_PRESETS else Path(choice).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"deepspeed config {path} does not exist: give one of {DEEPSPEED_PRESETS} or the "
                                "path of a DeepSpeed JSON config")
    return path


def accelerate_command(module: str, args: list[str], num_processes: int, deepspeed: str | None = None,
                       rank_logs: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, env) that run `python -m module args` as `num_processes` ranks on this node.

    Every line a rank prints is prefixed `[defaultR]:` (torch elastic's --tee); with `rank_logs` each
    rank's output is also kept in rank_logs/<run>/attempt_0/R/."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"  # lines reach the task's log as they are printed
    accelerate = str(Path(sys.executable).parent / "accelerate")
    common = ["--main_process_port", str(free_port()), "--tee", "3"]
    if rank_logs is not None:
        common += ["--log_dir", str(rank_logs)]
    ds_config = deepspeed_config(deepspeed)
    if not torch.cuda.is_available():
        env.setdefault("RLHF_TORCH_THREADS", str(max(1, (os.cpu_count() or 1) // num_processes)))
        if ds_config is None:
            env["ACCELERATE_USE_CPU"] = "1"
        else:  # DeepSpeed refuses --cpu / ACCELERATE_USE_CPU: the worker asks for gloo (see ranks.start_ranks)
            env["RLHF_DIST_BACKEND"] = "gloo"
    # zero3_init_flag false as infra/accelerate/zero3.yaml says (accelerate's default under ZeRO-3 is true): the
    # workers load whole models and let the engines partition them
    mode = ["--multi_gpu"] if ds_config is None else ["--use_deepspeed", "--deepspeed_config_file", str(ds_config),
                                                       "--zero3_init_flag", "false"]
    argv = [accelerate, "launch", *mode, "--num_processes", str(num_processes), "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", *common, "-m", module, *args]
    return argv, env


def group_processes(tag: str) -> list[int]:
    """The live processes whose environment carries RLHF_WORKER_GROUP=tag: the launcher and every rank.

    Found by environment because torch elastic starts each rank in a session of its own, so neither the
    launcher's process group nor its session holds the ranks, and a rank whose launcher died is re-parented.
    """
    marker = b"\0" + f"{GROUP_ENV}={tag}".encode() + b"\0"  # a whole entry of the NUL-separated environment
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if marker in b"\0" + f.read() + b"\0":
                    found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def stop_group(proc: subprocess.Popen, tag: str, grace_seconds: float) -> None:
    """SIGTERM to every process of the group, SIGKILL to what is left after `grace_seconds`; returns once the
    group is gone (or another `grace_seconds` have passed)."""
    _signal_all(group_processes(tag), signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and group_processes(tag):
        proc.poll()  # reap the launcher: a zombie has no environment and drops out of the list
        time.sleep(0.05)
    _signal_all(group_processes(tag), signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + grace_seconds  # a SIGKILL is delivered, not done: return once they are gone
    while time.monotonic() < deadline and group_processes(tag):
        time.sleep(0.05)


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def failed_rank(log_text: str) -> tuple[int, int] | None:
    """(rank, exit code) of the root cause in torch elastic's failure summary in a launcher log, if any.

    The summary lists the other ranks (stopped by SIGTERM after the first failure) before the root cause."""
    root = log_text.rfind("Root Cause")
    match = re.search(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*exitcode\s*:\s*(-?\d+)", log_text[root:])
    return (int(match[1]), int(match[2])) if root >= 0 and match else None


def group_world_size(directory: Path, asked: int, what: str, log_path: Path) -> int:
    """The world size the ranks wrote into `directory`/world_size.txt; raises when it is not the `asked` number
    (N lone processes, each rank 0 of 1, would each have done all the work and said 1)."""
    world_size = int((directory / "world_size.txt").read_text())
    if world_size != asked:
        raise RuntimeError(f"{what} asked for {asked} ranks and ran with {world_size}: see {log_path}")
    return world_size


def run_worker(module: str, args: list[str], num_processes: int, log_path: Path, deepspeed: str | None = None,
               grace_seconds: float = GRACE_SECONDS, logger: logging.Logger | logging.LoggerAdapter | None = None
               ) -> None:
    """Run the worker group to completion, its lines into `log_path` and the task's logger as they come.

    Raises WorkerError (the failing rank, its exit code, its last lines) if the group fails. On any
    exception raised into this call while the group runs, the group is stopped (`stop_group`) first.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv, env = accelerate_command(module, args, num_processes, deepspeed, rank_logs=log_path.parent / "ranks")
    tag = env[GROUP_ENV] = uuid.uuid4().hex
    logger = logger or stage_logger()
    name = module.rsplit(".", 1)[-1]
    with open(log_path, "w") as log, _sigterm_raises():
        # die_with_parent: a SIGKILLed round takes the launcher with it (its agent then stops the ranks); this
        # thread waits for the group, so the signal cannot come early
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True,
                                preexec_fn=die_with_parent if sys.platform == "linux" else None)
        reader = _LineReader(proc.stdout, log, logger, name)
        reader.start()
        try:
            while not reader.finished:  # only sleeps: an exception raised into this thread lands here
                time.sleep(POLL_SECONDS)
            code = proc.wait()
        except BaseException:
            stop_group(proc, tag, grace_seconds)
            raise
        finally:
            reader.join(timeout=grace_seconds)
        if code != 0:  # the launcher itself may have died (OOM-killed): its ranks live on in their own sessions
            stop_group(proc, tag, grace_seconds)
    if reader.copy_error is not None:
        logger.warning("%s: copying the group's lines stopped at %r; %s is incomplete", name, reader.copy_error,
                       log_path)
    if code != 0:
        raise WorkerError(failure_message(module, num_processes, code, log_path))


def failure_message(module: str, num_processes: int, code: int, log_path: Path) -> str:
    """Which rank failed with which exit code, and its last lines (the launcher's when no rank is named)."""
    text = log_path.read_text(errors="replace")
    failed = failed_rank(text)
    if failed is None:
        head, tail = f"the launcher exited {code}", text.splitlines()[-TAIL_LINES:]
    else:
        rank, rank_code = failed
        prefix = f"[default{rank}]:"
        head = f"rank {rank} exited {rank_code}"
        tail = [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)][-TAIL_LINES:]
    return (f"{module} with {num_processes} processes failed: {head}; whole log {log_path}; its last lines:\n"
            + "\n".join(tail))


class _LineReader(threading.Thread):
    """Copies the group's lines into the log file and the task's logger as they come.

    The copying happens here, not in the launcher's thread: Prefect delivers a timeout or cancellation
    by raising into the task's thread, and an exception that lands inside a logging handler's emit is
    swallowed by `Handler.handleError`, which would leave the launcher waiting on a stuck group. The
    Prefect run logger can be used from this thread: its records carry the run ids."""

    def __init__(self, stream, log, logger, name: str):
        super().__init__(daemon=True)
        self.stream, self.log, self.logger, self.name_ = stream, log, logger, name
        self.finished = False  # a plain attribute: the launcher polls it without taking a lock
        self.copy_error: Exception | None = None  # why copying stopped (a full disk), if it did

    def run(self) -> None:
        try:
            for line in self.stream:
                if self.copy_error is not None:
                    continue  # keep draining the pipe: a group blocked writing to it would never exit
                try:
                    self.log.write(line)
                    self.log.flush()
                    self.logger.info("%s: %s", self.name_, line.rstrip())
                except Exception as e:
                    self.copy_error = e
        finally:
            self.finished = True  # end of output: the group's leader has closed it (exited)


class _sigterm_raises:
    """Outside Prefect (which installs its own bridge), make SIGTERM an exception in the main thread, so
    the launcher stops its group instead of dying with the group left running in its own session."""

    def __enter__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (
                signal.SIG_DFL, None):
            self.previous = signal.signal(signal.SIGTERM, _raise_terminated)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
        return False


def _raise_terminated(signum, frame):
    raise LauncherTerminated(f"signal {signum}")
