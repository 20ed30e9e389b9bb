"""Every stage publishes a Prefect markdown artifact from run_stage, on a cache hit too, and the round
one that links to its parent MLflow run; read back from a real Prefect API."""

from pathlib import Path

import pytest

from rlhf_core.config import load_config

ROOT = Path(__file__).parents[1]


def _artifacts(key: str):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                     sort=ArtifactSort.CREATED_DESC)


def test_each_stage_and_the_round_publish_a_markdown_artifact_on_a_miss_and_on_a_hit(prefect_api, tmp_path):
    from mlflow import MlflowClient

    from flows.round import rlhf_round

    cfg = load_config(ROOT / "configs" / "mini.yaml", overrides=[f"workdir={tmp_path / 'w'}", "name=art"])
    first = rlhf_round(config=cfg, stop_after="sample")
    second = rlhf_round(config=cfg, stop_after="sample")  # every stage served from the cache
    client = MlflowClient(first["mlflow"]["tracking_uri"])

    world = _artifacts("stage-world-art")
    assert len(world) == 2 and [str(a.flow_run_id) for a in world] == [second["prefect_flow_run_id"],
                                                                  first["prefect_flow_run_id"]]
    hit, miss = world[0].data, world[1].data
    assert "served from the cache" in hit and "ran in" in miss
    assert "The simulated prompt pool (to sample from) and the held-out evaluation prompts, held out by text" in miss
    assert "| world/n_prompts | 80 |" in miss and "| world/n_prompts | 80 |" in hit  # mini: 80 prompts
    stage_runs = client.search_runs([client.get_experiment_by_name("rlhf").experiment_id],
                                    filter_string="tags.`rlhf.stage` = 'world'", order_by=["start_time ASC"])
    assert [f"MLflow run `{r.info.run_id}`" in text for r, text in zip(stage_runs, (miss, hit))] == [True, True]
    for stage in ("sft", "sample"):
        assert len(_artifacts(f"stage-{stage}-art")) == 2

    round_artifacts = _artifacts("round-art")
    assert [f"MLflow run `{s['mlflow']['run_id']}`" in a.data for s, a in zip((second, first), round_artifacts)] \
        == [True, True]


def test_a_tracking_server_gets_a_link_into_its_ui_and_a_local_store_the_run_id(tmp_path):
    from tasks.tracking import Tracker

    local = Tracker(f"sqlite:///{tmp_path / 'm.db'}", "links")
    assert local.run_link("abc123") == f"MLflow run `abc123` (experiment {local.experiment_id} in " \
                                       f"`sqlite:///{tmp_path / 'm.db'}`)"
    server = object.__new__(Tracker)  # the link needs only the URI and the experiment id, no live server
    server.tracking_uri, server.experiment_id = "http://127.0.0.1:5000/", "7"
    assert server.run_link("abc123") == \
        "[MLflow run abc123](http://127.0.0.1:5000/#/experiments/7/runs/abc123?workflowType=machine_learning)"


@pytest.mark.parametrize("value, shown", [(0.123456, "0.1235"), (3, "3")])
def test_stage_markdown_shows_numbers_in_the_stage_order_without_timings(value, shown):
    from rlhf_core.artifacts import ArtifactRef
    from tasks.common import RunContext, stage_markdown

    ctx = RunContext(workdir="w", tracking_uri="sqlite:///x.db", experiment="e", parent_run_id="p", round_name="r")
    ref = ArtifactRef(kind="pairs", digest="d" * 64, path="/store/pairs/ddd")
    text = stage_markdown("vote", ctx, ref, {"b/first": value, "time/stage_seconds": 12.4, "a/second": 1.5},
                          cached=False, link="LINK")
    assert text.index(f"| b/first | {shown} |") < text.index("| a/second | 1.5 |")
    assert "ran in 12 s" in text and "time/stage_seconds" not in text and "Tracking: LINK" in text
