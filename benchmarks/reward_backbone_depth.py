"""Exploration: does another backbone or SFT budget lift the gold-label ceiling, and do the labels then matter?

    .venv/bin/python benchmarks/reward_backbone_depth.py [--layers 4] [--set KEY=VALUE ...] [--seed 0]
        [--config configs/mini.yaml] [--rounds-dir DIR]

    e.g. --set policy_model.hidden_size=128 --set policy_model.intermediate_size=384
         --set policy_model.num_attention_heads=8 --set policy_model.num_key_value_heads=4   (a wider backbone)
         --set sft.steps=2400                                                                 (twice the SFT)

Runs the round up to the imported comparisons with the round-config overrides (`--layers N` is
`--set policy_model.num_hidden_layers=N`; every key is validated by the round's pydantic config, so a
misspelt one is an error before anything runs), in a fresh workdir under
rlhf-runs/benchmarks/backbone-depth/ named from the overrides; then trains the default reward-model
recipe on the raw labels, on the gold labels, and on the pairs denoised (flip_margin, margin) by
fast-mode votes; prints held-out gold accuracy per pair type and the answer probe (of each reward model,
and of the SFT policy's own log-likelihood: "sft probe"), and writes them as JSON beside the workdir (same
name), a figure of the accuracies beside that (.png), its held-out pairs beside it (NAME-eval-pairs.parquet). The held-out pairs are the SFT policy's own
samples, so another policy is tested on other pairs: `--score-on NAME` also scores the raw-label reward model
on run NAME's saved held-out pairs (e.g. sft.steps1200-seed0). Seed 0 with 4 layers is quoted in
docs/reward-modelling.md section 6 (about 6 minutes on 2 cores), the SFT lengths (--set sft.steps=1200 / 2400
/ 4800, seeds 0-2) in its section 7.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

SET_BY_THE_BENCHMARK = ("seed", "workdir")  # --seed, and the workdir named from the overrides


def round_overrides(layers: int | None, sets: list[str]) -> list[str]:
    """The round-config overrides (`dotted.key=value`) of --layers and the --set items, in that order."""
    overrides = [] if layers is None else [f"policy_model.num_hidden_layers={layers}"]
    for item in sets:
        key = item.split("=", 1)[0].strip()
        if "=" not in item or not key:
            raise SystemExit(f"--set {item!r}: give KEY=VALUE, e.g. policy_model.hidden_size=128")
        if key in SET_BY_THE_BENCHMARK:
            raise SystemExit(f"--set {item!r}: {key} is the benchmark's own (use --seed; the workdir is named "
                             "from the overrides)")
        overrides.append(item)
    return overrides


def run_name(layers: int | None, sets: list[str], seed: int) -> str:
    """The run's workdir and JSON name: `layers4-seed0` for --layers alone (as before), the --set items' full
    keys and values otherwise (`policy_model.hidden_size128-sft.steps2400-seed0`), `default-seed0` for none."""
    parts = [] if layers is None else [f"layers{layers}"]
    parts += [re.sub(r"[^A-Za-z0-9._-]", "_", item.replace("=", "", 1).replace(" ", "")) for item in sets]
    return "-".join(parts or ["default"]) + f"-seed{seed}"


def sft_probe(policy_dir, cfg) -> dict[str, float]:
    """The SFT policy's `policy_answer_probe` (what the sft stage logs as sft/probe/*)."""
    from rlhf_core import models
    from rlhf_core.sim.metrics import policy_answer_probe

    return policy_answer_probe(models.load_policy(policy_dir), models.load_tokenizer(policy_dir),
                               cfg.world.max_operand, tuple(cfg.world.operations))


MODELS = ("raw labels", "gold labels", "flip_margin", "margin")  # the reward models it trains, in the figure's order
FIGURE_PANELS = {"all": "all held-out pairs", "correctness_only": "correctness only", "style_only": "style only"}


