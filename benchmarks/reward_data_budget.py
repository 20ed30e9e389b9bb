"""Exploration: is the reward model limited by its labels, by the shape of their noise, or by its data? (issue 8)

    .venv/bin/python benchmarks/reward_data_budget.py [--seeds 0 1 2] [--variants NAME ...]
        [--out docs/reward-data-budget.md] [--work-dir rlhf-runs/benchmarks/reward-data-budget]
        [--rounds-dir DIR] [--config YAML]

Per seed and variant, the round runs up to the imported comparisons with the variant's config overrides
(its stages come from the cache when --rounds-dir already holds them), then the round's reward-model
recipe is trained on the raw labels and on the gold-oriented labels and scored on the held-out gold pairs
(`gold_eval_pairs`: the SFT policy's samples on the 200 held-out prompts, 8 per prompt). Variants:

- "demo": the round as it is (about 3,000 pairs from 2,000 sampled prompts);
- "2x responses per prompt": 8 responses per prompt and 4 disjoint pairs each: twice the pairs, same prompts;
- "2x prompts (the whole pool)": sampling.n_samples 4000 of the pool of 4000;
- "2x prompts from a 2x pool": world.n_prompts 8000, sampling.n_samples 4000 (sampling still selects half);
- "flip-type noise": the demo's pairs relabelled by annotators with a sharper Bradley-Terry temperature (0.4)
  and more careless flips (error rates up to 0.5), so that most wrong labels are flips of clear pairs (Part
  II's "incorrect labels") rather than close calls.

Every variant but "2x prompts from a 2x pool" also trains on Part II's methods over fast-mode votes; "demo" on more
denoising variants: the symmetric and the paper's band, other margin scales, and soft labels on every pair
(distilling the votes).
Each finished (seed, variant) is kept as JSON in --work-dir, so a killed run resumes. Seed 0 of every variant
and seeds 1 and 2 of "demo" and "2x prompts (the whole pool)" are quoted in docs/reward-modelling.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

FLIP_NOISE = {"annotator_temperature": 0.4, "annotator_error_max": 0.5}  # the demo's: 0.9 and 0.2
VARIANTS = {  # name -> (dotted config overrides, relabel the pairs with these annotator settings or None)
    "demo": ((), None),
    "2x responses per prompt": (("generation.generators=[{name: policy, model: policy, strategies: ["
                                 "{name: t1.0, temperature: 1.0, n: 4}, {name: t0.7-p0.9, temperature: 0.7, top_p: 0.9, "
                                 "n: 4}]}]", "annotation.pairs_per_prompt=4"), None),
    "2x prompts (the whole pool)": (("sampling.n_samples=4000",), None),
    "2x prompts from a 2x pool": (("world.n_prompts=8000", "sampling.n_samples=4000"), None),
    "flip-type noise": ((), FLIP_NOISE),
}
DENOISING = {  # name -> (DenoiseConfig overrides, bucket rule: symmetric band 0.1 | paper one-sided 0.25 | all)
    "baseline": ({"method": "baseline"}, "symmetric"),
    "margin": ({"method": "margin"}, "symmetric"),
    "flip_margin": ({"method": "flip_margin"}, "symmetric"),
    "soft_label_margin": ({"method": "soft_label_margin"}, "symmetric"),
    "soft_label_margin, paper band": ({"method": "soft_label_margin"}, "paper"),
    "soft_label_margin, margin_scale 1.0": ({"method": "soft_label_margin", "margin_scale": 1.0}, "symmetric"),
    "soft_label_margin, margin_scale 0": ({"method": "soft_label_margin", "margin_scale": 0.0}, "symmetric"),
    "soft labels on every pair + margin": ({"method": "soft_label_margin"}, "all"),
    "soft labels on every pair, margin_scale 0": ({"method": "soft_label_margin", "margin_scale": 0.0}, "all"),
}
NOISE_DENOISING = ("baseline", "margin", "flip_margin", "soft_label_margin")
DENOISED_VARIANTS = ("flip-type noise", "2x responses per prompt", "2x prompts (the whole pool)")  # and "demo"
TYPES = ("correctness_only", "style_only", "style_agrees", "style_conflicts")


def relabel(pairs, annotators: dict, seed: int):
    """The pairs labelled again by simulated annotators with other settings (the world's label_pair, one
    annotator drawn per pair): chosen/rejected swapped where the new label prefers the rejected response."""
    import numpy as np

    from rlhf_core.config import WorldConfig
    from rlhf_core.sim.annotators import annotator_error_rates, label_pair
    from rlhf_core.sim.metrics import gold_difference

    world = WorldConfig(**annotators)
    rates = annotator_error_rates(world, seed)
    rng = random.Random(f"relabel-{seed}-{sorted(annotators.items())}")
    gold = gold_difference(pairs["prompt"], pairs["chosen"], pairs["rejected"])
    swap = np.array([label_pair(g, rates[rng.choice(sorted(rates))], world.annotator_temperature, rng) == "right"
                     for g in gold], dtype=bool)
    out = pairs.copy()
    out["chosen"] = np.where(swap, pairs["rejected"], pairs["chosen"])
    out["rejected"] = np.where(swap, pairs["chosen"], pairs["rejected"])
    return out


def noisier_labels(cfg, policy: str, pairs, error_max: float, votes_path: Path, temperature: float | None = None):
    """(the round's pairs labelled again by the world's annotators, each now flipping at a rate drawn in
    [0, error_max], with Bradley-Terry `temperature` (None: the world's), the round's voting recipe's votes on
    those labels): the votes are kept at `votes_path`, so a re-run reads them back."""
    from rlhf_core.artifacts import atomic_write
    from rlhf_core.reward.voting import vote
    from rlhf_core.schemas import read_table

    noisy = relabel(pairs, {"annotator_temperature": temperature or cfg.world.annotator_temperature,
                            "annotator_error_max": error_max}, cfg.seed)
    if not votes_path.exists():
        votes, report = vote(policy, noisy, cfg.voting, seed=cfg.seed, progress=True)
        print("voted on the noisier labels", cfg.seed, report, flush=True)
        votes_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(votes_path, lambda f: votes.to_parquet(f, index=False))
    return noisy, read_table("votes", votes_path)


def denoise_variant(pairs, votes, overrides: dict, rule: str):
    """The pairs denoised by `votes` with DenoiseConfig(**overrides), the votes bucketed by `rule`."""
    from rlhf_core.config import DenoiseConfig
    from rlhf_core.reward.denoise import denoise
    from rlhf_core.reward.voting import bucket

    if rule == "paper":
        votes = votes.assign(bucket=bucket(votes["mean"].to_numpy(), 0.25, float(votes["mean"].std(ddof=0)),
                                           symmetric=False))
    elif rule == "all":
        votes = votes.assign(bucket="incorrect")  # soft_label_margin then gives every pair the votes' sigmoid(z)
    return denoise(pairs, votes, DenoiseConfig(**overrides))[0]


def run_variant(seed: int, name: str, workdir: Path, config: str | None) -> dict:
    from flows.round import rlhf_round
    from reward_modelling import gold_oriented, rm_report, round_config, round_pairs, round_voting
    from rlhf_core.config import DenoiseConfig
    from rlhf_core.reward.denoise import denoise
    from rlhf_core.reward.train import train_reward_model
    from rlhf_core.reward.voting import vote
    from rlhf_core.sim.metrics import flip_report, gold_difference

    overrides, annotators = VARIANTS[name]
    cfg = round_config(config, seed, workdir, overrides)
    policy, pairs, eval_pairs = round_pairs(rlhf_round(config=cfg, stop_after="import_annotations")["artifacts"],
                                            seed)
    if annotators is not None:
        pairs = relabel(pairs, annotators, seed)
    gold = gold_difference(pairs["prompt"], pairs["chosen"], pairs["rejected"])
    result = {"seed": seed, "variant": name, "n_pairs": len(pairs), "n_prompts": int(pairs["prompt_id"].nunique()),
              "n_eval_pairs": len(eval_pairs), "raw_agreement_excl_gold_ties": float((gold > 0)[gold != 0].mean()),
              "reward_models": {}}

    def train(label: str, train_pairs) -> None:
        t0 = time.time()
        model, tok, _ = train_reward_model(policy, train_pairs, cfg.reward.train, seed=seed)
        result["reward_models"][label] = rm_report(model, tok, eval_pairs, cfg.reward.train) | {
            "seconds": time.time() - t0}
        print(seed, name, label, {k: round(v, 3) for k, v in result["reward_models"][label].items()
                                  if not k.startswith("n_")}, flush=True)

    train("raw labels", pairs)
    train("gold labels", gold_oriented(pairs))
    methods = DENOISING if name == "demo" else NOISE_DENOISING if name in DENOISED_VARIANTS else ()
    if methods:
        votes, _ = vote(policy, pairs, round_voting(cfg, {"mode": "fast"}), seed=seed)
        result["fast_votes_flip_report"] = flip_report(pairs, denoise(pairs, votes, DenoiseConfig(method="flip"))[0])
        for method in methods:
            if method != "baseline":  # baseline = the raw labels, trained above
                train(method, denoise_variant(pairs, votes, *DENOISING[method]))
    return result


def write_report(results: list[dict], out: Path, seconds: float) -> None:
    """docs page: per variant the reward models' held-out accuracy, mean over the seeds measured (min..max)."""
    from reward_modelling import _cell
    from rlhf_core.artifacts import atomic_write_text

    by_variant: dict[str, list[dict]] = {}
    for r in results:
        by_variant.setdefault(r["variant"], []).append(r)
    lines = [
        "# Reward model: labels, noise shape or data? (issue 8 exploration)",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `benchmarks/reward_data_budget.py`, {os.cpu_count()} "
        f"cores ({platform.machine()}), {seconds / 60:.0f} min for this invocation (finished (seed, variant)s are "
        "read from --work-dir). Held-out gold accuracy of the round's reward-model recipe; cells: mean over the "
        "seeds measured (min..max), the seeds listed per row. Gold-tied pairs are left out.",
        "",
        "| variant | seeds | pairs | prompts | raw label agreement | labels | overall | correctness only | "
        "style only | style agrees | style conflicts |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in by_variant.items():
        for label in rows[0]["reward_models"]:
            have = [r for r in rows if label in r["reward_models"]]
            cells = [_cell([r["reward_models"][label].get(t, float("nan")) for r in have]) for t in ("all",) + TYPES]
            lines.append(
                f"| {name} | {', '.join(str(r['seed']) for r in have)} | {_cell([r['n_pairs'] for r in have], ',.0f')} | "
                f"{_cell([r['n_prompts'] for r in have], ',.0f')} | {_cell([r['raw_agreement_excl_gold_ties'] for r in have])} "
                f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Fast-mode votes (symmetric band 0.1), what flipping would do to the labels:", "",
              "| variant | seeds | flip precision | agreement before | after flipping |", "|---|---|---|---|---|"]
    for name, rows in by_variant.items():
        have = [r for r in rows if "fast_votes_flip_report" in r]
        if have:
            f = [r["fast_votes_flip_report"] for r in have]
            lines.append(f"| {name} | {', '.join(str(r['seed']) for r in have)} | "
                         f"{_cell([x['flip_precision_excl_gold_ties'] for x in f])} | "
                         f"{_cell([x['gold_agreement_before_excl_gold_ties'] for x in f])} | "
                         f"{_cell([x['gold_agreement_after_excl_gold_ties'] for x in f])} |")
    lines += ["", plot(results, out)]
    atomic_write_text(out, "\n".join(lines) + "\n")
    atomic_write_text(out.with_suffix(".json"), json.dumps(results, indent=1))


def plot(results: list[dict], out: Path) -> str:
    """Held-out gold accuracy per (variant, labels): a dot per seed, the mean a bar; the markdown line that shows it
    (the figure beside `out`, .png)."""
    from result_files import dots, figure_axes, save_figure

    values: dict[str, list[float]] = {}
    for r in results:
        for labels, report in r["reward_models"].items():
            values.setdefault(f"{r['variant']}: {labels}", []).append(report["all"])
    fig, (ax,) = figure_axes(1, width=8, height=0.3 * len(values) + 1.2)
    dots(ax, values, "held-out gold accuracy", "Reward model by data variant and labels")
    return save_figure(fig, out)


def main(argv: list[str] | None = None) -> None:
    from reward_modelling import add_round_arguments, round_workdir
    from rlhf_core.artifacts import atomic_write_text

    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", default="docs/reward-data-budget.md")
    parser.add_argument("--work-dir", default="rlhf-runs/benchmarks/reward-data-budget",
                        help="finished (seed, variant) results (a killed run resumes) and, without --rounds-dir, the "
                        "rounds")
    add_round_arguments(parser)
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for seed in args.seeds:
        for name in args.variants:
            done = work / f"seed{seed}-{name.replace(' ', '_')}.json"
            if not done.exists():  # every variant of a seed shares one round directory: stages cached by config
                workdir = round_workdir(args.rounds_dir, seed, work / f"round-seed{seed}")
                atomic_write_text(done, json.dumps(run_variant(seed, name, workdir, args.config)))
    results = [json.loads(p.read_text()) for p in sorted(work.glob("seed*.json"))]
    order = list(VARIANTS)
    results.sort(key=lambda r: (order.index(r["variant"]), r["seed"]))
    write_report(results, Path(args.out), time.time() - t0)


if __name__ == "__main__":
    main()
