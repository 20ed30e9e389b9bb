"""Iterated rounds of the miniature config through a real Prefect API and a real MLflow store: round 2
votes on and trains with the pairs of rounds 1 and 2 (iteration.pairs: accumulate) or its own
(per_round), and a stop threshold above any win rate ends three rounds after round 2, saying why in
the Prefect log and in MLflow."""

import hashlib
import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from rlhf_core.artifacts import ArtifactRef, ArtifactStore
from rlhf_core.config import load_config
from rlhf_core.schemas import read_table

CONFIG = Path(__file__).parents[1] / "configs" / "mini.yaml"
TINY = ["sft.steps=20", "voting.n_models=2", "ppo.iterations=2", "ppo.critic_warmup_steps=1"]


def _config(workdir, *overrides: str):
    return load_config(CONFIG, overrides=[f"workdir={workdir}", *TINY, *overrides])


@pytest.fixture(scope="module")
def iterated(prefect_api, tmp_path_factory):
    """Three rounds asked, accumulating pairs, with a stop threshold no win rate reaches (1.01)."""
    from flows.round import rlhf_rounds

    workdir = tmp_path_factory.mktemp("iterated")
    summaries = rlhf_rounds(config=_config(workdir, "iteration.pairs=accumulate", "iteration.stop_min_win_rate=1.01"),
                            n_rounds=3)
    return workdir, summaries


def _sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def _ref(summary, stage: str) -> ArtifactRef:
    return ArtifactRef(**summary["artifacts"][stage])


def _inputs(store: ArtifactStore, summary, stage: str) -> dict[str, str]:
    return {i.name: i.digest for i in store.manifest(_ref(summary, stage)).inputs}


def test_round_2_votes_and_trains_on_the_pairs_of_rounds_1_and_2(iterated):
    workdir, (r1, r2) = iterated
    store = ArtifactStore(Path(workdir) / "artifacts")
    n1, n2 = (store.manifest(_ref(r, "import_annotations")).metrics["annotation/n_pairs"] for r in (r1, r2))
    assert n1 > 0 and n2 > 0
    assert "accumulate_pairs" not in r1["artifacts"]  # round 1 has no earlier pairs
    pairs = read_table("comparisons", _ref(r2, "accumulate_pairs").file("comparisons.parquet"))
    assert len(pairs) == n1 + n2 == r2["headline"]["pairs accumulated over rounds"]
    assert pairs["round_no"].value_counts().to_dict() == {1: n1, 2: n2}
    # each pair id names its round: the same prompt and response ids recur across rounds
    assert (pairs["pair_id"].str[:3] == pairs["round_no"].map({1: "r1-", 2: "r2-"})).all()
    accumulated = r2["artifacts"]["accumulate_pairs"]["digest"]
    assert _inputs(store, r2, "vote")["comparisons"] == accumulated
    assert _inputs(store, r2, "denoise")["comparisons"] == accumulated
    assert _inputs(store, r2, "reward")["comparisons"] == accumulated
    votes = read_table("votes", _ref(r2, "vote").file("votes.parquet"))
    assert len(votes) == n1 + n2  # re-voted: every accumulated pair has a strength
    # round 2 trained from round 1's policy and was judged against it
    assert _inputs(store, r2, "ppo")["policy"] == r1["artifacts"]["ppo"]["digest"]
    assert _inputs(store, r2, "evaluate_vs_previous")["baseline"] == r1["artifacts"]["ppo"]["digest"]


def test_per_round_pairs_leave_the_earlier_rounds_out(iterated):
    from flows.round import rlhf_round

    workdir, (r1, r2) = iterated
    summary = rlhf_round(config=_config(workdir, "iteration.pairs=per_round"), round_no=2, stop_after="vote",
                         start_policy=_ref(r1, "ppo"), earlier_pairs=_ref(r1, "import_annotations"))
    assert summary["artifacts"]["import_annotations"] == r2["artifacts"]["import_annotations"]  # from the cache
    assert "accumulate_pairs" not in summary["artifacts"]
    store = ArtifactStore(Path(workdir) / "artifacts")
    assert _inputs(store, summary, "vote")["comparisons"] == r2["artifacts"]["import_annotations"]["digest"]


