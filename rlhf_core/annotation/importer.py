"""Import a list of annotation files into judgements, comparison pairs and a quarantine table.

One entry point for the annotation stage, `import_files`. Each file is read by the importer of
its format (told by `detect_file_format`, or given):

    label_studio   Label Studio JSON export: pairwise, rating and ranking templates
    score_table    per-response scores or ranks (JSONL / CSV / Parquet), or JSONL rankings
    hh | trl | trl_messages   text preference pairs (they carry their own texts)

Files are merged in order: a judgement already imported from an earlier file is quarantined as
`duplicate` (same judgement), `contradictory` (same annotator and item, another judgement) or
`task_id_reused` (a data.task_id of an earlier file's task that showed other responses), so
adding a new export to the list adds only its new judgements, and importing the same file twice
changes nothing. Every quarantine row names its `source_file`. accepted + quarantined = input
rows holds per file and over the whole import (checked).

Judgements become pairs by the configured aggregation: pairwise labels by majority per task;
scores by annotators' mean score or by the majority of their own orders, with `min_score_gap`,
`pair_mode` and `ties`. Text pairs are pairs already. A pair of responses judged both pairwise and by
scores is kept once, as the pairwise labels make it (report: `pairs_from_two_sources`, `..._disagreeing`).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from rlhf_core.annotation import text_pairs
from rlhf_core.annotation.aggregate import inter_annotator_agreement, pairs_from_annotator_scores
from rlhf_core.annotation.label_studio import (
    QUARANTINE_COLUMNS,
    ImportFormatError,
    import_label_studio_export,
    read_export,
)
from rlhf_core.annotation.pairs import aggregate_majority
from rlhf_core.annotation.score_tables import check_score_table, import_score_table
from rlhf_core.config import AnnotationConfig
from rlhf_core.schemas import TABLES

TEXT_PAIR_FORMATS = ("hh", "trl", "trl_messages")
SCORE_KEYS = ("score", "rank", "ranking")
QUARANTINE_OUT = ["source_file", *QUARANTINE_COLUMNS]
# Columns every comparisons table of this stage has beyond the canonical ones:
#   tie          the pair was kept as a tie (ties="keep"): trained towards P(chosen > rejected) = 0.5
#   soft_label   the training target P(chosen > rejected): 0.5 for ties, else 1.0
#   label_margin a human margin label (Llama-2 style) where the data had one, else NaN; kept for
#                analysis, not used as the training margin (denoising sets that from votes)
#   score_gap    the score difference the pair was formed from (scored data), else NaN
#   source       the format the pair came from
EXTRA_COLUMNS = {"tie": bool, "soft_label": float, "label_margin": float, "score_gap": float, "source": str}


@dataclass
class ImportResult:
    annotations: pd.DataFrame  # pairwise judgements, one row per annotator judgement
    scores: pd.DataFrame  # per-response scores (ratings, ranks), one row per annotator and response
    comparisons: pd.DataFrame  # the pairs, canonical columns + EXTRA_COLUMNS
    quarantine: pd.DataFrame  # QUARANTINE_OUT
    report: dict[str, float] = field(default_factory=dict)


def _jsonl_kind(obj: dict) -> str | None:
    """A JSONL line's format: a score-table row (prompt_id and a score, rank or ranking), or a text pair's."""
    if "prompt_id" in obj and any(k in obj for k in SCORE_KEYS):
        return "score_table"
    return text_pairs._kind(obj)


EXPORT_SUFFIXES = (".json", ".jsonl", ".ndjson", ".csv", ".parquet")  # in any case, each optionally .gz


def is_export_name(name: str) -> bool:
    """Whether `detect_file_format` can tell a file's importer from its name."""
    return name.lower().removesuffix(".gz").endswith(EXPORT_SUFFIXES)


