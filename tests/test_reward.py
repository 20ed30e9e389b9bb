"""Reward models, voting and denoising: hand-computed formulas and tiny real trainings."""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification

from rlhf_core import models
from rlhf_core.config import DenoiseConfig, PolicyModelConfig, RewardTrainConfig, VotingConfig
from rlhf_core.reward.denoise import denoise
from rlhf_core.reward.losses import preference_loss
from rlhf_core.reward.model import encode, score_texts
from rlhf_core.reward.train import pairwise_accuracy, train_reward_model
from rlhf_core.reward.voting import bucket, sign_agreement, strength_stats, vote
from rlhf_core.schemas import validate_table

TINY = PolicyModelConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
FAST = RewardTrainConfig(epochs=3, batch_size=16, lr=3e-3, max_length=64)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory):
    """A tiny random Qwen2 policy saved as a Hugging Face dir: the reward models' init."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads cost more than they give
    tok = models.build_tokenizer()
    out = tmp_path_factory.mktemp("policy")
    models.save_hf(models.build_policy(TINY, tok, seed=0), tok, out)
    yield out
    torch.set_num_threads(threads)


def _letters(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefgh ") for _ in range(n))


def make_pairs(n: int, seed: int = 0) -> pd.DataFrame:
    """A separable comparisons table: every chosen response contains '!!', no rejected one does."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        chosen = _letters(rng, rng.randint(6, 14))
        cut = rng.randint(0, len(chosen))
        rows.append(
            {
                "pair_id": f"p{i:03d}",
                "prompt_id": f"q{i:03d}",
                "prompt": "say " + _letters(rng, 8),
                "chosen": chosen[:cut] + "!!" + chosen[cut:],
                "rejected": _letters(rng, rng.randint(8, 16)),
                "chosen_id": f"r{i:03d}a",
                "rejected_id": f"r{i:03d}b",
                "n_labels": 1,
                "label_agreement": 1.0,
            }
        )
    return validate_table("comparisons", pd.DataFrame(rows))


# ---------------------------------------------------------------- losses


R_C = torch.tensor([1.0, 0.5, -0.2])
R_R = torch.tensor([0.0, 1.0, -1.0])


def _logsig(x: float) -> float:
    return -math.log1p(math.exp(-x))


def test_preference_loss_is_bradley_terry_by_default():
    loss, metrics = preference_loss(R_C, R_R)
    d = [1.0, -0.5, 0.8]
    assert loss.item() == pytest.approx(-sum(_logsig(x) for x in d) / 3, abs=1e-6)
    assert loss.item() == pytest.approx(-F.logsigmoid(R_C - R_R).mean().item(), abs=1e-7)
    assert metrics["accuracy"] == pytest.approx(2 / 3)
    assert metrics["reward_gap"] == pytest.approx(1.3 / 3)
    assert metrics["reward_chosen"] == pytest.approx(1.3 / 3)
    assert metrics["reward_rejected"] == pytest.approx(0.0)


def test_preference_loss_with_margin_and_soft_label():
    margin = torch.tensor([0.5, 0.0, 1.0])
    p = torch.tensor([1.0, 0.9, 0.8])
    loss, metrics = preference_loss(R_C, R_R, margin=margin, soft_label=p)
    d = [0.5, -0.5, -0.2]  # gap - margin
    by_hand = -sum(pi * _logsig(x) + (1 - pi) * _logsig(-x) for pi, x in zip([1.0, 0.9, 0.8], d)) / 3
    assert loss.item() == pytest.approx(by_hand, abs=1e-6)
    assert metrics["accuracy"] == pytest.approx(2 / 3)  # measured on the raw gap, not gap - margin
    # margin only: p = 1
    loss_m, _ = preference_loss(R_C, R_R, margin=margin)
    assert loss_m.item() == pytest.approx(-sum(_logsig(x) for x in d) / 3, abs=1e-6)