def test_the_kl_anchor_is_sft_in_every_round_unless_the_start_policy_is_asked_for(iterated):
    """iteration.kl_reference: round 2's PPO is anchored to SFT (no other reference among its inputs); with
    start_policy to round 1's policy, another stage run; round 1 starts from SFT, so there it is the same run."""
    from flows.round import rlhf_round

    workdir, (r1, r2) = iterated
    store = ArtifactStore(Path(workdir) / "artifacts")
    assert "kl_reference" not in _inputs(store, r2, "ppo") and _inputs(store, r2, "ppo")["sft"] == r1["artifacts"][
        "sft"]["digest"]
    moving = _config(workdir, "iteration.pairs=accumulate", "iteration.kl_reference=start_policy")
    again = rlhf_round(config=moving, round_no=1, stop_after="ppo")
    assert again["artifacts"]["ppo"] == r1["artifacts"]["ppo"]  # from the cache: the same anchor, SFT
    summary = rlhf_round(config=moving, round_no=2, stop_after="ppo", start_policy=_ref(r1, "ppo"),
                         earlier_pairs=_ref(r1, "import_annotations"))
    assert summary["artifacts"]["reward"] == r2["artifacts"]["reward"]  # everything before PPO from the cache
    assert summary["artifacts"]["ppo"]["digest"] != r2["artifacts"]["ppo"]["digest"]
    assert _inputs(store, summary, "ppo")["kl_reference"] == r1["artifacts"]["ppo"]["digest"]


def test_a_stop_threshold_above_1_ends_the_rounds_after_round_2(iterated):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    _, summaries = iterated
    assert len(summaries) == 2  # of the 3 asked
    r1, r2 = summaries
    assert r1["stop"] is None  # no round before round 1 to be judged against
    h = r2["headline"]
    win_rate = h["judged win rate vs the round before"] + 0.5 * h["judged tie rate vs the round before"]
    reason = (f"round 2's judged win rate against round 1 is {win_rate:.3f} (a tie half a win), under "
              "iteration.stop_min_win_rate 1.01")
    assert r2["stop"] == reason
    run = MlflowClient(r2["mlflow"]["tracking_uri"]).get_run(r2["mlflow"]["run_id"]).data
    assert run.tags["rlhf.iteration.stop"] == "yes" and run.tags["rlhf.iteration.stop_reason"] == reason
    assert run.metrics["iteration/win_rate_vs_previous"] == pytest.approx(win_rate)
    APILogHandler().flush()  # the run loggers send their records to the API in batches
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r2["prefect_flow_run_id"]])))
    assert f"iterated rounds stop after this round: {reason}" in [log.message for log in logs]


def test_the_rounds_nest_under_one_mlflow_run_that_holds_their_headlines_per_round(iterated):
    workdir, (r1, r2) = iterated
    client = MlflowClient(r1["mlflow"]["tracking_uri"])
    round_runs = [client.get_run(r["mlflow"]["run_id"]) for r in (r1, r2)]
    series_id = round_runs[0].data.tags["mlflow.parentRunId"]
    assert round_runs[1].data.tags["mlflow.parentRunId"] == series_id
    # round 2 links back to round 1's run (a chained round gets the same tag from next-round's trigger)
    assert round_runs[1].data.tags["rlhf.previous_round.run_id"] == r1["mlflow"]["run_id"]
    assert "rlhf.previous_round.run_id" not in round_runs[0].data.tags
    series = client.get_run(series_id)
    assert series.info.run_name == "rounds-mini" and series.info.status == "FINISHED"
    assert series.data.tags["rlhf.series_workdir"] == str(Path(workdir).resolve())
    assert series.data.tags["rlhf.series.rounds_run"] == "2" and series.data.tags["rlhf.series.stop_reason"] == r2["stop"]
    assert series.data.params["n_rounds"] == "3"
    gold = client.get_metric_history(series_id, "headline/eval/policy/gold")
    assert [(m.step, m.value) for m in sorted(gold, key=lambda m: m.step)] == [
        (1, pytest.approx(r1["headline"]["gold score, new policy"])),
        (2, pytest.approx(r2["headline"]["gold score, new policy"]))]
    vs_previous = client.get_metric_history(series_id, "headline/evaluate_vs_previous/eval/judge/win_rate")
    assert [m.step for m in vs_previous] == [2]  # round 1 has no round before it


