"""PPO-max: core formulas on hand-computed tensors, the sampler, and the trainer end to end."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rlhf_core import models
from rlhf_core.config import PolicyModelConfig, PPOConfig
from rlhf_core.generation.sampler import decode_responses, response_mask_from_ids, sample_batch
from rlhf_core.ppo.core import (
    AdaptiveKLController,
    RunningMoments,
    explained_variance,
    gae,
    kl_penalty,
    normalize_and_clip,
    policy_loss,
    scale_and_clip,
    token_rewards,
    value_loss,
)
from rlhf_core.ppo.data_parallel import pad_cat
from rlhf_core.ppo.trainer import build_critic, response_logits, sample_seeds, train_ppo

TINY = PolicyModelConfig(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
)


# ---------------------------------------------------------------- GAE


def gae_loop(rewards, values, mask, gamma, lam):
    """The reference: one sequence at a time, straight from the definition."""
    advantages, returns = torch.zeros_like(rewards), torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        n = int(mask[b].sum())
        next_adv = 0.0
        for t in reversed(range(n)):
            next_value = values[b, t + 1].item() if t + 1 < n else 0.0
            delta = rewards[b, t].item() + gamma * next_value - values[b, t].item()
            next_adv = delta + gamma * lam * next_adv
            advantages[b, t] = next_adv
            returns[b, t] = next_adv + values[b, t]
    return advantages, returns


def test_gae_by_hand_1x3():
    rewards, values = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.5, 0.5]])
    adv, ret = gae(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.5)
    # delta = [-0.05, -0.05, 0.5]; A2 = 0.5, A1 = -0.05 + 0.45 * 0.5, A0 = -0.05 + 0.45 * A1
    assert torch.allclose(adv, torch.tensor([[0.02875, 0.175, 0.5]]))
    assert torch.allclose(ret, torch.tensor([[0.52875, 0.675, 1.0]]))


def test_gae_value_after_last_response_token_is_zero():
    rewards, values = torch.tensor([[0.0, 1.0, 7.0]]), torch.tensor([[0.5, 0.5, 9.0]])
    adv, ret = gae(rewards, values, torch.tensor([[1, 1, 0]]), gamma=1.0, lam=1.0)
    # the masked third position (reward 7, value 9) contributes nothing: A1 = 1 - 0.5, A0 = 0 + 0.5 - 0.5 + A1
    assert torch.allclose(adv, torch.tensor([[0.5, 0.5, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 0.0]]))


def test_gae_matches_loop_on_ragged_masks():
    g = torch.Generator().manual_seed(0)
    B, T = 6, 9
    rewards, values = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    lengths = torch.tensor([1, 9, 4, 7, 2, 5])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    adv, ret = gae(rewards, values, mask, gamma=0.99, lam=0.95)
    ref_adv, ref_ret = gae_loop(rewards, values, mask, gamma=0.99, lam=0.95)
    assert torch.allclose(adv, ref_adv, atol=1e-5)
    assert torch.allclose(ret, ref_ret, atol=1e-5)


# ---------------------------------------------------------------- KL and rewards


def test_kl_estimators_by_hand():
    logp, logp_ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert torch.allclose(kl_penalty(logp, logp_ref, "k1"), torch.tensor([math.log(2.0)]))
    # k3: ratio = 0.25 / 0.5 = 0.5 -> (0.5 - 1) - log 0.5
    assert torch.allclose(kl_penalty(logp, logp_ref, "k3"), torch.tensor([-0.5 + math.log(2.0)]))
    with pytest.raises(ValueError, match="k2"):
        kl_penalty(logp, logp_ref, "k2")


def test_k3_is_nonnegative():
    g = torch.Generator().manual_seed(1)
    logp, logp_ref = torch.randn(4, 50, generator=g) * 3, torch.randn(4, 50, generator=g) * 3
    assert (kl_penalty(logp, logp_ref, "k3") >= 0).all()


def test_token_rewards_place_score_at_last_response_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    logp_ref = torch.full((2, 4), -2.0)
    rewards, kl = token_rewards(torch.tensor([2.0, -1.0]), logp_ref + 0.1, logp_ref, mask, 0.5, "k1")
    assert torch.allclose(kl, 0.1 * mask)
    expected = torch.tensor([[-0.05, -0.05, -0.05 + 2.0, 0.0], [-0.05 - 1.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(rewards, expected)


def test_running_moments_match_numpy():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=n) for n in (5, 1, 17, 8)]
    moments = RunningMoments()
    for b in batches:
        moments.update(torch.tensor(b, dtype=torch.float32))
    seen = np.concatenate(batches)
    assert moments.count == len(seen)
    assert moments.mean == pytest.approx(seen.mean(), rel=1e-6)
    assert moments.std == pytest.approx(seen.std(), rel=1e-6)


def test_normalize_and_clip():
    moments = RunningMoments()
    out = normalize_and_clip(torch.tensor([1.0, 2.0, 3.0, 100.0]), moments, clip=1.5)
    assert moments.count == 4
    seen = np.array([1.0, 2.0, 3.0, 100.0])
    expected = np.clip((seen - seen.mean()) / seen.std(), -1.5, 1.5)
    assert torch.allclose(out, torch.tensor(expected, dtype=torch.float32))


def test_scale_and_clip_divides_by_the_running_std_without_centring():
    moments = RunningMoments()
    out = scale_and_clip(torch.tensor([1.0, 2.0, 3.0, 100.0]), moments, clip=1.5)
    seen = np.array([1.0, 2.0, 3.0, 100.0])
    assert torch.allclose(out, torch.tensor(np.clip(seen / seen.std(), -1.5, 1.5), dtype=torch.float32))
    assert out[0] > 0  # not centred: a positive score stays positive


def test_padding_with_an_overflowing_log_ratio_changes_no_reward_loss_or_gradient():
    """Masked positions may hold any finite value: a log-ratio of 200 there (exp overflows float32) must not turn
    into inf * 0 = NaN in k3, the PPO ratio, the advantages or the gradient."""
    mask = torch.tensor([[1, 1, 0]])
    logp_ref = torch.tensor([[-1.0, -2.0, -300.0]])
    tame = torch.tensor([[-1.0, -2.0, -300.0]])
    wild = tame.clone()
    wild[0, 2] = -100.0  # log pi_ref - log pi = -200 there; pi_ref / pi = exp(-200) is fine, its inverse is not
    for logp in (tame, wild):
        rewards, kl = token_rewards(torch.tensor([1.0]), logp + 0.1 * mask, logp_ref, mask, 0.5, "k3")
        assert torch.isfinite(rewards).all() and kl[0, 2] == 0
    old_logp = torch.tensor([[-1.0, -2.0, -300.0]])
    losses = []
    for padded in (-300.0, -50.0):  # logp - old_logp = 250 at the padded position: exp overflows
        logp = torch.tensor([[-0.9, -2.1, padded]], requires_grad=True)
        loss, metrics = policy_loss(logp, old_logp, torch.tensor([[1.0, -1.0, 1.0]]), mask, clip_coef=0.2)
        loss.backward()
        assert torch.isfinite(logp.grad).all() and logp.grad[0, 2] == 0 and math.isfinite(metrics["approx_kl"])
        losses.append(loss.item())
    assert losses[0] == losses[1]


def test_adaptive_kl_controller_by_hand():
    control = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10000)
    assert control.update(current_kl=12.0, n_steps=1000) == pytest.approx(0.1 * (1 + 0.2 * 0.1))  # error clipped
    assert control.update(current_kl=5.4, n_steps=1000) == pytest.approx(0.102 * (1 - 0.1 * 0.1))  # 5.4/6 - 1
    with pytest.raises(ValueError, match="target > 0"):
        AdaptiveKLController(0.1, 0.0, 100)


def test_ppo_config_takes_one_reward_transform():
    with pytest.raises(ValueError, match="alternatives"):
        PPOConfig(reward_norm=True, reward_scaling=True)
    PPOConfig(reward_norm=False, reward_scaling=True)


def test_ppo_config_refuses_an_adaptive_kl_that_starts_at_zero():
    with pytest.raises(ValueError, match="kl_target steers kl_coef by multiplying it"):
        PPOConfig(preset="vanilla", kl_target=0.1)  # vanilla's kl_coef is 0
    assert PPOConfig(preset="vanilla", kl_target=0.1, kl_coef=0.05).kl_coef == 0.05


# ---------------------------------------------------------------- losses


def test_policy_loss_unclipped_and_clipped_by_hand():
    # token 0: ratio 1.1, A = 2 -> inside the clip: -2.2
    # token 1: ratio 1.5, A = 1 -> clipped at 1.2: max(-1.5, -1.2) = -1.2
    # token 2: ratio 0.5, A = -1 -> clipped at 0.8: max(0.5, 0.8) = 0.8
    # token 3: masked out
    ratio = torch.tensor([[1.1, 1.5, 0.5, 9.0]])
    old_logp = torch.full((1, 4), -1.0)
    advantages = torch.tensor([[2.0, 1.0, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = policy_loss(old_logp + ratio.log(), old_logp, advantages, mask, clip_coef=0.2)
    assert loss.item() == pytest.approx((-2.2 - 1.2 + 0.8) / 3)
    assert metrics["clipfrac"] == pytest.approx(2 / 3)
    r = np.array([1.1, 1.5, 0.5])
    assert metrics["approx_kl"] == pytest.approx(np.mean((r - 1) - np.log(r)), rel=1e-5)


def test_policy_loss_gradient_vanishes_when_clipped():
    logp = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), clip_coef=0.2)
    loss.backward()
    assert logp.grad.item() == 0.0


def test_value_loss_clipping():
    returns, old_values = torch.tensor([[2.0, 2.0, 0.0]]), torch.tensor([[1.0, 1.0, 1.0]])
    values, mask = torch.tensor([[1.5, 1.1, 0.5]]), torch.tensor([[1, 1, 1]])
    # token 0: moved +0.5 > 0.2 -> clipped to 1.2: max(0.25, 0.64) = 0.64; token 1: inside, 0.81 both ways;
    # token 2: moved -0.5 -> clipped to 0.8: max(0.25, 0.64) = 0.64 (a clip of V + V_old would give 1.2: 1.44)
    loss, metrics = value_loss(values, old_values, returns, mask, value_clip=0.2, clip_vloss=True)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81 + 0.64) / 3)
    assert metrics["clipfrac"] == pytest.approx(2 / 3)
    assert metrics["error"] == pytest.approx((0.25 + 0.81 + 0.25) / 3)
    loss, _ = value_loss(values, old_values, returns, mask, value_clip=0.2, clip_vloss=False)
    assert loss.item() == pytest.approx(0.5 * (0.25 + 0.81 + 0.25) / 3)


def test_explained_variance():
    returns, mask = torch.tensor([[1.0, 2.0, 3.0, 50.0]]), torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 4), 2.0), returns, mask) == pytest.approx(0.0)
    # Var[R] 4 (not 1): R - V = [0, 1, 2] has a quarter of it
    wider = torch.tensor([[1.0, 3.0, 5.0, 50.0]])
    assert explained_variance(torch.tensor([[1.0, 2.0, 3.0, 0.0]]), wider, mask) == pytest.approx(0.75)


# ---------------------------------------------------------------- sampler


@pytest.fixture(scope="module")
def tiny_policy_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("policy")
    tok = models.build_tokenizer()
    models.save_hf(models.build_policy(TINY, tok, seed=0), tok, out)
    return out


@pytest.fixture(scope="module")
def tiny():
    tok = models.build_tokenizer()
    return models.build_policy(TINY, tok, seed=0).eval(), tok


QUERIES = ["Q: a\nA:", "Q: a much longer query\nA:", "Q: mid size\nA:"]


def test_response_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 1, 7, 1], [5, 6, 7, 8], [1, 0, 0, 0]])
    assert response_mask_from_ids(ids, eos_token_id=1).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert response_mask_from_ids(ids, eos_token_id=[1, 6]).tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]]


def test_generation_stops_at_the_models_own_end_of_turn_tokens(tiny):
    """A chat model whose turn ends with a token other than the tokenizer's eos lists it in generation_config
    (Gemma-2-it, Phi-3): sampling stops there, as model.generate and vLLM do (it ran on to max_new_tokens)."""
    model, tok = tiny
    greedy = sample_batch(model, tok, QUERIES[:1], max_new_tokens=6, temperature=0)
    ids = greedy.response_ids[0].tolist()
    end_of_turn = ids[2]
    before = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, end_of_turn]
    try:
        stopped = sample_batch(model, tok, QUERIES[:1], max_new_tokens=6, temperature=0)
    finally:
        model.generation_config.eos_token_id = before
    n = ids.index(end_of_turn) + 1  # up to and including its first occurrence
    assert stopped.response_mask[0].tolist() == [1] * n + [0] * (stopped.response_mask.shape[1] - n)
    assert stopped.response_ids[0, :n].tolist() == ids[:n]


def test_sample_batch_left_pads_queries(tiny):
    model, tok = tiny
    assert tok.padding_side == "right"  # the default stays as it was
    out = sample_batch(model, tok, QUERIES, max_new_tokens=4, generator_seed=0)
    lengths = [len(q.encode()) for q in QUERIES]  # byte-level: one token per byte, no eos appended
    assert out.query_mask.sum(1).tolist() == lengths
    assert (out.query_mask[:, -1] == 1).all()  # every query ends at the last column
    for row, n in zip(range(3), lengths):
        assert (out.query_ids[row, : out.query_ids.shape[1] - n] == tok.pad_token_id).all()
        assert tok.decode(out.query_ids[row, -n:]) == QUERIES[row]
    assert tok.padding_side == "right"


def test_sample_batch_deterministic_for_a_seed(tiny):
    model, tok = tiny
    a = sample_batch(model, tok, QUERIES, max_new_tokens=8, top_p=0.9, generator_seed=3)
    b = sample_batch(model, tok, QUERIES, max_new_tokens=8, top_p=0.9, generator_seed=3)
    c = sample_batch(model, tok, QUERIES, max_new_tokens=8, top_p=0.9, generator_seed=4)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    assert not torch.equal(a.response_ids, c.response_ids)


def test_greedy_is_reproducible_and_matches_the_full_forward(tiny):
    model, tok = tiny
    a = sample_batch(model, tok, QUERIES, max_new_tokens=6, temperature=0.0)
    b = sample_batch(model, tok, QUERIES, max_new_tokens=6, temperature=0.0)
    assert torch.equal(a.response_ids, b.response_ids)
    # KV-cache generation and one full forward with left padding + position ids agree:
    # every greedy token is the argmax of the logits the trainer computes for it.
    with torch.no_grad():
        logits = response_logits(model, a, temperature=1.0)
    mask = a.response_mask.bool()
    assert torch.equal(logits.argmax(-1)[mask], a.response_ids[mask])


def test_left_padding_does_not_change_logprobs(tiny):
    model, tok = tiny
    batch = sample_batch(model, tok, QUERIES, max_new_tokens=5, generator_seed=0)
    with torch.no_grad():
        batched = response_logits(model, batch, temperature=1.0)
        alone = sample_batch(model, tok, QUERIES[:1], max_new_tokens=5, generator_seed=0)
        alone.response_ids = batch.response_ids[:1]
        alone.response_mask = batch.response_mask[:1]
        single = response_logits(model, alone, temperature=1.0)
    assert torch.allclose(batched[0], single[0], atol=1e-4)


def test_generation_logits_equal_the_full_forwards_so_the_rollout_skips_that_forward(tiny):
    """PPO's rollout takes the policy's log-probs from generation (`return_logits`): the KV-cache logits of
    every real response position equal one full forward's, left padding and row-seeded sampling included."""
    model, tok = tiny
    batch = sample_batch(model, tok, QUERIES, max_new_tokens=6, temperature=0.7, top_p=0.9, row_seeds=[1, 2, 3],
                         return_logits=True)
    assert batch.logits.shape == (*batch.response_ids.shape, len(tok))
    with torch.no_grad():
        full = response_logits(model, batch, temperature=1.0)
    mask = batch.response_mask.bool()
    assert torch.allclose(batch.logits[mask], full[mask], atol=1e-5)
    assert sample_batch(model, tok, QUERIES, max_new_tokens=6, row_seeds=[1, 2, 3]).logits is None


