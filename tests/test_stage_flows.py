"""`rlhf-stage`: one heavy stage alone on chosen input artifacts, through a real Prefect API and MLflow store.

The stage flow calls the round's own stage (flows/stages.py), so on the round's inputs it makes the artifact
the round makes: the round run afterwards is served from the cache with the same digest.
"""

from pathlib import Path

import pytest
from mlflow import MlflowClient
from prefect import get_client

from flows.stages import find_artifact
from rlhf_core.artifacts import ArtifactStore
from rlhf_core.config import ConfigError, load_config

CONFIG = Path(__file__).parents[1] / "configs" / "mini.yaml"


@pytest.fixture(scope="module")
def round_to_vote(prefect_api, tmp_path_factory):
    from flows.round import rlhf_round

    workdir = tmp_path_factory.mktemp("stage-flows")
    cfg = load_config(CONFIG, overrides=[f"workdir={workdir}", "voting.n_models=2"])
    return cfg, rlhf_round(config=cfg, stop_after="vote")


def test_denoise_alone_on_the_rounds_votes_makes_what_the_round_makes(round_to_vote):
    from flows.round import rlhf_round
    from flows.stages import rlhf_stage

    cfg, first = round_to_vote
    votes = first["artifacts"]["vote"]
    # pairs not given: the round's, from its cache (rlhf_round runs as a subflow to find them)
    state = rlhf_stage(stage="denoise", inputs={"vote": f"votes:{votes['digest']}"}, config=cfg, return_state=True)
    alone = state.result()
    with get_client(sync_client=True) as client:  # the subflow did not take its live parent for a killed run
        history = client.read_flow_run_states(state.state_details.flow_run_id)
    assert [h.type.value for h in history if h.type.value == "CRASHED"] == [] and history[-1].type.value == "COMPLETED"
    assert alone["inputs"]["pairs"]["digest"] == first["artifacts"]["import_annotations"]["digest"]
    assert alone["artifact"]["kind"] == "denoised"

    again = rlhf_round(config=cfg, stop_after="denoise")
    assert again["artifacts"]["denoise"]["digest"] == alone["artifact"]["digest"]
    client = MlflowClient(again["mlflow"]["tracking_uri"])
    denoise_run = client.search_runs(
        [client.get_run(again["mlflow"]["run_id"]).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{again['mlflow']['run_id']}' and tags.`rlhf.stage` = 'denoise'")
    assert [r.data.tags["rlhf.cache"] for r in denoise_run] == ["hit"]  # the stage flow made it


def test_an_input_of_the_wrong_kind_is_refused_before_any_work(round_to_vote):
    from flows.stages import rlhf_stage

    cfg, first = round_to_vote
    pairs = first["artifacts"]["import_annotations"]
    with pytest.raises(ConfigError, match=r"inputs\.vote: stage denoise reads a votes artifact as vote, and .* is a "
                                          r"comparisons artifact .*give the output of stage vote"):
        rlhf_stage(stage="denoise", inputs={"vote": pairs["path"]}, config=cfg)
    with pytest.raises(ConfigError, match="stage denoise reads pairs, vote; it has no input reward"):
        rlhf_stage(stage="denoise", inputs={"reward": f"votes:{first['artifacts']['vote']['digest']}"}, config=cfg)


def test_an_artifact_is_found_by_kind_digest_prefix_or_directory(round_to_vote):
    cfg, first = round_to_vote
    store = ArtifactStore(Path(cfg.workdir) / "artifacts")
    votes = first["artifacts"]["vote"]
    by_prefix = find_artifact(votes["digest"][:12], "vote", store)
    by_path = find_artifact(votes["path"], "vote", store)
    assert by_prefix.model_dump() == by_path.model_dump() == votes
    with pytest.raises(ConfigError, match="no artifact matching 'votes:000000000000'"):
        find_artifact("votes:000000000000", "vote", store)
    with pytest.raises(ConfigError, match="neither kind:digest, a digest"):
        find_artifact("votes", "vote", store)


def test_a_given_input_whose_bytes_changed_since_its_commit_is_refused(round_to_vote):
    import shutil

    cfg, first = round_to_vote
    store = ArtifactStore(Path(cfg.workdir) / "artifacts")
    copy = Path(cfg.workdir) / "edited-votes"  # a copy of the votes artifact, edited by hand
    shutil.copytree(first["artifacts"]["vote"]["path"], copy)
    assert find_artifact(str(copy), "vote", store).digest == first["artifacts"]["vote"]["digest"]
    [table] = [p for p in copy.glob("*.parquet")]
    table.write_bytes(table.read_bytes()[:-1] + b"!")
    with pytest.raises(ConfigError, match=rf"inputs\.vote: votes:\w{{12}} at .*edited-votes changed since it was "
                                          rf"committed \({table.name}: changed .*rlhf verify <workdir> --remove"):
        find_artifact(str(copy), "vote", store)


def test_a_stage_without_gold_is_not_served_the_one_with_gold(round_to_vote):
    """`simulated` decides whether the vote and denoise stages add gold metrics, so it is part of their keys: a hit
    reports what a miss would (each execution has its own artifact, so its own manifest's metrics)."""
    from rlhf_core.artifacts import ArtifactRef
    from tasks.common import RunContext
    from tasks.denoise import denoise_pairs
    from tasks.tracking import Tracker
    from tasks.voting import vote_strength

    cfg, first = round_to_vote
    art = {name: ArtifactRef(**first["artifacts"][name]) for name in ("import_annotations", "vote", "sft")}
    tracker = Tracker(first["mlflow"]["tracking_uri"], cfg.experiment)
    ctx = RunContext(workdir=cfg.workdir, tracking_uri=first["mlflow"]["tracking_uri"], experiment=cfg.experiment,
                     parent_run_id=tracker.start_run("no-gold", {}), round_name="no-gold")
    votes = vote_strength.fn(ctx, cfg.voting, art["import_annotations"], art["sft"], cfg.seed, simulated=False)
    denoise_pairs.fn(ctx, cfg.denoise, art["import_annotations"], art["vote"], simulated=False)
    # the same votes table, made again: another execution (its own key), so its own artifact and manifest
    assert Path(votes.file("votes.parquet")).read_bytes() == Path(art["vote"].file("votes.parquet")).read_bytes()
    assert votes.digest != art["vote"].digest
    assert not [k for k in ctx.store.manifest(votes).metrics if "gold" in k]
    assert [k for k in ctx.store.manifest(art["vote"]).metrics if "gold" in k]
    client = MlflowClient(first["mlflow"]["tracking_uri"])
    runs = {r.data.tags["rlhf.stage"]: r for r in client.search_runs(
        [client.get_run(first["mlflow"]["run_id"]).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{ctx.parent_run_id}'")}
    assert {stage: r.data.tags["rlhf.cache"] for stage, r in runs.items()} == {"vote": "miss", "denoise": "miss"}
    assert not [k for r in runs.values() for k in r.data.metrics if "gold" in k or "flip_precision" in k]


def test_ppo_alone_registers_its_policy_with_the_rounds_lineage_tags(round_to_vote):
    """rlhf-stage ppo registers rlhf-policy as a round's ppo does, with what it started from and its reward model."""
    from flows.stages import rlhf_stage

    cfg, _ = round_to_vote
    result = rlhf_stage(stage="ppo", config=cfg)  # every input from the round (its cache, or run now)
    client = MlflowClient(result["mlflow"]["tracking_uri"])
    version = next(v for v in client.search_model_versions("name = 'rlhf-policy'")
                   if v.tags.get("rlhf.digest") == result["artifact"]["digest"])
    assert version.tags["rlhf.start_policy.source"] == "sft"
    assert version.tags["rlhf.start_policy.digest"] == result["inputs"]["policy"]["digest"]
    assert version.tags["rlhf.reward_model.digest"] == result["inputs"]["reward"]["digest"]
    assert "rlhf.reward_model.model_version" in version.tags and "rlhf.start_policy.model_version" in version.tags
    parent = client.get_run(result["mlflow"]["run_id"]).data.tags
    assert parent["rlhf.start_policy.digest"] == result["inputs"]["policy"]["digest"]


def test_the_cli_runs_one_stage_alone_on_a_chosen_input(round_to_vote):
    """`rlhf stage denoise --input vote=votes:<digest>`: the rlhf-stage flow from the command line."""
    from typer.testing import CliRunner

    from flows.cli import app

    cfg, first = round_to_vote
    votes = first["artifacts"]["vote"]
    args = ["stage", "denoise", "--config", str(CONFIG), "--set", f"workdir={cfg.workdir}", "--set",
            "voting.n_models=2", "--input", f"vote=votes:{votes['digest']}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    store = ArtifactStore(Path(cfg.workdir) / "artifacts")
    made = [ref for ref in store.artifacts("denoised") if f"Output: denoised:{ref.digest}" in " ".join(
        result.output.split())]
    assert len(made) == 1 and votes["digest"] in {i.digest for i in store.manifest(made[0]).inputs}  # the chosen
    assert f"votes:{votes['digest'][:12]}" in result.output  # its inputs, the chosen one among them
    # refused with one line: a stage that is not heavy, an input without its name, a wrong kind
    for bad, message in ((["stage", "sample", "--input", "vote=x"], "--input runs one of import_annotations, vote, denoise"),
                         (["stage", "denoise", "--input", f"votes:{votes['digest']}"], "NAME=ARTIFACT"),
                         (args[:-1] + [f"vote={first['artifacts']['import_annotations']['path']}"],
                          "reads a votes artifact as vote")):
        refused = CliRunner().invoke(app, bad)
        assert refused.exit_code == 2 and message in " ".join(refused.output.split()), refused.output


def test_a_stage_alone_adds_gold_metrics_by_what_its_pairs_are_not_by_the_config(round_to_vote, monkeypatch):
    """`simulated` came from the config (no annotation.exports): the round's simulated pairs given under a config
    with exports lost every gold metric, and real pairs under one without failed on gold after the voters trained."""
    from flows.stages import rlhf_stage

    cfg, first = round_to_vote
    export = Path(first["artifacts"]["annotators"]["path"]) / "exports" / "00-simulated-label-studio.json"
    monkeypatch.setenv("RLHF_ALLOWED_ROOTS", str(Path(cfg.workdir).parent))
    with_exports = cfg.model_copy(update={"annotation": cfg.annotation.model_copy(update={"exports": (str(export),)})})
    pairs, votes = first["artifacts"]["import_annotations"], first["artifacts"]["vote"]
    result = rlhf_stage(stage="denoise", config=with_exports, inputs={"pairs": f"comparisons:{pairs['digest']}",
                                                                      "vote": f"votes:{votes['digest']}"})
    store = ArtifactStore(Path(cfg.workdir) / "artifacts")
    metrics = store.manifest(store.find("denoised", result["artifact"]["digest"])).metrics
    assert "denoise/flip_precision_excl_gold_ties" in metrics and store.manifest(store.find("denoised", result["artifact"][
        "digest"])).config["simulated"] is True


def test_a_stage_alone_refuses_a_continued_series_config(round_to_vote):
    from flows.stages import rlhf_stage

    cfg, first = round_to_vote
    series = cfg.model_copy(update={"iteration": cfg.iteration.model_copy(update={"continue_series": True})})
    with pytest.raises(ConfigError, match="set it false for a stage run alone"):
        rlhf_stage(stage="denoise", inputs={"vote": f"votes:{first['artifacts']['vote']['digest']}"}, config=series)


def test_an_input_that_leaves_the_store_before_the_lock_is_refused_before_any_work(round_to_vote, monkeypatch):
    """Inputs are checked before the workdir's lock is taken (the round's own are looked up under the lock of a
    round up to that stage): one collected in between (`rlhf gc`) is refused, naming it, not read half-way."""
    import shutil
    from contextlib import contextmanager

    import flows.stages
    from flows.stages import rlhf_stage

    cfg, first = round_to_vote
    copy = Path(cfg.workdir) / "votes-collected-in-between"
    shutil.copytree(first["artifacts"]["vote"]["path"], copy)
    real_lock = flows.stages.lock_workdir

    @contextmanager
    def lock_after_a_collection(*args, **kwargs):
        shutil.rmtree(copy)
        with real_lock(*args, **kwargs) as left:
            yield left

    monkeypatch.setattr(flows.stages, "lock_workdir", lock_after_a_collection)
    with pytest.raises(ConfigError, match=r"inputs: vote \(votes:\w{12}\) left the store after they were checked"):
        rlhf_stage(stage="denoise", config=cfg, inputs={"vote": str(copy)})


def test_votes_are_refused_on_comparisons_they_were_not_measured_on(round_to_vote):
    """A vote is r(chosen) - r(rejected) of its pair as then oriented; pair ids do not name an orientation, so
    votes joined to other comparisons (a re-import whose majority swapped a pair) would flip the wrong pairs."""
    import pandas as pd

    from flows.stages import rlhf_stage
    from rlhf_core.schemas import write_table

    cfg, first = round_to_vote
    pairs = pd.read_parquet(Path(first["artifacts"]["import_annotations"]["path"]) / "comparisons.parquet")
    swapped = pairs.copy()
    swapped.loc[0, ["chosen", "rejected"]] = pairs.loc[0, ["rejected", "chosen"]].to_numpy()
    swapped.loc[0, ["chosen_id", "rejected_id"]] = pairs.loc[0, ["rejected_id", "chosen_id"]].to_numpy()
    store = ArtifactStore(Path(cfg.workdir) / "artifacts")
    with store.staging() as staged:
        write_table("comparisons", swapped, staged / "comparisons.parquet")
        other = store.commit(staged, kind="comparisons", stage="import_annotations", stage_version="x",
                             code_version="t", config={}, config_digest="c", inputs={}, cache_key="re-import")
    votes = first["artifacts"]["vote"]
    with pytest.raises(ConfigError, match=rf"votes {votes['digest'][:12]} were measured on comparisons "
                                          rf"{first['artifacts']['import_annotations']['digest'][:12]}, not on the "
                                          rf"comparisons given \({other.digest[:12]}\).*vote again"):
        rlhf_stage(stage="denoise", inputs={"vote": f"votes:{votes['digest']}", "pairs": f"comparisons:{other.digest}"},
                   config=cfg)
    # votes from another workdir's store (given by path) are checked alike: their manifest says what they were
    # measured on
    import shutil

    from rlhf_core.artifacts import ArtifactRef
    from tasks.denoise import check_votes_measured_on

    elsewhere = Path(cfg.workdir).parent / "another-workdir" / "artifacts" / "votes" / votes["digest"]
    shutil.copytree(votes["path"], elsewhere)
    copied = ArtifactRef(kind="votes", digest=votes["digest"], path=str(elsewhere))
    with pytest.raises(ConfigError, match="were measured on comparisons"):
        check_votes_measured_on(copied, other)
    check_votes_measured_on(copied, ArtifactRef(**first["artifacts"]["import_annotations"]))  # its own: accepted


def test_held_out_prompts_measure_the_reward_model_on_labels_it_never_learned_from(round_to_vote, monkeypatch):
    """reward.holdout_fraction on real annotations (the round's export imported as a team's): the pairs of the held-out
    prompts are neither voted on, nor denoised, nor trained on, and the reward models' agreement with their human
    labels is logged (real annotations have no gold: without it nothing measured the reward model)."""
    from flows.round import rlhf_round
    from rlhf_core.models import load_tokenizer
    from rlhf_core.reward.holdout import held_out
    from rlhf_core.reward.model import RewardModel
    from rlhf_core.reward.train import pair_reward_diffs
    from rlhf_core.schemas import read_table

    cfg, first = round_to_vote
    export = Path(first["artifacts"]["annotators"]["path"]) / "exports" / "00-simulated-label-studio.json"
    monkeypatch.setenv("RLHF_ALLOWED_ROOTS", str(Path(cfg.workdir).parent))
    real = cfg.model_copy(update={"annotation": cfg.annotation.model_copy(update={"exports": (str(export),)}),
                                  "reward": cfg.reward.model_copy(update={"holdout_fraction": 0.3})})
    summary = rlhf_round(config=real, stop_after="reward")
    art = {name: Path(a["path"]) for name, a in summary["artifacts"].items()}
    comparisons = read_table("comparisons", art["import_annotations"] / "comparisons.parquet")
    held = held_out(comparisons["prompt"], 0.3)
    assert 0 < held.sum() < len(comparisons)
    votes = read_table("votes", art["vote"] / "votes.parquet")
    denoised = read_table("denoised", art["denoise"] / "denoised.parquet")
    assert set(votes["pair_id"]) == set(denoised["pair_id"]) == set(comparisons["pair_id"][~held])

    store = ArtifactStore(Path(cfg.workdir) / "artifacts")
    manifests = {s: store.manifest(store.find(summary["artifacts"][s]["kind"], summary["artifacts"][s]["digest"]))
                 for s in ("vote", "denoise", "reward")}
    assert manifests["vote"].config["holdout_fraction"] == manifests["denoise"].config["holdout_fraction"] == 0.3
    assert manifests["reward"].config["reward"]["holdout_fraction"] == 0.3
    unheld = store.manifest(store.find("votes", first["artifacts"]["vote"]["digest"])).config
    assert "holdout_fraction" not in unheld  # rounds that hold nothing out keep the keys they had

    labelled = comparisons[held & ~comparisons["tie"].fillna(False).to_numpy(dtype=bool)]
    model, tokenizer = RewardModel.load(art["reward"]), load_tokenizer(art["reward"])
    diffs = pair_reward_diffs(model, tokenizer, labelled, cfg.reward.train.max_length)
    metrics = manifests["reward"].metrics
    assert metrics["reward/heldout/n_pairs"] == len(labelled)
    assert metrics["reward/n_train_pairs"] == (~held).sum()
    assert metrics["reward/heldout/accuracy"] == pytest.approx(float((diffs > 0).mean()))
    assert 0.0 <= metrics["reward/baseline/heldout/accuracy"] <= 1.0  # the raw labels' model, same held-out pairs
    assert summary["headline"]["RM agreement with held-out human labels"] == metrics["reward/heldout/accuracy"]
    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    reward_run = client.search_runs(
        [client.get_run(summary["mlflow"]["run_id"]).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{summary['mlflow']['run_id']}' and tags.`rlhf.stage` = 'reward'")
    assert reward_run[0].data.metrics["reward/heldout/accuracy"] == pytest.approx(metrics["reward/heldout/accuracy"])
    from flows.stages import rlhf_stage

    no_holdout = real.model_copy(update={"reward": cfg.reward})
    with pytest.raises(ConfigError, match=r"held out the pairs of reward.holdout_fraction 0.3 of the prompts, this "
                                          r"config 0.0: vote again"):  # pair ids would differ: say why
        rlhf_stage(stage="denoise", config=no_holdout, inputs={
            "pairs": f"comparisons:{summary['artifacts']['import_annotations']['digest']}",
            "vote": f"votes:{summary['artifacts']['vote']['digest']}"})
    with pytest.raises(ConfigError, match=r"denoised pairs \w{12} held out the pairs of reward.holdout_fraction 0.3 "
                                          r"of the prompts, this config 0.0: denoise again"):
        rlhf_stage(stage="reward", config=no_holdout, inputs={
            "denoise": f"denoised:{summary['artifacts']['denoise']['digest']}"})


def test_an_export_is_imported_against_the_responses_given(round_to_vote, monkeypatch):
    """`rlhf stage import_annotations --input generate=responses:<digest>`: the labels of tasks made from responses
    the round no longer generates (other settings, or a pipeline whose response ids differ) join the artifact that
    made them. The exports are collected beside the responses given, not taken from the round, which would generate
    again first (and whose simulated crowd would label those other responses). On the round's own responses it is
    the round's import."""
    import flows.stages
    from flows.stages import rlhf_stage

    def no_round(missing, config):
        raise AssertionError(f"the round ran for {missing}")

    monkeypatch.setattr(flows.stages, "round_inputs", no_round)
    cfg, first = round_to_vote
    result = rlhf_stage(stage="import_annotations", config=cfg,
                        inputs={"generate": f"responses:{first['artifacts']['generate']['digest']}"})
    assert result["artifact"] == first["artifacts"]["import_annotations"]  # the same exports, the same responses
    assert result["inputs"]["annotators"] == first["artifacts"]["annotators"]  # collected beside them: a cache hit


def test_an_export_given_to_the_import_is_read_as_what_it_is_not_as_the_config_says(round_to_vote, monkeypatch):
    """The simulated crowd's export given under a config with exports was read as a user's, without gold metrics
    (and a user's under a config without exports as the simulated crowd's, in its format): `simulated` follows the
    export, as it follows the pairs for the later stages."""
    from flows.stages import rlhf_stage

    cfg, first = round_to_vote
    export = Path(first["artifacts"]["annotators"]["path"]) / "exports" / "00-simulated-label-studio.json"
    monkeypatch.setenv("RLHF_ALLOWED_ROOTS", str(Path(cfg.workdir).parent))
    with_exports = cfg.model_copy(update={"annotation": cfg.annotation.model_copy(update={"exports": (str(export),)})})
    result = rlhf_stage(stage="import_annotations", config=with_exports, inputs={
        "annotators": f"annotation_export:{first['artifacts']['annotators']['digest']}",
        "generate": f"responses:{first['artifacts']['generate']['digest']}"})
    store = ArtifactStore(Path(cfg.workdir) / "artifacts")
    manifest = store.manifest(store.find("comparisons", result["artifact"]["digest"]))
    assert manifest.config["simulated"] is True and "annotation/gold_agreement_excl_gold_ties" in manifest.metrics