def test_a_round_stopped_after_evaluate_neither_judges_against_the_champion_nor_promotes(iterated):
    from flows.round import rlhf_round

    workdir, summaries = iterated
    cfg = _config(workdir, "iteration.pairs=accumulate", "iteration.stop_min_win_rate=1.01")
    summary = rlhf_round(config=cfg, stop_after="evaluate")  # round 1 again, every stage from the cache
    assert summary["artifacts"]["evaluate"] == summaries[0]["artifacts"]["evaluate"]
    assert "evaluate_vs_champion" not in summary["artifacts"] and summary["promotion"] is None


def test_a_continued_series_samples_anew_and_learns_from_every_round_so_far(prefect_api, tmp_path):
    """A scheduled round (iteration.continue_series, rlhf-round/weekly) follows the last finished round of its name:
    run twice with one config it is round 1, then round 2 with new prompts and the pairs of both rounds. Without it
    the same config is round 1 again and finds every stage in the cache: a week that learns nothing."""
    from flows.round import rlhf_round

    first = rlhf_round(config=_config(tmp_path, "name=weekly", "iteration.continue_series=true"))
    second = rlhf_round(config=_config(tmp_path, "name=weekly", "iteration.continue_series=true"))
    assert (first["round_no"], second["round_no"]) == (1, 2)
    assert second["artifacts"]["sample"] != first["artifacts"]["sample"]  # sampled with seed + 1
    assert second["artifacts"]["ppo"] != first["artifacts"]["ppo"]
    store = ArtifactStore(Path(tmp_path) / "artifacts")
    n1, n2 = (store.manifest(_ref(r, "import_annotations")).metrics["annotation/n_pairs"] for r in (first, second))
    pairs = read_table("comparisons", _ref(second, "accumulate_pairs").file("comparisons.parquet"))
    assert pairs["round_no"].value_counts().to_dict() == {1: n1, 2: n2}
    assert _inputs(store, second, "reward")["comparisons"] == second["artifacts"]["accumulate_pairs"]["digest"]
    client = MlflowClient(first["mlflow"]["tracking_uri"])
    runs = [client.get_run(r["mlflow"]["run_id"]) for r in (first, second)]
    assert [r.info.run_name for r in runs] == ["round-weekly-1", "round-weekly-2"]
    assert runs[1].data.tags["rlhf.previous_round.run_id"] == first["mlflow"]["run_id"]
    # a round stopped after a stage is not a finished round: the series still continues from round 2
    third = rlhf_round(config=_config(tmp_path, "name=weekly", "iteration.continue_series=true"), stop_after="sample")
    assert third["round_no"] == 3
    assert rlhf_round(config=_config(tmp_path, "name=weekly", "iteration.continue_series=true"),
                      stop_after="sample")["round_no"] == 3
    # the same config without continue_series: round 1 again, every stage from the cache
    again = rlhf_round(config=_config(tmp_path, "name=weekly"))
    assert again["round_no"] == 1 and again["artifacts"] == first["artifacts"]
    # ... and it leaves the series where it was: the next scheduled round is round 3
    from tasks.iteration import last_finished_round

    assert last_finished_round(tmp_path, "weekly").round_no == 2


