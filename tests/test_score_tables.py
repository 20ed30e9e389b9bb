"""Score tables (JSONL, CSV, Parquet, gzip): accepted + quarantined = rows, reasons named, ids stable."""

import gzip
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf_core.annotation.label_studio import ImportFormatError
from rlhf_core.annotation.score_tables import detect_table_format, file_annotator, import_score_table
from rlhf_core.schemas import validate_table

RESPONSES = pd.DataFrame({
    "prompt_id": ["p1", "p1", "p1", "p2"],
    "response_id": ["r1", "r2", "r3", "r4"],
    "prompt": ["q1", "q1", "q1", "q2"],
    "response": ["one", "two", "three", "four"],
})


def _accepted(scores: pd.DataFrame) -> int:
    return scores["annotation_id"].nunique()


def test_jsonl_scores_ranks_and_rankings_with_every_reason(tmp_path):
    lines = [
        {"prompt_id": "p1", "response_id": "r1", "score": 4.5, "annotator": "ann"},  # 0
        {"prompt_id": "p1", "response_id": "r2", "rank": 2, "annotator": "ann"},  # 1: score -2
        {"prompt_id": "p1", "response_id": "r3", "score": 1},  # 2: anonymous
        {"prompt_id": "p1", "ranking": ["r3", "r1", "r2"], "annotator": 5},  # 3: annotator "5"
        "{not json",  # 4
        [1, 2],  # 5
        {"prompt_id": "p1", "score": 3},  # 6: no response_id
        {"prompt_id": "p1", "response_id": "r1", "annotator": "bob"},  # 7: no score
        {"prompt_id": "p1", "response_id": "r1", "score": "high", "annotator": "bob"},  # 8
        {"prompt_id": "p1", "response_id": "r1", "score": True, "annotator": "bob"},  # 9
        {"prompt_id": "p1", "response_id": "r9", "score": 1, "annotator": "bob"},  # 10
        {"prompt_id": "p2", "response_id": "r1", "score": 1, "annotator": "bob"},  # 11
        {"prompt_id": "p1", "response_id": "r1", "score": 4.5, "annotator": "ann"},  # 12: same again
        {"prompt_id": "p1", "response_id": "r1", "score": 2, "annotator": "ann"},  # 13: another score
        {"prompt_id": "p1", "ranking": ["r1"], "annotator": "bob"},  # 14
        {"prompt_id": "p1", "ranking": ["r1", "r4"], "annotator": "bob"},  # 15
        {"prompt_id": "p1", "ranking": ["r1", "r3", "r2"], "annotator": 5},  # 16: another ranking
    ]
    path = tmp_path / "scores.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n\n")
    scores, quarantine = import_score_table(path, RESPONSES)
    unnamed = file_annotator(path)  # the file, by its bytes: a second vendor file without names is another annotator
    assert unnamed.startswith("file:") and len(unnamed) == 17
    assert scores[["score_id", "response_id", "score", "annotator", "source_index"]].values.tolist() == [
        ["score:r1:ann:r1", "r1", 4.5, "ann", 0],
        ["rank:r2:ann:r2", "r2", -2.0, "ann", 1],  # a rank: another scale than ann's score of r1
        [f"score:r3:{unnamed}:r3", "r3", 1.0, unnamed, 2],
        ["ranking:p1:5:r3", "r3", -1.0, "5", 3],
        ["ranking:p1:5:r1", "r1", -2.0, "5", 3],
        ["ranking:p1:5:r2", "r2", -3.0, "5", 3],
    ]  # fmt: skip
    validate_table("scores", scores)
    assert list(zip(quarantine["source_index"], quarantine["reason"])) == [
        (4, "malformed_json"), (5, "malformed_json"), (6, "missing_field"), (7, "missing_field"),
        (8, "not_a_number"), (9, "not_a_number"), (10, "unknown_response"), (11, "prompt_mismatch"),
        (12, "duplicate"), (13, "contradictory"), (14, "bad_ranking"), (15, "prompt_mismatch"), (16, "contradictory"),
    ]  # fmt: skip
    assert quarantine["raw"].iloc[0] == "{not json"
    assert _accepted(scores) + len(quarantine) == len(lines)


def test_csv_gz_streams_rows_and_keeps_the_raw_text(tmp_path):
    text = (
        "prompt_id,response_id,score,rank,annotator\r\n"
        "p1,r1,3,,ann\r\n"
        "p1,r2,,1,ann\r\n"  # rank 1 -> score -1
        "\r\n"  # a blank line is not a row
        'p1,"r3",nan,,ann\r\n'
        "p1,r3,2,,ann,extra\r\n"
        'p1,r3,"2,5",,bob\r\n'  # a quoted comma: "2,5" is not a number
        "p1,r3,inf,,bob\r\n"
        ",r3,1,,bob\r\n"
    )
    path = tmp_path / "scores.csv.gz"
    path.write_bytes(gzip.compress(text.encode("utf-8")))
    assert detect_table_format(path) == "csv"
    scores, quarantine = import_score_table(path, RESPONSES)
    assert list(zip(scores["response_id"], scores["score"], scores["source_index"])) == [("r1", 3.0, 0), ("r2", -1.0, 1)]
    assert list(zip(quarantine["source_index"], quarantine["reason"], quarantine["raw"])) == [
        (2, "not_a_number", 'p1,"r3",nan,,ann'),
        (3, "malformed_csv", "p1,r3,2,,ann,extra"),
        (4, "not_a_number", 'p1,r3,"2,5",,bob'),
        (5, "not_a_number", "p1,r3,inf,,bob"),
        (6, "missing_field", ",r3,1,,bob"),
    ]  # fmt: skip
    assert _accepted(scores) + len(quarantine) == 7


