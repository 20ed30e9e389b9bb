"""Secrets of RLHF Part II on the simulated world, where gold is known: writes docs/reward-modelling.md.

    .venv/bin/python benchmarks/reward_modelling.py [--seeds 0 1 2] [--out docs/reward-modelling.md]
        [--config configs/mini.yaml] [--rounds-dir DIR]

Per seed, the round runs up to the imported comparisons (world, SFT, sampling, generation, simulated
annotators) in a fresh workdir, then, on those same pairs:

1. reward-model recipes trained on the raw (noisy) labels, scored on held-out gold pairs overall,
   per pair type, and with the answer probe (is the reward about correctness or about the number?);
2. voting schemes (faithful in-sample = the paper, faithful out-of-fold, fast shared-trunk): label
   agreement with gold per strength decile, flip precision and recall, gold agreement after
   flipping, seconds, and the Spearman correlation of each scheme's mean strength with faithful's;
3. the denoising methods of Part II sec. 2.5 on the in-sample votes: held-out gold accuracy of the
   reward model trained on each;
4. MetaRM (Part II sec. 3.2) against the same recipe without the meta step, both trained on the
   round's denoised pairs, the meta step fed with samples of the round's PPO policy: accuracy on
   gold pairs of the SFT policy and of the PPO policy (the shifted distribution).

The round runs to the end (PPO included) in a fresh workdir per seed. Each finished seed is kept as JSON in --work-dir, so a killed run resumes with
the next seed. Every table gives the mean over seeds and the min..max range. About 21 minutes per
seed on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
sys.path.insert(0, str(Path(__file__).parent))

from result_files import check_kept_settings  # noqa: E402

RECIPES = {  # name -> RewardTrainConfig overrides (epochs 2, batch 16 throughout)
    "end token, lr 1e-3 (before)": {"read": "end_token", "lr": 1e-3, "head_lr": None},
    "end token, lr 1e-4 / head 3e-3": {"read": "end_token"},
    "end token + log-likelihood (default)": {},
    "end token + log-likelihood + LM loss 0.5": {"lm_coef": 0.5},
    "end token + log-likelihood + SimCSE on differences 0.1": {"contrastive": {"coef": 0.1,
                                                                                "positives": "differences"}},
    "end token + log-likelihood + SimCSE on responses 0.1": {"contrastive": {"coef": 0.1, "positives": "responses"}},
    "end token + log-likelihood, gold labels (ceiling)": {"_gold": True},
}
PAPER_BAND = {"band": "one_sided", "ambiguous_band": 0.25}  # incorrect = mean < 0 (the default is symmetric 0.1)
SCHEMES = {
    "faithful, in-sample (paper)": {"mode": "faithful", "scheme": "in_sample", **PAPER_BAND},
    "faithful, out-of-fold (2 folds)": {"mode": "faithful", "scheme": "out_of_fold", **PAPER_BAND},
    "fast, shared trunk": {"mode": "fast", "scheme": "in_sample", **PAPER_BAND},
}
METHODS = ("baseline", "flip", "margin", "flip_margin", "soft_label_margin")
SYMMETRIC = "faithful, in-sample, symmetric band 0.1"
SYMMETRIC_METHOD = "flip_margin, symmetric band 0.1"
TYPES = ("correctness_only", "style_only", "style_agrees", "style_conflicts")


def gold_oriented(pairs):
    """The pairs relabelled by gold (gold ties dropped)."""
    import numpy as np

    from rlhf_core.sim.metrics import gold_difference

    gold = gold_difference(pairs["prompt"], pairs["chosen"], pairs["rejected"])
    out = pairs[gold != 0].copy()
    wrong = gold[gold != 0] < 0
    chosen, rejected = out["chosen"].to_numpy(), out["rejected"].to_numpy()
    out["chosen"], out["rejected"] = np.where(wrong, rejected, chosen), np.where(wrong, chosen, rejected)
    return out


META_RUNS = {  # name -> reward.train.meta overrides
    "vanilla": {},
    "MetaRM, eta 0.1 (default)": {"enabled": True},
    "MetaRM, eta 0.01": {"enabled": True, "inner_lr": 0.01},
}
META_SAMPLES_PER_PROMPT = 8  # drawn from the PPO policy per training prompt; the meta step takes k of them


def meta_samples(policy_dir, prompts: list[str], n: int, seed: int):
    """(prompt, response): n samples at temperature 1 of the policy for every prompt."""
    import pandas as pd

    from rlhf_core.sim.metrics import policy_samples

    draws = policy_samples(policy_dir, prompts, [seed * 104729 + k for k in range(n)])
    return pd.DataFrame([{"prompt": p, "response": t} for texts in draws for p, t in zip(prompts, texts)])


def round_pairs(art: dict, seed: int):
    """(the SFT policy's path, the round's imported comparisons, held-out gold pairs of the SFT policy's
    samples, 8 per held-out prompt) from a round's artifacts."""
    from rlhf_core.schemas import read_table
    from rlhf_core.sim.metrics import gold_eval_pairs

    pairs = read_table("comparisons", Path(art["import_annotations"]["path"]) / "comparisons.parquet")
    eval_prompts = read_table("prompts", Path(art["world"]["path"]) / "eval_prompts.parquet")["prompt"].tolist()
    policy = art["sft"]["path"]
    return policy, pairs, gold_eval_pairs(policy, eval_prompts, seed=seed, samples_per_prompt=8)