def test_a_continued_series_refuses_what_it_cannot_continue(tmp_path):
    from rlhf_core.config import ConfigError, check_iterated_rounds
    from tasks.iteration import (FINISHED_ROUNDS, check_new_import, last_finished_round, record_finished_round,
                                 series_base)

    assert last_finished_round(tmp_path, "weekly") is None  # nothing finished yet: round 1
    store = ArtifactStore(tmp_path / "artifacts")

    def commit(kind: str, files: dict[str, bytes], inputs=None) -> ArtifactRef:
        with store.staging() as out:
            for name, content in files.items():
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                (out / name).write_bytes(content)
            return store.commit(out, kind=kind, stage=kind, stage_version="1", code_version="t", config={},
                                config_digest="c", inputs=inputs or {}, cache_key=kind + str(sorted(files)))

    pairs = commit("comparisons", {"comparisons.parquet": b"pairs"})
    week1 = commit("annotation_export", {"exports/00-week1.json": b"[1]"})
    ref = {"kind": pairs.kind, "digest": pairs.digest, "path": pairs.path}
    summary = {"round_no": 1, "artifacts": {"annotators": week1.model_dump(), "import_annotations": ref, "ppo": ref},
               "mlflow": {"run_id": "r1"}}
    weekly = _config(tmp_path, "name=weekly")
    record_finished_round(tmp_path, "weekly", summary, series_base(weekly))
    last = last_finished_round(tmp_path, "weekly")
    assert (last.round_no, last.pairs, last.mlflow_run_id) == (1, pairs, "r1")
    assert last.exports == {_sha(b"[1]"): "00-week1.json"}
    assert last_finished_round(tmp_path, "other") is None
    # another config under the same name: the same series only when its seed, world and SFT policy are the series'
    tuned = _config(tmp_path, "name=weekly", "ppo.policy_lr=3e-5", "reward.train.epochs=3")  # tuned between weeks
    assert last_finished_round(tmp_path, "weekly", series_base(tuned)).round_no == 1
    other = _config(tmp_path, "name=weekly", "seed=7", "world.max_operand=3")
    with pytest.raises(ConfigError, match=r"round weekly #1 in .* was made with another seed, world or SFT policy than "
                                          r"this round's \(seed \(0 then, 7 now\); world.max_operand \(.* then, 3 now\)\)"):
        last_finished_round(tmp_path, "weekly", series_base(other))
    record_finished_round(tmp_path, "weekly", summary | {"round_no": 1, "mlflow": {"run_id": "late"}})
    assert last_finished_round(tmp_path, "weekly").mlflow_run_id == "r1"  # a round not after it: no change
    assert last_finished_round(tmp_path, "weekly").base == series_base(weekly)  # kept by a round given none
    # last week's file again, under another name and beside a new one: refused before it is imported, naming it
    week2 = commit("annotation_export", {"exports/00-week2.json": b"[2]", "exports/01-old.json": b"[1]"})
    with pytest.raises(ConfigError, match=r"already learned from: 01-old.json \(as 00-week1.json\)"):
        check_new_import(last, store, week2)
    check_new_import(last, store, commit("annotation_export", {"exports/00-week2.json": b"[2]"}))
    # the series' exports accumulate: round 3 may not import week 1's file either
    record_finished_round(tmp_path, "weekly", summary | {"round_no": 2, "artifacts": summary["artifacts"] | {
        "annotators": commit("annotation_export", {"exports/00-week2.json": b"[2]"}).model_dump()}})
    assert set(last_finished_round(tmp_path, "weekly").exports) == {_sha(b"[1]"), _sha(b"[2]")}
    # a record written before exports were kept (imports only): its exports are read back from the imports' inputs
    record = tmp_path / FINISHED_ROUNDS
    good = record.read_text()
    imported = commit("comparisons", {"comparisons.parquet": b"week 1's pairs"}, inputs={"export": week1})
    record.write_text(json.dumps({"weekly": {"round_no": 1, "pairs": ref, "imports": [imported.digest], "policy": ref,
                                             "mlflow_run_id": "r1"}}))
    legacy = last_finished_round(tmp_path, "weekly")
    assert legacy.exports == {_sha(b"[1]"): "00-week1.json"}
    # ... nor a base: continued with one (as every round passes its series_base), it is trusted, not a TypeError
    assert last_finished_round(tmp_path, "weekly", series_base(weekly)).round_no == 1
    with pytest.raises(ConfigError, match=r"already learned from: 01-old.json \(as 00-week1.json\)"):
        check_new_import(legacy, store, week2)
    # a record edited by hand: one line naming the file and the entry, not a KeyError mid-round
    record.write_text(good.replace('"round_no": 2', '"round": 2'))
    not_a_record = rf"{FINISHED_ROUNDS} is not a record of finished rounds"
    with pytest.raises(ConfigError, match=not_a_record + r" \(at weekly.round_no"):
        last_finished_round(tmp_path, "weekly")
    record.write_text(good[:-20])
    with pytest.raises(ConfigError, match=not_a_record + r" \(Invalid JSON.*remove it"):
        last_finished_round(tmp_path, "weekly")
    record.write_text(good)
    store.remove(pairs)
    with pytest.raises(ConfigError, match=f"no longer in .*remove 'weekly' from .*{FINISHED_ROUNDS}"):
        last_finished_round(tmp_path, "weekly")
    with pytest.raises(ConfigError, match="continue_series is for single rounds"):
        check_iterated_rounds(_config(tmp_path, "iteration.continue_series=true"), 2)


