"""Part II's SimCSE contrastive loss and MetaRM: each on hand-computed numbers, then inside training."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from rlhf_core import models
from rlhf_core.config import ContrastiveConfig, MetaRMConfig, RewardTrainConfig, VotingConfig
from rlhf_core.reward.losses import contrastive_samples, difference_loss, info_nce
from rlhf_core.reward.model import RewardModel, encode
from rlhf_core.reward.train import (
    _pair_batch,
    meta_ascent,
    meta_batch,
    meta_groups,
    pair_loss,
    step_gradients,
    train_reward_model,
)
from test_reward import TINY, make_pairs

CFG = RewardTrainConfig(read="end_token", epochs=1, batch_size=8, lr=3e-3, max_length=64)


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory):
    """A tiny random Qwen2 policy: the reward models' init."""
    tok = models.build_tokenizer()
    out = tmp_path_factory.mktemp("policy")
    models.save_hf(models.build_policy(TINY, tok, seed=0), tok, out)
    return out


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------- the formulas


def test_info_nce_on_hand_numbers():
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    b = torch.tensor([[2.0, 0.0], [0.6, 0.8]])  # cosines: a0.b0 = 1, a0.b1 = 0.6, a1.b0 = 0, a1.b1 = 0.8
    tau = 0.5
    row0 = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(0.6 / tau)))
    row1 = -math.log(math.exp(0.8 / tau) / (math.exp(0.0 / tau) + math.exp(0.8 / tau)))
    assert info_nce(a, b, tau).item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    with pytest.raises(ValueError, match="two"):
        info_nce(a, b[:1], tau)


def test_contrastive_samples_are_the_responses_or_the_differences():
    h_c, h_r = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    assert torch.equal(contrastive_samples(h_c, h_r, "responses"), torch.cat([h_c, h_r]))
    assert torch.equal(contrastive_samples(h_c, h_r, "differences"), torch.tensor([[0.5, 1.5], [2.0, 4.0]]))
    with pytest.raises(ValueError, match="unknown"):
        contrastive_samples(h_c, h_r, "pairs")


def test_difference_loss_on_hand_numbers():
    rewards = torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.0, 2.0]])
    first = (_sigmoid(1.0) + _sigmoid(3.0) + _sigmoid(2.0)) / 3  # |0-1|, |0-3|, |1-3|
    assert difference_loss(rewards).item() == pytest.approx((first + 0.5) / 2, rel=1e-6)  # alike samples: 0.5
    with pytest.raises(ValueError, match="k >= 2"):
        difference_loss(torch.zeros(3, 1))


# ---------------------------------------------------------------- in the reward model


def test_contrastive_term_is_info_nce_of_the_two_views(init_dir):
    pairs = make_pairs(6)
    model = RewardModel.from_policy(init_dir, seed=0, read="end_token").train()
    batch = _pair_batch(models.build_tokenizer(), pairs, 64)
    assert model.set_attention_dropout(0.0) == model.config.num_hidden_layers
    cfg = CFG.model_copy(update={"contrastive": ContrastiveConfig(coef=0.5, positives="differences")})
    loss, metrics = pair_loss(model, batch, pairs, cfg)
    plain, _ = pair_loss(model, batch, pairs, CFG)
    h = model.end_hidden(model.hidden_states(batch["input_ids"], batch["attention_mask"]), batch)  # (12, H)
    diffs = h[:6] - h[6:]
    expected = info_nce(diffs, diffs, 0.05)  # no dropout: both views are the same
    assert metrics["contrastive_loss"] == pytest.approx(expected.item(), rel=1e-5)
    assert loss.item() == pytest.approx(plain.item() + 0.5 * expected.item(), rel=1e-5)
    # with dropout the two views differ (the augmentation), and the loss has a gradient
    model.set_attention_dropout(0.5)
    torch.manual_seed(0)
    _, dropped = pair_loss(model, batch, pairs, cfg)
    assert dropped["contrastive_loss"] != pytest.approx(expected.item(), rel=1e-3)


