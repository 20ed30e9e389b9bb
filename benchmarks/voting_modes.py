"""Issue 12's voting goal: faithful and fast voting, each relative to one reward-model training, and how well
they agree (Spearman of the mean strength; and, since the world knows gold, how well each finds wrong labels).

    .venv/bin/python benchmarks/voting_modes.py [--config configs/mini.yaml] [--seed 0] [--rounds-dir DIR]
        [--work-dir rlhf-runs/benchmarks/voting-modes] [--repeats 3] [--contenders NAME ...] [--json docs/benchmarks-voting.json] [--doc docs/benchmarks.md]
        [--note TEXT]

The round (the embedded demo's config, or --config, at --seed) runs up to its imported comparisons
(`stop_after="import_annotations"`, in --rounds-dir/round-seedN or else --work-dir/round-seedN, kept: a re-run
takes its stages from the cache).
On its pairs and its SFT policy, in this process, the contenders run in turn within each repeat (the order rotated
by one each repeat), each timed from model load to the last pair scored, in wall and in this process's CPU seconds:

- one_reward_model: `train_reward_model` with the round's reward.train (the final reward model's recipe), then
  every pair scored (`pair_reward_diffs`): the unit the others are measured in;
- faithful: `vote` with the round's voting config (M full reward models one after the other, in process);
- fast: the same config in mode fast (M heads over one shared trunk);
- fast_length_grouped: fast with voting.train.batching length_grouped;
- fast_prompt_shared: that, and voting.train.share_prompt (each prompt run once for both replies).

Agreement, from the first repeat (every contender is seeded, so the repeats vote alike; checked): each mode's
Spearman with faithful's mean strength, and, denoised with the round's own denoise config, the flip precision and
the labels' gold agreement after (gold ties left out). Writes the JSON (--json), a figure beside it (same name,
.png: cost per contender against the 3x goal; fast's mean strength against faithful's) and its section of --doc.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from orchestration_overhead import machine, write_outputs  # noqa: E402
from result_files import bars, figure_axes, save_figure  # noqa: E402
from reward_modelling import add_round_arguments, round_config, round_workdir  # noqa: E402

SECTION_START, SECTION_END = "<!-- voting-modes:start -->", "<!-- voting-modes:end -->"
UNIT = "one_reward_model"
VOTING = {  # contender -> voting config overrides (voting.train's as "train.<key>")
    "faithful": {"mode": "faithful"},
    "fast": {"mode": "fast"},
    "fast_length_grouped": {"mode": "fast", "train.batching": "length_grouped"},
    "fast_prompt_shared": {"mode": "fast", "train.batching": "length_grouped", "train.share_prompt": True},
}
CONTENDERS = (UNIT, *VOTING)
GOAL_COST, GOAL_SPEARMAN = 3.0, 0.9  # issue 12: fast <= 3x one reward-model training, Spearman >= 0.9


def voting_config(base, overrides: dict):
    """The round's VotingConfig with `overrides` ("train.<key>" for voting.train's keys)."""
    from rlhf_core.config import VotingConfig

    data = base.model_dump()
    for key, value in overrides.items():
        if key.startswith("train."):
            data["train"][key.removeprefix("train.")] = value
        else:
            data[key] = value
    return VotingConfig.model_validate(data)


def run_contender(name: str, policy: str, pairs, cfg, seed: int) -> dict:
    """One timed run: seconds, cpu_seconds and the (N,) per-pair mean difference it produced."""
    import numpy as np

    from rlhf_core.reward.train import pair_reward_diffs, train_reward_model
    from rlhf_core.reward.voting import vote

    wall, cpu = time.perf_counter(), time.process_time()
    if name == UNIT:
        model, tokenizer, _ = train_reward_model(policy, pairs, cfg.reward.train, seed=seed)
        mean = pair_reward_diffs(model, tokenizer, pairs, cfg.reward.train.max_length)
        votes = None
    else:
        votes, _ = vote(policy, pairs, voting_config(cfg.voting, VOTING[name]), seed=seed)
        mean = votes["mean"].to_numpy()
    return {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu,
            "mean": np.asarray(mean, dtype=float), "votes": votes}


def agreement(runs: dict, pairs, denoise_cfg) -> dict[str, dict]:
    """Per voting contender: Spearman of its mean strength with faithful's (where faithful ran) and with the unit
    model's reward gap, and, denoised with `denoise_cfg`, what flipping did to the labels (`flip_report`)."""
    from scipy.stats import spearmanr

    from rlhf_core.reward.denoise import denoise
    from rlhf_core.sim.metrics import flip_report

    out = {}
    for name, run in runs.items():
        if run["votes"] is None:
            continue
        denoised, _ = denoise(pairs, run["votes"], denoise_cfg)
        report = {"share_flipped": float(denoised["flipped"].mean()), **flip_report(pairs, denoised)}
        if "faithful" in runs:
            report["spearman_vs_faithful"] = float(spearmanr(run["mean"], runs["faithful"]["mean"])[0])
        out[name] = report
    return out