def test_a_series_round_run_again_starts_where_it_first_started(tmp_path):
    """Round k of a weekly series resolves rlhf-policy@champion when it starts; killed after its own promotion moved
    the alias (before its record was written), its re-run as round k started from its own policy."""
    from tasks.cleanup import plan_garbage
    from tasks.iteration import STARTED_ROUNDS, series_start

    store = ArtifactStore(tmp_path / "artifacts")

    def policy(content: bytes) -> ArtifactRef:
        with store.staging() as out:
            (out / "model.safetensors").write_bytes(content)
            return store.commit(out, kind="policy", stage="ppo", stage_version="1", code_version="t", config={},
                                config_digest="c", inputs={}, cache_key=content.decode())

    champion, own = policy(b"week 2's champion"), policy(b"round 3's own policy, promoted before the kill")
    resolved = []

    def resolve(ref):
        return lambda: (resolved.append(ref) or ref, "champion")

    assert series_start(tmp_path, "weekly", 3, resolve(champion)) == (champion, "champion")
    assert series_start(tmp_path, "weekly", 3, resolve(own)) == (champion, "champion")  # the re-run: where it began
    assert resolved == [champion]
    assert series_start(tmp_path, "weekly", 4, resolve(own)) == (own, "champion")  # the next week resolves anew
    assert series_start(tmp_path, "other", 4, resolve(champion)) == (champion, "champion")  # series are apart
    assert series_start(tmp_path, "weekly", 4, resolve(champion)) == (own, "champion")
    # the store's cleanup keeps what a round under way started from, however old
    import os
    import time

    old = time.time() - 9 * 86400
    for ref in (champion, own):
        manifest = Path(ref.path) / "manifest.json"
        manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"created_at": old}))
    for entry in (tmp_path / "artifacts" / "cache").glob("*.json"):
        os.utime(entry, (old, old))
    assert plan_garbage(tmp_path, keep_days=1).garbage == []
    (tmp_path / STARTED_ROUNDS).write_text("{")  # a record that does not read: resolved again, not a crash
    assert series_start(tmp_path, "weekly", 4, resolve(champion)) == (champion, "champion")
    # a pin is for the config it was made for: a series of another seed (another SFT policy) under the name of one
    # that never finished resolves its own start (it generated and trained PPO from the other seed's SFT policy)
    seed0, seed1 = {"sft": "a" * 64, "start_from": "sft"}, {"sft": "b" * 64, "start_from": "sft"}
    assert series_start(tmp_path, "rlhf-rounds:x", 1, resolve(champion), seed0) == (champion, "champion")
    assert series_start(tmp_path, "rlhf-rounds:x", 1, resolve(own), seed0) == (champion, "champion")
    assert series_start(tmp_path, "rlhf-rounds:x", 1, resolve(own), seed1) == (own, "champion")
    assert series_start(tmp_path, "rlhf-rounds:x", 1, resolve(champion), seed1) == (own, "champion")
    # a pinned policy whose directory is gone (removed by hand, a registry download deleted) is resolved again
    import shutil

    shutil.rmtree(own.path)
    assert series_start(tmp_path, "rlhf-rounds:x", 1, resolve(champion), seed1) == (champion, "champion")


