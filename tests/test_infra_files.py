"""The container and cluster templates cannot run here (no Docker, no cluster): checked as files.

infra/Dockerfile installs with the README's setup command; infra/docker-compose.yaml wires the worker to
the Prefect and MLflow servers it starts; infra/k8s/base-job-template.json resolves, through Prefect's
own templating, to a Job that requests GPUs and mounts the shared volume that shared-pvc.yaml claims.
"""

import json
import re
from pathlib import Path

import pytest
import yaml
from prefect.utilities.templating import apply_values, find_placeholders

ROOT = Path(__file__).parents[1]
INFRA = ROOT / "infra"


def _dockerfile_runs() -> list[str]:
    """The Dockerfile's RUN commands, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (INFRA / "Dockerfile").read_text())
    return [line[len("RUN "):].strip() for line in text.splitlines() if line.startswith("RUN ")]


def _readme_setup_commands() -> list[str]:
    """The setup commands of the README's first code block (`bash infra/setup.sh && .venv/bin/rlhf demo`)."""
    block = re.search(r"```\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    commands = [c.strip() for line in block.splitlines() for c in line.split("&&")]
    return [c for c in commands if "setup" in c]


def test_the_image_installs_as_the_readme_setup_does():
    setup = _readme_setup_commands()
    assert setup == ["bash infra/setup.sh"]
    assert set(setup) <= set(_dockerfile_runs())
    script = (INFRA / "setup.sh").read_text()
    assert "TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}" in script and "-c constraints.txt" in script
    # a .venv copied from the build machine would make setup.sh skip torch: the build context leaves it out
    ignored = (INFRA / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignored and "rlhf-runs*" in ignored
    # anything installed beyond setup.sh is pinned
    extra = [c for c in _dockerfile_runs() if "pip install" in c]
    assert extra and all(re.search(r"==\d", c) for c in extra)


def test_the_image_python_satisfies_the_project():
    base = re.search(r"^ARG BASE=python:(\d+)\.(\d+)", (INFRA / "Dockerfile").read_text(), re.M)
    required = re.search(r'requires-python = ">=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert (int(base[1]), int(base[2])) >= (int(required[1]), int(required[2]))


def _compose() -> dict:
    return yaml.safe_load((INFRA / "docker-compose.yaml").read_text())


def test_compose_runs_postgres_prefect_mlflow_and_a_worker_that_logs_to_mlflow():
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"postgres", "prefect-server", "mlflow", "worker"}
    build = services["prefect-server"]["build"]
    assert (INFRA / build["context"] / build["dockerfile"]).resolve() == INFRA / "Dockerfile"
    assert {s.get("image") for name, s in services.items() if name != "postgres"} == {"rlhf-pipeline:latest"}

    worker = services["worker"]["environment"]
    mlflow_args = dict(a.split("=", 1) for a in services["mlflow"]["command"] if a.startswith("--"))
    assert worker["MLFLOW_TRACKING_URI"] == f"http://mlflow:{mlflow_args['--port']}"
    assert f"mlflow:{mlflow_args['--port']}" in mlflow_args["--allowed-hosts"].split(",")
    prefect_cmd = services["prefect-server"]["command"]
    assert worker["PREFECT_API_URL"] == f"http://prefect-server:{prefect_cmd[prefect_cmd.index('--port') + 1]}/api"
    assert "prefect worker start --pool rlhf" in " ".join(services["worker"]["command"])

    # both servers on PostgreSQL, each its own database; the password comes from the environment only
    assert services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"].startswith(
        "postgresql+asyncpg://rlhf:${POSTGRES_PASSWORD}@postgres:5432/prefect")
    # MLflow's store URI (with the password) in its environment: on the command line `ps` shows it to anyone
    assert services["mlflow"]["environment"]["MLFLOW_BACKEND_STORE_URI"].startswith(
        "postgresql+psycopg://rlhf:${POSTGRES_PASSWORD}@postgres")
    assert not any("POSTGRES_PASSWORD" in arg for arg in services["mlflow"]["command"])
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    assert "CREATE DATABASE prefect;" in compose["configs"]["create-prefect-database"]["content"]

    # round workdirs and MLflow's artifacts on one shared volume, an allowed root for configs and exports
    assert "shared:/shared" in services["worker"]["volumes"] and "shared:/shared" in services["mlflow"]["volumes"]
    assert worker["RLHF_ALLOWED_ROOTS"] == "/shared" and mlflow_args["--artifacts-destination"].startswith("/shared/")


def _job_template() -> dict:
    return json.loads((INFRA / "k8s" / "base-job-template.json").read_text())


def test_every_placeholder_of_the_k8s_job_template_is_a_declared_variable():
    template = _job_template()
    used = {p.name for p in find_placeholders(template["job_configuration"])}
    declared = set(template["variables"]["properties"])
    assert used == declared, (used - declared, declared - used)
    assert all(v.get("description") for v in template["variables"]["properties"].values())


def test_the_k8s_job_requests_gpus_and_mounts_the_shared_claim():
    template = _job_template()
    properties = template["variables"]["properties"]
    defaults = {name: p["default"] for name, p in properties.items() if "default" in p}
    job = apply_values(template["job_configuration"], defaults | {"name": "r1", "command": "prefect flow-run execute"})
    manifest = job["job_manifest"]
    pod = manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 1 == container["resources"]["limits"]["nvidia.com/gpu"]
    assert manifest["metadata"]["generateName"] == "r1-" and manifest["metadata"]["namespace"] == "rlhf"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    pvc = yaml.safe_load((INFRA / "k8s" / "shared-pvc.yaml").read_text())
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["metadata"]["namespace"] == defaults["namespace"]
    assert mounts["shared"] == defaults["env"]["RLHF_ALLOWED_ROOTS"] == "/shared"
    assert mounts["dshm"] == "/dev/shm" and volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert job["env"]["MLFLOW_TRACKING_URI"].startswith("http://")


def test_the_docs_show_how_to_use_each_template():
    docs = (ROOT / "docs" / "operations.md").read_text()
    for command in ("docker build -f infra/Dockerfile", "docker compose -f infra/docker-compose.yaml up",
                    "--base-job-template infra/k8s/base-job-template.json", "kubectl apply -f infra/k8s/shared-pvc.yaml"):
        assert command in docs, command


def test_every_deployment_config_in_prefect_yaml_is_valid_and_the_weekly_schedule_starts_from_the_champion():
    from rlhf_core.config import RoundConfig, load_config

    deployments = {d["name"]: d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]}
    configs = {name: RoundConfig.model_validate(d["parameters"]["config"])
               for name, d in deployments.items() if "config" in d.get("parameters", {})}
    configs |= {name: load_config(ROOT / d["parameters"]["config_path"])
                for name, d in deployments.items() if "config_path" in d.get("parameters", {})}
    # weekly's config is a file: a run given a partial `config` replaced the deployment's whole and lost the champion
    assert "config" not in deployments["weekly"]["parameters"]
    assert configs["weekly"].iteration.start_from == "champion" and "schedules" in deployments["weekly"]
    assert configs["weekly"].iteration.continue_series  # else every week samples the same prompts as round 1


