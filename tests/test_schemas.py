"""Canonical tables: validation names the problem; Parquet round-trips and loads with datasets."""

import pandas as pd
import pytest

from rlhf_core.schemas import TABLES, SchemaError, read_table, validate_table, write_table


def _prompts():
    return pd.DataFrame({"prompt_id": ["p1", "p2"], "prompt": ["a", "b"], "tags": [["x"], ["x", "y"]],
                         "source": ["sim", "sim"]})


def test_every_design_table_exists():
    assert set(TABLES) == {"prompts", "sampled_prompts", "responses", "annotations", "comparisons", "scores", "votes",
                           "denoised", "judgements"}


def test_missing_column_wrong_type_duplicate_key():
    with pytest.raises(SchemaError, match=r"missing column\(s\) \['source'\]"):
        validate_table("prompts", _prompts().drop(columns="source"))
    bad = _prompts().astype({"prompt": object})
    bad.loc[1, "prompt"] = 3
    with pytest.raises(SchemaError, match="row 1 column 'prompt' must be str"):
        validate_table("prompts", bad)
    dup = _prompts()
    dup.loc[1, "prompt_id"] = "p1"
    with pytest.raises(SchemaError, match="duplicate key"):
        validate_table("prompts", dup)


def test_parquet_round_trip_and_datasets(tmp_path):
    path = write_table("prompts", _prompts().assign(extra=[1, 2]), tmp_path / "p.parquet")
    back = read_table("prompts", path)
    assert back["tags"].tolist() == [["x"], ["x", "y"]] and "extra" in back
    from datasets import Dataset

    ds = Dataset.from_parquet(str(path))
    assert ds[1]["tags"] == ["x", "y"] and ds.num_rows == 2
