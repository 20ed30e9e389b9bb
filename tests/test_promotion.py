"""Promotion to rlhf-policy@champion through real rounds of the miniature config (a real Prefect API, a
real MLflow registry in a temp dir): not promoted at or below the threshold, promoted above it, and a
round that starts from the champion generates with, trains from and is judged against that very version (whether
it improves is measured, not tested: docs/iterated-rounds.md)."""

from pathlib import Path

import pytest
from mlflow import MlflowClient

from rlhf_core.artifacts import ArtifactStore
from rlhf_core.config import load_config

CONFIG = Path(__file__).parents[1] / "configs" / "mini.yaml"
TINY = ["sft.steps=20", "voting.n_models=2", "ppo.iterations=2", "ppo.critic_warmup_steps=1"]


def _config(workdir, threshold: float):
    return load_config(CONFIG, overrides=[f"workdir={workdir}", *TINY, "iteration.start_from=champion",
                                          f"iteration.promote_min_win_rate={threshold}"])


@pytest.fixture(scope="module")
def rounds(prefect_api, tmp_path_factory):
    """Round 1 with an unreachable threshold (1.0), the same round again with one below its win rate, then
    a round that starts from the champion."""
    from flows.round import rlhf_round

    workdir = tmp_path_factory.mktemp("promotion")
    kept = rlhf_round(config=_config(workdir, 1.0))
    kept["aliases"] = _aliases(kept)
    threshold = kept["promotion"]["win_rate"] / 2
    promoted = rlhf_round(config=_config(workdir, threshold))  # every stage from the cache
    promoted["aliases"] = _aliases(promoted)
    from_champion = rlhf_round(config=_config(workdir, 1.0))
    from_champion["aliases"] = _aliases(from_champion)
    return workdir, kept, promoted, from_champion


def _aliases(summary) -> dict[str, int]:
    """rlhf-policy's aliases and the versions holding them, as the round left them."""
    return dict(_client(summary).get_registered_model("rlhf-policy").aliases)


def _client(summary):
    uri = summary["mlflow"]["tracking_uri"]
    return MlflowClient(uri, registry_uri=uri)


def _inputs(workdir, summary, stage):
    store = ArtifactStore(Path(workdir) / "artifacts")
    ref = store.find(summary["artifacts"][stage]["kind"], summary["artifacts"][stage]["digest"])
    return {i.name: i.digest for i in store.manifest(ref).inputs}


def test_a_policy_judged_at_or_below_the_threshold_is_not_promoted(rounds):
    workdir, kept, _, _ = rounds
    # no champion yet: judged against SFT, a tie half a win
    h = kept["headline"]
    assert kept["promotion"]["win_rate"] == pytest.approx(h["judged win rate vs SFT"] + 0.5 * h["judged tie rate vs SFT"])
    assert kept["promotion"]["promoted"] is False and "against the SFT policy" in kept["promotion"]["reason"]
    client = _client(kept)
    parent = client.get_run(kept["mlflow"]["run_id"]).data
    assert parent.tags["rlhf.promotion"] == "not promoted"
    assert parent.metrics["promotion/win_rate"] == pytest.approx(kept["promotion"]["win_rate"])
    assert parent.metrics["promotion/threshold"] == 1.0
    # the ppo stage registered it as version 1 with `candidate`, and no version is champion
    assert kept["aliases"] == {"candidate": 1}
    assert client.get_model_version("rlhf-policy", "1").tags["rlhf.digest"] == kept["artifacts"]["ppo"]["digest"]
    # start_from champion with none registered: the round started from SFT, and says so
    assert _inputs(workdir, kept, "generate")["policy"] == kept["artifacts"]["sft"]["digest"]
    assert parent.tags["rlhf.start_policy.source"] == "sft"
    assert parent.tags["rlhf.start_policy.model_version"] == "rlhf-sft-policy/1"


def test_a_policy_judged_above_the_threshold_becomes_champion(rounds):
    _, kept, promoted, _ = rounds
    assert kept["promotion"]["win_rate"] > 0  # else no threshold lies below it
    assert promoted["artifacts"]["ppo"] == kept["artifacts"]["ppo"]  # the same policy, from the cache
    assert promoted["promotion"]["promoted"] is True and promoted["promotion"]["version"] == 1
    assert promoted["aliases"] == {"candidate": 1, "champion": 1}
    client = _client(promoted)
    champion = client.get_model_version("rlhf-policy", "1")
    assert champion.tags["rlhf.digest"] == kept["artifacts"]["ppo"]["digest"]
    assert "promoted to champion" in champion.tags["rlhf.promotion"]
    assert client.get_run(promoted["mlflow"]["run_id"]).data.tags["rlhf.promotion"] == "promoted to champion"