def state_blind_policy(tok, eos_logit: float):
    """A policy whose head ignores the state: every token's logit 0, eos's `eos_logit`."""
    model = models.build_policy(TINY, tok, seed=0).eval()
    model.lm_head = torch.nn.Linear(TINY.hidden_size, len(tok), bias=True)
    torch.nn.init.zeros_(model.lm_head.weight)
    torch.nn.init.zeros_(model.lm_head.bias)
    model.lm_head.bias.data[tok.eos_token_id] = eos_logit
    return model


def test_sampled_responses_end_at_eos(tiny):
    _, tok = tiny
    model = state_blind_policy(tok, eos_logit=math.log(383 / 7))  # p(eos) = 0.175 per token (259 tokens)
    out = sample_batch(model, tok, ["Q: x\nA:"] * 16, max_new_tokens=12, generator_seed=0)
    is_eos = out.response_ids == tok.eos_token_id
    stopped = is_eos.any(1)
    assert 0 < stopped.sum() < 16
    for ids, mask, text, stop in zip(out.response_ids, out.response_mask, out.texts, stopped):
        n = int(mask.sum())
        if stop:
            assert ids[n - 1] == tok.eos_token_id and (ids[:n - 1] != tok.eos_token_id).all()
            assert (ids[n:] == tok.pad_token_id).all()
        else:
            assert n == ids.shape[0]
        assert "</s>" not in text and "<pad>" not in text
    assert decode_responses(tok, out.response_ids, out.response_mask) == out.texts


