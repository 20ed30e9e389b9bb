"""Reward-model batches (issue 12): the pairs are tokenised once before training, `length_grouped` batches
group pairs of similar length (transformers' group_by_length) while staying seeded and random per batch, and
`share_prompt` runs each pair's prompt once for both replies with the same rewards and gradients."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from rlhf_core import models
from rlhf_core.config import RewardTrainConfig
from rlhf_core.reward import train as reward_train
from rlhf_core.reward.model import RewardModel, encode
from rlhf_core.reward.train import (encode_pairs, epoch_batches, pair_batch, shared_prompt_batch,
                                   shared_prompt_length, train_reward_model)
from test_reward import init_dir  # noqa: F401 - a fixture: a tiny random Qwen2 policy saved as a Hugging Face dir


def pairs_of_lengths(n: int) -> pd.DataFrame:
    """Pairs whose replies grow with their index (chosen i: i + 1 letters, rejected: 2 i + 1)."""
    return pd.DataFrame({"prompt": [f"p{i % 3}" for i in range(n)],
                         "chosen": ["a" * (i + 1) for i in range(n)],
                         "rejected": ["b" * (2 * i + 1) for i in range(n)]})


def retokenised_batch(tokenizer, pairs: pd.DataFrame, max_length: int) -> dict[str, torch.Tensor]:
    """The batch as the training loop built it before issue 12: the pairs' texts tokenised again at each step."""
    prompts = pairs["prompt"].tolist()
    return encode(tokenizer, prompts + prompts, pairs["chosen"].tolist() + pairs["rejected"].tolist(), max_length)


def test_a_batch_of_the_pairs_tokenised_once_equals_the_batch_tokenised_at_the_step():
    tok = models.build_tokenizer()
    pairs = pairs_of_lengths(6)
    encoded = encode_pairs(tok, pairs, max_length=16)
    # one token per byte: "Q: p0\nA:" is 8 tokens, then the reply and eos; the longer side is the rejected one,
    # and pair 5's (8 + 11 + 1 = 20) is cut from the left to 16
    assert encoded.lengths().tolist() == [10, 12, 14, 16, 16, 16]
    for rows in (np.array([4, 0, 2]), np.array([5]), np.arange(6)):
        batch = pair_batch(encoded, rows)
        expected = retokenised_batch(tok, pairs.iloc[rows], max_length=16)
        assert batch.keys() == expected.keys()
        for key in batch:
            assert torch.equal(batch[key], expected[key]), key
    assert pair_batch(encoded, np.array([0, 1]))["input_ids"].shape == (4, 12)  # to pair 1's rejected


def test_one_epoch_on_pairs_tokenised_once_gives_the_same_weights_as_tokenising_every_batch(init_dir, monkeypatch):
    pairs = pairs_of_lengths(12)
    cfg = RewardTrainConfig(epochs=1, batch_size=4, max_length=32)
    once, tok, _ = train_reward_model(init_dir, pairs, cfg, seed=3)

    def tokenise_at_the_step(encoded, rows, device=None):
        return retokenised_batch(tok, pairs.iloc[rows], cfg.max_length)

    monkeypatch.setattr(reward_train, "pair_batch", tokenise_at_the_step)
    every_batch, _, _ = train_reward_model(init_dir, pairs, cfg, seed=3)
    trained = dict(every_batch.named_parameters())
    for name, p in once.named_parameters():
        assert torch.equal(p, trained[name]), name
    fresh = RewardModel.from_policy(init_dir, 3, cfg.read)
    assert not torch.equal(once.head().weight, fresh.head().weight)  # it did train


def test_length_grouped_batches_are_the_sorted_mega_batches_of_the_seeded_permutation_in_shuffled_order():
    lengths = np.array([5, 40, 12, 33, 8, 21, 17, 2, 29, 11, 38, 25, 14, 3, 36, 19])  # (16,)
    cfg = RewardTrainConfig(batch_size=2, batching="length_grouped")
    batches = epoch_batches(16, cfg, np.random.default_rng(7), lengths)

    # 16 pairs, 2 per batch: min(16 // (4 * 2), 50) = 2 batches per mega-batch, so 4 mega-batches of 4 pairs
    order = np.random.default_rng(7).permutation(16)  # the same first draw
    expected = set()
    for start in range(0, 16, 4):
        mega = sorted(order[start : start + 4], key=lambda i: -lengths[i])
        expected |= {tuple(mega[:2]), tuple(mega[2:])}
    assert {tuple(b) for b in batches} == expected
    assert sorted(np.concatenate(batches).tolist()) == list(range(16))  # every pair once per epoch
    in_mega_order = [tuple(order[s : s + 4][np.argsort(-lengths[order[s : s + 4]])][h : h + 2])
                     for s in range(0, 16, 4) for h in (0, 2)]
    assert [tuple(b) for b in batches] != in_mega_order  # the batches are shuffled, not left mega-batch by mega-batch
    assert [tuple(b) for b in epoch_batches(16, cfg, np.random.default_rng(8), lengths)] != [tuple(b) for b in batches]

    def padded(bs):
        return sum(len(b) * lengths[b].max() for b in bs)

    random_batches = epoch_batches(16, cfg.model_copy(update={"batching": "random"}), np.random.default_rng(7), lengths)
    assert [b.tolist() for b in random_batches] == [order[s : s + 2].tolist() for s in range(0, 16, 2)]
    assert padded(batches) < padded(random_batches)


