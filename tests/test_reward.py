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
from rlhf_core.models import format_query
from rlhf_core.config import DenoiseConfig, PolicyModelConfig, RewardTrainConfig, VotingConfig
from rlhf_core.reward.denoise import denoise
from rlhf_core.reward.losses import imitation_loss, preference_loss, smooth_labels
from rlhf_core.reward.model import RewardModel, encode, score_texts
from rlhf_core.reward.train import encode_pairs, pairwise_accuracy, train_reward_model
from rlhf_core.reward.voting import bucket, fold_of_pairs, sign_agreement, strength_scale, strength_stats, vote
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
    assert preference_loss(torch.zeros(2), torch.zeros(2))[1]["accuracy"] == 0.0  # a tie ranks nothing right


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
    # the response mask covers the response and the eos, also when the query was cut away
    rmask = batch["response_mask"]
    assert rmask[0].tolist() == [0] * (len(short) - 4) + [1] * 4 + [0] * (12 - len(short))
    assert rmask[1].all()


def test_label_smoothing_and_imitation_loss_on_hand_numbers():
    torch.testing.assert_close(smooth_labels(torch.tensor([1.0, 0.5, 0.0, 0.8]), 0.1),
                               torch.tensor([0.9, 0.5, 0.1, 0.8 * 0.9 + 0.2 * 0.1]))
    with pytest.raises(ValueError, match="eps"):
        smooth_labels(torch.ones(1), 0.5)
    # two responses of 2 and 3 tokens with summed log-probs -1.0 and -2.0: mean NLL per token 3/5
    assert imitation_loss(torch.tensor([-1.0, -2.0]), torch.tensor([2, 3])).item() == pytest.approx(0.6)


PROMPTS, RESPONSES = ["say hi", "x"], [" hello", " a b c d"]


def _logprob_term_by_hand(init_dir, token_weight) -> torch.Tensor:
    """(2,) sum over response tokens + eos of token_weight(h) * log p(token | ..), from the causal LM with the
    reward model's weights run on each (prompt, response) alone; h is the state that predicts the token."""
    tok, policy = models.build_tokenizer(), models.load_policy(init_dir).eval()
    expected = []
    for p, r in zip(PROMPTS, RESPONSES):
        query = tok(models.format_query(tok, p), add_special_tokens=False)["input_ids"]
        answer = tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            out = policy(torch.tensor([query + answer]), output_hidden_states=True)
        logp, h = torch.log_softmax(out.logits[0, :-1], -1), out.hidden_states[-1][0]  # (T-1, V), (T, H)
        expected.append(sum(float(token_weight(h[len(query) - 1 + j])) * logp[len(query) - 1 + j, t].item()
                            for j, t in enumerate(answer)))
    return torch.tensor(expected)


