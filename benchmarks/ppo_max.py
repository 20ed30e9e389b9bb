"""PPO-max against vanilla PPO on the simulated world, where gold is known: writes docs/ppo-max-benchmark.md.

    .venv/bin/python benchmarks/ppo_max.py [--seeds 0 1 2] [--runs NAME ...] [--out docs/ppo-max-benchmark.md]
        [--config configs/mini.yaml] [--rounds-dir DIR] [--set ppo.policy_lr=1e-5 ...]

Per seed, the round runs up to the reward model in --work-dir (the stages come from its cache on a
re-run), and a baseline reward model is trained with the same recipe on the raw (not denoised)
labels; for section 7's runs also a weak one, the end-token read alone on the raw labels (the recipe before
issue 8, blind to arithmetic correctness), and for section 8's the round's recipe on the pairs labelled again by
noisier annotators, as they are and after the round's voting and denoising (NOISY_ERROR_MAX); the held-out
gold-pair accuracy of each is measured beside the round's. Then every run of RUNS trains PPO from the SFT policy
with the round's own PPO config (the
demo's: PPO-max, 60 iterations of 32 prompts x 2 responses) and the run's changes, and is measured:

- the training curves (RM score, gold, KL, perplexity, length, entropy, clip fractions, value error);
- gold of the final policy's greedy responses on the held-out prompts, and KL(policy || SFT) there;
- the last 10 iterations' mean gold and KL of the rollouts, and the largest perplexity seen.

Sections: PPO-max vs vanilla (Part I Fig. 4), no KL penalty against the denoised vs the baseline
reward model (Part II Fig. 9), top-p 1.0 vs 0.9 (Qwen), an ablation (each switch off alone), the
settings (policy learning rate, KL coefficient) at this model size, PPO-max, vanilla and the old
demo settings at a longer budget, both presets against the weak reward model (Part I's reward hacking), and
Fig. 9 again with noisier annotators (the round's recipe on labels that denoising has more to fix).
Each finished (seed, run) is kept as JSON in --work-dir (named by the run, so delete the folder after
changing the round's PPO config), and a killed benchmark resumes with the next run. About 30 s per run
of 60 iterations on 2 cores (80 s at 150, 200 s at 450), 58 runs per seed: about 37 min of PPO per seed (two
processes of 1 thread side by side, one per seed, take about as long each). --config and
--rounds-dir pick the round (the smoke test: configs/mini.yaml's, shared with the other benchmarks).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
sys.path.insert(0, str(Path(__file__).parent))

from result_files import check_kept_settings  # noqa: E402
from reward_modelling import add_round_arguments, round_config, round_workdir, run_settings  # noqa: E402

LONG = 150  # the longer budget of section 5: does vanilla PPO hack the reward model given time?
OLD_DEMO = {"kl_coef": 1.0, "policy_lr": 1e-4, "ptx_coef": 1.0, "critic_warmup_steps": 16}  # the demo before 2026-11-23
# section 8's budgets, in the order they were added: does a policy pushed harder hack the raw-label model alone?
NOISY_RATES = (("", {}), (", policy lr 1e-4", {"policy_lr": 1e-4}), (", policy lr 3e-4", {"policy_lr": 3e-4}),
               (", policy lr 1e-4, 150 iterations", {"policy_lr": 1e-4, "iterations": LONG}),
               (", policy lr 3e-4, 150 iterations", {"policy_lr": 3e-4, "iterations": LONG}),
               # as far as lr 3e-4 for 150 iterations in steps a third the size: are its KL spikes the step size's?
               (", policy lr 1e-4, 450 iterations", {"policy_lr": 1e-4, "iterations": 3 * LONG}))
SWITCHES_OFF = (  # the ablations at lr 1e-4: (name, the override that turns one PPO-max switch off)
    ("- reward normalisation", {"reward_norm": False}), ("- advantage whitening", {"norm_adv": False}),
    ("- value clipping", {"clip_vloss": False}), ("- critic warm-up", {"critic_warmup_steps": 0}),
    ("- critic from the RM", {"critic_from_reward_model": False}))
RUNS = {  # name -> (overrides over the round's own PPO config, reward model the run is trained against)
    "ppo-max": ({}, "denoised"),
    "vanilla": ({"preset": "vanilla"}, "denoised"),
    "old demo settings (kl 1.0, lr 1e-4, ptx 1.0)": (OLD_DEMO, "denoised"),
    "ppo-max + ptx 1.0": ({"ptx_coef": 1.0}, "denoised"),
    "no KL, denoised RM": ({"kl_coef": 0.0}, "denoised"),
    "no KL, baseline RM": ({"kl_coef": 0.0}, "baseline"),
    "top-p 1.0": ({"top_p": 1.0}, "denoised"),
    "- reward normalisation": ({"reward_norm": False}, "denoised"),
    "- advantage whitening": ({"norm_adv": False}, "denoised"),
    "- value clipping": ({"clip_vloss": False}, "denoised"),
    "- critic warm-up": ({"critic_warmup_steps": 0}, "denoised"),
    "- critic from the RM": ({"critic_from_reward_model": False}, "denoised"),
    "policy lr 3e-6": ({"policy_lr": 3e-6}, "denoised"),
    "policy lr 3e-5": ({"policy_lr": 3e-5}, "denoised"),
    "policy lr 1e-4": ({"policy_lr": 1e-4}, "denoised"),
    "policy lr 3e-4, critic lr 1e-3 (PPOConfig defaults)": ({"policy_lr": 3e-4, "critic_lr": 1e-3}, "denoised"),
    "vanilla, policy lr 1e-4": ({"preset": "vanilla", "policy_lr": 1e-4}, "denoised"),
    "vanilla, policy lr 3e-4, critic lr 1e-3": ({"preset": "vanilla", "policy_lr": 3e-4, "critic_lr": 1e-3},
                                                "denoised"),
    "kl_coef 0.2": ({"kl_coef": 0.2}, "denoised"),
    **{f"policy lr 1e-4, {name}": (switch | {"policy_lr": 1e-4}, "denoised")
       for name, switch in (("no KL", {"kl_coef": 0.0}), *SWITCHES_OFF)},
    "policy lr 1e-4, no KL, baseline RM": ({"policy_lr": 1e-4, "kl_coef": 0.0}, "baseline"),
    "ppo-max, 150 iterations": ({"iterations": LONG}, "denoised"),
    "vanilla, 150 iterations": ({"preset": "vanilla", "iterations": LONG}, "denoised"),
    "old demo settings, 150 iterations": (OLD_DEMO | {"iterations": LONG}, "denoised"),
    # section 7: a reward model that can be hacked (the recipe before issue 8: the end-token read alone, raw labels)
    "ppo-max, weak RM": ({}, "weak"),
    "vanilla, weak RM": ({"preset": "vanilla"}, "weak"),
    "ppo-max, weak RM, policy lr 1e-4": ({"policy_lr": 1e-4}, "weak"),
    "vanilla, weak RM, policy lr 1e-4": ({"preset": "vanilla", "policy_lr": 1e-4}, "weak"),
    "ppo-max, weak RM, policy lr 1e-4, kl_coef 0.2": ({"policy_lr": 1e-4, "kl_coef": 0.2}, "weak"),
    "old demo settings, weak RM": (OLD_DEMO, "weak"),
    # the ablation where the policy does hack: each PPO-max switch off alone against the weak RM at lr 1e-4
    **{f"weak RM, policy lr 1e-4, {name}": (switch | {"policy_lr": 1e-4}, "weak") for name, switch in SWITCHES_OFF},
    # Part II Fig. 9 where there is something to hack: no KL, the weak recipe on the raw vs the denoised labels
    "no KL, weak RM, policy lr 1e-4": ({"policy_lr": 1e-4, "kl_coef": 0.0}, "weak"),
    "no KL, weak denoised RM, policy lr 1e-4": ({"policy_lr": 1e-4, "kl_coef": 0.0}, "weak_denoised"),
    "ppo-max, weak RM, 150 iterations": ({"iterations": LONG}, "weak"),
    "vanilla, weak RM, 150 iterations": ({"preset": "vanilla", "iterations": LONG}, "weak"),
    # section 8: Part II Fig. 9 where denoising has more to fix: the round's recipe on noisier annotators' labels
    **{f"no KL, noisy-label {rm} RM{lr_name}": ({"kl_coef": 0.0} | lr, f"noisy_{rm}")
       for rm in ("baseline", "denoised") for lr_name, lr in NOISY_RATES},
    # ... and the weak recipe on those labels: reward models that can be hacked, further apart
    **{f"no KL, weak RM, noisy-label {rm}, policy lr 1e-4": ({"kl_coef": 0.0, "policy_lr": 1e-4}, f"weak_noisy_{rm}")
       for rm in ("baseline", "denoised")},
}
WEAK = tuple(name for name in RUNS if RUNS[name][1] in ("weak", "weak_denoised"))
NOISY = tuple(name for name in RUNS if "noisy" in RUNS[name][1])
# section 8's noisier annotators: each flips labels at a rate drawn in [0, 0.5] instead of the world's [0, 0.2]; their
# labels are 0.62 right (0.59..0.64 over seeds 0-2), a little under issue 8's 63-75 % (the world's own: about 0.69)
NOISY_ERROR_MAX = 0.5
WEAK_FIG9 = ("no KL, weak RM, policy lr 1e-4", "no KL, weak denoised RM, policy lr 1e-4")
WEAK_ABLATION = ("ppo-max, weak RM, policy lr 1e-4", "no KL, weak RM, policy lr 1e-4",
                 *(f"weak RM, policy lr 1e-4, {name}" for name, _ in SWITCHES_OFF), "vanilla, weak RM, policy lr 1e-4")
WEAK_MAIN = ("ppo-max, weak RM", "vanilla, weak RM", "ppo-max, weak RM, policy lr 1e-4",
             "vanilla, weak RM, policy lr 1e-4", "ppo-max, weak RM, policy lr 1e-4, kl_coef 0.2",
             "old demo settings, weak RM", "ppo-max, weak RM, 150 iterations", "vanilla, weak RM, 150 iterations")
ABLATION = ("ppo-max", "no KL, denoised RM", "- reward normalisation", "- advantage whitening", "- value clipping",
            "- critic warm-up", "- critic from the RM", "top-p 1.0", "ppo-max + ptx 1.0")
ABLATION_LR_1E4 = ("policy lr 1e-4", *(n for n in RUNS if n.startswith("policy lr 1e-4, ") and "baseline" not in n),
                   "vanilla, policy lr 1e-4")
SETTINGS = ("policy lr 3e-6", "ppo-max", "vanilla", "policy lr 3e-5", "policy lr 1e-4", "vanilla, policy lr 1e-4",
            "policy lr 3e-4, critic lr 1e-3 (PPOConfig defaults)", "vanilla, policy lr 3e-4, critic lr 1e-3",
            "kl_coef 0.2", "old demo settings (kl 1.0, lr 1e-4, ptx 1.0)")
TAIL = 10  # iterations averaged for the "final" rollout numbers


def round_artifacts(cfg, weak: bool = False, noisy: bool = False) -> dict:
    """The round `cfg` up to the reward model (from the cache when it ran before), plus more reward models: the
    baseline (the round's recipe on the raw, not denoised, labels); when `weak`, the weak one (the end-token read
    alone, the recipe before issue 8: style without arithmetic correctness, something to hack) on the raw and on
    the round's denoised pairs; when `noisy`, both recipes on the same pairs labelled by noisier annotators
    (NOISY_ERROR_MAX), as they are and after the round's own voting and denoising of those labels."""
    from flows.round import rlhf_round
    from rlhf_core.schemas import read_table

    seed, workdir = cfg.seed, Path(cfg.workdir)
    art = rlhf_round(config=cfg, stop_after="reward")["artifacts"]
    raw = read_table("comparisons", Path(art["import_annotations"]["path"]) / "comparisons.parquet")
    baseline = extra_reward_model(workdir / "baseline-reward-model", art["sft"]["path"], raw, cfg.reward.train,
                                       seed)
    weak_cfg = cfg.reward.train.model_copy(update={"read": "end_token"})
    denoised = read_table("denoised", Path(art["denoise"]["path"]) / "denoised.parquet")
    weak_models = {"weak": extra_reward_model(workdir / "weak-reward-model", art["sft"]["path"], raw, weak_cfg,
                                                   seed),
                   "weak_denoised": extra_reward_model(workdir / "weak-denoised-reward-model", art["sft"]["path"],
                                                            denoised, weak_cfg, seed)} if weak else {}
    noisy_models = noisy_reward_models(cfg, art["sft"]["path"], raw) if noisy else {}
    world = Path(art["world"]["path"])
    return {"sft": art["sft"]["path"], "denoised": art["reward"]["path"], "baseline": baseline, **weak_models,
            **noisy_models,
            "prompts": read_table("prompts", world / "prompts.parquet")["prompt"].tolist(),
            "eval_prompts": read_table("prompts", world / "eval_prompts.parquet")["prompt"].tolist(),
            "demos": str(Path(art["sft"]["path"]) / "demonstrations.parquet"),
            "max_length": cfg.reward.train.max_length, "ppo": cfg.ppo}


