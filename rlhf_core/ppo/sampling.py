"""Rollout sampling whose random draws belong to the rows, not to the batch.

`sample_batch` (rlhf_core.generation.sampler) draws a whole batch from one random stream, so a row's
tokens depend on the rows sampled beside it. PPO's data-parallel ranks each sample their share of a
rollout, and must draw what one process draws: here each row has its own seeded stream, and sampling
is Gumbel-max (Gumbel 1954; Maddison et al. 2014): argmax(log p + g), g = -log(E), E ~ Exp(1) i.i.d.,
is an exact sample of p. The distribution is `sample_batch`'s (temperature, then nucleus filtering);
the rows are still generated in one batched call with a KV cache.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

from rlhf_core.generation.sampler import Rollout, decode_responses, response_mask_from_ids


class RowGumbelNoise(LogitsProcessor):
    """Adds each row's own Gumbel noise to its scores: (B, V) -> (B, V). Row i's t-th step draws the
    t-th V values of its stream seeded with seeds[i], whatever the batch; greedy decoding of the
    result samples softmax(scores). The streams live on the scores' device (a GPU's own generators),
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


@torch.no_grad()
def sample_rows(model: torch.nn.Module, tokenizer, queries: list[str], row_seeds: list[int], max_new_tokens: int,
                temperature: float, top_p: float) -> Rollout:
    """One response per query, row i drawn from its own stream seeded with row_seeds[i] (`RowGumbelNoise`),
    laid out as `sample_batch` lays out a rollout (left-padded queries, pad after the first eos)."""
    # left padding and no special tokens, as sample_batch encodes queries
    enc = tokenizer(queries, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt")
    device = next(model.parameters()).device
    query_ids, query_mask = enc.input_ids.to(device), enc.attention_mask.to(device)  # (B, Tq)
    warpers = [TemperatureLogitsWarper(temperature)] + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])
    out = model.generate(
        input_ids=query_ids,
        attention_mask=query_mask,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        use_cache=True,
        do_sample=False,  # the argmax of the noised scores is the sample
        repetition_penalty=1.0,  # nothing from the model's generation_config.json
        logits_processor=LogitsProcessorList([*warpers, RowGumbelNoise(row_seeds)]),
    )  # (B, Tq + Tr)
    response_ids = out[:, query_ids.shape[1] :]  # (B, Tr)
    response_mask = response_mask_from_ids(response_ids, tokenizer.eos_token_id)
    response_ids = response_ids.masked_fill(response_mask == 0, tokenizer.pad_token_id)
    return Rollout(query_ids, query_mask, response_ids, response_mask,
                   decode_responses(tokenizer, response_ids, response_mask))
