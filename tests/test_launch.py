"""The worker launcher: a stopped launch leaves no process behind, a failed rank is named, lines stream."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prefect_logs import run_and_read_logs

from tasks.launch import WorkerError, failed_rank, group_world_size, run_worker

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


def test_a_sigkilled_round_takes_its_launcher_and_ranks_with_it(tmp_path):
    """SIGKILL runs no handler: before, the launcher and its ranks lived on (a killed vote's voters kept training and
    writing into the scratch directory the next round resumes from, with the workdir's lock released)."""
    log = tmp_path / "worker.log"
    round_process = subprocess.Popen(
        [sys.executable, "-c", f"from pathlib import Path; from tasks.launch import run_worker; "
         f"run_worker({PROBE!r}, ['--sleep', '120'], 2, Path({str(log)!r}))"], cwd=ROOT)
    try:
        wait_for(lambda: log.exists() and len(group_pids(log.read_text())) == 3)  # 2 ranks + their agent
        pids = group_pids(log.read_text())
        round_process.kill()
        round_process.wait(timeout=30)
        wait_for(lambda: not [pid for pid in pids if alive(pid)], seconds=60)
    finally:
        for pid in group_pids(log.read_text()) if log.exists() else []:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_launcher_that_dies_on_its_own_takes_its_ranks_with_it(tmp_path):
    """The accelerate process OOM-killed: its ranks run in their own sessions and would keep their GPUs."""
    log, raised = tmp_path / "worker.log", []
    thread = threading.Thread(target=lambda: raised.append(pytest.raises(
        WorkerError, run_worker, PROBE, STUCK, 2, log, grace_seconds=1.0)))
    thread.start()
    try:
        wait_for(lambda: log.exists() and len(group_pids(log.read_text())) == 3)  # 2 ranks + their agent
        pids = group_pids(log.read_text())
        agent = int(re.search(r"ppid (\d+)", log.read_text())[1])
        os.kill(agent, signal.SIGKILL)
        thread.join(timeout=30)
        assert not thread.is_alive() and "the launcher exited -9" in str(raised[0].value)
        assert not [pid for pid in pids if alive(pid)]
    finally:
        if thread.is_alive() or any(alive(pid) for pid in group_pids(log.read_text())):
            for pid in group_pids(log.read_text()):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_ranks_with_unequal_work_wait_for_each_other_past_the_groups_timeout(tmp_path, monkeypatch):
    """Voter k on rank k mod N, shard k on rank k mod N: a rank with less to do waits in the final barrier longer
    than the process group's timeout (NCCL 10 min) allows. Here the group times out after 10 s and rank 0 works
    20 s longer than rank 1."""
    monkeypatch.setenv("RLHF_DIST_TIMEOUT_S", "10")
    uneven = ["--join-ranks", "--sleep", "20", "--out", str(tmp_path)]
    run_worker(PROBE, uneven, 2, tmp_path / "worker.log")
    assert (tmp_path / "world_size.txt").read_text() == "2\n"
    assert group_world_size(tmp_path, 2, "probe", tmp_path / "worker.log") == 2
    # what N lone processes (each rank 0 of 1) would leave: every stage refuses it (generation did not check)
    with pytest.raises(RuntimeError, match="generation asked for 3 ranks and ran with 2: see .*worker.log"):
        group_world_size(tmp_path, 3, "generation", tmp_path / "worker.log")
    assert "rank 1 done" in (tmp_path / "worker.log").read_text()
    # the control: the group's own barrier does time out, so the wait above outlasted a real timeout
    with pytest.raises(WorkerError, match="rank 1 exited"):
        run_worker(PROBE, [*uneven, "--plain-wait"], 2, tmp_path / "plain.log")


class SlowSwallowingLines(Lines):
    """Like Prefect's console handler: an exception inside emit goes to handleError and is swallowed.
    Holds the emit of the group's third line (both ranks and their agent are up by then) for 2 s."""

    def __init__(self):
        super().__init__()
        self.holding = threading.Event()

    def emit(self, record):
        try:
            super().emit(record)
            if len(group_pids("\n".join(m for _, m in self.lines))) == 3 and not self.holding.is_set():
                self.holding.set()
                for _ in range(20):
                    time.sleep(0.1)
        except Exception:
            self.handleError(record)

    def handleError(self, record):
        pass  # quietly, as logging.raiseExceptions = False would


def test_an_exception_raised_into_the_launcher_stops_the_group(tmp_path):
    """What a Prefect task timeout does to a sync task running in a worker thread: raise into it. It is
    raised while a log handler is busy with a line; a launcher that logged from its own thread would
    have the exception swallowed by the handler and wait on the stuck group for ever."""
    log, lines, raised = tmp_path / "worker.log", SlowSwallowingLines(), []
    logger = logging.getLogger("test_launch.raise")
    logger.propagate = False
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)

    def launch():
        try:
            run_worker(PROBE, STUCK, 2, log, grace_seconds=1.0, logger=logger)
        except BaseException as e:  # noqa: BLE001 - the test reads what arrived
            raised.append(e)

    thread = threading.Thread(target=launch)
    thread.start()
    try:
        assert lines.holding.wait(timeout=60)
        pids = group_pids(log.read_text())
        assert thread.is_alive() and all(alive(pid) for pid in pids)  # streamed while the ranks still run
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(TimeoutError))
        thread.join(timeout=30)
        assert not thread.is_alive() and isinstance(raised[0], TimeoutError)
        assert not [pid for pid in pids if alive(pid)]
    finally:
        logger.removeHandler(lines)
        logger.propagate = True
        if thread.is_alive():  # the launcher missed the exception: free the test run from the stuck group
            for pid in group_pids(log.read_text()):
                os.kill(pid, signal.SIGKILL)


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


