"""Matplotlib figures logged to MLflow (Agg backend: no display needed)."""

from __future__ import annotations

from collections import Counter

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def tag_histogram(pool_tags, sampled_tags, top: int = 30, labels: tuple[str, str] = ("pool", "sampled"),
                  title: str = "Tag frequency before/after sampling"):
    """Tag frequency (share of prompts) in a "before" vs an "after" set, most frequent "before" tags first.

    Before/after sampling: the pool's tags vs the selection's. Before/after normalisation: the
    raw tags vs the normalised ones (merged tags then show up under their new names only).
    """
    pool = Counter(t for ts in pool_tags for t in ts)
    chosen = Counter(t for ts in sampled_tags for t in ts)
    names = [t for t, _ in pool.most_common(top)]
    n_pool, n_sel = max(1, len(pool_tags)), max(1, len(sampled_tags))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [pool[t] / n_pool for t in names], width=0.4, label=labels[0])
    ax.bar([i + 0.2 for i in x], [chosen[t] / n_sel for t in names], width=0.4, label=labels[1])
    ax.set_xticks(list(x), names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("share of prompts with tag")
    ax.set_title(title)
    ax.legend()
    return fig


def strength_histogram(means, buckets, stds=None):
    """Secrets of RLHF II Fig. 1: histograms of the pairs' mean strength (by bucket) and of its std."""
    fig, axes = plt.subplots(1, 1 if stds is None else 2, figsize=(6 if stds is None else 11, 3.5))
    ax = axes if stds is None else axes[0]
    for name in ("incorrect", "ambiguous", "normal"):
        vals = [m for m, b in zip(means, buckets) if b == name]
        if vals:
            ax.hist(vals, bins=30, alpha=0.6, label=f"{name} ({len(vals)})")
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel("preference strength (mean r(chosen) - r(rejected))")
    ax.set_ylabel("pairs")
    ax.legend()
    if stds is not None:
        axes[1].hist(list(stds), bins=30, color="tab:purple", alpha=0.8)
        axes[1].set_xlabel("std of r(chosen) - r(rejected) over the voters")
        axes[1].set_ylabel("pairs")
    fig.tight_layout()
    return fig


def strength_std_by_group(means, stds, n_groups: int = 10):
    """Secrets of RLHF II Fig. 2: mean std of the votes per equal-count group of mean strength."""
    import numpy as np

    order = np.argsort(np.asarray(means, dtype=float), kind="stable")
    groups = np.array_split(np.asarray(stds, dtype=float)[order], n_groups)
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.bar(range(1, n_groups + 1), [g.mean() if len(g) else float("nan") for g in groups], color="tab:purple")
    ax.set_xlabel("strength group (weakest first)")
    ax.set_ylabel("mean std of the votes")
    ax.set_title("Vote spread by preference strength")
    return fig


def agreement_by_strength(shares: list[float], label: str = "gold"):
    """Secrets of RLHF II Fig. 3: agreement of the labels with `label` per group of strength, weakest first."""
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.bar(range(1, len(shares) + 1), shares, color="tab:green")
    ax.axhline(0.5, color="k", lw=0.6, ls=":")
    ax.set_ylim(0, 1)
    ax.set_xlabel("strength decile (weakest first)")
    ax.set_ylabel(f"label agrees with {label}")
    ax.set_title(f"Agreement with {label} by preference strength")
    return fig


def agreement_by_bucket(shares: dict[str, float]):
    """Share of pairs whose label agrees with gold, per strength bucket (simulated world only)."""
    fig, ax = plt.subplots(figsize=(5, 3.2))
    names = list(shares)
    ax.bar(names, [shares[n] for n in names], color="tab:green")
    ax.set_ylim(0, 1)
    ax.set_ylabel("label agrees with gold")
    ax.set_title("Agreement with gold by strength bucket")
    return fig


PPO_CURVES = ("objective/score", "objective/gold", "objective/kl", "objective/perplexity", "response/length",
              "objective/entropy", "policy/clipfrac", "value/error")


def ppo_curves(runs: list[dict] | dict[str, list[dict]], keys=PPO_CURVES, ncols: int = 4):
    """Secrets of RLHF Part I Fig. 4 style: the training curves side by side, one panel per metric.

    runs: one history (a list of per-iteration metric dicts) or {label: history} to overlay runs.
    Keys no run logged (gold outside the simulated world) are left out.
    """
    runs = {"": runs} if isinstance(runs, list) else runs
    keys = [k for k in keys if any(k in h for hist in runs.values() for h in hist)]
    nrows = -(-len(keys) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.8 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for label, hist in runs.items():
            ax.plot([h.get("iteration", i) for i, h in enumerate(hist)], [h.get(key, float("nan")) for h in hist],
                    label=label or None)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("iteration")
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    if len(runs) > 1:
        axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def verdict_bars(rates: dict[str, float], title: str):
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    names = ["win", "tie", "lose"]
    ax.bar(names, [rates.get(f"{n}_rate", 0.0) for n in names], color=["tab:green", "tab:gray", "tab:red"])
    ax.set_ylim(0, 1)
    ax.set_title(title)
    return fig


def verdict_bars_with_intervals(rates: dict[str, float], title: str):
    """Win / tie / lose shares with their bootstrap 95 % intervals as error bars.

    rates: {"win_rate": r, "win_rate_lo": lo, "win_rate_hi": hi, ...} (rlhf_core.judge.stats.verdict_metrics).
    """
    names = ["win", "tie", "lose"]
    shares = [rates.get(f"{n}_rate", 0.0) for n in names]
    below = [max(0.0, s - rates.get(f"{n}_rate_lo", s)) for n, s in zip(names, shares)]
    above = [max(0.0, rates.get(f"{n}_rate_hi", s) - s) for n, s in zip(names, shares)]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.bar(names, shares, yerr=[below, above], capsize=6, color=["tab:green", "tab:gray", "tab:red"])
    for i, share in enumerate(shares):
        ax.text(i, share + above[i] + 0.02, f"{share:.0%}", ha="center", fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("share of prompts (95 % bootstrap CI)")
    ax.set_title(title)
    return fig