def test_a_round_started_from_the_champion_trains_from_and_is_judged_against_that_version(rounds):
    workdir, kept, _, from_champion = rounds
    champion_digest = kept["artifacts"]["ppo"]["digest"]
    assert _inputs(workdir, from_champion, "generate")["policy"] == champion_digest
    assert _inputs(workdir, from_champion, "ppo")["policy"] == champion_digest
    client = _client(from_champion)
    parent = client.get_run(from_champion["mlflow"]["run_id"]).data.tags
    assert parent["rlhf.start_policy.source"] == "champion"
    assert parent["rlhf.start_policy.model_version"] == "rlhf-policy/1"
    assert from_champion["aliases"] == {"candidate": 2, "champion": 1}  # threshold 1.0: the champion stays v1
    new = client.get_model_version("rlhf-policy", "2")
    assert new.tags["rlhf.digest"] == from_champion["artifacts"]["ppo"]["digest"]
    assert new.tags["rlhf.start_policy.model_version"] == "rlhf-policy/1"
    assert new.tags["rlhf.start_policy.digest"] == champion_digest
    reward = client.get_model_version_by_alias("rlhf-reward-model", "candidate")  # trained in this round
    assert reward.tags["rlhf.digest"] == from_champion["artifacts"]["reward"]["digest"]
    assert new.tags["rlhf.reward_model.model_version"] == f"rlhf-reward-model/{reward.version}"
    # judged against the champion it started from
    assert _inputs(workdir, from_champion, "evaluate_vs_champion")["baseline"] == champion_digest
    assert "against rlhf-policy v1 (champion)" in from_champion["promotion"]["reason"]


def test_a_champion_that_moved_while_the_round_was_judged_is_not_replaced(tmp_path):
    """Two rounds (other workdirs, other pods) judged against v1 for minutes; the first promoted. The second was
    promoted over it before, never compared with it."""
    from rlhf_core.artifacts import ArtifactRef
    from rlhf_core.config import IterationConfig
    from tasks.common import RunContext
    from tasks.promotion import promote

    ctx = RunContext(workdir=str(tmp_path), tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="e",
                     parent_run_id="", round_name="r")
    ctx = ctx.model_copy(update={"parent_run_id": ctx.tracker.start_run("r", {})})
    client = ctx.tracker.client
    client.create_registered_model("rlhf-policy")
    for digest in ("v1", "v2", "ours"):
        client.create_model_version("rlhf-policy", source=str(tmp_path), tags={"rlhf.digest": digest})
    client.set_registered_model_alias("rlhf-policy", "champion", "2")  # promoted by another round meanwhile
    with ctx.store.staging() as staged:
        (staged / "judgements.txt").write_text("won")
        evaluation = ctx.store.commit(staged, kind="evaluation", stage="evaluate", stage_version="1", code_version="t",
                                      config={}, config_digest="c", inputs={}, cache_key="k",
                                      metrics={"eval/judge/win_rate": 0.9, "eval/judge/tie_rate": 0.0})
    ours = ArtifactRef(kind="policy", digest="ours", path=str(tmp_path))
    rule = IterationConfig(promote_min_win_rate=0.5)
    result = promote.fn(ctx, rule, ours, evaluation, "rlhf-policy v1 (champion)", "1")
    assert result["promoted"] is False and "the champion is now v2, which it was not judged against" in result["reason"]
    assert client.get_registered_model("rlhf-policy").aliases == {"champion": 2}
    result = promote.fn(ctx, rule, ours, evaluation, "rlhf-policy v2 (champion)", "2")  # judged against v2: it wins
    assert result["promoted"] is True and client.get_registered_model("rlhf-policy").aliases == {"champion": 3}
    # a win rate at the threshold is not above it: not promoted
    with ctx.store.staging() as staged:
        (staged / "judgements.txt").write_text("level")
        level = ctx.store.commit(staged, kind="evaluation", stage="evaluate", stage_version="1", code_version="t",
                                 config={}, config_digest="c", inputs={}, cache_key="k2",
                                 metrics={"eval/judge/win_rate": 0.4, "eval/judge/tie_rate": 0.2})
    client.create_model_version("rlhf-policy", source=str(tmp_path), tags={"rlhf.digest": "level"})
    level_policy = ArtifactRef(kind="policy", digest="level", path=str(tmp_path))
    result = promote.fn(ctx, rule, level_policy, level, "rlhf-policy v3 (champion)", "3")
    assert result["win_rate"] == pytest.approx(0.5) and result["promoted"] is False
    assert client.get_registered_model("rlhf-policy").aliases == {"champion": 3}
    # their rounds run again (a resumed rlhf-rounds): each decision is read back as it was made, not made again;
    # ours made itself champion (series/promoted is 1 from this), level was not promoted
    from tasks.promotion import earlier_promotion

    again = earlier_promotion(ctx, ours)
    assert again["promoted"] is True and "(it is the champion since)" in again["reason"]
    assert earlier_promotion(ctx, level_policy) is None  # judged against the champion it still has: decides again
    client.set_registered_model_alias("rlhf-policy", "champion", "1")  # moved back by hand
    again = earlier_promotion(ctx, level_policy)
    assert again["promoted"] is False and "(the champion has changed since)" in again["reason"]
    assert earlier_promotion(ctx, ours)["promoted"] is True  # promoted then, though no longer the champion