def test_soft_label_one_half_is_symmetric():
    loss_ab, _ = preference_loss(R_C, R_R, soft_label=torch.full((3,), 0.5))
    loss_ba, _ = preference_loss(R_R, R_C, soft_label=torch.full((3,), 0.5))
    assert loss_ab.item() == pytest.approx(loss_ba.item(), abs=1e-7)


# ---------------------------------------------------------------- encoding


def test_encode_appends_eos_pads_right_and_truncates_left():
    tok = models.build_tokenizer()
    batch = encode(tok, ["hi", "hi"], ["abc", "a much longer response that ends in XYZ"], max_length=12)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape == (2, 12) and mask.shape == (2, 12)
    short = tok(models.format_query(tok, "hi") + "abc", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert ids[0, : len(short)].tolist() == short
    assert ids[0, len(short) :].eq(tok.pad_token_id).all() and mask[0].sum() == len(short)
    # the long one keeps its end: the last 11 bytes of the text, then eos
    assert mask[1].all() and ids[1, -1] == tok.eos_token_id
    assert tok.decode(ids[1, :-1].tolist()) == "ends in XYZ"


# ---------------------------------------------------------------- training


def test_reward_model_learns_a_separable_task_and_reloads(init_dir, tmp_path):
    pairs = make_pairs(96, seed=1)
    model, tok, metrics = train_reward_model(init_dir, pairs, FAST, seed=0)
    assert metrics["steps"] == 3 * 6
    assert pairwise_accuracy(model, tok, pairs, FAST.max_length) >= 0.9
    assert pairwise_accuracy(model, tok, make_pairs(64, seed=2), FAST.max_length) >= 0.9  # held out

    models.save_hf(model, tok, tmp_path / "rm")
    reloaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "rm"))
    tok2 = models.load_tokenizer(tmp_path / "rm")
    prompts, responses = pairs["prompt"].tolist()[:8], pairs["chosen"].tolist()[:8]
    before = score_texts(model, tok, prompts, responses, FAST.max_length)
    after = score_texts(reloaded, tok2, prompts, responses, FAST.max_length)
    assert before.shape == (8,)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


def test_training_is_deterministic_per_seed_and_differs_across_seeds(init_dir):
    pairs = make_pairs(32)
    cfg = RewardTrainConfig(epochs=1, batch_size=8, lr=3e-3, max_length=64)
    tok = models.build_tokenizer()
    scores = []
    for seed in (5, 5, 6):
        model, _, _ = train_reward_model(init_dir, pairs, cfg, seed=seed)
        scores.append(score_texts(model, tok, pairs["prompt"].tolist(), pairs["chosen"].tolist(), 64))
    torch.testing.assert_close(scores[0], scores[1])
    assert not torch.allclose(scores[0], scores[2])


# ---------------------------------------------------------------- voting


def test_strength_stats_and_buckets_on_hand_numbers():
    diffs = np.array([[1.0, 3.0], [-1.0, 0.0], [0.0, 0.1], [0.2, 0.2]])
    mean, std = strength_stats(diffs)
    np.testing.assert_allclose(mean, [2.0, -0.5, 0.05, 0.2])
    np.testing.assert_allclose(std, [1.0, 0.5, 0.05, 0.0])
    assert bucket(mean, band=0.1) == ["normal", "incorrect", "ambiguous", "normal"]
    assert bucket(np.array([0.0, 0.1, -1e-9]), band=0.1) == ["ambiguous", "normal", "incorrect"]
    assert bucket(np.array([0.05]), band=0.0) == ["normal"]


def test_sign_agreement_on_hand_numbers():
    # model pairs (0,1): 2/3 agree, (0,2): 3/3, (1,2): 2/3
    diffs = np.array([[1.0, 2.0, 3.0], [1.0, -1.0, 1.0], [-1.0, -2.0, -0.5]])
    assert sign_agreement(diffs) == pytest.approx((2 / 3 + 1 + 2 / 3) / 3)