def test_length_grouped_training_learns_the_separable_pairs(init_dir):
    """Every chosen reply holds '!!', no rejected one does; replies of 4 to 16 letters, so batches group."""
    rng = np.random.default_rng(0)

    def letters(n):
        return "".join(rng.choice(list("abcdefgh "), size=n))

    pairs = pd.DataFrame([{"prompt": "say " + letters(8), "chosen": letters(int(rng.integers(2, 14))) + "!!",
                           "rejected": letters(int(rng.integers(4, 16)))} for _ in range(96)])
    # the end-token head alone: a random backbone's log-likelihood is noise (and longer is less likely)
    cfg = RewardTrainConfig(read="end_token", epochs=3, batch_size=16, lr=3e-3, max_length=64,
                            batching="length_grouped")
    model, tok, metrics = train_reward_model(init_dir, pairs, cfg, seed=0)
    assert metrics["steps"] == 3 * 6
    assert reward_train.pairwise_accuracy(model, tok, pairs, cfg.max_length) >= 0.9


def test_the_logprob_read_takes_the_lm_head_only_at_response_positions_and_gets_the_full_products_values(init_dir):
    model = RewardModel.from_policy(init_dir, 0, "end_token+logprob")
    batch = pair_batch(encode_pairs(models.build_tokenizer(), pairs_of_lengths(5), 32), np.arange(5))
    hidden = model.hidden_states(batch["input_ids"], batch["attention_mask"])  # (10, T, H)
    # the full product: every position's log-softmax over the vocabulary, then the response's picked
    logp = torch.log_softmax(hidden[:, :-1] @ model.trunk().get_input_embeddings().weight.T, dim=-1)  # (10, T-1, V)
    full = logp.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1) * batch["response_mask"][:, 1:]
    token_logp = model.response_token_logprob(hidden, batch)
    torch.testing.assert_close(token_logp, full, atol=1e-5, rtol=1e-5)
    # pair 0's chosen: "a" and eos are its response, predicted from the last two positions of "Q: p0\nA:a"
    assert (token_logp[0] != 0).sum() == 2 and (token_logp[0, 7:9] != 0).all()
    token_logp.sum().backward()  # the gradient reaches the trunk through the picked positions
    assert model.trunk().get_input_embeddings().weight.grad.abs().sum() > 0


def test_the_shared_prompt_is_the_query_both_rows_start_with_and_none_where_truncation_cut_them_apart():
    assert shared_prompt_length([1, 2, 3, 4, 9], [1, 2, 3, 5, 6, 9], 2, 3) == 3  # the query [1, 2, 3]
    assert shared_prompt_length([1, 2, 7, 9], [1, 2, 7, 9], 2, 2) == 2  # the same reply: only the query is shared
    assert shared_prompt_length([1, 2, 7, 9], [2, 7, 8, 9], 2, 2) == 0
    encoded = encode_pairs(models.build_tokenizer(), pairs_of_lengths(6), max_length=16)
    # "Q: p0\nA:" is 8 tokens; pairs 4 and 5's rejected rows are cut from the left, so their rows start apart
    assert encoded.prompt == [8, 8, 8, 8, 0, 0]
    assert encoded.batching_lengths(True).tolist() == encoded.prompt
    assert encoded.batching_lengths(False).tolist() == encoded.lengths().tolist()

    batch = shared_prompt_batch(encoded, np.array([0, 3, 4]), group_rows=4)
    assert batch["prompt_ids"].shape == (3, 8) and batch["prompt_mask"].sum(1).tolist() == [8, 8, 0]
    # the prompts' passes: sorted by prompt length, 4 rows a pass (2 a pass: the empty prompt with a full one)
    assert [g.tolist() for g in batch["prompt_groups"]] == [[2, 0, 1]]
    assert [g.tolist() for g in shared_prompt_batch(encoded, np.array([0, 3, 4]), 2)["prompt_groups"]] == [[2, 0], [1]]
    rows = [g["row"].tolist() for g in batch["continuations"]]
    # replies: chosen 2, 5, 14 tokens (pair 4's whole row), rejected 2, 8, 16; sorted, then 4 rows a pass
    assert rows == [[0, 3, 1, 4], [2, 5]]
    assert [tuple(g["input_ids"].shape) for g in batch["continuations"]] == [(4, 8), (2, 16)]
    first = batch["continuations"][0]
    assert first["pair"].tolist() == [0, 0, 1, 1]
    assert first["response_mask"].sum(1).tolist() == [2, 2, 5, 8]  # reply and eos; no query tokens left in them