def test_logprob_read_adds_the_response_log_likelihood_under_the_tied_lm_head(init_dir):
    """r = w . h_eos + a * sum log p(response tokens + eos), p from the causal LM with the same weights."""
    rm = RewardModel.from_policy(init_dir, seed=3, read="end_token+logprob")
    with torch.no_grad():
        rm.logprob_weight.fill_(0.7)
    batch = encode(models.build_tokenizer(), PROMPTS, RESPONSES, 64)
    with torch.no_grad():
        full, end = rm(**batch), RewardModel(rm.classifier, "end_token")(**batch)
    torch.testing.assert_close(full - end, _logprob_term_by_hand(init_dir, lambda h: 0.7), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        untied = AutoModelForSequenceClassification.from_pretrained(str(init_dir), num_labels=1)
        untied.config.tie_word_embeddings = False
        RewardModel(untied, "end_token+logprob")


def test_weighted_logprob_read_weights_each_response_token_by_a_plus_u_dot_h(init_dir):
    """r = w . h_eos + sum_t (a + u . h_{t-1} + b) log p(y_t | ..), h the trunk's (normed) last hidden state."""
    rm = RewardModel.from_policy(init_dir, seed=3, read="end_token+weighted_logprob")
    u = torch.linspace(-0.05, 0.05, rm.config.hidden_size)
    with torch.no_grad():
        rm.logprob_weight.fill_(0.7)
        rm.token_weight.weight[0] = u
        rm.token_weight.bias.fill_(0.2)
    batch = encode(models.build_tokenizer(), PROMPTS, RESPONSES, 64)
    with torch.no_grad():
        full, end = rm(**batch), RewardModel(rm.classifier, "end_token")(**batch)
    expected = _logprob_term_by_hand(init_dir, lambda h: 0.7 + u @ h + 0.2)
    torch.testing.assert_close(full - end, expected, atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # u = b = 0 is the plain read
        rm.token_weight.weight.zero_()
        rm.token_weight.bias.zero_()
        plain = RewardModel(rm.classifier, "end_token+logprob")
        plain.logprob_weight.fill_(0.7)
        torch.testing.assert_close(rm(**batch), plain(**batch), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- training


@pytest.mark.parametrize("read", ["end_token", "end_token+logprob", "end_token+weighted_logprob"])
def test_reward_model_learns_a_separable_task_and_reloads(init_dir, tmp_path, read):
    pairs = make_pairs(96, seed=1)
    cfg = FAST.model_copy(update={"read": read})
    model, tok, metrics = train_reward_model(init_dir, pairs, cfg, seed=0)
    assert metrics["steps"] == 3 * 6
    lengths = encode_pairs(tok, pairs, FAST.max_length).lengths()
    assert metrics["share_at_max_length"] == (lengths >= FAST.max_length).mean() == 0.0  # nothing cut here
    if read == "end_token":  # a random backbone's log-likelihood is noise (and longer is less likely):
        assert pairwise_accuracy(model, tok, pairs, FAST.max_length) >= 0.9  # the head alone learns the task
        assert pairwise_accuracy(model, tok, make_pairs(64, seed=2), FAST.max_length) >= 0.9  # held out
        assert metrics["logprob_weight"] == 1.0  # unused and not trained
    elif read == "end_token+logprob":
        assert metrics["logprob_weight"] < 1.0  # learned: the weight of a useless term shrinks
    else:
        assert model.token_weight.weight.abs().sum() > 0  # the per-token weights moved from 0

    model.save(tmp_path / "rm", tok)
    AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "rm"))  # plain transformers loads it
    reloaded = RewardModel.load(tmp_path / "rm")
    assert reloaded.read == read and reloaded.logprob_weight.item() == pytest.approx(metrics["logprob_weight"])
    tok2 = models.load_tokenizer(tmp_path / "rm")
    prompts, responses = pairs["prompt"].tolist()[:8], pairs["chosen"].tolist()[:8]
    before = score_texts(model, tok, prompts, responses, FAST.max_length)
    after = score_texts(reloaded, tok2, prompts, responses, FAST.max_length)
    assert before.shape == (8,)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    if read == "end_token":  # plain transformers computes the same reward from the saved directory
        plain = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "rm")).eval()
        batch = encode(tok2, prompts, responses, FAST.max_length)  # right-padded rows of several lengths
        with torch.no_grad():
            logits = plain(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0]
        torch.testing.assert_close(logits, before, atol=1e-5, rtol=1e-5)