def extra_reward_model(out_dir: Path, sft_dir: str, pairs, train_cfg, seed: int) -> str:
    """A reward model trained on `pairs` (the raw labels, or the denoised ones) with `train_cfg`, saved in out_dir
    once (kept for a re-run)."""
    from rlhf_core.reward.train import train_reward_model

    if not (out_dir / "config.json").exists():
        model, tokenizer, _ = train_reward_model(sft_dir, pairs, train_cfg, seed=seed)
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        model.save(tmp, tokenizer)
        tmp.rename(out_dir)
    return str(out_dir)


def noisy_reward_models(cfg, sft_dir: str, pairs) -> dict:
    """Section 8's reward models: the round's and the weak recipe on `pairs` labelled again by noisier annotators
    (NOISY_ERROR_MAX), as they are ("..._noisy_baseline") and voted on and denoised with the round's own voting and
    denoise configs ("..._noisy_denoised"); the votes and the labels' gold agreement before and after are kept in
    the round's workdir."""
    from reward_data_budget import noisier_labels

    from rlhf_core.artifacts import atomic_write_text
    from rlhf_core.reward.denoise import denoise
    from rlhf_core.sim.metrics import gold_agreement_of_pairs

    workdir = Path(cfg.workdir)
    noisy, votes = noisier_labels(cfg, sft_dir, pairs, NOISY_ERROR_MAX, workdir / "noisy-annotators" / "votes.parquet")
    denoised, report = denoise(noisy, votes, cfg.denoise)
    report |= {"gold_agreement_before": gold_agreement_of_pairs(noisy),
               "gold_agreement_after": gold_agreement_of_pairs(denoised),
               "flip_precision": gold_agreement_of_pairs(denoised[denoised["flipped"]])}
    atomic_write_text(workdir / "noisy-annotators" / "labels.json", json.dumps(report))
    recipes = {"": cfg.reward.train, "weak_": cfg.reward.train.model_copy(update={"read": "end_token"})}
    models = {}
    for prefix, train_cfg in recipes.items():
        for labels, train_pairs in (("baseline", noisy), ("denoised", denoised)):
            folder = workdir / f"{prefix.replace('_', '-')}noisy-{labels}-reward-model"
            models[f"{prefix}noisy_{labels}"] = extra_reward_model(folder, sft_dir, train_pairs, train_cfg, cfg.seed)
    return {**models, "noisy_labels": report}


