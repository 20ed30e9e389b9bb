"""InsTag sampling on hand-made pools: tag normalisation, deduplication, both selection modes."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rlhf_core.config import ConfigError, SamplingConfig, parse_config
from rlhf_core.sampling.dedup import drop_near_duplicate_prompts, lsh_params, minhash_signatures
from rlhf_core.sampling.instag import instag_passes, select_prompts
from rlhf_core.sampling.normalize import drop_duplicate_prompts, normalize_tags, normalize_text, stem_word, tag_key


def _pool(tags, prompts=None):
    n = len(tags)
    return pd.DataFrame({"prompt_id": [f"p{i}" for i in range(n)], "prompt": prompts or [f"q{i}" for i in range(n)],
                         "tags": tags, "source": "t"})


# ---------------------------------------------------------------- selection, complexity_first


def test_complexity_first_then_new_tags_only():
    pool = _pool([["a"], ["a", "b", "c"], ["a", "b"], ["d"], ["c", "d"], ["a"]])
    out, report = select_prompts(pool, budget=3, seed=0)
    # first the 3-tag prompt, then the 2-tag prompt that adds d; ["a","b"] adds nothing; then ["d"] adds
    # nothing, ... so the pass ends with 2 and the second pass starts from the most tagged left.
    assert out["prompt_id"].tolist()[:2] == ["p1", "p4"]
    assert out["prompt_id"].tolist()[2] == "p2"
    assert out["selection_order"].tolist() == [0, 1, 2]
    assert report["n_passes"] == 2 and report["tag_coverage"] == 1.0


def test_budget_equals_pool_takes_everything_deterministically():
    pool = _pool([["a"], ["a"], ["b"], []])
    out1, report = select_prompts(pool, budget=4, seed=1)
    out2, _ = select_prompts(pool, budget=4, seed=1)
    assert sorted(out1["prompt_id"]) == ["p0", "p1", "p2", "p3"]
    assert out1.equals(out2)
    assert out1["selection_reason"].tolist() == ["complexity-first"] * 3 + ["fill"]
    assert report["n_fill"] == 1 and report["budget_met"] == 1.0


def test_hand_case_full_order():
    # ranks: p0 (3 tags), then p1, p2 (2 tags, seeded order), then p3, p4 (1 tag).
    # pass 1: p0 covers a b c; p1 = [c, d] adds d; p2 = [a, b] adds nothing; p3 = [e] adds e; p4 = [a] no.
    # pass 2: p2 adds a; p4 = [a] nothing. pass 3: p4.
    pool = _pool([["a", "b", "c"], ["c", "d"], ["a", "b"], ["e"], ["a"]])
    for seed in range(4):  # the seeded tiebreak cannot change this order
        out, report = select_prompts(pool, budget=5, seed=seed)
        assert out["prompt_id"].tolist() == ["p0", "p1", "p3", "p2", "p4"] and report["n_passes"] == 3
        assert out["n_tags"].tolist() == [3, 2, 1, 2, 1]


def test_unknown_mode_and_oversized_budget_raise():
    pool = _pool([["a"], ["b"]])
    with pytest.raises(ValueError, match="unknown sampling mode 'greedy'"):
        select_prompts(pool, 1, 0, mode="greedy")
    with pytest.raises(ValueError, match="exceeds the pool"):
        select_prompts(pool, 3, 0)


def test_same_seed_same_selection_other_seed_other_tiebreak():
    pool = _pool([[f"t{i % 7}", f"u{i % 5}"] for i in range(60)])
    runs = [select_prompts(pool, 20, seed=s, mode=m)[0] for s in (3, 3, 4) for m in ("complexity_first", "balanced")]
    assert runs[0].equals(runs[2]) and runs[1].equals(runs[3])
    assert runs[0]["prompt_id"].tolist() != runs[4]["prompt_id"].tolist()


# ---------------------------------------------------------------- selection, balanced


def test_the_report_describes_the_selection_and_the_pool_apart():
    selected, report = select_prompts(_pool([["a", "b", "c"], ["a"], ["a"], ["a"]]), budget=1, seed=0)
    assert selected["tags"].tolist() == [["a", "b", "c"]]  # the most tagged first
    assert report["mean_tags_selected"] == 3.0 and report["mean_tags_pool"] == 1.5


def test_balanced_never_exceeds_the_cap_where_complexity_first_does():
    # "common" is on every tagged prompt: complexity-first takes it 8 times out of 10.
    pool = _pool([["common", f"r{i}"] for i in range(8)] + [["x"], ["y"], [], [], []])
    cf, cf_report = select_prompts(pool, budget=10, seed=0)
    bal, report = select_prompts(pool, budget=10, seed=0, mode="balanced", max_tag_share=0.3)
    assert sum("common" in ts for ts in cf["tags"]) == 8 and cf_report["max_tag_share_selected"] == 0.8
    assert sum("common" in ts for ts in bal["tags"]) == 3  # cap = floor(0.3 * 10)
    # 3 "common" prompts, x, y, and the 3 untagged ones as fill: 8 of 10, budget not met
    assert len(bal) == 8 and report["budget_met"] == 0.0 and report["n_fill"] == 3
    assert report["tag_cap"] == 3 and report["n_blocked_by_cap"] == 5
    assert set(bal["selection_reason"]) == {"balanced", "fill"}
    # the cap is of the budget, not of the pool left after deduplication (2 copies removed made it 2 before)
    copies = _pool([["common", f"r{i}"] for i in range(8)] + [["common", "s"], ["common", "t"]])
    copies["prompt"] = [f"q{i}" for i in range(8)] + ["q0", "q1"]
    capped, report = select_prompts(copies, budget=10, seed=0, mode="balanced", max_tag_share=0.3,
                                    drop_duplicates=True)
    assert report["n_duplicates_removed"] == 2 and report["tag_cap"] == 3 and len(capped) == 3
    # 0.29 x 100 is 28.999999999999996 in floats: the cap is still 29
    shares = _pool([["common", f"r{i}"] for i in range(100)] + [[f"s{i}"] for i in range(50)])
    capped, report = select_prompts(shares, budget=100, seed=0, mode="balanced", max_tag_share=0.29)
    assert report["tag_cap"] == 29 and sum("common" in ts for ts in capped["tags"]) == 29


def test_a_balanced_cap_of_zero_prompts_is_refused_before_any_work():
    """int(0.3 x 3) = 0: nothing tagged could be selected (the stage committed 0 prompts, generation then crashed)."""
    pool = _pool([["a"], ["b"], ["c"], ["d"]])
    with pytest.raises(ValueError, match=r"int\(0.3 x 3\) is 0 prompts per tag.*at least 0.3334 or sampling.n_samples "
                       r"to at least 4"):
        select_prompts(pool, budget=3, seed=0, mode="balanced", max_tag_share=0.3)
    with pytest.raises(ValidationError, match="is 0 prompts per tag"):
        SamplingConfig(n_samples=3, mode="balanced")
    assert len(select_prompts(pool, budget=3, seed=0, mode="balanced", max_tag_share=0.3334)[0]) == 3
    assert SamplingConfig(n_samples=3, mode="complexity_first").n_samples == 3  # no cap there


# ---------------------------------------------------------------- normalisation and deduplication


def test_rule_aggregation_merges_the_three_spellings():
    tags, report = normalize_tags(pd.Series([["code-reviews"], ["Code review"], ["code_reviewing", "math"]]),
                                  merge_variants=True)
    assert tags.tolist() == [["code review"], ["code review"], ["code review", "math"]]
    assert report == {"tags_raw": 4, "tags_after_cleaning": 4, "tags_after_rules": 2, "tags_after_semantic_merge": 2,
                      "n_tags_merged_semantic": 0, "tags_after_frequency_filter": 2}
    assert [stem_word(w) for w in ("reviews", "reviewing", "reviewed", "studies", "class", "status")] == [
        "review", "review", "review", "study", "class", "status"]
    assert tag_key("Data_Processing") == tag_key("data processes") == "data process"


def test_without_merging_variants_stay_apart():
    tags, report = normalize_tags(pd.Series([["code-reviews"], ["Code review"]]))
    assert tags.tolist() == [["code-reviews"], ["code review"]] and report["tags_after_rules"] == 2


def test_normalize_tags_cleans_and_filters():
    tags, report = normalize_tags(pd.Series([["Math ", "math", "rare"], ["MATH"]]), min_count=2)
    assert tags.tolist() == [["math"], ["math"]]
    assert report == {"tags_raw": 4, "tags_after_cleaning": 2, "tags_after_rules": 2, "tags_after_semantic_merge": 2,
                      "n_tags_merged_semantic": 0, "tags_after_frequency_filter": 1}


def test_frequency_filter_after_merging():
    # "plots" (2 spellings, 2 prompts) survives min_count=2 only because the spellings merge
    raw = pd.Series([["plots", "rare"], ["Plot"], ["solo"]])
    assert normalize_tags(raw, min_count=2)[0].tolist() == [[], [], []]
    tags, report = normalize_tags(raw, min_count=2, merge_variants=True)
    assert tags.tolist() == [["plot"], ["plot"], []]
    assert (report["tags_after_rules"], report["tags_after_frequency_filter"]) == (3, 1)


def test_duplicate_prompts_removed_keeping_the_smallest_prompt_id():
    pool = pd.DataFrame({"prompt_id": ["b", "a", "c", "d", "e"], "tags": [["x"]] * 5, "source": "t",
                         "prompt": ["What is 7+8?", "what  is 7+8", "What is 7-8?", "WHAT IS 7+8 ?!", "Hi"]})
    kept, n_removed = drop_duplicate_prompts(pool)
    assert n_removed == 2 and kept["prompt_id"].tolist() == ["a", "c", "e"]  # "+" and "-" stay apart
    # brackets, decimal marks, ratios and factorials are meaning, not prose; sentence punctuation is prose
    apart = ["What is (2+3) * 4?", "What is 2+3 * 4?", "What is 5! + 1?", "What is 5 + 1?", "1.5 + 2", "1,5 + 2",
             "15 + 2", "Ratio 3:4", "Ratio 34"]
    assert len({normalize_text(t) for t in apart}) == len(apart)
    assert normalize_text("What is 1.5 + 2? Answer: quickly.") == normalize_text("what is 1.5 + 2 answer quickly")
    out, report = select_prompts(pool, budget=5, seed=0, drop_duplicates=True)
    assert report["n_duplicates_removed"] == 2 and len(out) == 3 and report["budget_met"] == 0.0


# ---------------------------------------------------------------- fuzzy near-duplicates (MinHash + LSH)

NEAR = {  # prompt_id -> prompt; estimated Jaccard (5-char shingles, 256 permutations) in the comments
    "b": "What is 2+3? Be polite.",
    "a": "What is 2+3? Be polite!!",  # 1.0 with b once punctuation is normalised: a, the smaller id, stays
    "c": "Write a long story about a dragon who learns to bake bread in a small village.",
    "d": "Write a long story about a dragon who learns to bake bread in a tiny village.",  # 0.76 with c
    "e": "Translate good morning into French.",
    "f": "What is 2+4? Be polite.",  # 0.58 with a: another question, kept
}


def _near_pool(order):
    return pd.DataFrame({"prompt_id": order, "prompt": [NEAR[i] for i in order], "tags": [["x"]] * len(order),
                         "source": "t"})


def test_near_copies_removed_keeping_the_smallest_id_whatever_the_row_order():
    for order in (list(NEAR), sorted(NEAR), sorted(NEAR, reverse=True)):
        kept, n_removed = drop_near_duplicate_prompts(_near_pool(order), threshold=0.7)
        assert n_removed == 2 and sorted(kept["prompt_id"]) == ["a", "c", "e", "f"]
        assert kept["prompt_id"].tolist() == [i for i in order if i in {"a", "c", "e", "f"}]  # row order kept
    assert drop_near_duplicate_prompts(_near_pool(list(NEAR)), threshold=0.9)[1] == 1  # only the exact-after-cleaning
    out, report = select_prompts(_near_pool(list(NEAR)), budget=6, seed=0, near_duplicate_threshold=0.7)
    assert report["n_near_duplicates_removed"] == 2 and len(out) == 4 and report["n_pool"] == 6


def test_minhash_is_deterministic_and_estimates_jaccard():
    texts = list(NEAR.values())
    sig = minhash_signatures(texts, num_perm=256, seed=3)
    assert sig.shape == (6, 256) and sig.dtype == np.uint32
    assert np.array_equal(sig, minhash_signatures(texts, num_perm=256, seed=3))
    assert not np.array_equal(sig, minhash_signatures(texts, num_perm=256, seed=4))

    def shingles(t):
        t = normalize_text(t)
        return {t[i : i + 5] for i in range(len(t) - 4)}

    # shingles are of characters, not UTF-8 bytes: one changed CJK character (3 bytes) moves 5 of them (the
    # byte shingles' estimate was 0.89, and a distinct question was dropped as a near copy at 0.8)
    chinese = ["小明有15个苹果，给了小红7个，他还剩下几个苹果？", "小明有15个苹果，给了小红8个，他还剩下几个苹果？"]
    texts, sig = texts + chinese, np.vstack([sig, minhash_signatures(chinese, num_perm=256, seed=3)])
    for i, j in [(2, 3), (0, 5), (0, 4), (6, 7)]:
        true = len(shingles(texts[i]) & shingles(texts[j])) / len(shingles(texts[i]) | shingles(texts[j]))
        assert abs((sig[i] == sig[j]).mean() - true) < 0.1
    pair = pd.DataFrame({"prompt_id": ["p0", "p1"], "prompt": chinese, "tags": [["x"]] * 2, "source": "t"})
    assert drop_near_duplicate_prompts(pair, threshold=0.8)[1] == 0  # Jaccard 0.62: another question, kept
    assert minhash_signatures(["hi", ""], num_perm=8).shape == (2, 8)  # shorter than a shingle: one shingle
    bands, rows = lsh_params(0.8, 128)
    assert bands * rows <= 128 and 0.6 < (1 / bands) ** (1 / rows) < 0.85  # the S-curve's midpoint near 0.8


def test_near_duplicate_bad_input():
    with pytest.raises(ValueError, match="threshold must be in \\(0, 1\\]"):
        drop_near_duplicate_prompts(_near_pool(list(NEAR)), threshold=0.0)
    dup_ids = _near_pool(list(NEAR)).assign(prompt_id=["a", "a", "b", "c", "d", "e"])
    with pytest.raises(ValueError, match="prompt_id 'a' appears more than once"):
        drop_near_duplicate_prompts(dup_ids, threshold=0.8)


# ---------------------------------------------------------------- config


def test_sampling_config_defaults_keep_data_tags_and_checks_tagger_sources():
    cfg = SamplingConfig()
    assert cfg.tagger.source == "data" and cfg.semantic_merge_threshold is None and cfg.near_duplicate_threshold is None
    with pytest.raises(ConfigError, match="needs exactly one of tagger.vocabulary"):
        parse_config({"sampling": {"tagger": {"source": "embedding"}}})
    with pytest.raises(ConfigError, match="needs tagger.base_url and tagger.model"):
        parse_config({"sampling": {"tagger": {"source": "llm", "model": "m"}}})
    with pytest.raises(ConfigError, match="near_duplicate_threshold"):
        parse_config({"sampling": {"near_duplicate_threshold": 0}})
    cfg = parse_config({"sampling": {"tagger": {"source": "embedding", "vocabulary_file": "tags.txt"}}})
    assert cfg.sampling.tagger.vocabulary_file == "tags.txt"


# ---------------------------------------------------------------- properties


def _reference_passes(prompt_tags, budget, cap=None):
    """The plain InsTag loop (a scan of the pool per pass): what `instag_passes` must agree with."""
    remaining, chosen, count, n_passes = list(range(len(prompt_tags))), [], {}, 0

    def blocked(r):
        return cap is not None and any(count.get(t, 0) >= cap for t in prompt_tags[r])

    while len(chosen) < budget:
        covered, picked = set(), []
        for r in remaining:
            if len(chosen) + len(picked) < budget and set(prompt_tags[r]) - covered and not blocked(r):
                picked.append(r)
                covered |= set(prompt_tags[r])
                for t in prompt_tags[r]:
                    count[t] = count.get(t, 0) + 1
        if not picked:
            break
        n_passes += 1
        chosen += picked
        remaining = [r for r in remaining if r not in picked]
    fill = [r for r in remaining if not blocked(r)][: budget - len(chosen)]
    return chosen + fill, n_passes, len(fill)


pools = st.lists(st.lists(st.sampled_from("abcdefgh"), max_size=4, unique=True), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(pools, st.data())
def test_heap_passes_agree_with_the_plain_loop(tag_lists, data):
    ranked = sorted(([ord(t) - ord("a") for t in ts] for ts in tag_lists), key=len, reverse=True)
    budget = data.draw(st.integers(0, len(ranked)))
    cap = data.draw(st.one_of(st.none(), st.integers(0, budget)))
    assert instag_passes(ranked, 8, budget, cap) == _reference_passes(ranked, budget, cap)


@settings(max_examples=100, deadline=None)
@given(pools, st.lists(st.sampled_from(["q", "Q.", "r", "s "]), min_size=25, max_size=25), st.data())
def test_selection_is_unique_subset_of_budget_size(tag_lists, texts, data):
    pool = _pool(tag_lists, texts[: len(tag_lists)])
    budget = data.draw(st.integers(0, len(pool)))
    seed = data.draw(st.integers(0, 2**16))
    out, report = select_prompts(pool, budget, seed, drop_duplicates=True, merge_tag_variants=True)
    ids = out["prompt_id"].tolist()
    n_unique = len(drop_duplicate_prompts(pool)[0])
    assert len(set(ids)) == len(ids) and set(ids) <= set(pool["prompt_id"])
    assert len(ids) == min(budget, n_unique) == report["n_selected"]
    assert report["n_duplicates_removed"] == len(pool) - n_unique
    assert out["selection_order"].tolist() == list(range(len(ids)))
