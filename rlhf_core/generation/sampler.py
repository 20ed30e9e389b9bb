"""Batched sampling with a KV cache: queries in, left-padded query ids and masked responses out.

One function serves both the generation stage (responses to annotate) and PPO rollouts, so the
two always sample the same way. Layout of a rollout, per row:

    query_ids    [pad pad q q q q]     left-padded, so every response starts at the same column
    response_ids [r r r eos pad pad]   everything after the first eos is pad
    response_mask[1 1 1 1   0   0  ]   1 up to and including the first eos
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers import (LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerBase, TemperatureLogitsWarper,
                          TopKLogitsWarper, TopPLogitsWarper)


@dataclass
class Rollout:
    query_ids: torch.Tensor  # (B, Tq) left-padded
    query_mask: torch.Tensor  # (B, Tq) 1 on query tokens
    response_ids: torch.Tensor  # (B, Tr) pad after the first eos; Tr <= max_new_tokens
    response_mask: torch.Tensor  # (B, Tr) 1 up to and including the first eos
    texts: list[str]  # decoded responses, without eos / pad / special tokens
    logits: torch.Tensor | None = None  # (B, Tr, V) the model's raw logits at each step (`return_logits`)


def response_mask_from_ids(response_ids: torch.Tensor, eos_token_id: int | list[int]) -> torch.Tensor:
    """1 up to and including the first eos (any of them, when a list) of each row, 0 after: (B, Tr) -> (B, Tr) long.

    Computed from eos, not from `!= pad`, because many tokenizers use eos as pad.
    """
    stop = torch.tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id], device=response_ids.device)
    is_eos = torch.isin(response_ids, stop).long()  # (B, Tr)
    eos_before = is_eos.cumsum(1) - is_eos  # number of eos strictly before each position
    return (eos_before == 0).long()


def stop_token_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's eos and the model's own end-of-turn tokens (generation_config.eos_token_id: e.g. Gemma-2-it's
    <end_of_turn>, Phi-3's <|end|>), which vLLM stops at too; passing the tokenizer's eos alone replaced them."""
    own = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    own = [] if own is None else own if isinstance(own, list) else [own]
    return sorted({tokenizer.eos_token_id, *own})


def decode_responses(
    tokenizer: PreTrainedTokenizerBase, response_ids: torch.Tensor, response_mask: torch.Tensor
) -> list[str]:
    """Decode each row's valid tokens; eos, pad and other special tokens are skipped."""
    return [
        tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
        for ids, mask in zip(response_ids, response_mask)
    ]


class RepetitionPenalty(LogitsProcessor):
    """CTRL repetition penalty (Keskar et al., 2019) on every token already in the row.

    A token seen in the query or in the response so far gets its logit divided by `penalty` when
    positive and multiplied by it when negative, so `penalty` > 1 makes repeats less likely and 1
    changes nothing. Unlike transformers' own processor it skips left padding: with pad == eos, a
    padded row would otherwise have eos penalised, and a row's output would depend on its batch.
    """

    def __init__(self, penalty: float, query_mask: torch.Tensor):
        self.penalty = penalty
        self.query_mask = query_mask  # (B, Tq) 1 on real query tokens, 0 on left padding

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # input_ids (B, Tq + t): the query then the t tokens generated so far; scores (B, V)
        n_generated = input_ids.shape[1] - self.query_mask.shape[1]
        real = torch.cat([self.query_mask, self.query_mask.new_ones(len(input_ids), n_generated)], 1)
        seen = torch.zeros_like(scores).scatter_add_(1, input_ids, real.to(scores.dtype)) > 0  # (B, V)
        penalised = torch.where(scores > 0, scores / self.penalty, scores * self.penalty)
        return torch.where(seen, penalised, scores)