def sample_rows(model, tok, queries, row_seeds, max_new_tokens, temperature, top_p):
    """PPO's rollout sampling: one response per query, row i from its own stream (row_seeds[i])."""
    return sample_batch(model, tok, queries, max_new_tokens, temperature, top_p, row_seeds=row_seeds)


def test_row_seeded_sampling_does_not_depend_on_the_batch(tiny):
    """What lets N ranks sample one process's rollout: a row's tokens depend on its seed, not its batch."""
    model, tok = tiny
    queries, seeds = QUERIES + ["Q: x\nA:"], [11, 12, 13, 14]
    whole = sample_rows(model, tok, queries, seeds, max_new_tokens=8, temperature=1.0, top_p=0.9)
    halves = [sample_rows(model, tok, queries[i : i + 2], seeds[i : i + 2], 8, 1.0, 0.9) for i in (0, 2)]
    assert whole.texts == halves[0].texts + halves[1].texts
    width = whole.response_ids.shape[1]
    assert torch.equal(pad_cat([h.response_ids for h in halves], tok.pad_token_id)[:, :width], whole.response_ids)
    assert sample_rows(model, tok, queries, [21, 22, 23, 24], 8, 1.0, 0.9).texts != whole.texts
    assert sample_seeds(0, 1, 2, 2) == sample_seeds(0, 1, 2, 2) != sample_seeds(0, 1, 3, 2)