def add_round_arguments(parser: argparse.ArgumentParser) -> None:
    """--config and --rounds-dir: the round a seed runs (its size: the smoke test passes configs/mini.yaml)."""
    parser.add_argument("--config", default=None, help="the round's YAML config (default: the embedded demo's)")
    parser.add_argument("--rounds-dir", type=Path, default=None,
                        help="run seed N's round in DIR/round-seedN and keep it there, so its stages come from the "
                        "cache on a re-run and in any benchmark given the same DIR and config")


def round_config(config: str | None, seed: int, workdir: Path, overrides: tuple[str, ...] = ()):
    """The RoundConfig of a benchmark's round: `config`'s YAML (None: the embedded demo's defaults) at `seed`, in
    `workdir`, with `dotted.key=value` overrides."""
    from rlhf_core.config import load_config

    return load_config(config or None, overrides=[f"seed={seed}", f"workdir={workdir}", *overrides])


def round_workdir(rounds_dir: Path | None, seed: int, default: Path) -> Path:
    """Where seed's round runs: DIR/round-seedN under --rounds-dir, else the benchmark's own `default`."""
    return default if rounds_dir is None else rounds_dir / f"round-seed{seed}"


def round_voting(cfg, overrides: dict):
    """The round's voting config with `overrides` (the embedded demo's is VotingConfig()'s defaults)."""
    from rlhf_core.config import VotingConfig

    return VotingConfig.model_validate(cfg.voting.model_dump() | overrides)


def run_settings(args: argparse.Namespace, *options: str) -> dict:
    """What a seed's kept result depends on besides the seed and the code: the round's config (the sha256 of its
    text; None: the embedded demo's) and the benchmark's `options` (argument names)."""
    import hashlib

    if args.config and not Path(args.config).is_file():
        raise SystemExit(f"--config {args.config}: no such file")
    config = hashlib.sha256(Path(args.config).read_bytes()).hexdigest()[:16] if args.config else None
    return {"config_sha256": config, **{name: getattr(args, name) for name in options}}


def seed_results(seeds: list[int], work_dir: Path, run_seed, settings: dict) -> list[dict]:
    """run_seed(seed, workdir) for each seed, in a temporary workdir under `work_dir`; each result is kept as
    work_dir/seed<N>.json (written atomically), so a killed benchmark resumes with the next seed. `settings`
    (`run_settings`): a work dir holding results of other settings is refused (`check_kept_settings`)."""
    from rlhf_core.artifacts import atomic_write_text

    check_kept_settings(work_dir, settings)
    results = []
    for seed in seeds:
        done = work_dir / f"seed{seed}.json"
        if not done.exists():
            with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
                atomic_write_text(done, json.dumps(run_seed(seed, Path(tmp))))
        results.append(json.loads(done.read_text()))
    return results