def test_training_reports_the_share_of_pairs_cut_to_max_length(init_dir):
    pairs = make_pairs(16, seed=2)  # (the reviewer's case: a window the responses alone fill loses the question)
    cut = FAST.model_copy(update={"max_length": 8, "epochs": 1})
    _, tok, metrics = train_reward_model(init_dir, pairs, cut, seed=0)
    full = [len(q) + len(a) + 1 for q, a in zip(*(tok([format_query(tok, p) for p in pairs["prompt"]],
                                                       add_special_tokens=False)["input_ids"],
                                                   tok(pairs["chosen"].tolist(), add_special_tokens=False)["input_ids"]))]
    assert min(full) > 8 and metrics["share_at_max_length"] == 1.0


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
    # the band is in units of the scale; symmetric: just below 0 is ambiguous, not incorrect
    assert bucket(np.array([-0.3, -0.1, 0.1, 0.3]), band=0.1, scale=2.0) == ["incorrect", "incorrect", "ambiguous",
                                                                              "normal"]
    assert bucket(np.array([-0.3, -0.1, 0.1, 0.3]), band=0.1, scale=2.0, symmetric=True) == [
        "incorrect", "ambiguous", "ambiguous", "normal"]
    # a band of 0: mean exactly 0 (two equal texts) is not flipped under either rule, as Part II's mean < 0
    assert bucket(np.array([-1e-9, 0.0, 1e-9]), band=0.0, symmetric=True) == ["incorrect", "normal", "normal"]
    assert bucket(np.array([-1e-9, 0.0, 1e-9]), band=0.0) == ["incorrect", "normal", "normal"]
    assert strength_scale(np.array([1.0, -1.0, 3.0, -3.0])) == pytest.approx(np.sqrt(5.0))
    assert strength_scale(np.array([2.0, 2.0])) == 1.0  # no spread: unit scale
    # NaN entries (out_of_fold: the voter trained on the pair) are left out
    mean, std = strength_stats(np.array([[1.0, np.nan, 3.0], [np.nan, -2.0, np.nan]]))
    np.testing.assert_allclose(mean, [2.0, -2.0])
    np.testing.assert_allclose(std, [1.0, 0.0])
    with pytest.raises(ValueError, match="no vote"):
        strength_stats(np.array([[np.nan, np.nan]]))


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

    cfg = VotingConfig(n_models=3, train=RewardTrainConfig(read="end_token", epochs=2, batch_size=16, lr=3e-3,
                                                           max_length=64))
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
    assert metrics["share_at_max_length"] == 0.0  # rows far under 64 tokens
    np.testing.assert_allclose(votes["z"], votes["mean"] / metrics["strength_scale"])  # what denoise reads
    assert metrics["mean_std"] == pytest.approx(votes["std"].mean())
    # the voters' rows cut to max_length are reported as the reward stage's are (they flipped labels blind)
    cut = cfg.model_copy(update={"n_models": 2, "train": cfg.train.model_copy(update={"max_length": 8, "epochs": 1})})
    assert vote(init_dir, pairs.iloc[:16], cut, seed=0)[1]["share_at_max_length"] == 1.0


def test_out_of_fold_votes_come_only_from_voters_that_did_not_train_on_the_pair(init_dir, monkeypatch):
    from rlhf_core.reward import voting

    trained_on = []  # the pair ids each voter trained on, in voter order (the real training, observed)

    def observed(init, train_pairs, *args, **kwargs):
        trained_on.append(set(train_pairs["pair_id"]))
        return real_train(init, train_pairs, *args, **kwargs)

    real_train = voting.train_reward_model
    monkeypatch.setattr(voting, "train_reward_model", observed)
    pairs = make_pairs(60, seed=4)
    fold = fold_of_pairs(pairs["pair_id"], 2, seed=0)
    assert sorted(np.bincount(fold).tolist()) == [30, 30]  # balanced
    np.testing.assert_array_equal(fold, fold_of_pairs(pairs["pair_id"], 2, seed=0))  # seeded
    assert not np.array_equal(fold, fold_of_pairs(pairs["pair_id"], 2, seed=1))  # and shuffled by the seed
    cfg = VotingConfig(n_models=4, scheme="out_of_fold", folds=2,
                       train=RewardTrainConfig(read="end_token", epochs=2, batch_size=16, lr=3e-3, max_length=64))
    votes, metrics = vote(init_dir, pairs, cfg, seed=0)
    diffs = np.array(votes["diffs"].tolist())  # (60, 4)
    for k in range(4):  # voter k left fold k % 2 out and voted exactly on it
        np.testing.assert_array_equal(~np.isnan(diffs[:, k]), fold == k % 2)
        assert trained_on[k] == set(pairs["pair_id"][fold != k % 2])
    assert votes["n_votes"].tolist() == [2] * 60
    np.testing.assert_allclose(votes["mean"], np.nanmean(diffs, axis=1))
    assert (votes["mean"] > 0).mean() >= 0.8  # unseen pairs of a separable task are still right
    with pytest.raises(ValueError, match="n_models"):
        vote(init_dir, pairs, VotingConfig(n_models=2, scheme="out_of_fold", folds=3), seed=0)


