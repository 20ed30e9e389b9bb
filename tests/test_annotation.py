"""Label Studio import: accepted + quarantined = input, reasons named; majority pairs."""

import json

import pandas as pd
import pytest

from rlhf_core.annotation.label_studio import ImportFormatError, import_label_studio, read_export
from rlhf_core.annotation.pairs import aggregate_majority
from rlhf_core.annotation.tasks import make_comparison_tasks

RESPONSES = pd.DataFrame({
    "prompt_id": ["p1", "p1", "p1", "p2", "p2"],
    "response_id": ["r1", "r2", "r3", "r4", "r5"],
    "prompt": ["q1", "q1", "q1", "q2", "q2"],
    "response": ["one", "two", "one", "four", "five"],
    "generator": "g", "strategy": "{}",
})


def _task(tid, a, b, pid, annotations):
    return {"id": tid, "data": {"prompt": "q", "answer1": "x", "answer2": "y", "task_id": f"t{tid}",
                                "prompt_id": pid, "answer1_id": a, "answer2_id": b},
            "annotations": annotations}


def _ann(aid, who, selected="left", cancelled=False):
    return {"id": aid, "completed_by": who, "was_cancelled": cancelled,
            "result": [{"type": "pairwise", "from_name": "comparison", "to_name": "pairwise",
                        "value": {"selected": selected}}]}


def test_import_accepts_and_quarantines_with_reasons():
    export = [
        _task(1, "r1", "r2", "p1", [_ann(1, 7, "left"), _ann(2, 8, "right"), _ann(3, 9, "left")]),
        _task(2, "r4", "r5", "p2", [_ann(4, 7, "right"), _ann(5, 7, "left")]),  # duplicate annotator
        _task(3, "r1", "r9", "p1", [_ann(6, 7)]),  # unknown response
        _task(4, "r1", "r1", "p1", [_ann(7, 7)]),  # self pair
        _task(5, "r1", "r4", "p1", [_ann(8, 7)]),  # r4 belongs to p2
        _task(6, "r1", "r2", "p1", [_ann(9, 7, cancelled=True)]),
        _task(7, "r1", "r2", "p1", [_ann(10, 7, selected="middle")]),
        _task(8, "r1", "r2", "p1", []),
        {"id": 9, "annotations": [_ann(11, 7)]},  # no data
    ]
    annotations, quarantine = import_label_studio(export, RESPONSES)
    assert len(annotations) + len(quarantine) == 12
    assert annotations["label"].tolist() == ["a", "b", "a", "b"]
    assert quarantine["reason"].tolist() == ["duplicate", "unknown_response", "self_pair", "prompt_mismatch",
                                             "cancelled", "no_choice", "no_annotations", "missing_data"]
    assert all(json.loads(r) for r in quarantine["raw"])

    comparisons, report = aggregate_majority(annotations, RESPONSES)
    by_id = comparisons.set_index("pair_id")
    assert by_id.loc["t1", "chosen"] == "one" and by_id.loc["t1", "rejected"] == "two"
    assert by_id.loc["t1", "label_agreement"] == pytest.approx(2 / 3)
    assert by_id.loc["t2", "chosen"] == "five" and report["n_pairs"] == 2


def test_read_export_errors_are_actionable(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('[{"id": 1,}')
    with pytest.raises(ImportFormatError, match="not valid JSON at line 1"):
        read_export(bad)
    bad.write_text('{"id": 1}')
    with pytest.raises(ImportFormatError, match="list of tasks"):
        read_export(bad)
    bad.write_bytes(b"\xff\xfe[")
    with pytest.raises(ImportFormatError, match="not UTF-8"):
        read_export(bad)


def test_comparison_tasks_pair_distinct_responses():
    tasks = make_comparison_tasks(RESPONSES, pairs_per_prompt=2, seed=0)
    # p1 has two distinct texts (r1 and r3 are both "one"), p2 two: one pair each
    assert len(tasks) == 2
    assert all(a != b for a, b in zip(tasks["response_a"], tasks["response_b"]))
    assert tasks.equals(make_comparison_tasks(RESPONSES, pairs_per_prompt=2, seed=0))
