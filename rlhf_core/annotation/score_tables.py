"""Import of per-response scores, ranks or rankings from JSONL, CSV or Parquet into the scores table.

A row is one of
    a score   prompt_id, response_id, score (a finite number, higher is better), annotator (optional)
    a rank    the same with `rank` instead of `score` (1 = best): score = -rank
              (a row with both uses `score`)
    a ranking JSONL / Parquet only: prompt_id, ranking (response ids, best first, >= 2, distinct),
              annotator (optional) -> one scores row per id, score = -position (the first is -1);
              the checks are label_studio.check_ranking, as for a Label Studio Ranker
A missing (absent, null, or an empty CSV cell) annotator is the file (`file:` + 12 hex of its sha256): one
annotator per file; the same file added again is a duplicate, another file another annotator. Files stream: JSONL line by line,
CSV row by row (the csv module, first row = header), Parquet by record batches. The format comes
from the file name (.jsonl / .json -> jsonl, .csv, .parquet; .gz for jsonl and csv) or fmt.

Judgement ids (content-derived, so the same judgement has the same id in every file):
    annotation_id = f"score:{response_id}:{annotator}" for a score row,
                    f"rank:{response_id}:{annotator}" for a rank row (RANK_ROW; an annotator's ranks of a
                    prompt are one ranking, another scale than their scores: annotation/aggregate.py),
                    f"ranking:{prompt_id}:{annotator}" for a ranking row
    score_id      = f"{annotation_id}:{response_id}"

Blank lines are not rows, nor is the CSV header. Every row becomes one accepted judgement or one
quarantine row (`source_index` = 0-based data row number, also an extra column of the scores;
`raw` = the line as text, for Parquet the row as JSON): distinct annotation_id in scores +
len(quarantine) = rows, always (checked). Quarantine reasons, in the order they are checked:

    malformed_json    JSONL: not UTF-8, not JSON, or not a JSON object
    malformed_csv     CSV: not the header's number of fields, or a row the csv module rejects
    missing_field     prompt_id / response_id not a non-empty string, no score or rank (or ranking),
                      or an annotator that is neither a string nor an integer
    undecodable       an id or annotator with a lone surrogate escape ("\\ud800")
    not_a_number      score or rank not a finite number (CSV cells are parsed as floats)
    bad_ranking       a ranking that is not >= 2 distinct response id strings
    unknown_response  a response id not in the responses table
    prompt_mismatch   a response that belongs to another prompt
    duplicate         the same annotation_id as an earlier row of the file, the same judgement
    contradictory     the same annotation_id (same annotator and response for scores, the same for ranks,
                      or same annotator and prompt for rankings) with another score, rank or ranking; the
                      first is kept

Whole-file problems raise ImportFormatError: a broken gzip stream, a CSV that is not UTF-8 or has
no header or lacks the needed columns, a file that is not Parquet, an unknown suffix.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from rlhf_core.annotation.label_studio import (
    QUARANTINE_COLUMNS,
    SCORE_COLUMNS,
    ImportFormatError,
    Rejected,
    check_not_repeated,
    check_ranking,
    check_response,
    check_unicode,
    finite_number,
    text_field,
    to_json,
)
from rlhf_core.artifacts import sha256_file

FORMATS = ("jsonl", "csv", "parquet")
RANK_ROW = "rank:"  # the annotation_id prefix of a rank row
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
PARQUET_BATCH_ROWS = 10_000


@dataclass(frozen=True)
class _Judgement:
    annotation_id: str
    prompt_id: str
    annotator: str
    scored: tuple[tuple[str, float], ...]  # (response_id, score), best first for a ranking


def detect_table_format(path: str | Path) -> Literal["jsonl", "csv", "parquet"]:
    """The format told by the file name: .jsonl / .json / .ndjson, .csv (each optionally .gz), .parquet."""
    path = Path(path)
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
        if suffixes and SUFFIXES.get(suffixes[-1]) == "parquet":
            suffixes = []  # Parquet compresses inside the file
    fmt = SUFFIXES.get(suffixes[-1]) if suffixes else None
    if fmt is None:
        raise ImportFormatError(f"{path}: cannot tell the score-table format from the name; expected .jsonl, .json, "
                                ".csv (optionally .gz) or .parquet, or pass fmt='jsonl' | 'csv' | 'parquet'")
    return fmt


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")


def _jsonl_records(path: Path) -> Iterator[tuple[object, str]]:
    """(parsed object or Rejected, raw line) per non-blank line."""
    try:
        with _open_binary(path) as f:
            for line in f:
                line = line.rstrip(b"\r\n")
                if not line.strip():
                    continue
                raw = line.decode("utf-8", errors="backslashreplace")
                try:
                    yield json.loads(line.decode("utf-8-sig")), raw  # -sig: a byte-order mark is not an error
                except UnicodeDecodeError as err:
                    yield Rejected("malformed_json", f"not UTF-8 at byte {err.start}"), raw
                except (ValueError, RecursionError) as err:
                    yield Rejected("malformed_json", str(err)[:200]), raw
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise ImportFormatError(f"{path}: broken gzip stream ({err})") from None


class _RecordingLines:
    """Iterates a text file's lines and keeps those the csv reader took for its current row."""

    def __init__(self, lines):
        self.lines, self.taken = lines, []

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = next(self.lines)
        self.taken.append(line)
        return line