def rm_report(model, tokenizer, eval_pairs, cfg) -> dict:
    from rlhf_core.reward.model import score_texts
    from rlhf_core.reward.train import pair_reward_diffs
    from rlhf_core.sim.metrics import accuracy_by_pair_type, answer_probe

    out = accuracy_by_pair_type(pair_reward_diffs(model, tokenizer, eval_pairs, cfg.max_length), eval_pairs)
    out.update(answer_probe(lambda p, r: score_texts(model, tokenizer, p, r, cfg.max_length).numpy()))
    return out


def run_seed(cfg) -> dict:
    """Sections 1-4 on the pairs of the round `cfg` (run to the end)."""
    from scipy.stats import spearmanr

    from flows.round import rlhf_round
    from rlhf_core.config import DenoiseConfig
    from rlhf_core.reward.denoise import denoise
    from rlhf_core.reward.train import train_reward_model
    from rlhf_core.reward.voting import vote
    from rlhf_core.sim.metrics import agreement_by_strength_decile, flip_report

    seed = cfg.seed
    summary = rlhf_round(config=cfg)
    art = summary["artifacts"]
    policy, pairs, eval_pairs = round_pairs(art, seed)
    result: dict = {"seed": seed, "round headline": summary.get("headline"), "n_pairs": len(pairs),
                    "n_eval_pairs": len(eval_pairs), "recipes": {},
                    "schemes": {}, "methods": {}}

    for name, overrides in RECIPES.items():
        overrides = dict(overrides)
        gold = overrides.pop("_gold", False)
        train_cfg = type(cfg.reward.train).model_validate(cfg.reward.train.model_dump() | overrides)
        t0 = time.time()
        model, tok, _ = train_reward_model(policy, gold_oriented(pairs) if gold else pairs, train_cfg, seed=seed)
        result["recipes"][name] = rm_report(model, tok, eval_pairs, train_cfg) | {"seconds": time.time() - t0}
        print(seed, name, result["recipes"][name], flush=True)

    votes_by_scheme = {}
    for name, overrides in SCHEMES.items():
        vcfg = round_voting(cfg, overrides)
        t0 = time.time()
        votes, report = vote(policy, pairs, vcfg, seed=seed)  # the paper's scheme again too: its time is the unit
        seconds = time.time() - t0
        votes_by_scheme[name] = votes
        denoised, _ = denoise(pairs, votes, DenoiseConfig(method="flip"))
        result["schemes"][name] = {
            "deciles": agreement_by_strength_decile(votes["mean"].to_numpy(), pairs),
            "share_flipped": float(denoised["flipped"].mean()),
            "seconds": seconds,
            **flip_report(pairs, denoised),
        }
        print(seed, name, result["schemes"][name], flush=True)
    # the same in-sample votes bucketed with a symmetric band: pairs with -0.1 < z < 0 are smoothed, not flipped
    from rlhf_core.reward.voting import bucket

    sym = votes_by_scheme["faithful, in-sample (paper)"].copy()
    sym["bucket"] = bucket(sym["mean"].to_numpy(), 0.1, float(sym["mean"].std(ddof=0)), symmetric=True)
    votes_by_scheme[SYMMETRIC] = sym
    denoised, _ = denoise(pairs, sym, DenoiseConfig(method="flip"))
    result["schemes"][SYMMETRIC] = {
        "deciles": result["schemes"]["faithful, in-sample (paper)"]["deciles"],
        "share_flipped": float(denoised["flipped"].mean()),
        "seconds": result["schemes"]["faithful, in-sample (paper)"]["seconds"],
        **flip_report(pairs, denoised),
    }
    faithful = votes_by_scheme["faithful, in-sample (paper)"]["mean"].to_numpy()
    for name, votes in votes_by_scheme.items():
        result["schemes"][name]["spearman_vs_faithful"] = float(spearmanr(votes["mean"].to_numpy(), faithful)[0])

    for method in METHODS + (SYMMETRIC_METHOD,):
        votes = votes_by_scheme[SYMMETRIC if method == SYMMETRIC_METHOD else "faithful, in-sample (paper)"]
        denoised, _ = denoise(pairs, votes, DenoiseConfig(method=method.split(",")[0]))
        model, tok, _ = train_reward_model(policy, denoised, cfg.reward.train, seed=seed)
        result["methods"][method] = rm_report(model, tok, eval_pairs, cfg.reward.train)
        print(seed, method, result["methods"][method], flush=True)

    result.update(meta_section(art, pairs, eval_pairs, cfg, seed))
    return result