def detect_file_format(path: str | Path) -> str:
    """The importer for a file, from its name and, for JSONL, the keys of the first of its first lines that tells
    (a bad first row is quarantined by the import, not taken for the file's format)."""
    path = Path(path)
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".json"):
        return "label_studio"
    if name.endswith((".csv", ".parquet")):
        return "score_table"
    if name.endswith((".jsonl", ".ndjson")):
        if not any(line.strip() for _, line in text_pairs._lines(path)):  # as an empty CSV file, not 0 text pairs
            raise ImportFormatError(f"{path}: the file has no rows (an empty or failed export?); export it again, or "
                                    "remove it from annotation.exports")
        return text_pairs.detect_format(path, _jsonl_kind, "annotation.format (score_table, hh, trl or "
                                                           "trl_messages)")
    raise ImportFormatError(
        f"{path}: cannot tell the format from the name (expected .json, .jsonl, .csv or .parquet, "
        f"optionally .gz); set annotation.format"
    )


def check_export(path: str | Path, fmt: str = "auto", rows: int = 100) -> str:
    """Read enough of an export to know it is one, before any work: all of a Label Studio JSON file,
    the header and first `rows` rows of the others. Raises ImportFormatError saying what is wrong (a
    truncated or binary JSON file, a UTF-16 or binary JSONL/CSV, an unreadable Parquet file); returns
    the format. Bad rows of a good file are not its business: the import quarantines them."""
    path = Path(path)
    fmt = detect_file_format(path) if fmt == "auto" else fmt
    if fmt == "label_studio":
        read_export(path)
    elif fmt == "score_table":
        check_score_table(path, rows)
    else:
        text_pairs.check_text_pairs(path, rows)
    return fmt


def check_exports(cfg: AnnotationConfig) -> None:
    """`check_export` on every file of `annotation.exports`, the message naming its key and path."""
    for i, path in enumerate(cfg.exports):
        try:
            check_export(path, cfg.format)
        except ImportFormatError as err:
            raise ImportFormatError(f"annotation.exports[{i}]: {err}") from None


def _empty(kind: str) -> pd.DataFrame:
    return pd.DataFrame(columns=[c.name for c in TABLES[kind].columns])


def _with_source(quarantine: pd.DataFrame, source_file: str) -> pd.DataFrame:
    return quarantine.assign(source_file=source_file)[QUARANTINE_OUT]