def test_a_diverged_voter_is_an_error_not_a_missing_vote_and_no_pairs_is_an_error(init_dir, monkeypatch, tmp_path):
    from rlhf_core.reward import voting

    real_diffs = voting.pair_reward_diffs
    calls = []

    def second_voter_diverges(*args, **kwargs):
        calls.append(1)
        out = real_diffs(*args, **kwargs)
        return np.full_like(out, np.nan) if len(calls) == 2 else out

    monkeypatch.setattr(voting, "pair_reward_diffs", second_voter_diverges)
    pairs = make_pairs(24, seed=6)
    cfg = VotingConfig(n_models=3, train=RewardTrainConfig(read="end_token", epochs=1, batch_size=8, lr=3e-3,
                                                           max_length=64))
    with pytest.raises(FloatingPointError, match="voter 1 gave 24 non-finite .* lower voting.train.lr"):
        vote(init_dir, pairs, cfg, seed=0, voter_dir=tmp_path / "voters")  # NaN was read as "did not vote" before
    assert voting.voter_path(tmp_path / "voters", 0).exists()  # voter 0 is kept for the resume ...
    assert not voting.voter_path(tmp_path / "voters", 1).exists()  # ... the diverged one is not
    for mode in ("faithful", "fast"):  # fast mode divided by zero before
        with pytest.raises(ValueError, match="no pairs to vote on"):
            vote(init_dir, pairs.iloc[:0], VotingConfig(n_models=2, mode=mode), seed=0)


def test_fast_mode_votes_with_heads_over_one_trunk(init_dir):
    pairs = make_pairs(80, seed=5)
    swapped = np.zeros(len(pairs), dtype=bool)
    swapped[::5] = True
    c, r = pairs["chosen"].copy(), pairs["rejected"].copy()
    pairs.loc[swapped, "chosen"], pairs.loc[swapped, "rejected"] = r[swapped], c[swapped]
    cfg = VotingConfig(n_models=4, mode="fast",
                       train=RewardTrainConfig(read="end_token", epochs=3, batch_size=16, lr=3e-3, max_length=64))
    votes, metrics = vote(init_dir, pairs, cfg, seed=0)
    again, _ = vote(init_dir, pairs, cfg, seed=0)
    pd.testing.assert_frame_equal(votes, again)  # deterministic for a seed
    diffs = np.array(votes["diffs"].tolist())
    assert diffs.shape == (80, 4) and not np.isnan(diffs).any()
    assert (diffs.std(axis=1) > 0).all()  # the heads differ
    negative = votes["mean"].to_numpy() < 0
    assert negative[swapped].mean() >= 0.75 and negative[~swapped].mean() <= 0.1
    with pytest.raises(ValueError, match="in_sample"):
        vote(init_dir, pairs, VotingConfig(n_models=2, mode="fast", scheme="out_of_fold"), seed=0)