def test_parquet_over_row_groups_and_same_ids_as_jsonl(tmp_path):
    rows = {
        "prompt_id": ["p1", "p1", "p1", "p2", "p1"],
        "response_id": ["r1", "r2", "r3", "r4", None],
        "score": [5.0, 3.0, float("nan"), 1.0, 2.0],  # pyarrow keeps NaN as NaN (pandas would write null)
        "annotator": ["a", "a", "a", "b", "a"],
    }
    pq.write_table(pa.table(rows), tmp_path / "s.parquet", row_group_size=2)
    assert pq.ParquetFile(tmp_path / "s.parquet").num_row_groups == 3  # read as three record batches
    scores, quarantine = import_score_table(tmp_path / "s.parquet", RESPONSES)
    assert scores["score_id"].tolist() == ["score:r1:a:r1", "score:r2:a:r2", "score:r4:b:r4"]
    assert list(zip(quarantine["source_index"], quarantine["reason"])) == [(2, "not_a_number"), (4, "missing_field")]
    assert json.loads(quarantine["raw"].iloc[1])["response_id"] is None

    as_jsonl = tmp_path / "s.jsonl"
    as_jsonl.write_text(pd.DataFrame(rows).iloc[[0, 1, 3]].to_json(orient="records", lines=True))
    again, _ = import_score_table(as_jsonl, RESPONSES)
    assert again["score_id"].tolist() == scores["score_id"].tolist()
    assert again["score"].tolist() == scores["score"].tolist()


def test_whole_file_problems_raise_actionable_errors(tmp_path):
    with pytest.raises(ImportFormatError, match="cannot tell the score-table format"):
        import_score_table(tmp_path / "scores.txt", RESPONSES)
    bad_header = tmp_path / "a.csv"
    bad_header.write_text("prompt,answer,points\nq,x,1\n")
    with pytest.raises(ImportFormatError, match="lack prompt_id"):
        import_score_table(bad_header, RESPONSES)
    empty = tmp_path / "b.csv"
    empty.write_text("")
    with pytest.raises(ImportFormatError, match="empty CSV"):
        import_score_table(empty, RESPONSES)
    latin1 = tmp_path / "c.csv"
    latin1.write_bytes(b"prompt_id,response_id,score\np1,r1,1\np1,r\xe9,2\n")
    with pytest.raises(ImportFormatError, match="not UTF-8"):
        import_score_table(latin1, RESPONSES)
    not_parquet = tmp_path / "d.parquet"
    not_parquet.write_text("prompt_id,response_id,score\n")
    with pytest.raises(ImportFormatError, match="not a readable Parquet"):
        import_score_table(not_parquet, RESPONSES)
    broken_gz = tmp_path / "e.jsonl.gz"
    broken_gz.write_bytes(gzip.compress(b'{"prompt_id": "p1"}\n' * 100)[:30])
    with pytest.raises(ImportFormatError, match="broken gzip"):
        import_score_table(broken_gz, RESPONSES)
    assert detect_table_format("x.JSON") == "jsonl" and detect_table_format("x.parquet") == "parquet"
    rankings = tmp_path / "f.csv"  # passed the header check, then every row was "not a list of response ids"
    rankings.write_text('prompt_id,ranking\np1,"[""r1"", ""r2""]"\n')
    with pytest.raises(ImportFormatError, match="a CSV cannot hold rankings"):
        import_score_table(rankings, RESPONSES)


def test_annotator_7_is_7_from_csv_parquet_and_jsonl(tmp_path):
    """pandas writes an integer column with a gap as floats: 7.0 in Parquet and JSONL, the text "7.0" in a CSV."""
    frame = pd.DataFrame({"prompt_id": ["p1", "p1"], "response_id": ["r1", "r2"], "score": [1.0, 2.0],
                          "annotator": [7, None]})
    frame.to_csv(tmp_path / "s.csv", index=False)
    frame.to_parquet(tmp_path / "s.parquet")
    frame.to_json(tmp_path / "s.jsonl", orient="records", lines=True)
    assert "7.0" in (tmp_path / "s.csv").read_text()
    for name in ("s.csv", "s.parquet", "s.jsonl"):
        scores, _ = import_score_table(tmp_path / name, RESPONSES)
        assert scores["annotator"].tolist()[0] == "7", name


def test_byte_order_marks_are_not_errors(tmp_path):
    (tmp_path / "excel.csv").write_bytes(b"\xef\xbb\xbfprompt_id,response_id,score\r\np1,r1,2\r\n")
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"prompt_id": "p1", "response_id": "r1", "score": 2}\n')
    for name in ("excel.csv", "bom.jsonl"):
        scores, quarantine = import_score_table(tmp_path / name, RESPONSES)
        assert scores["score"].tolist() == [2.0] and quarantine.empty