RM_NAMES = {"denoised": "the round's (end token + log-likelihood, denoised labels)",
            "weak": "weak (end token only, raw labels)", "weak_denoised": "weak recipe, denoised labels",
            "noisy_baseline": "the round's recipe, noisier annotators' labels (section 8)",
            "noisy_denoised": "the round's recipe, noisier annotators' labels voted on and denoised (section 8)",
            "weak_noisy_baseline": "weak recipe, noisier annotators' labels (section 8)",
            "weak_noisy_denoised": "weak recipe, noisier annotators' labels voted on and denoised (section 8)"}


def reward_model_accuracy(art: dict, seed: int, known: dict) -> dict:
    """Held-out gold-pair accuracy (overall and per pair type) of the round's and the weak reward models on the SFT
    policy's samples of the held-out prompts (8 per prompt); those in `known` are not measured again."""
    from rlhf_core.reward.model import RewardModel
    from rlhf_core.reward.train import pair_reward_diffs
    from rlhf_core.models import load_tokenizer
    from rlhf_core.sim.metrics import accuracy_by_pair_type, gold_eval_pairs

    missing = [name for name in RM_NAMES if name not in known and name in art]
    if not missing:
        return known
    eval_pairs = gold_eval_pairs(art["sft"], art["eval_prompts"], seed=seed, samples_per_prompt=8)
    out = dict(known)
    for name in missing:
        model, tokenizer = RewardModel.load(art[name]), load_tokenizer(art[name])
        out[name] = accuracy_by_pair_type(pair_reward_diffs(model, tokenizer, eval_pairs, art["max_length"]),
                                          eval_pairs)
    return out