def test_fast_mode_trains_with_the_margin_and_label_smoothing_it_is_given(init_dir):
    """The shared trunk's loss reads the margin column (gap - margin: the heads push each gap past it) and label
    smoothing (targets pulled to 1/2: smaller gaps); a sign flipped or the smoothing skipped passed every test."""
    from rlhf_core.reward.voting import shared_trunk_diffs

    pairs = make_pairs(48, seed=6)
    train = RewardTrainConfig(read="end_token", epochs=1, batch_size=16, lr=3e-3, max_length=64)  # gaps under 3
    fast = VotingConfig(n_models=2, mode="fast", train=train)
    plain, _ = shared_trunk_diffs(init_dir, pairs, fast, seed=0)
    widened, _ = shared_trunk_diffs(init_dir, pairs.assign(margin=3.0), fast, seed=0)
    smoothed, _ = shared_trunk_diffs(init_dir, pairs, fast.model_copy(update={
        "train": train.model_copy(update={"label_smoothing": 0.3})}), seed=0)
    assert widened.mean() > plain.mean() + 0.05  # measured 0.89 vs 0.80 (gap + margin: 0.76)
    assert np.abs(smoothed).mean() < np.abs(plain).mean() - 0.05  # measured 0.68 vs 0.81


def test_fast_mode_heads_learn_only_from_the_pairs_their_bootstrap_weights_give_them(init_dir, monkeypatch):
    """Head 0's Poisson weights all 0: it trains on nothing and stays where it started (with ones for every head
    the heads still differ, by their start: no other test would notice the weights ignored)."""
    from rlhf_core.reward import voting

    made, start = [], []

    class Observed(voting.SharedTrunkVoters):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)
            start.append([h.weight.detach().clone() for h in self.heads] + [self.logprob_weights.detach().clone()])

    bootstrap = voting.bootstrap_weights
    monkeypatch.setattr(voting, "bootstrap_weights", lambda rng, n, m: bootstrap(rng, n, m) * torch.tensor([0., 1, 1]))
    monkeypatch.setattr(voting, "SharedTrunkVoters", Observed)
    cfg = VotingConfig(n_models=3, mode="fast", train=RewardTrainConfig(epochs=1, batch_size=8, lr=3e-3, max_length=64,
                                                                       weight_decay=0.0))
    vote(init_dir, make_pairs(16, seed=7), cfg, seed=0)
    heads, logprob_weights = made[0].heads, made[0].logprob_weights.detach()
    assert torch.equal(heads[0].weight, start[0][0]) and logprob_weights[0] == start[0][3][0]
    assert not torch.equal(heads[1].weight, start[0][1]) and not torch.equal(heads[2].weight, start[0][2])


def test_fast_mode_weighted_read_starts_as_the_plain_read_and_trains_per_head_token_weights(init_dir, monkeypatch):
    from rlhf_core.reward import voting
    from rlhf_core.reward.train import _pair_batch
    from rlhf_core.reward.voting import SharedTrunkVoters

    pairs = make_pairs(8, seed=6)
    batch = _pair_batch(models.build_tokenizer(), pairs, 64)
    weighted = SharedTrunkVoters(RewardModel.from_policy(init_dir, 0, "end_token+weighted_logprob"), 3)
    plain = SharedTrunkVoters(RewardModel.from_policy(init_dir, 0, "end_token+logprob"), 3)
    plain.heads.load_state_dict(weighted.heads.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(weighted(batch), plain(batch), atol=1e-5, rtol=1e-5)  # u = b = 0 at the start
    cfg = VotingConfig(n_models=3, mode="fast", train=RewardTrainConfig(read="end_token+weighted_logprob", epochs=1,
                                                                       batch_size=8, lr=3e-3, max_length=64))
    made = []  # the voters vote() builds, kept to look at their token weights after training

    class Observed(SharedTrunkVoters):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(voting, "SharedTrunkVoters", Observed)
    votes, _ = vote(init_dir, make_pairs(32, seed=7), cfg, seed=0)
    diffs = np.array(votes["diffs"].tolist())
    assert diffs.shape == (32, 3) and (diffs.std(axis=1) > 0).all()
    token_weights = made[0].token_weights  # zero at the start: every head's u_m and b_m moved
    assert (token_weights.weight.abs().sum(dim=1) > 0).all() and (token_weights.bias != 0).all()


# ---------------------------------------------------------------- denoising


def _votes_for(pairs: pd.DataFrame, means: list[float], band: float = 0.1, scale: float = 1.0) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "pair_id": pairs["pair_id"],
            "mean": means,
            "std": [0.1] * len(means),
            "diffs": [[m, m] for m in means],
            "z": np.array(means) / scale,
            "bucket": bucket(np.array(means), band, scale),
        }
    )


