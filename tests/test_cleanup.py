"""The store cleanup as a Prefect flow (rlhf-gc, deployment rlhf-gc/weekly-cleanup), run through a real Prefect API:
it deletes what `rlhf gc --remove` would and shows it as the run's markdown artifact; remove=false deletes nothing."""

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
import yaml

from rlhf_core.artifacts import ArtifactStore

ROOT = Path(__file__).parents[1]


def _store_with_a_week_old_artifact(workdir: Path):
    """Two artifacts committed a week ago (their manifests' and cache entries' times moved back), one of them since
    served from the cache."""
    store = ArtifactStore(workdir / "artifacts")
    refs, week_ago = [], time.time() - 7 * 86400
    for kind, content in (("votes", b"v" * 2**20), ("comparisons", b"p")):
        with store.staging() as staged:
            (staged / "table.parquet").write_bytes(content)
            ref = store.commit(staged, kind=kind, stage=kind, stage_version="1", code_version="t", config={},
                               config_digest="c", inputs={}, cache_key=f"k-{kind}")
        manifest = Path(ref.path) / "manifest.json"
        manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"created_at": week_ago}))
        os.utime(workdir / "artifacts" / "cache" / f"k-{kind}.json", (week_ago, week_ago))
        refs.append(ref)
    assert store.lookup("k-comparisons") == refs[1] and store.verify(refs[1])  # served now: used
    return store, refs


def test_the_cleanup_flow_deletes_what_nothing_recent_was_made_from(prefect_api, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client

    from flows.cleanup import rlhf_gc

    monkeypatch.chdir(tmp_path)  # the deployment's workdir is relative to the worker's directory
    store, (stale, used) = _store_with_a_week_old_artifact(tmp_path / "rlhf-runs")
    killed_download = tmp_path / "rlhf-runs" / "registry" / "rlhf-policy" / "download"
    killed_download.mkdir(parents=True)
    (killed_download / "model.safetensors").write_bytes(b"m" * 2**19)
    assert rlhf_gc(keep_days=8, remove=False)["unreferenced"] == 0
    listed = rlhf_gc(keep_days=1, remove=False)
    assert listed == {"artifacts": 2, "unreferenced": 1, "MiB": 1.0, "registry_downloads": 1,
                      "registry_downloads_MiB": 0.5, "removed": False, "cache_entries_removed": 0,
                      "figure_dirs_removed": 0, "unreadable": []}
    assert Path(stale.path).is_dir() and killed_download.is_dir()
    done = rlhf_gc(keep_days=1)
    assert done["removed"] and done["cache_entries_removed"] == 1 and not Path(stale.path).exists()
    assert not killed_download.exists()
    assert store.lookup("k-comparisons") == used

    async def latest_artifacts():
        async with get_client() as client:
            return await client.read_latest_artifacts()

    shown = [a for a in asyncio.run(latest_artifacts()) if a.key == "gc"]
    assert shown and "1 unreferenced (1.0 MiB), and 1 registry downloads" in shown[0].data
    assert "(0.5 MiB): removed" in shown[0].data and "| votes | 1 | 1.0 |" in shown[0].data
    assert "| registry download | 1 | 0.5 |" in shown[0].data
    with pytest.raises(ValueError, match="is not a round's workdir"):
        rlhf_gc(workdir=str(tmp_path / "elsewhere"))
    with pytest.raises(ValueError, match="keep_days must be at least 1"):  # a chained round's start would go
        rlhf_gc(keep_days=0.5)


def test_the_cleanup_deployment_runs_the_flow_with_its_parameters():
    from prefect.flows import load_flow_from_entrypoint

    deployment = next(d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
                      if d["name"] == "weekly-cleanup")
    flow = load_flow_from_entrypoint(str(ROOT / deployment["entrypoint"]))
    assert flow.name == "rlhf-gc"
    flow.validate_parameters(deployment["parameters"])  # names and types the flow takes
    assert deployment["schedules"][0]["active"] is False  # it deletes: on only once its workdir is the rounds'


DAY = 86400


def _old_commit(store, kind, content, key, inputs=None, days_ago=7.0):
    """An artifact committed `days_ago` days ago (its manifest's and cache entry's times moved back)."""
    with store.staging() as staged:
        (staged / "t.bin").write_bytes(content)
        ref = store.commit(staged, kind=kind, stage=kind, stage_version="1", code_version="t", config={},
                           config_digest="c", inputs=inputs or {}, cache_key=key)
    then = time.time() - days_ago * DAY
    manifest = Path(ref.path) / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"created_at": then}))
    os.utime(store.root / "cache" / f"{key}.json", (then, then))
    return ref


