"""Import of text preference pairs from JSONL (plain or gzip) into the comparisons table.

Two formats, one JSON object per line:
- "trl": `{"prompt": ..., "chosen": ..., "rejected": ...}`, TRL's plain-text preference form.
- "hh":  `{"chosen": ..., "rejected": ...}`, HH-RLHF's whole dialogues sharing every turn but the
  last Assistant reply; `split_hh_dialogue` cuts them into prompt and replies.

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
    empty_text       a field (or, for "hh", a split-off reply) is empty or whitespace only
    prefix_mismatch  "hh": no "\\n\\nAssistant:" marker, or the dialogues differ before the last reply
    oversized_field  prompt, chosen or rejected longer than `max_field_chars` characters
    self_pair        chosen == rejected
    duplicate        same prompt, chosen and rejected as an earlier accepted row of the file

Ids are content hashes, so importing the same file twice gives identical tables:
    prompt_id = "p" + sha256(prompt)[:16]
    chosen_id = "r" + sha256(prompt + "\\0" + chosen)[:16]   (rejected_id likewise)
    pair_id   = "c" + sha256(prompt_id + chosen_id + rejected_id)[:16]
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pandas as pd

from rlhf_core.annotation.label_studio import QUARANTINE_COLUMNS, ImportFormatError
from rlhf_core.schemas import TABLES, validate_table

ASSISTANT = "\n\nAssistant:"
FIELDS = {"trl": ("prompt", "chosen", "rejected"), "hh": ("chosen", "rejected")}
COMPARISON_COLUMNS = [c.name for c in TABLES["comparisons"].columns]


class _Rejected(Exception):
    """One row that cannot be accepted: a machine-readable reason and a human-readable detail."""

    def __init__(self, reason: str, detail: str):
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


def split_hh_dialogue(chosen: str, rejected: str) -> tuple[str, str, str]:
    """(prompt, chosen_reply, rejected_reply) from two HH-RLHF dialogues.

    prompt = `chosen` up to and including its last "\\n\\nAssistant:" marker; each reply is the
    rest of its dialogue with one leading space removed. Raises ValueError if `chosen` has no
    marker or `rejected` does not start with the same prompt.
    """
    cut = chosen.rfind(ASSISTANT)
    if cut < 0:
        raise ValueError(f"chosen dialogue has no {ASSISTANT!r} marker")
    prompt = chosen[: cut + len(ASSISTANT)]
    if not rejected.startswith(prompt):
        at = next((i for i, (a, b) in enumerate(zip(prompt, rejected)) if a != b), min(len(prompt), len(rejected)))
        raise ValueError(f"rejected dialogue does not start with the chosen prompt (they differ at character {at})")
    return prompt, chosen[len(prompt):].removeprefix(" "), rejected[len(prompt):].removeprefix(" ")


def _sha16(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its newline) for every line; a ".gz" name means gzip.

    A broken gzip stream is a problem of the whole file, not of a row: it raises ImportFormatError.
    """
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            for number, line in enumerate(f):
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


def _fields(obj: object, names: tuple[str, ...]) -> list[str]:
    """The named string fields of a JSON object, each valid, non-empty Unicode."""
    if not isinstance(obj, dict):
        raise _Rejected("not_an_object", f"got a JSON {type(obj).__name__}")
    for name in names:
        if name not in obj:
            raise _Rejected("missing_field", f"no {name!r} field; present: {sorted(obj)[:10]}")
    for name in names:
        if not isinstance(obj[name], str):
            raise _Rejected("not_a_string", f"{name!r} is a JSON {type(obj[name]).__name__}")
    for name in names:
        try:
            obj[name].encode("utf-8")
        except UnicodeEncodeError:
            raise _Rejected("undecodable", f"{name!r} contains a lone surrogate escape") from None
    _check_not_empty({name: obj[name] for name in names})
    return [obj[name] for name in names]


def _check_not_empty(texts: dict[str, str]) -> None:
    for name, text in texts.items():
        if not text.strip():
            raise _Rejected("empty_text", f"{name!r} is empty or whitespace only")


def _parse(line: bytes, fmt: str, max_field_chars: int) -> dict[str, str]:
    """{prompt, chosen, rejected} of one row, or raise _Rejected."""
    obj = _load(line)
    if fmt == "trl":
        prompt, chosen, rejected = _fields(obj, FIELDS["trl"])
    else:
        try:
            prompt, chosen, rejected = split_hh_dialogue(*_fields(obj, FIELDS["hh"]))
        except ValueError as err:
            raise _Rejected("prefix_mismatch", str(err)) from None
        _check_not_empty({"chosen reply": chosen, "rejected reply": rejected})
    texts = {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    for name, text in texts.items():
        if len(text) > max_field_chars:
            detail = f"{name!r} has {len(text)} characters > max_field_chars={max_field_chars}"
            raise _Rejected("oversized_field", detail)
    if chosen == rejected:
        raise _Rejected("self_pair", "chosen == rejected")
    return texts


def _comparison(prompt: str, chosen: str, rejected: str) -> dict:
    prompt_id = "p" + _sha16(prompt)
    chosen_id = "r" + _sha16(prompt + "\0" + chosen)
    rejected_id = "r" + _sha16(prompt + "\0" + rejected)
    return {
        "pair_id": "c" + _sha16(prompt_id + chosen_id + rejected_id),
        "prompt_id": prompt_id,
        "prompt": prompt,
        "chosen": chosen,
        "rejected": rejected,
        "chosen_id": chosen_id,
        "rejected_id": rejected_id,
        "n_labels": 1,  # one human judgement per pair in these data sets
        "label_agreement": 1.0,
    }


def import_text_pairs(
    path: str | Path, fmt: Literal["hh", "trl"], max_field_chars: int = 20_000
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (comparisons, quarantine) from a JSONL file of text pairs (see the module docstring)."""
    if fmt not in FIELDS:
        raise ValueError(f"unknown format {fmt!r}; known: {sorted(FIELDS)}")
    accepted, quarantined, n_rows = [], [], 0
    seen: set[str] = set()
    for number, line in _lines(Path(path)):
        if not line.strip():
            continue
        n_rows += 1
        try:
            row = _comparison(**_parse(line, fmt, max_field_chars))
            if row["pair_id"] in seen:
                raise _Rejected("duplicate", f"same pair as an earlier row (pair_id {row['pair_id']})")
        except _Rejected as rejected:
            raw = line.decode("utf-8", errors="backslashreplace")
            quarantined.append((number, rejected.reason, rejected.detail, raw))
            continue
        seen.add(row["pair_id"])
        accepted.append(row)
    comparisons = validate_table("comparisons", pd.DataFrame(accepted, columns=COMPARISON_COLUMNS))
    quarantine = pd.DataFrame(quarantined, columns=QUARANTINE_COLUMNS)
    if len(comparisons) + len(quarantine) != n_rows:  # the invariant the whole import rests on
        raise AssertionError(f"import lost rows: {len(comparisons)} + {len(quarantine)} != {n_rows}")
    return comparisons, quarantine
