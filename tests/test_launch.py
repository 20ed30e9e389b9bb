"""The worker launcher: a stopped launch leaves no process behind, a failed rank is named, lines stream."""

from __future__ import annotations

import ctypes
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tasks.launch import WorkerError, failed_rank, run_worker

ROOT = Path(__file__).resolve().parents[1]
PROBE = "rlhf_core.workers.probe"
STUCK = ["--sleep", "120", "--ignore-sigterm"]  # ranks that only a SIGKILL stops


class Lines(logging.Handler):
    """Keeps what the launcher logs, with the time each line arrived."""

    def __init__(self):
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def emit(self, record):
        self.lines.append((time.monotonic(), record.getMessage()))


def group_pids(text: str) -> list[int]:
    """Every rank's pid and its agent's (the launcher's child) from the probe's `rank R pid P ppid Q` lines."""
    pids = set()
    for pid, ppid in re.findall(r"rank \d+ pid (\d+) ppid (\d+)", text):
        pids |= {int(pid), int(ppid)}
    return sorted(pids)


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a zombie is dead, waiting for its parent to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_for(condition, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def test_sigterm_to_the_launching_process_kills_the_whole_group(tmp_path):
    log = tmp_path / "worker.log"
    launcher = subprocess.Popen(
        [sys.executable, "-c", f"from pathlib import Path; from tasks.launch import run_worker; "
         f"run_worker({PROBE!r}, {STUCK!r}, 2, Path({str(log)!r}), grace_seconds=1.0)"], cwd=ROOT)
    wait_for(lambda: log.exists() and len(group_pids(log.read_text())) == 3)  # 2 ranks + their agent
    pids = group_pids(log.read_text())
    assert all(alive(pid) for pid in pids)
    t0 = time.monotonic()
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) != 0
    stopped_in = time.monotonic() - t0
    assert not [pid for pid in pids if alive(pid)]
    assert stopped_in < 10  # 1 s of grace, then SIGKILL: the ranks ignored the SIGTERM


def test_an_exception_raised_into_the_launcher_stops_the_group(tmp_path):
    """What a Prefect task timeout does to a sync task running in a worker thread: raise into it."""
    log, lines, raised = tmp_path / "worker.log", Lines(), []
    logger = logging.getLogger("test_launch.raise")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)

    def launch():
        try:
            run_worker(PROBE, STUCK, 2, log, grace_seconds=1.0, logger=logger)
        except BaseException as e:  # noqa: BLE001 - the test reads what arrived
            raised.append(e)

    thread = threading.Thread(target=launch)
    thread.start()
    wait_for(lambda: len(group_pids("\n".join(m for _, m in lines.lines))) == 3)
    pids = group_pids(log.read_text())
    assert thread.is_alive() and all(alive(pid) for pid in pids)  # streamed while the ranks still run
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(TimeoutError))
    thread.join(timeout=30)
    assert not thread.is_alive() and isinstance(raised[0], TimeoutError)
    assert not [pid for pid in pids if alive(pid)]


def test_a_failing_rank_is_named_with_its_exit_code_and_last_lines(tmp_path):
    with pytest.raises(WorkerError) as failure:
        run_worker(PROBE, ["--fail-rank", "1", "--exit-code", "3"], 2, tmp_path / "worker.log")
    message = str(failure.value)
    assert "rank 1 exited 3" in message and str(tmp_path / "worker.log") in message
    last_lines = message.split("its last lines:\n")[1].splitlines()
    assert last_lines[-1] == "rank 1 fails with exit code 3" and last_lines[0].startswith("rank 1 pid ")


def test_failed_rank_reads_the_root_cause_not_the_ranks_stopped_after_it():
    summary = """Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 5531)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 5532)
"""
    assert failed_rank(summary) == (1, 3)
    assert failed_rank("Killed") is None


def test_a_prefect_task_timeout_stops_the_group(prefect_api, tmp_path):
    """The timeout arrives as an exception in the task's thread (SIGALRM on the main thread)."""
    from prefect import flow, task

    log = tmp_path / "worker.log"

    @task(timeout_seconds=15)
    def launch():
        run_worker(PROBE, STUCK, 2, log, grace_seconds=1.0)

    @flow
    def stage():
        launch()

    with pytest.raises(TimeoutError, match="timed out"):  # Prefect's TaskRunTimeoutError
        stage()
    pids = group_pids(log.read_text())
    assert len(pids) == 3 and not [pid for pid in pids if alive(pid)]
