"""What do the rounds after the first buy? `rlhf rounds N` on the embedded world, over seeds.

    .venv/bin/python benchmarks/iterated_rounds.py [--seeds 0 1 2] [--rounds 2] [--config configs/mini.yaml]
        [--rounds-dir DIR]

Per seed, `flows.round.rlhf_rounds` runs N rounds as `rlhf rounds N` does: round k + 1 samples new prompts, annotates
the responses of round k's policy, votes on and denoises the pairs of rounds 1..k + 1 (`iteration.pairs:
accumulate`), trains its reward model on them (from the SFT policy, as every round does) and improves round k's
policy by PPO; it is judged against SFT and against round k. Reported per round, over seeds: every headline number
of the round's summary (`flows.round.HEADLINE`: labels, voting, denoising, the reward model on and off the denoised
labels, gold, KL and the judge). The reward model of every round is scored on held-out pairs of the SFT policy's
samples, so its accuracy compares across rounds; gold and KL are the greedy policy's on the held-out prompts.

With --rounds-dir the rounds run in DIR/round-seedN (round 1 from the cache of any benchmark given the same DIR);
each finished seed is kept as JSON in --work-dir, so a killed run resumes with the next seed. Early stopping
(`iteration.stop_min_win_rate`) is off here, so every seed runs every round.
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

from result_files import figure_axes, save_figure  # noqa: E402
from reward_modelling import (_cell, add_round_arguments, round_config, round_workdir,  # noqa: E402
                              run_settings, seed_results)

# the rows of the report's table: the round summary's headline names, in this order
ROWS = (
    "pairs in total", "pairs accumulated over rounds", "annotator agreement with gold", "voters' gold accuracy",
    "flip precision", "gold agreement after denoising", "RM accuracy vs gold (held-out), raw labels",
    "RM accuracy vs gold (held-out)", "RM accuracy, correctness-only pairs", "gold score, SFT",
    "gold score, new policy", "KL(new policy || SFT)", "judged win rate vs SFT", "judged tie rate vs SFT",
    "judged lose rate vs SFT", "judged win rate vs the round before", "judged tie rate vs the round before",
)
FORMATS = {"pairs in total": ".0f", "pairs accumulated over rounds": ".0f"}


def run_seed(cfg, n_rounds: int) -> dict:
    from flows.round import rlhf_rounds

    t0 = time.time()
    summaries = rlhf_rounds(config=cfg, n_rounds=n_rounds)
    return {"seed": cfg.seed, "seconds": time.time() - t0, "ideal_gold": ideal_gold(summaries[0]["artifacts"]),
            "rounds": [{"round_no": s["round_no"], "headline": s["headline"]} for s in summaries]}


def ideal_gold(artifacts: dict) -> float:
    """Mean gold of the world's best response (`ideal_response`) on the held-out prompts the policies are scored on:
    the ceiling of "gold score, new policy"."""
    from rlhf_core.schemas import read_table
    from rlhf_core.sim.world import gold_score, ideal_response

    prompts = read_table("prompts", Path(artifacts["world"]["path"]) / "eval_prompts.parquet")["prompt"]
    return float(sum(gold_score(p, ideal_response(p)) for p in prompts) / len(prompts))


def value(result: dict, round_no: int, name: str) -> float:
    """One headline number of one round (NaN where the round does not report it, e.g. round 1 vs the round
    before)."""
    headline = result["rounds"][round_no - 1]["headline"]
    v = headline.get(name)
    return float("nan") if v is None else float(v)


def closed(result: dict, round_no: int) -> float:
    """(gold of round k's policy - SFT's) / (the ideal response's - SFT's), on the held-out prompts."""
    sft = value(result, 1, "gold score, SFT")
    return (value(result, round_no, "gold score, new policy") - sft) / (result["ideal_gold"] - sft)


def write_report(results: list[dict], n_rounds: int, out: Path, command: str) -> None:
    seeds = [r["seed"] for r in results]
    lines = [
        "# Iterated rounds: what the rounds after the first buy",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `{command}`, seeds {seeds}, {os.cpu_count()} cores "
        f"({platform.machine()}), no GPU. Each seed's rounds as `rlhf rounds {n_rounds}` runs them (the script's "
        "docstring). Cells: mean over seeds (min..max); per seed in the second table. The world's best response "
        "(right number, every style followed) scores " + _cell([r["ideal_gold"] for r in results]) + " gold on the "
        "held-out prompts.",
        "",
        "| | " + " | ".join(f"round {k}" for k in range(1, n_rounds + 1)) + " |",
        "|---|" + "---|" * n_rounds,
    ]
    for name in ROWS:
        cells = [_cell([value(r, k, name) for r in results], FORMATS.get(name, ".3f")) for k in range(1, n_rounds + 1)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        if name == "gold score, new policy":  # how much of the way from SFT to the world's best response
            cells = [_cell([closed(r, k) for r in results], ".2f") for k in range(1, n_rounds + 1)]
            lines.append("| share of the gap from SFT to the ideal response closed | " + " | ".join(cells) + " |")
    lines += ["", "Per seed: gold of the new policy, and the reward model on raw / denoised labels (held-out):", "",
              "| seed | " + " | ".join(f"round {k}: gold, RM raw / denoised" for k in range(1, n_rounds + 1)) + " |",
              "|---|" + "---|" * n_rounds]
    for r in results:
        lines.append(f"| {r['seed']} | " + " | ".join(
            f"{value(r, k, 'gold score, new policy'):.3f}, "
            f"{value(r, k, 'RM accuracy vs gold (held-out), raw labels'):.3f}"
            f" / {value(r, k, 'RM accuracy vs gold (held-out)'):.3f}" for k in range(1, n_rounds + 1)) + " |")
    lines += ["", "Minutes per seed (all rounds; stages cached before are not re-run): "
              + ", ".join(f"{r['seconds'] / 60:.1f}" for r in results), "", plot(results, n_rounds, out)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


def plot(results: list[dict], n_rounds: int, out: Path) -> str:
    """Gold of the greedy policy (SFT = round 0) and the reward model's held-out accuracy per round, one line a seed;
    the markdown line that shows it (the figure beside `out`, .png)."""
    fig, (gold_ax, rm_ax) = figure_axes(2, width=10, height=3.8)
    rounds = list(range(n_rounds + 1))
    for r in results:
        gold = [value(r, 1, "gold score, SFT")] + [value(r, k, "gold score, new policy") for k in rounds[1:]]
        gold_ax.plot(rounds, gold, marker="o", label=f"seed {r['seed']}")
        gold_ax.axhline(r["ideal_gold"], linestyle=":", linewidth=0.8, color=gold_ax.lines[-1].get_color())
        for name, style in (("RM accuracy vs gold (held-out), raw labels", "--"),
                            ("RM accuracy vs gold (held-out)", "-")):
            rm_ax.plot(rounds[1:], [value(r, k, name) for k in rounds[1:]], style, marker="o",
                       color=gold_ax.lines[-1].get_color())
    gold_ax.set_xticks(rounds, ["SFT"] + [f"round {k}" for k in rounds[1:]])
    gold_ax.set_ylabel("gold score, greedy, held-out prompts")
    gold_ax.set_title("Policy (dotted: the ideal response)", fontsize=10)
    gold_ax.legend(fontsize=8)
    rm_ax.set_xticks(rounds[1:], [f"round {k}" for k in rounds[1:]])
    rm_ax.set_ylabel("held-out gold accuracy")
    rm_ax.set_title("Reward model: raw labels (dashed), denoised (solid)", fontsize=10)
    return save_figure(fig, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=2, help="rounds per seed (>= 2)")
    parser.add_argument("--out", type=Path, default=Path("docs/iterated-rounds.md"))
    parser.add_argument("--work-dir", type=Path, default=Path("rlhf-runs/benchmarks/iterated-rounds"))
    add_round_arguments(parser)
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: the question is what the rounds after the first buy")
    # a seed's kept result is for one number of rounds: a different --rounds gets its own --work-dir
    work_dir = args.work_dir / f"rounds{args.rounds}"
    results = seed_results(args.seeds, work_dir, lambda seed, tmp: run_seed(
        round_config(args.config, seed, round_workdir(args.rounds_dir, seed, tmp),
                     ("iteration.stop_min_win_rate=null",)), args.rounds), run_settings(args, "rounds"))
    write_report(results, args.rounds, args.out, "benchmarks/iterated_rounds.py " + " ".join(argv or sys.argv[1:]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
