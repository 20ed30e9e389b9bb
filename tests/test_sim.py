"""The simulated world: prompts, graded gold, demonstrator, annotators (Label Studio export), SFT."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pandas as pd
import pytest
import torch

from rlhf_core import models
from rlhf_core.config import PolicyModelConfig, SFTConfig, WorldConfig
from rlhf_core.schemas import validate_table
from rlhf_core.sim.annotators import gold_agreement, simulate_label_studio_export
from rlhf_core.sft import collate, encode_example, response_logprobs, train_sft
from rlhf_core.sim.world import (
    demonstrate,
    gold_score,
    ideal_response,
    make_demonstrations,
    make_prompt_pool,
    number_to_words,
    parse_answer,
    parse_prompt,
)

# The demonstrator's grammar (see rlhf_core/sim/world.py): what SFT samples should look like.
DEMO_GRAMMAR = re.compile(r" (Sure! )?(It is )?(\d[+\-*]\d=)?(-?\d+|[a-z]+(-[a-z]+)?|minus [a-z]+)\.?")


@pytest.fixture
def one_thread():
    """Tiny models run ~10x faster on one thread than on two on these 2-core machines."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def demo_pair_tasks(n_prompts: int, seed: int, world: WorldConfig) -> pd.DataFrame:
    """Comparison tasks made of two distinct demonstrations of the same prompt."""
    pool = make_prompt_pool(n_prompts, seed)
    rng = random.Random(seed)
    rows = []
    for pid, prompt in zip(pool.prompt_id, pool.prompt):
        for _ in range(20):  # redraw until the two responses differ
            a = demonstrate(prompt, rng, world.demo_correct_prob, world.demo_style_prob)
            b = demonstrate(prompt, rng, world.demo_correct_prob, world.demo_style_prob)
            if a != b:
                rows.append({"task_id": f"t-{pid}", "prompt_id": pid, "prompt": prompt,
                             "response_a_id": f"{pid}-a", "response_a": a,
                             "response_b_id": f"{pid}-b", "response_b": b})
                break
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- prompts


def test_prompt_pool_is_deterministic_and_schema_valid():
    pool = make_prompt_pool(300, seed=3)
    validate_table("prompts", pool)
    pd.testing.assert_frame_equal(pool, make_prompt_pool(300, seed=3))
    assert not pool.equals(make_prompt_pool(300, seed=4))
    assert pool.prompt_id.iloc[0] == "p00000" and pool.prompt_id.is_unique
    assert (pool.source == "sim").all()
    assert pool.prompt.str.len().max() <= 40


def test_eval_pool_uses_its_own_prefix():
    ev = make_prompt_pool(10, seed=99, id_prefix="e")
    assert ev.prompt_id.tolist()[:2] == ["e00000", "e00001"]


def test_held_out_prompts_are_distinct_texts_and_it_says_when_the_world_has_too_few():
    """Drawn with repeats, 200 held-out prompts were 182-188 texts on the demo's world: each copy judged again."""
    kwargs = {"max_operand": 4, "ops": ("+", "-")}
    repeats = make_prompt_pool(200, seed=10_000, id_prefix="e", **kwargs)
    distinct = make_prompt_pool(200, seed=10_000, id_prefix="e", distinct=True, **kwargs)
    assert repeats.prompt.nunique() < 200 and distinct.prompt.is_unique and len(distinct) == 200
    first_repeat = int(repeats.prompt.duplicated().to_numpy().argmax())
    assert distinct.prompt[:first_repeat].tolist() == repeats.prompt[:first_repeat].tolist()
    with pytest.raises(ValueError, match="100 distinct prompts are more than it writes .40 found.*lower "
                                         "world.n_eval_prompts"):
        make_prompt_pool(100, seed=1, max_operand=0, ops=("+",), distinct=True)


