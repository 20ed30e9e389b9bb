"""The `rlhf` command line: bad configs stop before any work, with the key and the expected type."""

import os
import socket
from pathlib import Path

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
    result = runner.invoke(app, ["stage", "denoise", "--input", "vote=votes:aa", "--input", "vote=votes:bb"])
    assert result.exit_code == 2 and "--input vote given more than once" in result.output  # the last one won


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


def test_a_dead_tracking_server_fails_in_seconds_with_one_line(prefect_api, tmp_path, monkeypatch):
    import time

    from flows.round import rlhf_round
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
    # the flow itself, run as the UI runs it (a Prefect flow run, its parameters as JSON), fails before any stage
    with pytest.raises(TrackingUnavailableError):
        rlhf_round(config={"workdir": str(tmp_path / "w2")})
    assert not (tmp_path / "w2").exists()


def test_a_round_refused_for_a_reason_the_user_can_fix_ends_in_one_line_and_exit_2(capsys):
    """What the round's flow raises for a user's mistake (here a busy workdir) reaches the command line as its
    message and exit code 2, not a traceback; a bug keeps its traceback."""
    import typer

    from flows.cli import user_errors
    from tasks.common import WorkdirBusyError

    with pytest.raises(typer.Exit) as exit_:
        with user_errors():
            raise WorkdirBusyError("another round is running in w (pid 1 on vm): wait for it to finish")
    assert exit_.value.exit_code == 2
    assert capsys.readouterr().out.strip() == "another round is running in w (pid 1 on vm): wait for it to finish"
    with pytest.raises(KeyError):
        with user_errors():
            raise KeyError("a bug")


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


def test_a_round_waits_for_a_store_maintenance_but_never_for_another_round(tmp_path):
    """`rlhf gc --remove` / `rlhf verify --remove` hold the lock for seconds: a round (one a Prefect event started
    for an export announced once) waits for them, up to a bound, instead of failing; for a round it fails at once."""
    import threading
    import time

    from tasks.common import MAINTENANCE, WorkdirBusyError, lock_workdir

    def hold(note: str, seconds: float, held: threading.Event) -> None:
        with lock_workdir(tmp_path, note=note):
            held.set()
            time.sleep(seconds)

    held = threading.Event()
    holder = threading.Thread(target=hold, args=(f"{MAINTENANCE} rlhf gc", 1.0, held))
    holder.start()
    held.wait()
    start = time.monotonic()
    with lock_workdir(tmp_path, note="a round"):
        waited = time.monotonic() - start
    holder.join()
    assert 0.3 < waited < 30
    for note, wait in (("prefect flow runs abc", 600.0), (f"{MAINTENANCE} rlhf gc", 0.2)):
        held = threading.Event()
        holder = threading.Thread(target=hold, args=(note, 2.0, held))
        holder.start()
        held.wait()
        start = time.monotonic()
        with pytest.raises(WorkdirBusyError, match=f"another round is running in .*{note}"):
            with lock_workdir(tmp_path, maintenance_wait_s=wait):
                pass
        assert time.monotonic() - start < 1.5  # a round at once; a maintenance after the bound
        holder.join()


def test_a_scheduled_or_triggered_round_waits_for_another_round_up_to_its_bound(tmp_path):
    """An export's round (announced once) that met a weekly round failed at once: given wait_for_workdir_minutes it
    waits for the holder, and past the bound fails naming it and how long it waited."""
    import threading
    import time

    from flows.round import rlhf_round
    from rlhf_core.config import RoundConfig
    from tasks.common import WorkdirBusyError, lock_workdir

    def hold(seconds: float, held: threading.Event) -> None:
        with lock_workdir(tmp_path, note="prefect flow runs weekly"):
            held.set()
            time.sleep(seconds)

    held = threading.Event()
    holder = threading.Thread(target=hold, args=(1.0, held))
    holder.start()
    held.wait()
    start = time.monotonic()
    with lock_workdir(tmp_path, note="an export's round", busy_wait_s=60):
        waited = time.monotonic() - start
    holder.join()
    assert 0.3 < waited < 30
    held = threading.Event()
    holder = threading.Thread(target=hold, args=(3.0, held))
    holder.start()
    held.wait()
    with pytest.raises(WorkdirBusyError, match=r"; prefect flow runs weekly\) \(waited 0 min\): wait for it"):
        rlhf_round.fn(config=RoundConfig(workdir=str(tmp_path)), wait_for_workdir_minutes=0.01)
    holder.join()
    with pytest.raises(ValueError, match="wait_for_workdir_minutes must be at least 0"):
        rlhf_round.fn(config=RoundConfig(workdir=str(tmp_path)), wait_for_workdir_minutes=-1)


