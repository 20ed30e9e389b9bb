"""Label Studio import: accepted + quarantined = input, reasons named; majority pairs."""

import hashlib
import json

import pandas as pd
import pytest

from rlhf_core.annotation.label_studio import (
    ImportFormatError,
    import_label_studio,
    import_label_studio_export,
    read_export,
)
from rlhf_core.annotation.pairs import aggregate_majority
from rlhf_core.annotation.tasks import make_comparison_tasks
from rlhf_core.schemas import validate_table

RESPONSES = pd.DataFrame({
    "prompt_id": ["p1", "p1", "p1", "p2", "p2"],
    "response_id": ["r1", "r2", "r3", "r4", "r5"],
    "prompt": ["q1", "q1", "q1", "q2", "q2"],
    "response": ["one", "two", "one", "four", "five"],
    "generator": "g", "strategy": "{}",
})


TEXTS = dict(zip(RESPONSES["response_id"], RESPONSES["response"]))


def _task(tid, a, b, pid, annotations):
    """A pairwise task as the pipeline makes it, showing the responses' texts."""
    return {"id": tid, "data": {"prompt": "q", "answer1": TEXTS.get(a, "x"), "answer2": TEXTS.get(b, "y"),
                                "task_id": f"t{tid}",
                                "prompt_id": pid, "answer1_id": a, "answer2_id": b},
            "annotations": annotations}


def _ann(aid, who, selected="left", cancelled=False):
    return {"id": aid, "completed_by": who, "was_cancelled": cancelled,
            "result": [{"type": "pairwise", "from_name": "comparison", "to_name": "pairwise",
                        "value": {"selected": selected}}]}


def test_import_accepts_and_quarantines_with_reasons():
    export = [
        _task(1, "r1", "r2", "p1", [_ann(1, 7, "left"), _ann(2, 8, "right"), _ann(3, 9, "left")]),
        _task(2, "r4", "r5", "p2", [_ann(4, 7, "right"), _ann(5, 7, "left"),  # same annotator, other label
                                    _ann(12, 7, "right")]),  # same annotator, same label
        _task(3, "r1", "r9", "p1", [_ann(6, 7)]),  # unknown response
        _task(4, "r1", "r1", "p1", [_ann(7, 7)]),  # self pair
        _task(5, "r1", "r4", "p1", [_ann(8, 7)]),  # r4 belongs to p2
        _task(6, "r1", "r2", "p1", [_ann(9, 7, cancelled=True)]),
        _task(7, "r1", "r2", "p1", [_ann(10, 7, selected="middle")]),
        _task(8, "r1", "r2", "p1", []),
        {"id": 9, "annotations": [_ann(11, 7)]},  # no data
    ]
    annotations, quarantine = import_label_studio(export, RESPONSES)
    assert len(annotations) + len(quarantine) == 13
    assert annotations["label"].tolist() == ["a", "b", "a", "b"]
    assert annotations["annotation_id"].tolist() == ["t1:7", "t1:8", "t1:9", "t2:7"]  # the first of task 2 kept
    assert quarantine["reason"].tolist() == ["contradictory", "duplicate", "unknown_response", "self_pair",
                                             "prompt_mismatch", "cancelled", "no_choice", "no_annotations",
                                             "missing_data"]
    assert quarantine["source_index"].tolist() == [1, 1, 2, 3, 4, 5, 6, 7, 8]
    assert all(json.loads(r) for r in quarantine["raw"])

    comparisons, report = aggregate_majority(annotations, RESPONSES)
    by_id = comparisons.set_index("pair_id")
    assert by_id.loc["t1", "chosen"] == "one" and by_id.loc["t1", "rejected"] == "two"
    assert by_id.loc["t1", "label_agreement"] == pytest.approx(2 / 3)
    assert by_id.loc["t2", "chosen"] == "five" and report["n_pairs"] == 2


def test_a_task_id_one_annotator_judged_on_two_tasks_that_show_other_responses_is_named_so():
    """Two projects' tasks both named t1 (data.task_id): the second shows r1 vs r3. Annotator 7, who judged both,
    had the second quarantined as a "duplicate ... the same way" (a false reason; one judgement id for both);
    annotator 8's judgement of it is kept (pairs are named by their content: test_importer)."""
    export = [_task(1, "r1", "r2", "p1", [_ann(1, 7, "left")]),
              _task(1, "r1", "r3", "p1", [_ann(3, 7, "left"), _ann(4, 8, "right")]),
              _task(1, "r1", "r2", "p1", [_ann(5, 7, "left")])]  # the first task again: a duplicate, truly
    annotations, quarantine = import_label_studio(export, RESPONSES)
    assert annotations[["annotation_id", "response_b_id"]].values.tolist() == [["t1:7", "r2"], ["t1:8", "r3"]]
    assert quarantine["reason"].tolist() == ["task_id_reused", "duplicate"]
    assert quarantine["detail"][0] == ("task id t1 already names a task this annotator judged, showing p1, r1, r2; "
                                       "this one shows p1, r1, r3: give each task its own data.task_id")