def test_row_seeded_sampling_draws_from_the_softmax_and_honours_top_p(tiny):
    _, tok = tiny
    model = state_blind_policy(tok, eos_logit=math.log((len(tok) - 1) / 3))  # p(eos) = 1/4 exactly
    n = 8000
    out = sample_rows(model, tok, ["Q: x\nA:"] * n, list(range(n)), max_new_tokens=1, temperature=1.0, top_p=1.0)
    eos_rate = (out.response_ids[:, 0] == tok.eos_token_id).float().mean().item()
    assert abs(eos_rate - 0.25) < 4 * (0.25 * 0.75 / n) ** 0.5  # 4 standard errors: 0.019
    assert len(set(out.response_ids[:, 0].tolist())) > 200  # the other tokens are drawn too
    # top_p 0.2: the nucleus is eos alone (its 1/4 covers the 0.2)
    nucleus = sample_rows(model, tok, ["Q: x\nA:"] * 50, list(range(50)), max_new_tokens=1, temperature=1.0,
                          top_p=0.2)
    assert (nucleus.response_ids[:, 0] == tok.eos_token_id).all()


# ---------------------------------------------------------------- trainer


def lowercase_fraction(prompts, responses):
    """A hand-made reward: the share of the 8 response tokens that are lowercase letters."""
    return torch.tensor([sum(ch.islower() for ch in r) / 8 for r in responses], dtype=torch.float32)


def test_train_ppo_raises_the_score(tiny_policy_dir):
    cfg = PPOConfig(
        iterations=15, rollout_prompts=16, max_new_tokens=8, mini_batch_size=16,
        policy_lr=1e-2, critic_warmup_steps=4, top_p=1.0,  # 4 steps = iteration 0
    )  # fmt: skip
    seen = []
    prompts = [f"prompt {i}" for i in range(20)]
    policy, tokenizer, history = train_ppo(
        tiny_policy_dir, lowercase_fraction, prompts, cfg, seed=0, on_iteration=seen.append,
        gold_fn=lowercase_fraction,  # the gold here is the reward itself: logged, never trained on
    )
    assert seen == history and [m["iteration"] for m in history] == list(range(15))
    assert all(m["objective/gold"] == pytest.approx(m["objective/score"]) for m in history)
    assert set(history[0]) == {
        "objective/score", "objective/kl", "objective/entropy", "policy/approx_kl", "policy/clipfrac",
        "loss/policy", "loss/ptx", "loss/entropy_bonus", "loss/value", "value/explained_variance", "value/error",
        "response/length", "objective/kl_coef", "iteration", "objective/score_shaped", "objective/return",
        "objective/perplexity", "value/clipfrac", "lr/policy", "lr/critic", "objective/gold",
    }  # fmt: skip
    assert all(m["lr/critic"] == cfg.critic_lr for m in history)
    # the rate the policy's steps used: none in iteration 0, spent in critic warm-up (logged as the next one's before)
    assert [m["lr/policy"] for m in history] == [0.0] + [cfg.policy_lr] * 14
    assert all(m["objective/perplexity"] >= 1.0 for m in history)
    assert all(abs(m["objective/score_shaped"]) <= cfg.reward_clip for m in history)
    scores = [m["objective/score"] for m in history]
    # a random byte policy starts near 26/259 ~ 0.1; after PPO it writes mostly lowercase
    assert np.mean(scores[-3:]) > np.mean(scores[:3]) + 0.3, scores
    # the first rollout is sampled from the reference itself (to float rounding: the policy's log-probs come
    # from generation's KV cache, the reference's from a full forward)
    assert history[0]["objective/kl"] == pytest.approx(0.0, abs=1e-6)
    assert history[0]["loss/policy"] == 0.0  # critic warm-up: the policy is not updated
    kl = history[-1]["objective/kl"]
    assert math.isfinite(kl) and kl > 0
    assert isinstance(policy, torch.nn.Module) and tokenizer.eos_token_id == 1


def test_prompt_batches_shuffle_the_pool_afresh_each_pass():
    from rlhf_core.ppo.trainer import prompt_batches

    batches = prompt_batches(list("abcd"), 4, np.random.default_rng(0))
    passes = [tuple(next(batches)) for _ in range(4)]
    assert all(sorted(p) == list("abcd") for p in passes)  # each pass is the whole pool once
    assert len(set(passes)) > 1  # in a new order (a cycled first shuffle gave PPO one order every pass)