def _check_columns(path: Path, names: list[str], csv_file: bool = False) -> None:
    scored = "response_id" in names and {"score", "rank"} & set(names)
    if "prompt_id" in names and (scored or ("ranking" in names and not csv_file)):
        return
    if csv_file and "prompt_id" in names and "ranking" in names:  # a CSV cell holds text, not a list of ids
        raise ImportFormatError(f"{path}: a CSV cannot hold rankings (its 'ranking' column); write one row per "
                                "response with prompt_id, response_id and rank, or the rankings as JSONL or Parquet")
    raise ImportFormatError(f"{path}: columns {names[:20]} lack prompt_id and either response_id with score or rank, "
                            "or ranking; rename the columns to these names")


def _csv_records(path: Path) -> Iterator[tuple[object, str]]:
    """(record dict or Rejected, raw text) per non-blank data row; empty cells are None."""
    try:
        # utf-8-sig: spreadsheets start their CSV with a byte-order mark, which must not rename the first column
        with (gzip.open(path, "rt", encoding="utf-8-sig", newline="") if path.suffix.lower() == ".gz"
              else open(path, encoding="utf-8-sig", newline="")) as f:
            lines = _RecordingLines(f)
            reader = csv.reader(lines)
            header = next(reader, None)
            if header is None:
                raise ImportFormatError(f"{path}: empty CSV file; the first row must name the columns")
            _check_columns(path, header, csv_file=True)
            while True:
                lines.taken.clear()
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error as err:
                    yield Rejected("malformed_csv", str(err)), "".join(lines.taken).rstrip("\r\n")
                    continue
                raw = "".join(lines.taken).rstrip("\r\n")
                if not row:  # a blank line
                    continue
                if len(row) != len(header):
                    yield Rejected("malformed_csv", f"{len(row)} fields, the header has {len(header)}"), raw
                    continue
                yield {name: (cell if cell != "" else None) for name, cell in zip(header, row)}, raw
    except UnicodeDecodeError as err:
        raise ImportFormatError(f"{path}: not UTF-8 text ({err}); re-save the CSV as UTF-8") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise ImportFormatError(f"{path}: broken gzip stream ({err})") from None


def _parquet_records(path: Path) -> Iterator[tuple[object, str]]:
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise ImportFormatError(f"{path}: not a readable Parquet file ({err})") from None
    _check_columns(path, parquet.schema_arrow.names)
    try:
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for record in batch.to_pylist():
                yield record, to_json(record)
    except (pa.ArrowException, OSError) as err:
        raise ImportFormatError(f"{path}: a broken Parquet file ({err})") from None


def _annotator(record: dict, unnamed: str) -> str:
    """The row's annotator: a string, or an integer (also as a whole float, or in a CSV the text of one, "7.0":
    pandas writes an integer column with a gap as floats, so annotator 7 is "7" from every format); `unnamed` when
    it has none."""
    who = record.get("annotator")
    if who is None or who == "" or (isinstance(who, float) and math.isnan(who)):
        return unnamed
    if isinstance(who, float) and who.is_integer():
        who = int(who)
    if isinstance(who, str) and re.fullmatch(r"-?[0-9]+\.0+", who):
        who = who.split(".")[0]
    if isinstance(who, bool) or not isinstance(who, (str, int)):
        raise Rejected("missing_field", f"annotator {who!r} is neither a string nor an integer")
    return check_unicode(str(who), "annotator")


def file_annotator(path: Path) -> str:
    """The annotator of a file's rows that name none: the file, by its bytes (`file:` + 12 hex of its sha256).
    Two such files are two annotators (a vendor's file per annotator), the same file added again is a duplicate;
    before, every unnamed row was annotator "" and a second file's rows were quarantined as the first's."""
    return f"file:{sha256_file(path)[:12]}"