def test_a_pair_shown_both_ways_without_task_ids_is_two_tasks_not_a_reused_id():
    """A plain Label Studio project (no data.task_id) shows r1 | r2 and, as a position-bias check, r2 | r1: two
    tasks, named by what they show in its order; a blank data.task_id is none (not one id for every task)."""
    def task(a, b, selected, **data):
        return {"id": 1, "data": {"prompt_id": "p1", "answer1_id": a, "answer2_id": b, **data},
                "annotations": [_ann(1, 7, selected)]}

    annotations, quarantine = import_label_studio([task("r1", "r2", "left"), task("r2", "r1", "right")], RESPONSES)
    assert len(annotations) == 2 and quarantine.empty
    assert annotations["task_id"].str.startswith("ls-").all() and annotations["task_id"].nunique() == 2
    annotations, quarantine = import_label_studio([task("r1", "r2", "left", task_id=""),
                                                   task("r1", "r3", "left", task_id="")], RESPONSES)
    assert len(annotations) == 2 and quarantine.empty and annotations["task_id"].str.startswith("ls-").all()


def test_majority_gives_each_annotator_one_vote_per_pair_in_either_order():
    """Annotator 7 saw r1 vs r2 twice (as r1|r2 and as r2|r1) and preferred r1 both times; annotator 8 preferred
    r2: one vote each, a tie, no comparison. Annotator 9 splits their own two labels: no vote."""
    export = [
        _task(1, "r1", "r2", "p1", [_ann(1, 7, "left"), _ann(2, 8, "right"), _ann(3, 9, "left")]),
        _task(2, "r2", "r1", "p1", [_ann(4, 7, "right"), _ann(5, 9, "left")]),
    ]
    annotations, quarantine = import_label_studio(export, RESPONSES)
    assert len(annotations) == 5 and len(quarantine) == 0
    comparisons, report = aggregate_majority(annotations, RESPONSES)
    assert len(comparisons) == 0 and report["tied_tasks"] == 1

    export[1]["annotations"].append(_ann(6, 10, "right"))  # a third voter for r1 breaks the tie
    comparisons, report = aggregate_majority(import_label_studio(export, RESPONSES)[0], RESPONSES)
    assert comparisons[["chosen_id", "rejected_id", "n_labels"]].values.tolist() == [["r1", "r2", 3]]
    assert comparisons["label_agreement"].item() == pytest.approx(2 / 3) and report["tied_tasks"] == 0


def test_an_unknown_response_id_is_quoted_and_a_near_miss_named():
    export = [_task(1, "r1 ", "r2", "p1", [_ann(1, 7)]), _task(2, "r4", "r1", "p2", [_ann(2, 7)])]
    _, quarantine = import_label_studio(export, RESPONSES)
    assert quarantine["detail"].tolist() == [
        "response id 'r1 ' is not in the responses artifact (the artifact has 'r1': the export changed its spaces "
        "or Unicode form)", "response 'r1' belongs to prompt 'p1', not 'p2'"]
    _, quarantine = import_label_studio([_task(3, "r9", "r1", "p1", [_ann(3, 7)])], RESPONSES)
    assert quarantine["detail"].tolist() == [  # an id of responses generated otherwise: where its texts are
        "response id 'r9' is not in the responses artifact (tasks made from responses this round did not generate, "
        "with other settings, seed or pipeline version, join the generate artifact that made them: rlhf stage "
        "import_annotations --config C --input generate=responses:<digest>)"]