def test_the_kl_penalty_is_to_the_reference_given_not_to_the_start_policy(tiny_policy_dir, tmp_path):
    """A later round starts from the round before's policy and is anchored to SFT (`reference_dir`): its first
    rollout, sampled from the start policy, is far from the reference; without one it is the start policy (KL 0)."""
    tok = models.build_tokenizer()
    models.save_hf(models.build_policy(TINY, tok, seed=1), tok, tmp_path / "start")
    cfg = PPOConfig(iterations=1, rollout_prompts=4, max_new_tokens=6, mini_batch_size=8, critic_warmup_steps=0)
    _, _, anchored = train_ppo(tmp_path / "start", lowercase_fraction, ["a", "b"], cfg, seed=0,
                               reference_dir=tiny_policy_dir)
    _, _, own = train_ppo(tmp_path / "start", lowercase_fraction, ["a", "b"], cfg, seed=0)
    assert own[0]["objective/kl"] == pytest.approx(0.0, abs=1e-6) and anchored[0]["objective/kl"] > 0.1  # 0.33
    assert own[0]["objective/score"] == anchored[0]["objective/score"]  # the same rollout, another anchor
    with pytest.raises(ValueError, match="at least one prompt"):  # was: waited forever for a first batch
        train_ppo(tiny_policy_dir, lowercase_fraction, [], cfg, seed=0)


def test_train_ppo_is_deterministic_and_vanilla_switches_run(tiny_policy_dir):
    cfg = PPOConfig(
        iterations=2, rollout_prompts=4, max_new_tokens=6, mini_batch_size=4, critic_warmup_steps=0,
        reward_norm=False, norm_adv=False, clip_vloss=False, kl_estimator="k3",
    )  # fmt: skip
    prompts = ["a", "b", "c"]
    _, _, h1 = train_ppo(tiny_policy_dir, lowercase_fraction, prompts, cfg, seed=7)
    _, _, h2 = train_ppo(tiny_policy_dir, lowercase_fraction, prompts, cfg, seed=7, progress=True)
    assert h1 == h2
    assert all(math.isfinite(v) for m in h1 for k, v in m.items() if k != "value/explained_variance")


def test_critic_initialised_from_the_reward_model(tiny_policy_dir, tmp_path):
    tok = models.build_tokenizer()
    reward_model = models.reward_model_from_policy(tiny_policy_dir, seed=5)
    models.save_hf(reward_model, tok, tmp_path / "rm")
    critic = build_critic(tiny_policy_dir, tmp_path / "rm")
    assert torch.equal(critic.value_head.weight, reward_model.score.weight)
    assert torch.equal(critic.value_head.bias, torch.zeros(1))
    # so the critic's value at the last token is the reward model's score
    enc = tok(["Q: x\nA: yes"], add_special_tokens=False, return_tensors="pt")
    position_ids = torch.arange(enc.input_ids.shape[1])[None]
    with torch.no_grad():
        values = critic(enc.input_ids, enc.attention_mask, position_ids)  # (1, T)
        score = reward_model(**enc).logits  # (1, 1)
    assert torch.allclose(values[:, -1], score[:, 0], atol=1e-5)
    # without a reward model the critic starts from the policy's backbone
    policy = models.load_policy(tiny_policy_dir)
    from_policy = build_critic(tiny_policy_dir, None)
    assert torch.equal(from_policy.backbone.embed_tokens.weight, policy.model.embed_tokens.weight)


def test_ptx_loss_pulls_the_policy_towards_its_pretraining_data(tiny_policy_dir):
    """With ptx on, the policy update also lowers the LM loss on the given (prompt, response) data."""
    with pytest.raises(ValueError, match="ptx_examples"):
        train_ppo(tiny_policy_dir, lowercase_fraction, ["a"],
                  PPOConfig(ptx_coef=1.0, iterations=1, critic_warmup_steps=0), seed=0)
    data = [(f"prompt {i}", " XYZ") for i in range(8)]
    cfg = PPOConfig(iterations=6, rollout_prompts=4, max_new_tokens=6, mini_batch_size=8, policy_lr=1e-2,
                    critic_warmup_steps=0, ptx_coef=5.0, ptx_batch_size=4)
    _, _, history = train_ppo(tiny_policy_dir, lowercase_fraction, [p for p, _ in data], cfg, seed=0,
                              ptx_examples=data)
    ptx = [m["loss/ptx"] for m in history]
    assert all(v > 0 for v in ptx) and ptx[-1] < 0.5 * ptx[0], ptx


def test_new_switches_adaptive_kl_entropy_bonus_and_advantage_clip_run(tiny_policy_dir):
    """kl_target moves the coefficient between iterations; ent_coef and adv_clip enter the update."""
    cfg = PPOConfig(
        iterations=3, rollout_prompts=4, max_new_tokens=6, mini_batch_size=4, critic_warmup_steps=0,
        kl_coef=0.1, kl_target=0.001, kl_horizon=10, reward_norm=False, reward_scaling=True, adv_clip=0.5,
        ent_coef=0.01, policy_lr=1e-2,
    )  # fmt: skip
    _, _, history = train_ppo(tiny_policy_dir, lowercase_fraction, ["a", "b", "c"], cfg, seed=3)
    coefs = [m["objective/kl_coef"] for m in history]
    assert coefs[0] == 0.1 and history[0]["objective/kl"] == pytest.approx(0.0, abs=1e-6)
    # the first rollout's KL is 0 (to float rounding), below the target: error -0.2 over 8 sequences
    # (4 prompts x 2), horizon 10
    assert coefs[1] == pytest.approx(0.1 * (1 - 0.2 * 8 / 10))
    assert all(m["loss/entropy_bonus"] > 0 for m in history)
    # the bonus is in the loss, not only in the log: one iteration with and without it, same seed, other weights
    one = cfg.model_copy(update={"iterations": 1})
    without, with_bonus = (train_ppo(tiny_policy_dir, lowercase_fraction, ["a", "b", "c"],
                                     one.model_copy(update={"ent_coef": c}), seed=3)[0].state_dict() for c in (0.0, 0.5))
    assert any(not torch.equal(without[k], with_bonus[k]) for k in without)