def test_a_champion_of_another_model_is_named_by_what_differs(tmp_path):
    """The champion alias is one per tracking server: a mini config's 1-layer policy became the demo world's start
    (or a SmolLM2 candidate was judged against a byte-tokenizer champion)."""
    import json

    from rlhf_core.models import architecture_differences

    for name, layers, width in (("demo", 2, 64), ("mini", 1, 32), ("same", 2, 64)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(
            {"model_type": "qwen2", "vocab_size": 259, "num_hidden_layers": layers, "hidden_size": width}))
    assert architecture_differences(tmp_path / "mini", tmp_path / "demo") == ["hidden_size: 32 vs 64",
                                                                              "num_hidden_layers: 1 vs 2"]
    assert architecture_differences(tmp_path / "same", tmp_path / "demo") == []


def _context(tmp_path):
    from tasks.common import RunContext

    ctx = RunContext(workdir=str(tmp_path), tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="e",
                     parent_run_id="", round_name="r")
    return ctx.model_copy(update={"parent_run_id": ctx.tracker.start_run("r", {})})


def test_a_registry_download_of_another_model_under_the_same_version_number_is_downloaded_again(tmp_path):
    """Version numbers restart at 1 after a registered model is deleted: the folder of an earlier rlhf-policy/1 was
    used as today's champion."""
    from rlhf_core.artifacts import content_digest
    from tasks.evaluation import registered_policy

    ctx = _context(tmp_path)
    new = tmp_path / "new_model"
    new.mkdir()
    (new / "config.json").write_text('{"new": 1}')
    client = ctx.tracker.client
    client.create_registered_model("rlhf-policy")
    version = client.create_model_version("rlhf-policy", source=str(new), tags={"rlhf.digest": content_digest(new)[0]})
    client.set_registered_model_alias("rlhf-policy", "champion", version.version)
    old = tmp_path / "registry" / "rlhf-policy" / "1"
    old.mkdir(parents=True)
    (old / "config.json").write_text('{"old": 1}')
    ref = registered_policy(ctx, "rlhf-policy", "champion")
    assert ref.digest == version.tags["rlhf.digest"] and (Path(ref.path) / "config.json").read_text() == '{"new": 1}'


def test_a_stage_failing_on_a_registry_download_is_not_called_a_damaged_artifact(tmp_path):
    """A download has no manifest: any failure of a stage reading it was reported as a damaged input, with a
    `rlhf verify --remove` that never touches registry/ (the same error on every retry)."""
    from rlhf_core.artifacts import ArtifactRef, content_digest
    from tasks.common import run_stage

    ctx = _context(tmp_path)
    download = tmp_path / "registry" / "rlhf-policy" / "3"
    download.mkdir(parents=True)
    (download / "config.json").write_text("{}")
    baseline = ArtifactRef(kind="policy", digest=content_digest(download)[0], path=str(download))

    def produce(out, run):
        raise ConnectionError("judge server refused the connection")

    with pytest.raises(ConnectionError, match="judge server refused"):
        run_stage(ctx, stage="evaluate_vs_champion", version="3", kind="judgements", config={},
                  inputs={"baseline": baseline}, produce=produce)
