"""Property: malformed Label Studio exports and score tables never crash an importer, and every
input row is accepted or quarantined exactly once."""

import csv
import gzip
import io
import json
import tempfile
from pathlib import Path

import pandas as pd
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlhf_core.annotation.label_studio import import_label_studio_export
from rlhf_core.annotation.score_tables import import_score_table
from rlhf_core.schemas import validate_table

RESPONSES = pd.DataFrame({
    "prompt_id": ["p1", "p1", "p1", "p2", "p2"],
    "response_id": ["r1", "r2", "r3", "r4", "r5"],
})
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Mostly plausible values, so that many rows pass and duplicates, contradictions and id errors happen.
ids = st.sampled_from(["r1", "r2", "r3"] * 4 + ["r4", "r9", "p1", "", "\ud800"])
junk = st.one_of(st.none(), st.booleans(), st.integers(-3, 10), st.floats(allow_nan=True), st.text(max_size=3),
                 st.lists(st.integers(0, 2), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


def maybe(strategy, p_valid: float = 0.93):
    """`strategy` most of the time, else a value of the wrong kind."""
    return st.floats(0, 1).flatmap(lambda u: strategy if u < p_valid else junk)


annotators = st.one_of(st.integers(1, 3), st.sampled_from(["7", "", "\ud800"]), st.just({"email": "a@b"}))


def _results():
    pairwise = st.fixed_dictionaries({"type": st.just("pairwise"),
                                      "value": st.fixed_dictionaries({"selected": st.sampled_from(["left", "right",
                                                                                                    "middle"])})})
    rating = st.fixed_dictionaries({"type": st.just("rating"), "value": st.fixed_dictionaries({"rating": maybe(
        st.integers(1, 6))})})
    ranking = st.one_of(st.permutations(["r1", "r2", "r3"]), st.lists(ids, max_size=4, unique=True))
    lists = st.one_of(st.fixed_dictionaries({"rank": maybe(ranking)}),
                      st.dictionaries(st.sampled_from(["rank", "bucket"]), ranking, max_size=2))
    ranker = st.fixed_dictionaries({"type": st.just("ranker"), "value": st.fixed_dictionaries({"ranker": maybe(lists)})})
    other = st.fixed_dictionaries({"type": st.sampled_from(["choices", "textarea"]), "value": junk})
    one = st.one_of(pairwise, rating, ranker)
    return st.one_of(st.lists(one, min_size=1, max_size=1), st.lists(st.one_of(one, other, junk), max_size=2))


annotation = maybe(st.fixed_dictionaries(
    {"completed_by": maybe(annotators), "result": maybe(_results())},
    optional={"was_cancelled": maybe(st.just(False), 0.9), "id": st.integers()},
))
data = maybe(st.fixed_dictionaries({
    "prompt_id": maybe(st.sampled_from(["p1", "p1", "p1", "p2", "p3"])), "answer1_id": maybe(ids), "answer2_id": maybe(ids),
    "response_id": maybe(ids), "items": maybe(st.one_of(st.just([{"id": "r1"}, {"id": "r2"}, {"id": "r3"}]),
                               st.lists(maybe(st.fixed_dictionaries({"id": ids})), max_size=5))),
}, optional={"task_id": maybe(st.sampled_from(["t1", "t2"]))}))
task = maybe(st.fixed_dictionaries({"id": maybe(st.integers(1, 3)), "data": data,
                                    "annotations": maybe(st.lists(annotation, max_size=4))}))


@SETTINGS
@given(export=st.lists(task, max_size=6))
@example(export=[{"id": 1, "data": {"prompt_id": "p1", "items": [{"id": "r1"}, {"id": "\ud800"}]}, "annotations": [
    {"completed_by": 1, "result": [{"type": "ranker", "value": {"ranker": {"rank": ["r1", "\ud800"]}}}]}]}])
def test_label_studio_export_rows_are_all_accounted_for(export):
    export = json.loads(json.dumps(export))  # what a JSON export holds: lists, not tuples
    result = import_label_studio_export(export, RESPONSES, max_rating=5)
    n_input = sum(len(t["annotations"]) if isinstance(t, dict) and isinstance(t.get("annotations"), list)
                  and t["annotations"] else 1 for t in export)
    accepted = len(result.annotations) + result.scores["annotation_id"].nunique()
    assert accepted + len(result.quarantine) == n_input
    assert sum(result.template_counts.values()) == accepted
    validate_table("annotations", result.annotations)
    validate_table("scores", result.scores)
    assert set(result.quarantine["source_index"]) <= set(range(len(export)))


score_row = st.fixed_dictionaries({
    "prompt_id": maybe(st.sampled_from(["p1", "p1", "p2"])), "response_id": maybe(ids),
}, optional={
    "score": maybe(st.one_of(st.integers(1, 3), st.floats(-2, 5), st.sampled_from(["3", "nan", "x"]))),
    "rank": maybe(st.integers(1, 4)), "annotator": maybe(st.sampled_from(["a", "b", ""])),
    "ranking": maybe(st.one_of(st.permutations(["r1", "r2", "r3"]), st.lists(ids, max_size=4))),
})
garbage_line = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), min_size=1,
                       max_size=12).filter(lambda s: s.strip(" \t\x0b\x0c"))
jsonl_line = st.floats(0, 1).flatmap(lambda u: score_row if u < 0.8 else garbage_line)


@SETTINGS
@given(lines=st.lists(jsonl_line, max_size=12), compress=st.booleans())
@example(lines=[{"prompt_id": "p1", "ranking": ["r1", "\ud800"]}], compress=False)  # a surrogate in the detail
def test_jsonl_score_table_rows_are_all_accounted_for(lines, compress):
    text = "\n".join(json.dumps(line) if isinstance(line, dict) else line for line in lines) + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("scores.jsonl.gz" if compress else "scores.jsonl")
        path.write_bytes(gzip.compress(text.encode()) if compress else text.encode())
        scores, quarantine = import_score_table(path, RESPONSES)
    assert scores["annotation_id"].nunique() + len(quarantine) == len(lines)
    validate_table("scores", scores)


csv_cell = st.one_of(st.sampled_from(["p1", "p2", "r1", "r2", "r4", "r9", "1", "2.5", "-1", "nan", "", "a"]),
                     st.text(st.sampled_from('ab1,"\n '), max_size=4))


@SETTINGS
@given(rows=st.lists(st.one_of(st.lists(csv_cell, min_size=1, max_size=6), garbage_line.filter(
    lambda s: '"' not in s)), max_size=12))
def test_csv_score_table_rows_are_all_accounted_for(rows):
    out = io.StringIO()
    out.write("prompt_id,response_id,score,rank,annotator\n")
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        if isinstance(row, list):
            writer.writerow(row)
        else:
            out.write(row + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scores.csv"
        path.write_text(out.getvalue(), encoding="utf-8")
        scores, quarantine = import_score_table(path, RESPONSES)
    assert scores["annotation_id"].nunique() + len(quarantine) == len(rows)
    validate_table("scores", scores)