class RowGumbelNoise(LogitsProcessor):
    """Adds each row's own Gumbel noise to its scores: (B, V) -> (B, V). Gumbel-max (Gumbel 1954; Maddison
    et al. 2014): argmax(log p + g), g = -log(E), E ~ Exp(1) i.i.d., is an exact sample of p. Row i's t-th
    step draws the t-th V values of its stream seeded with seeds[i], whatever the batch; greedy decoding
    of the result samples softmax(scores). The streams live on the scores' device (a GPU's own generators),
    so no noise crosses from the CPU at every step."""

    def __init__(self, seeds: list[int]):
        self.seeds = seeds
        self.generators: list[torch.Generator] | None = None  # made at the first step, on the scores' device

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        device, vocab = scores.device, scores.shape[1]
        if self.generators is None:
            self.generators = [torch.Generator(device).manual_seed(s) for s in self.seeds]
        noise = torch.stack([-torch.empty(vocab, device=device).exponential_(generator=g).log()
                             for g in self.generators])  # (B, V)
        return scores + noise.to(scores.dtype)  # a filtered token (-inf) stays impossible


def _generate_kwargs(temperature: float, top_p: float, top_k: int) -> dict:
    """Sampling switches for model.generate; temperature 0 means greedy."""
    if temperature == 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k}


@torch.no_grad()
def sample_batch(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    queries: list[str],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    generator_seed: int | None = None,
    repetition_penalty: float = 1.0,
    row_seeds: list[int] | None = None,
    return_logits: bool = False,
) -> Rollout:
    """Sample one response per query (KV cache). Deterministic for a given `generator_seed`.

    With a seed, sampling runs inside a forked RNG: it neither depends on nor disturbs the
    caller's global torch RNG. Without one it draws from (and advances) the global RNG.
    `top_k=0` means no top-k filter. `repetition_penalty` is the CTRL penalty (`RepetitionPenalty`);
    a model's own generation_config.json cannot add another one.

    `row_seeds` (one per query): row i draws from its own stream seeded with row_seeds[i], by Gumbel-max
    (`RowGumbelNoise`), so a row's tokens do not depend on the rows beside it: PPO's data-parallel ranks
    each sample their share of a rollout and together draw what one process draws. Same distribution.

    `return_logits`: keep the model's logits of every step (before temperature, top-k/p or noise), so PPO
    takes the policy's log-probs from generation instead of a second forward pass over the same tokens.
    """
    # Left padding whatever the tokenizer's default: generation appends at the right edge.
    # add_special_tokens=False: many tokenizers would otherwise append eos (or prepend bos) to a query.
    enc = tokenizer(
        queries, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt"
    )
    if (enc.attention_mask.sum(1) == 0).any():
        raise ValueError(f"a query encodes to no tokens; check the tokenizer ({type(tokenizer).__name__})")
    device = next(model.parameters()).device
    query_ids, query_mask = enc.input_ids.to(device), enc.attention_mask.to(device)  # (B, Tq)
    processors = LogitsProcessorList()
    if repetition_penalty != 1.0:
        processors.append(RepetitionPenalty(repetition_penalty, query_mask))
    generate_kwargs = _generate_kwargs(temperature, top_p, top_k)
    if row_seeds is not None and temperature > 0:  # sample = argmax of the warped scores + each row's noise
        processors.append(TemperatureLogitsWarper(temperature))
        processors.extend([TopKLogitsWarper(top_k)] if top_k > 0 else [])
        processors.extend([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])
        processors.append(RowGumbelNoise(row_seeds))
        generate_kwargs = {"do_sample": False}

    stop_ids = stop_token_ids(model, tokenizer)
    seeded = generator_seed is not None
    devices = [] if device.type == "cpu" else [device]
    with torch.random.fork_rng(devices=devices) if seeded else contextlib.nullcontext():
        if seeded:
            torch.manual_seed(generator_seed)
        out = model.generate(
            input_ids=query_ids,
            attention_mask=query_mask,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=stop_ids,
            use_cache=True,
            repetition_penalty=1.0,  # transformers' own (pad-blind) penalty off; ours is in `processors`
            logits_processor=processors,
            output_logits=return_logits,
            return_dict_in_generate=True,
            **generate_kwargs,
        )
    logits = torch.stack(out.logits, dim=1) if return_logits else None  # (B, Tr, V)

    response_ids = out.sequences[:, query_ids.shape[1] :]  # (B, Tr)
    response_mask = response_mask_from_ids(response_ids, stop_ids)
    response_ids = response_ids.masked_fill(response_mask == 0, tokenizer.pad_token_id)
    texts = decode_responses(tokenizer, response_ids, response_mask)
    return Rollout(query_ids, query_mask, response_ids, response_mask, texts, logits)
