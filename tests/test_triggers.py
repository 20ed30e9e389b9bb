"""Chaining through Prefect automations, on a real Prefect API (the test harness's server runs the
reactive-trigger and action services): `prefect deploy` makes the deployment triggers of prefect.yaml into
automations, and the events a finished round and `rlhf-watch-exports` emit start flow runs of the right
deployments with the right parameters. No worker runs them: the flow runs are read back as created.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from flows.chaining import EXPORTED, ROUND_COMPLETED, round_completed, watch_exports
from rlhf_core.config import load_config

ROOT = Path(__file__).parents[1]
POOL = "rlhf"


@pytest.fixture(scope="module")
def deployed(prefect_api):
    """The two triggered deployments of prefect.yaml, deployed by the Prefect CLI to the harness's server."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.settings import PREFECT_API_URL

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
        except ObjectAlreadyExists:
            pass
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "RLHF_REPO_DIR": str(ROOT)}
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "prefect"), "--no-prompt", "deploy", "-n", "next-round",
                           "-n", "on-new-export"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    with get_client(sync_client=True) as client:
        return {name: client.read_deployment_by_name(f"rlhf-round/{name}") for name in ("next-round", "on-new-export")}


def _automation_of(deployment):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        owned = [a for a in client.read_automations()
                 if any(getattr(action, "deployment_id", None) == deployment.id for action in a.actions)]
    assert len(owned) == 1
    return owned[0]


