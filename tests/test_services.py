"""infra/services.sh: the shared services start on loopback ports, the worker inherits the tracking
URI, a deployment from prefect.yaml runs through the worker and logs to the MLflow server, and `stop`
leaves no process of theirs behind. One start for the module (the MLflow server takes ~30 s to answer)."""

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

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


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """The three services started by infra/services.sh on free loopback ports; stopped at the end."""
    state = tmp_path_factory.mktemp("services")
    data = tmp_path_factory.mktemp("data")  # config files and workdirs the worker's flow runs may use
    env = {**os.environ, "RLHF_SERVICES_DIR": str(state), "PREFECT_PORT": str(_free_port()),
           "MLFLOW_PORT": str(_free_port()), "RLHF_ALLOWED_ROOTS": str(data),
           "PREFECT_WORKER_QUERY_SECONDS": "2"}  # the worker polls every 2 s, not 10
    run = lambda *args: subprocess.run(["bash", str(ROOT / "infra" / "services.sh"), *args], env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=240)
    started = run("start")
    try:
        assert started.returncode == 0, started.stderr + started.stdout
        yield {"env": env, "dir": state, "data": data, "run": run, "stdout": started.stdout}
    finally:
        run("stop")


# Prefect's server answers 503 when its SQLite database is busy (a retryable error by its own account),
# and Prefect's client retries 408/429/502/503 with backoff; this test's raw HTTP does the same, or a
# loaded 2-core CI machine fails it on a transient "Service Unavailable" (seen once in CI).
_RETRYABLE_STATUS = {408, 429, 502, 503}


def _http_json(url: str, body: dict | None = None, attempts: int = 6) -> dict:
    data = None if body is None else json.dumps(body).encode()
    for attempt in range(attempts):
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                         method="GET" if body is None else "POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            if err.code not in _RETRYABLE_STATUS or attempt == attempts - 1:
                raise
            time.sleep(2 ** attempt)
    raise AssertionError("unreachable")


@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_a_deployment_from_prefect_yaml_runs_through_the_worker_and_logs_to_the_mlflow_server(services):
    env, data = services["env"], services["data"]
    prefect_api = f"http://127.0.0.1:{env['PREFECT_PORT']}/api"
    mlflow_api = f"http://127.0.0.1:{env['MLFLOW_PORT']}/api/2.0/mlflow"
    deploy_env = {**env, "PREFECT_API_URL": prefect_api, "PREFECT_HOME": str(services["dir"] / "prefect"),
                  "RLHF_REPO_DIR": str(ROOT)}
    deployed = subprocess.run([str(ROOT / ".venv" / "bin" / "prefect"), "--no-prompt", "deploy", "--all"], cwd=ROOT,
                              env=deploy_env, capture_output=True, text=True, timeout=180)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr

    # the miniature round, smaller still, in a workdir of its own, given as a config file
    config = yaml.safe_load((ROOT / "configs" / "mini.yaml").read_text())
    config |= {"name": "deployed", "workdir": str(data / "work"), "ppo": config["ppo"] | {"iterations": 2}}
    (data / "round.yaml").write_text(yaml.safe_dump(config))
    deployment = _http_json(f"{prefect_api}/deployments/name/rlhf-round/from-file")
    flow_run = _http_json(f"{prefect_api}/deployments/{deployment['id']}/create_flow_run",
                          {"parameters": {"config_path": str(data / "round.yaml")}})
    deadline = time.time() + 480
    while (state := _http_json(f"{prefect_api}/flow_runs/{flow_run['id']}")["state"])["type"] not in {
            "COMPLETED", "FAILED", "CRASHED", "CANCELLED"} and time.time() < deadline:
        time.sleep(3)
    worker_log = (services["dir"] / "worker.log").read_text()[-3000:]
    assert state["type"] == "COMPLETED", f"{state}\n{worker_log}"

    # the result, read from the MLflow server over its REST API
    experiment = _http_json(f"{mlflow_api}/experiments/get-by-name?"
                            + urllib.parse.urlencode({"experiment_name": "rlhf"}))["experiment"]
    runs = _http_json(f"{mlflow_api}/runs/search", {
        "experiment_ids": [experiment["experiment_id"]],
        "filter": f"tags.`prefect.flow_run_id` = '{flow_run['id']}'", "max_results": 100})["runs"]
    tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs}
    metrics = {r["info"]["run_id"]: {m["key"]: m["value"] for m in r["data"].get("metrics", [])} for r in runs}
    parents = [r for r in runs if "mlflow.parentRunId" not in tags[r["info"]["run_id"]]]
    assert len(parents) == 1 and parents[0]["info"]["status"] == "FINISHED"
    parent_id = parents[0]["info"]["run_id"]
    assert tags[parent_id]["rlhf.round"] == "deployed"
    stages = {tags[r["info"]["run_id"]]["rlhf.stage"]: r["info"]["run_id"] for r in runs
              if tags[r["info"]["run_id"]].get("mlflow.parentRunId") == parent_id}
    assert set(stages) >= {"world", "sft", "sample", "generate", "vote", "reward", "ppo", "evaluate"}
    win_rate = metrics[stages["evaluate"]]["eval/judge/win_rate"]
    assert 0.0 <= win_rate <= 1.0 and metrics[parent_id]["headline/eval/judge/win_rate"] == win_rate
    # 8 prompts judged in both orders: a win rate is a multiple of 1/8
    assert abs(win_rate * 8 - round(win_rate * 8)) < 1e-9