def test_an_old_imported_chain_is_all_garbage_and_the_plan_counts_what_it_says(tmp_path):
    """Responses an import has read are not out for annotation: prompts -> responses -> comparisons, old and
    kept by nothing, go together; "newest" is the most recent of a kind."""
    from tasks.cleanup import awaiting_annotation, plan_garbage

    store = ArtifactStore(tmp_path / "artifacts")
    prompts = _old_commit(store, "prompts", b"p", "kp")
    responses = _old_commit(store, "responses", b"r", "kr", {"prompts": prompts})
    _old_commit(store, "comparisons", b"c", "kc", {"responses": responses})
    _old_commit(store, "votes", b"a", "ka", days_ago=7)
    _old_commit(store, "votes", b"b", "kb", days_ago=3)
    assert awaiting_annotation(store) == []
    plan = plan_garbage(tmp_path, keep_days=1)
    assert sorted(r.kind for r in plan.garbage) == ["comparisons", "prompts", "responses", "votes", "votes"]
    votes = next(row for row in plan.by_kind if row["kind"] == "votes")
    assert votes["unreferenced"] == 2 and votes["newest (days ago)"] == pytest.approx(3.0, abs=0.05)


def test_a_directory_without_its_manifest_is_unreadable_to_the_plan_not_a_crash(tmp_path):
    from tasks.cleanup import plan_garbage

    store = ArtifactStore(tmp_path / "artifacts")
    kept = _old_commit(store, "responses", b"r", "kr")
    (Path(kept.path) / "manifest.json").unlink()  # a half-deleted or hand-edited artifact
    plan = plan_garbage(tmp_path, keep_days=1)
    assert plan.garbage == [] and [r.digest for r in plan.unreadable] == [kept.digest]


def test_an_artifact_served_from_the_cache_now_is_used_whatever_its_other_entries_say(tmp_path):
    """Two cache entries name one artifact (a store from before provenance.json, or the same execution keyed
    twice): the newest use counts, not the last entry read."""
    from tasks.cleanup import plan_garbage

    store = ArtifactStore(tmp_path / "artifacts")
    for key, days_ago in (("k-a", 0.0), ("k-b", 7.0)):  # one content: the same artifact, two entries
        ref = _old_commit(store, "votes", b"v", key, days_ago=7.0)
        os.utime(store.root / "cache" / f"{key}.json", (time.time() - days_ago * DAY,) * 2)
    assert len(store.committed()) == 1 and plan_garbage(tmp_path, keep_days=1).garbage == []
    assert store.lookup("k-a") == ref


def test_the_registry_download_a_round_under_way_started_from_is_not_collected(tmp_path):
    """rlhf-rounds pins the start of a round it began (started-rounds.json): its re-run starts there, so the
    download stays however long ago it was last used."""
    from rlhf_core.artifacts import ArtifactRef, content_digest
    from tasks.cleanup import plan_garbage
    from tasks.iteration import series_start

    (tmp_path / "artifacts").mkdir()
    pinned, other = (tmp_path / "registry" / "rlhf-policy" / v for v in ("3", "2"))
    for download in (pinned, other):
        download.mkdir(parents=True)
        (download / "model.safetensors").write_bytes(download.name.encode())
    champion = ArtifactRef(kind="policy", digest=content_digest(pinned)[0], path=str(pinned))
    series_start(tmp_path, "weekly", 3, lambda: (champion, "champion"))
    for download in (pinned, other):
        os.utime(download, (time.time() - 9 * DAY,) * 2)
    assert plan_garbage(tmp_path, keep_days=1).downloads == [other]


def test_a_finished_series_keeps_its_last_pairs_and_policy_and_counts_once(tmp_path):
    from tasks.cleanup import plan_garbage
    from tasks.iteration import FINISHED_ROUNDS

    store = ArtifactStore(tmp_path / "artifacts")
    pairs = _old_commit(store, "comparisons", b"p", "kp")
    policy = _old_commit(store, "policy", b"w", "kw", {"pairs": pairs})
    _old_commit(store, "votes", b"v", "kv")
    (tmp_path / FINISHED_ROUNDS).write_text(json.dumps({"weekly": {
        "round_no": 3, "pairs": pairs.model_dump(), "policy": policy.model_dump(), "mlflow_run_id": "r"}}))
    plan = plan_garbage(tmp_path, keep_days=1)
    assert plan.n_series == 1 and [r.kind for r in plan.garbage] == ["votes"]
