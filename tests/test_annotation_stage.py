"""The annotation stage with real export files: formats through the round, merging exports,
idempotence, allowed roots, and what MLflow and Prefect recorded."""

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient

from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import load_config
from rlhf_core.paths import PathNotAllowedError

CONFIG = Path(__file__).parents[1] / "configs" / "mini.yaml"
HH = Path(__file__).parent / "data" / "hh-rlhf" / "pairs-200.jsonl.gz"


def _round(workdir, exports, *overrides, stop_after="import_annotations"):
    from flows.round import rlhf_round

    sets = [f"workdir={workdir}", f"annotation.exports={json.dumps([str(p) for p in exports])}", *overrides]
    return rlhf_round(config=load_config(CONFIG, overrides=sets), stop_after=stop_after)


def _tables(summary):
    ref = ArtifactRef(**summary["artifacts"]["import_annotations"])
    return (pd.read_parquet(ref.file("comparisons.parquet")), pd.read_parquet(ref.file("quarantine.parquet")), ref)


@pytest.fixture
def allow_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_ALLOWED_ROOTS", str(tmp_path))
    return tmp_path


def _hh_lines(n):
    with gzip.open(HH, "rt", encoding="utf-8") as f:
        return [next(f) for _ in range(n)]


def test_hh_export_through_the_round_recorded_in_mlflow_and_prefect(prefect_api, allow_tmp):
    summary = _round(allow_tmp / "w", [HH])
    comparisons, quarantine, _ = _tables(summary)
    assert len(comparisons) + len(quarantine) == 200
    assert set(comparisons["source"]) == {"hh"} and not comparisons["tie"].any()
    assert (comparisons["soft_label"] == 1.0).all()
    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    run = client.search_runs([client.get_run(summary["mlflow"]["run_id"]).info.experiment_id],
                             filter_string="tags.`rlhf.stage` = 'import_annotations'")[0]
    assert run.data.metrics["annotation/accepted"] == len(comparisons)
    assert run.data.metrics["annotation/input_rows"] == 200
    assert run.data.metrics["annotation/quarantined"] == len(quarantine)

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["annotation-quarantine"])))
    arts = [a for a in arts if str(a.flow_run_id) == summary["prefect_flow_run_id"]]  # this round's, not another test's
    assert len(arts) == 1 and arts[0].type == "table" and "200 input rows" in arts[0].description


def test_same_file_same_digest_and_a_new_export_adds_only_new_pairs(prefect_api, allow_tmp, monkeypatch):
    lines = _hh_lines(30)
    first, second = allow_tmp / "first.jsonl", allow_tmp / "second.jsonl"
    first.write_text("".join(lines[:20]))
    second.write_text("".join(lines[10:30]))  # 10 rows already in `first`

    a, _, ref_a = _tables(_round(allow_tmp / "w1", [first]))
    _, _, ref_b = _tables(_round(allow_tmp / "w2", [first]))  # another store, same file
    assert ref_a.digest == ref_b.digest and len(a) == 20

    # the simulated crowd's settings are not the key of real exports: the copied files are
    again = _round(allow_tmp / "w1", [first], "world.annotator_error_max=0.4", "world.n_annotators=3",
                   stop_after="annotators")
    client = MlflowClient(again["mlflow"]["tracking_uri"])
    stage = client.search_runs([client.get_run(again["mlflow"]["run_id"]).info.experiment_id],
                               filter_string="tags.`rlhf.stage` = 'annotators'", order_by=["attributes.start_time DESC"])
    assert stage[0].data.tags["rlhf.cache"] == "hit"
    # ... nor the path a file was given by (relative here, absolute from rlhf-round/on-new-export): every stage
    # after it ran again on the same data
    monkeypatch.chdir(allow_tmp)
    assert _tables(_round(allow_tmp / "w1", [Path("first.jsonl")]))[2].digest == ref_a.digest

    merged, quarantine, _ = _tables(_round(allow_tmp / "w1", [first, second]))
    assert len(merged) == 30 and merged["pair_id"].is_unique
    assert set(a["pair_id"]) <= set(merged["pair_id"])
    dup = quarantine[quarantine["reason"] == "duplicate"]
    assert len(dup) == 10 and set(dup["source_file"]) == {"01-second.jsonl"}