def test_contrastive_training_runs_and_reports_its_loss(init_dir):
    cfg = CFG.model_copy(update={"contrastive": ContrastiveConfig(coef=0.1, positives="responses")})
    _, _, metrics = train_reward_model(init_dir, make_pairs(16), cfg, seed=0)
    assert metrics["contrastive_loss"] > 0 and math.isfinite(metrics["contrastive_loss"])
    # this backbone's only dropout is attention dropout: at 0 the two views are the same sample (trained before)
    no_views = CFG.model_copy(update={"contrastive": ContrastiveConfig(coef=0.1, dropout=0.0)})
    with pytest.raises(ValueError, match="contrastive.dropout above 0"):
        train_reward_model(init_dir, make_pairs(16), no_views, seed=0)


def _samples(n_prompts: int = 3, k: int = 4) -> pd.DataFrame:
    rows = [{"prompt": f"say p{i}", "response": f"answer {i} {'x' * j}"} for i in range(n_prompts) for j in range(k)]
    return pd.DataFrame(rows + [{"prompt": "say lone", "response": "only one"}])


def test_meta_groups_keep_prompts_with_k_distinct_samples():
    groups = meta_groups(_samples(), 4)
    assert [p for p, _ in groups] == ["say p0", "say p1", "say p2"] and all(len(r) == 4 for _, r in groups)
    with pytest.raises(ValueError, match="at least 5 distinct"):
        meta_groups(_samples(), 5)
    with pytest.raises(ValueError, match="lack column"):
        meta_groups(pd.DataFrame({"prompt": ["a"]}), 2)


def test_metarm_samples_are_the_policys_own_responses():
    """Another generation model's responses are no samples of the policy PPO starts from (they entered J)."""
    from tasks.reward import policy_samples

    responses = pd.DataFrame({"prompt": ["q"] * 4, "response": ["p-a", "p-b", "big-a", "policy2-a"],
                              "generator": ["policy:0123456789ab", "policy:0123456789ab", "big:ba9876543210",
                                            "policy2:ffffffffffff"]})
    assert meta_groups(policy_samples(responses, ("policy",)), 2) == [("q", ["p-a", "p-b"])]


def test_meta_ascent_moves_the_weights_by_eta_times_grad_j(init_dir):
    tok = models.build_tokenizer()
    cfg = CFG.model_copy(update={"meta": MetaRMConfig(enabled=True, inner_lr=0.01, samples_per_prompt=4,
                                                      prompts_per_step=2)})
    batch = meta_batch(tok, meta_groups(_samples(), 4), cfg, np.random.default_rng(0))
    assert batch["input_ids"].shape[0] == 8  # 2 prompts x 4 samples

    reference = RewardModel.from_policy(init_dir, seed=0, read="end_token+logprob")
    params = [p for p in reference.parameters() if p.requires_grad]
    j_ref = difference_loss(reference(**batch).view(2, 4))
    grads = torch.autograd.grad(j_ref, params)
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
    assert norm < 1.0  # below max_grad_norm: no clipping, the shift is exactly eta * grad

    model = RewardModel.from_policy(init_dir, seed=0, read="end_token+logprob")
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    shifts, j = meta_ascent(model, batch, 4, 0.01, max_grad_norm=1.0)
    assert j == pytest.approx(j_ref.item(), rel=1e-6)
    after = [p.detach() for p in model.parameters() if p.requires_grad]
    for b, a, g, s in zip(before, after, grads, shifts):
        torch.testing.assert_close(a - b, 0.01 * g, atol=1e-7, rtol=1e-4)
        torch.testing.assert_close(s, 0.01 * g)
    # clipping: a smaller max_grad_norm scales the step to eta * max_grad_norm in norm
    clipped = RewardModel.from_policy(init_dir, seed=0, read="end_token+logprob")
    shifts, _ = meta_ascent(clipped, batch, 4, 0.01, max_grad_norm=norm / 10)
    assert math.sqrt(sum(float(s.pow(2).sum()) for s in shifts)) == pytest.approx(0.01 * norm / 10, rel=1e-3)