def greedy_gold_and_kl(policy, reference, tokenizer, prompts: list[str], seed: int) -> dict:
    """Gold of greedy responses on held-out prompts, and Monte-Carlo KL(policy || reference) there."""
    from rlhf_core.evaluation import kl_to_baseline
    from rlhf_core.generation.sampler import sample_batch
    from rlhf_core.models import format_query
    from rlhf_core.sim.metrics import mean_gold

    queries = [format_query(tokenizer, p) for p in prompts]
    greedy = sample_batch(policy, tokenizer, queries, 24, temperature=0.0, generator_seed=seed).texts
    kl = kl_to_baseline(policy, reference, tokenizer, prompts, 24, seed) if policy is not reference else 0.0
    return {"gold_greedy": mean_gold(prompts, greedy), "kl_eval": kl}


def run_one(name: str, art: dict, seed: int) -> dict:
    import numpy as np
    import pandas as pd

    from rlhf_core import models
    from rlhf_core.config import PPOConfig, deep_merge
    from rlhf_core.ppo.trainer import train_ppo
    from tasks.ppo import gold_scores, reward_scorer

    overrides, reward = RUNS[name]
    # the round's dump leaves the preset switches null, so a preset given in `overrides` sets them
    cfg = PPOConfig.model_validate(deep_merge(art["ppo"].model_dump(), overrides))
    ptx = None
    if cfg.ptx_coef > 0:
        demos = pd.read_parquet(art["demos"])
        ptx = list(zip(demos["prompt"], demos["response"]))
    t0 = time.time()
    policy, tokenizer, history = train_ppo(art["sft"], reward_scorer(art[reward], art["max_length"]), art["prompts"],
                                           cfg, seed=seed, critic_init_dir=art[reward], progress=True,
                                           ptx_examples=ptx, gold_fn=gold_scores)
    seconds = time.time() - t0
    reference = models.load_policy(art["sft"]).to(next(policy.parameters()).device).eval()  # beside the policy
    tail = history[-TAIL:]
    return {"name": name, "seed": seed, "seconds": seconds, "history": history,
            **greedy_gold_and_kl(policy.eval(), reference, tokenizer, art["eval_prompts"], seed),
            "gold_tail": float(np.mean([m["objective/gold"] for m in tail])),
            "kl_tail": float(np.mean([m["objective/kl"] for m in tail])),
            "score_tail": float(np.mean([m["objective/score"] for m in tail])),
            "length_tail": float(np.mean([m["response/length"] for m in tail])),
            "ppl_max": float(max(m["objective/perplexity"] for m in history)),
            "ppl_tail": float(np.mean([m["objective/perplexity"] for m in tail]))}


