"""Policy evaluation: a candidate against a baseline on held-out prompts.

Judged pairwise (both orders, see `rlhf_core.judge.protocol`), plus the numbers PPO monitoring
cares about: reward-model score, KL to the baseline, response length, and gold where known.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from rlhf_core.config import EvalConfig
from rlhf_core.generation.sampler import sample_batch
from rlhf_core.judge.protocol import Judge, judge_pairs
from rlhf_core.judge.stats import agreement, verdict_metrics
from rlhf_core.models import format_query
from rlhf_core.ops import logprobs_from_logits
from rlhf_core.ppo.trainer import response_logits

ScoreFn = Callable[[list[str], list[str]], torch.Tensor]


@torch.no_grad()
def kl_to_baseline(candidate, baseline, tokenizer, prompts: list[str], max_new_tokens: int, seed: int) -> float:
    """Monte-Carlo KL(candidate || baseline): mean over sampled responses of sum_t log pi_c - log pi_b.
    The two policies may sit on different devices (a policy trained on the GPU, its reference loaded on the CPU)."""
    queries = [format_query(tokenizer, p) for p in prompts]
    sample = sample_batch(candidate, tokenizer, queries, max_new_tokens, temperature=1.0, generator_seed=seed)
    logp_c = logprobs_from_logits(response_logits(candidate, sample, 1.0), sample.response_ids)
    device = next(baseline.parameters()).device
    on_baseline = dataclasses.replace(sample, **{name: getattr(sample, name).to(device) for name in
                                                 ("query_ids", "query_mask", "response_ids", "response_mask")})
    logp_b = logprobs_from_logits(response_logits(baseline, on_baseline, 1.0), on_baseline.response_ids)
    return float(((logp_c - logp_b.to(logp_c.device)) * sample.response_mask).sum(1).mean())


def compare_policies(candidate, baseline, tokenizer, prompts: pd.DataFrame, judge: Judge, cfg: EvalConfig, seed: int,
                     score_fn: ScoreFn | None = None, gold_fn: Callable[[str, str], float] | None = None,
                     names: tuple[str, str] = ("candidate", "baseline"), concurrency: int = 1,
                     gold_judge: Judge | None = None) -> tuple[pd.DataFrame, dict]:
    """Return the judgements table (candidate as model_a; both orders, rationales, parse status) and metrics.

    `gold_judge`: a second judge of the same pairs (the simulated world's oracle); its verdicts go in
    `verdict_gold` and the judge's agreement with it in `judge/agreement_with_gold`.
    """
    prompts = prompts.iloc[: cfg.n_prompts]
    texts = prompts["prompt"].tolist()
    queries = [format_query(tokenizer, p) for p in texts]
    resp = {
        name: sample_batch(model, tokenizer, queries, cfg.max_new_tokens, temperature=cfg.temperature,
                           generator_seed=seed).texts
        for name, model in zip(names, (candidate, baseline))
    }
    pairs = list(zip(texts, resp[names[0]], resp[names[1]]))
    judgements = pd.DataFrame([
        {"prompt_id": pid, "model_a": names[0], "model_b": names[1], "response_a": a, "response_b": b} | row
        for pid, (_, a, b), row in zip(prompts["prompt_id"], pairs, judge_pairs(judge, pairs, concurrency))
    ])
    metrics = judgement_metrics(judgements, cfg.bootstrap_samples, seed)
    if gold_judge is not None:
        judgements["verdict_gold"] = [row["verdict"] for row in judge_pairs(gold_judge, pairs)]
        metrics["judge/agreement_with_gold"] = agreement(judgements["verdict"].tolist(),
                                                         judgements["verdict_gold"].tolist())
        metrics |= {f"gold_judge/{k}": v for k, v in verdict_metrics(judgements["verdict_gold"].tolist(),
                                                                     cfg.bootstrap_samples, seed).items()}
    for name in names:
        metrics[f"{name}/response_length"] = float(np.mean([len(r) for r in resp[name]]))
        if score_fn is not None:
            metrics[f"{name}/reward"] = float(score_fn(texts, resp[name]).mean())
        if gold_fn is not None:
            metrics[f"{name}/gold"] = float(np.mean([gold_fn(p, r) for p, r in zip(texts, resp[name])]))
    metrics[f"{names[0]}/kl_to_{names[1]}"] = kl_to_baseline(candidate, baseline, tokenizer, texts,
                                                             cfg.max_new_tokens, seed)
    return judgements, metrics


def judgement_metrics(judgements: pd.DataFrame, n_boot: int, seed: int) -> dict[str, float]:
    """judge/{win,tie,lose}_rate with bootstrap 95 % bounds (_lo, _hi), n, the share of pairs whose two orders
    disagree, and the share of single-order replies that parsed only by a fallback or not at all."""
    metrics = {f"judge/{k}": v for k, v in verdict_metrics(judgements["verdict"].tolist(), n_boot, seed).items()}
    metrics["judge/position_disagreement"] = float((judgements["verdict_ab"] != judgements["verdict_ba"]).mean())
    statuses = pd.concat([judgements["parse_status_ab"], judgements["parse_status_ba"]])
    for status in ("fallback", "unparsed"):
        metrics[f"judge/{status}_share"] = float((statuses == status).mean())
    return metrics