def test_meta_step_takes_the_pair_gradient_at_the_shifted_weights_and_restores_them(init_dir):
    tok = models.build_tokenizer()
    pairs = make_pairs(8)
    cfg = CFG.model_copy(update={"meta": MetaRMConfig(enabled=True, inner_lr=0.05, samples_per_prompt=4,
                                                      prompts_per_step=3)})
    meta = meta_batch(tok, meta_groups(_samples(), 4), cfg, np.random.default_rng(0))
    batch = _pair_batch(tok, pairs, 64)

    model = RewardModel.from_policy(init_dir, seed=0, read="end_token").train()
    theta = [p.detach().clone() for p in model.parameters()]
    _, metrics = step_gradients(model, batch, pairs, cfg, meta)
    assert 0.5 <= metrics["meta_difference"] < 1.0
    for p, t in zip(model.parameters(), theta):
        assert torch.equal(p.detach(), t)  # the weights are theta again, bit for bit

    # by hand: theta' = theta + eta * grad J, then the gradient of the pair loss at theta'
    shifted = RewardModel.from_policy(init_dir, seed=0, read="end_token").train()
    params = [p for p in shifted.parameters() if p.requires_grad]
    grads_j = torch.autograd.grad(difference_loss(shifted(**meta).view(-1, 4)), params, allow_unused=True)
    with torch.no_grad():
        for p, g in zip(params, grads_j):
            if g is not None:
                p.add_(0.05 * g)
    pair_loss(shifted, batch, pairs, CFG)[0].backward()
    plain = RewardModel.from_policy(init_dir, seed=0, read="end_token").train()
    pair_loss(plain, batch, pairs, CFG)[0].backward()
    for p, s, q in zip(model.parameters(), shifted.parameters(), plain.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(p.grad, s.grad, atol=1e-6, rtol=1e-4)
    assert any(not torch.allclose(p.grad, q.grad) for p, q in zip(model.parameters(), plain.parameters())
               if p.grad is not None)  # and it is not the plain gradient


def test_metarm_training_needs_samples_and_with_a_vanishing_step_is_vanilla(init_dir):
    pairs = make_pairs(16)
    meta_cfg = CFG.model_copy(update={"meta": MetaRMConfig(enabled=True, inner_lr=1e-9)})
    with pytest.raises(ValueError, match="needs policy samples"):
        train_reward_model(init_dir, pairs, meta_cfg, seed=0)
    tok = models.build_tokenizer()
    vanilla, _, _ = train_reward_model(init_dir, pairs, CFG, seed=0)
    meta, _, metrics = train_reward_model(init_dir, pairs, meta_cfg, seed=0, meta_samples=_samples())
    assert metrics["meta_difference"] >= 0.5
    batch = encode(tok, pairs["prompt"].tolist(), pairs["chosen"].tolist(), 64)
    real, _, _ = train_reward_model(init_dir, pairs, meta_cfg.model_copy(
        update={"meta": MetaRMConfig(enabled=True, inner_lr=0.5)}), seed=0, meta_samples=_samples())
    with torch.no_grad():
        torch.testing.assert_close(meta(**batch), vanilla(**batch), atol=1e-4, rtol=1e-4)
        assert not torch.allclose(real(**batch), vanilla(**batch), atol=1e-3)


def test_voting_rejects_what_voters_cannot_do():
    with pytest.raises(ValueError, match="MetaRM belongs to reward.train"):
        VotingConfig(train=RewardTrainConfig(meta=MetaRMConfig(enabled=True)))
    with pytest.raises(ValueError, match="contrastive"):
        VotingConfig(mode="fast", train=RewardTrainConfig(contrastive=ContrastiveConfig(coef=0.1)))
