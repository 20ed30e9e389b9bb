"""The reward model: a backbone with a scalar head read at the end token, plus (optionally) the
log-likelihood of the response under the backbone's own LM head.

    r(x, y) = w . h_end                                                  read = "end_token"
    r(x, y) = w . h_end + a * sum_{t in y + eos} log p_theta(y_t | x, y_<t)   read = "end_token+logprob"
    r(x, y) = w . h_end + sum_{t in y + eos} (a + u . h_{t-1} + b) log p_theta(y_t | x, y_<t)
                                                                      read = "end_token+weighted_logprob"

h_end is the last hidden state at the appended eos of a decoder; on an encoder (BERT family:
all-MiniLM-L6-v2, ...) it is the pooled [CLS], [CLS] query [SEP] response [SEP], which is what its
`*ForSequenceClassification` reads, and only the "end_token" read applies. p_theta is the softmax of the hidden states
times the (tied) input embeddings, i.e. the LM head the backbone was trained with; `a` is a
learned scalar starting at 1. Both terms come from one forward pass of the same trunk. The weighted
read adds a learned per-token weight u . h_{t-1} + b (from the state that predicts token t; u, b start
at 0, i.e. at the plain read), so the model can count the tokens that carry correctness (the answer)
more than those that carry only wording (measured in docs/reward-modelling.md, section 1).

Why the second term: a policy's knowledge of what the right answer is sits in its next-token
prediction at the answer slot. The end-token head of a small backbone cannot reuse it (measured
on the simulated world: even trained on gold labels it reaches 0.58 on pairs that differ only in
arithmetic correctness, and its reward is explained 94 % by the answered number, 1 % by the
distance to the truth), while the response log-likelihood already ranks the right answer first
(0.87 on those pairs). Training both terms jointly keeps what the backbone knows and learns
what it does not (style). See docs/reward-modelling.md.

On disk the model is an ordinary `*ForSequenceClassification` directory (plain transformers
loads it and computes the end-token term); the log-likelihood weight is stored in its config
as `rlhf_reward = {"read": ..., "logprob_weight": a}`, read back by `RewardModel.load`.
Plain transformers finds the end as the last token that is not padding, so its end-token term is
ours only when the tokenizer's pad token is not its eos. With pad = eos (`models.load_tokenizer`
gives a tokenizer without a pad token that one) it reads the token before the response's eos:
load such a model with `RewardModel.load`, as every stage of the pipeline does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AutoModelForSequenceClassification, DynamicCache, PreTrainedTokenizerBase

from rlhf_core.models import classification_head, format_query, reward_model_from_policy, save_hf

Read = Literal["end_token", "end_token+logprob", "end_token+weighted_logprob"]
READS: tuple[str, ...] = ("end_token", "end_token+logprob", "end_token+weighted_logprob")
# a read of rewards off the trunk's states: (end (N, H), predictor (N, T', H), targets (N, T'), predicts (N, T'))
# -> rewards (N,) or (N, M); `RewardModel.read_rewards` is the model's own
ReadFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
CONFIG_KEY = "rlhf_reward"  # the entry of config.json that holds the read and the weight


def encode(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], responses: list[str], max_length: int
) -> dict[str, torch.Tensor]:
    """Token ids of `format_query(prompt) + response` with eos appended, right-padded (`encode_rows`, then
    `right_padded`).

    Returns:
        input_ids: (N, T) long, pad id after the eos.
        attention_mask: (N, T) long, 1 on real tokens.
        response_mask: (N, T) long, 1 on the response tokens and the eos (what the
            log-likelihood term sums over).
    """
    return right_padded(*encode_rows(tokenizer, prompts, responses, max_length), tokenizer.pad_token_id)


def encode_rows(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], responses: list[str], max_length: int
) -> tuple[list[list[int]], list[int]]:
    """Unpadded token ids of `format_query(prompt) + response` with eos appended, and each row's number of
    response tokens (eos included); `right_padded` turns them into a batch.

    Query and response are tokenized separately (so the boundary is exact for any tokenizer).
    A sequence longer than `max_length` (eos included) is truncated from the LEFT, so the end of
    the response and the eos the head reads are always kept.

    An encoder's tokenizer (BERT family: [CLS]/[SEP], no eos) gets [CLS] prompt [SEP] response [SEP]
    instead, the prompt without the query template (`_encoder_rows`).
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    if is_encoder_tokenizer(tokenizer):
        return _encoder_rows(tokenizer, prompts, responses, max_length)
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer needs an eos and a pad token")
    queries = tokenizer([format_query(tokenizer, p) for p in prompts], add_special_tokens=False)["input_ids"]
    answers = tokenizer(list(responses), add_special_tokens=False)["input_ids"]
    if any(not q for q in queries) or any(not a for a, r in zip(answers, responses) if r):
        raise ValueError(
            f"{type(tokenizer).__name__} turned a non-empty text into no tokens: wrong tokenizer class? "
            "(transformers 5 AutoTokenizer loads Qwen2Tokenizer for a qwen2 config.json whatever "
            "tokenizer_config.json says)"
        )
    ids, n_response = [], []
    for q, a in zip(queries, answers):
        full = (q + a + [tokenizer.eos_token_id])[-max_length:]
        ids.append(full)
        n_response.append(min(len(a) + 1, len(full)))
    return ids, n_response


