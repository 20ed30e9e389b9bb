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


def generate_responses(model, tokenizer, prompts: pd.DataFrame, strategies, generator: str, batch_size: int,
                       seed: int, progress: bool = True) -> tuple[pd.DataFrame, dict]:
    """Return the responses table (one row per response) and a report with tokens/s.

    Prompts are sorted by length so each batch pads little; each batch has its own seed, so the
    output does not depend on how many batches ran before (a resumed run gives the same rows).
    """
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
    responses = pd.DataFrame(rows).sort_values(["prompt_id", "response_id"]).reset_index(drop=True)
    n_distinct = responses.groupby("prompt_id")["response"].nunique().mean() if len(responses) else 0.0
    report = {
        "n_responses": len(responses),
        "tokens": n_tokens,
        "tokens_per_second": n_tokens / max(seconds, 1e-9),
        "mean_distinct_per_prompt": float(n_distinct),
        "empty_share": float((responses["response"].str.strip() == "").mean()) if len(responses) else 0.0,
    }
    return responses, report


def _strategy_json(strategy: SamplingStrategy) -> str:
    return json.dumps(strategy.model_dump(), sort_keys=True)
