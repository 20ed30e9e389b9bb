"""Import of Label Studio JSON exports: pairwise, rating and ranking templates.

The result type of each annotation tells its template:

    pairwise  <Pairwise .../>; data: prompt_id, answer1_id, answer2_id;
              value {"selected": "left" | "right"}     -> one `annotations` row, label "a" | "b"
    rating    <Rating ... maxRating="5"/>; data: prompt_id, response_id;
              value {"rating": 4}                      -> one `scores` row, score = the rating
    ranker    <List name="items" value="$items"/><Ranker name="rank" toName="items"/> (no buckets);
              data: prompt_id, items [{"id": response_id, ...}, ...];
              value {"ranker": {"rank": [ids, best first]}} -> one `scores` row per ranked id,
              score = -position (the first is -1)

Judgement ids are derived from content, so they are the same in every export of the same
project; a later export that repeats a judgement can then be dropped as a duplicate:

    task_id       = data["task_id"] when it is a non-empty string (the pipeline's own task id),
                    else one made from what the task shows: "ls-" + a hash of prompt_id and the
                    answer ids in their order (pairwise), of prompt_id and response_id (rating), or of
                    prompt_id and the item ids (ranker); Label Studio's own task["id"] only when the
                    data lacks those fields (the task is then quarantined for them). Label Studio
                    numbers tasks per project and instance, so two projects' exports both hold a
                    "task 1": by that number their judgements were pooled into one pair.
    annotator     = str(annotation["completed_by"]) (a Label Studio user id; for an object, its
                    "id", else its "email": a project exported both ways names one user once)
    annotation_id = f"{task_id}:{annotator}"        (one judgement per annotator and task)
    score_id      = f"{annotation_id}:{response_id}"

Every annotation becomes one accepted judgement or one quarantine row, and a task without
annotations is one quarantine row: len(annotations) + distinct annotation_id in scores +
len(quarantine) = input rows, always (checked before returning). `source_index` is the task's
0-based position in the export (an extra column of annotations and scores too). Quarantine
reasons, in the order they are checked:

    malformed_task        the task is not an object, or its "annotations" is not a list
    no_annotations        the task has no annotation
    missing_data          the task has no "data" object
    malformed_annotation  the annotation is not an object, or its "result" is not a list
    cancelled             the annotator skipped the task
    missing_field         no task id, no annotator, or a data field the template needs is missing
                          or not a non-empty string (ranker: "items" not a list of objects with "id")
    undecodable           a task id, annotator or id with a lone surrogate escape ("\\ud800")
    no_choice             no pairwise, rating or ranker result; or "selected" not left / right
    multiple_results      more than one pairwise / rating / ranker result in one annotation
    self_pair             pairwise: answer1_id == answer2_id
    bad_rating            the rating is not a finite number, or not in 1..max_rating (when given)
    bad_ranking           not one list (a bucketed Ranker) of >= 2 distinct ids, all among the items
    unknown_response      a response id not in the responses table
    prompt_mismatch       a response that belongs to another prompt
    text_mismatch         the task shows a response text (pairwise data.answer1 / answer2, rating data.response,
                          a ranker item's text or body) other than the responses table's for its id, compared
                          after NFC and trimming: the texts were edited or rendered, or the tasks were made by a
                          pipeline whose response ids did not name their text (generate stage version 3 and
                          before: responses generated again kept their ids) (match_texts=False: not checked, for
                          tasks that show rendered texts)
    task_id_reused        the annotator already judged a task of this id that shows other ids (a data.task_id
                          given twice, e.g. by two projects): one judgement id for both; other annotators' are kept
    duplicate             the annotator already judged this task in this export, the same way
    contradictory         the annotator already judged this task in this export, another way
                          (the first judgement stays accepted)
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import unicodedata
import zlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rlhf_core.schemas import TABLES

QUARANTINE_COLUMNS = ["source_index", "reason", "detail", "raw"]
ANNOTATION_COLUMNS = [*(c.name for c in TABLES["annotations"].columns), "source_index"]
SCORE_COLUMNS = [*(c.name for c in TABLES["scores"].columns), "source_index"]
TEMPLATES = ("pairwise", "rating", "ranker")


class ImportFormatError(ValueError):
    """The file as a whole cannot be read as this format."""


class Rejected(Exception):
    """One row that cannot be accepted: a machine-readable reason and a human-readable detail."""

    def __init__(self, reason: str, detail: str):
        super().__init__(reason, detail)
        # details quote ids from the file, which may hold lone surrogates that no table can store
        self.reason, self.detail = reason, detail.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True)
class LabelStudioImport:
    annotations: pd.DataFrame  # pairwise judgements: the annotations table + source_index
    scores: pd.DataFrame  # rating and ranker judgements: the scores table + source_index
    quarantine: pd.DataFrame  # QUARANTINE_COLUMNS
    template_counts: dict[str, int]  # accepted judgements per template (every one of TEMPLATES)


@dataclass(frozen=True)
class _Judgement:
    template: str
    task_id: str
    annotator: str
    prompt_id: str
    value: object  # pairwise: "a" | "b"; rating: the rating; ranker: the ranked ids, best first

    @property
    def annotation_id(self) -> str:
        return f"{self.task_id}:{self.annotator}"


def read_export(path: str | Path) -> list[dict]:
    """The export's tasks: UTF-8 JSON, with or without a byte-order mark, gzipped when the name ends in .gz."""
    path = Path(path)
    raw = path.read_bytes()
    if path.suffix.lower() == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
            raise ImportFormatError(f"{path}: not a whole gzip file ({err})") from None
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as err:
        raise ImportFormatError(f"{path}: not UTF-8 text ({err})") from None
    except json.JSONDecodeError as err:
        # one JSON object per line (datasets' to_json writes .json so): JSON Lines, read by the text-pair formats
        lines = err.msg == "Extra data" and err.colno == 1
        hint = ("; it looks like JSON Lines (one object per line): name it .jsonl, or set annotation.format (hh, trl, "
                "trl_messages or score_table)" if lines else "")
        raise ImportFormatError(f"{path}: not valid JSON at line {err.lineno} column {err.colno}: {err.msg}"
                                f"{hint}") from None
    except RecursionError:
        raise ImportFormatError(f"{path}: JSON nested too deeply to be a Label Studio export") from None
    if not isinstance(data, list):
        raise ImportFormatError(f"{path}: a Label Studio JSON export is a list of tasks, got {type(data).__name__}")
    return data