def test_export_outside_the_allowed_roots_is_refused_before_any_work(prefect_api, tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "export.jsonl").write_text(_hh_lines(1)[0])
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")  # roots: the cwd and the workdir, nothing else
    monkeypatch.delenv("RLHF_ALLOWED_ROOTS", raising=False)
    workdir = tmp_path / "project" / "runs"
    with pytest.raises(PathNotAllowedError, match=r"annotation.exports\[0\].*RLHF_ALLOWED_ROOTS"):
        _round(workdir, ["../elsewhere/export.jsonl"], stop_after="annotators")
    assert not workdir.exists()  # refused up front: no stage ran (the annotators stage would refuse it too, late)

    monkeypatch.setenv("RLHF_ALLOWED_ROOTS", str(tmp_path / "elsewhere"))  # the fix the message names
    summary = _round(workdir, ["../elsewhere/export.jsonl"], stop_after="annotators")
    assert summary["artifacts"]["annotators"]["kind"] == "annotation_export"


def test_exports_that_give_no_pair_are_refused_at_import_saying_why(prefect_api, allow_tmp):
    """Every row a self pair: before, the import committed 0 pairs and the vote stage failed with "no pairs to
    train on"; now the import stage fails, naming the rows and their quarantine reasons, and commits nothing."""
    from rlhf_core.annotation.label_studio import ImportFormatError

    export = allow_tmp / "same.jsonl"
    export.write_text("".join(json.dumps({"prompt": f"Q{i}", "chosen": "A", "rejected": "A"}) + "\n"
                              for i in range(5)))
    with pytest.raises(ImportFormatError, match=r"no comparison pair to train on: 0 of 5 rows accepted, 5 quarantined "
                                                r"\(.*self_pair x5\)"):
        _round(allow_tmp / "w", [export])
    assert not list((allow_tmp / "w" / "artifacts").glob("comparisons/*"))


def test_an_export_that_changes_while_it_is_copied_is_refused_not_committed_under_its_old_hash(
        prefect_api, allow_tmp, monkeypatch):
    """The stage keys its cache on the exports' hashes, then copies them: a file still being written between the two
    was committed under the hash of content it does not hold (and served for that content ever after)."""
    import shutil

    import tasks.annotation
    from tasks.annotation import ExportChangedError

    lines = _hh_lines(20)
    export = allow_tmp / "growing.jsonl"
    export.write_text("".join(lines[:10]))
    copyfile = shutil.copyfile  # tasks.annotation's shutil is everyone's: other copies go through unchanged

    def copy_while_the_annotation_tool_appends(src, dst, **kwargs):
        if Path(src) == export and export.read_text().count("\n") == 10:  # the tool is still writing the export
            export.write_text("".join(lines))
        return copyfile(src, dst, **kwargs)

    monkeypatch.setattr(tasks.annotation.shutil, "copyfile", copy_while_the_annotation_tool_appends)
    with pytest.raises(ExportChangedError, match=r"growing.jsonl changed while the round read it.*run the round again"):
        _round(allow_tmp / "w", [export], stop_after="annotators")
    assert not list((allow_tmp / "w" / "artifacts").glob("annotation_export/*"))
    monkeypatch.setattr(tasks.annotation.shutil, "copyfile", copyfile)
    summary = _round(allow_tmp / "w", [export])  # the whole file now: keyed and copied as one
    comparisons, _, _ = _tables(summary)
    assert len(comparisons) == 20


def test_a_hundred_and_one_exports_are_imported_in_the_order_given(prefect_api, allow_tmp):
    """The copies were named 00- to 100-, and read in name order: "100-..." came before "99-...", so of two files
    with the same judgement the later one was kept and the earlier quarantined."""
    lines = _hh_lines(100)
    exports = []
    for i in range(101):
        exports.append(allow_tmp / f"batch-{i}.jsonl")
        exports[-1].write_text(lines[min(i, 99)])  # files 99 and 100 hold the same pair
    _, quarantine, ref = _tables(_round(allow_tmp / "w", exports))
    assert sorted(p.name for p in (Path(ref.path).parent.parent / "annotation_export").glob("*/exports/*"))[-1] \
        == "100-batch-100.jsonl"
    assert quarantine["reason"].tolist() == ["duplicate"] and quarantine["source_file"].tolist() == [
        "100-batch-100.jsonl"]
