"""import_files: every format into one comparisons table, merging exports, aggregation options, ties."""

import json

import pandas as pd
import pytest

from rlhf_core.annotation.importer import detect_file_format, import_files
from rlhf_core.config import AnnotationConfig, DenoiseConfig
from rlhf_core.reward.denoise import denoise

RESPONSES = pd.DataFrame({
    "prompt_id": ["p1", "p1", "p1", "p2", "p2"],
    "response_id": ["r1", "r2", "r3", "r4", "r5"],
    "prompt": ["q1", "q1", "q1", "q2", "q2"],
    "response": ["one", "two", "three", "four", "five"],
    "generator": "g", "strategy": "{}",
})


def _rating(tid, pid, rid, ratings):
    return {"id": tid, "data": {"prompt_id": pid, "response_id": rid},
            "annotations": [{"id": i, "completed_by": who, "result": [{"type": "rating", "value": {"rating": r}}]}
                            for i, (who, r) in enumerate(ratings)]}


def _ranking(tid, pid, ids, order, who):
    return {"id": tid, "data": {"prompt_id": pid, "items": [{"id": i} for i in ids]},
            "annotations": [{"id": 1, "completed_by": who,
                             "result": [{"type": "ranker", "value": {"ranker": {"rank": order}}}]}]}


def _write(path, obj):
    path.write_text(json.dumps(obj))
    return path


def test_ratings_mean_vs_majority_and_agreement(tmp_path):
    # p1: annotator 1 rates r1 > r2 > r3 (5, 3, 1); annotator 2 rates r2 > r1 > r3 (3, 4, 2).
    export = _write(tmp_path / "ratings.json", [
        _rating(1, "p1", "r1", [(1, 5), (2, 3)]),
        _rating(2, "p1", "r2", [(1, 3), (2, 4)]),
        _rating(3, "p1", "r3", [(1, 1), (2, 2)]),
    ])
    mean = import_files([export], RESPONSES, AnnotationConfig(aggregate="mean"))
    pairs = {(c, r) for c, r in zip(mean.comparisons["chosen_id"], mean.comparisons["rejected_id"])}
    # means: r1 4.0, r2 3.5, r3 1.5 -> r1>r2, r1>r3, r2>r3
    assert pairs == {("r1", "r2"), ("r1", "r3"), ("r2", "r3")}
    r1r2 = mean.comparisons.set_index("chosen_id").loc["r1"].set_index("rejected_id").loc["r2"]
    assert r1r2["score_gap"] == pytest.approx(0.5) and r1r2["label_agreement"] == pytest.approx(0.5)
    assert mean.report["accepted"] == 6 and mean.report["quarantined"] == 0

    majority = import_files([export], RESPONSES, AnnotationConfig(aggregate="majority"))
    # r1 vs r2 splits 1:1 -> dropped; r1>r3 and r2>r3 are unanimous
    assert set(zip(majority.comparisons["chosen_id"], majority.comparisons["rejected_id"])) == {
        ("r1", "r3"), ("r2", "r3")}
    assert "agreement/scores/alpha_interval" in mean.report


def test_ranking_csv_and_pairwise_in_one_import_and_the_same_export_twice(tmp_path):
    ranking = _write(tmp_path / "rank.json", [_ranking(7, "p2", ["r4", "r5"], ["r5", "r4"], who=3)])
    scores = tmp_path / "scores.csv"
    scores.write_text("prompt_id,response_id,score,annotator\np1,r1,1,a\np1,r3,4,a\np1,r9,2,a\n")
    cfg = AnnotationConfig()
    once = import_files([ranking, scores], RESPONSES, cfg)
    assert set(zip(once.comparisons["chosen_id"], once.comparisons["rejected_id"])) == {("r5", "r4"), ("r3", "r1")}
    assert once.quarantine["reason"].tolist() == ["unknown_response"]  # r9
    assert once.report["input_rows"] == once.report["accepted"] + once.report["quarantined"] == 4

    twice = import_files([ranking, scores, ranking, scores], RESPONSES, cfg,
                         names=["a.json", "b.csv", "c.json", "d.csv"])
    pd.testing.assert_frame_equal(twice.comparisons, once.comparisons)
    repeated = twice.quarantine[twice.quarantine["source_file"].isin(["c.json", "d.csv"])]
    assert sorted(repeated["reason"]) == ["duplicate", "duplicate", "duplicate", "unknown_response"]


def test_a_changed_judgement_in_a_later_export_is_contradictory(tmp_path):
    first = _write(tmp_path / "a.json", [_ranking(7, "p2", ["r4", "r5"], ["r5", "r4"], who=3)])
    second = _write(tmp_path / "b.json", [_ranking(7, "p2", ["r4", "r5"], ["r4", "r5"], who=3)])
    result = import_files([first, second], RESPONSES, AnnotationConfig())
    assert result.quarantine["reason"].tolist() == ["contradictory"]
    assert result.comparisons[["chosen_id", "rejected_id"]].values.tolist() == [["r5", "r4"]]  # the first stays


def test_kept_ties_train_towards_one_half_and_are_never_flipped(tmp_path):
    scores = tmp_path / "scores.jsonl"
    scores.write_text("\n".join(json.dumps({"prompt_id": "p2", "response_id": r, "score": 3}) for r in ("r4", "r5")))
    kept = import_files([scores], RESPONSES, AnnotationConfig(ties="keep")).comparisons
    assert kept["tie"].tolist() == [True] and kept["soft_label"].tolist() == [0.5]
    assert len(import_files([scores], RESPONSES, AnnotationConfig(ties="drop")).comparisons) == 0
    votes = pd.DataFrame({"pair_id": kept["pair_id"], "mean": [-2.0], "std": [0.1], "diffs": [[-2.0]],
                          "bucket": ["incorrect"]})
    out, metrics = denoise(kept, votes, DenoiseConfig())
    assert not out["flipped"].any() and out["soft_label"].tolist() == [0.5] and out["margin"].tolist() == [0.0]
    assert metrics["n_flipped"] == 0


def test_detect_file_format(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"prompt_id": "p1", "response_id": "r1", "score": 1}\n')
    (tmp_path / "t.jsonl").write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    (tmp_path / "h.jsonl").write_text('{"chosen": "\\n\\nHuman: a\\n\\nAssistant: b", "rejected": "x"}\n')
    assert detect_file_format(tmp_path / "s.jsonl") == "score_table"
    assert detect_file_format(tmp_path / "t.jsonl") == "trl"
    assert detect_file_format(tmp_path / "h.jsonl") == "hh"
    assert detect_file_format(tmp_path / "x.json") == "label_studio"
    assert detect_file_format(tmp_path / "x.parquet") == "score_table"
    with pytest.raises(ValueError, match="annotation.format"):
        detect_file_format(tmp_path / "x.txt")