SCARCE_FRACTIONS = (0.25, 0.5)
SCARCE_METHODS = ("baseline", "flip", "flip_margin", "soft_label_margin")


def meta_section(art: dict, pairs, eval_pairs, cfg, seed: int) -> dict:
    """Section 4: vanilla vs MetaRM on the round's denoised pairs, the meta step on samples of the
    round's PPO policy; accuracy on gold pairs of the SFT policy and of the PPO policy."""
    from rlhf_core.config import MetaRMConfig
    from rlhf_core.reward.train import pair_reward_diffs, train_reward_model
    from rlhf_core.schemas import read_table
    from rlhf_core.sim.metrics import accuracy_by_pair_type, gold_eval_pairs

    policy, ppo_policy = art["sft"]["path"], art["ppo"]["path"]
    eval_prompts = read_table("prompts", Path(art["world"]["path"]) / "eval_prompts.parquet")["prompt"].tolist()
    samples = meta_samples(ppo_policy, sorted(pairs["prompt"].unique()), META_SAMPLES_PER_PROMPT, seed)
    shifted_pairs = gold_eval_pairs(ppo_policy, eval_prompts, seed=seed, samples_per_prompt=8)
    denoised = read_table("denoised", Path(art["denoise"]["path"]) / "denoised.parquet")
    out = {"n_shifted_eval_pairs": len(shifted_pairs),
           "meta_distinct_per_prompt": float(samples.groupby("prompt")["response"].nunique().mean()), "meta": {}}
    for name, meta in META_RUNS.items():
        train_cfg = cfg.reward.train.model_copy(update={"meta": MetaRMConfig(**meta)})
        t0 = time.time()
        model, tok, report = train_reward_model(policy, denoised, train_cfg, seed=seed, meta_samples=samples)
        seconds = time.time() - t0
        out["meta"][name] = {
            "sft": accuracy_by_pair_type(pair_reward_diffs(model, tok, eval_pairs, train_cfg.max_length), eval_pairs),
            "ppo": accuracy_by_pair_type(pair_reward_diffs(model, tok, shifted_pairs, train_cfg.max_length),
                                         shifted_pairs),
            "seconds": seconds,
            "meta_difference": report.get("meta_difference", float("nan")),
        }
        print(seed, name, out["meta"][name], flush=True)
    return out


# A PPO that drifts, the distribution MetaRM is for: 10x the demo's policy lr and no KL penalty. (It was
# kl_coef 0.05 and no ptx, which became the PPO-max defaults, so 4b silently re-ran the round's own PPO.)
SHIFT_PPO = {"policy_lr": 1e-4, "kl_coef": 0.0}


def shifted_round(cfg, shift: dict | None = None) -> tuple:
    """The round `cfg` with its PPO config updated by `shift` (default SHIFT_PPO), up to its evaluation (earlier
    stages from the cache): (its config, its summary: artifacts and headline). Also benchmarks/metarm_shift.py's
    drifted policy."""
    from flows.round import rlhf_round

    shift = SHIFT_PPO if shift is None else shift
    shifted = cfg.ppo.model_copy(update=shift)
    if shifted == cfg.ppo:
        raise ValueError(f"PPO shift {shift} is the round's own PPO config: there would be no shift to measure")
    cfg = cfg.model_copy(update={"ppo": shifted})
    return cfg, rlhf_round(config=cfg, stop_after="evaluate")