def test_the_training_loss_reads_the_margin_and_soft_label_that_denoising_writes(init_dir):
    """Without this, denoising could have no effect on the reward model and no test would notice."""
    from rlhf_core.reward.losses import preference_loss
    from rlhf_core.reward.train import _pair_batch, pair_loss

    pairs = make_pairs(4, seed=3).assign(margin=[0.0, 0.5, 1.0, 2.0], soft_label=[1.0, 0.9, 0.5, 0.2])
    model, cfg = RewardModel.from_policy(init_dir, 0, "end_token+logprob"), RewardTrainConfig()
    batch = _pair_batch(models.build_tokenizer(), pairs, 64)
    with torch.no_grad():
        rewards = model(**batch)  # chosen rows first
        loss, _ = pair_loss(model, batch, pairs, cfg)
        d = rewards[:4] - rewards[4:] - torch.tensor([0.0, 0.5, 1.0, 2.0])
        p = torch.tensor([1.0, 0.9, 0.5, 0.2])
        by_hand = -(p * F.logsigmoid(d) + (1 - p) * F.logsigmoid(-d)).mean()
        plain, _ = preference_loss(rewards[:4], rewards[4:])
    torch.testing.assert_close(loss, by_hand)
    assert abs(loss.item() - plain.item()) > 0.1  # the columns change the loss


def test_denoise_flips_exactly_the_negative_pairs():
    pairs = make_pairs(5)
    pairs["soft_label"] = [1.0, 1.0, 1.0, 1.0, 0.8]  # the annotators' own target for the last pair
    means = [-0.4, 0.05, 0.0, 1.5, -2.0]
    out, metrics = denoise(pairs, _votes_for(pairs, means, scale=2.0).iloc[::-1], DenoiseConfig())  # order-free

    validate_table("denoised", out)
    assert out["pair_id"].tolist() == pairs["pair_id"].tolist()
    assert out["flipped"].tolist() == [m < 0 for m in means]
    for i, f in enumerate(out["flipped"]):
        a, b = ("rejected", "chosen") if f else ("chosen", "rejected")
        assert out["chosen"][i] == pairs[a][i] and out["rejected"][i] == pairs[b][i]
        assert out["chosen_id"][i] == pairs[a + "_id"][i]
    assert out["bucket"].tolist() == ["incorrect", "ambiguous", "ambiguous", "normal", "incorrect"]
    # a flipped pair's target for the ORIGINAL order is 1 - p: swapped texts keep p (0.8 stays 0.8, not
    # the old overwrite with 1.0); ambiguous ones are smoothed by eps = 0.1
    np.testing.assert_allclose(out["soft_label"], [1.0, 0.9, 0.9, 1.0, 0.8])
    np.testing.assert_allclose(out["margin"], [0.1, 0.0125, 0.0, 0.375, 0.5])  # 0.5 * |mean| / 2
    assert metrics == pytest.approx({"n_flipped": 2, "share_flipped": 0.4, "n_smoothed": 2, "n_soft_labelled": 0,
                                     "mean_margin": 0.1975, "margin_abs_mean": 0.1975})


