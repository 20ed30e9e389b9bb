"""Models as MLflow 3 logged models: a miniature round logs each model it trains (SFT policy, reward model, PPO
policy) as a logged model of its stage's run, with the files, params and metrics, READY, and registers the
version from it with lineage tags; the same round served from the cache onto a new MLflow store shows the same.
Read back from real SQLite MLflow stores."""

import json
import logging
import math
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
from mlflow import MlflowClient
from mlflow.entities import LoggedModelStatus

from rlhf_core.artifacts import ArtifactRef, ArtifactStore
from rlhf_core.config import load_config
from tasks.tracking import Tracker, _warn_renamed

CONFIG = Path(__file__).parents[1] / "configs" / "mini.yaml"
MODELS = {"sft": "rlhf-sft-policy", "reward": "rlhf-reward-model", "ppo": "rlhf-policy"}  # stage -> registered name


@pytest.fixture(scope="module")
def rounds(prefect_api, tmp_path_factory):
    """A mini round (it trains and registers), then the same round on a new, empty MLflow store: every stage
    a cache hit."""
    from flows.round import rlhf_round

    workdir = tmp_path_factory.mktemp("logged")
    cfg = load_config(CONFIG, overrides=[f"workdir={workdir}"])
    rlhf_logger = logging.getLogger("rlhf")
    _warn_renamed.cache_clear()  # it warns once per name and process: an earlier test may have had the warning
    renamed = _Collect()
    rlhf_logger.addHandler(renamed)
    try:
        miss = rlhf_round(config=cfg)
        fresh = cfg.model_copy(update={"tracking_uri": f"sqlite:///{workdir / 'fresh-mlflow.db'}"})
        hit = rlhf_round(config=fresh)
    finally:
        rlhf_logger.removeHandler(renamed)
    return {"miss": miss, "hit": hit, "store": ArtifactStore(workdir / "artifacts"), "warnings": renamed.messages}


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _client(summary) -> MlflowClient:
    uri = summary["mlflow"]["tracking_uri"]
    return MlflowClient(uri, registry_uri=uri)


