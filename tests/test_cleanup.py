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