def test_denoise_methods_follow_part_two():
    pairs = make_pairs(4)
    pairs["tie"] = [False, False, False, True]
    pairs["soft_label"] = [0.8, 0.8, 1.0, 0.5]  # the annotators' own targets: under 1, so (1 - p) terms count
    votes = _votes_for(pairs, [-1.0, 0.05, 2.0, -3.0])
    run = {m: denoise(pairs, votes, DenoiseConfig(method=m))[0] for m in
           ("baseline", "flip", "margin", "flip_margin", "soft_label_margin")}

    base = run["baseline"]
    assert not base["flipped"].any() and base["chosen"].tolist() == pairs["chosen"].tolist()
    assert base["soft_label"].tolist() == [0.8, 0.8, 1.0, 0.5] and base["margin"].tolist() == [0.0] * 4
    assert run["flip"]["flipped"].tolist() == [True, False, False, False]  # never a tie
    # the flipped pair keeps p (its texts swapped); the ambiguous one is smoothed: 0.8 * 0.9 + 0.2 * 0.1
    np.testing.assert_allclose(run["flip"]["soft_label"], [0.8, 0.74, 1.0, 0.5])
    assert run["flip"]["margin"].tolist() == [0.0] * 4
    np.testing.assert_allclose(run["margin"]["margin"], [-0.5, 0.025, 1.0, 0.0])  # signed, unflipped; tie: 0
    np.testing.assert_allclose(run["flip_margin"]["margin"], [0.5, 0.025, 1.0, 0.0])
    soft = run["soft_label_margin"]
    assert not soft["flipped"].any()
    q = 1 / (1 + math.e)  # sigmoid(z) for mean < 0, composed with the annotators' 0.8: p q + (1 - p)(1 - q)
    np.testing.assert_allclose(soft["soft_label"], [0.8 * q + 0.2 * (1 - q), 0.74, 1.0, 0.5])
    np.testing.assert_allclose(soft["margin"], [-0.5, 0.025, 1.0, 0.0])
    assert all(r["soft_label"][3] == 0.5 and not r["flipped"][3] for r in run.values())
    margins = denoise(pairs, votes, DenoiseConfig(method="margin"))[1]  # signed: -0.5, 0.025, 1.0, 0.0
    assert (margins["mean_margin"], margins["margin_abs_mean"]) == pytest.approx((0.13125, 0.38125))
    tied = pairs.iloc[:2].assign(tie=[True, False])  # both ambiguous (0.05): only the untied one is smoothed
    assert denoise(tied, _votes_for(tied, [0.05, 0.05]), DenoiseConfig(method="flip"))[1]["n_smoothed"] == 1


def test_soft_labels_read_strength_in_scale_units_a_missing_label_is_one_and_a_tie_is_one_half():
    """Branches the tests above leave open (each survived a mutation): q = sigmoid(mean / scale), not sigmoid(mean);
    a NaN soft label (an import without one) is the label itself, 1; a tie is 0.5 whatever its soft label says."""
    pairs = make_pairs(3)
    pairs["tie"] = [False, False, True]
    pairs["soft_label"] = [np.nan, 1.0, 1.0]
    out = denoise(pairs, _votes_for(pairs, [-1.0, 2.0, -3.0], scale=2.0), DenoiseConfig(method="soft_label_margin"))[0]
    q = 1 / (1 + math.exp(0.5))  # sigmoid(-1 / 2)
    np.testing.assert_allclose(out["soft_label"], [q, 1.0, 0.5])
    base = denoise(pairs, _votes_for(pairs, [-1.0, 2.0, -3.0], scale=2.0), DenoiseConfig(method="baseline"))[0]
    np.testing.assert_allclose(base["soft_label"], [1.0, 1.0, 0.5])


def test_denoise_rejects_mismatched_pair_ids():
    pairs = make_pairs(3)
    with pytest.raises(ValueError, match="differ in pair_id"):
        denoise(pairs, _votes_for(pairs, [1.0, 1.0, 1.0]).iloc[:2], DenoiseConfig())