def test_a_waiting_round_lets_a_series_run_all_its_rounds(tmp_path, caplog):
    """rlhf-rounds holds the series lock across its rounds and the round lock for each in turn: a waiting round
    took the round lock between two of them and the series' next round failed. It waits for the series now, and
    its log says whom it waits for."""
    import logging
    import threading
    import time

    from tasks.common import ROUND_LOCK, SERIES_LOCK, WorkdirBusyError, lock_workdir

    gap, events = threading.Event(), []

    def series() -> None:
        with lock_workdir(tmp_path, note="prefect flow runs series", name=SERIES_LOCK, what="rlhf-rounds"):
            for k in (1, 2, 3):
                with lock_workdir(tmp_path, note=f"series round {k}", busy_wait_s=60):
                    events.append(f"round {k}")
                    time.sleep(0.3)
                gap.set()
                time.sleep(0.6)  # between rounds: the series logs its round, starts the next subflow

    runner_ = threading.Thread(target=series)
    runner_.start()
    gap.wait()  # the round lock is free now, the series lock is not
    with caplog.at_level(logging.INFO, logger="rlhf"):
        with lock_workdir(tmp_path, note="weekly", busy_wait_s=60, yield_to_series=True):
            events.append("weekly")
    runner_.join()
    assert events == ["round 1", "round 2", "round 3", "weekly"]
    assert any("held by pid" in r.getMessage() and "prefect flow runs series" in r.getMessage() for r in caplog.records)
    # a round started by hand fails at once, naming the series, rather than failing it
    with lock_workdir(tmp_path, note="prefect flow runs series", name=SERIES_LOCK, what="rlhf-rounds"):
        with pytest.raises(WorkdirBusyError, match="prefect flow runs series"):
            with lock_workdir(tmp_path, yield_to_series=True):
                pass
    assert (tmp_path / ROUND_LOCK).exists()


@pytest.mark.parametrize("name, content", [
    ("truncated.json", b'[{"id": 1, "annotations": [{"result": '),
    ("binary.json", bytes(range(256)) * 4),
    ("utf16.jsonl", '{"prompt": "p", "chosen": "a", "rejected": "b"}\n'.encode("utf-16")),
    ("binary.jsonl", b"\x00\xff\xfe" * 500),
    ("truncated.parquet", b"PAR1\x15\x04\x15"),
    ("utf16.csv", "prompt_id,response_id,score,annotator\np,r,1,a\n".encode("utf-16")),
])
def test_a_bad_whole_export_is_refused_before_any_work_naming_its_key_and_path(prefect_api, tmp_path, monkeypatch,
                                                                              name, content):
    from flows.round import rlhf_round
    from rlhf_core.annotation.importer import ImportFormatError

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
    with pytest.raises(ImportFormatError, match=r"annotation.exports\[1\]"):  # a UI run (a flow run, JSON) too
        rlhf_round(config={"workdir": str(tmp_path / "w"),
                           "annotation": {"exports": ["exports/good.jsonl", f"exports/{name}"]}})
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