def test_the_pool_never_holds_a_held_out_prompt_and_says_when_it_cannot():
    held_out = make_prompt_pool(200, seed=10_000, id_prefix="e", max_operand=4, ops=("+", "-"))
    plain = make_prompt_pool(4000, seed=0, max_operand=4, ops=("+", "-"))
    assert plain.prompt.isin(set(held_out.prompt)).mean() > 0.05  # a second draw alone would repeat them
    pool = make_prompt_pool(4000, seed=0, max_operand=4, ops=("+", "-"), held_out=frozenset(held_out.prompt))
    assert len(pool) == 4000 and not pool.prompt.isin(set(held_out.prompt)).any()
    assert pool.prompt_id.tolist()[:2] == ["p00000", "p00001"] and pool.prompt_id.is_unique
    first_held_out_draw = int(plain.prompt.isin(set(held_out.prompt)).to_numpy().argmax())
    assert pool.prompt[:first_held_out_draw].tolist() == plain.prompt[:first_held_out_draw].tolist()
    every_text = frozenset(make_prompt_pool(5000, seed=1, max_operand=0, ops=("+",)).prompt)
    with pytest.raises(ValueError, match="nearly all held out .* raise world.max_operand"):
        make_prompt_pool(10, seed=0, max_operand=0, ops=("+",), held_out=every_text)


def test_tags_vary_in_count_and_kind():
    pool = make_prompt_pool(1000, seed=0)
    counts = pool.tags.map(len)
    assert counts.min() == 1 and counts.max() == 5
    assert counts.nunique() == 5
    all_tags = {t for tags in pool.tags for t in tags}
    assert {"add", "sub", "mul", "carry", "negative-result", "brief", "polite", "show-work", "words"} <= all_tags
    # the first tag is always the operation, and gold reads the same styles from the text
    for prompt, tags in zip(pool.prompt[:100], pool.tags[:100]):
        assert tags[0] in {"add", "sub", "mul"}
        assert set(parse_prompt(prompt).styles) == set(tags) & {"brief", "polite", "show-work", "words"}


# ---------------------------------------------------------------- gold


def test_gold_grades_correctness_by_distance():
    p = "What is 7+8?"
    right, off1, off2, off5 = (gold_score(p, f" It is {n}.") for n in (15, 16, 13, 20))
    assert right > off1 > off2 > off5
    assert right - off1 == pytest.approx(1.0)  # CORRECT_WEIGHT * (1 - 1/2)
    assert off1 - off2 == pytest.approx(0.5)
    assert gold_score(p, " It is.") < off5  # no number at all is worse than any number


def test_gold_rewards_each_followed_style_tag():
    p = "What is 6+7? Be brief. Use words."
    assert parse_prompt(p).styles == ("brief", "words")
    none = gold_score(p, " It is 13.")
    brief = gold_score(p, " 13")
    both = gold_score(p, " thirteen")
    assert brief - none == pytest.approx(0.6)
    assert both - brief == pytest.approx(0.6)
    assert gold_score(p, ideal_response(p)) == pytest.approx(both)
    # a style marker the prompt did not ask for earns nothing
    assert gold_score("What is 6+7?", " Sure! It is 13.") == gold_score("What is 6+7?", " It is 13.")


def test_gold_reads_show_work_polite_and_negative_answers():
    p = "Compute 3-9. Be polite. Show work."
    assert ideal_response(p) == " Sure! It is 3-9=-6."
    assert gold_score(p, " Sure! It is 3-9=-6.") == pytest.approx(2.0 + 2 * 0.6)
    assert gold_score(p, " It is 3-9=-6.") == pytest.approx(2.0 + 0.6)
    assert parse_answer(" 4*7=28")[0] == 28  # the answer is after "=", not the operand
    assert parse_answer(" minus six") == (-6, True)
    assert parse_answer(" seventy-two") == (72, True)


def test_gold_never_raises_on_garbage():
    p = "What is 2*3? Be brief."
    rng = random.Random(0)
    for _ in range(300):
        junk = "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 30)))
        assert np.isfinite(gold_score(p, junk))
    assert np.isfinite(gold_score(p, "9" * 5000))
    assert gold_score(p, "\x00\x01\x02 6") < gold_score(p, " 6")  # garbage bytes cost


