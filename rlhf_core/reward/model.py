"""Tokenization and scoring for reward models (a backbone with a scalar head read at the end token).

A pair's text is `format_query(prompt) + response + eos`. Sequences are right-padded with the
pad id, so a `*ForSequenceClassification` head, which reads the last non-pad token, reads the
appended eos: the reward of the whole response. Where pad = eos (most pretrained chat tokenizers,
e.g. SmolLM2's `<|im_end|>`), it reads the last response token instead, the same way for every
text, so rewards stay comparable.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from rlhf_core.models import format_query


def encode(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], responses: list[str], max_length: int
) -> dict[str, torch.Tensor]:
    """Token ids of `format_query(prompt) + response` with eos appended, right-padded.

    A sequence longer than `max_length` (eos included) is truncated from the LEFT, so the end
    of the response and the eos the head reads are always kept. Padded to the longest sequence
    in the batch (at most `max_length`).

    Returns:
        input_ids: (N, T) long, pad id after the eos.
        attention_mask: (N, T) long, 1 on real tokens.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer needs an eos and a pad token")
    texts = [format_query(tokenizer, p) + r for p, r in zip(prompts, responses)]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    if any(not x for x, t in zip(ids, texts) if t):
        raise ValueError(
            f"{type(tokenizer).__name__} turned a non-empty text into no tokens: wrong tokenizer class? "
            "(transformers 5 AutoTokenizer loads Qwen2Tokenizer for a qwen2 config.json whatever "
            "tokenizer_config.json says)"
        )
    ids = [(x + [tokenizer.eos_token_id])[-max_length:] for x in ids]
    T = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), T), tokenizer.pad_token_id, dtype=torch.long)  # (N, T)
    attention_mask = torch.zeros((len(ids), T), dtype=torch.long)  # (N, T)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
        attention_mask[i, : len(x)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def forward_rewards(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(N,) rewards: the scalar head at the last non-pad token of each sequence."""
    return model(**batch).logits[:, 0]  # (N, 1) -> (N,)


@torch.no_grad()
def score_texts(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    responses: list[str],
    max_length: int = 96,
    batch_size: int = 64,
) -> torch.Tensor:
    """(N,) float rewards of each (prompt, response), in eval mode, without gradients."""
    model.eval()
    out = []
    for i in range(0, len(prompts), batch_size):
        batch = encode(tokenizer, prompts[i : i + batch_size], responses[i : i + batch_size], max_length)
        out.append(forward_rewards(model, batch).float())
    return torch.cat(out) if out else torch.zeros(0)