# ---------------------------------------------------------------- report


def _cell(values, fmt: str = "{:.3f}") -> str:
    import numpy as np

    values = [v for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(float(np.mean(values)))} ({fmt.format(min(values))}..{fmt.format(max(values))})"


COLUMNS = (("gold, greedy, held-out", "gold_greedy"), ("Δ gold vs SFT", "gold_gain"), ("KL vs SFT, held-out", "kl_eval"),
           (f"gold, rollouts, last {TAIL}", "gold_tail"), (f"RM score, last {TAIL}", "score_tail"),
           (f"Δ RM score, last vs first {TAIL}", "score_gain"),
           (f"KL, last {TAIL}", "kl_tail"), ("KL spikes", "kl_spikes"), ("perplexity max", "ppl_max"),
           ("perplexity spikes", "ppl_spikes"), (f"rollout gold below its best, last {TAIL}", "gold_drop"),
           (f"length, last {TAIL}", "length_tail"))
# Part II Fig. 9's "stable" as a count: an iteration whose rollout KL (to the SFT reference) is more than twice the
# median of the SPIKE_WINDOW iterations before it (and over KL_SPIKE_FLOOR nats: early noise is not a spike), or
# whose rollout perplexity is more than PPL_SPIKE_FACTOR x that median
SPIKE_WINDOW, KL_SPIKE_FACTOR, KL_SPIKE_FLOOR, PPL_SPIKE_FACTOR = 10, 2.0, 0.5, 1.05


def spikes(values: list[float], factor: float, floor: float = 0.0) -> int:
    """How many of `values` (from the SPIKE_WINDOW-th on) exceed `factor` x the median of the SPIKE_WINDOW before
    them, and `floor`."""
    import numpy as np

    return sum(1 for i in range(SPIKE_WINDOW, len(values))
               if values[i] > max(floor, factor * float(np.median(values[i - SPIKE_WINDOW:i]))))


def gold_below_best(gold: list[float]) -> float:
    """How far the last TAIL iterations' mean rollout gold is below the best mean of any TAIL iterations in a row:
    0 for a run that ends at its best, large for one whose gold rose and then fell (the pattern of reward hacking)."""
    import numpy as np

    window = min(TAIL, len(gold))  # a run shorter than TAIL (the smoke test's) is one window: 0
    means = np.convolve(np.asarray(gold, dtype=float), np.ones(window) / window, mode="valid")
    return float(means.max() - means[-1])


# the per-iteration curves the report's JSON keeps of every run (the run files in --work-dir keep them all)
CURVES = ("objective/score", "objective/gold", "objective/kl", "objective/perplexity", "response/length")