def test_the_summary_of_a_shared_mode_round_links_its_servers_pages_and_says_a_stage_run_is_not_a_round(capsys):
    """With a tracking server, `mlflow ui --backend-store-uri http://...` fails; with a Prefect server, `prefect
    server start` would start a second, empty one. Counts print as counts, a KL of -0.0004 as 0.000."""
    from flows.cli import print_summary

    path = "/srv/rlhf/workdirs/a-long-name/artifacts/votes/" + "0123456789abcdef" * 4  # longer than the table
    summary = {"round": "r", "round_no": 1, "stopped_after": "vote", "promotion": None, "stop": None,
               "artifacts": {"vote": {"kind": "votes", "digest": "0123456789abcdef" * 4, "path": path}},
               "headline": {"pairs flipped by voting": 703.0, "KL(new policy || SFT)": -0.0004},
               "mlflow": {"tracking_uri": "http://127.0.0.1:5000", "experiment": "e", "run_id": "abc",
                          "run_url": "http://127.0.0.1:5000/#/experiments/1/runs/abc?workflowType=machine_learning"},
               "prefect_flow_run_id": "f1", "prefect_flow_run_url": "http://127.0.0.1:4200/runs/flow-run/f1"}
    print_summary(summary)
    out = " ".join(capsys.readouterr().out.split())
    assert "RLHF round 'r' #1 run up to stage vote" in out
    assert "Open the MLflow UI: http://127.0.0.1:5000/#/experiments/1/runs/abc" in out and "mlflow ui" not in out
    assert "Open the Prefect UI: http://127.0.0.1:4200/runs/flow-run/f1" in out and "server start" not in out
    assert " 703 " in out and "703.000" not in out
    assert "votes:0123456789ab" in out and "…" not in out  # the path folded, never cut
    assert "-0.000" not in out and "0.000" in out


LOCAL_API_SCRIPT = """
import os, sys
from flows.local_api import LocalAPIError, runs_on_local_api, start_local_api

try:
    wait = start_local_api()
except LocalAPIError:  # PREFECT_API_URL named a server that does not answer: refused, nothing started
    print("refused", os.environ.get("PREFECT_API_URL"), runs_on_local_api())
    raise SystemExit(0)
url = os.environ.get("PREFECT_API_URL")
print("url", url)
wait()

from prefect import flow
from prefect.client.orchestration import get_client

@flow
def tiny() -> int:
    return 1

assert tiny() == 1
with get_client(sync_client=True) as client:
    ran_here = client.read_flow_runs()[0].name
    print("api", client.api_url == url + "/", "prefect.server.api.server" in sys.modules, bool(ran_here),
          runs_on_local_api())  # a round here leaves its MLflow run no link to this API's pages
"""


@pytest.mark.parametrize("api_url", [None, "http://127.0.0.1:9/api"])
def test_the_cli_starts_prefects_local_api_early_and_the_flow_uses_that_server(tmp_path, api_url):
    """`rlhf demo` starts Prefect's local API while it imports the round, without importing prefect.server itself
    (docs/benchmarks.md: ~3 s of a round's start); the flow runs on that server and the server stops with the
    process. With PREFECT_API_URL set nothing is started (here it names a port nobody answers on: refused)."""
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    done = subprocess.run([sys.executable, "-c", LOCAL_API_SCRIPT], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last == (f"refused {api_url} False" if api_url else "api True False True True")
    if not api_url:  # the server went with the process: nothing listens on its port any more
        url = done.stdout.split("url ", 1)[1].split()[0]
        assert not _listening(int(url.rsplit(":", 1)[1].split("/")[0]))


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_prefect_api_url_that_does_not_answer_is_one_clear_error_before_any_work():
    """Before: the first flow call retried for ~20 s, then a 430-line traceback. Any HTTP reply is an answer (a Prefect
    Cloud workspace may want its key for /health)."""
    import http.server
    import threading

    from flows.local_api import LocalAPIError, check_prefect_api

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LocalAPIError, match=f"the Prefect API at http://127.0.0.1:{port}/api .PREFECT_API_URL. does "
                                            "not answer .*start it .bash infra/services.sh start., or unset"):
        check_prefect_api(f"http://127.0.0.1:{port}/api", timeout_s=2)
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # answers 501 to GET
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        check_prefect_api(f"http://127.0.0.1:{server.server_port}/api", timeout_s=2)
    finally:
        server.shutdown()


