"""MetaRM on a drifted policy's pairs, compared pair by pair with the vanilla reward model (Secrets of RLHF Part II
sec. 3.2): writes docs/metarm-shift.md (+ .json).

    .venv/bin/python benchmarks/metarm_shift.py [--seeds 0 1 2] [--etas 0.1 0.3 1] [--eval-samples 32]
        [--model-seeds 0 1000] [--shift {default,hard,hacked}] [--config configs/mini.yaml] [--rounds-dir DIR]
        [--work-dir DIR]

Section 4b of benchmarks/reward_modelling.py found MetaRM 0.4 points ahead of the vanilla model on a drifted
policy's held-out pairs: one or two pairs of 330-420 per seed, too few to tell. This asks the same question with
enough pairs to answer it. Per seed:

- the round (from the cache with the reward-modelling benchmark's --rounds-dir) runs its PPO again with the
  --shift's settings (SHIFTS; default: reward_modelling.SHIFT_PPO, 10x the demo's policy lr, no KL penalty): the
  drifted policy;
- the meta step's samples: 8 of the drifted policy's samples per training prompt (as section 4b);
- held-out gold pairs: --eval-samples samples of the drifted policy per held-out prompt, consecutive samples
  paired, gold ties dropped; and the SFT policy's 8 per prompt (what MetaRM may cost in distribution);
- trained on the round's denoised pairs with the round's recipe: the vanilla model, the vanilla model with
  another seed (the control: what a different seed alone changes), and MetaRM at each eta (--etas).

Each model is compared with the vanilla model of its seed on the same pairs: b pairs only it gets right, c pairs
only vanilla gets right, pooled over seeds, with the exact two-sided sign-test p-value of b against c; and, since a
prompt's pairs are not independent, the same test over prompts (prompts where it gets more of the prompt's pairs
right than vanilla, against prompts where vanilla gets more). MetaRM is shown where it is ahead on every seed and
the test over prompts gives p < 0.05; the control says how far a seed change alone moves the model.

--shift hard (written 2026-11-27, before its run) drifts further: policy lr 3e-4 for 150 iterations, no KL. The default
shift left the vanilla model only 1.4 points worse on the drifted pairs than on the SFT policy's, too little for MetaRM
to keep. With the hard shift, Part II's claim is shown where (1) vanilla loses more under it than under the default
shift, (2) MetaRM at the default eta 0.1 is ahead of vanilla on every seed at both model seeds, with p < 0.05 over
prompts pooled, and (3) MetaRM loses less than vanilla from the SFT policy's pairs to the drifted ones.

--shift hacked (written 2026-11-27, before its run) is the default shift in a round whose reward recipe can be hacked:
the end-token read alone (reward.train.read=end_token: the reward model the PPO optimises and every model here; the
voters keep their own recipe, voting.train, so the denoised pairs are the round's). Against such a reward model the
drifted policy raises its learned reward while gold falls (docs/ppo-max.md 5b), so its responses are the ones that
reward model misjudges: the shift MetaRM is for. The default and hard shifts' drifted policies gained gold against the
round's recipe, which they could not hack. Shown where (1) vanilla loses at least 3 points from the SFT policy's pairs
to the drifted policy's, (2) as for hard, and (3) as for hard. Measured: not shown (docs/reward-modelling.md 11c).

Every finished (seed, model) is kept as JSON in --work-dir (the held-out pairs and the meta samples as parquet), so a
killed run resumes and more etas add to the same table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
sys.path.insert(0, str(Path(__file__).parent))

from result_files import dots, figure_axes, keep_one_setting, save_figure  # noqa: E402
from reward_modelling import (META_SAMPLES_PER_PROMPT, SHIFT_PPO, TYPES, _cell, add_round_arguments,  # noqa: E402
                              meta_samples, round_config, round_workdir, shifted_round)

CONTROL_SEED_OFFSET = 100  # the control: the vanilla recipe trained with seed + 100
SHIFTS = {  # --shift: name -> {"ppo": the drifted policy's PPO settings over the round's own, "round": overrides of
    # the round's config: its reward recipe for the PPO's reward model and every model here}
    "default": {"ppo": SHIFT_PPO},
    "hard": {"ppo": {"policy_lr": 3e-4, "kl_coef": 0.0, "iterations": 150}},  # ppo-max.md 5c's hardest push, 2.5x
    # the default shift in a round whose reward recipe can be hacked (the end-token read alone: ppo-max.md 5b), so
    # the drifted policy writes what that reward model misjudges
    "hacked": {"ppo": SHIFT_PPO, "round": ["reward.train.read=end_token"]},
}


def sign_test_p(b: int, c: int) -> float:
    """Exact two-sided sign test of b successes against c (p = 0.5 each): P(|X - n/2| >= |b - n/2|), n = b + c."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def model_names(etas: list[float]) -> list[str]:
    return ["vanilla", f"vanilla, seed + {CONTROL_SEED_OFFSET} (control)", *(f"MetaRM, eta {eta:g}" for eta in etas)]