def test_advantage_clip_bounds_the_whitened_advantages():
    from types import SimpleNamespace

    from rlhf_core.ppo.trainer import compute_advantages

    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    exp = SimpleNamespace(response_mask=mask, scores=torch.tensor([3.0, -1.0]), logp=torch.randn(2, 4),
                          ref_logp=torch.randn(2, 4), values=torch.zeros(2, 4))
    plain = compute_advantages(SimpleNamespace(**vars(exp)), RunningMoments(), PPOConfig())
    clipped = compute_advantages(SimpleNamespace(**vars(exp)), RunningMoments(), PPOConfig(adv_clip=0.5))
    assert plain.advantages.abs().max() > 0.5
    assert torch.equal(clipped.advantages, plain.advantages.clamp(-0.5, 0.5) * mask)


def test_presets_fill_the_switches_not_given_and_explicit_keys_win():
    from rlhf_core.config import PPO_PRESETS, RoundConfig, load_config

    assert PPOConfig() == PPOConfig(preset="ppo-max")  # the defaults are PPO-max
    vanilla = PPOConfig(preset="vanilla")
    assert (vanilla.kl_coef, vanilla.reward_norm, vanilla.clip_vloss, vanilla.norm_adv,
            vanilla.critic_warmup_steps, vanilla.ptx_coef) == (0.0, False, False, False, 0, 0.0)
    assert PPOConfig(preset="vanilla", norm_adv=True).norm_adv is True  # still overridable
    assert PPOConfig.model_validate_json(vanilla.model_dump_json()) == vanilla  # a dump reloads to itself
    assert set(PPO_PRESETS) == {"ppo-max", "vanilla"}
    with pytest.raises(ValueError, match="preset"):
        PPOConfig(preset="trl")
    # through a config file and --set, as the CLI and the UI form give it: the preset replaces the round's
    # own values of its switches, other keys stay the round's
    mini = Path(__file__).parents[1] / "configs" / "mini.yaml"
    cfg = load_config(mini, overrides=["ppo.preset=vanilla"])
    assert isinstance(cfg, RoundConfig) and (cfg.ppo.kl_coef, cfg.ppo.ptx_coef, cfg.ppo.iterations) == (0.0, 0.0, 3)
    cfg = load_config(mini, overrides=["ppo.preset=vanilla", "ppo.norm_adv=true"])
    assert cfg.ppo.norm_adv is True and cfg.ppo.reward_norm is False
    paper = load_config(mini, overrides=["ppo.preset=ppo-max"]).ppo
    assert (paper.kl_coef, paper.ptx_coef, paper.norm_adv) == (PPOConfig().kl_coef, 0.0, True)


def test_a_preset_chosen_in_the_prefect_form_sets_the_switches_the_form_sends_as_null():
    """The UI form sends every key with the defaults of the flow's parameter schema: the preset switches
    are null there, so choosing "vanilla" in the form gives vanilla, and a value typed in still wins."""
    from prefect.utilities.callables import parameter_schema

    from flows.round import rlhf_round
    from rlhf_core.config import PPO_PRESETS, RESOLVED, RoundConfig

    form = parameter_schema(rlhf_round).model_dump()["properties"]["config"]["default"]
    assert {key: form["ppo"][key] for key in PPO_PRESETS["vanilla"]} == dict.fromkeys(PPO_PRESETS["vanilla"])
    form["ppo"]["preset"] = "vanilla"
    vanilla = RoundConfig.model_validate(form).ppo
    assert {key: getattr(vanilla, key) for key in PPO_PRESETS["vanilla"]} == PPO_PRESETS["vanilla"]
    assert (vanilla.iterations, vanilla.policy_lr) == (RoundConfig().ppo.iterations, RoundConfig().ppo.policy_lr)
    form["ppo"]["norm_adv"] = True
    assert RoundConfig.model_validate(form).ppo.norm_adv is True
    # what is logged and keyed: the values, so an explicit 0.05 and the preset's 0.05 are one config
    assert RoundConfig().model_dump(context=RESOLVED)["ppo"]["kl_coef"] == PPO_PRESETS["ppo-max"]["kl_coef"] == 0.05
    assert PPOConfig().model_dump(context=RESOLVED) == PPOConfig(kl_coef=0.05).model_dump(context=RESOLVED)
    # a switch changed after validation (model_copy) dumps as its value, so a reload keeps it
    changed = PPOConfig().model_copy(update={"kl_coef": 0.0})
    assert PPOConfig.model_validate(changed.model_dump()).kl_coef == 0.0


# ---------------------------------------------------------------- schedules, warm-up, checkpoints


