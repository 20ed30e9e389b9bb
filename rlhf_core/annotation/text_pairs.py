"""Import of text preference pairs from JSONL (plain or gzip) into the comparisons table.

Three formats, one JSON object per line (`detect_format` tells them apart, fmt="auto"):
- "trl": `{"prompt": ..., "chosen": ..., "rejected": ...}`, TRL's plain-text preference form.
- "trl_messages": the same keys holding lists of `{"role": ..., "content": ...}` messages, TRL's
  conversational form. Stored as text: prompt = "\\n\\n<Role>: <content>" per message plus a final
  "\\n\\nAssistant:" (the HH convention; role "user" is written "Human", so the same dialogue gets
  the same prompt_id in both formats); chosen / rejected = their messages' contents joined by "\\n\\n".
- "hh":  `{"chosen": ..., "rejected": ...}`, HH-RLHF's whole dialogues sharing every turn but the
  last Assistant reply; `split_hh_dialogue` cuts them into prompt and replies.

Any format may carry a Llama-2-style "margin_label" (see MARGIN_BY_LABEL); it becomes the extra
column `margin` (float, NaN for a row without one, absent or null).

The file (gzip if its name ends in ".gz") is read in binary, line by line (large files stream),
and each line is decoded by itself, so one bad line is quarantined instead of stopping the
import. Blank lines (only ASCII whitespace) are skipped and are not rows. Every other line is
a row and becomes either one comparison or one quarantine row (`source_index` = its 0-based
line number in the file, `reason`, `detail`, `raw` = the line as text): accepted + quarantined
= rows, always (checked before returning). Quarantine reasons, in the order they are checked:

    undecodable      bytes that are not UTF-8, or a string with a lone surrogate escape ("\\ud800")
    malformed_json   not a JSON value
    not_an_object    JSON, but not an object
    missing_field    a required field is absent
    not_a_string     a required field is not a string
    bad_messages     "trl_messages": a field is not a non-empty list of objects with string
                     "role" and "content"
    empty_text       a field (or, for "hh", a split-off reply) is empty or whitespace only
    prefix_mismatch  "hh": no "\\n\\nAssistant:" marker, or the dialogues differ before the last reply
    oversized_field  prompt, chosen or rejected longer than `max_field_chars` characters
    self_pair        chosen == rejected, up to Unicode form (NFC) and spaces around them: one text shown twice
    bad_margin_label "margin_label" present but not one of MARGIN_BY_LABEL
    duplicate        same prompt, chosen and rejected as an earlier accepted row of the file
    contradictory    the same prompt and two responses as an earlier accepted row, preferred the other way
                     (the first row stays accepted)

Ids are content hashes, so importing the same file twice gives identical tables:
    prompt_id = "p" + sha256(prompt)[:16]
    chosen_id = "r" + sha256(prompt + "\\0" + chosen)[:16]   (rejected_id likewise)
    pair_id   = pairs.comparison_pair_id(prompt_id, chosen_id, rejected_id)

Two front ends share one parsing loop (`_classified_rows`, one item per row, in file order):
`import_text_pairs` collects everything into DataFrames (small files, tests), and
`import_text_pairs_to` streams it into comparisons.parquet and quarantine.parquet, `batch_rows`
rows at a time, so its memory does not grow with the file except for the duplicate check:
    - each accepted row leaves 8 bytes behind: its pair_id's 64 hash bits in a sorted uint64
      array (16 bytes per accepted row for a moment while a merge copies the array); the digest
      is the pair_id itself, so the check is exact, and a duplicate is found in O(log n);
    - at most DIGEST_MERGE_EVERY recent digests wait in a Python set before each merge (about
      70 bytes each, under 5 MB in all);
    - everything else is bounded by batch_rows times the size of a row: one batch of accepted
      rows and one of quarantine rows (Python dicts, then an Arrow table), plus the current line.
So 1M accepted rows cost 8 MB for the duplicate check (docs/benchmark-annotation-import.md).
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import os
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from rlhf_core.annotation.label_studio import QUARANTINE_COLUMNS, ImportFormatError, comparable_text
from rlhf_core.annotation.pairs import comparison_pair_id
from rlhf_core.schemas import TABLES, SchemaError, validate_table

ASSISTANT, HUMAN = "\n\nAssistant:", "\n\nHuman:"
FIELDS = {
    "trl": ("prompt", "chosen", "rejected"),
    "trl_messages": ("prompt", "chosen", "rejected"),
    "hh": ("chosen", "rejected"),
}
COMPARISON_COLUMNS = [c.name for c in TABLES["comparisons"].columns]
OUTPUT_COLUMNS = [*COMPARISON_COLUMNS, "margin"]
ROLE_NAMES = {"user": "Human", "assistant": "Assistant", "system": "System"}  # others: capitalised
DETECT_LINES = 20
DIGEST_MERGE_EVERY = 65_536  # recent pair digests held in a Python set before they join the sorted array

_ARROW_TYPES = {"str": pa.string(), "int": pa.int64(), "float": pa.float64()}
COMPARISONS_ARROW_SCHEMA = pa.schema(
    [(c.name, _ARROW_TYPES[c.kind]) for c in TABLES["comparisons"].columns] + [("margin", pa.float64())]
)
QUARANTINE_ARROW_SCHEMA = pa.schema(
    [("source_index", pa.int64()), ("reason", pa.string()), ("detail", pa.string()), ("raw", pa.string())]
)

# Llama 2 (Touvron et al. 2023) §3.2.2: annotators also rate how much better the chosen reply is,
# and the reward model's loss subtracts a discrete margin per rating (these are the 3/2/1/0 of
# their "Margin Large", Table 28).
MARGIN_BY_LABEL = {
    "significantly better": 3.0,
    "better": 2.0,
    "slightly better": 1.0,
    "negligibly better": 0.0,
    "unsure": 0.0,
}


class _Rejected(Exception):
    """One row that cannot be accepted: a machine-readable reason and a human-readable detail."""

    def __init__(self, reason: str, detail: str):
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


def split_hh_dialogue(chosen: str, rejected: str) -> tuple[str, str, str]:
    """(prompt, chosen_reply, rejected_reply) from two HH-RLHF dialogues.

    prompt = the dialogues' common beginning up to and including its last "\\n\\nAssistant:" marker (a
    reply that itself holds the marker stays a reply: cutting at the chosen dialogue's last marker quarantined such
    a row); each reply is the rest of its dialogue with one leading space removed. Raises ValueError if `chosen`
    has no marker, the two differ before the last one they share, or a reply holds a later "\\n\\nHuman:" turn
    (the dialogues split at an earlier Assistant turn).
    """
    if ASSISTANT not in chosen:
        raise ValueError(f"chosen dialogue has no {ASSISTANT!r} marker")
    common = len(os.path.commonprefix([chosen, rejected]))
    cut = chosen.rfind(ASSISTANT, 0, common)
    if cut < 0:
        raise ValueError(f"rejected dialogue does not start with the chosen prompt (they differ at character {common})")
    prompt = chosen[: cut + len(ASSISTANT)]
    replies = chosen[len(prompt):].removeprefix(" "), rejected[len(prompt):].removeprefix(" ")
    if any(HUMAN in reply for reply in replies):  # they split at an earlier Assistant turn: not one last reply each
        raise ValueError(f"the dialogues differ before the last reply (at character {common}, and a later "
                         f"{HUMAN!r} turn follows): the pair must share every turn but the last Assistant reply")
    return (prompt, *replies)


def _sha16(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its newline) for every line; a ".gz" name means gzip. A UTF-8 byte-order mark
    (Windows tools write one) is dropped from the first line, as the score tables' reader does.

    A broken gzip stream is a problem of the whole file, not of a row: it raises ImportFormatError.
    """
    try:
        with (gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")) as f:
            for number, line in enumerate(f):
                if number == 0:
                    line = line.removeprefix(codecs.BOM_UTF8)
                yield number, line.rstrip(b"\r\n")
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise ImportFormatError(f"{path}: broken gzip stream ({err})") from None


def _load(line: bytes) -> object:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _Rejected("undecodable", f"not UTF-8 at byte {err.start}") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        raise _Rejected("malformed_json", str(err)[:200]) from None


def check_text_pairs(path: str | Path, rows: int = 100) -> None:
    """Raise ImportFormatError when the file as a whole is not JSON lines: none of its first `rows`
    non-blank lines decodes as UTF-8 JSON (a UTF-16 or binary file). Bad single rows are quarantined
    by the import, not refused here."""
    path, seen = Path(path), 0
    for _, line in _lines(path):
        if not line.strip():
            continue
        try:
            _load(line)
            return
        except _Rejected:
            seen += 1
        if seen >= rows:
            break
    if seen:
        raise ImportFormatError(f"{path}: none of its first {seen} lines is UTF-8 JSON (UTF-16 or binary?): "
                                "save it as UTF-8 JSONL")


def _object(obj: object, names: tuple[str, ...]) -> dict:
    """`obj` itself, checked to be a JSON object holding every named field."""
    if not isinstance(obj, dict):
        raise _Rejected("not_an_object", f"got a JSON {type(obj).__name__}")
    for name in names:
        if name not in obj:
            raise _Rejected("missing_field", f"no {name!r} field; present: {sorted(obj)[:10]}")
    return obj


def _check_unicode(name: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _Rejected("undecodable", f"{name!r} contains a lone surrogate escape") from None


def _fields(obj: object, names: tuple[str, ...]) -> list[str]:
    """The named string fields of a JSON object, each valid, non-empty Unicode."""
    obj = _object(obj, names)
    for name in names:
        if not isinstance(obj[name], str):
            raise _Rejected("not_a_string", f"{name!r} is a JSON {type(obj[name]).__name__}")
    for name in names:
        _check_unicode(name, obj[name])
    _check_not_empty({name: obj[name] for name in names})
    return [obj[name] for name in names]


def _check_not_empty(texts: dict[str, str]) -> None:
    for name, text in texts.items():
        if not text.strip():
            raise _Rejected("empty_text", f"{name!r} is empty or whitespace only")


def _messages(name: str, value: object) -> list[dict]:
    """A non-empty list of {"role": str, "content": str, ...} messages, or raise bad_messages."""
    if not isinstance(value, list) or not value:
        raise _Rejected("bad_messages", f"{name!r} is not a non-empty list of messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise _Rejected("bad_messages", f"{name}[{i}] is a JSON {type(message).__name__}, not an object")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise _Rejected("bad_messages", f"{name}[{i}] has no string {key!r}")
            _check_unicode(f"{name}[{i}].{key}", message[key])
    return value


def _conversation(obj: object) -> tuple[str, str, str]:
    """(prompt, chosen, rejected) as text from TRL's conversational form (see the module docstring)."""
    obj = _object(obj, FIELDS["trl_messages"])
    prompt, chosen, rejected = (_messages(name, obj[name]) for name in FIELDS["trl_messages"])
    turns = "".join(f"\n\n{ROLE_NAMES.get(m['role'], m['role'].capitalize())}: {m['content']}" for m in prompt)
    chosen_text = "\n\n".join(m["content"] for m in chosen)
    rejected_text = "\n\n".join(m["content"] for m in rejected)
    _check_not_empty({"chosen": chosen_text, "rejected": rejected_text})
    return turns + ASSISTANT, chosen_text, rejected_text


def _texts(obj: object, fmt: str) -> tuple[str, str, str]:
    """(prompt, chosen, rejected) of one parsed row, or raise _Rejected."""
    if fmt == "trl":
        return tuple(_fields(obj, FIELDS["trl"]))
    if fmt == "trl_messages":
        return _conversation(obj)
    try:
        prompt, chosen, rejected = split_hh_dialogue(*_fields(obj, FIELDS["hh"]))
    except ValueError as err:
        raise _Rejected("prefix_mismatch", str(err)) from None
    _check_not_empty({"chosen reply": chosen, "rejected reply": rejected})
    return prompt, chosen, rejected


def _margin(obj: dict) -> float:
    """The numeric margin of the row's "margin_label" (MARGIN_BY_LABEL); NaN when it has none."""
    label = obj.get("margin_label")
    if label is None:
        return float("nan")
    if not isinstance(label, str) or label not in MARGIN_BY_LABEL:
        raise _Rejected("bad_margin_label", f"margin_label {label!r}; known: {list(MARGIN_BY_LABEL)}")
    return MARGIN_BY_LABEL[label]


def _parse(line: bytes, fmt: str, max_field_chars: int) -> tuple[dict[str, str], float]:
    """({prompt, chosen, rejected}, margin) of one row, or raise _Rejected."""
    obj = _load(line)
    prompt, chosen, rejected = _texts(obj, fmt)
    texts = {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    for name, text in texts.items():
        if len(text) > max_field_chars:
            detail = f"{name!r} has {len(text)} characters > max_field_chars={max_field_chars}"
            raise _Rejected("oversized_field", detail)
    if comparable_text(chosen) == comparable_text(rejected):
        raise _Rejected("self_pair", "chosen == rejected (up to Unicode form and surrounding spaces)")
    return texts, _margin(obj)


def _comparison(prompt: str, chosen: str, rejected: str) -> dict:
    prompt_id = "p" + _sha16(prompt)
    chosen_id = "r" + _sha16(prompt + "\0" + chosen)
    rejected_id = "r" + _sha16(prompt + "\0" + rejected)
    return {
        "pair_id": comparison_pair_id(prompt_id, chosen_id, rejected_id),
        "prompt_id": prompt_id,
        "prompt": prompt,
        "chosen": chosen,
        "rejected": rejected,
        "chosen_id": chosen_id,
        "rejected_id": rejected_id,
        "n_labels": 1,  # one human judgement per pair in these data sets
        "label_agreement": 1.0,
    }


def _kind(obj: dict) -> Literal["hh", "trl", "trl_messages"] | None:
    prompt = obj.get("prompt")
    if isinstance(prompt, list):
        return "trl_messages"
    if isinstance(prompt, str):
        return "trl"
    if "prompt" not in obj and isinstance(obj.get("chosen"), str) and isinstance(obj.get("rejected"), str):
        return "hh"  # a dialogue each; lists there are TRL's implicit-prompt messages, which no format here reads
    return None


def detect_format(path: str | Path, kind: Callable[[dict], str | None] = _kind,
                  formats: str = "fmt='hh', fmt='trl' or fmt='trl_messages'") -> str:
    """The format of a JSONL file of text pairs, told by the first of its first DETECT_LINES
    JSON-object lines that fits one: "prompt" a list → "trl_messages", a string → "trl";
    no "prompt" but "chosen" and "rejected" strings → "hh". None fits: ImportFormatError (a ValueError) naming
    `formats` (and, for rows of chosen / rejected message lists without a prompt, what to do). `kind`: another line
    classifier (the importer's also knows score-table rows).
    """
    seen: list[list[str]] = []
    for _, line in _lines(Path(path)):
        try:
            obj = _load(line) if line.strip() else None
        except _Rejected:
            continue
        if not isinstance(obj, dict):
            continue
        if fmt := kind(obj):
            return fmt
        seen.append(sorted(obj)[:8])
        if len(seen) == DETECT_LINES:
            break
    implicit = any("prompt" not in keys and {"chosen", "rejected"} <= set(keys) for keys in seen)
    raise ImportFormatError(
        f"{path}: cannot tell the format from {len(seen)} JSON object line(s) "
        f"(keys of the first: {seen[:3]}); pass {formats}"
        + ("; rows of chosen / rejected message lists without a prompt (TRL's implicit prompt) are not read: give "
           "each row its prompt messages (trl_messages: prompt, chosen and rejected lists)" if implicit else "")
    )


class _PairDigests:
    """The pair_ids accepted so far, as their 64 hash bits: 8 bytes each once merged.

    New digests go into a small Python set; every DIGEST_MERGE_EVERY of them are merged into one
    sorted uint64 array, which is searched by bisection.
    """

    def __init__(self) -> None:
        self._sorted = np.empty(0, dtype=np.uint64)
        self._recent: set[int] = set()

    def __contains__(self, digest: int) -> bool:
        if digest in self._recent:
            return True
        key = np.uint64(digest)  # a Python int would make numpy compare in float64, copying the array
        i = int(self._sorted.searchsorted(key))
        return i < self._sorted.size and self._sorted[i] == key

    def add(self, digest: int) -> None:
        self._recent.add(digest)
        if len(self._recent) >= DIGEST_MERGE_EVERY:
            recent = np.sort(np.fromiter(self._recent, dtype=np.uint64, count=len(self._recent)))
            self._sorted = np.insert(self._sorted, self._sorted.searchsorted(recent), recent)
            self._recent.clear()


def reversed_pair_id(row: dict) -> str:
    """The pair_id of the same comparison with chosen and rejected swapped."""
    return comparison_pair_id(row["prompt_id"], row["rejected_id"], row["chosen_id"])


def _pair_digest(pair_id: str) -> int:
    """The 64 bits of a pair_id ("c" + 16 hex digits): equal digests mean equal pair_ids."""
    return int(pair_id[1:], 16)


def _classified_rows(path: Path, fmt: str, max_field_chars: int) -> Iterator[tuple[dict | None, dict | None]]:
    """One item per row of the file, in file order: (comparison row with `margin`, None) if the
    row is accepted, (None, quarantine row) if not. Blank lines are not rows and give nothing."""
    seen = _PairDigests()
    for number, line in _lines(path):
        if not line.strip():
            continue
        try:
            texts, margin = _parse(line, fmt, max_field_chars)
            row = {**_comparison(**texts), "margin": margin}
            digest = _pair_digest(row["pair_id"])
            if digest in seen:
                raise _Rejected("duplicate", f"same pair as an earlier row (pair_id {row['pair_id']})")
            if _pair_digest(reversed_pair_id(row)) in seen:
                raise _Rejected("contradictory", "the same two responses as an earlier row, preferred the other "
                                f"way (pair_id {reversed_pair_id(row)}); the first is kept")
        except _Rejected as rejected:
            raw = line.decode("utf-8", errors="backslashreplace")
            yield None, dict(zip(QUARANTINE_COLUMNS, (number, rejected.reason, rejected.detail, raw)))
            continue
        seen.add(digest)
        yield row, None


def _resolve_format(path: str | Path, fmt: str) -> str:
    """`fmt` itself, or the detected format for "auto"; an unknown name raises ValueError."""
    if fmt == "auto":
        return detect_format(path)
    if fmt not in FIELDS:
        raise ValueError(f"unknown format {fmt!r}; known: {['auto', *FIELDS]}")
    return fmt


def import_text_pairs(
    path: str | Path, fmt: Literal["auto", "hh", "trl", "trl_messages"] = "auto", max_field_chars: int = 20_000
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (comparisons + `margin`, quarantine) from a JSONL file of text pairs (see the module docstring).

    Holds the whole result in memory; `import_text_pairs_to` streams a large file to Parquet instead.
    fmt="auto" asks `detect_format`, which raises ImportFormatError on a file it cannot tell (an empty one too).
    """
    fmt = _resolve_format(path, fmt)
    accepted, quarantined, n_rows = [], [], 0
    for comparison, quarantine_row in _classified_rows(Path(path), fmt, max_field_chars):
        n_rows += 1
        if comparison is not None:
            accepted.append(comparison)
        else:
            quarantined.append(quarantine_row)
    comparisons = pd.DataFrame(accepted, columns=OUTPUT_COLUMNS).astype({"margin": float})
    validate_table("comparisons", comparisons)
    quarantine = pd.DataFrame(quarantined, columns=QUARANTINE_COLUMNS)
    if len(comparisons) + len(quarantine) != n_rows:  # the invariant the whole import rests on
        raise AssertionError(f"import lost rows: {len(comparisons)} + {len(quarantine)} != {n_rows}")
    return comparisons, quarantine


@dataclass(frozen=True)
class ImportSummary:
    """What `import_text_pairs_to` read and wrote; accepted + quarantined == rows."""

    fmt: str
    rows: int  # non-blank lines of the file
    accepted: int  # rows of comparisons.parquet
    quarantined: int  # rows of quarantine.parquet
    reasons: dict[str, int]  # quarantine reason -> number of rows, in order of first appearance
    comparisons_path: Path
    quarantine_path: Path


class _ParquetBatches:
    """Rows appended one at a time, written to an open ParquetWriter `batch_rows` at a time."""

    def __init__(self, name: str, writer: pq.ParquetWriter, batch_rows: int):
        self.name, self.writer, self.batch_rows = name, writer, batch_rows
        self.pending: list[dict] = []

    def append(self, row: dict) -> None:
        self.pending.append(row)
        if len(self.pending) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        table = pa.Table.from_pylist(self.pending, schema=self.writer.schema)
        nulls = [name for name, column in zip(table.column_names, table.columns) if column.null_count]
        if nulls:  # every column is required; Arrow's types alone would let a None through
            raise SchemaError(f"{self.name}: null values in column(s) {nulls}")
        self.writer.write_table(table)
        self.pending = []


def _temp_path(out_dir: Path, name: str) -> Path:
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    return Path(tmp)


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def import_text_pairs_to(
    path: str | Path,
    out_dir: str | Path,
    fmt: Literal["auto", "hh", "trl", "trl_messages"] = "auto",
    max_field_chars: int = 20_000,
    batch_rows: int = 20_000,
) -> ImportSummary:
    """Stream a JSONL file of text pairs into out_dir/comparisons.parquet (+ `margin`) and
    out_dir/quarantine.parquet, `batch_rows` rows at a time (memory: see the module docstring).

    The rows are those `import_text_pairs` returns, in the same order and types; the comparisons
    file reads back with `schemas.read_table("comparisons", ...)`. Both files are written under
    temporary names in out_dir and renamed into place only when the whole file was read, quarantine
    first and comparisons last: after a failure there is no new comparisons.parquet.
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
    fmt = _resolve_format(path, fmt)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = {"quarantine": out_dir / "quarantine.parquet", "comparisons": out_dir / "comparisons.parquet"}
    temps = {name: _temp_path(out_dir, target.name) for name, target in targets.items()}
    try:
        n_rows, reasons = 0, Counter()
        with (
            pq.ParquetWriter(temps["comparisons"], COMPARISONS_ARROW_SCHEMA) as comparisons_writer,
            pq.ParquetWriter(temps["quarantine"], QUARANTINE_ARROW_SCHEMA) as quarantine_writer,
        ):
            comparisons = _ParquetBatches("comparisons", comparisons_writer, batch_rows)
            quarantine = _ParquetBatches("quarantine", quarantine_writer, batch_rows)
            for comparison, quarantine_row in _classified_rows(Path(path), fmt, max_field_chars):
                n_rows += 1
                if comparison is not None:
                    comparisons.append(comparison)
                else:
                    reasons[quarantine_row["reason"]] += 1
                    quarantine.append(quarantine_row)
            comparisons.flush()
            quarantine.flush()
        written = {name: pq.ParquetFile(tmp).metadata.num_rows for name, tmp in temps.items()}
        if written["comparisons"] + written["quarantine"] != n_rows:  # the invariant the whole import rests on
            raise AssertionError(f"import lost rows: {written['comparisons']} + {written['quarantine']} != {n_rows}")
        for name, tmp in temps.items():  # quarantine first: a comparisons.parquet never lacks its quarantine
            _fsync(tmp)
            os.replace(tmp, targets[name])
    except BaseException:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        raise
    return ImportSummary(
        fmt=fmt,
        rows=n_rows,
        accepted=written["comparisons"],
        quarantined=written["quarantine"],
        reasons=dict(reasons),
        comparisons_path=targets["comparisons"],
        quarantine_path=targets["quarantine"],
    )