def test_shared_prompt_rewards_and_gradients_equal_the_whole_rows_for_every_read(init_dir):
    """Pairs with a shared query and pairs whose rows truncation cut apart (empty prompt; pair 6's chosen row is
    all reply, whose first token nothing predicts), in passes of 1, 3 and 4 rows (prompts and replies alike; and
    the prompts in one pass): rewards and every weight's gradient equal the plain path's up to float rounding."""
    all_reply = pd.DataFrame({"prompt": ["p0"], "chosen": ["a" * 20], "rejected": ["b"]})
    encoded = encode_pairs(models.build_tokenizer(), pd.concat([pairs_of_lengths(6), all_reply]), max_length=16)
    assert encoded.prompt[6] == 0 and encoded.chosen_response[6] == len(encoded.chosen[6])
    rows = np.array([5, 0, 3, 6, 1, 4, 2])
    for read in ("end_token", "end_token+logprob", "end_token+weighted_logprob"):
        model = RewardModel.from_policy(init_dir, 0, read)
        if model.token_weight is not None:  # away from its zero start, so the per-token weights differ
            torch.nn.init.normal_(model.token_weight.weight, std=0.1)
        signs = torch.tensor([1.0, -2.0, 0.5, 1.5, -1.0, 3.0, 0.7] * 2)  # (14,) any weighting of the 2B rewards

        def rewards_and_grads(batch):
            model.zero_grad()
            rewards = model(**batch)
            (signs * rewards).sum().backward()
            return rewards.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

        plain, plain_grads = rewards_and_grads(pair_batch(encoded, rows))
        batches = [shared_prompt_batch(encoded, rows, group_rows) for group_rows in (1, 3, 4)]
        batches.append({k: v for k, v in batches[1].items() if k != "prompt_groups"})  # the prompts in one pass
        for batch in batches:
            shared, shared_grads = rewards_and_grads(batch)
            torch.testing.assert_close(shared, plain, atol=1e-4, rtol=1e-5)
            assert shared_grads.keys() == plain_grads.keys()
            for name, grad in plain_grads.items():
                torch.testing.assert_close(shared_grads[name], grad, atol=1e-4, rtol=1e-4, msg=f"{read} {name}")


def test_training_with_the_prompt_shared_follows_the_same_trajectory(init_dir):
    pairs = pairs_of_lengths(12)
    cfg = RewardTrainConfig(epochs=2, batch_size=4, max_length=32)
    plain, tok, plain_metrics = train_reward_model(init_dir, pairs, cfg, seed=3)
    shared, _, shared_metrics = train_reward_model(init_dir, pairs, cfg.model_copy(update={"share_prompt": True}),
                                                   seed=3)
    assert shared_metrics["loss"] == pytest.approx(plain_metrics["loss"], rel=1e-4)
    weights = dict(shared.named_parameters())
    for name, p in plain.named_parameters():
        torch.testing.assert_close(weights[name], p, atol=1e-4, rtol=1e-4, msg=name)


def test_share_prompt_is_refused_with_the_losses_that_read_the_whole_rows():
    with pytest.raises(ValueError, match="share_prompt cannot be combined with lm_coef"):
        RewardTrainConfig(share_prompt=True, lm_coef=0.5)
    with pytest.raises(ValueError, match="share_prompt cannot be combined"):
        RewardTrainConfig(share_prompt=True, contrastive={"coef": 0.1})


# ---------------------------------------------------------------- fast voting batches as training does


