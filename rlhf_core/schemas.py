"""The canonical tables of the pipeline. Column names are part of the contract; extra columns are allowed.

`validate_table(kind, df)` checks required columns, their types and key uniqueness, and says
exactly which column or row is wrong. Tables are stored as Parquet (`write_table`) and load with
pandas or `datasets.Dataset.from_parquet`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1


class SchemaError(ValueError):
    """A table that does not match its canonical schema."""


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "str" | "int" | "float" | "bool" | "list"
    doc: str = ""


@dataclass(frozen=True)
class TableSchema:
    kind: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    doc: str


S, I, F, B, L = "str", "int", "float", "bool", "list"

TABLES: dict[str, TableSchema] = {
    t.kind: t
    for t in [
        TableSchema(
            "prompts",
            (Column("prompt_id", S), Column("prompt", S), Column("tags", L), Column("source", S)),
            key=("prompt_id",),
            doc="a prompt",
        ),
        TableSchema(
            "sampled_prompts",
            (
                Column("prompt_id", S),
                Column("prompt", S),
                Column("tags", L),
                Column("source", S),
                Column("n_tags", I),
                Column("selection_order", I),
                Column("selection_reason", S, "complexity-first | balanced | fill"),
            ),
            key=("prompt_id",),
            doc="a prompt chosen for annotation",
        ),
        TableSchema(
            "responses",
            (
                Column("prompt_id", S),
                Column("response_id", S),
                Column("prompt", S),
                Column("response", S),
                Column("generator", S, "model that wrote it"),
                Column("strategy", S, "sampling parameters as JSON"),
            ),
            key=("response_id",),
            doc="one response",
        ),
        TableSchema(
            "annotations",
            (
                Column("annotation_id", S),
                Column("task_id", S, "the annotation-tool task this judgement belongs to"),
                Column("prompt_id", S),
                Column("response_a_id", S),
                Column("response_b_id", S),
                Column("label", S, "a | b | tie"),
                Column("annotator", S),
                Column("raw", S, "the source row as exported, JSON"),
            ),
            key=("annotation_id",),
            doc="one annotator judgement as imported",
        ),
        TableSchema(
            "scores",
            (
                Column("score_id", S, "annotation_id + ':' + response_id"),
                Column("annotation_id", S, "the judgement it came from (a ranking gives several rows)"),
                Column("prompt_id", S),
                Column("response_id", S),
                Column("score", F, "higher is better; a rank r is scored -r"),
                Column("annotator", S),
                Column("raw", S, "the source row as exported, JSON or text"),
            ),
            key=("score_id",),
            doc="one annotator's score of one response, as imported",
        ),
        TableSchema(
            "comparisons",
            (
                Column("pair_id", S),
                Column("prompt_id", S),
                Column("prompt", S),
                Column("chosen", S),
                Column("rejected", S),
                Column("chosen_id", S),
                Column("rejected_id", S),
                Column("n_labels", I),
                Column("label_agreement", F, "share of labels agreeing with the aggregate"),
            ),
            key=("pair_id",),
            doc="one preference pair",
        ),
        TableSchema(
            "votes",
            (
                Column("pair_id", S),
                Column("mean", F, "mean over M models of r(chosen) - r(rejected)"),
                Column("std", F),
                Column("diffs", L, "per-model reward differences"),
                Column("bucket", S, "incorrect | ambiguous | normal"),
            ),
            key=("pair_id",),
            doc="one pair's preference strength",
        ),
        TableSchema(
            "denoised",
            (
                Column("pair_id", S),
                Column("prompt_id", S),
                Column("prompt", S),
                Column("chosen", S),
                Column("rejected", S),
                Column("flipped", B),
                Column("soft_label", F, "target P(chosen > rejected)"),
                Column("margin", F),
                Column("bucket", S),
            ),
            key=("pair_id",),
            doc="one training pair",
        ),
        TableSchema(
            "judgements",
            (
                Column("prompt_id", S),
                Column("model_a", S),
                Column("model_b", S),
                Column("response_a", S),
                Column("response_b", S),
                Column("verdict", S, "win | tie | lose, for model_a"),
                Column("verdict_ab", S, "judged with A shown first"),
                Column("verdict_ba", S, "judged with B shown first, mapped back to A"),
                Column("rationale", S),
            ),
            key=("prompt_id", "model_a", "model_b"),
            doc="one judge verdict",
        ),
    ]
}

_CHECKS = {
    S: lambda v: isinstance(v, str),
    I: lambda v: isinstance(v, int) and not isinstance(v, bool),
    F: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    B: lambda v: isinstance(v, bool),
    L: lambda v: hasattr(v, "__len__") and not isinstance(v, (str, bytes, dict)),
}


def _py(v):
    """numpy scalars to Python scalars, for type checks."""
    return v.item() if hasattr(v, "item") and not hasattr(v, "__len__") else v


def validate_table(kind: str, df: pd.DataFrame) -> pd.DataFrame:
    """Raise SchemaError naming the first missing column, wrongly typed cell or duplicate key."""
    if kind not in TABLES:
        raise SchemaError(f"unknown table kind {kind!r}; known: {sorted(TABLES)}")
    schema = TABLES[kind]
    missing = [c.name for c in schema.columns if c.name not in df.columns]
    if missing:
        raise SchemaError(f"{kind}: missing column(s) {missing}; present: {list(df.columns)}")
    for col in schema.columns:
        check = _CHECKS[col.kind]
        for i, v in enumerate(df[col.name].tolist()):
            v = _py(v)
            if v is None or not check(v):
                raise SchemaError(f"{kind}: row {i} column {col.name!r} must be {col.kind}, got {v!r}")
    dup = df.duplicated(list(schema.key))
    if dup.any():
        first = df.loc[dup, list(schema.key)].iloc[0].tolist()
        raise SchemaError(f"{kind}: duplicate key {schema.key}={first} ({int(dup.sum())} duplicates)")
    return df


def write_table(kind: str, df: pd.DataFrame, path: str | Path) -> Path:
    """Validate and write a table as Parquet (no index). Callers write into a temp artifact dir."""
    validate_table(kind, df)
    path = Path(path)
    df.reset_index(drop=True).to_parquet(path, index=False)
    return path


def read_table(kind: str, path: str | Path) -> pd.DataFrame:
    df = pd.read_parquet(path)
    for col in TABLES[kind].columns:
        if col.kind == L and col.name in df.columns:
            df[col.name] = df[col.name].map(list)
    return validate_table(kind, df)
