"""One model's generation: every (strategy, n) over every prompt, ids stable, provenance kept."""

import json

import pandas as pd

from rlhf_core import models
from rlhf_core.config import PolicyModelConfig, SamplingStrategy
from rlhf_core.generation.plan import generate_responses
from rlhf_core.schemas import validate_table

TINY = PolicyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1)
PROMPTS = pd.DataFrame({"prompt_id": ["p1", "p2", "p3"], "prompt": ["What is 1+1?", "2-1 = ?", "Compute 3+4."],
                        "tags": [["add"], ["sub"], ["add"]], "source": "t"})
PLAN = (SamplingStrategy(name="hot", temperature=1.0, n=2, max_new_tokens=6),
        SamplingStrategy(name="greedy", temperature=0.0, n=1, max_new_tokens=6))


def _run(seed=0, batch_size=2):
    tok = models.build_tokenizer()
    policy = models.build_policy(TINY, tok, seed=0).eval()
    return generate_responses(policy, tok, PROMPTS, PLAN, generator="tiny", batch_size=batch_size, seed=seed)


def test_every_strategy_and_sample_over_every_prompt():
    responses, report = _run()
    validate_table("responses", responses)
    assert report["n_generated"] == 3 * (2 + 1)
    assert len(responses) == report["n_responses"] == report["n_generated"] - report["duplicates_removed"]
    assert not responses.duplicated(["prompt_id", "response"]).any()
    assert responses["response_id"].is_unique and set(responses["generator"]) == {"tiny"}
    names = responses["strategy"].map(lambda s: json.loads(s)["name"])
    assert set(names) <= {"hot", "greedy"} and (names == "greedy").sum() == 3  # greedy: one per prompt
    assert report["tokens"] > 0 and report["tokens_per_second"] > 0
    # greedy responses are the same whatever the seed; sampled ones are reproducible for a seed
    again, _ = _run()
    pd.testing.assert_frame_equal(responses, again)
    other, _ = _run(seed=1)
    greedy = names == "greedy"
    other_greedy = other["strategy"].map(lambda s: json.loads(s)["name"]) == "greedy"  # rows sort by id, which names
    by_prompt = ["prompt_id"]                                                                # the text: order by prompt
    assert (responses[greedy].sort_values(by_prompt)["response"].tolist()
            == other[other_greedy].sort_values(by_prompt)["response"].tolist())


def test_identical_responses_to_a_prompt_are_kept_once():
    # greedy twice gives the same text twice: only the smaller response_id survives
    tok = models.build_tokenizer()
    policy = models.build_policy(TINY, tok, seed=0).eval()
    plan = (SamplingStrategy(name="g", temperature=0.0, n=2, max_new_tokens=5),)
    responses, report = generate_responses(policy, tok, PROMPTS, plan, "tiny", batch_size=3, seed=0)
    assert report["n_generated"] == 6 and report["duplicates_removed"] == 3 and len(responses) == 3


def test_bad_prompts_fail_before_any_generation():
    import pytest

    from rlhf_core.generation.plan import GenerationInputError

    tok = models.build_tokenizer()
    policy = models.build_policy(TINY, tok, seed=0).eval()
    empty = PROMPTS.assign(prompt=["What is 1+1?", "  ", "x"])
    with pytest.raises(GenerationInputError, match=r"row 1 \(prompt_id p2\): empty prompt"):
        generate_responses(policy, tok, empty, PLAN, "tiny", batch_size=2, seed=0)
    long = PROMPTS.assign(prompt=["What is 1+1?", "x" * 200, "y"])
    with pytest.raises(GenerationInputError, match=r"row 1 \(prompt_id p2\): query is 206 tokens"):
        generate_responses(policy, tok, long, PLAN, "tiny", batch_size=2, seed=0)


def test_a_tokenizer_saves_the_same_whatever_its_last_call_padded(tmp_path):
    """Rollouts left left-padding switched on in the fast tokenizer's backend, and tokenizer.json kept it: a PPO run
    resumed from a finished checkpoint (no rollout) committed the same weights under another digest."""
    from rlhf_core.artifacts import content_digest
    from rlhf_core.generation.sampler import sample_batch

    tokenizer = models.build_tokenizer()
    policy = models.build_policy(TINY, tokenizer)
    models.save_hf(policy, tokenizer, tmp_path / "fresh")
    sample_batch(policy, tokenizer, ["Q: 1+1?\nA:", "Q: 2+2? Be polite.\nA:"], 2, temperature=0.0)
    assert tokenizer.backend_tokenizer.padding is not None  # what a rollout leaves behind
    models.save_hf(policy, tokenizer, tmp_path / "after")
    assert content_digest(tmp_path / "after") == content_digest(tmp_path / "fresh")
    assert tokenizer.backend_tokenizer.padding is not None  # the caller's tokenizer is left as it was