def test_the_ranks_lines_reach_the_prefect_task_runs_log(prefect_api, tmp_path):
    """The lines are logged from the launcher's reader thread; the run logger's records still carry the run."""
    from prefect import flow, task
    from prefect.runtime import task_run

    @task
    def launch() -> str:
        run_worker(PROBE, ["--sleep", "0"], 2, tmp_path / "worker.log")
        return task_run.id

    @flow
    def stage() -> str:
        return launch()

    messages = run_and_read_logs(stage, of="task")
    for rank in (0, 1):
        assert any(m.startswith(f"probe: [default{rank}]:rank {rank} pid ") for m in messages), messages


@pytest.mark.parametrize("preset", ["zero2", "zero3"])
def test_a_deepspeed_launch_passes_what_the_matching_accelerate_config_says(preset):
    """infra/accelerate/<preset>.yaml is for launching a worker by hand; the pipeline passes its settings on the
    command line, so the two run alike (the ZeRO-3 file said zero3_init_flag false, the launcher left accelerate's
    default, true)."""
    import yaml

    from tasks.launch import accelerate_command

    settings = yaml.safe_load((ROOT / "infra" / "accelerate" / f"{preset}.yaml").read_text())["deepspeed_config"]
    argv, _ = accelerate_command(PROBE, [], 2, preset)
    given = dict(zip(argv, argv[1:]))  # each flag with the word after it
    assert Path(given["--deepspeed_config_file"]) == (ROOT / settings["deepspeed_config_file"]).resolve()
    assert given["--zero3_init_flag"] == str(settings.get("zero3_init_flag", False)).lower()


def test_a_workers_directory_resumes_only_the_run_that_wrote_it(tmp_path):
    """A worker run by hand (or a GPU check) with new inputs in an old --checkpoint-dir resumed the old run's PPO
    checkpoint silently; the rank count may change between a kill and its resume."""
    import argparse
    import json

    from rlhf_core.workers.ranks import RUN_FILE, check_resumable_dir

    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "manifest.json").write_text(json.dumps({"digest": "ab" * 32}))
    (tmp_path / "prompts.parquet").write_bytes(b"prompts")
    (tmp_path / "cfg.json").write_text(json.dumps({"lr": 1e-5, "num_processes": 2}))
    args = argparse.Namespace(config=str(tmp_path / "cfg.json"), seed=3, policy_dir=str(tmp_path / "policy"),
                              prompts=str(tmp_path / "prompts.parquet"), ptx=None)
    inputs, work = ("policy_dir", "prompts", "ptx"), tmp_path / "work"
    check_resumable_dir(work, args, inputs, main_process=False)
    assert not (work / RUN_FILE).exists()  # only the main process notes the run
    check_resumable_dir(work, args, inputs, main_process=True)
    assert json.loads((work / RUN_FILE).read_text())["inputs"]["policy_dir"] == "digest:" + "ab" * 32
    (tmp_path / "cfg.json").write_text(json.dumps({"lr": 1e-5, "num_processes": 1}))  # fewer ranks: resumes
    check_resumable_dir(work, args, inputs, main_process=True)
    (tmp_path / "prompts.parquet").write_bytes(b"other prompts")
    with pytest.raises(ValueError, match="holds the work of another run .another prompts.: give this run"):
        check_resumable_dir(work, args, inputs, main_process=False)
    (tmp_path / "prompts.parquet").write_bytes(b"prompts")
    with pytest.raises(ValueError, match="another seed"):
        check_resumable_dir(work, argparse.Namespace(**vars(args) | {"seed": 4}), inputs, main_process=True)


def test_a_generation_run_resumes_after_its_workdir_moved(tmp_path):
    """generators.json holds the policy's absolute path, and the resume check keyed the file's bytes: a killed
    multi-rank generation in a moved (or copied) workdir was refused as "another run" on every re-run, though its
    cache key, which names the generators by id, was the same. Strategies and ids still tell runs apart."""
    import argparse

    from rlhf_core.config import SamplingStrategy
    from rlhf_core.generation.generators import Generator, generators_identity, save_generators
    from rlhf_core.workers.ranks import check_resumable_dir

    def generators(path: str, temperature: float = 1.0) -> Path:
        out = tmp_path / f"generators-{len(list(tmp_path.glob('generators-*')))}.json"
        strategy = SamplingStrategy(name="t", temperature=temperature)
        save_generators([Generator("policy", "policy-ab12", path, (strategy,))], out)
        return out

    before, moved = generators("/old/workdir/artifacts/policy/ab12"), generators("/new/workdir/artifacts/policy/ab12")
    assert generators_identity(before) == generators_identity(moved)
    assert generators_identity(generators("/old/workdir/artifacts/policy/ab12", 0.7)) != generators_identity(before)
    (tmp_path / "cfg.json").write_text("{}")
    (tmp_path / "prompts.parquet").write_bytes(b"prompts")
    args = argparse.Namespace(config=str(tmp_path / "cfg.json"), seed=0, prompts=str(tmp_path / "prompts.parquet"))
    for path in (before, moved):  # the generate worker's check, as it names its generators
        check_resumable_dir(tmp_path / "shards", args, ("prompts",), main_process=True,
                            identities={"generators": generators_identity(path)})
    with pytest.raises(ValueError, match="another generators"):
        check_resumable_dir(tmp_path / "shards", args, ("prompts",), main_process=True,
                            identities={"generators": generators_identity(generators("/x", 0.7))})