def is_encoder_tokenizer(tokenizer: PreTrainedTokenizerBase) -> bool:
    """A BERT-style tokenizer ([CLS] and [SEP], no eos): its model reads the [CLS] position."""
    return tokenizer.eos_token_id is None and tokenizer.cls_token_id is not None and tokenizer.sep_token_id is not None


def _encoder_rows(tokenizer, prompts: list[str], responses: list[str], max_length: int
                  ) -> tuple[list[list[int]], list[int]]:
    """[CLS] query [SEP] response [SEP]; too long, the query loses tokens from its left first, then the
    response (the [CLS] the head reads and the final [SEP] always stay). Same outputs as `encode_rows`."""
    queries = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    answers = tokenizer(list(responses), add_special_tokens=False)["input_ids"]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids, n_response = [], []
    for q, a in zip(queries, answers):
        a = a[-(max_length - 3):] if max_length > 3 else []  # room for [CLS] and two [SEP]
        room = max(0, max_length - 3 - len(a))
        q = q[max(0, len(q) - room):]  # its last `room` tokens (all of it when it fits)
        ids.append([cls] + q + [sep] + a + [sep])
        n_response.append(len(a) + 1)
    return ids, n_response


def right_padded(ids: list[list[int]], n_response: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and response_mask (the last n_response[i] real tokens) of right-padded rows."""
    T = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), T), pad_id, dtype=torch.long)  # (N, T)
    attention_mask = torch.zeros((len(ids), T), dtype=torch.long)  # (N, T)
    response_mask = torch.zeros((len(ids), T), dtype=torch.long)  # (N, T)
    for i, (x, n) in enumerate(zip(ids, n_response)):
        input_ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
        attention_mask[i, : len(x)] = 1
        response_mask[i, len(x) - n : len(x)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask}


class RewardModel(nn.Module):
    """A `*ForSequenceClassification` model (trunk + `score` or `classifier` head) and the optional
    log-likelihood term."""

    def __init__(self, classifier: nn.Module, read: Read = "end_token", logprob_weight: float = 1.0):
        super().__init__()
        if read not in READS:
            raise ValueError(f"unknown reward read {read!r}; known: {READS}")
        self.classifier = classifier
        if (bias := self.head().bias) is not None:  # a linear `score` (decoders) or `classifier` (BERT family) head
            # a constant no loss here can see (each compares rewards): its gradient is 0 in one process, and on a
            # rank's shard float noise (~1e-9) that AdamW turns into full head_lr steps, shifting every reward
            bias.requires_grad_(False)
        if getattr(classifier, "score", None) is None and not self.is_encoder():
            # e.g. DistilBERT: `classifier` sits on its own pre_classifier over [CLS]; read as a decoder, the reward
            # would come from the last [SEP] and differ from what the saved model computes
            raise ValueError(f"{type(classifier).__name__} has a `classifier` head but no pooler over [CLS]: a reward "
                             "backbone must be a decoder (Qwen2, Llama, ...) or a BERT-family encoder with a pooler")
        if read != "end_token":
            self.require_tied_lm_head(f"reward read {read!r}", "set the read to 'end_token' (reward.train.read; "
                                      "voting.train.read for the voters)")
        self.read = read
        self.logprob_weight = nn.Parameter(torch.tensor(float(logprob_weight)), requires_grad=read != "end_token")
        self.token_weight = None  # the weighted read's u . h + b; zero at the start = the plain read
        if read == "end_token+weighted_logprob":
            self.token_weight = nn.Linear(classifier.config.hidden_size, 1)
            nn.init.zeros_(self.token_weight.weight)
            nn.init.zeros_(self.token_weight.bias)

    @property
    def config(self):
        return self.classifier.config

    def trunk(self) -> nn.Module:
        return self.classifier.base_model

    def head(self) -> nn.Linear:
        return classification_head(self.classifier)

    def is_encoder(self) -> bool:
        """BERT-family trunks carry a pooler over [CLS]; decoders have none."""
        return getattr(self.trunk(), "pooler", None) is not None

    def require_tied_lm_head(self, what: str, instead: str) -> None:
        """Refuse `what` (a read or loss that scores tokens with `response_logprob`) on a backbone where the input
        embedding is not the LM head: an encoder (its state at t has seen token t + 1) or a decoder with a separate
        lm_head (not loaded into a *ForSequenceClassification model, so the log-probs would be another matrix's)."""
        if self.is_encoder():
            raise ValueError(f"{what} needs a decoder's LM head; {type(self.classifier).__name__} is an encoder: "
                             f"{instead}")
        if not getattr(self.classifier.config, "tie_word_embeddings", False):
            raise ValueError(f"{what} needs a backbone whose LM head is its input embedding (tie_word_embeddings="
                             f"true); this one has a separate lm_head: {instead}")

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(N, T, H) last hidden states of the trunk (after its final norm)."""
        return self.trunk()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def rewards_from_hidden(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor],
                            read: ReadFunction | None = None) -> torch.Tensor:
        """(N,) rewards from the trunk's hidden states of right-padded rows; `read` replaces `read_rewards`
        (voting's shared-trunk mode reads M heads off one pass, (N, M))."""
        read = self.read_rewards if read is None else read
        return read(self.end_hidden(hidden, batch), hidden[:, :-1], batch["input_ids"][:, 1:],
                    batch["response_mask"][:, 1:].bool())

    def read_rewards(self, end: torch.Tensor, predictor: torch.Tensor, targets: torch.Tensor, predicts: torch.Tensor
                     ) -> torch.Tensor:
        """(N,) the read: the head at `end` (N, H), plus the log-likelihood of the response tokens `targets` (N, T')
        where `predicts` (N, T'), each predicted from the state `predictor` (N, T', H) at the same index."""
        rewards = self.head()(end).squeeze(-1)  # (N,)
        if self.read == "end_token":
            return rewards
        token_logp = self.token_logprob(predictor, targets, predicts)  # (N, T')
        if self.token_weight is None:
            return rewards + self.logprob_weight * token_logp.sum(dim=1)
        per_token = self.logprob_weight + self.token_weight(predictor).squeeze(-1)  # (N, T'): a + u . h_{t-1} + b
        return rewards + (per_token * token_logp).sum(dim=1)

    def end_hidden(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(N, H) what the head reads: the hidden state at each sequence's eos (right padding), or an
        encoder's pooled [CLS] (its pooler applied to position 0, as its *ForSequenceClassification does)."""
        if self.is_encoder():
            return self.trunk().pooler(hidden)
        end = batch["attention_mask"].sum(dim=1) - 1  # (N,)
        return hidden[torch.arange(len(hidden)), end]

    def set_attention_dropout(self, p: float) -> int:
        """Set the attention dropout of every attention layer (active in train mode only); returns how many.

        SimCSE's augmentation for the contrastive loss; the model's config, and so what is saved, is unchanged.
        """
        layers = [m for m in self.modules() if isinstance(getattr(m, "attention_dropout", None), float)]
        for m in layers:
            m.attention_dropout = p
        return len(layers)

    def response_logprob(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(N,) sum over response tokens and eos of log p(token | everything before), LM head = embeddings."""
        return self.response_token_logprob(hidden, batch).sum(dim=1)

    def response_token_logprob(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(N, T-1) log p(token t+1 | ..t) on response tokens and eos, 0 elsewhere."""
        return self.token_logprob(hidden[:, :-1], batch["input_ids"][:, 1:], batch["response_mask"][:, 1:].bool())

    def token_logprob(self, predictor: torch.Tensor, targets: torch.Tensor, predicts: torch.Tensor) -> torch.Tensor:
        """(N, T') log p(targets[:, t] | the state predictor[:, t]) where predicts (N, T'), 0 elsewhere; the LM head
        is the input embeddings.

        Only the predicting positions go through the LM head, (n, H) x (H, V): the prompt's and the padding's
        log-probs would be multiplied by 0 (issue 12: prompts are most of a pair's tokens).
        """
        embeddings = self.trunk().get_input_embeddings().weight  # (V, H)
        logits = predictor[predicts] @ embeddings.T  # (n, V)
        logp = torch.log_softmax(logits.float(), dim=-1)
        token_logp = logp.gather(-1, targets[predicts].unsqueeze(-1)).squeeze(-1)  # (n,)
        return torch.zeros(predicts.shape, dtype=token_logp.dtype, device=token_logp.device
                           ).masked_scatter(predicts, token_logp)

    def shared_prompt_rewards(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                              continuations: list[dict[str, torch.Tensor]],
                              prompt_groups: list[torch.Tensor] | None = None, read: ReadFunction | None = None
                              ) -> torch.Tensor:
        """(2B,) the rewards of B pairs, each pair's prompt run through the trunk once for its two replies.

        prompt_ids, prompt_mask: (B, P) the tokens each pair's chosen and rejected rows share at the start (its
        query), right-padded. prompt_groups: the prompt rows in groups of similar length, each run in its own pass
        cut to its longest prompt (default: one pass over all B, padded to P). continuations: the 2B rows'
        remaining tokens (reply and eos; chosen rows are 0..B-1, rejected B..2B-1) in groups of similar length,
        each a dict of input_ids, attention_mask, response_mask (n, C) right-padded, pair (n,), the prompt row it
        continues, and row (n,), its place in the output. A group runs the trunk over its continuations with its
        prompts' keys and values as the cache (their padding masked out). The result equals `forward` on the whole
        rows up to float rounding (tests/test_reward_batching.py), with each prompt's tokens run once instead of
        twice and each pass padded to its own longest (issue 12). `read` replaces `read_rewards` (voting's
        shared-trunk mode: (2B, M), one column per head).
        """
        if self.is_encoder():
            raise ValueError("share_prompt needs a decoder (a causal trunk with a key-value cache); "
                             f"{type(self.classifier).__name__} is an encoder: set reward.train.share_prompt (or "
                             "voting.train.share_prompt for the voters) false")
        trunk = self.trunk()
        prompt_length = prompt_mask.sum(dim=1)  # (B,)
        B, P = prompt_ids.shape
        groups = prompt_groups if prompt_groups is not None else [torch.arange(B, device=prompt_ids.device)]
        states, layer_keys, layer_values = [], [], []
        for rows in groups:
            length = prompt_length[rows]
            longest = max(1, int(length.max()))
            # no attention mask: with right padding no real token sees a pad, so attention takes its causal path
            out = trunk(input_ids=prompt_ids[rows, :longest], use_cache=True)
            states.append(out.last_hidden_state[torch.arange(len(rows), device=rows.device),
                                                (length - 1).clamp(min=0)])  # predicts the reply's first token
            # each layer's (n, heads, longest, d) keys and values, padded to P (masked out in the replies' pass)
            layer_keys.append([F.pad(layer.keys, (0, 0, 0, P - longest)) for layer in out.past_key_values.layers])
            layer_values.append([F.pad(layer.values, (0, 0, 0, P - longest)) for layer in out.past_key_values.layers])
        back = torch.argsort(torch.cat(list(groups)))  # the batch's order from the groups'
        last_state = torch.cat(states)[back]  # (B, H)
        keys_values = [(torch.cat(keys)[back], torch.cat(values)[back])
                       for keys, values in zip(zip(*layer_keys), zip(*layer_values))]
        read = self.read_rewards if read is None else read
        rewards, rows = [], []
        for group in continuations:
            pair, mask = group["pair"], group["attention_mask"]  # (n,), (n, C)
            C = mask.shape[1]
            cache = DynamicCache(ddp_cache_data=[(k[pair], v[pair]) for k, v in keys_values], config=self.config)
            hidden = trunk(input_ids=group["input_ids"], attention_mask=torch.cat([prompt_mask[pair], mask], dim=1),
                           position_ids=prompt_length[pair, None] + torch.arange(C, device=mask.device),
                           past_key_values=cache, use_cache=True,
                           cache_position=torch.arange(P, P + C, device=mask.device)).last_hidden_state  # (n, C, H)
            end = hidden[torch.arange(len(hidden), device=mask.device), mask.sum(dim=1) - 1]  # (n, H)
            predictor = torch.cat([last_state[pair, None], hidden[:, :-1]], dim=1)  # (n, C, H): t predicts token t
            predicts = group["response_mask"].bool()
            predicts[:, 0] &= prompt_length[pair] > 0  # an empty prompt predicts nothing (as a row's first token)
            rewards.append(read(end, predictor, group["input_ids"], predicts))
            rows.append(group["row"])
        return torch.cat(rewards)[torch.argsort(torch.cat(rows))]

    def weights_read_outside_their_module(self) -> list[nn.Parameter]:
        """The weights `forward` reads outside their own module's call: the tied input embeddings the logprob
        reads multiply by (`response_token_logprob`). ZeRO-3 gathers a partitioned weight only in its module's
        forward, so a ZeRO-3 trainer registers these with the model (deepspeed.zero.register_external_parameter)
        to have them gathered for the model's whole forward and backward."""
        return [] if self.read == "end_token" else [self.trunk().get_input_embeddings().weight]

    def forward(self, input_ids=None, attention_mask=None, response_mask=None, prompt_ids=None, prompt_mask=None,
                continuations=None, prompt_groups=None) -> torch.Tensor:
        """(N,) rewards of right-padded rows, or (2B,) of a shared-prompt batch (`shared_prompt_rewards`: given
        prompt_ids, prompt_mask, continuations and prompt_groups instead); one call either way, so ZeRO-3's hooks
        see it."""
        if continuations is not None:
            return self.shared_prompt_rewards(prompt_ids, prompt_mask, continuations, prompt_groups)
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask}
        return self.rewards_from_hidden(self.hidden_states(input_ids, attention_mask), batch)

    # ------------------------------------------------------------ building, saving, loading

    @classmethod
    def from_policy(cls, policy_path: str | Path, seed: int = 0, read: Read = "end_token") -> RewardModel:
        """The policy's trunk with a fresh head (drawn after seeding torch with `seed`) and weight 1."""
        return cls(reward_model_from_policy(policy_path, seed), read)

    def save(self, out_dir: str | Path, tokenizer: PreTrainedTokenizerBase) -> None:
        """A `*ForSequenceClassification` directory whose config also holds the read and its weights
        (the weighted read's u and b too: H + 1 numbers)."""
        spec = {"read": self.read, "logprob_weight": float(self.logprob_weight.item())}
        if self.token_weight is not None:
            spec["token_weight"] = self.token_weight.weight[0].tolist()
            spec["token_bias"] = float(self.token_weight.bias.item())
        setattr(self.classifier.config, CONFIG_KEY, spec)
        save_hf(self.classifier, tokenizer, out_dir)

    @classmethod
    def load(cls, path: str | Path) -> RewardModel:
        classifier = AutoModelForSequenceClassification.from_pretrained(str(path), dtype=torch.float32)
        spec = getattr(classifier.config, CONFIG_KEY, None) or {"read": "end_token", "logprob_weight": 1.0}
        model = cls(classifier, spec["read"], spec["logprob_weight"])
        if model.token_weight is not None:
            with torch.no_grad():
                model.token_weight.weight[0] = torch.tensor(spec["token_weight"])
                model.token_weight.bias.fill_(spec["token_bias"])
        return model.eval()


def forward_rewards(model: RewardModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(N,) rewards of an encoded batch."""
    return model(**batch)


@torch.no_grad()
def score_texts(
    model: RewardModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    responses: list[str],
    max_length: int = 96,
    batch_size: int = 64,
) -> torch.Tensor:
    """(N,) float rewards of each (prompt, response) on the CPU, in eval mode, without gradients; the
    batches go to the model's device."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(prompts), batch_size):
        batch = encode(tokenizer, prompts[i : i + batch_size], responses[i : i + batch_size], max_length)
        out.append(forward_rewards(model, {k: v.to(device) for k, v in batch.items()}).float().cpu())
    return torch.cat(out) if out else torch.zeros(0)
