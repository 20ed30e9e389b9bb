"""Import of Label Studio JSON exports (pairwise template) into the annotations table.

Every annotation in the export becomes either one row of `annotations` or one row of the
quarantine table with a machine-readable reason; a task with no annotation at all is one
quarantined row. So accepted + quarantined = input rows, always (checked before returning).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

QUARANTINE_COLUMNS = ["source_index", "reason", "detail", "raw"]


class ImportFormatError(ValueError):
    """The file as a whole cannot be read as this format."""


def read_export(path: str | Path) -> list[dict]:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ImportFormatError(f"{path}: not UTF-8 text ({err})") from None
    except json.JSONDecodeError as err:
        raise ImportFormatError(f"{path}: not valid JSON at line {err.lineno} column {err.colno}: {err.msg}") from None
    if not isinstance(data, list):
        raise ImportFormatError(f"{path}: a Label Studio JSON export is a list of tasks, got {type(data).__name__}")
    return data


def _pairwise_choice(annotation: dict) -> str | None:
    for result in annotation.get("result") or []:
        if isinstance(result, dict) and result.get("type") == "pairwise":
            selected = (result.get("value") or {}).get("selected")
            return {"left": "a", "right": "b"}.get(selected)
    return None


def _check(task: dict, annotation: dict, known_responses: dict[str, str]) -> tuple[str, str] | None:
    """(reason, detail) if this annotation cannot be accepted, else None."""
    data = task.get("data") if isinstance(task, dict) else None
    if not isinstance(data, dict):
        return "missing_data", "task has no 'data' object"
    for field in ("prompt_id", "answer1_id", "answer2_id"):
        if not isinstance(data.get(field), str) or not data.get(field):
            return "missing_field", f"data.{field} is missing or not a string"
    a, b = data["answer1_id"], data["answer2_id"]
    if a == b:
        return "self_pair", f"answer1_id == answer2_id == {a}"
    for rid in (a, b):
        if rid not in known_responses:
            return "unknown_response", f"response id {rid} is not in the responses artifact"
        if known_responses[rid] != data["prompt_id"]:
            return "prompt_mismatch", f"response {rid} belongs to prompt {known_responses[rid]}, not {data['prompt_id']}"
    if not isinstance(annotation, dict):
        return "malformed_annotation", "annotation is not an object"
    if annotation.get("was_cancelled"):
        return "cancelled", "annotator skipped the task"
    if _pairwise_choice(annotation) is None:
        return "no_choice", "no pairwise result with selected left/right"
    return None


def import_label_studio(export: list[dict], responses: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (annotations, quarantine) tables from a pairwise Label Studio export."""
    known = dict(zip(responses["response_id"], responses["prompt_id"]))
    accepted, quarantined, n_input = [], [], 0
    seen: set[tuple[str, str]] = set()
    for t_index, task in enumerate(export):
        annotations = task.get("annotations") if isinstance(task, dict) else None
        if not annotations:
            n_input += 1
            quarantined.append((t_index, "no_annotations", "task has no annotations", json.dumps(task)))
            continue
        for annotation in annotations:
            n_input += 1
            raw = json.dumps({"task_id": task.get("id"), "data": task.get("data"), "annotation": annotation})
            problem = _check(task, annotation, known)
            data = task.get("data") or {}
            annotator = str(annotation.get("completed_by", "")) if isinstance(annotation, dict) else ""
            key = (str(data.get("task_id", task.get("id"))), annotator)
            if problem is None and key in seen:
                problem = ("duplicate", f"annotator {annotator} labelled task {key[0]} twice")
            if problem is not None:
                quarantined.append((t_index, problem[0], problem[1], raw))
                continue
            seen.add(key)
            accepted.append(
                {
                    "annotation_id": f"{key[0]}:{annotation.get('id', len(accepted))}",
                    "task_id": key[0],
                    "prompt_id": data["prompt_id"],
                    "response_a_id": data["answer1_id"],
                    "response_b_id": data["answer2_id"],
                    "label": _pairwise_choice(annotation),
                    "annotator": annotator,
                    "raw": raw,
                }
            )
    annotations_df = pd.DataFrame(accepted, columns=["annotation_id", "task_id", "prompt_id", "response_a_id",
                                                     "response_b_id", "label", "annotator", "raw"])
    quarantine_df = pd.DataFrame(quarantined, columns=QUARANTINE_COLUMNS)
    if len(annotations_df) + len(quarantine_df) != n_input:  # the invariant the whole import rests on
        raise AssertionError(f"import lost rows: {len(annotations_df)} + {len(quarantine_df)} != {n_input}")
    return annotations_df, quarantine_df