def test_read_export_errors_are_actionable(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('[{"id": 1,}')
    with pytest.raises(ImportFormatError, match="not valid JSON at line 1") as err:
        read_export(bad)
    assert "JSON Lines" not in str(err.value)
    bad.write_text('{"prompt": "q", "chosen": "a", "rejected": "b"}\n{"prompt": "q", "chosen": "a", "rejected": "c"}\n')
    with pytest.raises(ImportFormatError, match="line 2 column 1: Extra data; it looks like JSON Lines .* name it "
                                                ".jsonl, or set annotation.format"):
        read_export(bad)  # what datasets' to_json writes by default
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


# ---------------------------------------------------------------- rating and ranker templates

def _rating_task(tid, rid, pid, annotations):
    return {"id": tid, "data": {"prompt": "q", "answer": "x", "prompt_id": pid, "response_id": rid},
            "annotations": annotations}


def _rating(aid, who, rating):
    return {"id": aid, "completed_by": who, "was_cancelled": False,
            "result": [{"type": "rating", "from_name": "rating", "to_name": "answer", "value": {"rating": rating}}]}


def _ranker_task(tid, pid, item_ids, annotations):
    return {"id": tid, "data": {"prompt": "q", "prompt_id": pid,
                                "items": [{"id": i, "title": i, "body": TEXTS.get(i, "text")} for i in item_ids]},
            "annotations": annotations}


def _ranking(aid, who, ids, lists=None):
    return {"id": aid, "completed_by": who, "was_cancelled": False,
            "result": [{"type": "ranker", "from_name": "rank", "to_name": "items",
                        "value": {"ranker": lists if lists is not None else {"rank": ids}}}]}


def _shown(*ids: str) -> str:
    """The task id of a task without data.task_id: made from the ids it shows (Label Studio's own task["id"] is
    per project: two projects' "task 1" were one task)."""
    return "ls-" + hashlib.sha256("\0".join(ids).encode()).hexdigest()[:16]


def test_a_task_showing_other_texts_than_the_responses_under_its_ids_is_quarantined():
    """Responses generated again under the same ids (a strategy's temperature changed, its name not, before
    response ids named their text; or texts edited since): the export's labels were matched by id to texts the
    annotators never saw. Texts are compared after NFC and trimming."""
    regenerated = RESPONSES.assign(response=RESPONSES["response"].replace({"two": "deux"}))
    decomposed = RESPONSES.assign(response=RESPONSES["response"].replace({"one": "one\u0301"}))  # o, n, e + accent
    export = [_task(1, "r1", "r2", "p1", [_ann(1, 7, "left")])]  # shows "one" vs "two"
    rating = _rating_task(2, "r2", "p1", [_rating(2, 7, 4)])
    rating["data"]["response"] = "two "
    ranking = _ranker_task(3, "p1", ["r1", "r2"], [_ranking(3, 7, ["r2", "r1"])])
    result = import_label_studio_export(export + [rating, ranking], regenerated)
    assert result.quarantine["reason"].tolist() == ["text_mismatch"] * 3
    assert "another text for r2 than the responses artifact holds ('two' vs 'deux')" in result.quarantine["detail"][0]
    assert "annotation.match_texts false" in result.quarantine["detail"][0]
    assert len(import_label_studio_export(export + [rating, ranking], RESPONSES).quarantine) == 0  # "two " is "two"
    shown_composed = _task(4, "r1", "r2", "p1", [_ann(4, 7, "left")])
    shown_composed["data"]["answer1"] = "on\u00e9"  # the composed form of "one" + combining acute accent
    assert len(import_label_studio_export([shown_composed], decomposed).quarantine) == 0
    unchecked = import_label_studio_export(export + [rating, ranking], regenerated, match_texts=False)
    assert len(unchecked.quarantine) == 0 and len(unchecked.annotations) == 1
    assert len(import_label_studio_export(export, RESPONSES.drop(columns="response")).quarantine) == 0  # no texts


def test_mixed_export_gives_annotations_scores_and_reasons():
    export = [
        _task(1, "r1", "r2", "p1", [_ann(1, 7, "right")]),
        _rating_task(2, "r1", "p1", [_rating(2, 7, 4), _rating(3, 8, 2), _rating(4, 8, 2), _rating(5, 8, 5)]),
        _rating_task(3, "r2", "p1", [_rating(6, 7, "four"), _rating(7, 8, 9), _rating(8, 9, float("inf"))]),
        _rating_task(4, "r4", "p1", [_rating(9, 7, 3)]),  # r4 answers p2
        _ranker_task(5, "p1", ["r1", "r2", "r3"], [_ranking(10, 7, ["r3", "r1", "r2"]), _ranking(11, 8, ["r2", "r1"])]),
        _ranker_task(6, "p1", ["r1", "r2", "r3"], [
            _ranking(12, 7, ["r1"]),  # a single id
            _ranking(13, 8, ["r1", "r1"]),  # a repeat
            _ranking(14, 9, ["r1", "r9"]),  # not among the items
            _ranking(15, 10, None, lists={"good": ["r1"], "bad": ["r2"]}),  # bucketed
        ]),
        _ranker_task(7, "p1", ["r1", "r9"], [_ranking(16, 7, ["r9", "r1"])]),  # r9 is an item, not a response
    ]
    result = import_label_studio_export(export, RESPONSES, max_rating=5)
    assert result.template_counts == {"pairwise": 1, "rating": 2, "ranker": 2}
    assert result.annotations[["annotation_id", "label"]].values.tolist() == [["t1:7", "b"]]
    scores, rated, ranked = result.scores, _shown("p1", "r1"), _shown("p1", "r1", "r2", "r3")
    assert scores[["score_id", "annotation_id", "response_id", "score", "annotator"]].values.tolist() == [
        [f"{rated}:7:r1", f"{rated}:7", "r1", 4.0, "7"],
        [f"{rated}:8:r1", f"{rated}:8", "r1", 2.0, "8"],
        [f"{ranked}:7:r3", f"{ranked}:7", "r3", -1.0, "7"],
        [f"{ranked}:7:r1", f"{ranked}:7", "r1", -2.0, "7"],
        [f"{ranked}:7:r2", f"{ranked}:7", "r2", -3.0, "7"],
        [f"{ranked}:8:r2", f"{ranked}:8", "r2", -1.0, "8"],
        [f"{ranked}:8:r1", f"{ranked}:8", "r1", -2.0, "8"],
    ]  # fmt: skip
    validate_table("scores", scores)
    validate_table("annotations", result.annotations)
    assert result.quarantine["reason"].tolist() == [
        "duplicate", "contradictory", "bad_rating", "bad_rating", "bad_rating", "prompt_mismatch",
        "bad_ranking", "bad_ranking", "bad_ranking", "bad_ranking", "unknown_response",
    ]  # fmt: skip
    n_input = 1 + 4 + 3 + 1 + 2 + 4 + 1
    assert len(result.annotations) + scores["annotation_id"].nunique() + len(result.quarantine) == n_input


def test_judgement_ids_are_stable_across_exports():
    """A re-export (new Label Studio annotation ids, other order) gives the same judgement ids."""
    first = [_rating_task(2, "r1", "p1", [_rating(2, 7, 4)]), _task(1, "r1", "r2", "p1", [_ann(1, 7)])]
    again = [_task(1, "r1", "r2", "p1", [_ann(901, 7)]), _rating_task(2, "r1", "p1", [_rating(902, 7, 4)])]
    a, b = import_label_studio_export(first, RESPONSES), import_label_studio_export(again, RESPONSES)
    assert a.annotations["annotation_id"].tolist() == b.annotations["annotation_id"].tolist() == ["t1:7"]
    assert a.scores["score_id"].tolist() == b.scores["score_id"].tolist() == [f"{_shown('p1', 'r1')}:7:r1"]


def test_pairwise_only_importer_refuses_scores():
    export = [_task(1, "r1", "r2", "p1", [_ann(1, 7)]), _rating_task(2, "r1", "p1", [_rating(2, 7, 4)])]
    with pytest.raises(ImportFormatError, match="1 rating and 0 ranker"):
        import_label_studio(export, RESPONSES)


def test_malformed_tasks_and_annotations_are_quarantined():
    export = [
        "not a task",
        {"id": 2, "annotations": {"id": 1}},
        {"id": 3, "data": {"prompt_id": "p1", "response_id": "r1"}, "annotations": ["x", {"result": "x"}]},
        _rating_task(4, "r1", "p1", [{"result": [{"type": "rating", "value": {"rating": 3}}]}]),  # no completed_by
        _rating_task(5, "r1", "p1", [{**_rating(1, 7, 3), "result": [*_rating(1, 7, 3)["result"],
                                                                     *_ann(1, 7)["result"]]}]),
    ]
    result = import_label_studio_export(export, RESPONSES)
    assert result.quarantine["reason"].tolist() == ["malformed_task", "malformed_task", "malformed_annotation",
                                                    "missing_field", "missing_field", "multiple_results"]
    assert result.annotations.empty and result.scores.empty


@pytest.mark.parametrize("selected", [["left"], {"side": "left"}, 1, None])
def test_a_pairwise_choice_that_is_not_a_string_is_quarantined_not_a_crash(selected):
    annotations, quarantine = import_label_studio([_task(1, "r1", "r2", "p1", [_ann(1, 7, selected)])], RESPONSES)
    assert annotations.empty and quarantine["reason"].tolist() == ["no_choice"]


def test_label_studio_tasks_of_the_rounds_responses_import_as_the_simulated_crowds_do():
    """The README's recipe: make_comparison_tasks, then label_studio_tasks, labelled in Label Studio: its rows had
    other field names (response_a_id, ...) than the import reads, and every judgement was quarantined."""
    from rlhf_core.annotation.tasks import label_studio_tasks

    tasks = make_comparison_tasks(RESPONSES.iloc[[0, 1, 3, 4]], pairs_per_prompt=1, seed=0)
    export = [task | {"id": i, "annotations": [_ann(i, 7, "left")]} for i, task in enumerate(label_studio_tasks(tasks))]
    result = import_label_studio_export(json.loads(json.dumps(export)), RESPONSES)
    assert len(result.quarantine) == 0 and len(result.annotations) == 2
    assert result.annotations["response_a_id"].tolist() == tasks["response_a_id"].tolist()