def test_vote_finds_the_swapped_labels(init_dir):
    pairs = make_pairs(120, seed=3)
    swapped = np.zeros(len(pairs), dtype=bool)
    swapped[::5] = True  # 20 % of the labels are wrong
    c, r = pairs["chosen"].copy(), pairs["rejected"].copy()
    pairs.loc[swapped, "chosen"], pairs.loc[swapped, "rejected"] = r[swapped], c[swapped]

    cfg = VotingConfig(n_models=3, train=RewardTrainConfig(epochs=2, batch_size=16, lr=3e-3, max_length=64))
    votes, metrics = vote(init_dir, pairs, cfg, seed=0)

    validate_table("votes", votes)
    assert votes["pair_id"].tolist() == pairs["pair_id"].tolist()
    assert all(len(d) == 3 for d in votes["diffs"])
    mean, std = strength_stats(np.array(votes["diffs"].tolist()))
    np.testing.assert_allclose(votes["mean"], mean)
    np.testing.assert_allclose(votes["std"], std)
    negative = votes["mean"].to_numpy() < 0
    assert negative[swapped].mean() >= 0.75  # the wrong labels are found (0.83-1.0 over 12 seeds) ...
    assert negative[~swapped].mean() <= 0.1  # ... and few right ones are accused (0.0-0.07)
    assert metrics["share_incorrect"] == pytest.approx(negative.mean())
    assert sum(metrics[f"share_{b}"] for b in ("incorrect", "ambiguous", "normal")) == pytest.approx(1.0)
    assert 0.5 <= metrics["sign_agreement"] <= 1.0


# ---------------------------------------------------------------- denoising


def _votes_for(pairs: pd.DataFrame, means: list[float], band: float = 0.1) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "pair_id": pairs["pair_id"],
            "mean": means,
            "std": [0.1] * len(means),
            "diffs": [[m, m] for m in means],
            "bucket": bucket(np.array(means), band),
        }
    )


def test_denoise_flips_exactly_the_negative_pairs():
    pairs = make_pairs(5)
    means = [-0.4, 0.05, 0.0, 1.5, -2.0]
    out, metrics = denoise(pairs, _votes_for(pairs, means).iloc[::-1], DenoiseConfig())  # order-free join

    validate_table("denoised", out)
    assert out["pair_id"].tolist() == pairs["pair_id"].tolist()
    assert out["flipped"].tolist() == [True, False, False, False, True]
    for i, f in enumerate(out["flipped"]):
        a, b = ("rejected", "chosen") if f else ("chosen", "rejected")
        assert out["chosen"][i] == pairs[a][i] and out["rejected"][i] == pairs[b][i]
        assert out["chosen_id"][i] == pairs[a + "_id"][i]
    assert out["bucket"].tolist() == ["incorrect", "ambiguous", "ambiguous", "normal", "incorrect"]
    np.testing.assert_allclose(out["soft_label"], [1.0, 0.9, 0.9, 1.0, 1.0])
    np.testing.assert_allclose(out["margin"], [0.4, 0.05, 0.0, 1.5, 2.0])  # |mean|
    assert metrics == pytest.approx({"n_flipped": 2, "share_flipped": 0.4, "n_smoothed": 2, "mean_margin": 0.79})


def test_denoise_switches():
    pairs = make_pairs(3)
    votes = _votes_for(pairs, [-0.4, 0.05, 1.0])
    out, metrics = denoise(pairs, votes, DenoiseConfig(flip=False, adaptive_margin=False, ambiguous_smoothing=0.0))
    assert not out["flipped"].any() and out["chosen"].tolist() == pairs["chosen"].tolist()
    assert out["margin"].tolist() == [0.0, 0.0, 0.0] and out["soft_label"].tolist() == [1.0, 1.0, 1.0]
    assert metrics["n_smoothed"] == 0

    out, _ = denoise(pairs, votes, DenoiseConfig(flip=False, margin_scale=2.0))
    np.testing.assert_allclose(out["margin"], [-0.8, 0.1, 2.0])  # unflipped: the signed strength


def test_denoise_rejects_mismatched_pair_ids():
    pairs = make_pairs(3)
    with pytest.raises(ValueError, match="differ in pair_id"):
        denoise(pairs, _votes_for(pairs, [1.0, 1.0, 1.0]).iloc[:2], DenoiseConfig())