def held_out_pairs(work: Path, seed: int, art: dict, eval_samples: int):
    """(the drifted policy's held-out gold pairs, the SFT policy's), kept in `work` so every model of the seed is
    scored on the same pairs."""
    import pandas as pd

    from rlhf_core.artifacts import atomic_write
    from rlhf_core.schemas import read_table
    from rlhf_core.sim.metrics import gold_eval_pairs

    eval_prompts = read_table("prompts", Path(art["world"]["path"]) / "eval_prompts.parquet")["prompt"].tolist()
    out = []
    for name, policy, n in (("drifted", art["ppo"]["path"], eval_samples), ("sft", art["sft"]["path"], 8)):
        path = work / f"seed{seed}-{name}-pairs.parquet"
        if not path.exists():
            pairs = gold_eval_pairs(policy, eval_prompts, seed=seed, samples_per_prompt=n)
            atomic_write(path, lambda f, pairs=pairs: pairs.to_parquet(f, index=False))
        out.append(pd.read_parquet(path))
    return out


def kept_model_file(seed: int, model_seed: int, name: str) -> str:
    """The file in --work-dir that keeps one trained model's results (its per-pair correctness included)."""
    model = ("" if model_seed == 0 else f"m{model_seed}-") + name.replace(" ", "_").replace(",", "")
    return f"seed{seed}-{model}.json"


def train_and_score(name: str, meta_etas: dict[str, float], cfg, art: dict, samples, drifted, sft_pairs,
                    model_seed: int) -> dict:
    """One model of the seed: trained on the round's denoised pairs, scored on both sets of held-out pairs.
    `meta_etas`: the MetaRM models' names -> their step size; any other name is trained without the meta step."""
    from rlhf_core.config import MetaRMConfig
    from rlhf_core.reward.train import pair_reward_diffs, train_reward_model
    from rlhf_core.schemas import read_table
    from rlhf_core.sim.metrics import accuracy_by_pair_type

    train_cfg = cfg.reward.train
    seed = cfg.seed + model_seed + (CONTROL_SEED_OFFSET if "control" in name else 0)
    if name in meta_etas:
        train_cfg = train_cfg.model_copy(update={"meta": MetaRMConfig(enabled=True, inner_lr=meta_etas[name])})
    denoised = read_table("denoised", Path(art["denoise"]["path"]) / "denoised.parquet")
    t0 = time.time()
    model, tok, report = train_reward_model(art["sft"]["path"], denoised, train_cfg, seed=seed,
                                            meta_samples=samples if name in meta_etas else None)
    seconds = time.time() - t0
    drifted_diffs = pair_reward_diffs(model, tok, drifted, train_cfg.max_length)
    sft_diffs = pair_reward_diffs(model, tok, sft_pairs, train_cfg.max_length)
    return {"drifted": accuracy_by_pair_type(drifted_diffs, drifted),
            "sft": accuracy_by_pair_type(sft_diffs, sft_pairs),
            "drifted_right": [bool(d > 0) for d in drifted_diffs],  # chosen is gold's better response
            "seconds": seconds, "meta_difference": report.get("meta_difference", float("nan"))}