def _stage_run(client, summary, stage):
    parent = client.get_run(summary["mlflow"]["run_id"])
    return client.search_runs([parent.info.experiment_id], filter_string=(
        f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.`rlhf.stage` = '{stage}'"))[0]


def _logged(client, summary, stage):
    """(the stage's run, the registered candidate version, its logged model)."""
    version = client.get_model_version_by_alias(MODELS[stage], "candidate")
    model = client.get_logged_model(version.source.removeprefix("models:/"))
    return _stage_run(client, summary, stage), version, model


@pytest.mark.parametrize("which", ["miss", "hit"])
@pytest.mark.parametrize("stage", list(MODELS))
def test_each_model_is_a_ready_logged_model_of_its_stage_run(rounds, which, stage):
    summary, store = rounds[which], rounds["store"]
    client = _client(summary)
    run, version, model = _logged(client, summary, stage)
    ref = ArtifactRef(**summary["artifacts"][stage])
    manifest = store.manifest(ref)
    assert run.data.tags["rlhf.cache"] == which
    assert version.source == f"models:/{model.model_id}" and version.run_id == run.info.run_id
    assert model.status == LoggedModelStatus.READY and model.source_run_id == run.info.run_id
    assert model.model_id in {o.model_id for o in run.outputs.model_outputs}  # the run lists its model
    assert json.loads(model.tags["mlflow.modelVersions"]) == [{"name": MODELS[stage], "version": version.version}]
    assert model.tags["rlhf.digest"] == version.tags["rlhf.digest"] == ref.digest
    # the model's files are the artifact's (a Hugging Face directory)
    files = Path(urlparse(model.artifact_location).path)
    assert {"config.json", "model.safetensors"} <= {f.name for f in files.iterdir()}
    assert (files / "model.safetensors").read_bytes() == (Path(ref.path) / "model.safetensors").read_bytes()
    assert model.params["config_digest"] == manifest.config_digest
    assert (model.params["code_version"], model.params["stage_version"]) == (manifest.code_version,
                                                                             manifest.stage_version)
    # the stage's numbers, linked to the model from its run (NaN is not logged)
    numbers = {k: v for k, v in manifest.metrics.items() if not math.isnan(v)}
    if which == "hit":  # the maker's time is the maker's: the hit's run did not spend it
        assert numbers.pop("time/stage_seconds") > 0 and "time/stage_seconds" not in run.data.metrics
    assert {m.key: m.value for m in model.metrics} == pytest.approx(numbers)
    assert {m.run_id for m in model.metrics} == {run.info.run_id}


def test_the_base_model_is_what_each_model_was_initialised_from(rounds):
    client, sft_digest = _client(rounds["miss"]), rounds["miss"]["artifacts"]["sft"]["digest"]
    base = {stage: _logged(client, rounds["miss"], stage)[2].params["base_model"] for stage in MODELS}
    assert base == {"sft": "none (built from its config)", "reward": f"policy:{sft_digest}",
                    "ppo": f"policy:{sft_digest}"}  # round 1's PPO starts from SFT


def test_each_stage_run_lists_the_logged_models_it_read_as_model_inputs(rounds):
    """PPO read the SFT policy and the reward model, the reward stage the SFT policy: the runs say so (MLflow's
    model inputs, which the UI draws), by the models' logged ids."""
    summary = rounds["miss"]
    client = _client(summary)
    model_of = {stage: _logged(client, summary, stage)[2].model_id for stage in MODELS}
    runs = {stage: client.get_run(_stage_run(client, summary, stage).info.run_id)  # search_runs leaves model inputs out
            for stage in ("reward", "ppo", "evaluate")}
    read = {stage: {i.model_id for i in run.inputs.model_inputs} for stage, run in runs.items()}
    assert read["reward"] == {model_of["sft"]}
    assert read["ppo"] == {model_of["sft"], model_of["reward"]}
    assert read["evaluate"] == {model_of["sft"], model_of["reward"], model_of["ppo"]}


@pytest.mark.parametrize("which", ["miss", "hit"])
def test_lineage_leads_from_the_policy_to_its_reward_model_to_votes_and_annotations(rounds, which):
    summary = rounds[which]
    client, digest = _client(summary), {stage: ref["digest"] for stage, ref in summary["artifacts"].items()}
    _, reward, _ = _logged(client, summary, "reward")
    _, policy, policy_model = _logged(client, summary, "ppo")
    assert policy.tags["rlhf.reward_model.model_version"] == f"rlhf-reward-model/{reward.version}"
    # the logged model (the Models tab) carries the same lineage as its registered version
    lineage = {k: v for k, v in policy.tags.items() if k.startswith(("rlhf.reward_model.", "rlhf.start_policy."))}
    assert len(lineage) == 5 and lineage.items() <= policy_model.tags.items()
    assert policy.tags["rlhf.input.reward_model"] == f"reward_model:{digest['reward']}"
    assert reward.tags["rlhf.lineage.votes"] == digest["vote"]
    assert reward.tags["rlhf.lineage.comparisons"] == digest["import_annotations"]  # the imported pairs
    assert reward.tags["rlhf.lineage.annotation_export"] == digest["annotators"]  # the annotators' files
    assert reward.tags["rlhf.input.denoised"] == f"denoised:{digest['denoise']}"
    assert "rlhf.lineage.unresolved" not in reward.tags  # a round's own artifacts: the walk went all the way


def test_lineage_says_where_it_stops_at_an_artifact_from_another_store(tmp_path):
    """A reward model trained on votes given from another work dir: the walk cannot go past them, and the tags
    say so (rlhf.lineage.unresolved) instead of looking like a model trained on votes of no pairs."""
    from tasks.common import data_lineage

    store = ArtifactStore(tmp_path / "artifacts")
    elsewhere = ArtifactRef(kind="votes", digest="ab" * 32, path=str(tmp_path / "other" / "votes"))
    with store.staging() as staged:
        (staged / "model.safetensors").write_bytes(b"weights")
        ref = store.commit(staged, kind="reward_model", stage="reward", stage_version="1", code_version="test",
                           config={}, config_digest="c", inputs={"votes": elsewhere}, cache_key="k")
    assert data_lineage(store, store.manifest(ref)) == {"rlhf.lineage.votes": "ab" * 32,
                                                        "rlhf.lineage.unresolved": f"votes:{'ab' * 32}"}


def test_a_cache_hit_on_a_new_store_shows_what_the_miss_showed(rounds):
    def shown(summary):
        client = _client(summary)
        out = {}
        for stage in MODELS:
            _, version, model = _logged(client, summary, stage)
            tags = {k: v for k, v in version.tags.items() if k.startswith("rlhf.")}
            # but the time the stage took, which only the run that trained the model spent
            out[stage] = (version.version, tags, model.params,
                          sorted(m.key for m in model.metrics if m.key != "time/stage_seconds"))
        return out

    assert shown(rounds["hit"]) == shown(rounds["miss"])
    client = _client(rounds["hit"])
    vote = _stage_run(client, rounds["hit"], "vote")  # plots and output tables as the miss logged them
    assert {"preference_strength.png"} <= {Path(f.path).name for f in client.list_artifacts(vote.info.run_id, "plots")}
    assert any(f.path.endswith(".parquet") for f in client.list_artifacts(vote.info.run_id, "outputs"))


ALLOWED = re.compile(r"[A-Za-z0-9_/.\-]+")


def test_every_metric_name_of_a_round_is_logged_as_its_stage_named_it(rounds):
    """No character MLflow refuses or a search must quote, so no name is rewritten on the way (the tracker warns
    when it has to)."""
    client = _client(rounds["miss"])
    parent = client.get_run(rounds["miss"]["mlflow"]["run_id"])
    runs = [parent, *client.search_runs([parent.info.experiment_id],
                                        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")]
    names = {name for run in runs for name in run.data.metrics}
    assert len(runs) == 12 and len(names) > 100  # the parent and 11 stages
    assert sorted(n for n in names if not ALLOWED.fullmatch(n)) == []
    assert [m for m in rounds["warnings"] if "is logged as" in m] == []


def test_a_name_outside_the_allowed_characters_is_rewritten_with_a_warning(tmp_path, caplog):
    tracker = Tracker(f"sqlite:///{tmp_path / 'm.db'}", "names")
    run_id = tracker.start_run("r", {})
    with caplog.at_level(logging.WARNING, logger="rlhf"):
        tracker.log_metrics(run_id, {"KL(new || SFT)": 0.25, "eval/judge/win_rate": 0.5})
    assert tracker.client.get_run(run_id).data.metrics == {"KL_new____SFT_": 0.25, "eval/judge/win_rate": 0.5}
    assert [r.getMessage() for r in caplog.records if r.name == "rlhf"] == \
        ["metric 'KL(new || SFT)' is logged as 'KL_new____SFT_': name it with letters, digits and _ / . - only"]


def test_a_model_whose_files_fail_to_upload_is_failed_and_not_registered(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'm.db'}", "fails", tmp_path / "artifacts")
    run_id = tracker.start_run("reward", {})
    with pytest.raises(FileNotFoundError, match="no-such-model holds no model"):
        tracker.register_model(run_id, tmp_path / "no-such-model", "broken", "candidate",
                               tags={"rlhf.digest": "d" * 64, "rlhf.stage": "reward"})
    [model] = tracker.client.search_logged_models([tracker.experiment_id])
    assert model.status == LoggedModelStatus.FAILED and model.source_run_id == run_id
    assert tracker.client.search_model_versions("name = 'broken'") == []


def test_a_model_a_killed_round_left_pending_is_failed_by_the_next_round(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'm.db'}", "killed")
    killed = tracker.start_run("ppo", {"rlhf.workdir": "/w", "prefect.flow_run_id": "killed-flow-run"})
    pending = tracker.client.create_logged_model(tracker.experiment_id, name="rlhf-policy", source_run_id=killed)
    # the same path on another machine sharing this MLflow server: a live run, not noted by the killed holder
    live = tracker.start_run("ppo", {"rlhf.workdir": "/w", "prefect.flow_run_id": "live-flow-run"})
    live_model = tracker.client.create_logged_model(tracker.experiment_id, name="rlhf-policy", source_run_id=live)
    assert tracker.close_killed_runs("/w", set()) == 0  # no killed holder: nothing to close
    assert tracker.close_killed_runs("/w", {"killed-flow-run"}) == 1
    assert tracker.client.get_logged_model(pending.model_id).status == LoggedModelStatus.FAILED
    assert tracker.client.get_run(live).info.status == "RUNNING"
    assert tracker.client.get_logged_model(live_model.model_id).status == LoggedModelStatus.PENDING
    # a workdir path with a quote (it broke the filter string: the next round crashed, the runs stayed RUNNING)
    quoted = tracker.start_run("ppo", {"rlhf.workdir": "/home/o'brien/w", "prefect.flow_run_id": "other-flow-run"})
    assert tracker.close_killed_runs("/home/o'brien/w", {"other-flow-run"}) == 1
    assert tracker.client.get_run(quoted).info.status == "KILLED"


def test_a_version_registered_by_a_run_killed_before_its_alias_gets_the_alias_when_run_again(tmp_path, monkeypatch):
    """v1 holds candidate; a run registers v2 and is killed before it moves the alias. Run again (a cache hit), v2
    was found by its digest and, candidate being held (by v1), kept it there for good: the stage's newest model
    was never served. An old version found again (a cached re-run of an old config) still leaves the alias."""
    tracker = Tracker(f"sqlite:///{tmp_path / 'm.db'}", "killed-alias", tmp_path / "artifacts")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    register = lambda digest: tracker.register_model(tracker.start_run("ppo", {}), model_dir, "p", "candidate",  # noqa
                                                     tags={"rlhf.digest": digest})
    assert register("a" * 64) == 1
    with monkeypatch.context() as m:
        def killed(*args):
            raise KeyboardInterrupt("killed")

        m.setattr(tracker.client, "set_registered_model_alias", killed)
        with pytest.raises(KeyboardInterrupt):
            register("b" * 64)
    assert int(tracker.aliased_version("p", "candidate").version) == 1
    assert register("b" * 64) == 2
    aliased = tracker.aliased_version("p", "candidate")
    assert int(aliased.version) == 2 and "rlhf.alias_pending" not in aliased.tags
    assert register("a" * 64) == 1 and int(tracker.aliased_version("p", "candidate").version) == 2


def test_no_secret_reaches_the_logged_model_or_the_version(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'm.db'}", "secrets", tmp_path / "artifacts")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    version = tracker.register_model(tracker.start_run("ppo", {}), model_dir, "keyed", "candidate",
                                     tags={"rlhf.digest": "e" * 64, "judge.api_key": "sk-tag"},
                                     params={"http": {"api_key": "sk-param"}, "config_digest": "c"})
    registered = tracker.client.get_model_version("keyed", version)
    model = tracker.client.get_logged_model(registered.source.removeprefix("models:/"))
    shown = json.dumps([registered.tags, model.tags, model.params])
    assert "sk-" not in shown and model.params == {"config_digest": "c"}


PROMPTS = ["What is 2+3?", "Compute 4-1. Be polite."]


@pytest.mark.parametrize("stage", list(MODELS))
def test_each_registered_model_loads_and_predicts_as_an_mlflow_pyfunc(rounds, stage, monkeypatch):
    """`mlflow.pyfunc.load_model("models:/<name>@candidate")` gives the stage's model: the reward model scores as the
    pipeline scores (the round's max_length), a policy answers as greedy generation does (the round's
    max_new_tokens); the signature names the columns and parameters."""
    import mlflow
    import pandas as pd

    from rlhf_core.generation.sampler import sample_batch
    from rlhf_core.models import format_query, load_policy, load_tokenizer
    from rlhf_core.reward.model import RewardModel, score_texts

    summary = rounds["miss"]
    ref = ArtifactRef(**summary["artifacts"][stage])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", summary["mlflow"]["tracking_uri"])
    model = mlflow.pyfunc.load_model(f"models:/{MODELS[stage]}@candidate")
    params = {p.name: p.default for p in model.metadata.get_params_schema().params}
    tokenizer = load_tokenizer(ref.path)
    if stage == "reward":
        responses = [" It is 5.", " Sure! It is 4."]
        assert model.metadata.get_input_schema().input_names() == ["prompt", "response"]
        assert params == {"max_length": 96, "batch_size": 64}
        got = model.predict(pd.DataFrame({"prompt": PROMPTS, "response": responses}))
        direct = score_texts(RewardModel.load(ref.path), tokenizer, PROMPTS, responses, max_length=96)
        assert got.columns.tolist() == ["reward"] and got["reward"].tolist() == pytest.approx(direct.tolist(), abs=1e-6)
        with pytest.raises(Exception, match="response"):  # a request without the response column is refused
            model.predict(pd.DataFrame({"prompt": PROMPTS}))
    else:
        assert model.metadata.get_input_schema().input_names() == ["prompt"]
        assert params["max_new_tokens"] == (12 if stage == "ppo" else 24) and params["temperature"] == 0.0
        got = model.predict(pd.DataFrame({"prompt": PROMPTS}))
        direct = sample_batch(load_policy(ref.path), tokenizer, [format_query(tokenizer, p) for p in PROMPTS],
                              params["max_new_tokens"], temperature=0.0).texts
        assert got["response"].tolist() == direct
        shorter = model.predict(pd.DataFrame({"prompt": PROMPTS}), params={"max_new_tokens": 2})["response"]
        assert all(len(tokenizer(s, add_special_tokens=False).input_ids) <= 2 for s in shorter)
        # sampled, a row's response depends on its seed and place, not on the batch it was drawn in
        three = pd.DataFrame({"prompt": PROMPTS + ["What is 1+1?"]})
        sampled = {b: model.predict(three, params={"temperature": 1.0, "seed": 3, "batch_size": b})["response"]
                   .tolist() for b in (1, 3)}
        assert sampled[1] == sampled[3]
        huge = model.predict(three, params={"temperature": 1.0, "seed": 2**45, "batch_size": 3})["response"]
        assert len(huge) == 3  # any seed the signature takes (it overflowed torch's signed 64-bit seed)


def test_a_registered_model_is_served_by_its_own_copy_of_the_code_in_a_fresh_process(rounds, tmp_path):
    """The code/ folder the MLmodel names is what a serving process imports (not an installed rlhf_core)."""
    import subprocess
    import sys

    summary = rounds["miss"]
    script = ("import sys, mlflow, pandas as pd; m = mlflow.pyfunc.load_model(sys.argv[1]); import rlhf_core; "
              "print(rlhf_core.__file__); print(m.predict(pd.DataFrame({'prompt': ['What is 2+3?'], "
              "'response': [' It is 5.']}))['reward'][0])")
    env = {"MLFLOW_TRACKING_URI": summary["mlflow"]["tracking_uri"], "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script, f"models:/{MODELS['reward']}@candidate"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    module_file, reward = done.stdout.split()[-2:]
    assert "/code/rlhf_core/__init__.py" in module_file and "site-packages" not in module_file
    from rlhf_core.models import load_tokenizer
    from rlhf_core.reward.model import RewardModel, score_texts

    ref = ArtifactRef(**summary["artifacts"]["reward"])
    direct = score_texts(RewardModel.load(ref.path), load_tokenizer(ref.path), ["What is 2+3?"], [" It is 5."], 96)
    assert float(reward) == pytest.approx(float(direct[0]), abs=1e-5)


def test_a_version_registered_before_models_were_pyfuncs_gets_one_on_its_next_cache_hit(rounds, tmp_path,
                                                                                        monkeypatch):
    import mlflow

    ref = ArtifactRef(**rounds["miss"]["artifacts"]["reward"])
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    tracker = Tracker(uri, "legacy", tmp_path / "artifacts")
    tags = {"rlhf.digest": ref.digest, "rlhf.stage": "reward"}
    tracker.register_model(tracker.start_run("reward", {}), Path(ref.path), "legacy-rm", "candidate", tags=tags)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(Exception, match="MLmodel"):
        mlflow.pyfunc.load_model("models:/legacy-rm/1")
    pyfunc = {"kind": "reward_model", "max_length": 96}
    assert tracker.register_model(tracker.start_run("reward", {}), Path(ref.path), "legacy-rm", "candidate",
                                  tags=tags, pyfunc=pyfunc) == 1  # the same version, now a pyfunc
    scored = mlflow.pyfunc.load_model("models:/legacy-rm/1").predict([{"prompt": "1+1", "response": " 2"}])
    assert scored.shape == (1, 1)


def test_a_pyfunc_request_it_cannot_read_is_refused_with_what_to_send(tmp_path):
    from rlhf_core.serving import POLICY_DEFAULTS, _rows, _settings

    assert _rows(["a", "b"], ("prompt",))["prompt"].tolist() == ["a", "b"]
    assert _rows([{"prompt": "p", "response": "r"}], ("prompt", "response")).shape == (1, 2)
    with pytest.raises(ValueError, match="no column 'response': send a table with the columns prompt, response"):
        _rows({"prompt": ["p"]}, ("prompt", "response"))
    with pytest.raises(ValueError, match="column 'prompt' must hold text"):
        _rows({"prompt": [3]}, ("prompt",))
    with pytest.raises(ValueError, match="unknown parameter max_tokens: this model takes batch_size, max_new_tokens"):
        _settings(POLICY_DEFAULTS, {"max_tokens": 3})
    assert isinstance(_settings(POLICY_DEFAULTS, {"temperature": 1})["temperature"], float)
    assert isinstance(_settings(POLICY_DEFAULTS, {"max_new_tokens": 4.0})["max_new_tokens"], int)
    with pytest.raises(ValueError, match=r"out of range: batch_size 0 \(at least 1\); top_p 1.5 \(in \(0, 1\]\)"):
        _settings(POLICY_DEFAULTS, {"batch_size": 0, "top_p": 1.5})