def test_the_local_apis_port_is_held_from_its_launch_so_no_other_server_answers_for_it():
    """The port was chosen, released, then bound by uvicorn seconds later: another server taking it meanwhile answered
    the health check for ours, and the round ran against a server that ended with that other process."""
    from flows import local_api

    server = local_api.LocalAPI()
    server.launch()  # returns at once: uvicorn needs seconds to import
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", server.port))
        server.wait_healthy(timeout_s=120)
    finally:
        server.stop()


def test_a_local_api_that_cannot_start_is_one_clear_error(tmp_path, monkeypatch):
    """A server that exits at once is launched again, then reported in one line that
    says what to do."""
    from flows import local_api

    server = local_api.LocalAPI()
    launch = server.launch

    def broken_launch():
        launch()
        server.process.kill()  # as a server whose port was taken exits
        server.process.wait()

    monkeypatch.setattr(server, "launch", broken_launch)
    monkeypatch.setattr(local_api, "_point_prefect_at", lambda url: None)
    server.launch()
    with pytest.raises(local_api.LocalAPIError, match="did not start: exited with code .*set PREFECT_API_URL"):
        server.wait_healthy(timeout_s=30)
    assert server.process.poll() is not None



def test_a_round_killed_with_sigkill_leaves_no_local_api_behind(tmp_path):
    """atexit does not run on SIGKILL: the local API is tied to the process that launched it (Linux), so a killed
    round does not leave a server holding a port and Prefect's database."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    if sys.platform != "linux":
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    script = ("import os, time\nfrom flows.local_api import start_local_api\nwait = start_local_api()\nwait()\n"
              "print(os.environ['PREFECT_API_URL'], flush=True)\ntime.sleep(600)\n")
    round_ = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[1])
    url = round_.stdout.readline().strip()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert _listening(port)
    round_.send_signal(signal.SIGKILL)
    round_.wait()
    deadline = time.time() + 30
    while _listening(port) and time.time() < deadline:
        time.sleep(0.2)
    assert not _listening(port)


def test_verify_finds_damaged_artifacts_and_unfinished_executions_and_removes_them_only_when_asked(tmp_path):
    from rlhf_core.artifacts import ArtifactStore
    from tasks.common import lock_workdir

    workdir = tmp_path / "w"
    store = ArtifactStore(workdir / "artifacts")
    refs = []
    for i in range(3):
        with store.staging() as staged:
            (staged / "table.parquet").write_bytes(b"rows %d" % i)
            refs.append(store.commit(staged, kind="votes", stage="vote", stage_version="1", code_version="t",
                                     config={}, config_digest="c", inputs={}, cache_key=f"key{i}"))
    (workdir / "artifacts" / "votes" / refs[1].digest / "table.parquet").write_bytes(b"rows X")  # one byte
    (workdir / "artifacts" / "cache" / "gone.json").write_text(
        refs[0].model_copy(update={"digest": "0" * 64, "path": str(workdir / "artifacts" / "votes" / ("0" * 64))}
                           ).model_dump_json())
    (workdir / "scratch" / "ppo-0123456789abcdef" / "checkpoint").mkdir(parents=True)
    (workdir / "scratch" / "ppo-0123456789abcdef" / "checkpoint" / "policy.bin").write_bytes(b"\0" * 2**20)
    killed_note = "pid 1 on elsewhere; prefect flow runs abc"
    (workdir / ".round.lock").write_text(killed_note)

    result = runner.invoke(app, ["verify", str(workdir)])
    assert result.exit_code == 1, result.output
    assert "3 artifacts in" in result.output and "2 intact, 1 damaged; 1 cache entries point at no artifact" \
        in result.output
    assert f"damaged votes:{refs[1].digest[:12]}" in result.output and "table.parquet: changed" in result.output
    assert "unfinished:" in result.output and "ppo-0123456789abcdef (1.0 MiB" in result.output
    assert "--remove` to delete them" in result.output
    assert all((workdir / "artifacts" / "votes" / r.digest).exists() for r in refs)  # nothing removed unasked

    with lock_workdir(workdir, note="a round"):  # a live round: nothing is removed under it
        busy = runner.invoke(app, ["verify", str(workdir), "--remove"])
    assert busy.exit_code == 2 and "a round is running in" in busy.output and "nothing removed" in busy.output
    assert "give this round its own workdir" not in busy.output  # a round's advice, not verify's
    (workdir / ".round.lock").write_text(killed_note)  # as the killed round left it (the live one emptied it)

    result = runner.invoke(app, ["verify", str(workdir), "--remove", "--remove-scratch"])
    assert result.exit_code == 0, result.output
    assert "removed 1 damaged artifacts and 1 dangling cache entries" in result.output
    assert not (workdir / "artifacts" / "votes" / refs[1].digest).exists()
    assert store.lookup("key1") is None and store.lookup("key0") == refs[0] and store.lookup("key2") == refs[2]
    assert not list((workdir / "scratch").iterdir())
    assert (workdir / ".round.lock").read_text() == killed_note  # the next round still closes the killed one's runs
    again = runner.invoke(app, ["verify", str(workdir)])
    assert again.exit_code == 0 and "2 intact, 0 damaged; 0 cache entries" in again.output
    assert runner.invoke(app, ["verify", str(tmp_path / "nothing")]).exit_code == 2


def _workdir_with_one_votes_artifact(workdir):
    """A workdir whose store holds one votes artifact (votes.parquet, cache key "key"): (store, its ref)."""
    from rlhf_core.artifacts import ArtifactStore

    store = ArtifactStore(workdir / "artifacts")
    with store.staging() as staged:
        (staged / "votes.parquet").write_bytes(b"rows")
        ref = store.commit(staged, kind="votes", stage="vote", stage_version="1", code_version="t", config={},
                           config_digest="c", inputs={}, cache_key="key")
    return store, ref


def test_verify_remove_keeps_an_artifact_a_round_made_whole_while_it_scanned(tmp_path, monkeypatch):
    """The scan runs before the lock (minutes on a big store): a round that re-committed a damaged artifact
    meanwhile made it whole, and `--remove` must not delete it then."""
    import contextlib

    import tasks.common as common

    workdir = tmp_path / "w"
    store, ref = _workdir_with_one_votes_artifact(workdir)
    (Path(ref.path) / "votes.parquet").unlink()  # damaged: a file missing
    real_lock = common.lock_workdir

    @contextlib.contextmanager
    def lock_after_a_round_repaired_it(*args, **kwargs):
        (Path(ref.path) / "votes.parquet").write_bytes(b"rows")  # the round's commit, before verify gets the lock
        with real_lock(*args, **kwargs) as held:
            yield held

    monkeypatch.setattr(common, "lock_workdir", lock_after_a_round_repaired_it)
    result = runner.invoke(app, ["verify", str(workdir), "--remove"])
    assert result.exit_code == 0, result.output
    assert "0 intact, 1 damaged" in result.output and "votes.parquet: missing" in result.output
    assert "removed 0 damaged artifacts and 0 dangling cache entries" in result.output
    assert "1 made whole by a round during the check: kept" in " ".join(result.output.split())
    assert store.lookup("key") == ref and store.verify(ref)


def test_verify_remove_deletes_an_artifact_that_lost_its_manifest_once(tmp_path):
    """A directory without its manifest is a damaged artifact, not a cache entry pointing at nothing: it was both,
    and --remove deleted its entry twice (FileNotFoundError, no summary)."""
    workdir = tmp_path / "w"
    store, ref = _workdir_with_one_votes_artifact(workdir)
    (Path(ref.path) / "manifest.json").unlink()
    listed = runner.invoke(app, ["verify", str(workdir)])
    assert listed.exit_code == 1 and "0 intact, 1 damaged; 0 cache entries point at no artifact" in listed.output
    result = runner.invoke(app, ["verify", str(workdir), "--remove"])
    assert result.exit_code == 0, result.output
    assert "removed 1 damaged artifacts and 0 dangling cache entries" in result.output
    assert not Path(ref.path).exists() and store.lookup("key") is None


def test_gc_lists_what_nothing_kept_was_made_from_and_removes_it_only_when_asked(tmp_path):
    """`rlhf gc`: a series' head (finished-rounds.json) and its lineage stay however old, as do recent work and
    responses out for annotation; the rest is listed, and deleted with its cache entries and figures only with
    --remove, never under a live round or series, never a killed stage's curves."""
    import json
    import os
    import time

    from mlflow import MlflowClient

    from rlhf_core.artifacts import ArtifactStore
    from tasks.common import lock_workdir
    from tasks.iteration import FINISHED_ROUNDS

    workdir = tmp_path / "w"
    store = ArtifactStore(workdir / "artifacts")
    week_ago = time.time() - 7 * 86400

    def commit(kind: str, content: bytes, key: str, inputs=None):
        """An artifact committed a week ago (its manifest's time, outside its digest, and its cache entry's)."""
        with store.staging() as staged:
            (staged / "table.parquet").write_bytes(content)
            ref = store.commit(staged, kind=kind, stage=kind, stage_version="1", code_version="t", config={},
                               config_digest="c", inputs=inputs or {}, cache_key=key)
        manifest = workdir / "artifacts" / kind / ref.digest / "manifest.json"
        manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"created_at": week_ago}))
        os.utime(workdir / "artifacts" / "cache" / f"{key}.json", (week_ago, week_ago))
        (workdir / "artifacts" / "plots" / key).mkdir(parents=True)
        return ref

    def record(round_no: int, pairs, policy) -> None:
        (workdir / FINISHED_ROUNDS).write_text(json.dumps({"weekly": {
            "round_no": round_no, "pairs": pairs.model_dump(), "policy": policy.model_dump(), "mlflow_run_id": "r"}}))

    pairs = commit("comparisons", b"p" * 2**20, "k-pairs")
    policy = commit("policy", b"w", "k-policy", {"pairs": pairs})
    stale = commit("votes", b"v" * 2**20, "k-stale", {"pairs": pairs})
    out_for_annotation = commit("responses", b"r0", "k-out")
    (workdir / "artifacts" / "plots" / "k-killed-ppo").mkdir()  # a killed stage's curves: no cache entry yet
    record(3, pairs, policy)
    registry = workdir / "registry" / "rlhf-policy"  # champions downloaded from MLflow: last used a week ago, now
    for version, used in (("3", week_ago), ("5", time.time())):
        (registry / version).mkdir(parents=True)
        (registry / version / "model.safetensors").write_bytes(b"m" * 2**20)
        os.utime(registry / version, (used, used))
    (registry / "download").mkdir()  # what a killed download left
    (registry / ".trash-2" / "code").mkdir(parents=True)  # what a killed deletion left

    result = runner.invoke(app, ["gc", str(workdir)])  # all used within 30 days: nothing to collect
    assert result.exit_code == 0 and "4 kept" in result.output and "0 unreferenced" in result.output, result.output
    result = runner.invoke(app, ["gc", str(workdir), "--keep-days", "1"])
    assert result.exit_code == 0, result.output
    assert "3 kept" in result.output and "1 unreferenced (1.0 MiB)" in result.output and "votes" in result.output
    assert "3 registry downloads that no round used in the last 1 days, or a killed download left (1.0 MiB" \
        in " ".join(result.output.split())
    assert "--keep-days 1 --remove` to delete them" in result.output
    assert (workdir / "artifacts" / "votes" / stale.digest).is_dir()  # nothing removed unasked
    assert runner.invoke(app, ["gc", str(workdir), "--keep-days", "0.5"]).exit_code == 2  # under a day: refused
    for lock in (".round.lock", ".rounds.lock"):  # a round, or a series between its rounds
        with lock_workdir(workdir, note="a round", name=lock):
            busy = runner.invoke(app, ["gc", str(workdir), "--keep-days", "1", "--remove"])
        assert busy.exit_code == 2 and "nothing removed: another" in busy.output, busy.output
    result = runner.invoke(app, ["gc", str(workdir), "--keep-days", "1", "--remove"])
    assert result.exit_code == 0, result.output
    assert "removed 1 artifacts (1.0 MiB), 1 cache entries, 1 figure directories and 3 registry downloads" \
        in " ".join(result.output.split())
    assert sorted(p.name for p in registry.iterdir()) == ["5"]  # used today: kept
    assert not (workdir / "artifacts" / "votes" / stale.digest).exists()
    assert not (workdir / "artifacts" / "plots" / "k-stale").exists()
    assert (workdir / "artifacts" / "plots" / "k-killed-ppo").is_dir()  # its resumption replays them
    assert {r.digest for r in store.committed()} == {pairs.digest, policy.digest, out_for_annotation.digest}
    # once imported, the responses are the import's lineage like any other; --drop-registered-models: a policy only
    # the series' lineage reaches goes once the registry holds it
    generator = commit("policy", b"g" * 2**20, "k-generator")
    responses = commit("responses", b"r", "k-responses", {"policy": generator})
    week4 = commit("comparisons", b"p4", "k-pairs4", {"responses": responses})
    record(4, week4, policy)
    drop = ["gc", str(workdir), "--keep-days", "1", "--drop-registered-models"]
    result = runner.invoke(app, drop)
    assert result.exit_code == 0 and "0 unreferenced" in result.output, result.output  # not registered: kept
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    client.create_registered_model("rlhf-policy")
    client.create_model_version("rlhf-policy", source=str(workdir), tags={"rlhf.digest": generator.digest})
    result = runner.invoke(app, drop)
    assert "1 unreferenced (1.0 MiB)" in result.output and "--drop-registered-models --remove` to" in result.output
    # a registry URI with a password is refused unshown (it was echoed in the "does not answer" line and the
    # suggested command), and a URI without --drop-registered-models, which would not be read, is refused
    secret = "http://alice:s3cretpw@127.0.0.1:9"
    for argv in ([*drop, "--tracking-uri", secret], ["gc", str(workdir), "--tracking-uri", "http://127.0.0.1:9"]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2 and "s3cretpw" not in result.output and "tracking_uri" in result.output
    assert runner.invoke(app, [*drop, "--remove"]).exit_code == 0
    assert not os.path.exists(generator.path) and os.path.exists(responses.path)
    (workdir / FINISHED_ROUNDS).write_text("{")  # a record that does not read: nothing is collected
    refused = runner.invoke(app, ["gc", str(workdir), "--keep-days", "1", "--remove"])
    assert refused.exit_code == 2 and "is not a record of finished rounds" in refused.output
    assert os.path.exists(pairs.path) and os.path.exists(week4.path)
    assert runner.invoke(app, ["gc", str(tmp_path / "nothing")]).exit_code == 2


def test_iterated_rounds_over_real_exports_are_one_line_before_any_work(tmp_path, monkeypatch):
    """A ValueError raised inside rlhf-rounds gave a 120-line traceback and exit 1, after Prefect's local API."""
    monkeypatch.setenv("RLHF_ALLOWED_ROOTS", str(tmp_path))
    export = tmp_path / "batch-1.jsonl"
    export.write_text('{"prompt": "1+1", "chosen": "2", "rejected": "3"}\n')
    result = runner.invoke(app, ["rounds", "2", "--set", f"annotation.exports=[{export}]",
                                 "--set", f"workdir={tmp_path / 'w'}"])
    assert result.exit_code == 2 and "would import the same 1 export file(s) in every round" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "w").exists()