def test_gold_charges_garbage_and_length_per_byte_and_reads_ascii_digits_only():
    p = "What is 3+4?"
    clean = gold_score(p, " It is 7.")
    # 7 two-byte characters: 14 garbage bytes (-1.4), and 23 bytes in all, one over FREE_LENGTH (-0.1)
    assert gold_score(p, " It is 7." + "\u00e9" * 7) == pytest.approx(clean - 1.4 - 0.1)
    assert parse_answer(" \u0661\u0665") == (None, False)  # Arabic-Indic digits are not an answer here
    assert parse_answer(" It is 1\uff15.")[0] == 1  # nor is a fullwidth 5


def test_show_work_needs_the_prompts_own_expression_and_minus_reads_as_a_sign():
    p = "What is 1+2? Show work."
    assert gold_score(p, " It is 1+2=3.") - gold_score(p, " It is 3.") == pytest.approx(0.6)
    assert gold_score(p, " It is 11+2=3.") == gold_score(p, " It is 3.")  # "1+2=" inside "11+2=" is not the work
    assert parse_answer(" It is minus 1.") == (-1, False)
    assert parse_answer(" It is Minus  12.") == (-12, False)
    assert parse_answer(" It is 4-5=-1.") == (-1, False)


def test_number_words_round_trip():
    for n in range(-99, 100):
        assert parse_answer(" " + number_to_words(n)) == (n, True)


def test_demonstrator_matches_its_probabilities():
    pool = make_prompt_pool(400, seed=1)
    demos = make_demonstrations(pool, per_prompt=5, correct_prob=0.55, style_prob=0.5, seed=2)
    assert list(demos.columns) == ["prompt_id", "prompt", "response"] and len(demos) == 2000
    correct = [parse_answer(r)[0] == parse_prompt(p).truth for p, r in zip(demos.prompt, demos.response)]
    assert np.mean(correct) == pytest.approx(0.55, abs=0.03)
    assert all(r.startswith(" ") and len(r) <= 21 for r in demos.response)
    assert all(DEMO_GRAMMAR.fullmatch(r) for r in demos.response)
    perfect = make_demonstrations(pool, 1, correct_prob=1.0, style_prob=1.0, seed=0)
    assert perfect.response.tolist() == [ideal_response(p) for p in pool.prompt]


# ---------------------------------------------------------------- annotators


def test_annotators_agree_with_gold_like_a_real_crowd():
    world = WorldConfig()
    tasks = demo_pair_tasks(2000, seed=0, world=world)
    assert len(tasks) > 1900
    export = simulate_label_studio_export(tasks, world, seed=0)
    agreement = gold_agreement(tasks, export)
    assert 0.63 <= agreement <= 0.75, agreement


def test_sharper_annotators_agree_more():
    world = WorldConfig()
    tasks = demo_pair_tasks(1000, seed=1, world=world)
    noisy = gold_agreement(tasks, simulate_label_studio_export(tasks, world, seed=1))
    sharp = WorldConfig(annotator_temperature=0.1, annotator_error_max=0.0)
    assert gold_agreement(tasks, simulate_label_studio_export(tasks, sharp, seed=1)) > 0.97 > noisy


def test_gold_agreement_skips_gold_ties_and_cancelled_labels():
    """Hand-made export: 2 of 3 counted labels right; a gold tie and a cancelled label do not count; nothing -> NaN."""
    right, wrong = ideal_response("Compute 4+2. Show work."), " It is 7."
    tasks = pd.DataFrame({"task_id": ["t1", "t2"], "prompt": ["Compute 4+2. Show work."] * 2,
                          "response_a": [right, right], "response_b": [wrong, right]})  # t2: a gold tie

    def label(selected, cancelled=False):
        return {"was_cancelled": cancelled, "result": [{"value": {"selected": selected}}]}

    export = [{"data": {"task_id": "t1"}, "annotations": [label("left"), label("left"), label("right"),
                                                          label("right", cancelled=True)]},
              {"data": {"task_id": "t2"}, "annotations": [label("right"), label("right")]}]
    assert gold_agreement(tasks, export) == pytest.approx(2 / 3)
    tie_only = [export[1]]
    cancelled_only = [{"data": {"task_id": "t1"}, "annotations": [label("left", cancelled=True)]}]
    assert np.isnan(gold_agreement(tasks, tie_only)) and np.isnan(gold_agreement(tasks, cancelled_only))