def run_seed(cfg, work: Path, etas: list[float], eval_samples: int, model_seed: int = 0,
             shift: dict | None = None) -> dict:
    """Every model of `etas` (and the vanilla and control models) for the round `cfg` with its PPO drifted by
    `shift` (default SHIFT_PPO), each trained with seed cfg.seed + model_seed; each kept in `work`."""
    from rlhf_core.artifacts import atomic_write_text

    seed = cfg.seed
    _, summary = shifted_round(cfg, shift)
    art, headline = summary["artifacts"], summary.get("headline", {})
    drifted, sft_pairs = held_out_pairs(work, seed, art, eval_samples)
    samples = kept_meta_samples(work / f"seed{seed}-meta-samples.parquet", art, seed)
    meta_etas = {f"MetaRM, eta {eta:g}": eta for eta in etas}
    models = {}
    for name in model_names(etas):
        kept = work / kept_model_file(seed, model_seed, name)
        if not kept.exists():
            result = train_and_score(name, meta_etas, cfg, art, samples, drifted, sft_pairs, model_seed)
            print(seed, name, result["drifted"]["all"], result["sft"]["all"], f"{result['seconds']:.0f} s", flush=True)
            atomic_write_text(kept, json.dumps(result))
        models[name] = json.loads(kept.read_text())
    return {"seed": seed, "model_seed": model_seed, "drifted_prompts": drifted["prompt"].tolist(),
            "kl": headline.get("KL(new policy || SFT)"), "gold_sft": headline.get("gold score, SFT"),
            "gold_drifted": headline.get("gold score, new policy"), "n_drifted_pairs": len(drifted),
            "n_sft_pairs": len(sft_pairs),
            "meta_distinct_per_prompt": float(samples.groupby("prompt")["response"].nunique().mean()),
            "models": models}


def kept_meta_samples(path: Path, art: dict, seed: int):
    """The meta step's samples of the drifted policy (section 4b's: the same prompts and generator seeds), drawn once
    and kept at `path`."""
    import pandas as pd

    from rlhf_core.artifacts import atomic_write

    if not path.exists():
        samples = meta_samples(art["ppo"]["path"], sorted(read_prompts(art)), META_SAMPLES_PER_PROMPT, seed)
        atomic_write(path, lambda f: samples.to_parquet(f, index=False))
    return pd.read_parquet(path)


def read_prompts(art: dict) -> list[str]:
    """The round's training prompts: those of its imported comparisons."""
    from rlhf_core.schemas import read_table

    pairs = read_table("comparisons", Path(art["import_annotations"]["path"]) / "comparisons.parquet")
    return pairs["prompt"].unique().tolist()


def paired(vanilla: list[bool], other: list[bool]) -> tuple[int, int]:
    """(pairs only `other` gets right, pairs only `vanilla` gets right)."""
    if len(vanilla) != len(other):
        raise ValueError(f"scored on different pairs: {len(vanilla)} vs {len(other)}")
    b = sum(o and not v for v, o in zip(vanilla, other))
    c = sum(v and not o for v, o in zip(vanilla, other))
    return b, c


def paired_by_prompt(vanilla: list[bool], other: list[bool], prompts: list[str]) -> tuple[int, int]:
    """(prompts where `other` gets more of the prompt's pairs right than `vanilla`, prompts where vanilla gets more).
    A prompt's pairs share its question, so their discordances are not independent; prompts are."""
    lead: dict[str, int] = {}
    for v, o, prompt in zip(vanilla, other, prompts, strict=True):
        lead[prompt] = lead.get(prompt, 0) + int(o) - int(v)
    return sum(x > 0 for x in lead.values()), sum(x < 0 for x in lead.values())


def plot(summaries: list[dict], out: Path) -> str:
    """Held-out gold accuracy of every model on the SFT policy's pairs and on the drifted policy's: a dot per (seed,
    model seed), the mean a bar; the markdown line that shows it (the figure beside `out`, .png)."""
    names = list(summaries[0]["models"])
    fig, axes = figure_axes(2, width=6, height=0.35 * len(names) + 1.2)
    for ax, pairs in zip(axes, ("sft", "drifted")):
        dots(ax, {n: [r["models"][n][pairs]["all"] for r in summaries] for n in names}, "held-out gold accuracy",
             f"Pairs of the {'SFT' if pairs == 'sft' else 'drifted'} policy", point="a seed and model seed")
    return save_figure(fig, out)