def test_a_round_whose_judge_server_is_down_is_refused_before_any_work(tmp_path):
    """It was found at the evaluate stage, after every other stage had run (minutes; hours on a real model)."""
    from pathlib import Path

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mini = Path(__file__).parents[1] / "configs" / "mini.yaml"
    judge = ["--set", f"workdir={tmp_path / 'w'}", "--set", "evaluation.judge=http",
             "--set", f"evaluation.http.base_url=http://127.0.0.1:{port}/v1", "--set", "evaluation.http.api_key_env=null"]
    # rlhf-rounds made its workdir, mlflow.db and a FAILED series run before its first round refused it
    for command in (["round", str(mini)], ["rounds", "2", "--config", str(mini)]):
        result = runner.invoke(app, [*command, *judge])
        assert result.exit_code == 2, result.output
        assert f"evaluation.http.base_url: nothing answers at http://127.0.0.1:{port}/v1" in " ".join(
            result.output.split())
        assert not (tmp_path / "w").exists()


def test_a_round_whose_judge_key_is_missing_is_refused_before_any_work(tmp_path, monkeypatch):
    """The server answers, but the variable that should hold its key is not set: found at the evaluate stage
    before (a RuntimeError traceback after SFT, voting, the reward model and PPO)."""
    from pathlib import Path

    from judge_server import JudgeServer

    monkeypatch.delenv("RLHF_TEST_UNSET_KEY", raising=False)
    mini = Path(__file__).parents[1] / "configs" / "mini.yaml"
    with JudgeServer() as server:
        result = runner.invoke(app, ["round", str(mini), "--set", f"workdir={tmp_path / 'w'}", "--set",
                                     "evaluation.judge=http", "--set", f"evaluation.http.base_url={server.base_url}",
                                     "--set", "evaluation.http.api_key_env=RLHF_TEST_UNSET_KEY"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "evaluation.http: evaluation.http.api_key_env names RLHF_TEST_UNSET_KEY, which is not set" in " ".join(
        result.output.split())
    assert not (tmp_path / "w").exists()


def test_a_maintenance_killed_under_the_lock_keeps_the_killed_rounds_note(tmp_path):
    """rlhf gc / verify --remove put a killed round's note back only when they let go: killed themselves, the note
    was gone, and the next round left that round's MLflow and Prefect runs RUNNING for good."""
    import signal
    import subprocess
    import sys
    import time

    from flows.round import flow_runs_in
    from tasks.common import lock_workdir

    killed_note = "pid 1 on elsewhere; prefect flow runs aaa,bbb"
    (tmp_path / ".round.lock").write_text(killed_note)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from tasks.common import lock_workdir\n"
        "with lock_workdir(sys.argv[1], note='maintenance: rlhf gc', keep_left=True, maintenance_wait_s=0):\n"
        "    print('held', flush=True); time.sleep(60)"), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    time.sleep(0.2)
    with lock_workdir(tmp_path, note="the next round") as left:
        assert flow_runs_in(left) == {"aaa", "bbb"} and "maintenance: rlhf gc" in left


def test_rlhf_round_waits_for_a_busy_workdir_only_when_told(tmp_path):
    """`--wait-for-workdir MINUTES` (a cron job's round): the deployments' wait from the command line."""
    import threading
    from pathlib import Path

    from tasks.common import lock_workdir

    mini = Path(__file__).parents[1] / "configs" / "mini.yaml"
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock_workdir(tmp_path, note="prefect flow runs weekly"):
            held.set()
            done.wait(120)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    at_once = runner.invoke(app, ["round", str(mini), "--set", f"workdir={tmp_path}"])
    waited = runner.invoke(app, ["round", str(mini), "--set", f"workdir={tmp_path}", "--wait-for-workdir", "0.01"])
    done.set()
    holder.join()
    assert at_once.exit_code == waited.exit_code == 2
    assert "prefect flow runs weekly" in at_once.output and "(waited" not in at_once.output
    assert "(waited 0 min)" in " ".join(waited.output.split())