def _number(record: dict, name: str) -> float:
    value = record[name]
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise Rejected("not_a_number", f"{name} {record[name]!r} is not a number") from None
    number = finite_number(value)
    if number is None:
        raise Rejected("not_a_number", f"{name} {record[name]!r} is not a finite number")
    return number


def _judgement(record: object, known: dict[str, str], unnamed: str) -> _Judgement:
    """The judgement of one row, or raise Rejected (reasons in the module docstring)."""
    if not isinstance(record, dict):
        raise Rejected("malformed_json", f"a JSON {type(record).__name__}, not an object")
    prompt_id = text_field(record, "prompt_id", where="row")
    annotator = _annotator(record, unnamed)
    if record.get("ranking") is not None:
        ranking = check_ranking(record["ranking"], prompt_id, known)
        scored = tuple((rid, -float(position)) for position, rid in enumerate(ranking, start=1))
        return _Judgement(f"ranking:{prompt_id}:{annotator}", prompt_id, annotator, scored)
    response_id = text_field(record, "response_id", where="row")
    if record.get("score") is not None:
        kind, score = "score:", _number(record, "score")
    elif record.get("rank") is not None:
        kind, score = RANK_ROW, -_number(record, "rank")
    else:
        raise Rejected("missing_field", "the row has no score, rank or ranking")
    check_response(response_id, prompt_id, known)
    return _Judgement(f"{kind}{response_id}:{annotator}", prompt_id, annotator, ((response_id, score),))


def check_score_table(path: str | Path, rows: int = 100) -> None:
    """Raise ImportFormatError when the file as a whole is not a score table: an unreadable Parquet
    file or CSV header, missing columns, or none of its first `rows` rows readable (binary, UTF-16)."""
    path = Path(path)
    records = {"jsonl": _jsonl_records, "csv": _csv_records, "parquet": _parquet_records}[detect_table_format(path)]
    seen = 0
    for record, _ in records(path):
        if not isinstance(record, Rejected):
            return
        seen += 1
        if seen >= rows:
            break
    if seen:
        raise ImportFormatError(f"{path}: none of its first {seen} rows can be read (UTF-16 or binary?): save it as "
                                "UTF-8 JSONL or CSV, or Parquet")


def import_score_table(
    path: str | Path, responses: pd.DataFrame, fmt: Literal["auto", "jsonl", "csv", "parquet"] = "auto"
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (scores + source_index, quarantine) from a file of scores, ranks or rankings (see the
    module docstring). `responses`: the responses table (response_id, prompt_id)."""
    path = Path(path)
    fmt = detect_table_format(path) if fmt == "auto" else fmt
    records = {"jsonl": _jsonl_records, "csv": _csv_records, "parquet": _parquet_records}.get(fmt)
    if records is None:
        raise ValueError(f"unknown format {fmt!r}; known: {['auto', *FORMATS]}")
    known = dict(zip(responses["response_id"], responses["prompt_id"]))
    rows, quarantined, n_rows = [], [], 0
    first: dict[str, _Judgement] = {}  # annotation_id -> its accepted judgement
    unnamed = file_annotator(path)
    for source_index, (record, raw) in enumerate(records(path)):
        n_rows += 1
        try:
            if isinstance(record, Rejected):
                raise record
            judgement = _judgement(record, known, unnamed)
            check_not_repeated(first, judgement.annotation_id, judgement,
                               f"{judgement.annotation_id} was already given by an earlier row")
        except Rejected as rejected:
            quarantined.append((source_index, rejected.reason, rejected.detail, raw))
            continue
        first[judgement.annotation_id] = judgement
        rows += [{"score_id": f"{judgement.annotation_id}:{rid}", "annotation_id": judgement.annotation_id,
                  "prompt_id": judgement.prompt_id, "response_id": rid, "score": score,
                  "annotator": judgement.annotator, "raw": raw, "source_index": source_index}
                 for rid, score in judgement.scored]
    scores = pd.DataFrame(rows, columns=SCORE_COLUMNS).astype({"score": float})
    quarantine = pd.DataFrame(quarantined, columns=QUARANTINE_COLUMNS)
    if scores["annotation_id"].nunique() + len(quarantine) != n_rows:  # the invariant the whole import rests on
        raise AssertionError(f"import lost rows: {scores['annotation_id'].nunique()} + {len(quarantine)} != {n_rows}")
    return scores, quarantine