def _merge(kept: pd.DataFrame, new: pd.DataFrame, key: str, values: list[str],
           source_file: str, shown: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Add `new` judgements to `kept`. A judgement is the rows sharing `key` (one row for a pairwise
    label, one per ranked response for a ranking); one whose key was kept from an earlier file goes
    to quarantine as one row: `duplicate` if its `values` rows are the same, `task_id_reused` if its `shown`
    columns differ (another task under a reused data.task_id, e.g. another project's), else `contradictory`."""
    if kept.empty or new.empty:
        return (new if kept.empty else kept), pd.DataFrame(columns=QUARANTINE_OUT)

    def judgement(rows: pd.DataFrame, columns: list[str]) -> list:
        return sorted(rows[columns].astype(str).itertuples(index=False, name=None))

    earlier_rows = dict(list(kept[kept[key].isin(set(new[key]))].groupby(key)))
    rows = []
    for k, group in new[new[key].isin(earlier_rows.keys())].groupby(key, sort=True):
        same = judgement(group, values) == judgement(earlier_rows[k], values)
        if shown and judgement(group, shown) != judgement(earlier_rows[k], shown):
            reason, detail = "task_id_reused", (f"{key} {k} already imported from an earlier file for a task showing "
                                                 "other responses: give each task its own data.task_id")
        else:
            reason = "duplicate" if same else "contradictory"
            detail = f"{key} {k} already imported from an earlier file" + ("" if same else " with another judgement")
        first = group.iloc[0]
        rows.append((source_file, int(first.get("source_index", -1)), reason, detail, str(first["raw"])))
    fresh = new[~new[key].isin(earlier_rows.keys())]
    return pd.concat([kept, fresh], ignore_index=True), pd.DataFrame(rows, columns=QUARANTINE_OUT)


def _finish(comparisons: pd.DataFrame, source: str) -> pd.DataFrame:
    out = comparisons.copy()
    if "margin" in out.columns:  # a human margin label: kept apart from the training margin
        out = out.rename(columns={"margin": "label_margin"})
    out["tie"] = out["tie"].astype(bool) if "tie" in out.columns else False
    out["soft_label"] = np.where(out["tie"], 0.5, 1.0)
    for name in ("label_margin", "score_gap"):
        if name not in out.columns:
            out[name] = np.nan
    out["source"] = source
    canonical = [c.name for c in TABLES["comparisons"].columns]
    return out[canonical + list(EXTRA_COLUMNS)].astype(EXTRA_COLUMNS)


def _one_comparison_per_pair(comparisons: pd.DataFrame) -> tuple[pd.DataFrame, int, int]:
    """(comparisons with one row per prompt and unordered pair of responses, how many rows were dropped, how many
    of those said otherwise: another winner, or a tie against a preference).

    A pair can come from two sources: pairwise labels and scores of the same responses (one Label Studio export may
    mix the pairwise and the rating template). The first row is kept, so pairwise labels, a direct comparison, win
    over scores, compared only through their values. Before, duplicates were dropped by pair_id, but the two
    sources name a pair differently (a task id, a hash of the sorted ids, a hash in chosen/rejected order): the
    scored pair was dropped when the scores disagreed with the labels and kept as a second copy when they agreed.
    """
    first = comparisons[["chosen_id", "rejected_id"]].min(axis=1)
    second = comparisons[["chosen_id", "rejected_id"]].max(axis=1)
    key = comparisons["prompt_id"] + "\0" + first + "\0" + second
    dropped = key.duplicated(keep="first")
    kept = comparisons[~dropped].set_index(key[~dropped])
    disagreeing = dropped & ((comparisons["chosen_id"] != key.map(kept["chosen_id"]))
                             | (comparisons["tie"] != key.map(kept["tie"])))
    out = comparisons[~dropped].reset_index(drop=True)
    if out["pair_id"].duplicated().any():  # a task id equal to another pair's id: no pair may silently replace one
        shared = out["pair_id"][out["pair_id"].duplicated()].iloc[0]
        raise ImportFormatError(f"two different pairs share the pair id {shared!r}; rename that Label Studio task "
                                "(data.task_id) and import again")
    return out, int(dropped.sum()), int(disagreeing.sum())


def _read_text_pairs(path: str | Path, fmt: str, max_field_chars: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(comparisons, quarantine) of a text-pair file, streamed through Parquet: the rows never sit in
    memory as Python objects (about 3 kB a row), only as the final columnar table."""
    with tempfile.TemporaryDirectory(prefix="rlhf-text-pairs-") as tmp:
        summary = text_pairs.import_text_pairs_to(path, tmp, fmt=fmt, max_field_chars=max_field_chars)
        return pd.read_parquet(summary.comparisons_path), pd.read_parquet(summary.quarantine_path)


def import_files(paths: list[str | Path], responses: pd.DataFrame, cfg: AnnotationConfig,
                 names: list[str] | None = None) -> ImportResult:
    """Import every file (see the module docstring). `responses` is the round's responses table:
    judgements naming a prompt or response not in it are quarantined (text pairs carry their own).
    `names` are the file names reported in `source_file` (default: the paths' names)."""
    names = names or [Path(p).name for p in paths]
    annotations, scores = _empty("annotations"), _empty("scores")
    pairs, quarantine = [], [pd.DataFrame(columns=QUARANTINE_OUT)]
    text_pair_ids: set[str] = set()
    report: dict[str, float] = {"n_files": len(paths), "input_rows": 0}
    for path, name in zip(paths, names):
        fmt = detect_file_format(path) if cfg.format == "auto" else cfg.format
        report[f"files/{fmt}"] = report.get(f"files/{fmt}", 0) + 1
        if fmt == "label_studio":
            result = import_label_studio_export(read_export(path), responses, max_rating=cfg.max_rating,
                                                match_texts=cfg.match_texts)
            new_ann, new_scores, bad = result.annotations, result.scores, result.quarantine
        elif fmt == "score_table":
            new_ann, (new_scores, bad) = _empty("annotations"), import_score_table(path, responses)
        else:
            found, bad = _read_text_pairs(path, fmt, cfg.max_field_chars)
            n_in = len(found) + len(bad)
            repeated = found["pair_id"].isin(text_pair_ids).to_numpy()
            reversed_ids = [text_pairs.reversed_pair_id(row) for row in
                            found[["prompt_id", "chosen_id", "rejected_id"]].to_dict("records")]
            reverse = pd.Series(reversed_ids, index=found.index).isin(text_pair_ids).to_numpy() & ~repeated
            clash = found.loc[repeated | reverse, ["pair_id", "prompt", "chosen", "rejected"]]
            dup = [(name, -1, "duplicate" if again else "contradictory",
                    f"pair {pid} already imported from an earlier file" if again else
                    "the same two responses as a pair of an earlier file, preferred the other way; the first is kept",
                    json.dumps({"prompt": p, "chosen": c, "rejected": r}))
                   for again, (pid, p, c, r) in zip(repeated[repeated | reverse], clash.itertuples(index=False))]
            found = found[~(repeated | reverse)]
            text_pair_ids.update(found["pair_id"])
            pairs.append(_finish(found, fmt))
            quarantine += [_with_source(bad, name), pd.DataFrame(dup, columns=QUARANTINE_OUT)]
            report["input_rows"] += n_in
            continue
        n_in = len(new_ann) + new_scores["annotation_id"].nunique() + len(bad)
        report["input_rows"] += n_in
        quarantine.append(_with_source(bad, name))
        pairwise_values = ["response_a_id", "response_b_id", "label"]
        annotations, q_ann = _merge(annotations, new_ann, "annotation_id", pairwise_values, name,
                                    shown=["prompt_id", "response_a_id", "response_b_id"])
        scores, q_scores = _merge(scores, new_scores, "annotation_id", ["response_id", "score"], name,
                                  shown=["prompt_id", "response_id"])  # the rated response, the ranked ones
        quarantine += [q_ann, q_scores]

    if len(annotations):
        majority, rep = aggregate_majority(annotations, responses)
        pairs.append(_finish(majority, "label_studio"))
        report.update({f"pairwise/{k}": v for k, v in rep.items()})
    if len(scores):
        scored, rep = pairs_from_annotator_scores(scores, responses, aggregate=cfg.aggregate,
                                                  min_gap=cfg.min_score_gap, mode=cfg.pair_mode, ties=cfg.ties)
        pairs.append(_finish(scored, "scores"))
        report.update({f"scores/{k}": v for k, v in rep.items() if isinstance(v, (int, float))})
    comparisons = pd.concat(pairs, ignore_index=True) if pairs else _finish(_empty("comparisons"), "none")
    comparisons, judged_twice, disagreeing = _one_comparison_per_pair(comparisons)
    quarantine_df = pd.concat([q for q in quarantine if len(q)], ignore_index=True) if any(
        len(q) for q in quarantine) else pd.DataFrame(columns=QUARANTINE_OUT)
    accepted = len(annotations) + scores["annotation_id"].nunique() + len(text_pair_ids)
    if accepted + len(quarantine_df) != report["input_rows"]:  # the invariant the whole import rests on
        raise AssertionError(f"import lost rows: {accepted} + {len(quarantine_df)} != {report['input_rows']}")
    report.update(accepted=accepted, quarantined=len(quarantine_df), n_pairs=len(comparisons),
                  n_ties=int(comparisons["tie"].sum()), pairs_from_two_sources=judged_twice,
                  pairs_from_two_sources_disagreeing=disagreeing)
    report.update({f"agreement/{k}": v for k, v in inter_annotator_agreement(annotations, scores).items()})
    return ImportResult(annotations, scores, comparisons, quarantine_df, report)
