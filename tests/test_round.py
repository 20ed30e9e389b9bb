"""End to end: `rlhf_round` on the miniature config through a real Prefect API and a real MLflow store.

Reads back what MLflow recorded (parent run, one nested run per stage, inputs with digests,
registered models) and checks that an identical second run is served from the cache.
"""

import math
import re
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from rlhf_core.config import load_config

CONFIG = Path(__file__).parents[1] / "configs" / "mini.yaml"
STAGES = {"world", "sft", "sample", "generate", "annotators", "import_annotations", "vote", "denoise", "reward",
          "ppo", "evaluate"}


@pytest.fixture(scope="module")
def two_rounds(prefect_api, tmp_path_factory):
    from flows.round import rlhf_round

    workdir = tmp_path_factory.mktemp("round")
    cfg = load_config(CONFIG, overrides=[f"workdir={workdir}"])
    first = rlhf_round(config=cfg)
    second = rlhf_round(config=cfg)
    return cfg, first, second


def _children(client, run_id):
    exp = client.get_run(run_id).info.experiment_id
    return client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{run_id}'")


def test_parent_and_nested_runs(two_rounds):
    cfg, first, _ = two_rounds
    client = MlflowClient(first["mlflow"]["tracking_uri"])
    assert first["mlflow"]["tracking_uri"].startswith("sqlite:///") and "mlflow.db" in first["mlflow"]["tracking_uri"]
    parent = client.get_run(first["mlflow"]["run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["prefect.flow_run_id"] == first["prefect_flow_run_id"] != ""
    # a server that outlives the round (here the test's): the run links to the flow run's page
    assert parent.data.tags["prefect.flow_run_url"].endswith(f"/flow-run/{first['prefect_flow_run_id']}")
    assert parent.data.params["ppo.kl_coef"] == str(cfg.ppo.kl_coef)
    children = _children(client, parent.info.run_id)
    assert {r.data.tags["rlhf.stage"] for r in children} == STAGES and len(children) == len(STAGES)
    assert all(r.data.tags["rlhf.cache"] == "miss" and r.info.status == "FINISHED" for r in children)
    assert all(r.data.tags["rlhf.device"].startswith("cpu: ") for r in children)  # where each stage ran
    assert all(r.data.tags["prefect.task_run_id"] for r in children)
    # the code that ran: the commit in MLflow's own tag (the UI's Version column), ".dirty" when files were changed
    from tasks.common import git_state

    sha, dirty = git_state()
    assert sha and all(r.data.tags["mlflow.source.git.commit"] == sha for r in [parent, *children])
    assert parent.data.tags["rlhf.code_version"].endswith(sha[:7] + (".dirty" if dirty else ""))
    sft = next(r for r in children if r.data.tags["rlhf.stage"] == "sft").data.metrics
    assert 0.0 <= sft["sft/probe/top1_correct"] <= 1.0  # how sharply the policy the reward models start from knows
    assert math.isfinite(sft["sft/probe/gap_right_vs_off1"]) and math.isfinite(sft["sft/probe/gap_off1_vs_off2"])


def test_inputs_logged_with_full_content_digests(two_rounds):
    _, first, _ = two_rounds
    client = MlflowClient(first["mlflow"]["tracking_uri"])
    vote = next(r for r in _children(client, first["mlflow"]["run_id"]) if r.data.tags["rlhf.stage"] == "vote")
    datasets = {d.dataset.name: d.dataset for d in vote.inputs.dataset_inputs}
    comparisons_digest = first["artifacts"]["import_annotations"]["digest"]
    assert datasets["comparisons/comparisons"].digest == comparisons_digest[:36]
    assert vote.data.tags["rlhf.input.policy"] == f"policy:{first['artifacts']['sft']['digest']}"
    # the data the stage reads, not a model's own files (the SFT policy's demonstrations) nor the refused rows
    assert "comparisons/quarantine" not in datasets and not any(n.startswith("policy/") for n in datasets)
    assert all(not d.dataset.name.startswith("policy/")
               for r in _children(client, first["mlflow"]["run_id"]) for d in r.inputs.dataset_inputs)


def test_models_registered_and_reload_with_transformers(two_rounds, tmp_path):
    import mlflow
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from rlhf_core.models import build_tokenizer

    _, first, _ = two_rounds
    uri = first["mlflow"]["tracking_uri"]
    client = MlflowClient(uri, registry_uri=uri)
    for name, loader in [("rlhf-reward-model", AutoModelForSequenceClassification),
                         ("rlhf-policy", AutoModelForCausalLM)]:
        version = client.get_model_version_by_alias(name, "candidate")
        files = client.get_model_version_download_uri(name, version.version)  # its logged model's files
        local = mlflow.artifacts.download_artifacts(artifact_uri=files, dst_path=str(tmp_path / name),
                                                    tracking_uri=uri)
        model = loader.from_pretrained(local)
        assert sum(p.numel() for p in model.parameters()) > 0
        tokenizer = AutoTokenizer.from_pretrained(local)  # plain transformers, no project code
        assert tokenizer("Q: 1+1\nA:", add_special_tokens=False).input_ids == \
               build_tokenizer()("Q: 1+1\nA:", add_special_tokens=False).input_ids != []


def test_a_model_is_registered_once_per_digest_and_again_after_a_kill_lost_it(two_rounds):
    """The second (cached) round registers nothing new; a round whose registration was lost (killed after
    the cache entry was written, here: the registered model deleted) registers it on the cache hit."""
    from flows.round import rlhf_round

    cfg, first, second = two_rounds
    uri = first["mlflow"]["tracking_uri"]
    client = MlflowClient(uri, registry_uri=uri)
    versions = client.search_model_versions("name = 'rlhf-policy'")
    digests = [v.tags["rlhf.digest"] for v in versions]
    assert len(digests) == len(set(digests)) and first["artifacts"]["ppo"]["digest"] in digests
    client.delete_registered_model("rlhf-policy")
    third = rlhf_round(config=cfg)
    candidate = client.get_model_version_by_alias("rlhf-policy", "candidate")
    assert candidate.tags["rlhf.digest"] == third["artifacts"]["ppo"]["digest"] == first["artifacts"]["ppo"]["digest"]
    assert len(client.search_model_versions("name = 'rlhf-policy'")) == 1
    # a cached stage shows its output tables as a miss does
    vote = next(r for r in _children(client, third["mlflow"]["run_id"]) if r.data.tags["rlhf.stage"] == "vote")
    assert vote.data.tags["rlhf.cache"] == "hit"
    assert any(f.path.endswith(".parquet") for f in client.list_artifacts(vote.info.run_id, "outputs"))
    # ... and the labels themselves: the annotators' export, kept in a sub-folder of the artifact
    annotators = next(r for r in _children(client, third["mlflow"]["run_id"])
                      if r.data.tags["rlhf.stage"] == "annotators")
    assert [f.path for f in client.list_artifacts(annotators.info.run_id, "outputs/exports")] == [
        "outputs/exports/00-simulated-label-studio.json"]


def test_runs_a_killed_round_left_running_are_closed_by_the_next_round(two_rounds):
    """The next round closes what the killed holder of the workdir's lock noted as its own (its flow runs, and the
    MLflow runs tagged with them), not every run of the workdir's path: on a shared MLflow or Prefect server, the
    same absolute path may be another machine's (pod's) live round."""
    from prefect import get_client
    from prefect.states import Crashed, Running

    from flows.round import rlhf_round
    from tasks.tracking import Tracker

    cfg, first, _ = two_rounds
    uri, workdir = first["mlflow"]["tracking_uri"], str(Path(cfg.workdir).resolve())
    with get_client(sync_client=True) as prefect:  # a flow run a SIGKILLed round left RUNNING, and a live one's
        flow_runs = {name: prefect.create_flow_run(rlhf_round, name=name, state=Running(),
                                                   parameters={"config": {"workdir": workdir}})
                     for name in ("killed", "same path, another machine")}
    tracker = Tracker(uri, cfg.experiment)
    orphan, live = (tracker.start_run("ppo", {"rlhf.workdir": workdir, "prefect.flow_run_id": str(flow_runs[n].id)})
                    for n in ("killed", "same path, another machine"))  # RUNNING, as a SIGKILLed stage leaves it
    (Path(workdir) / ".round.lock").write_text(f"pid 1 on elsewhere; prefect flow runs {flow_runs['killed'].id}")
    half_written = Path(cfg.workdir) / "artifacts" / ".staging" / "tmpkilled"
    half_written.mkdir(parents=True)
    (half_written / "responses.parquet").write_bytes(b"PAR1 half")
    summary = rlhf_round(config=cfg, stop_after="world")
    assert not half_written.exists()
    client = MlflowClient(uri)
    assert client.get_run(orphan).info.status == "KILLED"
    assert client.get_run(live).info.status == "RUNNING"  # not the killed holder's: left alone
    assert client.get_run(summary["mlflow"]["run_id"]).info.status == "FINISHED"
    with get_client(sync_client=True) as prefect:
        states = {name: prefect.read_flow_run(run.id).state for name, run in flow_runs.items()}
        assert states["killed"].is_crashed() and states["same path, another machine"].is_running()
        assert prefect.read_flow_run(summary["prefect_flow_run_id"]).state.is_completed()
        prefect.set_flow_run_state(flow_runs["same path, another machine"].id, Crashed(), force=True)
    tracker.end_run(live)


def test_a_killed_rounds_flow_runs_are_found_by_the_lock_it_left_not_by_guessing_a_relative_workdir(two_rounds):
    """A run whose config names the workdir relative to its own directory may be another directory's live round
    (one Prefect server, two checkouts, both `rlhf-runs`): it was marked CRASHED while it ran. Now a round closes
    the flow runs its killed predecessor noted in the workdir's lock, and only those."""
    import os

    from prefect import get_client
    from prefect.states import Crashed, Running

    from flows.round import rlhf_round

    cfg, _, _ = two_rounds
    workdir = Path(cfg.workdir).resolve()
    with get_client(sync_client=True) as prefect:
        runs = {name: prefect.create_flow_run(rlhf_round, name=name, state=Running(),
                                              parameters={"config": {"workdir": os.path.relpath(workdir)}})
                for name in ("killed, noted in the lock", "another directory's, relative")}
    # as a SIGKILLed holder leaves the lock file: its note never emptied
    killed = runs["killed, noted in the lock"].id
    (workdir / ".round.lock").write_text(f"pid 1 on elsewhere; prefect flow runs {killed}")
    rlhf_round(config=cfg, stop_after="world")
    with get_client(sync_client=True) as prefect:
        states = {name: prefect.read_flow_run(run.id).state for name, run in runs.items()}
        assert states["killed, noted in the lock"].is_crashed()
        assert states["another directory's, relative"].is_running()
        prefect.set_flow_run_state(runs["another directory's, relative"].id, Crashed(), force=True)
    assert (workdir / ".round.lock").read_text() == ""  # let go cleanly: nothing for the next round to close


def test_a_second_rlhf_rounds_in_a_busy_workdir_is_refused_before_it_touches_the_series_run(two_rounds):
    from flows.round import rlhf_rounds
    from tasks.common import WorkdirBusyError, lock_workdir

    cfg, _, _ = two_rounds
    with lock_workdir(cfg.workdir, name=".rounds.lock", what="rlhf-rounds"):
        with pytest.raises(WorkdirBusyError, match="another rlhf-rounds is running in"):
            rlhf_rounds(config=cfg, n_rounds=1)


def test_the_series_run_a_killed_rlhf_rounds_left_is_closed_by_the_next_one_and_no_other(two_rounds):
    from flows.round import SERIES_WORKDIR_TAG, rlhf_rounds
    from tasks.tracking import Tracker

    cfg, first, _ = two_rounds
    workdir = Path(cfg.workdir).resolve()
    tracker = Tracker(first["mlflow"]["tracking_uri"], cfg.experiment)
    killed, live = (tracker.start_run("rounds-x", {SERIES_WORKDIR_TAG: str(workdir), "prefect.flow_run_id": flow})
                    for flow in ("killed-series-flow-run", "another-machines-series-flow-run"))
    (workdir / ".rounds.lock").write_text("pid 1 on elsewhere; prefect flow runs killed-series-flow-run")
    [summary] = rlhf_rounds(config=cfg, n_rounds=1)
    assert tracker.client.get_run(killed).info.status == "KILLED"
    assert tracker.client.get_run(live).info.status == "RUNNING"
    assert summary["artifacts"]["ppo"] == first["artifacts"]["ppo"]
    assert (workdir / ".rounds.lock").read_text() == ""
    tracker.end_run(live)


@pytest.mark.parametrize("method", ["baseline", "flip", "margin", "flip_margin", "soft_label_margin"])
def test_every_denoise_method_commits_through_the_stage_and_reads_back(two_rounds, method):
    """Three of the five methods flip nothing, so flip precision is NaN: its manifest once held null, and the stage
    failed on its own artifact, then on every cache hit of it."""
    from flows.round import rlhf_round
    from rlhf_core.artifacts import ArtifactRef, ArtifactStore

    cfg, _, _ = two_rounds
    cfg = cfg.model_copy(update={"denoise": cfg.denoise.model_copy(update={"method": method})})
    for _ in range(2):  # made, then served from the cache
        ref = ArtifactRef(**rlhf_round(config=cfg, stop_after="denoise")["artifacts"]["denoise"])
    metrics = ArtifactStore(Path(cfg.workdir) / "artifacts").manifest(ref).metrics
    assert all(math.isfinite(v) for v in metrics.values()) and metrics
    assert ("denoise/flip_precision_excl_gold_ties" in metrics) == (method in ("flip", "flip_margin"))


def test_headline_numbers_are_real(two_rounds):
    _, first, _ = two_rounds
    h = first["headline"]
    assert 0.0 <= h["annotator agreement with gold"] <= 1.0
    assert 0.0 <= h["RM accuracy vs gold (held-out)"] <= 1.0
    rates = h["judged win rate vs SFT"] + h["judged tie rate vs SFT"] + h["judged lose rate vs SFT"]
    assert rates == pytest.approx(1.0)
    assert h["KL(new policy || SFT)"] is not None and h["pairs in total"] > 0
    parent = MlflowClient(first["mlflow"]["tracking_uri"]).get_run(first["mlflow"]["run_id"]).data.metrics
    assert parent["headline/eval/policy/kl_to_sft"] == pytest.approx(h["KL(new policy || SFT)"])
    assert not [k for k in parent if k.startswith("headline/") and not re.fullmatch(r"[\w/.\-]+", k)]  # none mangled
    # Part II's measurements reach the summary (values are noise at this size; tables in docs/reward-modelling.md)
    for key in ("voters' gold accuracy", "gold agreement before denoising", "gold agreement after denoising",
                "RM accuracy vs gold (held-out), raw labels"):
        assert 0.0 <= h[key] <= 1.0, key
    # NaN when nothing was flipped; absent when the 8 held-out prompts gave no correctness-only pair
    for key in ("flip precision", "RM accuracy, correctness-only pairs"):
        assert h[key] is None or math.isnan(h[key]) or 0.0 <= h[key] <= 1.0, key
    # real: recomputed from the artifacts the round wrote, not only in range
    import pandas as pd

    from rlhf_core.sim.metrics import gold_agreement_of_pairs

    pairs = pd.read_parquet(Path(first["artifacts"]["import_annotations"]["path"]) / "comparisons.parquet")
    denoised = pd.read_parquet(Path(first["artifacts"]["denoise"]["path"]) / "denoised.parquet")
    assert h["pairs in total"] == len(pairs) == len(denoised)
    assert h["annotator agreement with gold"] == pytest.approx(gold_agreement_of_pairs(pairs))
    assert h["gold agreement after denoising"] == pytest.approx(gold_agreement_of_pairs(denoised))


def test_second_identical_round_is_served_from_cache(two_rounds):
    _, first, second = two_rounds
    assert {k: v["digest"] for k, v in first["artifacts"].items()} == \
           {k: v["digest"] for k, v in second["artifacts"].items()}
    client = MlflowClient(second["mlflow"]["tracking_uri"])
    children = _children(client, second["mlflow"]["run_id"])
    assert {r.data.tags["rlhf.stage"] for r in children} == STAGES
    assert all(r.data.tags["rlhf.cache"] == "hit" for r in children)
    # each hit names the run that made its artifact, and where that ran
    made = {r.data.tags["rlhf.stage"]: r for r in _children(client, first["mlflow"]["run_id"])}
    for run in children:
        maker = made[run.data.tags["rlhf.stage"]]
        assert run.data.tags["rlhf.made_by.run_id"] == maker.info.run_id
        assert run.data.tags["rlhf.made_by.device"] == maker.data.tags["rlhf.device"]
    # a cached stage still shows the metrics its artifact was made with
    reward = next(r for r in children if r.data.tags["rlhf.stage"] == "reward")
    assert "reward/gold_accuracy_heldout" in reward.data.metrics
    assert {"reward/probe/r2_number", "reward/probe/top1_correct", "reward/baseline/gold_accuracy_heldout"} <= \
        set(reward.data.metrics)
    vote = next(r for r in children if r.data.tags["rlhf.stage"] == "vote")
    assert "voting/gold_agreement_excl_gold_ties/decile_01" in vote.data.metrics
    voters = [vote.data.metrics[f"voting/voter_gold_accuracy_excl_gold_ties/voter_{k:02d}"] for k in range(3)]
    assert vote.data.metrics["voting/voter_gold_accuracy_excl_gold_ties"] == pytest.approx(np.mean(voters))
    # ... and the plots the miss logged
    plots = {Path(f.path).name for f in client.list_artifacts(vote.info.run_id, "plots")}
    assert {"preference_strength.png", "strength_std_by_group.png"} <= plots


def test_prefect_recorded_the_flow_and_its_tasks(two_rounds):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    _, first, _ = two_rounds
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(first["prefect_flow_run_id"])
        assert run.state.is_completed()
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    assert {t.name.split("-")[0] for t in tasks} >= {"world", "sft", "sample", "generate", "vote", "ppo"}


def test_iterated_rounds_train_round_2_from_round_1s_policy(two_rounds):
    """Round 2 samples new prompts, generates with round 1's policy and starts PPO from it."""
    from flows.round import rlhf_rounds
    from rlhf_core.artifacts import ArtifactStore

    cfg, first, _ = two_rounds
    r1, r2 = rlhf_rounds(config=cfg, n_rounds=2)
    assert r1["artifacts"]["ppo"]["digest"] == first["artifacts"]["ppo"]["digest"]  # round 1 from cache
    store = ArtifactStore(Path(cfg.workdir) / "artifacts")
    round1_policy = r1["artifacts"]["ppo"]["digest"]
    inputs = {stage: {i.name: i.digest for i in store.manifest(store.find(a["kind"], a["digest"])).inputs}
              for stage, a in r2["artifacts"].items()}
    assert inputs["generate"]["policy"] == round1_policy and inputs["ppo"]["policy"] == round1_policy
    assert r2["artifacts"]["sample"]["digest"] != r1["artifacts"]["sample"]["digest"]  # new prompts
    assert r2["artifacts"]["sft"] == r1["artifacts"]["sft"]
    client = MlflowClient(r2["mlflow"]["tracking_uri"])
    assert client.get_run(r2["mlflow"]["run_id"]).data.tags["rlhf.round_no"] == "2"


def test_generation_stage_launches_two_worker_ranks(prefect_api, tmp_path):
    """generation.num_processes=2: the task launches an accelerate group of 2 CPU ranks."""
    from flows.round import rlhf_round
    from rlhf_core.artifacts import ArtifactStore
    from rlhf_core.schemas import read_table

    cfg = load_config(CONFIG, overrides=[f"workdir={tmp_path}", "generation.num_processes=2",
                                         "generation.shard_size=8"])
    summary = rlhf_round(config=cfg, stop_after="generate")
    store = ArtifactStore(tmp_path / "artifacts")
    ref = store.find("responses", summary["artifacts"]["generate"]["digest"])
    metrics = store.manifest(ref).metrics
    assert metrics["generation/world_size"] == 2 and metrics["generation/n_shards"] == 3  # 24 prompts / 8
    responses = read_table("responses", ref.file("responses.parquet"))
    assert responses["prompt_id"].nunique() == cfg.sampling.n_samples
    assert not any((tmp_path / "scratch").iterdir())  # committed: the shards are gone


def test_vote_on_two_worker_ranks_and_metarm_on_the_rounds_responses(prefect_api, tmp_path):
    """voting.num_processes=2 runs the voters as 2 ranks; MetaRM's reward stage takes the round's responses."""
    from flows.round import rlhf_round

    cfg = load_config(CONFIG, overrides=[f"workdir={tmp_path}", "voting.num_processes=2",
                                         "reward.train.meta.enabled=true", "reward.train.meta.samples_per_prompt=2"])
    summary = rlhf_round(config=cfg, stop_after="reward")
    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    runs = {r.data.tags["rlhf.stage"]: r for r in _children(client, summary["mlflow"]["run_id"])}
    assert runs["vote"].data.metrics["voting/world_size"] == 2
    assert runs["reward"].data.tags["rlhf.input.responses"] == f"responses:{summary['artifacts']['generate']['digest']}"
    assert 0.5 <= runs["reward"].data.metrics["reward/meta_difference"] < 1.0
    assert runs["reward"].data.params["reward.train.meta.enabled"] == "True"
    assert runs["vote"].data.params["execution.num_processes"] == "2"
    # the number of ranks is not part of the cache key: one rank reuses the 2-rank votes
    again = rlhf_round(config=cfg.model_copy(update={"voting": cfg.voting.model_copy(update={"num_processes": 1})}),
                       stop_after="vote")
    vote = next(r for r in _children(client, again["mlflow"]["run_id"]) if r.data.tags["rlhf.stage"] == "vote")
    assert vote.data.tags["rlhf.cache"] == "hit" and again["artifacts"]["vote"] == summary["artifacts"]["vote"]


def test_killed_ppo_stage_resumes_from_its_checkpoint(two_rounds, monkeypatch):
    """PPO killed in iteration 2 of 0..3 with a checkpoint after iteration 1: the re-run resumes from it (iterations
    2 and 3 trained again), and the stage's MLflow run still holds every iteration's curve (the checkpointed ones
    replayed). (Killed in iteration 3, the run would already have checkpointed all four: nothing left to resume.)"""
    import tasks.ppo
    from flows.round import rlhf_round

    cfg = load_config(CONFIG, overrides=[f"workdir={two_rounds[0].workdir}", "ppo.iterations=4",
                                         "ppo.checkpoint_every=2"])
    real_train_ppo, calls, resumed = tasks.ppo.train_ppo, [], []

    def train_ppo(*args, on_iteration, checkpoint_dir, kill_at=None, **kwargs):
        calls.append((Path(checkpoint_dir) / "checkpoint.pt").exists())

        def hook(m):
            if m["iteration"] == kill_at:
                raise RuntimeError("killed")
            on_iteration(m)
        return real_train_ppo(*args, on_iteration=hook, checkpoint_dir=checkpoint_dir, on_resume=resumed.append,
                              **kwargs)

    monkeypatch.setattr(tasks.ppo, "train_ppo", lambda *a, **kw: train_ppo(*a, kill_at=2, **kw))
    with pytest.raises(Exception, match="killed"):
        rlhf_round(config=cfg, stop_after="ppo")
    monkeypatch.setattr(tasks.ppo, "train_ppo", train_ppo)
    summary = rlhf_round(config=cfg, stop_after="ppo")
    assert calls == [False, True]  # the first run started fresh, the re-run found the checkpoint
    assert resumed == [2]  # and restored its 2 iterations instead of training them again
    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    ppo = next(r for r in _children(client, summary["mlflow"]["run_id"]) if r.data.tags["rlhf.stage"] == "ppo")
    assert ppo.info.status == "FINISHED" and ppo.data.tags["rlhf.cache"] == "miss"
    gold = client.get_metric_history(ppo.info.run_id, "objective/gold")
    assert sorted(m.step for m in gold) == [0, 1, 2, 3] and all(math.isfinite(m.value) for m in gold)
    assert ppo.data.metrics["ppo/gold_last"] == pytest.approx(next(m.value for m in gold if m.step == 3))
    assert not any((Path(cfg.workdir) / "scratch").iterdir())  # committed: the checkpoint is gone


def test_gpu_check_reproduces_the_round_on_this_machine(two_rounds, tmp_path):
    """infra/gpu_check.py, the check of the training stages on a GPU, run here on the mini round: the reward
    worker trains the round's own model (to the bit, and as the in-process training does), its voters give
    the round's votes, and PPO runs through its worker. On a GPU the same numbers are compared, not equal."""
    import json
    import subprocess
    import sys

    root = Path(__file__).parents[1]
    check = [sys.executable, str(root / "infra" / "gpu_check.py")]
    subprocess.run([*check, "prepare", "--round", two_rounds[0].workdir, "--config", str(CONFIG),
                    "--out", str(tmp_path / "inputs")], check=True)
    subprocess.run([*check, "run", "--inputs", str(tmp_path / "inputs"), "--out", str(tmp_path / "check.json"),
                    "--voters", "2", "--ppo-iterations", "2"], check=True)
    result = json.loads((tmp_path / "check.json").read_text())
    assert result["device_type"] == "cpu"
    import transformers

    assert result["transformers"] == transformers.__version__  # the device image's versions differ: say which ran
    worker, in_process = result["reward_worker"], result["reward_in_process"]
    assert worker["gold_heldout"]["all"] == worker["round_gold_heldout"]
    assert in_process["max_abs_weight_diff_vs_worker"] == 0.0 and in_process["gold_heldout"] == worker["gold_heldout"]
    assert result["vote_worker"]["sign_agreement_vs_round"] == 1.0
    assert result["vote_worker"]["spearman_mean_vs_round"] == pytest.approx(1.0)
    assert result["ppo_worker"]["iterations"] == 2