def test_lr_factor_warmup_then_decay_by_hand():
    from rlhf_core.ppo.core import lr_factor

    # warm-up 2 steps, 6 steps in all: the decay spans steps 2..5, progress (step - 2) / 4
    assert [lr_factor(s, "linear", 2, 6) for s in range(6)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    assert [lr_factor(s, "constant", 2, 6) for s in range(6)] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    cosine = [lr_factor(s, "cosine", 2, 6) for s in range(6)]
    assert cosine == pytest.approx([0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5,
                                    0.5 * (1 + math.cos(3 * math.pi / 4))])
    assert lr_factor(0, "linear", 0, 4) == 1.0 and lr_factor(9, "linear", 0, 4) == 0.0  # clamped past the end
    with pytest.raises(ValueError, match="schedule"):
        lr_factor(3, "step", 0, 4)


def test_config_counts_warmup_in_optimiser_steps_and_refuses_what_cannot_train():
    cfg = PPOConfig(rollout_prompts=4, responses_per_prompt=2, mini_batch_size=3, ppo_epochs=2)
    assert cfg.steps_per_iteration == 2 * 3  # ceil(8 / 3) minibatches per epoch
    with pytest.raises(ValueError, match="leaves no policy update"):
        PPOConfig(iterations=2, rollout_prompts=4, mini_batch_size=8, critic_warmup_steps=4)  # 2 x 2 steps
    with pytest.raises(ValueError, match="critic_warmup_steps"):
        PPOConfig(critic_warmup_iterations=2)  # the old key names its replacement


SMALL = dict(rollout_prompts=4, max_new_tokens=6, mini_batch_size=4, policy_lr=1e-2)  # 4 steps per iteration


class Killed(Exception):
    pass


def kill_at(iteration: int, seen: list):
    def on_iteration(m):
        if m["iteration"] == iteration:
            raise Killed
        seen.append(m)
    return on_iteration


def test_critic_warmup_leaves_the_policy_bit_identical(tiny_policy_dir, tmp_path):
    """Warm-up 4 steps = all of iteration 0: the checkpoint after it holds the initial policy, a moved critic."""
    cfg = PPOConfig(iterations=2, critic_warmup_steps=4, checkpoint_every=1, **SMALL)
    with pytest.raises(Killed):
        train_ppo(tiny_policy_dir, lowercase_fraction, ["a", "b"], cfg, seed=1, checkpoint_dir=tmp_path,
                  on_iteration=kill_at(0, []))
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    initial = models.load_policy(tiny_policy_dir).state_dict()
    assert all(torch.equal(state["policy"]["model"][k], v) for k, v in initial.items())
    assert state["policy"]["schedule"]["last_epoch"] == 0 and state["critic"]["schedule"]["last_epoch"] == 4
    assert state["history"][0]["loss/policy"] == 0.0 and state["history"][0]["loss/value"] > 0
    # warm-up 2 steps: the policy takes the last 2 of iteration 0's 4 steps
    cfg = PPOConfig(iterations=2, critic_warmup_steps=2, checkpoint_every=1, **SMALL)
    with pytest.raises(Killed):
        train_ppo(tiny_policy_dir, lowercase_fraction, ["a", "b"], cfg, seed=1, checkpoint_dir=tmp_path / "b",
                  on_iteration=kill_at(0, []))
    state = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert state["policy"]["schedule"]["last_epoch"] == 2
    assert not all(torch.equal(state["policy"]["model"][k], v) for k, v in initial.items())


def test_a_killed_run_resumes_to_the_same_result(tiny_policy_dir, tmp_path):
    """Killed in iteration 2 of 0..4 (the last checkpoint holds iterations 0-1), resumed: the same metrics and weights.

    Every piece of state is exercised: ptx batches, the adaptive KL coefficient, running reward
    moments, cosine schedules with warm-up, and the critic's warm-up ending inside the checkpointed iterations, so
    the policy has stepped twice before the checkpoint (its optimiser, schedule and ptx position restored; with a
    warm-up past the checkpoint, as before, a resume that dropped them passed)."""
    data = [(f"prompt {i}", " xyz") for i in range(6)]
    cfg = PPOConfig(iterations=5, checkpoint_every=2, critic_warmup_steps=6, ptx_coef=0.5, ptx_batch_size=4,
                    kl_target=0.01, kl_horizon=50, lr_schedule="cosine", policy_lr_warmup_steps=3,
                    critic_lr_warmup_steps=2, **SMALL)
    prompts = [p for p, _ in data]
    args = dict(seed=4, ptx_examples=data, gold_fn=lowercase_fraction)
    scored: list[int] = []

    def counted_reward(prompts_, responses):  # how many responses a run scores: a resumed one, iterations 2-4 only
        scored.append(len(responses))
        return lowercase_fraction(prompts_, responses)

    full_policy, _, full = train_ppo(tiny_policy_dir, counted_reward, prompts, cfg, **args)
    scored_by_full_run, scored[:] = sum(scored), []

    seen = []
    with pytest.raises(Killed):
        train_ppo(tiny_policy_dir, lowercase_fraction, prompts, cfg, checkpoint_dir=tmp_path,
                  on_iteration=kill_at(2, seen), **args)
    assert [m["iteration"] for m in seen] == [0, 1]
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert len(state["history"]) == 2 and state["policy"]["schedule"]["last_epoch"] == 2  # 8 steps, 6 warm-up
    assert state["policy"]["optimizer"]["state"]  # Adam's moments to restore
    replayed, scored[:] = [], []
    # resumed checkpointing every iteration: how often is not what the run computes (nor in its cache key)
    every_iteration = cfg.model_copy(update={"checkpoint_every": 1})
    policy, _, resumed = train_ppo(tiny_policy_dir, counted_reward, prompts, every_iteration,
                                   checkpoint_dir=tmp_path, on_iteration=replayed.append, **args)
    assert replayed == resumed and [m["iteration"] for m in resumed] == list(range(5))
    assert sum(scored) * 5 == scored_by_full_run * 3 > 0  # it continued; it did not train from iteration 0 again
    for a, b in zip(full, resumed):
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-7, nan_ok=True), (a["iteration"], k)
    assert len({m["objective/kl_coef"] for m in full}) > 1 and full[-1]["lr/policy"] < cfg.policy_lr
    for k, v in full_policy.state_dict().items():
        assert torch.allclose(policy.state_dict()[k], v, atol=1e-6), k
    # a checkpoint of another run is refused, not silently resumed
    with pytest.raises(ValueError, match="another PPO run"):
        train_ppo(tiny_policy_dir, lowercase_fraction, prompts, cfg, checkpoint_dir=tmp_path,
                  **(args | {"seed": 5}))


def test_ppo_curves_overlay_runs_and_skip_keys_nobody_logged():
    from tasks.plots import ppo_curves

    hist = [{"iteration": i, "objective/score": i, "objective/kl": 0.1 * i} for i in range(3)]
    fig = ppo_curves({"ppo-max": hist, "vanilla": hist}, keys=("objective/score", "objective/gold", "objective/kl"))
    titles = [ax.get_title() for ax in fig.axes if ax.axison]
    assert titles == ["objective/score", "objective/kl"]
    assert len(fig.axes[0].lines) == 2


