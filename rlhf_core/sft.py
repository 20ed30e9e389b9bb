"""Supervised fine-tuning of a causal LM on (prompt, response) demonstrations (the SFT stage, and
the pretraining-data loss that PPO-max mixes into the policy update).

One example = query tokens followed by response tokens and eos; the loss is the mean
next-token cross-entropy over response tokens and eos only (query positions carry label -100):

    loss = - 1/|R| * sum_{t in R} log pi(x_t | x_<t),   R = response + eos positions

Batches are drawn by shuffled epochs; AdamW; linear warmup then cosine decay to 10 % of lr.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import torch
from transformers import PreTrainedTokenizerBase

from rlhf_core.config import SFTConfig
from rlhf_core.models import format_query
from rlhf_core.ops import logprobs_from_logits
from rlhf_core.progress import progress_bar

IGNORE_INDEX = -100  # label of positions the loss skips (the query, padding)
WARMUP_FRACTION = 0.05  # of the steps, linear warmup from 0
MIN_LR_RATIO = 0.1  # cosine decays to lr * MIN_LR_RATIO
MAX_GRAD_NORM = 1.0


def encode_example(tokenizer: PreTrainedTokenizerBase, prompt: str, response: str) -> tuple[list[int], int]:
    """(token ids of query + response + eos, number of query tokens).

    Query and response are tokenized separately, so the boundary is exact for any tokenizer.
    """
    query_ids = tokenizer(format_query(tokenizer, prompt), add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    return query_ids + response_ids + [tokenizer.eos_token_id], len(query_ids)


def collate(examples: list[tuple[list[int], int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch: input_ids, attention_mask and labels (-100 on query and padding), (B, T)."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)  # (B, T)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)  # (B, T)
    for i, (ids, n_query) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        labels[i, n_query : len(ids)] = torch.tensor(ids[n_query:])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@torch.no_grad()
def response_logprobs(policy: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[str],
                      responses: list[str], batch_size: int = 64) -> np.ndarray:
    """(N,) sum over each response's tokens and eos of log pi(token | query, earlier tokens): the negative of
    what `train_sft` minimises, per example and summed rather than averaged (no gradients, eval mode)."""
    policy.eval()
    device = next(policy.parameters()).device
    out = []
    for i in range(0, len(prompts), batch_size):
        batch = collate([encode_example(tokenizer, p, r) for p, r in zip(prompts[i : i + batch_size],
                                                                         responses[i : i + batch_size])],
                        tokenizer.pad_token_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        labels = batch["labels"][:, 1:]  # (B, T-1): position t predicts token t+1
        logp = logprobs_from_logits(logits.float(), labels.clamp(min=0))  # (B, T-1); ignored positions masked next
        out.append((logp * (labels != IGNORE_INDEX)).sum(dim=1).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0)


def lr_factor(step: int, total_steps: int) -> float:
    """Multiplier of lr at `step`: linear warmup over WARMUP_FRACTION, then cosine to MIN_LR_RATIO."""
    warmup = max(1, int(WARMUP_FRACTION * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))


def _batches(n: int, batch_size: int, steps: int, generator: torch.Generator):
    """`steps` index batches drawn from shuffled epochs over n examples."""
    order: list[int] = []
    for _ in range(steps):
        while len(order) < batch_size:
            order += torch.randperm(n, generator=generator).tolist()
        batch, order = order[:batch_size], order[batch_size:]
        yield batch


def train_sft(
    policy: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    demos: pd.DataFrame,
    cfg: SFTConfig,
    seed: int,
    progress: bool = False,
) -> dict:
    """Train `policy` in place on demos (prompt, response); return metrics.

    Metrics: sft/loss_first (first step), sft/loss_final (mean of the last 10 % of steps),
    sft/steps, sft/n_demos, sft/seconds.
    """
    if len(demos) == 0:
        raise ValueError("train_sft needs at least one demonstration")
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    max_len = policy.config.max_position_embeddings
    examples = [encode_example(tokenizer, p, r) for p, r in zip(demos["prompt"], demos["response"])]
    too_long = [ids for ids, _ in examples if len(ids) > max_len]
    if too_long:
        raise ValueError(f"{len(too_long)} demonstrations exceed the policy's {max_len} positions")

    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg.steps))
    policy.train()
    losses: list[float] = []
    start = time.perf_counter()
    bar = progress_bar(total=cfg.steps, desc="sft", disable=not progress)
    for batch_idx in _batches(len(examples), cfg.batch_size, cfg.steps, generator):
        batch = collate([examples[i] for i in batch_idx], tokenizer.pad_token_id)
        loss = policy(**batch).loss  # mean CE over positions whose label is not -100
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    bar.close()
    policy.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return {
        "sft/loss_first": losses[0],
        "sft/loss_final": sum(tail) / len(tail),
        "sft/steps": cfg.steps,
        "sft/n_demos": len(examples),
        "sft/seconds": time.perf_counter() - start,
    }