def test_one_label_flips_with_the_annotators_error_rate_and_every_annotator_is_drawn():
    """A pair gold calls certain is labelled "left" with probability 1 - e; the crowd is all n_annotators ids."""
    from rlhf_core.sim.annotators import label_pair

    rng = random.Random(0)
    share = sum(label_pair(50.0, 0.4, 0.9, rng) == "left" for _ in range(20_000)) / 20_000
    assert share == pytest.approx(0.6, abs=0.015)
    tasks = demo_pair_tasks(30, seed=2, world=WorldConfig())
    used = {a["completed_by"] for t in simulate_label_studio_export(tasks, WorldConfig(), seed=0)
            for a in t["annotations"]}
    assert used == set(range(1, WorldConfig().n_annotators + 1))
    everyone = WorldConfig(n_annotators=3, annotators_per_pair=3)  # each pair labelled by the whole crowd
    export = simulate_label_studio_export(tasks, everyone, seed=0)
    assert all(sorted(a["completed_by"] for a in t["annotations"]) == [1, 2, 3] for t in export)


def test_export_is_a_label_studio_pairwise_export():
    world = WorldConfig(annotators_per_pair=3)
    tasks = demo_pair_tasks(50, seed=2, world=world)
    export = simulate_label_studio_export(tasks, world, seed=7)
    assert json.loads(json.dumps(export)) == export  # plain JSON
    assert export == simulate_label_studio_export(tasks, world, seed=7)  # deterministic
    assert len(export) == len(tasks)
    annotation_ids = []
    for task, row in zip(export, tasks.itertuples()):
        assert isinstance(task["id"], int) and task["inner_id"] == task["id"] and task["project"] == 1
        assert task["data"] == {"prompt": row.prompt, "answer1": row.response_a, "answer2": row.response_b,
                                "task_id": row.task_id, "prompt_id": row.prompt_id,
                                "answer1_id": row.response_a_id, "answer2_id": row.response_b_id}
        assert task["total_annotations"] == 3 and task["cancelled_annotations"] == 0
        assert task["predictions"] == [] and task["total_predictions"] == 0 and task["meta"] == {}
        annotators = [a["completed_by"] for a in task["annotations"]]
        assert len(set(annotators)) == 3 and all(1 <= k <= world.n_annotators for k in annotators)
        for ann in task["annotations"]:
            annotation_ids.append(ann["id"])
            assert ann["was_cancelled"] is False and ann["ground_truth"] is False
            assert isinstance(ann["lead_time"], float)
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", ann["created_at"])
            (result,) = ann["result"]
            assert {k: result[k] for k in ("type", "from_name", "to_name", "origin")} == {
                "type": "pairwise", "from_name": "comparison", "to_name": "pairwise", "origin": "manual"}
            assert isinstance(result["id"], str) and result["value"]["selected"] in {"left", "right"}
    assert len(set(annotation_ids)) == len(annotation_ids)


def test_export_imports_cleanly_with_the_label_studio_importer():
    from rlhf_core.annotation.label_studio import import_label_studio

    world = WorldConfig(annotators_per_pair=2)
    tasks = demo_pair_tasks(40, seed=3, world=world)
    responses = pd.DataFrame({
        "response_id": list(tasks.response_a_id) + list(tasks.response_b_id),
        "prompt_id": list(tasks.prompt_id) * 2,
    })
    annotations, quarantine = import_label_studio(simulate_label_studio_export(tasks, world, seed=0), responses)
    assert len(annotations) == 80 and len(quarantine) == 0


def test_too_few_annotators_is_a_clear_error():
    tasks = demo_pair_tasks(3, seed=0, world=WorldConfig())
    with pytest.raises(ValueError, match="annotators_per_pair"):
        simulate_label_studio_export(tasks, WorldConfig(n_annotators=2, annotators_per_pair=3), seed=0)


# ---------------------------------------------------------------- SFT


