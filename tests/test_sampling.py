"""InsTag complexity-first diverse sampling on hand-made pools."""

import pandas as pd

from rlhf_core.sampling.instag import complexity_first_diverse, normalize_tags


def _pool(tags):
    return pd.DataFrame({"prompt_id": [f"p{i}" for i in range(len(tags))], "prompt": [f"q{i}" for i in range(len(tags))],
                         "tags": tags, "source": "t"})


def test_complexity_first_then_new_tags_only():
    pool = _pool([["a"], ["a", "b", "c"], ["a", "b"], ["d"], ["c", "d"], ["a"]])
    out, report = complexity_first_diverse(pool, budget=3, seed=0)
    # first the 3-tag prompt, then the 2-tag prompt that adds d; ["a","b"] adds nothing; then ["d"] adds
    # nothing, ... so the pass ends with 2 and the second pass starts from the most tagged left.
    assert out["prompt_id"].tolist()[:2] == ["p1", "p4"]
    assert out["prompt_id"].tolist()[2] == "p2"
    assert out["selection_order"].tolist() == [0, 1, 2]
    assert report["n_passes"] == 2 and report["tag_coverage"] == 1.0


def test_budget_equals_pool_takes_everything_deterministically():
    pool = _pool([["a"], ["a"], ["b"], []])
    out1, _ = complexity_first_diverse(pool, budget=4, seed=1)
    out2, _ = complexity_first_diverse(pool, budget=4, seed=1)
    assert sorted(out1["prompt_id"]) == ["p0", "p1", "p2", "p3"]
    assert out1.equals(out2)
    assert out1["selection_reason"].iloc[-1] == "fill"


def test_normalize_tags_cleans_and_filters():
    tags, report = normalize_tags(pd.Series([["Math ", "math", "rare"], ["MATH"]]), min_count=2)
    assert tags.tolist() == [["math"], ["math"]]
    assert report == {"tags_raw": 4, "tags_after_cleaning": 2, "tags_after_frequency_filter": 1}