def run_meta_shift(cfg) -> dict:
    """Section 4b: section 4 against a policy shifted further, the round `cfg` with PPO SHIFT_PPO."""
    seed = cfg.seed
    cfg, summary = shifted_round(cfg)
    art = summary["artifacts"]
    _, pairs, eval_pairs = round_pairs(art, seed)
    headline = summary.get("headline", {})
    return meta_section(art, pairs, eval_pairs, cfg, seed) | {
        "kl": headline.get("KL(new policy || SFT)"), "gold_sft": headline.get("gold score, SFT"),
        "gold_ppo": headline.get("gold score, new policy")}


def run_scarce(cfg) -> dict:
    """Section 5: does denoising pay when pairs are few? The methods on a random share of the pairs.

    The round `cfg` runs up to the imported comparisons (a re-run in its workdir takes it from the cache);
    for each fraction the pairs are subsampled, voted on (faithful, in-sample) and denoised, and a
    reward model is trained per method and on the gold labels of the same pairs.
    """
    import numpy as np

    from flows.round import rlhf_round
    from rlhf_core.config import DenoiseConfig
    from rlhf_core.reward.denoise import denoise
    from rlhf_core.reward.train import pair_reward_diffs, train_reward_model
    from rlhf_core.reward.voting import vote
    from rlhf_core.sim.metrics import accuracy_by_pair_type, flip_report

    seed = cfg.seed
    art = rlhf_round(config=cfg, stop_after="import_annotations")["artifacts"]
    policy, pairs, eval_pairs = round_pairs(art, seed)
    out = {}
    for fraction in SCARCE_FRACTIONS:
        rng = np.random.default_rng([seed, int(fraction * 1000)])
        subset = pairs.iloc[np.sort(rng.choice(len(pairs), size=int(len(pairs) * fraction), replace=False))]
        votes, _ = vote(policy, subset, round_voting(cfg, PAPER_BAND), seed=seed)
        row = {"n_pairs": len(subset), **flip_report(subset, denoise(subset, votes, DenoiseConfig(method="flip"))[0])}
        for method in (*SCARCE_METHODS, "gold labels (ceiling)"):
            train_pairs = (gold_oriented(subset) if method.startswith("gold")
                           else denoise(subset, votes, DenoiseConfig(method=method))[0])
            model, tok, _ = train_reward_model(policy, train_pairs, cfg.reward.train, seed=seed)
            diffs = pair_reward_diffs(model, tok, eval_pairs, cfg.reward.train.max_length)
            row[method] = accuracy_by_pair_type(diffs, eval_pairs)["all"]
        out[str(fraction)] = row
        print(seed, "scarce", fraction, row, flush=True)
    return out


def _cell(values, fmt: str = ".3f") -> str:
    """Mean (min..max) of the values that are not NaN, each in `fmt`; "n/a" when none is."""
    import numpy as np

    v = np.array([x for x in values if x == x], dtype=float)
    if not len(v):
        return "n/a"
    return f"{v.mean():{fmt}}" if len(v) == 1 else f"{v.mean():{fmt}} ({v.min():{fmt}}..{v.max():{fmt}})"


def _meta_table(per_seed: list[dict]) -> list[str]:
    """Markdown rows of a MetaRM section: each run's accuracy on the SFT and the PPO policy's pairs."""
    lines = ["| reward model | SFT pairs, overall | SFT pairs, correctness only | PPO pairs, overall "
             "| PPO pairs, correctness only | seconds |", "|---|---|---|---|---|---|"]
    for name in META_RUNS:
        rows = [meta[name] for meta in per_seed]
        cells = [_cell([x[d].get(k, float("nan")) for x in rows]) for d in ("sft", "ppo")
                 for k in ("all", "correctness_only")]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {_cell([x['seconds'] for x in rows])} |")
    return lines


