"""Does agreement with held-out human labels, the one measure a reward model trained on real annotations has, tell
what gold tells? Writes docs/reward-holdout.md (+ .json, .png).

    .venv/bin/python benchmarks/reward_holdout.py [--seeds 0 1 2] [--fraction 0.2] [--config C]
        [--rounds-dir DIR] [--work-dir W] [--out docs/reward-holdout.md]

Per seed, the round runs up to its reward model twice in one workdir (the stages before voting from the cache the
second time): with reward.holdout_fraction 0 and with --fraction. The simulated world knows gold, so each reward
model, the denoised one and the baseline on the raw labels, is measured both ways: accuracy on held-out gold pairs
(the eval prompts' pairs; both runs) and agreement with the annotators' labels of the held-out prompts' pairs (the
--fraction run: all of them, and those that two or more annotators labelled alike). Two questions: does the
human-label measure order the denoised and baseline models as gold does, and what does holding the prompts out cost
in gold accuracy? Each finished seed is kept as work-dir/fractionF/seedN.json, so a killed run resumes.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
sys.path.insert(0, str(Path(__file__).parent))

from result_files import figure_axes, save_figure, write_json  # noqa: E402
from reward_modelling import (_cell, add_round_arguments, round_config, round_workdir,  # noqa: E402
                              run_settings, seed_results)

MODELS = {"denoised": "reward", "baseline": "reward/baseline"}  # name -> metric prefix in the reward stage


def reward_metrics(cfg) -> tuple[dict[str, float], dict]:
    """The round up to its reward model (stages from the cache where they ran): the reward stage's metrics and the
    round's artifacts."""
    from flows.round import rlhf_round
    from rlhf_core.artifacts import ArtifactStore

    summary = rlhf_round(config=cfg, stop_after="reward")
    store = ArtifactStore(Path(cfg.workdir) / "artifacts")
    reward = summary["artifacts"]["reward"]
    return store.manifest(store.find(reward["kind"], reward["digest"])).metrics, summary["artifacts"]


def held_out_label_accuracy(comparisons_dir: str, fraction: float) -> dict[str, float]:
    """a: how often the annotators' labels of the held-out pairs agree with gold (gold ties and annotator ties
    left out), the rate that bounds what agreement with them can show; a_unanimous: the same over the pairs that
    two or more annotators labelled alike (NaN with one label per pair), the subset `accuracy_unanimous` reads."""
    from rlhf_core.reward.holdout import held_out_side, unanimous_labels
    from rlhf_core.schemas import read_table
    from rlhf_core.sim.metrics import gold_difference

    pairs = held_out_side(read_table("comparisons", Path(comparisons_dir) / "comparisons.parquet"), fraction)
    gold = gold_difference(pairs["prompt"], pairs["chosen"], pairs["rejected"])
    unanimous = unanimous_labels(pairs)
    rate = {"label_accuracy": float((gold[gold != 0] > 0).mean())}
    subset = gold[unanimous & (gold != 0)]
    rate["label_accuracy_unanimous"] = float((subset > 0).mean()) if len(subset) else float("nan")
    return rate


def run_seed(config: str | None, seed: int, workdir: Path, fraction: float) -> dict:
    """Gold accuracy of both models without and with the held-out prompts; their held-out human-label agreement."""
    result = {"seed": seed, "fraction": fraction}
    for name, held in (("all prompts", 0.0), ("held out", fraction)):
        metrics, artifacts = reward_metrics(round_config(config, seed, workdir, (f"reward.holdout_fraction={held}",)))
        result[name] = {model: {key: metrics[f"{prefix}/{key}"] for key in (
            "gold_accuracy_heldout", "heldout/accuracy", "heldout/accuracy_unanimous", "heldout/n_pairs",
            "heldout/n_unanimous") if f"{prefix}/{key}" in metrics} for model, prefix in MODELS.items()}
        result[name]["n_train_pairs"] = metrics["reward/n_train_pairs"]
    result["held out"] |= held_out_label_accuracy(artifacts["import_annotations"]["path"], fraction)
    return result


def expected_agreement(gold_accuracy: float, label_accuracy: float) -> float:
    """Agreement of a model right on gold at rate g with labels right at rate a, their errors independent."""
    return gold_accuracy * label_accuracy + (1 - gold_accuracy) * (1 - label_accuracy)


