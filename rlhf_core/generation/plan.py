"""A generation plan: every strategy (sampling parameters, n) over every prompt, batched."""

from __future__ import annotations

import hashlib
import json
import time

import pandas as pd
from tqdm.auto import tqdm

from rlhf_core.config import SamplingStrategy
from rlhf_core.generation.sampler import sample_batch
from rlhf_core.models import format_query


def response_id(prompt_id: str, generator: str, strategy: str, k: int) -> str:
    return "r" + hashlib.sha256(f"{prompt_id}|{generator}|{strategy}|{k}".encode()).hexdigest()[:16]


class GenerationInputError(ValueError):
    """A prompt the plan cannot generate for; the message names the row and what to change."""


def check_prompts(prompts: pd.DataFrame, tokenizer, max_positions: int, max_new_tokens: int) -> None:
    """Fail before generating anything: empty prompts, and queries that leave no room to answer."""
    for i, (pid, text) in enumerate(zip(prompts["prompt_id"], prompts["prompt"])):
        if not isinstance(text, str) or not text.strip():
            raise GenerationInputError(f"row {i} (prompt_id {pid}): empty prompt; remove it from the prompt set")
        n = len(tokenizer(format_query(tokenizer, text), add_special_tokens=False)["input_ids"])
        if n + max_new_tokens > max_positions:
            raise GenerationInputError(
                f"row {i} (prompt_id {pid}): query is {n} tokens + max_new_tokens {max_new_tokens} > the "
                f"model's {max_positions} positions; shorten the prompt or lower max_new_tokens"
            )


def generate_responses(model, tokenizer, prompts: pd.DataFrame, strategies, generator: str, batch_size: int,
                       seed: int, progress: bool = True) -> tuple[pd.DataFrame, dict]:
    """Return the responses table (one row per distinct response) and a report with tokens/s.

    Prompts are sorted by length so each batch pads little; each batch has its own seed, so the
    output does not depend on how many batches ran before (a resumed run gives the same rows).
    Identical responses to one prompt are kept once (the smallest response_id).
    """
    longest = max((s.max_new_tokens for s in strategies), default=0)
    check_prompts(prompts, tokenizer, model.config.max_position_embeddings, longest)
    model.eval()
    order = prompts.assign(_len=prompts["prompt"].str.len()).sort_values(["_len", "prompt_id"], kind="stable")
    rows, n_tokens, start = [], 0, time.time()
    jobs = [(s, k) for s in strategies for k in range(s.n)]
    batches = [order.iloc[i : i + batch_size] for i in range(0, len(order), batch_size)]
    bar = tqdm(total=len(jobs) * len(batches), desc="generate", disable=not progress)
    for j, (strategy, k) in enumerate(jobs):
        for b, batch in enumerate(batches):
            queries = [format_query(tokenizer, p) for p in batch["prompt"]]
            rollout = sample_batch(
                model, tokenizer, queries, max_new_tokens=strategy.max_new_tokens,
                temperature=strategy.temperature, top_p=strategy.top_p, top_k=strategy.top_k,
                generator_seed=seed * 1_000_003 + j * 10_007 + b,
            )
            n_tokens += int(rollout.response_mask.sum())
            for (_, p), text in zip(batch.iterrows(), rollout.texts):
                rows.append({
                    "prompt_id": p.prompt_id,
                    "response_id": response_id(p.prompt_id, generator, strategy.name, k),
                    "prompt": p.prompt,
                    "response": text,
                    "generator": generator,
                    "strategy": _strategy_json(strategy),
                })
            bar.update(1)
    bar.close()
    seconds = time.time() - start
    generated = pd.DataFrame(rows).sort_values(["prompt_id", "response_id"])
    responses = generated.drop_duplicates(["prompt_id", "response"]).reset_index(drop=True)
    n_distinct = responses.groupby("prompt_id")["response"].nunique().mean() if len(responses) else 0.0
    report = {
        "n_generated": len(generated),
        "duplicates_removed": len(generated) - len(responses),
        "n_responses": len(responses),
        "tokens": n_tokens,
        "tokens_per_second": n_tokens / max(seconds, 1e-9),
        "mean_distinct_per_prompt": float(n_distinct),
        "empty_share": float((responses["response"].str.strip() == "").mean()) if len(responses) else 0.0,
    }
    return responses, report


def _strategy_json(strategy: SamplingStrategy) -> str:
    return json.dumps(strategy.model_dump(), sort_keys=True)