def write_report(results: list[dict], etas: list[float], out: Path, eval_samples: int, command: str,
                 shift: dict) -> None:
    from rlhf_core.artifacts import atomic_write_text

    first = [r for r in results if r["model_seed"] == results[0]["model_seed"]]  # one entry per seed
    lines = [
        "# MetaRM on a drifted policy's pairs, paired with the vanilla reward model (Secrets of RLHF Part II sec. 3.2)",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `{command}`, seeds {[r['seed'] for r in first]}, "
        f"{os.cpu_count()} cores ({platform.machine()}), no GPU. The method is in the script's docstring.",
        f"The drifted policy: the round's PPO with {shift['ppo']}"
        + (f", in the round with {', '.join(shift['round'])}" if shift.get("round") else "") + "; KL to the SFT policy "
        f"{_cell([r['kl'] for r in first])}, gold score SFT {_cell([r['gold_sft'] for r in first])} → "
        f"{_cell([r['gold_drifted'] for r in first])}. Held-out gold pairs: {[r['n_drifted_pairs'] for r in first]} "
        f"of the drifted policy ({eval_samples} samples per held-out prompt), {[r['n_sft_pairs'] for r in first]} of "
        f"the SFT policy. The meta step's samples: {META_SAMPLES_PER_PROMPT} per training prompt "
        f"({_cell([r['meta_distinct_per_prompt'] for r in first], '.2f')} distinct).",
        "Cells: mean over seeds (min..max). b: drifted pairs only this model gets right, c: only the vanilla model of "
        "the same seed; pooled over seeds; p: exact two-sided sign test of b against c. A prompt's pairs are not "
        "independent, so the same test also runs over prompts: prompts where this model gets more of the prompt's "
        "pairs right than vanilla against prompts where vanilla gets more.",
    ]
    model_seeds = list(dict.fromkeys(r["model_seed"] for r in results))
    for model_seed in model_seeds:
        lines += ["", f"## Model seed {model_seed}: every model trained with seed = round seed + {model_seed}", "",
                  *_model_table([r for r in results if r["model_seed"] == model_seed], etas)]
    if len(model_seeds) > 1:
        lines += ["", f"## All model seeds pooled ({len(results)} trainings of each model)", "",
                  "Per-seed cells are per (seed, model seed); a prompt of two model seeds counts twice, once per "
                  "pair of models compared.", "", *_model_table(results, etas)]
    # the per-pair lists stay in --work-dir (kept_model_file): the doc's JSON holds the summaries
    summaries = [{k: v for k, v in r.items() if k != "drifted_prompts"}
                 | {"models": {name: {k: v for k, v in m.items() if k != "drifted_right"}
                               for name, m in r["models"].items()}} for r in results]
    lines += ["", plot(summaries, out), ""]
    atomic_write_text(out, "\n".join(lines))
    atomic_write_text(out.with_suffix(".json"), json.dumps(summaries, indent=1))
    print("\n".join(lines))


