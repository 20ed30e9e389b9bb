"""Measurements only the simulated world can make: agreement of pairs and policies with gold."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlhf_core.sim.world import gold_score


def gold_difference(prompts, chosen, rejected) -> np.ndarray:
    """gold(prompt, chosen) - gold(prompt, rejected) per pair."""
    return np.array([gold_score(p, c) - gold_score(p, r) for p, c, r in zip(prompts, chosen, rejected)])


def gold_agreement_of_pairs(pairs: pd.DataFrame) -> float:
    """Share of pairs whose `chosen` is strictly better under gold, among pairs gold does not tie."""
    diff = gold_difference(pairs["prompt"], pairs["chosen"], pairs["rejected"])
    decided = diff != 0
    return float((diff[decided] > 0).mean()) if decided.any() else float("nan")


def mean_gold(prompts, responses) -> float:
    return float(np.mean([gold_score(p, r) for p, r in zip(prompts, responses)]))


def gold_eval_pairs(policy_dir, prompts: list[str], seed: int, samples_per_prompt: int = 4,
                    max_new_tokens: int = 24) -> pd.DataFrame:
    """Held-out pairs labelled by gold: the policy's samples paired up per prompt, gold ties dropped."""
    from rlhf_core import models
    from rlhf_core.generation.sampler import sample_batch

    model, tokenizer = models.load_policy(policy_dir), models.load_tokenizer(policy_dir)
    queries = [models.format_query(tokenizer, p) for p in prompts]
    samples = [
        sample_batch(model, tokenizer, queries, max_new_tokens=max_new_tokens, temperature=1.0,
                     generator_seed=seed * 7919 + k).texts
        for k in range(samples_per_prompt)
    ]
    rows = []
    for i, prompt in enumerate(prompts):
        for k in range(0, samples_per_prompt - 1, 2):
            a, b = samples[k][i], samples[k + 1][i]
            ga, gb = gold_score(prompt, a), gold_score(prompt, b)
            if ga != gb:
                rows.append({"prompt": prompt, "chosen": a if ga > gb else b, "rejected": b if ga > gb else a})
    return pd.DataFrame(rows, columns=["prompt", "chosen", "rejected"])
