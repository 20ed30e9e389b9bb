"""One model's part of the generation plan: every strategy (sampling parameters, n) over a set of prompts.

`generate_responses` is the transformers backend for one model and one set of prompts (one shard);
`shards.generate_plan_shards` runs it for every generator over fixed prompt shards. Both the
in-process stage and the multi-process worker go through the shards, so the rows never depend on
the number of processes.
"""

from __future__ import annotations

import hashlib
import json
import time

import pandas as pd

from rlhf_core.config import SamplingStrategy
from rlhf_core.generation.sampler import sample_batch
from rlhf_core.models import format_query

ROW_COLUMNS = ["prompt_id", "response_id", "prompt", "response", "generator", "strategy"]


class GenerationInputError(ValueError):
    """A prompt, model or setting the plan cannot generate with; the message names it and what to change."""


def response_id(prompt_id: str, generator: str, strategy: str, k: int, text: str) -> str:
    """Id of one response: the k-th sample of `generator` ("name:digest of its weights") under `strategy` (its
    sampling parameters as `strategy_json`), and the text it wrote. Two models never collide, and responses
    generated again with other parameters, another seed or other code get other ids even under the same names: a
    label joined by id (a score table carries no text to compare) always names the text the annotator saw."""
    key = json.dumps([prompt_id, generator, strategy, k, text], ensure_ascii=False)
    return "r" + hashlib.sha256(key.encode()).hexdigest()[:16]


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from its parts (run seed, generator, shard, strategy, k, ...): the same on every machine,
    whatever the number of processes or the order the work runs in."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def strategy_json(strategy: SamplingStrategy) -> str:
    """The `strategy` column: the sampling parameters as sorted JSON."""
    return json.dumps(strategy.model_dump(), sort_keys=True)


def context_length(config) -> int | None:
    """The positions a model attends over, under the names transformers configs give it; None if unstated."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_prompts(prompts: pd.DataFrame, tokenizer, max_positions: int | None, max_new_tokens: int,
                  model: str = "the model") -> None:
    """Fail before generating anything: empty prompts, and queries that leave no room to answer.

    `max_positions` None (a config that states no context length) skips the length check.
    """
    for i, (pid, text) in enumerate(zip(prompts["prompt_id"], prompts["prompt"])):
        if not isinstance(text, str) or not text.strip():
            raise GenerationInputError(f"row {i} (prompt_id {pid}): empty prompt; remove it from the prompt set")
        if max_positions is None:
            continue
        n = len(tokenizer(format_query(tokenizer, text), add_special_tokens=False)["input_ids"])
        if n + max_new_tokens > max_positions:
            raise GenerationInputError(
                f"row {i} (prompt_id {pid}): query is {n} tokens + max_new_tokens {max_new_tokens} > "
                f"{model}'s {max_positions} positions; shorten the prompt or lower max_new_tokens"
            )


def dedupe(generated: pd.DataFrame) -> pd.DataFrame:
    """Identical responses to one prompt are kept once: the smallest response_id survives."""
    ordered = generated.sort_values(["prompt_id", "response_id"])
    return ordered.drop_duplicates(["prompt_id", "response"]).reset_index(drop=True)


def generate_responses(model, tokenizer, prompts: pd.DataFrame, strategies, generator: str, batch_size: int,
                       seed: int, bar=None) -> tuple[pd.DataFrame, dict]:
    """Return the responses table (one row per distinct response) and a report (tokens, seconds, counts).

    Prompts are sorted by length so each batch pads little. Batch b of the k-th sample of a strategy
    draws with `stable_seed(seed, strategy, k, b)`: the rows depend only on the prompts, the model,
    the strategies, batch_size and seed. `bar` (a tqdm) advances by one per response.
    """
    longest = max((s.max_new_tokens for s in strategies), default=0)
    check_prompts(prompts, tokenizer, context_length(model.config), longest, generator)
    model.eval()
    order = prompts.assign(_len=prompts["prompt"].str.len()).sort_values(["_len", "prompt_id"], kind="stable")
    batches = [order.iloc[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rows, n_tokens, start = [], 0, time.time()
    for strategy in strategies:
        for k in range(strategy.n):
            for b, batch in enumerate(batches):
                rollout = sample_batch(
                    model, tokenizer, [format_query(tokenizer, p) for p in batch["prompt"]],
                    max_new_tokens=strategy.max_new_tokens, temperature=strategy.temperature, top_p=strategy.top_p,
                    top_k=strategy.top_k, repetition_penalty=strategy.repetition_penalty,
                    generator_seed=stable_seed(seed, strategy.name, k, b),
                )
                n_tokens += int(rollout.response_mask.sum())
                rows += [response_row(p, text, generator, strategy, k) for p, text in zip(batch.itertuples(), rollout.texts)]
                if bar is not None:
                    bar.update(len(batch))
    generated = pd.DataFrame(rows, columns=ROW_COLUMNS)
    return dedupe(generated), generation_report(generated, n_tokens, time.time() - start)


def response_row(prompt, text: str, generator: str, strategy: SamplingStrategy, k: int) -> dict:
    """One row of the responses table; `prompt` has .prompt_id and .prompt (an itertuples row)."""
    params = strategy_json(strategy)
    return {"prompt_id": prompt.prompt_id, "response_id": response_id(prompt.prompt_id, generator, params, k, text),
            "prompt": prompt.prompt, "response": text, "generator": generator, "strategy": params}


def generation_report(generated: pd.DataFrame, n_tokens: int, seconds: float) -> dict:
    """Counts before and after `dedupe`, tokens and time of one call (a shard of one generator)."""
    n_responses = len(generated.drop_duplicates(["prompt_id", "response"]))
    return {"n_generated": len(generated), "duplicates_removed": len(generated) - n_responses,
            "n_responses": n_responses, "tokens": n_tokens, "seconds": seconds,
            "tokens_per_second": n_tokens / max(seconds, 1e-9)}
