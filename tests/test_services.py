"""infra/services.sh: the shared services start on loopback ports, the worker inherits the tracking
URI, and `stop` leaves no process of theirs behind."""

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environ(pid: int, wait_for: str) -> dict[str, str]:
    """The process's environment once `wait_for` is in it (`env VAR=... cmd` sets it as it execs cmd)."""
    deadline = time.time() + 20
    while True:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
        if wait_for in env or time.time() > deadline:
            return env
        time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_start_status_stop(tmp_path):
    env = {**os.environ, "RLHF_SERVICES_DIR": str(tmp_path), "PREFECT_PORT": str(_free_port()),
           "MLFLOW_PORT": str(_free_port())}
    run = lambda *args: subprocess.run(["bash", str(ROOT / "infra" / "services.sh"), *args], env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=240)
    started = run("start")
    try:
        assert started.returncode == 0, started.stderr + started.stdout
        assert f"export MLFLOW_TRACKING_URI=http://127.0.0.1:{env['MLFLOW_PORT']}" in started.stdout
        pids = {name: int((tmp_path / f"{name}.pid").read_text()) for name in ("prefect", "mlflow", "worker")}
        assert _environ(pids["worker"], "MLFLOW_TRACKING_URI").get("MLFLOW_TRACKING_URI") == f"http://127.0.0.1:{env['MLFLOW_PORT']}"
        assert all(os.getpgid(pid) == pid for pid in pids.values())  # each leads its own group
        status = run("status").stdout
        assert all(f"{name}: running (pid {pid}" in status for name, pid in pids.items())
        assert run("start").returncode == 1  # a second start refuses rather than doubling the services
    finally:
        run("stop")
    assert not any(_group_alive(pid) for pid in pids.values())  # the worker (and its children) too
    assert "worker: stopped" in run("status").stdout