def plot(out: dict, path: Path) -> None:
    """Held-out gold accuracy of each reward model, overall and on the two pair types the labels matter most for;
    saved as `path` with .png."""
    from result_files import bars, figure_axes, save_figure

    fig, axes = figure_axes(len(FIGURE_PANELS), width=4.2, height=2.4)
    for ax, (key, title) in zip(axes, FIGURE_PANELS.items()):
        bars(ax, {model: out[model].get(key, float("nan")) for model in MODELS}, "held-out gold accuracy", title)
        ax.set_xlim(0.5, 1.0)  # chance and up: the models differ by a few points
    fig.suptitle(f"reward models on the round's pairs, {', '.join(out['overrides']) or 'default config'}, "
                 f"seed {out['seed']}", fontsize=10)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    import pandas as pd

    from flows.round import rlhf_round
    from reward_modelling import (add_round_arguments, gold_oriented, rm_report, round_config, round_pairs,
                                  round_voting, round_workdir)
    from rlhf_core.artifacts import atomic_write, atomic_write_text
    from rlhf_core.config import ConfigError, DenoiseConfig
    from rlhf_core.reward.denoise import denoise
    from rlhf_core.reward.train import train_reward_model
    from rlhf_core.reward.voting import vote
    from rlhf_core.sim.metrics import flip_report

    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=None, help="policy_model.num_hidden_layers")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a round-config override (dotted key, YAML value); repeat for more")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default="rlhf-runs/benchmarks/backbone-depth")
    parser.add_argument("--score-on", nargs="*", default=[], metavar="NAME",
                        help="runs (e.g. default-seed0) on whose saved held-out pairs the raw-label model is also "
                        "scored")
    add_round_arguments(parser)
    args = parser.parse_args(argv)
    overrides = round_overrides(args.layers, args.sets)
    name = run_name(args.layers, args.sets, args.seed)
    work = round_workdir(args.rounds_dir, args.seed, Path(args.work_dir) / name)
    try:
        cfg = round_config(args.config, args.seed, work, tuple(overrides))
    except ConfigError as err:  # a misspelt key or a bad value, before anything runs
        raise SystemExit(str(err)) from None
    work_dir = Path(args.work_dir)
    missing = [other for other in args.score_on if not (work_dir / f"{other}-eval-pairs.parquet").is_file()]
    if missing:
        raise SystemExit(f"--score-on {' '.join(missing)}: no {work_dir}/NAME-eval-pairs.parquet (run NAME first)")
    other_pairs = {other: pd.read_parquet(work_dir / f"{other}-eval-pairs.parquet") for other in args.score_on}
    t0 = time.time()
    policy, pairs, eval_pairs = round_pairs(rlhf_round(config=cfg, stop_after="import_annotations")["artifacts"],
                                            args.seed)

    atomic_write(work_dir / f"{name}-eval-pairs.parquet", lambda f: eval_pairs.to_parquet(f, index=False))
    out = {"layers": cfg.policy_model.num_hidden_layers, "overrides": overrides, "seed": args.seed,
           "round seconds": time.time() - t0, "sft probe": sft_probe(policy, cfg)}
    for label, train in (("raw labels", pairs), ("gold labels", gold_oriented(pairs))):
        t0 = time.time()
        model, tok, _ = train_reward_model(policy, train, cfg.reward.train, seed=args.seed)
        out[label] = rm_report(model, tok, eval_pairs, cfg.reward.train) | {"seconds": time.time() - t0}
        print(label, out[label], flush=True)
        if label == "raw labels":
            for other, held_out in other_pairs.items():
                out[f"raw labels on {other}'s held-out pairs"] = rm_report(model, tok, held_out, cfg.reward.train)
    votes, _ = vote(policy, pairs, round_voting(cfg, {"mode": "fast"}), seed=args.seed)
    out["flip report"] = flip_report(pairs, denoise(pairs, votes, DenoiseConfig(method="flip"))[0])
    for method in ("flip_margin", "margin"):
        denoised, _ = denoise(pairs, votes, DenoiseConfig(method=method))
        model, tok, _ = train_reward_model(policy, denoised, cfg.reward.train, seed=args.seed)
        out[method] = rm_report(model, tok, eval_pairs, cfg.reward.train)
        print(method, out[method], flush=True)
    atomic_write_text(work_dir / f"{name}.json", json.dumps(out, indent=1))
    plot(out, work_dir / f"{name}.json")


if __name__ == "__main__":
    main()
