"""Does an ensemble of final reward models reach what one cannot? Held-out gold accuracy of the mean reward.

    .venv/bin/python benchmarks/reward_ensemble.py [--seeds 0 1 2] [--members 5] [--gold-members 3]
        [--config configs/mini.yaml] [--rounds-dir DIR]

Per seed, the round runs up to the imported comparisons in a fresh workdir; then `--members` reward models of
the round's own recipe (`reward.train`, 2 epochs, the default read) are trained on the raw annotator labels,
each with its own seed (head init and data order), and `--gold-members` on gold-oriented labels (the ceiling).
Each member's reward differences on the held-out gold pairs are kept; an ensemble of the first k members
scores a pair by the mean of their standardised differences (each member's divided by its own std over the
held-out pairs, so no member dominates by scale). Reported: held-out gold accuracy overall and per pair type
of one member (mean over members) and of the ensembles of 2..k members.

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

import numpy as np

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
sys.path.insert(0, str(Path(__file__).parent))

from result_files import figure_axes, save_figure  # noqa: E402
from reward_modelling import (TYPES, _cell, add_round_arguments, gold_oriented, round_config,  # noqa: E402
                              round_pairs, round_workdir, run_settings, seed_results)

LABELS = ("raw", "gold")


def run_seed(cfg, members: int, gold_members: int) -> dict:
    from flows.round import rlhf_round
    from rlhf_core.reward.train import pair_reward_diffs, train_reward_model
    from rlhf_core.sim.metrics import accuracy_by_pair_type

    seed = cfg.seed
    policy, pairs, eval_pairs = round_pairs(rlhf_round(config=cfg, stop_after="import_annotations")["artifacts"], seed)
    train_cfg = cfg.reward.train
    result: dict = {"seed": seed, "n_pairs": len(pairs), "n_eval_pairs": len(eval_pairs),
                    "members": {"raw": members, "gold": gold_members}}
    for labels in LABELS:
        train = pairs if labels == "raw" else gold_oriented(pairs)
        diffs, seconds = [], []
        for k in range(result["members"][labels]):
            t0 = time.time()
            model, tok, _ = train_reward_model(policy, train, train_cfg, seed=seed * 1000 + k)
            d = pair_reward_diffs(model, tok, eval_pairs, train_cfg.max_length)
            diffs.append(d / d.std())
            seconds.append(time.time() - t0)
            print(seed, labels, "member", k, accuracy_by_pair_type(d, eval_pairs)["all"], flush=True)
        singles = [accuracy_by_pair_type(d, eval_pairs) for d in diffs]
        result[labels] = {
            # a pair type the held-out pairs lack (a miniature world) is NaN
            "single": {key: float(np.mean([s.get(key, np.nan) for s in singles])) for key in ("all", *TYPES)},
            "single_all": [s["all"] for s in singles],
            "ensembles": {str(k): accuracy_by_pair_type(np.mean(diffs[:k], axis=0), eval_pairs)
                          for k in range(2, len(diffs) + 1)},
            "seconds_per_member": float(np.mean(seconds)),
        }
        print(seed, labels, json.dumps(result[labels]["ensembles"].get(str(len(diffs)))), flush=True)
    return result


def write_report(results: list[dict], out: Path, seconds: float) -> None:
    members = results[0]["members"]
    lines = [
        "# An ensemble of final reward models: held-out gold accuracy of the mean reward",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `benchmarks/reward_ensemble.py`, seeds "
        f"{[r['seed'] for r in results]}, {os.cpu_count()} cores ({platform.machine()}), no GPU; this invocation "
        f"{seconds / 60:.0f} min (seeds finished earlier are read from --work-dir).",
        f"Pairs per seed: {[r['n_pairs'] for r in results]}; held-out gold pairs: "
        f"{[r['n_eval_pairs'] for r in results]}. Members: {members['raw']} on raw labels, {members['gold']} on "
        "gold-oriented labels; the round's reward recipe "
        "(`reward.train`), member k with seed 1000 * seed + k. Cells: mean over seeds (min..max); gold-tied pairs "
        "left out.",
        "",
        "| labels, reward | overall | " + " | ".join(t.replace("_", " ") for t in TYPES) + " |",
        "|---|---|" + "---|" * len(TYPES),
    ]
    for labels in LABELS:
        cells = [_cell([r[labels]["single"][key] for r in results]) for key in ("all", *TYPES)]
        lines.append(f"| {labels}, one member (mean over members) | " + " | ".join(cells) + " |")
        for k in range(2, members[labels] + 1):
            cells = [_cell([r[labels]["ensembles"][str(k)].get(key, np.nan) for r in results])
                     for key in ("all", *TYPES)]
            lines.append(f"| {labels}, mean of {k} members | " + " | ".join(cells) + " |")
    lines += ["", "Each member's overall accuracy, raw labels, per seed: "
              + "; ".join(f"seed {r['seed']}: " + ", ".join(f"{a:.3f}" for a in r["raw"]["single_all"])
                          for r in results),
              "", "Seconds per member (train + score; the machine may have been shared): "
              + ", ".join(f"{r['raw']['seconds_per_member']:.0f}" for r in results), "", plot(results, out)]
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))


def plot(results: list[dict], out: Path) -> str:
    """Held-out gold accuracy against the number of members averaged, raw and gold labels: mean over seeds with the
    min..max range; the markdown line that shows it (the figure beside `out`, .png)."""
    fig, (ax,) = figure_axes(1, width=6, height=4)
    for labels in LABELS:
        sizes = range(1, results[0]["members"][labels] + 1)
        per_seed = np.array([[r[labels]["single"]["all"] if k == 1 else r[labels]["ensembles"][str(k)]["all"]
                              for k in sizes] for r in results])  # (seeds, sizes)
        mean = per_seed.mean(axis=0)
        ax.errorbar(list(sizes), mean, yerr=[mean - per_seed.min(axis=0), per_seed.max(axis=0) - mean], marker="o",
                    capsize=3, label=f"{labels} labels")
    ax.set_xticks(range(1, max(results[0]["members"].values()) + 1))
    ax.set_xlabel("members averaged (1 = one member, mean over members)")
    ax.set_ylabel("held-out gold accuracy")
    ax.set_title(f"Ensembles of final reward models, {len(results)} seeds (min..max)", fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--members", type=int, default=5, help="reward models on the raw labels")
    parser.add_argument("--gold-members", type=int, default=3, help="reward models on gold-oriented labels")
    parser.add_argument("--out", type=Path, default=Path("docs/reward-ensemble.md"))
    parser.add_argument("--work-dir", type=Path, default=Path("rlhf-runs/benchmarks/reward-ensemble"))
    add_round_arguments(parser)
    args = parser.parse_args(argv)
    start = time.time()
    results = seed_results(args.seeds, args.work_dir, lambda seed, tmp: run_seed(
        round_config(args.config, seed, round_workdir(args.rounds_dir, seed, tmp)), args.members, args.gold_members),
        run_settings(args, "members", "gold_members"))
    write_report(results, args.out, time.time() - start)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
