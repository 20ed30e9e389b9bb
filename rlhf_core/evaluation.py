"""Policy evaluation: a candidate against a baseline on held-out prompts.

Judged pairwise (both orders, see `rlhf_core.judge.protocol`), plus the numbers PPO monitoring
cares about: reward-model score, KL to the baseline, response length, and gold where known.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from rlhf_core.config import EvalConfig
from rlhf_core.generation.sampler import sample_batch
from rlhf_core.judge.protocol import judge_pair_with_rationale, summarize
from rlhf_core.models import format_query
from rlhf_core.ops import logprobs_from_logits
from rlhf_core.ppo.trainer import response_logits

ScoreFn = Callable[[list[str], list[str]], torch.Tensor]


@torch.no_grad()
def kl_to_baseline(candidate, baseline, tokenizer, prompts: list[str], max_new_tokens: int, seed: int) -> float:
    """Monte-Carlo KL(candidate || baseline): mean over sampled responses of sum_t log pi_c - log pi_b."""
    queries = [format_query(tokenizer, p) for p in prompts]
    sample = sample_batch(candidate, tokenizer, queries, max_new_tokens, temperature=1.0, generator_seed=seed)
    logp_c = logprobs_from_logits(response_logits(candidate, sample, 1.0), sample.response_ids)
    logp_b = logprobs_from_logits(response_logits(baseline, sample, 1.0), sample.response_ids)
    return float(((logp_c - logp_b) * sample.response_mask).sum(1).mean())


def compare_policies(candidate, baseline, tokenizer, prompts: pd.DataFrame, judge, cfg: EvalConfig, seed: int,
                     score_fn: ScoreFn | None = None, gold_fn: Callable[[str, str], float] | None = None,
                     names: tuple[str, str] = ("candidate", "baseline")) -> tuple[pd.DataFrame, dict]:
    """Return the judgements table (candidate as model_a) and metrics."""
    prompts = prompts.iloc[: cfg.n_prompts]
    texts = prompts["prompt"].tolist()
    queries = [format_query(tokenizer, p) for p in texts]
    resp = {
        name: sample_batch(model, tokenizer, queries, cfg.max_new_tokens, temperature=cfg.temperature,
                           generator_seed=seed).texts
        for name, model in zip(names, (candidate, baseline))
    }
    rows = []
    for pid, prompt, a, b in zip(prompts["prompt_id"], texts, resp[names[0]], resp[names[1]]):
        verdict, ab, ba, rationale = judge_pair_with_rationale(judge, prompt, a, b)
        rows.append({"prompt_id": pid, "model_a": names[0], "model_b": names[1], "response_a": a,
                     "response_b": b, "verdict": verdict, "verdict_ab": ab, "verdict_ba": ba,
                     "rationale": rationale})
    judgements = pd.DataFrame(rows)
    metrics = {f"judge/{k}": v for k, v in summarize(judgements["verdict"].tolist()).items()}
    metrics["judge/position_disagreement"] = float((judgements["verdict_ab"] != judgements["verdict_ba"]).mean())
    for name in names:
        metrics[f"{name}/response_length"] = float(np.mean([len(r) for r in resp[name]]))
        if score_fn is not None:
            metrics[f"{name}/reward"] = float(score_fn(texts, resp[name]).mean())
        if gold_fn is not None:
            metrics[f"{name}/gold"] = float(np.mean([gold_fn(p, r) for p, r in zip(texts, resp[name])]))
    metrics[f"{names[0]}/kl_to_{names[1]}"] = kl_to_baseline(candidate, baseline, tokenizer, texts,
                                                             cfg.max_new_tokens, seed)
    return judgements, metrics