def _flow_runs_of(deployment, wait_for: int, timeout: float = 60.0):
    """The deployment's flow runs, once there are `wait_for` of them (the trigger services run every second)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    deadline = time.time() + timeout
    with get_client(sync_client=True) as client:
        while True:
            this = DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
            runs = client.read_flow_runs(deployment_filter=this)
            if len(runs) >= wait_for or time.time() > deadline:
                return runs
            time.sleep(1)


def test_deploy_makes_each_trigger_an_automation_on_its_event(deployed):
    # switched on by hand: chaining, and rounds on exports once the deployment names the round's config
    assert not _automation_of(deployed["next-round"]).enabled and not _automation_of(deployed["on-new-export"]).enabled
    next_round = _automation_of(deployed["next-round"]).trigger
    assert next_round.expect == {ROUND_COMPLETED}
    assert next_round.match.model_dump()["rlhf.next"] == "yes"
    assert next_round.match.model_dump()["rlhf.subflow"] == "no"
    on_export = _automation_of(deployed["on-new-export"]).trigger
    assert on_export.expect == {EXPORTED}


def _summary(round_no: int, stop: str | None) -> dict:
    ref = lambda kind, digest: {"kind": kind, "digest": digest, "path": f"/store/{kind}/{digest}"}  # noqa: E731
    return {"round_no": round_no, "stop": stop, "mlflow": {"run_id": "r1"},
            "artifacts": {"import_annotations": ref("comparisons", "c" * 64), "ppo": ref("policy", "p" * 64)}}


def test_a_finished_round_starts_the_next_one_and_a_round_that_says_stop_does_not(deployed):
    from prefect.client.orchestration import get_client
    from prefect.events import emit_event

    with get_client(sync_client=True) as client:  # as a user switches it on in the UI
        client.resume_automation(_automation_of(deployed["next-round"]).id)
    config = load_config(ROOT / "configs" / "mini.yaml", overrides=["name=chained"])
    emit_event(**round_completed(config, _summary(1, "its win rate against the round before is 0.4"), False))
    emit_event(**round_completed(config, _summary(2, None), subflow=True))  # inside rlhf-rounds: it chains itself
    emit_event(**round_completed(config, _summary(3, None), subflow=False))
    runs = _flow_runs_of(deployed["next-round"], wait_for=1)
    time.sleep(3)  # the events before it were processed first; give a wrongly fired one time to show
    runs = _flow_runs_of(deployed["next-round"], wait_for=1)
    assert len(runs) == 1
    parameters = runs[0].parameters
    assert parameters["round_no"] == 4
    assert parameters["start_policy"] == _summary(3, None)["artifacts"]["ppo"]
    assert parameters["earlier_pairs"] == _summary(3, None)["artifacts"]["import_annotations"]
    assert parameters["previous_round_run_id"] == "r1"  # the finished round's MLflow run, tagged on the new one
    assert parameters["wait_for_workdir_minutes"] == 720  # a weekly round in the workdir: waited for, not failed on
    assert parameters["config"] == config.model_dump(mode="json")


def test_a_new_annotation_export_starts_a_round_that_imports_it(deployed, tmp_path):
    export = tmp_path / "batch-1.jsonl"
    export.write_text('{"prompt": "1+1", "chosen": "2", "rejected": "3"}\n')
    (tmp_path / "notes.txt").write_text("not an export")
    (tmp_path / ".batch-2.jsonl").write_text("")  # hidden: a file a tool is still writing
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:  # as a user switches it on in the UI
        client.resume_automation(_automation_of(deployed["on-new-export"]).id)
    assert watch_exports(folder=str(tmp_path), min_age_seconds=0) == [str(export.resolve())]
    assert watch_exports(folder=str(tmp_path), min_age_seconds=0) == []  # announced once
    runs = _flow_runs_of(deployed["on-new-export"], wait_for=1)
    assert [run.parameters["annotation_exports"] for run in runs] == [[str(export.resolve())]]
    assert runs[0].parameters["wait_for_workdir_minutes"] == 720  # the deployment's, beside the event's


def test_the_deployed_pull_step_reads_the_repository_where_the_run_starts_not_where_it_was_deployed(
        deployed, tmp_path, monkeypatch):
    """Prefect's set_working_directory with "{{ $RLHF_REPO_DIR }}" baked the deploying checkout's path into every
    run (a pod whose image holds the repository elsewhere failed before its flow loaded); unset, the run failed on
    a flow file it could not find. The stored step reads the variable when the run starts, and says what to do."""
    import asyncio

    from prefect.deployments.steps.core import StepExecutionError, run_steps

    pull = deployed["next-round"].pull_steps
    assert pull == [{"flows.pull.enter_repo_dir": {}}]  # nothing of the deploying machine in it
    elsewhere = tmp_path / "opt" / "rlhf"  # as the image's /opt/rlhf
    (elsewhere / "flows").mkdir(parents=True)
    (elsewhere / "flows" / "round.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLHF_REPO_DIR", str(elsewhere))
    assert asyncio.run(run_steps(pull, print_function=lambda *_: None)) == {"directory": str(elsewhere)}
    assert Path.cwd() == elsewhere
    for value, says in (("", "RLHF_REPO_DIR is not set where this flow run starts"),
                        (str(tmp_path), "holds no checkout of this repository")):
        monkeypatch.setenv("RLHF_REPO_DIR", value)
        with pytest.raises(StepExecutionError) as err:
            asyncio.run(run_steps(pull, print_function=lambda *_: None))
        assert says in str(err.value.__cause__)


def test_triggered_rounds_queue_behind_each_other_instead_of_failing_on_the_busy_workdir(deployed):
    for name in ("next-round", "on-new-export"):
        options = deployed[name]
        assert options.global_concurrency_limit.limit == 1, name
        assert options.concurrency_options.collision_strategy == "ENQUEUE", name


def test_export_names_the_watcher_announces_are_the_ones_the_importers_read():
    from rlhf_core.annotation.importer import is_export_name

    assert all(is_export_name(n) for n in ("a.jsonl", "B.JSONL", "c.jsonl.gz", "d.csv.gz", "e.parquet", "f.json",
                                           "g.ndjson"))
    assert not any(is_export_name(n) for n in ("notes.txt", "a.jsonl.bak", "model.safetensors", "archive.gz"))


def test_a_round_over_real_exports_does_not_start_the_next_one_and_iterated_rounds_refuse_them(tmp_path):
    from rlhf_core.config import ConfigError, check_iterated_rounds

    simulated = load_config(ROOT / "configs" / "mini.yaml")
    real = load_config(ROOT / "configs" / "mini.yaml", overrides=[f"annotation.exports=[{tmp_path / 'batch-1.jsonl'}]"])
    assert round_completed(simulated, _summary(1, None), False)["resource"]["rlhf.next"] == "yes"
    # the next round would import the same file again: it waits for annotations of this round's responses
    assert round_completed(real, _summary(1, None), False)["resource"]["rlhf.next"] == "no"
    # a weekly round's next is next week's, which its schedule starts: the next-round automation must not run it now
    weekly = load_config(ROOT / "configs" / "weekly.yaml")
    assert weekly.iteration.continue_series and round_completed(weekly, _summary(3, None), False)["resource"][
        "rlhf.next"] == "no"
    check_iterated_rounds(simulated, 3)
    check_iterated_rounds(real, 1)
    with pytest.raises(ConfigError, match="same 1 export file"):
        check_iterated_rounds(real, 2)