def write_report(results: list[dict], out: Path, command: str, seconds: float) -> None:
    def col(run: str, model: str, key: str) -> list[float]:
        return [r[run][model].get(key, float("nan")) for r in results]

    def gap(run: str, key: str) -> list[float]:
        return [a - b for a, b in zip(col(run, "denoised", key), col(run, "baseline", key))]

    fraction = results[0]["fraction"]
    lines = [
        "# Held-out human labels as the measure of a reward model",
        "",
        "Generated by `benchmarks/reward_holdout.py`; the command, machine and date are at the end. With real "
        "annotations there is no gold: `reward.holdout_fraction` keeps a share of the prompts out of voting, "
        "denoising and reward training, and logs the reward models' agreement with the annotators' labels of their "
        "pairs (`reward/heldout/accuracy`; ties left out). On the simulated world gold is known, so the same reward "
        "models are also measured on the held-out gold pairs. Cells: mean (min..max) over seeds.",
        "",
        "| measure | denoised | baseline (raw labels) | denoised - baseline |",
        "|---|---|---|---|",
    ]
    rows = [
        ("gold accuracy, no prompts held out", "all prompts", "gold_accuracy_heldout"),
        (f"gold accuracy, {fraction:.0%} of the prompts held out", "held out", "gold_accuracy_heldout"),
        ("agreement with held-out human labels", "held out", "heldout/accuracy"),
        ("agreement with held-out unanimous labels (2+ annotators)", "held out", "heldout/accuracy_unanimous"),
    ]
    if all(col("held out", "denoised", "heldout/accuracy_unanimous")[i] != col("held out", "denoised",
           "heldout/accuracy_unanimous")[i] for i in range(len(results))):  # NaN: one label per pair, none unanimous
        rows = rows[:3]
    for label, run, key in rows:
        lines.append(f"| {label} | {_cell(col(run, 'denoised', key))} | {_cell(col(run, 'baseline', key))} | "
                     f"{_cell(gap(run, key), '+.3f')} |")
    expected_rows = [("expected agreement, g·a + (1 - g)(1 - a)", "label_accuracy")]
    if len(rows) == 4:
        expected_rows.append(("expected agreement with the unanimous labels, a their own", "label_accuracy_unanimous"))
    for label, rate in expected_rows:
        expected = {m: [expected_agreement(r["held out"][m]["gold_accuracy_heldout"], r["held out"][rate])
                        for r in results] for m in MODELS}
        lines.append(f"| {label} | {_cell(expected['denoised'])} | {_cell(expected['baseline'])} | "
                     f"{_cell([d - b for d, b in zip(expected['denoised'], expected['baseline'])], '+.3f')} |")
    n_held = col("held out", "denoised", "heldout/n_pairs")
    n_unanimous = col("held out", "denoised", "heldout/n_unanimous")
    lines += [
        "",
        f"Pairs: {_cell([r['all prompts']['n_train_pairs'] for r in results], '.0f')} to train on with every prompt, "
        f"{_cell([r['held out']['n_train_pairs'] for r in results], '.0f')} with {fraction:.0%} of the prompts held "
        f"out; {_cell(n_held, '.0f')} held-out pairs with a preference"
        + (f", {_cell(n_unanimous, '.0f')} of them unanimous." if len(rows) == 4 else
           " (one label per pair: none is unanimous)."),
        "",
        f"a, the annotators' agreement with gold on the held-out pairs (gold ties left out): "
        f"{_cell([r['held out']['label_accuracy'] for r in results])}"
        + (f"; on the unanimous ones: {_cell([r['held out']['label_accuracy_unanimous'] for r in results])}"
           if len(rows) == 4 else "")
        + "; g: each model's accuracy on all the held-out gold pairs with the prompts held out (the unanimous "
        "subset holds the pairs the annotators found easy, where a model may be right more often than g). The "
        "measured agreement counts the held-out pairs that gold calls a tie too.",
        "",
        "Per seed (denoised / baseline):",
        "",
        "| seed | gold, all prompts | gold, held out | human labels |"
        + (" unanimous labels |" if len(rows) == 4 else ""),
        "|---" * (1 + len(rows)) + "|",
    ]
    for r in results:
        cells = [f"{r[run]['denoised'].get(key, float('nan')):.3f} / {r[run]['baseline'].get(key, float('nan')):.3f}"
                 for _, run, key in rows]
        lines.append(f"| {r['seed']} | " + " | ".join(cells) + " |")

    fig, (ax,) = figure_axes(1, width=6.5, height=4.2)
    for i, r in enumerate(results):
        xs = [r["held out"][m]["gold_accuracy_heldout"] for m in MODELS]
        ys = [r["held out"][m]["heldout/accuracy"] for m in MODELS]
        ax.plot(xs, ys, color="0.7", zorder=1)
        for m, x, y, colour in zip(MODELS, xs, ys, ("tab:blue", "tab:orange")):
            ax.scatter([x], [y], color=colour, label=m if i == 0 else None, zorder=2)
            ax.annotate(f" seed {r['seed']}", (x, y), fontsize=7)
    ax.set_xlabel("accuracy on held-out gold pairs")
    ax.set_ylabel("agreement with held-out human labels")
    ax.set_title("one reward model, measured by gold and by held-out human labels", fontsize=10)
    ax.legend(fontsize=8)
    lines += ["", save_figure(fig, out), "",
              f"How it ran: `{command}`; {platform.machine()}, {os.cpu_count()} cores, no GPU; "
              f"{datetime.now(timezone.utc):%Y-%m-%d}; {seconds / 60:.0f} min."]
    out.parent.mkdir(parents=True, exist_ok=True)
    from rlhf_core.artifacts import atomic_write_text

    atomic_write_text(out, "\n".join(lines) + "\n")
    write_json(out, {"results": results, "command": command})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--fraction", type=float, default=0.2, help="reward.holdout_fraction of the second run")
    parser.add_argument("--out", default="docs/reward-holdout.md")
    parser.add_argument("--work-dir", default="rlhf-runs/benchmarks/reward-holdout",
                        help="each finished seed's result (fractionF/seedN.json): a re-run reuses them")
    add_round_arguments(parser)
    args = parser.parse_args(argv)
    start = time.time()
    results = seed_results(args.seeds, Path(args.work_dir) / f"fraction{args.fraction}", lambda seed, tmp: run_seed(
        args.config, seed, round_workdir(args.rounds_dir, seed, tmp), args.fraction), run_settings(args, "fraction"))
    command = shlex.join(["benchmarks/reward_holdout.py", *(argv if argv is not None else sys.argv[1:])])
    write_report(results, Path(args.out), command, time.time() - start)


if __name__ == "__main__":
    main()