def write_report(results: list[dict], out: Path, figure_dir: Path, seconds: float) -> None:
    import numpy as np
    import torch

    from tasks.plots import plt

    seeds = [r["seed"] for r in results]
    lines = [
        "# Reward modelling on the simulated world (Secrets of RLHF Part II)",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `benchmarks/reward_modelling.py`, seeds {seeds}, "
        f"{os.cpu_count()} cores ({platform.machine()}), torch {torch.__version__}, no GPU; this invocation "
        f"{seconds / 60:.0f} min (seeds finished earlier are read from --work-dir; the seconds in the tables are "
        "each run's own).",
        f"Pairs per seed: {[r['n_pairs'] for r in results]} annotated; held-out gold pairs: "
        f"{[r['n_eval_pairs'] for r in results]}. Cells: mean over seeds (min..max). Gold-tied pairs are left out "
        "of every agreement and accuracy.",
        "",
        "## 1. Reward-model recipes, trained on the raw (noisy) labels",
        "",
        "| recipe | overall | correctness only | style only | style agrees | style conflicts | probe R² number "
        "| probe R² distance | probe top-1 right | seconds (train + score) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in RECIPES:
        rows = [r["recipes"][name] for r in results]
        cells = [_cell([x["all"] for x in rows])] + [_cell([x.get(t, float("nan")) for x in rows]) for t in TYPES]
        cells += [_cell([x[k] for x in rows]) for k in ("r2_number", "r2_distance", "top1_correct", "seconds")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## 2. Voting: does preference strength find the wrong labels?",
        "",
        "| scheme | bottom decile agreement | top decile agreement | flipped | flip precision | flip recall "
        "| agreement before | after flipping | Spearman vs faithful | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in (*SCHEMES, SYMMETRIC):
        rows = [r["schemes"][name] for r in results]
        cells = [_cell([x["deciles"][0] for x in rows]), _cell([x["deciles"][-1] for x in rows]),
                 _cell([x["share_flipped"] for x in rows]),
                 *[_cell([x[k] for x in rows]) for k in ("flip_precision_excl_gold_ties", "flip_recall_excl_gold_ties",
                                                         "gold_agreement_before_excl_gold_ties",
                                                         "gold_agreement_after_excl_gold_ties",
                                                         "spearman_vs_faithful", "seconds")]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Agreement of the original labels with gold per strength decile (weakest first):", "",
              "| scheme | " + " | ".join(str(i) for i in range(1, 11)) + " |", "|---|" + "---|" * 10]
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    for name in SCHEMES:
        deciles = np.array([r["schemes"][name]["deciles"] for r in results])  # (seeds, 10)
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in deciles.mean(0)) + " |")
        ax.errorbar(range(1, 11), deciles.mean(0), yerr=[deciles.mean(0) - deciles.min(0),
                                                         deciles.max(0) - deciles.mean(0)], label=name, capsize=3)
    ax.set_ylim(0, 1)
    ax.set_xlabel("strength decile (weakest first)")
    ax.set_ylabel("label agrees with gold")
    ax.legend(fontsize=7)
    fig.tight_layout()
    figure_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(figure_dir / "reward-strength-deciles.png", dpi=110)
    plt.close(fig)
    lines += ["", "![agreement by strength decile](figures/reward-strength-deciles.png)", "",
              "## 3. Denoising methods (Part II sec. 2.5), votes of the faithful in-sample scheme", "",
              "| method | overall | correctness only | style only | style agrees | style conflicts |",
              "|---|---|---|---|---|---|"]
    for method in (*METHODS, SYMMETRIC_METHOD):
        rows = [r["methods"][method] for r in results]
        cells = [_cell([x["all"] for x in rows])] + [_cell([x.get(t, float("nan")) for x in rows]) for t in TYPES]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "## 4. MetaRM on the shifted distribution (Part II sec. 3.2)", "",
              f"Both trained on the round's denoised pairs with the default recipe; MetaRM's meta step sees "
              f"{META_SAMPLES_PER_PROMPT} samples of the round's PPO policy per training prompt "
              f"({_cell([r['meta_distinct_per_prompt'] for r in results])} distinct). Held-out gold pairs: "
              f"{[r['n_eval_pairs'] for r in results]} of the SFT policy, {[r['n_shifted_eval_pairs'] for r in results]} "
              "of the PPO policy.", "",
              *_meta_table([r["meta"] for r in results])]
    shift = [r["meta_shift"] for r in results]
    lines += ["", f"### 4b. A policy shifted further: PPO with {SHIFT_PPO}", "",
              f"The round re-run with that PPO (the rest of its config the default): KL to SFT "
              f"{_cell([x['kl'] for x in shift])}, gold score SFT {_cell([x['gold_sft'] for x in shift])} -> PPO "
              f"{_cell([x['gold_ppo'] for x in shift])}. Held-out gold pairs of that policy: "
              f"{[x['n_shifted_eval_pairs'] for x in shift]}.", "",
              *_meta_table([x["meta"] for x in shift])]
    lines += ["", "## 5. When do the methods pay? A share of the pairs", "",
              "The same round's pairs subsampled at random, voted on (faithful, in-sample) and denoised; held-out "
              "gold accuracy of the reward model trained on each.", "",
              "| pairs | flip precision | agreement before | after flipping | " + " | ".join(SCARCE_METHODS)
              + " | gold labels (ceiling) |", "|---|" + "---|" * (len(SCARCE_METHODS) + 4)]
    for fraction in SCARCE_FRACTIONS:
        rows = [r["scarce"][str(fraction)] for r in results]
        cells = [_cell([x[k] for x in rows]) for k in ("flip_precision_excl_gold_ties",
                                                        "gold_agreement_before_excl_gold_ties",
                                                        "gold_agreement_after_excl_gold_ties",
                                                        *SCARCE_METHODS, "gold labels (ceiling)")]
        n_pairs = "..".join(str(f(x["n_pairs"] for x in rows)) for f in (min, max))
        lines.append(f"| {fraction:.0%} ({n_pairs}) | " + " | ".join(cells) + " |")
    lines.append("")
    out.write_text("\n".join(lines))
    (out.with_suffix(".json")).write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="docs/reward-modelling-benchmark.md")
    parser.add_argument("--work-dir", default="rlhf-runs/benchmarks/reward-modelling",
                        help="each finished seed's results (seedN.json): a re-run reuses them")
    add_round_arguments(parser)
    args = parser.parse_args(argv)
    from rlhf_core.artifacts import atomic_write_text

    start = time.time()
    work = Path(args.work_dir)
    check_kept_settings(work, run_settings(args))
    results = []
    for seed in args.seeds:
        done = work / f"seed{seed}.json"
        if not done.exists():
            with tempfile.TemporaryDirectory() as tmp:
                workdir = round_workdir(args.rounds_dir, seed, Path(tmp) / f"seed{seed}")
                atomic_write_text(done, json.dumps(run_seed(round_config(args.config, seed, workdir)), indent=1))
        result = json.loads(done.read_text())
        kept_round = round_config(args.config, seed, round_workdir(args.rounds_dir, seed, work / f"round-seed{seed}"))
        scarce = work / f"seed{seed}-scarce.json"
        if not scarce.exists():
            atomic_write_text(scarce, json.dumps(run_scarce(kept_round), indent=1))
        shift = work / f"seed{seed}-meta-shift.json"
        if not shift.exists():
            atomic_write_text(shift, json.dumps(run_meta_shift(kept_round), indent=1))
        results.append(result | {"scarce": json.loads(scarce.read_text()), "meta_shift": json.loads(shift.read_text())})
    out = Path(args.out)
    write_report(results, out, out.parent / "figures", time.time() - start)


if __name__ == "__main__":
    main()