def measure(args) -> dict:
    import numpy as np

    from flows.round import rlhf_round
    from rlhf_core.schemas import read_table

    workdir = round_workdir(args.rounds_dir, args.seed, args.work_dir / f"round-seed{args.seed}")
    cfg = round_config(args.config, args.seed, workdir)
    art = rlhf_round(config=cfg, stop_after="import_annotations")["artifacts"]
    pairs = read_table("comparisons", Path(art["import_annotations"]["path"]) / "comparisons.parquet")
    policy = art["sft"]["path"]
    runs: dict[str, list[dict]] = {name: [] for name in args.contenders}
    for repeat in range(args.repeats):
        order = args.contenders[repeat % len(args.contenders):] + args.contenders[: repeat % len(args.contenders)]
        for name in order:
            run = run_contender(name, policy, pairs, cfg, args.seed)
            runs[name].append(run)
            print(f"repeat {repeat + 1}/{args.repeats} {name}: {run['seconds']:.1f} s "
                  f"({run['cpu_seconds']:.1f} CPU s)", flush=True)
    first = {name: r[0] for name, r in runs.items()}
    same = {name: all(np.allclose(r["mean"], r_[0]["mean"], rtol=1e-5, atol=1e-6) for r in r_[1:])
            for name, r_ in runs.items()}
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "config": args.config or "the embedded demo config", "seed": args.seed, "n_pairs": len(pairs),
        "n_voters": cfg.voting.n_models, "voter_epochs": cfg.voting.train.epochs,
        "reward_epochs": cfg.reward.train.epochs, "repeats": args.repeats, "contenders": list(args.contenders),
        "same_votes_every_repeat": same,
        "seconds": {name: [r["seconds"] for r in rs] for name, rs in runs.items()},
        "cpu_seconds": {name: [r["cpu_seconds"] for r in rs] for name, rs in runs.items()},
        "agreement": agreement(first, pairs, cfg.denoise),
        "fast_vs_faithful_means": ({name: first[name]["mean"].tolist() for name in ("fast", "faithful")}
                                   if "fast" in first and "faithful" in first else None),
    }
    median = {name: float(np.median(v)) for name, v in result["seconds"].items()}
    median_cpu = {name: float(np.median(v)) for name, v in result["cpu_seconds"].items()}
    result["median_seconds"], result["median_cpu_seconds"] = median, median_cpu
    if UNIT in median:
        result["vs_one_reward_model"] = {name: median[name] / median[UNIT] for name in median}
        result["vs_one_reward_model_cpu"] = {name: median_cpu[name] / median_cpu[UNIT] for name in median_cpu}
    return result


def verdict(result: dict) -> str:
    """The goal's line: the fast contenders' cost and Spearman against the goal."""
    ratios, agree = result.get("vs_one_reward_model"), result["agreement"]
    fast = [name for name in result["contenders"] if name.startswith("fast")]
    if not ratios or not fast or "faithful" not in agree:
        return "**Goal (issue 12): fast <= 3x one reward-model training and Spearman >= 0.9: not measured in this run.**"
    met = [name for name in fast if ratios[name] <= GOAL_COST and agree[name]["spearman_vs_faithful"] >= GOAL_SPEARMAN]
    parts = ", ".join(f"{name} {ratios[name]:.2f}x / {agree[name]['spearman_vs_faithful']:.3f}" for name in fast)
    return (f"**Goal (issue 12): fast <= {GOAL_COST:g}x one reward-model training and Spearman with faithful >= "
            f"{GOAL_SPEARMAN}. Now (cost / Spearman): {parts}; faithful {ratios['faithful']:.2f}x"
            f": {'met by ' + ', '.join(met) if met else 'not met'}.**")


def _epochs(n: int) -> str:
    return f"{n} epoch" + ("s" if n != 1 else "")