def _table(results: dict[str, list[dict]], names) -> list[str]:
    lines = ["| run | " + " | ".join(c for c, _ in COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    for name in names:
        rows = results.get(name, [])
        if rows:
            lines.append(f"| {name} | " + " | ".join(_cell([r[k] for r in rows], "{:.1f}" if k.endswith("_spikes")
                                                           else "{:.3f}") for _, k in COLUMNS) + " |")
    return lines


def _settings(ppo) -> str:
    """The round's PPO settings the report names (the demo's at default size)."""
    return (f"policy lr {ppo.policy_lr:g}, critic lr {ppo.critic_lr:g}, kl_coef {ppo.kl_coef:g}, "
            f"critic warm-up {ppo.critic_warmup_steps} steps")


def _accuracy_table(rm_accuracy: dict[int, dict]) -> list[str]:
    """Held-out gold-pair accuracy of the denoised and the weak reward model, mean (min..max) over seeds."""
    from rlhf_core.sim.metrics import PAIR_TYPES

    lines = ["| reward model | all | " + " | ".join(t.replace("_", " ") for t in PAIR_TYPES) + " |",
             "|---|---|" + "---|" * len(PAIR_TYPES)]
    for name, label in RM_NAMES.items():
        rows = [rm_accuracy[s][name] for s in sorted(rm_accuracy) if name in rm_accuracy[s]]
        if not rows:
            continue
        lines.append(f"| {label} | " + " | ".join(_cell([r.get(k) for r in rows]) for k in ("all", *PAIR_TYPES))
                     + " |")
    return lines


def _noisy_labels_table(noisy_labels: dict[int, dict]) -> list[str]:
    """Gold agreement of the noisier annotators' labels before and after the round's denoising, per seed."""
    lines = ["| seed | labels' gold agreement | after denoising | flipped | flip precision |", "|---|---|---|---|---|"]
    for seed, r in sorted(noisy_labels.items()):
        lines.append(f"| {seed} | {r['gold_agreement_before']:.3f} | {r['gold_agreement_after']:.3f} | "
                     f"{r['share_flipped']:.3f} | {r['flip_precision']:.3f} |")
    return lines


def write_report(results: dict[str, list[dict]], sft: dict[int, dict], out: Path, figure_dir: Path, ppo,
                 rm_accuracy: dict[int, dict], noisy_labels: dict[int, dict], command: str) -> None:
    from tasks.plots import ppo_curves

    seeds = sorted(sft)
    for rows in results.values():
        for r in rows:
            r["gold_gain"] = r["gold_greedy"] - sft[r["seed"]]["gold_greedy"]
            scores = [m["objective/score"] for m in r["history"]]  # the learned reward of the rollouts
            r["score_gain"] = sum(scores[-TAIL:]) / len(scores[-TAIL:]) - sum(scores[:TAIL]) / len(scores[:TAIL])
            r["kl_spikes"] = spikes([m["objective/kl"] for m in r["history"]], KL_SPIKE_FACTOR, KL_SPIKE_FLOOR)
            r["ppl_spikes"] = spikes([m["objective/perplexity"] for m in r["history"]], PPL_SPIKE_FACTOR)
            r["gold_drop"] = gold_below_best([m["objective/gold"] for m in r["history"]])
    figure_dir.mkdir(parents=True, exist_ok=True)
    first = seeds[0]

    def figure(names, file):
        runs = {n: next(r["history"] for r in results[n] if r["seed"] == first) for n in names if n in results}
        if not runs:  # none of its runs was asked for (--runs)
            return "(not run)"
        fig = ppo_curves(runs)
        fig.savefig(figure_dir / file, dpi=90)
        return f"![{file}](figures/{file}) (seed {first})"

    minutes = sum(r["seconds"] for rows in results.values() for r in rows) / 60
    lines = [
        "# PPO-max on the simulated world",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `{command}`"
        f" on {platform.machine()}, {os.cpu_count()} cores, no GPU; {minutes:.0f} min of PPO in all.",
        "Every run: the round's SFT policy, the round's own PPO config (`ppo-max`: the PPO-max switches, "
        f"{ppo.iterations} iterations",
        f"x {ppo.rollout_prompts} prompts x {ppo.responses_per_prompt} responses, {_settings(ppo)}) with the run's "
        "changes, against the round's",
        "denoised reward model unless the name says baseline.",
        f"Cells: mean over seeds {', '.join(map(str, seeds))} (min..max). Gold greedy is on the held-out prompts "
        f"(SFT: {_cell([sft[s]['gold_greedy'] for s in seeds])}). Spikes: iterations whose rollout KL is over "
        f"{KL_SPIKE_FACTOR:g}x the median of the {SPIKE_WINDOW} before (and over {KL_SPIKE_FLOOR:g}), or whose "
        f"perplexity is over {PPL_SPIKE_FACTOR:g}x it.",
        "",
        "## 1. PPO-max against vanilla PPO (Part I Fig. 4)",
        "",
        *_table(results, ("ppo-max", "vanilla", "old demo settings (kl 1.0, lr 1e-4, ptx 1.0)")),
        "",
        figure(("ppo-max", "vanilla"), "ppo-max-vs-vanilla.png"),
        "",
        "## 2. No KL penalty: the denoised against the baseline reward model (Part II Fig. 9)",
        "",
        *_table(results, ("no KL, denoised RM", "no KL, baseline RM", "policy lr 1e-4, no KL",
                          "policy lr 1e-4, no KL, baseline RM")),
        "",
        figure(("no KL, denoised RM", "no KL, baseline RM"), "ppo-no-kl-denoised-vs-baseline.png"),
        "",
        "## 3. Top-p 1.0 against 0.9 (Qwen)",
        "",
        *_table(results, ("ppo-max", "top-p 1.0")),
        "",
        figure(("ppo-max", "top-p 1.0"), "ppo-top-p.png"),
        "",
        "## 4. Ablation: each PPO-max switch off alone",
        "",
        *_table(results, ABLATION),
        "",
        "The same at policy lr 1e-4 (10x the round's), where the policy moves further:",
        "",
        *_table(results, ABLATION_LR_1E4),
        "",
        "## 5. Settings: the policy learning rate and the KL coefficient at this model size",
        "",
        *_table(results, SETTINGS),
        "",
        figure(("policy lr 3e-6", "ppo-max", "policy lr 1e-4", "policy lr 3e-4, critic lr 1e-3 (PPOConfig defaults)"),
               "ppo-policy-lr.png"),
        "",
        f"## 6. A longer budget: {LONG} iterations",
        "",
        *_table(results, ("ppo-max, 150 iterations", "vanilla, 150 iterations", "old demo settings, 150 iterations")),
        "",
        figure(("ppo-max, 150 iterations", "vanilla, 150 iterations", "old demo settings, 150 iterations"),
               "ppo-long-budget.png"),
        "",
        "## 7. Against weak reward models: the end-token read alone (the recipe before issue 8)",
        "",
        "Held-out gold-pair accuracy of the reward models (the SFT policy's samples); the weak ones are blind to "
        "arithmetic correctness:",
        "",
        *_accuracy_table(rm_accuracy),
        "",
        *_table(results, WEAK_MAIN),
        "",
        "The ablation where the policy does hack: each PPO-max switch off alone, against the weak reward model at "
        "lr 1e-4:",
        "",
        *_table(results, WEAK_ABLATION),
        "",
        "Part II Fig. 9 against reward models that can be hacked: no KL penalty, lr 1e-4, the weak recipe trained "
        "on the raw against the denoised labels:",
        "",
        *_table(results, WEAK_FIG9),
        "",
        figure(("vanilla, weak RM, policy lr 1e-4", "ppo-max, weak RM, policy lr 1e-4",
                "ppo-max, weak RM, policy lr 1e-4, kl_coef 0.2"), "ppo-weak-rm.png"),
        "",
        "## 8. Part II Fig. 9 with noisier annotators: no KL, the round's recipe on raw against denoised labels",
        "",
        f"The round's pairs labelled again by annotators who flip at a rate drawn in [0, "
        f"{NOISY_ERROR_MAX}] (the world's: [0, 0.2]); the round's voting (faithful, in "
        "sample) and denoise configs on those labels; the round's reward recipe on each. Labels per seed:",
        "",
        *_noisy_labels_table(noisy_labels),
        "",
        *_table(results, NOISY),
        "",
        figure(("no KL, weak RM, noisy-label baseline, policy lr 1e-4", "no KL, weak RM, noisy-label denoised, "
                "policy lr 1e-4"), "ppo-no-kl-weak-noisy-labels.png"),
        "",
        figure(("no KL, noisy-label baseline RM, policy lr 1e-4", "no KL, noisy-label denoised RM, policy lr 1e-4"),
               "ppo-no-kl-noisy-labels.png"),
        "",
        figure(("no KL, noisy-label baseline RM, policy lr 3e-4", "no KL, noisy-label denoised RM, policy lr 3e-4"),
               "ppo-no-kl-noisy-labels-lr3e-4.png"),
        "",
        figure(("no KL, noisy-label baseline RM, policy lr 3e-4, 150 iterations",
                "no KL, noisy-label denoised RM, policy lr 3e-4, 150 iterations"),
               "ppo-no-kl-noisy-labels-lr3e-4-150.png"),
        "",
        figure(("no KL, noisy-label baseline RM, policy lr 1e-4, 450 iterations",
                "no KL, noisy-label denoised RM, policy lr 1e-4, 450 iterations"),
               "ppo-no-kl-noisy-labels-lr1e-4-450.png"),
        "",
    ]
    out.write_text("\n".join(lines) + "\n")
    summary = {name: [{k: v for k, v in r.items() if k != "history"}
                      | {"curves": {k: [round(m[k], 4) for m in r["history"]] for k in CURVES}} for r in rows]
               for name, rows in results.items()}
    out.with_suffix(".json").write_text(report_json(sft, summary))


def report_json(sft: dict, summary: dict[str, list[dict]]) -> str:
    """The report's JSON, one line per (run, seed): with its curves a run is a few thousand numbers, which one per
    line (indent) would make twice the size."""
    runs = ",\n".join(f" {json.dumps(name)}: [\n" + ",\n".join(f"  {json.dumps(r)}" for r in rows) + "]"
                       for name, rows in summary.items())
    return f'{{"sft": {json.dumps(sft)},\n "runs": {{\n{runs}}}}}\n'


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS), metavar="NAME")
    parser.add_argument("--work-dir", type=Path, default=Path("rlhf-runs/benchmarks/ppo-max"))
    parser.add_argument("--out", type=Path, default=Path("docs/ppo-max-benchmark.md"))
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="dotted overrides of the round's config, e.g. ppo.policy_lr=1e-5 (the kept runs of "
                        "docs/ppo-max-benchmark.md were made at that rate)")
    add_round_arguments(parser)
    args = parser.parse_args(argv)

    import torch

    from rlhf_core import models
    from rlhf_core.artifacts import atomic_write_text

    # OMP_NUM_THREADS, where set, caps the threads: two benchmark processes side by side (e.g. one per seed) then
    # share the cores instead of oversubscribing them
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    check_kept_settings(args.work_dir, run_settings(args, "set"))  # a run's kept results are per seed and name
    results: dict[str, list[dict]] = {}
    sft: dict[int, dict] = {}
    rm_accuracy: dict[int, dict] = {}
    noisy_labels: dict[int, dict] = {}
    for seed in args.seeds:
        art = round_artifacts(round_config(args.config, seed,
                                           round_workdir(args.rounds_dir, seed, args.work_dir / f"round-seed{seed}"),
                                           tuple(args.set)), weak=any(name in WEAK for name in args.runs),
                               noisy=any(name in NOISY for name in args.runs))
        sft_file = args.work_dir / f"seed{seed}-sft.json"
        if not sft_file.exists():
            ref = models.load_policy(art["sft"]).eval()
            atomic_write_text(sft_file, json.dumps(greedy_gold_and_kl(ref, ref, models.load_tokenizer(art["sft"]),
                                                                      art["eval_prompts"], seed)))
        sft[seed] = json.loads(sft_file.read_text())
        if any(name in WEAK + NOISY for name in args.runs):
            accuracy_file = args.work_dir / f"seed{seed}-rm-accuracy.json"
            known = json.loads(accuracy_file.read_text()) if accuracy_file.exists() else {}
            accuracy = reward_model_accuracy(art, seed, known)
            if accuracy != known:
                atomic_write_text(accuracy_file, json.dumps(accuracy))
            rm_accuracy[seed] = accuracy
        if "noisy_labels" in art:
            noisy_labels[seed] = art["noisy_labels"]
        for name in args.runs:
            path = args.work_dir / f"seed{seed}-{name.replace(' ', '_').replace('/', '_')}.json"
            if not path.exists():
                atomic_write_text(path, json.dumps(run_one(name, art, seed)))
                print(seed, name, {k: v for k, v in json.loads(path.read_text()).items() if k != "history"},
                      flush=True)
            results.setdefault(name, []).append(json.loads(path.read_text()))
    command = shlex.join(["benchmarks/ppo_max.py", *(sys.argv[1:] if argv is None else argv)])
    write_report(results, sft, args.out, args.out.parent / "figures", art["ppo"], rm_accuracy, noisy_labels, command)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