@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_start_status_stop(services):
    env, state, run = services["env"], services["dir"], services["run"]
    assert f"export MLFLOW_TRACKING_URI=http://127.0.0.1:{env['MLFLOW_PORT']}" in services["stdout"]
    pids = {name: int((state / f"{name}.pid").read_text()) for name in ("prefect", "mlflow", "worker")}
    assert _environ(pids["worker"], "MLFLOW_TRACKING_URI").get("MLFLOW_TRACKING_URI") == f"http://127.0.0.1:{env['MLFLOW_PORT']}"
    assert all(os.getpgid(pid) == pid for pid in pids.values())  # each leads its own group
    status = run("status").stdout
    assert all(f"{name}: running (pid {pid}" in status for name, pid in pids.items())
    assert run("start").returncode == 1  # a second start refuses rather than doubling the services
    # status without the ports in its environment reports the ones start used, not 4200 / 5000
    bare = {k: v for k, v in env.items() if k not in ("PREFECT_PORT", "MLFLOW_PORT")}
    status = subprocess.run(["bash", str(ROOT / "infra" / "services.sh"), "status"], env=bare, capture_output=True,
                            text=True, timeout=60).stdout
    assert f"127.0.0.1:{env['PREFECT_PORT']}/api" in status and f"127.0.0.1:{env['MLFLOW_PORT']}" in status
    # another set of services on ports already taken: it said it started, its health checks answered by these
    other = {**env, "RLHF_SERVICES_DIR": str(state.parent / "other-services")}
    taken = subprocess.run(["bash", str(ROOT / "infra" / "services.sh"), "start"], env=other, capture_output=True,
                           text=True, timeout=60)
    assert taken.returncode == 1 and f"port {env['PREFECT_PORT']} is in use" in taken.stderr
    assert not (state.parent / "other-services" / "prefect.pid").exists()  # nothing was started
    run("stop")
    assert not any(_group_alive(pid) for pid in pids.values())  # the worker (and its children) too
    assert "worker: stopped" in run("status").stdout


@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_a_stale_pid_file_names_another_process_which_status_does_not_report_and_stop_does_not_kill(tmp_path):
    """After a reboot or a crash, services/<name>.pid may hold the pid of an unrelated process: `status` called it
    running and `stop` killed its whole process group."""
    unrelated = subprocess.Popen(["setsid", "sleep", "300"])
    try:
        time.sleep(0.2)  # setsid has exec'd sleep
        env = {**os.environ, "RLHF_SERVICES_DIR": str(tmp_path)}
        (tmp_path / "mlflow.pid").write_text(f"{unrelated.pid}\n")  # from before start times were recorded,
        os.utime(tmp_path / "mlflow.pid", (time.time() - 3600,) * 2)  # and before a reboot: older than the process
        (tmp_path / "prefect.pid").write_text(f"{unrelated.pid}\n")
        (tmp_path / "prefect.start").write_text("1\n")  # the pid's start time then: another process
        run = lambda *args: subprocess.run(["bash", str(ROOT / "infra" / "services.sh"), *args], env=env,  # noqa: E731
                                           capture_output=True, text=True, timeout=60)
        assert "mlflow: stopped" in run("status").stdout and "prefect: stopped" in run("status").stdout
        stopped = run("stop")
        assert stopped.returncode == 0 and f"mlflow's pid {unrelated.pid} is another process now" in stopped.stderr
        assert unrelated.poll() is None  # still running
        assert not (tmp_path / "mlflow.pid").exists() and not (tmp_path / "prefect.start").exists()
    finally:
        unrelated.kill()
        unrelated.wait()


@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_services_started_before_start_times_were_recorded_are_still_reported_and_stopped(tmp_path):
    """A pid file the earlier script wrote (no .start): its process, older than the file, is the service."""
    service = subprocess.Popen(["setsid", "sleep", "300"])
    try:
        time.sleep(1.2)  # the file is written after the process started, as launch wrote it
        (tmp_path / "worker.pid").write_text(f"{service.pid}\n")
        env = {**os.environ, "RLHF_SERVICES_DIR": str(tmp_path)}
        run = lambda *args: subprocess.run(["bash", str(ROOT / "infra" / "services.sh"), *args], env=env,  # noqa: E731
                                           capture_output=True, text=True, timeout=60)
        assert f"worker: running (pid {service.pid}" in run("status").stdout
        assert run("stop").returncode == 0
        service.wait(timeout=20)  # stopped
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()


@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_stop_ends_a_service_group_whose_leader_has_exited(tmp_path):
    """A pid is not reused while its process group lives: a group whose leader died (a crashed server, its children
    left) is still the service's, and `stop` ends it."""
    leader = subprocess.run(["setsid", "bash", "-c", "sleep 300 >/dev/null 2>&1 & echo $$ $!"], capture_output=True,
                            text=True, timeout=30)
    group, child = (int(x) for x in leader.stdout.split())
    try:
        assert os.getpgid(child) == group  # the leader has exited; its child holds the group
        (tmp_path / "worker.pid").write_text(f"{group}\n")
        (tmp_path / "worker.start").write_text("1\n")
        env = {**os.environ, "RLHF_SERVICES_DIR": str(tmp_path)}
        stopped = subprocess.run(["bash", str(ROOT / "infra" / "services.sh"), "stop"], env=env, capture_output=True,
                                 text=True, timeout=60)
        assert stopped.returncode == 0 and stopped.stderr == ""
        time.sleep(0.5)
        assert not _group_alive(group)
    finally:
        if _group_alive(group):
            os.killpg(group, 9)