def test_rlhf_rounds_run_again_after_a_failure_starts_and_decides_round_1_as_it_first_did(prefect_api, tmp_path,
                                                                                          monkeypatch):
    """start_from: champion; round 1 promotes its policy, round 2 fails. Run again, round 1 started from its own
    promoted policy (a second PPO pass, the series shifted by a round) and, with start_from: sft, was judged again
    against round 2's champion and could move the alias back to itself."""
    import flows.stages as stages
    from flows.round import rlhf_rounds
    from tasks.iteration import STARTED_ROUNDS

    config = _config(tmp_path, "iteration.start_from=champion", "iteration.promote_min_win_rate=0.0",
                     "iteration.stop_min_win_rate=null")
    vote = stages.HEAVY_STAGES["vote"]

    def failing_in_round_2(ctx, cfg, inputs, seed, simulated):
        if ctx.round_no == 2:
            raise RuntimeError("round 2 fails")
        return vote.call(ctx, cfg, inputs, seed, simulated)

    monkeypatch.setitem(stages.HEAVY_STAGES, "vote", stages.HeavyStage(vote.inputs, failing_in_round_2))
    with pytest.raises(RuntimeError, match="round 2 fails"):
        rlhf_rounds(config=config, n_rounds=2)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db", registry_uri=f"sqlite:///{tmp_path}/mlflow.db")
    champion = client.get_model_version_by_alias("rlhf-policy", "champion")
    assert str(champion.version) == "1"  # round 1's policy, promoted (judged against SFT, no champion yet)
    assert "rlhf-rounds:mini" in json.loads((tmp_path / STARTED_ROUNDS).read_text())

    monkeypatch.setitem(stages.HEAVY_STAGES, "vote", vote)
    r1, r2 = rlhf_rounds(config=config, n_rounds=2)
    store = ArtifactStore(Path(tmp_path) / "artifacts")
    assert r1["artifacts"]["ppo"]["digest"] == champion.tags["rlhf.digest"]  # the same round 1, from the cache
    assert _inputs(store, r1, "generate")["policy"] == r1["artifacts"]["sft"]["digest"]  # started from SFT again
    assert "evaluate_vs_champion" not in r1["artifacts"]
    assert r1["promotion"]["reason"].startswith("decided when it was first judged (it is the champion since)")
    assert r1["promotion"]["promoted"] is True  # series/promoted 1: its policy became the champion (was 0)
    assert _inputs(store, r2, "generate")["policy"] == r1["artifacts"]["ppo"]["digest"]
    assert "rlhf-rounds:mini" not in json.loads((tmp_path / STARTED_ROUNDS).read_text())  # finished: forgotten


def test_a_round_given_missing_or_wrong_inputs_is_refused_before_any_stage(prefect_api, tmp_path):
    """A missing earlier_pairs failed after six stages as a "damaged artifact" that rlhf verify could not find; a
    missing start_policy at generate, as a transformers repo-id error."""
    from flows.round import rlhf_round
    from rlhf_core.config import ConfigError
    from tasks.iteration import check_round_inputs

    store = ArtifactStore(tmp_path / "artifacts")
    with store.staging() as out:
        (out / "comparisons.parquet").write_bytes(b"pairs")
        pairs = store.commit(out, kind="comparisons", stage="import_annotations", stage_version="1", code_version="t",
                             config={}, config_digest="c", inputs={}, cache_key="k")
    check_round_inputs(tmp_path, None, pairs)  # intact: accepted
    gone = ArtifactRef(kind="comparisons", digest="cd" * 32, path=str(tmp_path / "artifacts" / "comparisons" / "cd"))
    with pytest.raises(ConfigError, match=r"earlier_pairs comparisons:cdcdcdcdcdcd at .* is not there intact "
                                          r"\(manifest.json unreadable \(FileNotFoundError\)\)"):
        rlhf_round(config=_config(tmp_path), round_no=2, earlier_pairs=gone)
    assert not (tmp_path / "artifacts" / "prompts").exists()  # no stage ran
    with pytest.raises(ConfigError, match="start_policy is a comparisons artifact .*; give a policy artifact"):
        check_round_inputs(tmp_path, pairs, None)
    with pytest.raises(ConfigError, match="start_policy policy:ab.* \\(no such directory\\)"):
        check_round_inputs(tmp_path, ArtifactRef(kind="policy", digest="ab" * 32, path=str(tmp_path / "nowhere")), None)
