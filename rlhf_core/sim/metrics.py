"""Measurements only the simulated world can make: agreement of pairs, votes and reward models with gold.

Gold ties: one convention everywhere. A pair whose two responses have equal gold cannot be right
or wrong, so every gold-agreement figure here is taken over the pairs gold does NOT tie, and the
names of the metrics built from them say so (`..._excl_gold_ties`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from rlhf_core.sim.world import GOLD_TIE, gold_components, gold_score, parse_prompt

PAIR_TYPES = ("correctness_only", "style_only", "style_agrees", "style_conflicts", "other")


def gold_difference(prompts, chosen, rejected) -> np.ndarray:
    """gold(prompt, chosen) - gold(prompt, rejected) per pair; exactly 0 for a tie (closer than GOLD_TIE)."""
    diff = np.array([gold_score(p, c) - gold_score(p, r) for p, c, r in zip(prompts, chosen, rejected)], dtype=float)
    diff[np.abs(diff) < GOLD_TIE] = 0.0
    return diff


def gold_agreement_of_pairs(pairs: pd.DataFrame) -> float:
    """Share of pairs whose `chosen` is strictly better under gold, among pairs gold does not tie."""
    diff = gold_difference(pairs["prompt"], pairs["chosen"], pairs["rejected"])
    decided = diff != 0
    return float((diff[decided] > 0).mean()) if decided.any() else float("nan")


def pair_type(prompt: str, a: str, b: str) -> str:
    """What separates two responses under gold: correctness only, style only, both (agreeing or
    conflicting in direction), or neither (garbage/length terms only, or nothing)."""
    ga, gb = gold_components(prompt, a), gold_components(prompt, b)
    d_correct, d_style = ga["correctness"] - gb["correctness"], ga["style"] - gb["style"]
    if d_correct and not d_style:
        return "correctness_only"
    if d_style and not d_correct:
        return "style_only"
    if d_correct and d_style:
        return "style_agrees" if (d_correct > 0) == (d_style > 0) else "style_conflicts"
    return "other"


def pair_types(pairs: pd.DataFrame) -> np.ndarray:
    return np.array([pair_type(p, c, r) for p, c, r in zip(pairs["prompt"], pairs["chosen"], pairs["rejected"])])


def accuracy_by_pair_type(diffs: np.ndarray, pairs: pd.DataFrame) -> dict[str, float]:
    """Share of gold-decided pairs whose predicted difference `diffs` (N,) has gold's sign: overall and
    per pair type, plus n per type. The pairs' own chosen/rejected orientation does not matter, and a predicted
    difference of 0 (no preference) is never right, whichever way the pair is written."""
    gold = gold_difference(pairs["prompt"], pairs["chosen"], pairs["rejected"])
    decided = gold != 0
    right = np.sign(np.asarray(diffs, dtype=float)) == np.sign(gold)
    types = pair_types(pairs)
    out = {"all": float(right[decided].mean()) if decided.any() else float("nan")}
    for t in PAIR_TYPES:
        m = decided & (types == t)
        if m.any():
            out[t] = float(right[m].mean())
        out[f"n_{t}"] = int(m.sum())
    return out


def agreement_by_strength_decile(mean: np.ndarray, pairs: pd.DataFrame, n_groups: int = 10) -> list[float]:
    """Agreement of the pairs' labels with gold in each of `n_groups` equal-count groups of mean strength,
    weakest first (Part II Fig. 3); gold-tied pairs are left out before grouping."""
    gold = gold_difference(pairs["prompt"], pairs["chosen"], pairs["rejected"])
    decided = gold != 0
    order = np.argsort(np.asarray(mean)[decided], kind="stable")
    correct = (gold[decided] > 0)[order]
    return [float(g.mean()) if len(g) else float("nan") for g in np.array_split(correct, n_groups)]


def flip_report(comparisons: pd.DataFrame, denoised: pd.DataFrame) -> dict[str, float]:
    """What flipping did to the labels, over gold-decided pairs: precision (flipped pairs that were wrong),
    recall (wrong pairs that were flipped), labels fixed and broken, agreement before and after."""
    joined = comparisons[["pair_id", "prompt", "chosen", "rejected"]].merge(
        denoised[["pair_id", "flipped"]], on="pair_id", validate="1:1")
    gold = gold_difference(joined["prompt"], joined["chosen"], joined["rejected"])
    decided = gold != 0
    wrong = (gold < 0) & decided
    flipped = joined["flipped"].to_numpy(dtype=bool) & decided
    n_flipped = int(flipped.sum())
    return {
        "flip_precision_excl_gold_ties": float(wrong[flipped].mean()) if n_flipped else float("nan"),
        "flip_recall_excl_gold_ties": float(flipped[wrong].mean()) if wrong.any() else float("nan"),
        "labels_fixed": int((flipped & wrong).sum()),
        "labels_broken": int((flipped & ~wrong).sum()),
        "gold_agreement_before_excl_gold_ties": float((~wrong[decided]).mean()) if decided.any() else float("nan"),
        "gold_agreement_after_excl_gold_ties": float((wrong == flipped)[decided].mean()) if decided.any()
        else float("nan"),
    }


def answer_probe(score: Callable[[list[str], list[str]], np.ndarray], max_operand: int = 4,
                 ops: tuple[str, ...] = ("+", "-")) -> dict[str, float]:
    """Does the reward depend on correctness or on the answered number? Scores " It is n." for every
    problem and every n within the answers' range.

    Returns r2_number (share of the reward's variance explained by n alone), r2_distance (by
    |n - truth| alone), top1_correct (problems whose highest-reward n is the truth), and how the reward
    grades near misses, averaged over problems: gap_right_vs_off1 = score(truth) - mean score at |n - truth| = 1,
    gap_off1_vs_off2 = mean at distance 1 - mean at distance 2. Gold's correctness term gives 1.0 and 0.5
    (it halves with each unit of distance); a reward whose second gap is the larger (a policy's log-likelihood
    that spreads its mass over the near misses) cannot weigh a near miss against a style tag as gold does.
    """
    problems = [f"What is {a}{op}{b}?" for a in range(max_operand + 1) for op in ops for b in range(max_operand + 1)]
    truths = [parse_prompt(p).truth for p in problems]
    answers = range(min(truths), max(truths) + 1)
    rows = [(p, n, abs(n - t), n == t) for p, t in zip(problems, truths) for n in answers]
    df = pd.DataFrame(rows, columns=["prompt", "n", "distance", "correct"])
    df["reward"] = np.asarray(score(df["prompt"].tolist(), [f" It is {n}." for n in df["n"]]), dtype=np.float64)

    def r2(column: str) -> float:
        fitted = df.groupby(column)["reward"].transform("mean")
        total = ((df["reward"] - df["reward"].mean()) ** 2).sum()
        return float(1 - ((df["reward"] - fitted) ** 2).sum() / total) if total > 0 else float("nan")

    best = df.loc[df.groupby("prompt")["reward"].idxmax()]
    # (problems, distances); a world whose answers span under 3 numbers has no distance 2: its gap is NaN
    by_distance = df.groupby(["prompt", "distance"])["reward"].mean().unstack().reindex(columns=range(3))
    return {"r2_number": r2("n"), "r2_distance": r2("distance"), "top1_correct": float(best["correct"].mean()),
            "gap_right_vs_off1": float((by_distance[0] - by_distance[1]).mean()),
            "gap_off1_vs_off2": float((by_distance[1] - by_distance[2]).mean())}


def policy_answer_probe(policy, tokenizer, max_operand: int = 4, ops: tuple[str, ...] = ("+", "-")
                        ) -> dict[str, float]:
    """`answer_probe` of a policy's own log-likelihood of each answer (`rlhf_core.sft.response_logprobs`): how
    sharply the policy the reward models start from knows the answers (the sft stage logs it as sft/probe/*)."""
    from rlhf_core.sft import response_logprobs

    return answer_probe(lambda p, r: response_logprobs(policy, tokenizer, p, r), max_operand, ops)


def mean_gold(prompts, responses) -> float:
    return float(np.mean([gold_score(p, r) for p, r in zip(prompts, responses)]))


def policy_samples(policy_dir, prompts: list[str], generator_seeds: list[int], max_new_tokens: int = 24
                   ) -> list[list[str]]:
    """One sample at temperature 1 of the policy per prompt for each generator seed: [seed][prompt]."""
    from rlhf_core import models
    from rlhf_core.generation.sampler import sample_batch

    model, tokenizer = models.load_policy(policy_dir), models.load_tokenizer(policy_dir)
    queries = [models.format_query(tokenizer, p) for p in prompts]
    return [sample_batch(model, tokenizer, queries, max_new_tokens=max_new_tokens, temperature=1.0,
                         generator_seed=s).texts for s in generator_seeds]


HELD_OUT_SAMPLES_PER_PROMPT = 8  # 4 gold-labelled pairs per held-out prompt (~600 pairs in the demo)


def gold_eval_pairs(policy_dir, prompts: list[str], seed: int,
                    samples_per_prompt: int = HELD_OUT_SAMPLES_PER_PROMPT, max_new_tokens: int = 24) -> pd.DataFrame:
    """Held-out pairs labelled by gold: the policy's samples paired up per prompt, gold ties dropped. The default
    sample count is the reward stage's (its `reward/gold_accuracy_heldout` pairs)."""
    samples = policy_samples(policy_dir, prompts, [seed * 7919 + k for k in range(samples_per_prompt)],
                             max_new_tokens)
    rows = []
    for i, prompt in enumerate(prompts):
        for k in range(0, samples_per_prompt - 1, 2):
            a, b = samples[k][i], samples[k + 1][i]
            ga, gb = gold_score(prompt, a), gold_score(prompt, b)
            if abs(ga - gb) >= GOLD_TIE:
                rows.append({"prompt": prompt, "chosen": a if ga > gb else b, "rejected": b if ga > gb else a})
    return pd.DataFrame(rows, columns=["prompt", "chosen", "rejected"])
