"""Where the reward is read, and whether denoising then pays: the plain vs the weighted log-likelihood read.

    .venv/bin/python benchmarks/reward_read.py [--seeds 0 1 2] [--out docs/reward-read-benchmark.md]
        [--config configs/mini.yaml] [--rounds-dir DIR]

`end_token+logprob` (the default) scores r = w . h_eos + a * sum_t log p(y_t); `end_token+weighted_logprob`
lets each token's log-likelihood carry its own weight a + u . h_{t-1} + b (u, b learned from 0). Per seed, the
round runs up to the imported comparisons in a fresh workdir, then on those pairs:

- the voters (the round's voting config: 10 faithful voters, 1 epoch) with each read: flip precision and
  gold agreement before / after flipping (the round's symmetric band);
- the final reward model (the round's recipe, 2 epochs) with each read, trained on the raw labels, on
  gold-oriented labels (the ceiling) and on the round's denoised pairs (flip_margin) from the votes of
  each read: held-out gold accuracy overall and per pair type.

Each finished seed is kept as JSON in --work-dir, so a killed run resumes with the next seed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
sys.path.insert(0, str(Path(__file__).parent))

from result_files import dots, figure_axes, save_figure  # noqa: E402
from reward_modelling import (TYPES, _cell, add_round_arguments, gold_oriented, rm_report,  # noqa: E402
                              round_config, round_pairs, round_workdir, run_settings, seed_results)

READS = {"plain": "end_token+logprob", "weighted": "end_token+weighted_logprob"}
# final reward model (read, labels): labels are raw, gold, or "denoised by <voter read>"
RUNS = [("plain", "raw"), ("plain", "gold"), ("plain", "denoised by plain"),
        ("weighted", "raw"), ("weighted", "gold"), ("weighted", "denoised by plain"),
        ("weighted", "denoised by weighted")]


def run_seed(cfg) -> dict:
    from flows.round import rlhf_round
    from rlhf_core.reward.denoise import denoise
    from rlhf_core.reward.train import train_reward_model
    from rlhf_core.reward.voting import vote
    from rlhf_core.sim.metrics import flip_report

    seed = cfg.seed
    policy, pairs, eval_pairs = round_pairs(rlhf_round(config=cfg, stop_after="import_annotations")["artifacts"], seed)
    result: dict = {"seed": seed, "n_pairs": len(pairs), "n_eval_pairs": len(eval_pairs), "voters": {}, "rms": {}}

    denoised = {}
    for name, read in READS.items():
        vcfg = cfg.voting.model_copy(update={"train": cfg.voting.train.model_copy(update={"read": read})})
        t0 = time.time()
        votes, _ = vote(policy, pairs, vcfg, seed=seed)
        seconds = time.time() - t0
        flipped, _ = denoise(pairs, votes, cfg.denoise.model_copy(update={"method": "flip"}))
        result["voters"][name] = flip_report(pairs, flipped) | {"seconds": seconds}
        denoised[name], _ = denoise(pairs, votes, cfg.denoise)
        print(seed, "voters", name, result["voters"][name], flush=True)

    for read, labels in RUNS:
        train_cfg = cfg.reward.train.model_copy(update={"read": READS[read]})
        train = {"raw": pairs, "gold": gold_oriented(pairs)}.get(labels)
        train = denoised[labels.split()[-1]] if train is None else train
        t0 = time.time()
        model, tok, _ = train_reward_model(policy, train, train_cfg, seed=seed)
        key = f"{read} read, {labels}"
        result["rms"][key] = rm_report(model, tok, eval_pairs, train_cfg) | {"seconds": time.time() - t0}
        print(seed, key, result["rms"][key], flush=True)
    return result


def write_report(results: list[dict], out: Path, seconds: float) -> None:
    seeds = [r["seed"] for r in results]
    lines = [
        "# Where the reward is read: plain vs weighted log-likelihood, and what denoising then buys",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `benchmarks/reward_read.py`, seeds {seeds}, "
        f"{os.cpu_count()} cores ({platform.machine()}), no GPU; this invocation {seconds / 60:.0f} min "
        "(seeds finished earlier are read from --work-dir).",
        f"Pairs per seed: {[r['n_pairs'] for r in results]}; held-out gold pairs: "
        f"{[r['n_eval_pairs'] for r in results]}. Cells: mean over seeds (min..max). Gold-tied pairs are left out.",
        "",
        "- plain: `end_token+logprob`, r = w . h_eos + a * sum_t log p(y_t) (the default);",
        "- weighted: `end_token+weighted_logprob`, r = w . h_eos + sum_t (a + u . h_{t-1} + b) log p(y_t).",
        "",
        "## Voters (the round's 10 faithful voters, 1 epoch; the round's symmetric band)",
        "",
        "| voters' read | flip precision | flip recall | agreement before | after flipping | seconds |",
        "|---|---|---|---|---|---|",
    ]
    keys = ("flip_precision_excl_gold_ties", "flip_recall_excl_gold_ties", "gold_agreement_before_excl_gold_ties",
            "gold_agreement_after_excl_gold_ties", "seconds")
    for name in READS:
        lines.append(f"| {name} | " + " | ".join(_cell([r["voters"][name][k] for r in results]) for k in keys) + " |")
    lines += ["", "## Final reward model: held-out gold accuracy", "",
              "| read, labels | overall | " + " | ".join(t.replace("_", " ") for t in TYPES) + " | seconds |",
              "|---|---|" + "---|" * len(TYPES) + "---|"]
    for read, labels in RUNS:
        key = f"{read} read, {labels}"
        cells = [_cell([r["rms"][key].get(k, float("nan")) for r in results]) for k in ("all", *TYPES, "seconds")]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines += ["", "Gain of the denoised labels over the raw ones, same read, per seed (points of overall accuracy):",
              ""]
    for read, voters in (("plain", "plain"), ("weighted", "plain"), ("weighted", "weighted")):
        gains = [100 * (r["rms"][f"{read} read, denoised by {voters}"]["all"] - r["rms"][f"{read} read, raw"]["all"])
                 for r in results]
        lines.append(f"- {read} read, denoised by {voters}-read voters: "
                     + ", ".join(f"{g:+.1f}" for g in gains) + f" (mean {sum(gains) / len(gains):+.1f})")
    lines += ["", plot(results, out)]
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))


def plot(results: list[dict], out: Path) -> str:
    """Held-out gold accuracy of each final reward model (read, labels): a dot per seed, the mean a bar; the markdown
    line that shows it (the figure beside `out`, .png)."""
    names = list(results[0]["rms"])
    fig, (ax,) = figure_axes(1, width=7, height=0.32 * len(names) + 1.2)
    dots(ax, {n: [r["rms"][n]["all"] for r in results if n in r["rms"]] for n in names}, "held-out gold accuracy",
         f"Final reward model by read and labels, {len(results)} seeds")
    return save_figure(fig, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("docs/reward-read-benchmark.md"))
    parser.add_argument("--work-dir", type=Path, default=Path("rlhf-runs/benchmarks/reward-read"))
    add_round_arguments(parser)
    args = parser.parse_args(argv)
    start = time.time()
    results = seed_results(args.seeds, args.work_dir, lambda seed, tmp: run_seed(
        round_config(args.config, seed, round_workdir(args.rounds_dir, seed, tmp))), run_settings(args))
    write_report(results, args.out, time.time() - start)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
