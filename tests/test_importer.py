"""import_files: every format into one comparisons table, merging exports, aggregation options, ties."""

import json

import pandas as pd
import pytest

from rlhf_core.annotation.importer import detect_file_format, import_files
from rlhf_core.annotation.label_studio import ImportFormatError
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
    # a score table whose first row lacks its prompt_id (a bad row, quarantined by the import) is still one; the
    # whole file was refused as "cannot tell the text-pair format ... pass fmt='hh'"
    (tmp_path / "bad-first.jsonl").write_text('{"response_id": "r1", "score": 4}\n'
                                              '{"prompt_id": "p1", "response_id": "r2", "score": 2}\n')
    assert detect_file_format(tmp_path / "bad-first.jsonl") == "score_table"
    # a text pair with a score or rank of its own is still a text pair (a score row names its prompt_id)
    (tmp_path / "trl-scored.jsonl").write_text('{"prompt": "a", "chosen": "b", "rejected": "c", "score": 0.9}\n')
    (tmp_path / "hh-ranked.jsonl").write_text('{"chosen": "\\n\\nHuman: a\\n\\nAssistant: b", "rejected": "x", '
                                              '"rank": 1}\n')
    assert detect_file_format(tmp_path / "trl-scored.jsonl") == "trl"
    assert detect_file_format(tmp_path / "hh-ranked.jsonl") == "hh"
    (tmp_path / "neither.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(ValueError, match=r"pass annotation.format \(score_table, hh, trl or trl_messages\)"):
        detect_file_format(tmp_path / "neither.jsonl")


def test_an_empty_jsonl_export_is_named_empty(tmp_path):
    for content in (b"", b"\n\n", b"\xef\xbb\xbf\n"):  # nothing, blank lines, a byte-order mark
        (tmp_path / "week3.jsonl").write_bytes(content)
        with pytest.raises(ImportFormatError, match="the file has no rows"):
            detect_file_format(tmp_path / "week3.jsonl")


def _pairwise(tid, pid, a, b, votes, task_id=None):
    """A Label Studio pairwise task; `votes`: (annotator, "left" | "right"); no data.task_id unless given."""
    data = {"prompt_id": pid, "answer1_id": a, "answer2_id": b} | ({"task_id": task_id} if task_id else {})
    return {"id": tid, "data": data, "annotations": [
        {"id": i, "completed_by": who, "result": [{"type": "pairwise", "value": {"selected": side}}]}
        for i, (who, side) in enumerate(votes)]}


def _pairs(result) -> dict:
    return {(c, r): n for c, r, n in result.comparisons[["chosen_id", "rejected_id", "n_labels"]].itertuples(
        index=False)}


def test_two_projects_task_1_are_two_pairs_not_one(tmp_path):
    """Label Studio numbers tasks per project: project A's task 1 (p1: r1 | r2) and project B's task 1 (p2: r4 | r5)
    were pooled into one pair, B's votes reversing A's, and B's pair vanished without a quarantine row."""
    a = _write(tmp_path / "A.json", [_pairwise(1, "p1", "r1", "r2", [(7, "left")])])
    b = _write(tmp_path / "B.json", [_pairwise(1, "p2", "r4", "r5", [(7, "right"), (8, "right")])])
    result = import_files([a, b], RESPONSES, AnnotationConfig())
    assert _pairs(result) == {("r1", "r2"): 1, ("r5", "r4"): 2}
    assert result.report["accepted"] == 3 and result.report["quarantined"] == 0
    again = import_files([a, b, a], RESPONSES, AnnotationConfig())  # re-added: a duplicate, nothing changes
    assert _pairs(again) == _pairs(result) and again.report["quarantined"] == 1
    # the pipeline's own task ids reused for two pairs: kept apart, each pair named by its content
    reused = _write(tmp_path / "C.json", [_pairwise(1, "p1", "r1", "r2", [(7, "left")], task_id="t1"),
                                         _pairwise(2, "p2", "r4", "r5", [(8, "left")], task_id="t1")])
    result = import_files([reused], RESPONSES, AnnotationConfig())
    assert _pairs(result) == {("r1", "r2"): 1, ("r4", "r5"): 1} and result.report["pairwise/task_ids_reused"] == 1
    assert result.comparisons["pair_id"].is_unique
    # one annotator judged both t1s, each project's in its own file: named for what it is, as within one file
    first = _write(tmp_path / "D.json", [_pairwise(1, "p1", "r1", "r2", [(7, "left")], task_id="t1")])
    second = _write(tmp_path / "E.json", [_pairwise(1, "p2", "r4", "r5", [(7, "left")], task_id="t1")])
    result = import_files([first, second], RESPONSES, AnnotationConfig())
    assert result.quarantine["reason"].tolist() == ["task_id_reused"]
    assert "for a task showing other responses: give each task its own data.task_id" in result.quarantine["detail"][0]
    again = import_files([first, first], RESPONSES, AnnotationConfig())  # the same task twice: a duplicate still
    assert again.quarantine["reason"].tolist() == ["duplicate"]


def test_a_rating_or_ranking_task_id_reused_across_files_is_named_so(tmp_path):
    """One annotator's data.task_id t1 rates r1 in one file and r4 in another (t2: ranks r1, r2 then r4, r5): it
    was "contradictory", as if the annotator had changed their mind about one task."""
    def with_task_id(task, tid):
        task["data"]["task_id"] = tid
        return task

    first = _write(tmp_path / "a.json", [with_task_id(_rating(1, "p1", "r1", [(7, 4)]), "t1"),
                                         with_task_id(_ranking(2, "p1", ["r1", "r2"], ["r2", "r1"], who=7), "t2")])
    second = _write(tmp_path / "b.json", [with_task_id(_rating(1, "p2", "r4", [(7, 2)]), "t1"),
                                          with_task_id(_ranking(2, "p2", ["r4", "r5"], ["r4", "r5"], who=7), "t2")])
    result = import_files([first, second], RESPONSES, AnnotationConfig(aggregate="majority"))
    assert result.quarantine["reason"].tolist() == ["task_id_reused", "task_id_reused"]
    assert result.quarantine["detail"].str.contains("give each task its own data.task_id").all()
    changed = _write(tmp_path / "c.json", [with_task_id(_rating(1, "p1", "r1", [(7, 2)]), "t1")])
    again = import_files([first, changed, first], RESPONSES, AnnotationConfig(aggregate="majority"))
    assert again.quarantine["reason"].tolist() == ["contradictory", "duplicate", "duplicate"]


def test_a_pair_shown_in_both_orders_is_one_pair_with_every_vote(tmp_path):
    """r1 | r2 (1 left, 2 right) and r2 | r1 (2 right): r1 wins 3 to 2, not two pairs that contradict each other."""
    export = _write(tmp_path / "both.json", [
        _pairwise(1, "p1", "r1", "r2", [(1, "left"), (2, "right"), (3, "right")], task_id="t1"),
        _pairwise(2, "p1", "r2", "r1", [(4, "right"), (5, "right")], task_id="t2")])
    result = import_files([export], RESPONSES, AnnotationConfig())
    assert _pairs(result) == {("r1", "r2"): 5}
    assert result.comparisons["label_agreement"].tolist() == [pytest.approx(0.6)]
    one = import_files([_write(tmp_path / "one.json", [_pairwise(1, "p1", "r1", "r2", [(1, "left")],
                                                                 task_id="t1")])], RESPONSES, AnnotationConfig())
    assert one.comparisons["pair_id"].tolist() == ["t1"]  # a pair one task showed keeps the task's id


@pytest.mark.parametrize("scores_prefer", ["r1", "r2"])
def test_a_pair_judged_pairwise_and_by_scores_is_one_pair_the_pairwise_one(tmp_path, scores_prefer):
    """p1's r1 | r2 judged pairwise (r2 preferred, in two tasks or one) and rated by another annotator. Before, the
    scored pair was dropped without a word when the scores disagreed, and kept as a second copy when they agreed."""
    ratings = {"r1": 5, "r2": 1} if scores_prefer == "r1" else {"r1": 1, "r2": 5}
    rated = [_rating(10 + i, "p1", rid, [(9, ratings[rid])]) for i, rid in enumerate(("r1", "r2"))]
    for tasks in ([_pairwise(1, "p1", "r1", "r2", [(1, "right")], task_id="t1")],
                  [_pairwise(1, "p1", "r1", "r2", [(1, "right")], task_id="t1"),
                   _pairwise(2, "p1", "r2", "r1", [(2, "left")], task_id="t2")]):
        result = import_files([_write(tmp_path / "mixed.json", tasks + rated)], RESPONSES, AnnotationConfig())
        assert _pairs(result) == {("r2", "r1"): len(tasks)}
        assert result.comparisons["source"].tolist() == ["label_studio"]
        assert result.report["pairs_from_two_sources"] == 1
        assert result.report["pairs_from_two_sources_disagreeing"] == (scores_prefer == "r1")


def test_one_user_exported_as_an_id_or_as_an_object_is_one_annotator(tmp_path):
    plain = [_pairwise(1, "p1", "r1", "r2", [(7, "left"), (8, "right"), (9, "right")], task_id="t1")]
    expanded = json.loads(json.dumps(plain))
    for annotation in expanded[0]["annotations"]:
        annotation["completed_by"] = {"id": annotation["completed_by"], "email": f"u{annotation['completed_by']}@x"}
    once = import_files([_write(tmp_path / "a.json", plain)], RESPONSES, AnnotationConfig())
    twice = import_files([_write(tmp_path / "a.json", plain), _write(tmp_path / "b.json", expanded)], RESPONSES,
                         AnnotationConfig())
    assert _pairs(twice) == _pairs(once) == {("r2", "r1"): 3} and twice.report["quarantined"] == 3


def test_score_files_without_annotators_are_one_annotator_each(tmp_path):
    """A vendor file per annotator, no annotator column: the second file's rows were quarantined as the first's."""
    (tmp_path / "alice.csv").write_text("prompt_id,response_id,score\np1,r1,5\np1,r2,3\np1,r3,1\n")
    (tmp_path / "bob.csv").write_text("prompt_id,response_id,score\np1,r1,4\np1,r2,5\np1,r3,1\n")
    result = import_files([tmp_path / "alice.csv", tmp_path / "bob.csv"], RESPONSES, AnnotationConfig())
    assert result.report["accepted"] == 6 and result.report["quarantined"] == 0
    assert result.report["agreement/scores/n_annotators"] == 2
    again = import_files([tmp_path / "alice.csv", tmp_path / "alice.csv"], RESPONSES, AnnotationConfig())
    assert again.report["quarantined"] == 3 and set(again.quarantine["reason"]) == {"duplicate"}
    pd.DataFrame({"prompt_id": ["p1"] * 4, "response_id": ["r1", "r2", "r3", "r1"], "score": [5, 3, 1, 2],
                  "annotator": [7, 7, 7, None]}).to_parquet(tmp_path / "gaps.parquet")  # ints with a gap: floats
    gaps = import_files([tmp_path / "gaps.parquet"], RESPONSES, AnnotationConfig())
    assert gaps.report["quarantined"] == 0 and set(gaps.scores["annotator"]) == {"7", gaps.scores["annotator"][3]}


def test_a_gzipped_a_bom_and_a_too_deep_label_studio_export(tmp_path):
    import gzip

    from rlhf_core.annotation.importer import ImportFormatError

    tasks = [_pairwise(1, "p1", "r1", "r2", [(7, "left")], task_id="t1")]
    (tmp_path / "e.json.gz").write_bytes(gzip.compress(json.dumps(tasks).encode()))
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(tasks).encode())
    for name in ("e.json.gz", "bom.json"):
        assert _pairs(import_files([tmp_path / name], RESPONSES, AnnotationConfig())) == {("r1", "r2"): 1}
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ImportFormatError, match="nested too deeply"):
        import_files([tmp_path / "deep.json"], RESPONSES, AnnotationConfig())
    (tmp_path / "broken.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ImportFormatError, match="not a whole gzip file"):
        import_files([tmp_path / "broken.json.gz"], RESPONSES, AnnotationConfig())


def test_text_pairs_preferred_both_ways_keep_the_first(tmp_path):
    """yes > no in one row (or file) and no > yes in another were both accepted, each with agreement 1.0."""
    row = lambda chosen, rejected: json.dumps({"prompt": "ok?", "chosen": chosen, "rejected": rejected})  # noqa: E731
    (tmp_path / "t1.jsonl").write_text(row("yes", "no") + "\n" + row("no", "yes") + "\n")
    (tmp_path / "t2.jsonl").write_text(row("no", "yes") + "\n" + row("maybe", "no") + "\n")
    result = import_files([tmp_path / "t1.jsonl", tmp_path / "t2.jsonl"], RESPONSES, AnnotationConfig())
    assert list(zip(result.comparisons["chosen"], result.comparisons["rejected"])) == [("yes", "no"), ("maybe", "no")]
    assert result.quarantine["reason"].tolist() == ["contradictory", "contradictory"]
    assert result.quarantine["source_file"].tolist() == ["t1.jsonl", "t2.jsonl"]
    assert result.report["accepted"] + result.report["quarantined"] == 4


def test_ratings_outside_the_templates_scale_are_quarantined_when_it_is_given(tmp_path):
    export = _write(tmp_path / "ratings.json", [_rating(1, "p1", "r1", [(1, 50), (2, 4)]),
                                                _rating(2, "p1", "r2", [(1, 0), (2, 2)])])
    unchecked = import_files([export], RESPONSES, AnnotationConfig())
    assert unchecked.report["quarantined"] == 0
    checked = import_files([export], RESPONSES, AnnotationConfig(max_rating=5))
    assert checked.quarantine["reason"].tolist() == ["bad_rating", "bad_rating"]
    assert "outside 1..5" in checked.quarantine["detail"].iloc[0]


def test_match_texts_is_the_annotation_configs(tmp_path):
    """annotation.match_texts reaches the Label Studio import: a task showing another text for r1 is quarantined
    (text_mismatch), or, with false, imported (tasks that show rendered texts)."""
    task = _pairwise(1, "p1", "r1", "r2", [(7, "left")])
    task["data"] |= {"answer1": "<p>one</p>", "answer2": "two"}
    path = _write(tmp_path / "rendered.json", [task])
    assert import_files([path], RESPONSES, AnnotationConfig()).quarantine["reason"].tolist() == ["text_mismatch"]
    assert _pairs(import_files([path], RESPONSES, AnnotationConfig(match_texts=False))) == {("r1", "r2"): 1}