def test_the_k8s_pool_refuses_a_misspelt_job_variable_and_runs_pods_that_can_write_the_shared_volume(prefect_api):
    """`job_variables: {gpu: 8}` (for gpus) was accepted silently and the Job asked for 1 GPU."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import PrefectHTTPStatusError

    from flows.chaining import watch_exports

    template = _job_template()
    pod = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsUser": 1000, "fsGroup": 1000}  # the image's user; a fresh volume is root's
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="rlhf-gpu-test", type="kubernetes", base_job_template=template),
                                overwrite=True)
        flow_id = client.create_flow_from_name(watch_exports.name)
        good = client.create_deployment(flow_id, "k8s-good", work_pool_name="rlhf-gpu-test",
                                        job_variables={"image": "registry.example/rlhf-pipeline:v1", "gpus": 8})
        assert client.read_deployment(good).job_variables["gpus"] == 8
        with pytest.raises(PrefectHTTPStatusError, match="422"):
            client.create_deployment(flow_id, "k8s-typo", work_pool_name="rlhf-gpu-test", job_variables={"gpu": 8})


def test_mlflow_telemetry_is_off_from_the_first_import_of_the_tasks(tmp_path):
    """Offline by construction: `import mlflow` starts a telemetry client that asks mlflow-telemetry.io for its
    config (a DNS lookup and a request in every round). The tasks package turns it off before any of its modules
    imports mlflow; a user's own setting wins. Run outside pytest and CI, which MLflow itself leaves untracked."""
    import os
    import subprocess
    import sys

    untracked = {"PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK"}
    env = {k: v for k, v in os.environ.items() if k not in untracked}
    probe = ("import tasks.tracking, os; from mlflow.telemetry.client import get_telemetry_client; "
             "print(get_telemetry_client() is None, os.environ['MLFLOW_DISABLE_TELEMETRY'])")
    root = Path(__file__).parents[1]
    run = lambda e: subprocess.run([sys.executable, "-c", probe], env=e, cwd=root, capture_output=True,  # noqa: E731
                                   text=True, timeout=120).stdout.split()
    assert run(env) == ["True", "true"]
    assert run(env | {"MLFLOW_DISABLE_TELEMETRY": "1"}) == ["True", "1"]  # the user's own value stands