def section(result: dict) -> str:
    m, ratios, agree = result["machine"], result.get("vs_one_reward_model", {}), result["agreement"]
    cpu_ratios = result.get("vs_one_reward_model_cpu", {})
    lines = [
        SECTION_START,
        "## Voting: fast vs faithful mode (issue 12's voting goal; `benchmarks/voting_modes.py`)",
        "",
        f"Machine: {m['cores']} CPU cores ({m['processor']}), torch {m['torch']}, OMP_NUM_THREADS "
        f"{m['OMP_NUM_THREADS']}; load average {m['load_average_at_start']:.1f} at the start; {result['date']}. "
        "Ratios come from contenders run in turn within each repeat (order rotated), medians over "
        f"{result['repeats']} repeats; absolute seconds are context.",
        "",
        f"    python benchmarks/voting_modes.py {shlex.join(result['argv'])}".rstrip(),
        "",
        f"Round: {result['config']}, seed {result['seed']}, its {result['n_pairs']:,} imported pairs and SFT policy; "
        f"M = {result['n_voters']} voters of {_epochs(result['voter_epochs'])} each; one reward model = the final "
        f"recipe ({_epochs(result['reward_epochs'])}), trained and every pair scored. Agreement and gold from the first "
        "repeat (votes equal in every repeat: "
        + ", ".join(f"{n} {'yes' if s else 'NO'}" for n, s in result["same_votes_every_repeat"].items()) + ").",
        "",
        "| contender | seconds per run | vs one reward model | CPU seconds per run | vs one, CPU | Spearman with "
        "faithful | share flipped | flip precision (excl. gold ties) | labels' gold agreement after (excl. gold ties) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in result["contenders"]:
        a = agree.get(name, {})
        cells = [name, ", ".join(f"{s:.1f}" for s in result["seconds"][name]),
                 f"{ratios[name]:.2f}x" if ratios else "–",
                 ", ".join(f"{s:.1f}" for s in result["cpu_seconds"][name]),
                 f"{cpu_ratios[name]:.2f}x" if cpu_ratios else "–",
                 f"{a['spearman_vs_faithful']:.3f}" if "spearman_vs_faithful" in a else "–",
                 f"{a['share_flipped']:.3f}" if a else "–",
                 f"{a['flip_precision_excl_gold_ties']:.3f}" if a else "–",
                 f"{a['gold_agreement_after_excl_gold_ties']:.3f}" if a else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    before = next(iter(agree.values()), {}).get("gold_agreement_before_excl_gold_ties")
    lines += ["", verdict(result)]
    if before is not None:
        lines.append(f"The raw labels agree with gold on {before:.3f} of the gold-decided pairs.")
    for note in result.get("notes") or []:
        lines.append(f"Note: {note}")
    if result.get("figure"):
        lines += ["", f"![voting cost and agreement]({result['figure']})"]
    lines += ["", SECTION_END, ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Left: each contender's median seconds over one reward model's, with the goal line. Right: fast's mean
    strength against faithful's, per pair. Saved at `path` (.png)."""
    fig, (cost, scatter) = figure_axes(2, width=5.5, height=4.2)
    relative = "vs_one_reward_model" in result
    values = result["vs_one_reward_model"] if relative else result["median_seconds"]
    bars(cost, {n: values[n] for n in result["contenders"]},
         "median seconds / one reward model's" if relative else "median seconds", "Cost")
    if relative:
        cost.axvline(GOAL_COST, color="tab:red", ls="--", lw=1, label=f"goal for fast: {GOAL_COST:g}x")
        cost.legend(fontsize=8)
    means = result.get("fast_vs_faithful_means")
    if means:
        import numpy as np

        faithful, fast = np.asarray(means["faithful"]), np.asarray(means["fast"])
        scatter.scatter(faithful, fast, s=4, alpha=0.4)
        scatter.axhline(0, color="k", lw=0.5)
        scatter.axvline(0, color="k", lw=0.5)
        # the middle 99 % of either, so that a few extreme pairs do not squash the rest
        (x0, x1), (y0, y1) = np.percentile(faithful, [0.5, 99.5]), np.percentile(fast, [0.5, 99.5])
        scatter.set_xlim(x0 - 0.05 * (x1 - x0), x1 + 0.05 * (x1 - x0))
        scatter.set_ylim(y0 - 0.05 * (y1 - y0), y1 + 0.05 * (y1 - y0))
        outside = int(((faithful < x0) | (faithful > x1) | (fast < y0) | (fast > y1)).sum())
        rho = result["agreement"]["fast"]["spearman_vs_faithful"]
        scatter.set_title(f"Mean strength per pair (Spearman {rho:.3f}; {outside} of {len(fast)} off the plot)",
                          fontsize=10)
        scatter.set_xlabel("faithful (M full reward models)")
        scatter.set_ylabel("fast (M heads, one trunk)")
    else:
        scatter.set_axis_off()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_round_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=ROOT / "rlhf-runs" / "benchmarks" / "voting-modes",
                        help="where the round runs without --rounds-dir (kept: a re-run takes its stages from the cache)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each contender")
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS, metavar="NAME",
                        help=f"which to run, of: {', '.join(CONTENDERS)}")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "benchmarks-voting.json")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--note", action="append", help="a remark on this run (the machine's load, ...); repeatable")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    load_at_start = os.getloadavg()[0]
    result = measure(args)
    result.update(argv=list(sys.argv[1:] if argv is None else argv), machine=machine(load_at_start), notes=args.note)
    figure = args.json.with_suffix(".png")
    plot(result, figure)
    result["figure"] = os.path.relpath(figure, args.doc.parent)
    write_outputs(result, args.json, args.doc, section(result), SECTION_START, SECTION_END)
    print(verdict(result))
    return result


if __name__ == "__main__":
    main()