def test_sft_masks_the_query():
    tok = models.build_tokenizer()
    ids, n_query = encode_example(tok, "What is 1+1?", " It is 2.")
    assert tok.decode(ids[:n_query]) == "Q: What is 1+1?\nA:"
    assert ids[-1] == tok.eos_token_id
    batch = collate([(ids, n_query), ([5, 6, 7], 1)], tok.pad_token_id)
    assert batch["input_ids"].shape == (2, len(ids))
    labels = batch["labels"]
    assert (labels[0, :n_query] == -100).all() and labels[0, n_query:].tolist() == ids[n_query:]
    assert labels[1].tolist() == [-100, 6, 7] + [-100] * (len(ids) - 3)
    assert batch["attention_mask"][1].tolist() == [1, 1, 1] + [0] * (len(ids) - 3)


def test_sft_loss_falls_and_is_deterministic(one_thread):
    tok = models.build_tokenizer()
    demos = make_demonstrations(make_prompt_pool(60, seed=0), 2, 0.55, 0.5, seed=0)
    cfg = SFTConfig(steps=40, batch_size=16)
    runs = []
    for _ in range(2):
        policy = models.build_policy(PolicyModelConfig(), tok, seed=0)
        runs.append((train_sft(policy, tok, demos, cfg, seed=0), policy))
    (metrics, policy), (metrics2, policy2) = runs
    assert metrics["sft/loss_final"] < 0.5 * metrics["sft/loss_first"]
    assert metrics["sft/loss_final"] == metrics2["sft/loss_final"]
    assert all(torch.equal(a, b) for a, b in zip(policy.parameters(), policy2.parameters()))
    assert not policy.training


def test_response_logprobs_are_the_sft_loss_summed_per_example(one_thread):
    tok = models.build_tokenizer()
    policy = models.build_policy(PolicyModelConfig(), tok, seed=0)
    prompts, responses = ["What is 1+1?", "Compute 3-4. Be brief."], [" It is 2.", " -1"]
    got = response_logprobs(policy, tok, prompts, responses, batch_size=1)
    for prompt, response, logprob in zip(prompts, responses, got):
        ids, n_query = encode_example(tok, prompt, response)
        batch = collate([(ids, n_query)], tok.pad_token_id)
        with torch.no_grad():  # transformers' mean cross-entropy over the labelled positions (response + eos)
            loss = policy(**batch).loss.item()
        assert logprob == pytest.approx(-loss * (len(ids) - n_query), rel=1e-5)
    assert response_logprobs(policy, tok, prompts, responses) == pytest.approx(got, rel=1e-5)  # batching


@pytest.mark.slow
def test_default_sft_policy_imitates_the_demonstrator(one_thread):
    """Full default SFT, then 256 held-out prompts sampled at temperature 1."""
    from rlhf_core.generation.sampler import sample_batch

    world, cfg, tok = WorldConfig(), SFTConfig(), models.build_tokenizer()
    demos = make_demonstrations(make_prompt_pool(world.n_prompts, seed=0), cfg.demos_per_prompt,
                                world.demo_correct_prob, world.demo_style_prob, seed=1)
    policy = models.build_policy(PolicyModelConfig(), tok, seed=0)
    metrics = train_sft(policy, tok, demos, cfg, seed=0)
    assert metrics["sft/loss_final"] < 0.5

    prompts = make_prompt_pool(256, seed=99, id_prefix="e").prompt.tolist()
    rollout = sample_batch(policy, tok, [models.format_query(tok, p) for p in prompts], 24,
                           temperature=1.0, generator_seed=0)
    looks_like_demo = np.mean([bool(DEMO_GRAMMAR.fullmatch(r)) for r in rollout.texts])
    policy_gold = np.mean([gold_score(p, r) for p, r in zip(prompts, rollout.texts)])
    best_gold = np.mean([gold_score(p, ideal_response(p)) for p in prompts])
    assert looks_like_demo > 0.8
    assert policy_gold > 0.2  # well above garbage (-1)
    assert best_gold - policy_gold > 0.8  # room for RLHF