def _model_table(results: list[dict], etas: list[float]) -> list[str]:
    """One row per model: drifted-pair accuracy, its paired comparison with vanilla, per pair type, SFT pairs."""
    lines = [
        "| model | drifted pairs | Δ vs vanilla, points (per seed) | b / c pooled | p | prompts ahead / behind | p | "
        + " | ".join(f"drifted {t.replace('_', ' ')}" for t in TYPES) + " | SFT pairs | seconds |",
        "|---|---|---|---|---|---|---|" + "---|" * len(TYPES) + "---|---|",
    ]
    for name in model_names(etas):
        rows = [r["models"][name] for r in results]
        deltas = [100 * (m["drifted"]["all"] - r["models"]["vanilla"]["drifted"]["all"]) for m, r in zip(rows, results)]
        counts = [paired(r["models"]["vanilla"]["drifted_right"], m["drifted_right"]) for m, r in zip(rows, results)]
        b, c = sum(x[0] for x in counts), sum(x[1] for x in counts)
        # prompts keyed by seed (each has its own drifted samples of the held-out prompts) and model seed
        by_prompt = [paired_by_prompt(r["models"]["vanilla"]["drifted_right"], m["drifted_right"],
                                      [f"{r['seed']}:{r['model_seed']}:{p}" for p in r["drifted_prompts"]])
                     for m, r in zip(rows, results)]
        ahead, behind = sum(x[0] for x in by_prompt), sum(x[1] for x in by_prompt)
        lines.append(
            f"| {name} | {_cell([m['drifted']['all'] for m in rows])} | "
            + ("— | — | — | — | — | " if name == "vanilla" else
               f"{sum(deltas) / len(deltas):+.1f} ({', '.join(f'{d:+.1f}' for d in deltas)}) | {b} / {c} | "
               f"{sign_test_p(b, c):.3f} | {ahead} / {behind} | {sign_test_p(ahead, behind):.3f} | ")
            + " | ".join(_cell([m["drifted"].get(t, float("nan")) for m in rows]) for t in TYPES)
            + f" | {_cell([m['sft']['all'] for m in rows])} | {_cell([m['seconds'] for m in rows], '.0f')} |")
    return lines


def check_work_dir_shift(work: Path, shift: dict) -> None:
    """`work` keeps one shift's pairs and models: record it there on first use, refuse another shift after."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / "shift.json"
    if not path.exists() and any(work.glob("seed*-drifted-pairs.parquet")) and shift != SHIFTS["default"]:
        raise SystemExit(f"{work} holds pairs of another shift (made before shift.json was kept, so with "
                         f"{SHIFTS['default']}): give this shift its own --work-dir")

    def read_kept(text: str) -> dict:
        kept = json.loads(text)
        return kept if "ppo" in kept else {"ppo": kept}  # written before a shift could change the round: PPO alone

    keep_one_setting(path, shift, "give this shift its own --work-dir", read_kept)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--etas", type=float, nargs="+", default=[0.1, 0.3, 1.0],
                        help="MetaRM step sizes (reward.train.meta.inner_lr; the default recipe's is 0.1)")
    parser.add_argument("--eval-samples", type=int, default=32,
                        help="the drifted policy's samples per held-out prompt (paired consecutively)")
    parser.add_argument("--model-seeds", type=int, nargs="+", default=[0],
                        help="train every model with seed = round seed + each of these (a table per model seed)")
    parser.add_argument("--shift", choices=sorted(SHIFTS), default="default",
                        help="how far the policy drifts (SHIFTS); each shift has its own report and work dir")
    parser.add_argument("--out", help="default docs/metarm-shift.md, docs/metarm-shift-<shift>.md for another shift")
    parser.add_argument("--work-dir", help="default rlhf-runs/benchmarks/metarm-shift[-<shift>]")
    add_round_arguments(parser)
    args = parser.parse_args(argv)
    if args.eval_samples < 2 or args.eval_samples % 2:
        raise SystemExit(f"--eval-samples {args.eval_samples}: give an even number >= 2 (samples are paired)")
    suffix = "" if args.shift == "default" else f"-{args.shift}"
    work = Path(args.work_dir or f"rlhf-runs/benchmarks/metarm-shift{suffix}")
    out = Path(args.out or f"docs/metarm-shift{suffix}.md")
    shift = SHIFTS[args.shift]
    check_work_dir_shift(work, shift)
    results = []
    for model_seed in args.model_seeds:
        for seed in args.seeds:
            cfg = round_config(args.config, seed, round_workdir(args.rounds_dir, seed, work / f"round-seed{seed}"),
                               tuple(shift.get("round", ())))
            results.append(run_seed(cfg, work, args.etas, args.eval_samples, model_seed, shift["ppo"]))
    command = "benchmarks/metarm_shift.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    write_report(results, args.etas, out, args.eval_samples, command, shift)


if __name__ == "__main__":
    main()