def to_json(obj: object) -> str:
    """`obj` as JSON text for the `raw` column; repr() for what JSON cannot hold."""
    try:
        return json.dumps(obj, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(obj)


def finite_number(value: object) -> float | None:
    """`value` as a float if it is a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_unicode(text: str, name: str) -> str:
    """`text` itself, if it can be written as UTF-8 (JSON may hold a lone surrogate escape, "\\ud800")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise Rejected("undecodable", f"{name} contains a lone surrogate escape") from None
    return text


def text_field(obj: dict, name: str, where: str = "data") -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise Rejected("missing_field", f"{where}.{name} is missing or not a non-empty string")
    return check_unicode(value, f"{where}.{name}")


# how to import an export against the responses its tasks were made from (flows/stages.py)
IMPORT_AGAINST = "rlhf stage import_annotations --config C --input generate=responses:<digest>"


def comparable_text(text: str) -> str:
    """A text (or id) as a reader compares it: NFC Unicode form, no surrounding spaces (exports and editors change
    both without a word)."""
    return unicodedata.normalize("NFC", text).strip()


def check_response(response_id: str, prompt_id: str, known: dict[str, str]) -> None:
    """Raise Rejected unless `response_id` is a known response to `prompt_id` (known: response -> prompt)."""
    if response_id not in known:
        near = comparable_text(response_id)
        hint = (f" (the artifact has {near!r}: the export changed its spaces or Unicode form)" if near in known else
                f" (tasks made from responses this round did not generate, with other settings, seed or pipeline "
                f"version, join the generate artifact that made them: {IMPORT_AGAINST})")
        raise Rejected("unknown_response", f"response id {response_id!r} is not in the responses artifact{hint}")
    if known[response_id] != prompt_id:
        raise Rejected("prompt_mismatch",
                       f"response {response_id!r} belongs to prompt {known[response_id]!r}, not {prompt_id!r}")


def check_ranking(ranking: object, prompt_id: str, known: dict[str, str], items: set[str] | None = None) -> tuple:
    """The ranked response ids, best first, checked: >= 2 distinct id strings, all among `items`
    (when given), each a known response to `prompt_id`. Raises Rejected."""
    if not isinstance(ranking, list) or not all(isinstance(r, str) and r for r in ranking):
        raise Rejected("bad_ranking", "the ranking is not a list of response id strings")
    if len(ranking) < 2:
        raise Rejected("bad_ranking", f"the ranking has {len(ranking)} id(s); a ranking needs at least 2")
    if len(set(ranking)) != len(ranking):
        repeated = sorted({r for r in ranking if ranking.count(r) > 1})
        raise Rejected("bad_ranking", f"the ranking repeats {repeated[:5]}")
    if items is not None and not set(ranking) <= items:
        raise Rejected("bad_ranking", f"the ranking names {sorted(set(ranking) - items)[:5]}, not among the task's items")
    for response_id in ranking:
        check_response(response_id, prompt_id, known)
    return tuple(ranking)


def _shown(data: dict) -> list[str] | None:
    """The ids the task shows (prompt_id, then the answers, the rated response or the items), or None when a field
    is missing or not a string."""
    if isinstance(data.get("answer1_id"), str) and isinstance(data.get("answer2_id"), str):
        ids = [data.get("prompt_id"), data["answer1_id"], data["answer2_id"]]
    elif isinstance(data.get("response_id"), str):
        ids = [data.get("prompt_id"), data["response_id"]]
    elif isinstance(data.get("items"), list) and all(isinstance(i, dict) for i in data["items"]):
        ids = [data.get("prompt_id"), *(i.get("id") for i in data["items"])]
    else:
        return None
    return ids if all(isinstance(i, str) for i in ids) else None


def _task_id(task: dict, data: dict) -> str:
    if isinstance(data.get("task_id"), str) and data["task_id"]:
        return check_unicode(data["task_id"], "data.task_id")
    if (shown := _shown(data)) is not None:
        return "ls-" + hashlib.sha256("\0".join(shown).encode("utf-8", "surrogatepass")).hexdigest()[:16]
    if isinstance(task.get("id"), (int, str)) and not isinstance(task.get("id"), bool) and task.get("id") != "":
        return check_unicode(str(task["id"]), "task id")
    raise Rejected("missing_field", "the task has neither data.task_id nor an id")


def _annotator(annotation: dict) -> str:
    who = annotation.get("completed_by")
    if isinstance(who, dict):  # some exports expand the user: its id is what the plain form holds
        who = who.get("id") if who.get("id") not in (None, "") else who.get("email")
    if isinstance(who, bool) or not isinstance(who, (int, str)) or who == "":
        raise Rejected("missing_field", "annotation.completed_by (the annotator) is missing")
    return check_unicode(str(who), "annotation.completed_by")


def _result(annotation: dict) -> tuple[str, dict]:
    """(template, value) of the annotation's one pairwise / rating / ranker result."""
    results = annotation.get("result")
    if not isinstance(results, list):
        raise Rejected("malformed_annotation", "annotation.result is not a list")
    found = [r for r in results if isinstance(r, dict) and r.get("type") in TEMPLATES]
    if not found:
        raise Rejected("no_choice", f"no result of type {'/'.join(TEMPLATES)}")
    if len(found) > 1:
        raise Rejected("multiple_results", f"{len(found)} results of types {[r['type'] for r in found]}")
    value = found[0].get("value")
    return found[0]["type"], value if isinstance(value, dict) else {}


def _pairwise(data: dict, value: dict, prompt_id: str, known: dict[str, str]) -> str:
    a, b = text_field(data, "answer1_id"), text_field(data, "answer2_id")
    selected = value.get("selected")
    label = {"left": "a", "right": "b"}.get(selected) if isinstance(selected, str) else None  # a list is unhashable
    if label is None:
        raise Rejected("no_choice", f"pairwise selected {value.get('selected')!r}, not 'left' or 'right'")
    if a == b:
        raise Rejected("self_pair", f"answer1_id == answer2_id == {a}")
    check_response(a, prompt_id, known)
    check_response(b, prompt_id, known)
    return label


def _rating(data: dict, value: dict, prompt_id: str, known: dict[str, str], max_rating: int | None) -> float:
    response_id = text_field(data, "response_id")
    rating = finite_number(value.get("rating"))
    if rating is None:
        raise Rejected("bad_rating", f"rating {value.get('rating')!r} is not a finite number")
    if max_rating is not None and not 1 <= rating <= max_rating:
        raise Rejected("bad_rating", f"rating {rating} is outside 1..{max_rating} (max_rating)")
    check_response(response_id, prompt_id, known)
    return rating


def _ranker(data: dict, value: dict, prompt_id: str, known: dict[str, str]) -> tuple:
    items = data.get("items")
    if not isinstance(items, list) or not all(isinstance(i, dict) and isinstance(i.get("id"), str) for i in items):
        raise Rejected("missing_field", "data.items is missing or not a list of objects with a string id")
    lists = value.get("ranker")
    if not isinstance(lists, dict) or len(lists) != 1:
        n = len(lists) if isinstance(lists, dict) else 0
        raise Rejected("bad_ranking", f"value.ranker holds {n} lists; one ordered list (no buckets) is needed")
    (ranking,) = lists.values()
    return check_ranking(ranking, prompt_id, known, items={i["id"] for i in items})


# where each template's task shows the texts of the responses it names (field of data, or of an item)
SHOWN_TEXTS = {"pairwise": (("answer1_id", "answer1"), ("answer2_id", "answer2")),
               "rating": (("response_id", "response"),), "ranker": (("id", "text"), ("id", "body"))}


def check_texts_shown(template: str, data: dict, texts: dict[str, str]) -> None:
    """Raise text_mismatch when the task shows, for a response id, another text than `texts` (response_id ->
    text) holds for it; fields the task lacks are not checked."""
    holders = data.get("items") if template == "ranker" else [data]
    for holder in holders if isinstance(holders, list) else []:
        for id_field, text_field_name in SHOWN_TEXTS[template]:
            shown, response_id = holder.get(text_field_name), holder.get(id_field)
            if not isinstance(shown, str) or response_id not in texts:
                continue
            shown, ours = comparable_text(shown), comparable_text(texts[response_id])
            if shown != ours:
                raise Rejected("text_mismatch", f"the task shows another text for {response_id} than the responses "
                               f"artifact holds ({shown[:40]!r} vs {ours[:40]!r})"
                               ": set annotation.match_texts false if the tasks show rendered texts; tasks made by "
                               "a pipeline whose response ids did not name their text (generate stage version 3 and "
                               f"before) join the generate artifact that made them: {IMPORT_AGAINST}")


def _judgement(task: dict, annotation: object, known: dict[str, str], max_rating: int | None,
               texts: dict[str, str] | None = None) -> _Judgement:
    """The judgement of one annotation, or raise Rejected (reasons in the module docstring)."""
    data = task.get("data")
    if not isinstance(data, dict):
        raise Rejected("missing_data", "task has no 'data' object")
    if not isinstance(annotation, dict):
        raise Rejected("malformed_annotation", "annotation is not an object")
    if annotation.get("was_cancelled"):
        raise Rejected("cancelled", "annotator skipped the task")
    task_id, annotator = _task_id(task, data), _annotator(annotation)
    prompt_id = text_field(data, "prompt_id")
    template, value = _result(annotation)
    if template == "pairwise":
        judged = _pairwise(data, value, prompt_id, known)
    elif template == "rating":
        judged = _rating(data, value, prompt_id, known, max_rating)
    else:
        judged = _ranker(data, value, prompt_id, known)
    if texts is not None:
        check_texts_shown(template, data, texts)
    return _Judgement(template, task_id, annotator, prompt_id, judged)


def _rows(j: _Judgement, data: dict, raw: str, source_index: int) -> list[dict]:
    """The annotations row (pairwise) or scores rows (rating, ranker) of an accepted judgement."""
    annotation_id = j.annotation_id
    if j.template == "pairwise":
        return [{"annotation_id": annotation_id, "task_id": j.task_id, "prompt_id": j.prompt_id,
                 "response_a_id": data["answer1_id"], "response_b_id": data["answer2_id"], "label": j.value,
                 "annotator": j.annotator, "raw": raw, "source_index": source_index}]
    scored = [(data["response_id"], j.value)] if j.template == "rating" else [
        (rid, -float(position)) for position, rid in enumerate(j.value, start=1)]
    return [{"score_id": f"{annotation_id}:{rid}", "annotation_id": annotation_id, "prompt_id": j.prompt_id,
             "response_id": rid, "score": score, "annotator": j.annotator, "raw": raw, "source_index": source_index}
            for rid, score in scored]


def check_task_shown_alike(shown: dict[str, list[str] | None], key: str, task_id: str, now: list[str] | None
                           ) -> None:
    """Raise `task_id_reused` if the judgement `key` was accepted for a task that showed other ids than `now` (it
    was quarantined as a duplicate "the same way": a false reason)."""
    if key in shown and shown[key] != now:
        before, after = (", ".join(ids or ["?"]) for ids in (shown[key], now))
        raise Rejected("task_id_reused", f"task id {task_id} already names a task this annotator judged, showing "
                                         f"{before}; this one shows {after}: give each task its own data.task_id")


def check_not_repeated(first: dict, key: str, judgement, earlier: str) -> None:
    """Raise `duplicate` (the same judgement) or `contradictory` (another one) if `key` was already
    accepted; `first` maps accepted keys to their judgements, and the first judgement stays."""
    if key in first:
        same = first[key] == judgement
        raise Rejected("duplicate" if same else "contradictory",
                       earlier + (" the same way" if same else " another way; the first is kept"))


def import_label_studio_export(export: list[dict], responses: pd.DataFrame,
                               max_rating: int | None = None, match_texts: bool = True) -> LabelStudioImport:
    """Import a Label Studio export of any mix of the three templates (see the module docstring).

    `responses`: the responses table (response_id, prompt_id; with its `response` texts, the texts a task shows are
    checked against them unless not `match_texts`). `max_rating`: the Rating tag's maxRating, when known; ratings
    outside 1..max_rating are then quarantined.
    """
    known = dict(zip(responses["response_id"], responses["prompt_id"]))
    texts = (dict(zip(responses["response_id"], responses["response"]))
             if match_texts and "response" in responses.columns else None)
    annotation_rows, score_rows, quarantined, n_input = [], [], [], 0
    first: dict[str, _Judgement] = {}  # annotation_id -> its accepted judgement
    shown: dict[str, list[str] | None] = {}  # annotation_id -> the ids its accepted task showed
    counts = dict.fromkeys(TEMPLATES, 0)
    for t_index, task in enumerate(export):
        annotations = task.get("annotations") if isinstance(task, dict) else None
        if not isinstance(task, dict) or not isinstance(annotations, (list, type(None))):
            n_input += 1
            quarantined.append((t_index, "malformed_task", "the task is not an object with a list of annotations",
                                to_json(task)))
            continue
        if not annotations:
            n_input += 1
            quarantined.append((t_index, "no_annotations", "task has no annotations", to_json(task)))
            continue
        for annotation in annotations:
            n_input += 1
            raw = to_json({"task_id": task.get("id"), "data": task.get("data"), "annotation": annotation})
            try:
                judgement = _judgement(task, annotation, known, max_rating, texts)
                key = judgement.annotation_id
                check_task_shown_alike(shown, key, judgement.task_id, _shown(task["data"]))
                check_not_repeated(first, key, judgement,
                                   f"annotator {judgement.annotator} already judged task {judgement.task_id}")
            except Rejected as rejected:
                quarantined.append((t_index, rejected.reason, rejected.detail, raw))
                continue
            first[key] = judgement
            shown[key] = _shown(task["data"])
            counts[judgement.template] += 1
            rows = _rows(judgement, task["data"], raw, t_index)
            (annotation_rows if judgement.template == "pairwise" else score_rows).extend(rows)

    annotations_df = pd.DataFrame(annotation_rows, columns=ANNOTATION_COLUMNS)
    scores_df = pd.DataFrame(score_rows, columns=SCORE_COLUMNS).astype({"score": float})
    quarantine_df = pd.DataFrame(quarantined, columns=QUARANTINE_COLUMNS)
    accepted = len(annotations_df) + scores_df["annotation_id"].nunique()
    if accepted + len(quarantine_df) != n_input:  # the invariant the whole import rests on
        raise AssertionError(f"import lost rows: {accepted} + {len(quarantine_df)} != {n_input}")
    return LabelStudioImport(annotations_df, scores_df, quarantine_df, counts)


def import_label_studio(export: list[dict], responses: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(annotations, quarantine) of a pairwise-only export: `import_label_studio_export` without scores.

    Raises ImportFormatError if the export holds rating or ranker judgements (they would be lost here).
    """
    result = import_label_studio_export(export, responses)
    if len(result.scores):
        raise ImportFormatError(
            f"the export holds {result.template_counts['rating']} rating and {result.template_counts['ranker']} "
            "ranker judgement(s); import it with import_label_studio_export to keep their scores"
        )
    return result.annotations, result.quarantine
