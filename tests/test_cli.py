"""The `rlhf` command line: bad configs stop before any work, with the key and the expected type."""

import os

import pytest
from typer.testing import CliRunner

from flows.cli import app

runner = CliRunner()


def test_bad_config_fails_before_any_work(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"workdir: {tmp_path / 'w'}\nppo:\n  kl_coeff: 0.1\n  iterations: many\n")
    result = runner.invoke(app, ["demo", "--config", str(bad)])
    assert result.exit_code == 2
    assert "ppo.kl_coeff: unknown key" in result.output
    assert "ppo.iterations: Input should be a valid integer" in result.output
    assert not (tmp_path / "w").exists()  # nothing was started or written


def test_bad_override_and_unknown_stage(tmp_path):
    result = runner.invoke(app, ["demo", "--set", "voting.n_models=1"])
    assert result.exit_code == 2 and "voting.n_models: Input should be greater than or equal to 2" in result.output
    result = runner.invoke(app, ["stage", "train_everything"])
    assert result.exit_code == 2 and "unknown stage 'train_everything'" in result.output


def test_validate_version_schema(tmp_path):
    import json

    import rlhf_core

    good = tmp_path / "ok.yaml"
    good.write_text("seed: 4\n")
    assert runner.invoke(app, ["validate", str(good)]).exit_code == 0
    assert runner.invoke(app, ["version"]).output.strip() == rlhf_core.__version__
    schema = json.loads(runner.invoke(app, ["schema"]).output)
    assert "kl_coef" in json.dumps(schema)


def test_a_config_naming_a_file_outside_the_allowed_roots_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLHF_ALLOWED_ROOTS", raising=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("annotation: {exports: [/etc/hostname]}\n")
    result = runner.invoke(app, ["validate", str(cfg)])
    assert result.exit_code == 2 and "annotation.exports[0]" in result.output and "RLHF_ALLOWED_ROOTS" in result.output
    assert runner.invoke(app, ["demo", "--config", str(cfg)]).exit_code == 2


def test_a_dead_tracking_server_fails_in_seconds_with_one_line(tmp_path, monkeypatch):
    import socket
    import time

    from flows.round import rlhf_round
    from rlhf_core.config import RoundConfig
    from tasks.tracking import TrackingUnavailableError

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    start = time.time()
    result = runner.invoke(app, ["demo", "--set", f"workdir={tmp_path / 'w'}"])
    assert result.exit_code == 2 and time.time() - start < 30
    assert f"the MLflow tracking server http://127.0.0.1:{port} does not answer" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "w").exists()
    # the flow itself (a run triggered from the UI) fails before any stage, too
    with pytest.raises(TrackingUnavailableError):
        rlhf_round.fn(config=RoundConfig(workdir=str(tmp_path / "w2")))
    assert not (tmp_path / "w2").exists()


def test_a_second_round_in_a_busy_workdir_fails_at_once_naming_the_holder(tmp_path):
    from flows.round import rlhf_round
    from rlhf_core.config import RoundConfig
    from tasks.common import WorkdirBusyError, lock_workdir

    with lock_workdir(tmp_path):
        with pytest.raises(WorkdirBusyError, match=f"another round is running in {tmp_path} \\(pid {os.getpid()}"):
            rlhf_round.fn(config=RoundConfig(workdir=str(tmp_path)))
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "artifacts").exists()  # nothing was started
    with lock_workdir(tmp_path):  # released: the next holder gets it
        pass
    assert (tmp_path / ".gitignore").read_text().splitlines()[-1] == "*"  # a workdir never shows in git status


@pytest.mark.parametrize("name, content", [
    ("truncated.json", b'[{"id": 1, "annotations": [{"result": '),
    ("binary.json", bytes(range(256)) * 4),
    ("utf16.jsonl", '{"prompt": "p", "chosen": "a", "rejected": "b"}\n'.encode("utf-16")),
    ("binary.jsonl", b"\x00\xff\xfe" * 500),
    ("truncated.parquet", b"PAR1\x15\x04\x15"),
    ("utf16.csv", "prompt_id,response_id,score,annotator\np,r,1,a\n".encode("utf-16")),
])
def test_a_bad_whole_export_is_refused_before_any_work_naming_its_key_and_path(tmp_path, monkeypatch, name, content):
    from flows.round import rlhf_round
    from rlhf_core.annotation.importer import ImportFormatError
    from rlhf_core.config import RoundConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "good.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    (tmp_path / "exports" / name).write_bytes(content)
    config = tmp_path / "c.yaml"
    config.write_text(f"workdir: {tmp_path / 'w'}\nannotation: {{exports: [exports/good.jsonl, exports/{name}]}}\n")
    result = runner.invoke(app, ["demo", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert f"annotation.exports[1]: exports/{name}: " in result.output and "Traceback" not in result.output
    assert not (tmp_path / "w").exists()
    with pytest.raises(ImportFormatError, match=r"annotation.exports\[1\]"):  # the flow (a UI run) refuses it too
        rlhf_round.fn(config=RoundConfig(workdir=str(tmp_path / "w"),
                                         annotation={"exports": ["exports/good.jsonl", f"exports/{name}"]}))
    assert not (tmp_path / "w").exists()


def test_the_summary_says_what_promotion_decided_and_why_iterated_rounds_stop(capsys):
    from flows.cli import print_summary

    summary = {"round": "r", "round_no": 2, "artifacts": {}, "headline": {"judged win rate vs SFT": 0.5},
               "mlflow": {"tracking_uri": "sqlite:///m.db", "experiment": "e", "run_id": "abc"},
               "promotion": {"reason": "rlhf-policy v2 not promoted: judged win rate 0.400"},
               "stop": "round 2's judged win rate against round 1 is 0.400"}
    print_summary(summary)
    out = " ".join(capsys.readouterr().out.split())
    assert "Promotion: rlhf-policy v2 not promoted: judged win rate 0.400" in out
    assert "Iterated rounds stop here: round 2's judged win rate against round 1 is 0.400" in out
    print_summary(summary | {"promotion": None, "stop": None})  # a round ended early decides neither
    out = capsys.readouterr().out
    assert "Promotion" not in out and "stop here" not in out


EARLY_API_SCRIPT = """
import threading
from flows.cli import start_prefect_api_early
from prefect.server.api.server import SubprocessASGIServer

wait = start_prefect_api_early()
started = any(t.name == "prefect-api-start" for t in threading.enumerate())
wait()
if not started:
    print("no-op", sorted(map(str, SubprocessASGIServer._instances)))
    raise SystemExit(0)
server = SubprocessASGIServer()
pid = server.server_process.pid
assert server.running and server.server_process.poll() is None

from prefect import flow
from prefect.client.orchestration import get_client

@flow
def tiny() -> int:
    return 1

assert tiny() == 1
with get_client(sync_client=True) as client:
    print("api", client.api_url == server.api_url + "/", pid == SubprocessASGIServer().server_process.pid,
          len(SubprocessASGIServer._instances))
"""


@pytest.mark.parametrize("api_url", [None, "http://127.0.0.1:9/api"])
def test_the_cli_starts_prefects_local_api_early_and_the_flow_uses_that_server(tmp_path, api_url):
    """`rlhf demo` starts the ephemeral API while it imports the round (docs/benchmarks.md: ~5 s of a round's start);
    the flow then runs on that server, not on a second one. With PREFECT_API_URL set nothing is started."""
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    done = subprocess.run([sys.executable, "-c", EARLY_API_SCRIPT], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last == ("no-op []" if api_url else "api True True 1")