def test_kl_to_baseline_is_zero_against_itself_and_the_mean_log_ratio_otherwise(tiny):
    """The evaluation's Monte-Carlo KL: 0 for a policy against itself; against another policy, the mean over
    the sampled responses of the summed log-ratio, the responses drawn from the candidate with the seed."""
    from rlhf_core.evaluation import kl_to_baseline
    from rlhf_core.ops import logprobs_from_logits

    model, tok = tiny
    other = models.build_policy(TINY, tok, seed=1).eval()
    prompts = ["What is 1+2?", "What is 3-1?", "What is 4+4?"]
    assert kl_to_baseline(model, model, tok, prompts, max_new_tokens=6, seed=5) == 0.0
    sample = sample_batch(model, tok, [models.format_query(tok, p) for p in prompts], 6, temperature=1.0,
                          generator_seed=5)
    with torch.no_grad():
        ratio = (logprobs_from_logits(response_logits(model, sample, 1.0), sample.response_ids)
                 - logprobs_from_logits(response_logits(other, sample, 1.0), sample.response_ids))
    expected = float((ratio * sample.response_mask).sum(1).mean())
    assert kl_to_baseline(model, other, tok, prompts, max_new_tokens=6, seed=5) == pytest.approx(expected, abs=1e-6)


def _rollout_stub():
    from types import SimpleNamespace

    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    return SimpleNamespace(response_mask=mask, scores=torch.tensor([3.0, -1.0, 0.5]), logp=torch.randn(3, 4),
                           ref_logp=torch.randn(3, 4), values=torch.randn(3, 4))


def test_advantages_are_whitened_over_the_response_tokens_only_when_asked():
    """norm_adv: mean 0 and variance 1 over the masked tokens (a dropped whitening, or one not centred, passed every
    test); off: the GAE advantages themselves."""
    from types import SimpleNamespace

    from rlhf_core.ops import masked_mean, masked_var
    from rlhf_core.ppo.trainer import compute_advantages

    exp = _rollout_stub()
    mask = exp.response_mask
    whitened = compute_advantages(SimpleNamespace(**vars(exp)), RunningMoments(), PPOConfig(norm_adv=True))
    assert masked_mean(whitened.advantages, mask).abs() < 1e-6
    assert masked_var(whitened.advantages, mask) == pytest.approx(1.0, rel=1e-4)
    plain = compute_advantages(SimpleNamespace(**vars(exp)), RunningMoments(), PPOConfig(norm_adv=False))
    rewards, _ = token_rewards(normalize_and_clip(exp.scores, RunningMoments(), PPOConfig().reward_clip), exp.logp,
                               exp.ref_logp, mask, PPOConfig().kl_coef, "k1")
    expected, _ = gae(rewards, exp.values, mask, 1.0, 0.95)
    torch.testing.assert_close(plain.advantages, expected)
    assert (whitened.advantages[mask == 0] == 0).all()


def test_reward_scaling_divides_by_the_running_std_without_centring():
    """reward_scaling (reward_norm off) was never checked: its branch could be skipped and every test passed."""
    from types import SimpleNamespace

    from rlhf_core.ppo.trainer import compute_advantages

    exp, moments = _rollout_stub(), RunningMoments()
    out = compute_advantages(SimpleNamespace(**vars(exp)), moments,
                             PPOConfig(reward_norm=False, reward_scaling=True, reward_clip=1.0))
    std = exp.scores.double().std(unbiased=False)  # the moments after this one batch (population std)
    torch.testing.assert_close(out.shaped_scores, (exp.scores / std).clamp(-1.0, 1.0).float(), rtol=1e-4, atol=1e-6)
    assert moments.count == 3 and not torch.equal(out.shaped_scores, exp.scores)


def test_the_entropy_bonus_raises_the_policys_entropy():
    """ent_coef: the loss is pg_loss - ent_coef x entropy, so one step with zero advantages must raise the entropy
    of the minibatch's tokens (a sign flipped to a penalty passed every test)."""
    from types import SimpleNamespace

    from rlhf_core.ops import entropy_from_logits, masked_mean
    from rlhf_core.ppo.learner import Learner
    from rlhf_core.ppo.trainer import policy_step

    tok = models.build_tokenizer()
    policy = models.build_policy(TINY, tok, seed=0)
    ids = torch.tensor(tok("Q: What is 1+2?\nA:")["input_ids"] + tok(" It is 3.")["input_ids"]).unsqueeze(0)
    n_query = len(tok("Q: What is 1+2?\nA:")["input_ids"])
    mb = SimpleNamespace(query_ids=ids[:, :n_query], response_ids=ids[:, n_query:],
                         query_mask=torch.ones(1, n_query, dtype=torch.long),
                         response_mask=torch.ones(1, ids.shape[1] - n_query, dtype=torch.long))

    def entropy() -> float:
        with torch.no_grad():
            return masked_mean(entropy_from_logits(response_logits(policy, mb, 1.0)), mb.response_mask).item()

    with torch.no_grad():
        mb.logp = torch.zeros_like(mb.response_ids, dtype=torch.float)
    mb.advantages = torch.zeros(mb.response_ids.shape)
    before = entropy()
    learner = Learner.build(policy, 1e-2, "constant", 0, 1)
    policy_step(learner, mb, 1.0, PPOConfig(ent_coef=0.5))
    assert entropy() > before


def test_a_learner_step_clips_the_global_gradient_norm():
    """The clip line could go and every test passed (Adam hides a gradient's scale in the weights): the gradients
    a step leaves behind are the clipped ones."""
    from rlhf_core.ppo.learner import Learner

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    learner = Learner.build(model, 1e-3, "constant", 0, 1)
    learner.step(100 * model(torch.randn(8, 4)).pow(2).sum(), max_grad_norm=0.5)
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
    assert norm == pytest.approx(0.5, rel=1e-5)