def test_fast_voters_read_every_head_the_same_with_the_prompt_shared(init_dir):
    """SharedTrunkVoters over a shared-prompt batch: (2B, M) rewards and every weight's gradient equal the plain
    rows' for every read (the log-likelihood computed once for the M heads)."""
    from rlhf_core.reward.voting import SharedTrunkVoters

    encoded = encode_pairs(models.build_tokenizer(), pairs_of_lengths(6), max_length=16)
    rows = np.array([5, 0, 3, 1, 4, 2])
    for read in ("end_token", "end_token+logprob", "end_token+weighted_logprob"):
        voters = SharedTrunkVoters(RewardModel.from_policy(init_dir, 0, read), 3)
        if voters.token_weights is not None:  # away from the zero start, so each head weighs its tokens its own way
            torch.nn.init.normal_(voters.token_weights.weight, std=0.1)
        with torch.no_grad():
            voters.logprob_weights.copy_(torch.tensor([1.0, 0.5, -2.0]))
        signs = torch.randn(12, 3, generator=torch.Generator().manual_seed(0))  # any weighting of the (2B, M)

        def rewards_and_grads(batch):
            voters.zero_grad()
            rewards = voters(batch)
            (signs * rewards).sum().backward()
            return rewards.detach(), {n: p.grad.clone() for n, p in voters.named_parameters() if p.grad is not None}

        plain, plain_grads = rewards_and_grads(pair_batch(encoded, rows))
        assert plain.shape == (12, 3)
        # head m's column is the base model's read with head m's weights
        single = RewardModel.from_policy(init_dir, 0, read)
        with torch.no_grad():
            single.head().weight.copy_(voters.heads[1].weight)
            single.logprob_weight.fill_(0.5)
            if single.token_weight is not None:
                single.token_weight.weight[0] = voters.token_weights.weight[1]
                single.token_weight.bias.fill_(float(voters.token_weights.bias[1]))
            torch.testing.assert_close(single(**pair_batch(encoded, rows)), plain[:, 1], atol=1e-5, rtol=1e-5)
        shared, shared_grads = rewards_and_grads(shared_prompt_batch(encoded, rows, group_rows=4))
        torch.testing.assert_close(shared, plain, atol=1e-4, rtol=1e-5)
        assert shared_grads.keys() == plain_grads.keys()
        for name, grad in plain_grads.items():
            torch.testing.assert_close(shared_grads[name], grad, atol=1e-4, rtol=1e-4, msg=f"{read} {name}")


def test_fast_voting_trains_on_the_batches_its_config_asks_for(init_dir, monkeypatch):
    """voting.train's batching reaches the shared trunk: the rows of every step are `epoch_batches`' for the
    voting seed (after the heads' bootstrap weights are drawn), and with the prompt shared the votes follow the
    same trajectory as the plain rows."""
    from rlhf_core.config import VotingConfig
    from rlhf_core.reward import voting

    pairs = pairs_of_lengths(24)
    pairs["pair_id"] = [f"p{i}" for i in range(24)]
    train = RewardTrainConfig(epochs=2, batch_size=4, max_length=32, batching="length_grouped")
    cfg = VotingConfig(n_models=3, mode="fast", train=train)
    seen = []
    real_batch = voting.training_batch

    def recording_batch(encoded, rows, tcfg, device=None):
        seen.append(np.asarray(rows).tolist())
        return real_batch(encoded, rows, tcfg, device)

    monkeypatch.setattr(voting, "training_batch", recording_batch)
    plain, _ = voting.vote(init_dir, pairs, cfg, seed=7)
    rng = np.random.default_rng(7)
    rng.poisson(1.0, size=(24, 3))
    lengths = encode_pairs(models.build_tokenizer(), pairs, 32).lengths()
    expected = [b.tolist() for _ in range(2) for b in epoch_batches(24, train, rng, lengths)]
    assert seen[: len(expected)] == expected  # then the scoring batches
    assert any(len({int(lengths[i]) for i in b}) == 1 for b in expected)  # length-grouped, not a permutation cut

    random_rows = train.model_copy(update={"batching": "random"})
    plain, _ = voting.vote(init_dir, pairs, cfg.model_copy(update={"train": random_rows}), seed=7)
    shared, _ = voting.vote(init_dir, pairs, cfg.model_copy(
        update={"train": random_rows.model_copy(update={"share_prompt": True})}), seed=7)
    np.testing.assert_allclose(np.array(shared["diffs"].tolist()), np.array(plain["diffs"].tolist()),
                               atol=1e-3, rtol=1e-3)
    assert list(shared["bucket"]) == list(plain["bucket"])


def test_fast_voting_refuses_the_lm_loss_it_does_not_train():
    from rlhf_core.config import VotingConfig

    with pytest.raises(ValueError, match="voting.train.lm_coef 0"):
        VotingConfig(mode="fast", train=RewardTrainConfig(lm_coef=0.5))
    VotingConfig(mode="faithful", train=RewardTrainConfig(lm_coef=0.5))  # a faithful voter trains it
