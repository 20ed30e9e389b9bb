"""Which training labels, built from the round's votes, make the best final reward model? Each over several
model seeds, because one reward model's seed moves held-out accuracy by about a point: writes
docs/reward-label-sources.md (+ .json).

    .venv/bin/python benchmarks/reward_label_sources.py [--seeds 0 1 2] [--model-seeds 0 100]
        [--sources NAME ...] [--config configs/mini.yaml] [--rounds-dir DIR]
        [--annotator-error-max 0.5 [--annotator-temperature 0.5]]

Per seed, the round runs up to its votes (from the cache when it ran before: pass the --rounds-dir of the
reward-modelling benchmark). Each source of SOURCES builds training pairs from the round's imported
comparisons and votes; the round's reward recipe (`reward.train`) is trained on them once per model seed
(train seed = seed + model seed: model seed 0 is the reward-modelling benchmark's own model) and scored on
the held-out gold pairs overall and per pair type. A source is written `[voters:]labels[@recipe]`:

- labels: how the pairs are labelled (LABELS);
- voters: whose votes (VOTERS: the round's voting recipe with other settings, e.g. `oof5` out of fold over 5 folds;
  default the round's own votes, faithful in-sample, 10 one-epoch voters);
- recipe: `@NAME[+NAME...]` changes the final model's recipe (RECIPES: `@weighted` the weighted read, `@e4` 4 epochs,
  `@weighted+e4` both; default the round's `reward.train`).

With --annotator-error-max the round's pairs are first labelled again by noisier annotators (the world's
Bradley-Terry annotators, each flipping at a rate drawn in [0, max]) and the round's voting recipe votes on
those labels: Part II's methods where the labels are worse (give it its own --work-dir and --out). With
--annotator-temperature as well, the relabelling annotators' Bradley-Terry temperature changes too: a lower one gets
the close calls right more often, so more of the wrong labels are careless flips of clear pairs.

Every finished (seed, source, model seed) is kept as JSON in --work-dir (votes of other voters as parquet),
so a killed run resumes and more sources or model seeds add to the same table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
sys.path.insert(0, str(Path(__file__).parent))

from reward_data_budget import noisier_labels  # noqa: E402
from result_files import dots, figure_axes, keep_one_setting, save_figure  # noqa: E402
from reward_modelling import (PAPER_BAND, TYPES, _cell, add_round_arguments, gold_oriented,  # noqa: E402
                              round_config, round_pairs, round_voting, round_workdir)

LABELS = {  # name -> what it is (the builder is `training_pairs`)
    "baseline": "the annotators' labels as they are (Bradley-Terry baseline)",
    "gold": "gold-oriented labels, gold ties dropped (the ceiling)",
    "flip_paper": "flip, the paper's rule: reverse every pair with mean strength < 0",
    "flip_sym": "flip, the round's rule: reverse pairs with z <= -0.1 (symmetric band)",
    "round": "the round's own denoise config (flip_margin, symmetric band 0.1, smoothing of the ambiguous band)",
    "flip_paper_ls0.1": "flip (paper rule), then label smoothing 0.1 on every pair (reward.train.label_smoothing)",
    "flipsoft2": "flip (paper rule); a flipped pair's target is sigmoid(2 |z|) instead of the annotators' p",
    "distill2": "no flip; every pair's target is the ensemble's sigmoid(2 z) (distilling the votes)",
    "drop0.2": "flip (paper rule), then drop the pairs with |z| < 0.2",
    "drop0.4": "flip (paper rule), then drop the pairs with |z| < 0.4",
    "flip2_paper": "flip (paper rule); then the round's voting recipe votes again, trained on the flipped pairs "
                   "(voter seeds + 500), and flips again (paper rule)",
    "flip2oof_paper": "as flip2_paper, the second vote out of fold (voting.scheme out_of_fold, 2 folds)",
    "simcse": "the annotators' labels, with Part II's SimCSE loss on responses, coef 0.1 (reward.train.contrastive)",
    "flip_sym_simcse": "flip (the round's rule, z <= -0.1), with Part II's SimCSE loss on responses, coef 0.1",
}
SIMCSE = {"contrastive": {"coef": 0.1, "positives": "responses"}}  # section 6's better SimCSE (reward-modelling.md)
SECOND_VOTE = {"flip2_paper": {}, "flip2oof_paper": {"scheme": "out_of_fold"}}  # voting overrides of the 2nd vote
SECOND_VOTE_SEED = 500  # the second vote's voters get other seeds (init, data order) than the first's
VOTERS = {  # prefix -> voting overrides of the other voters ("train": voting.train overrides; faithful, 10 voters)
    "wv": {"train": {"read": "end_token+weighted_logprob"}},
    "v2": {"train": {"epochs": 2}},
    "oof5": {"scheme": "out_of_fold", "folds": 5},
    "oof10": {"scheme": "out_of_fold", "folds": 10},
    "v2oof5": {"scheme": "out_of_fold", "folds": 5, "train": {"epochs": 2}},
    "ls2": {"train": {"label_smoothing": 0.2}},
    "m20": {"n_models": 20},
}
RECIPES = {  # suffix -> reward.train overrides of the final model (the round's recipe: end_token+logprob, 2 epochs)
    "weighted": {"read": "end_token+weighted_logprob"},
    "e1": {"epochs": 1},
    "e3": {"epochs": 3},
    "e4": {"epochs": 4},
    "e6": {"epochs": 6},
    "lr3e-4": {"lr": 3e-4},
    "lr3e-5": {"lr": 3e-5},
}
SOURCES = ("baseline", "gold", "flip_paper", "flip_paper_ls0.1", "flipsoft2", "distill2", "drop0.2", "drop0.4",
           "baseline@weighted", "flip_paper@weighted", "gold@weighted", "wv:flip_paper", "wv:flip_paper@weighted",
           "v2:flip_paper", "flip2_paper", "flip2oof_paper")


def with_simcse(train_cfg):
    """`train_cfg` with SIMCSE's contrastive settings merged in (validated, so the nested config stays typed)."""
    from rlhf_core.config import deep_merge

    return type(train_cfg).model_validate(deep_merge(train_cfg.model_dump(), SIMCSE))


def training_pairs(labels: str, pairs, votes, train_cfg, revote=None, denoise_cfg=None):
    """(training pairs, reward.train config) of one LABELS entry, from the comparisons and a votes table (its z is
    the mean strength over `voting.strength_scale`). `revote(pairs, overrides)`: votes on other pairs, for the
    entries that vote twice (SECOND_VOTE)."""
    from scipy.special import expit

    from rlhf_core.config import DenoiseConfig
    from rlhf_core.reward.denoise import denoise
    from rlhf_core.reward.voting import bucket

    def flipped_by_paper_rule(pairs=pairs, votes=votes):
        paper = votes.copy()
        paper["bucket"] = bucket(votes["z"].to_numpy(), PAPER_BAND["ambiguous_band"], symmetric=False)
        return denoise(pairs, paper, DenoiseConfig(method="flip"))[0]

    if labels == "baseline":
        return pairs, train_cfg
    if labels == "gold":
        return gold_oriented(pairs), train_cfg
    if labels == "flip_paper":
        return flipped_by_paper_rule(), train_cfg
    if labels == "round":
        return denoise(pairs, votes, denoise_cfg)[0], train_cfg
    if labels == "flip_sym":
        return denoise(pairs, votes, DenoiseConfig(method="flip"))[0], train_cfg
    if labels == "simcse":
        return pairs, with_simcse(train_cfg)
    if labels == "flip_sym_simcse":
        return denoise(pairs, votes, DenoiseConfig(method="flip"))[0], with_simcse(train_cfg)
    if labels == "flip_paper_ls0.1":
        return flipped_by_paper_rule(), train_cfg.model_copy(update={"label_smoothing": 0.1})
    if labels == "flipsoft2":
        out = flipped_by_paper_rule()
        out["soft_label"] = np.where(out["flipped"], expit(2 * np.abs(out["z"])), out["soft_label"].fillna(1.0))
        return out, train_cfg
    if labels == "distill2":
        out = pairs.copy()
        out["soft_label"] = expit(2 * pairs[["pair_id"]].merge(votes, on="pair_id")["z"].to_numpy())
        return out, train_cfg
    if labels in SECOND_VOTE:
        once = flipped_by_paper_rule()
        twice = flipped_by_paper_rule(once, revote(once, SECOND_VOTE[labels]))
        twice["flipped"] = twice["flipped"] != once["flipped"].to_numpy()  # against the annotators' order
        return twice, train_cfg
    if labels.startswith("drop"):
        out = flipped_by_paper_rule()
        return out[np.abs(out["z"]) >= float(labels[len("drop"):])], train_cfg
    raise ValueError(f"unknown labels {labels!r}; known: {list(LABELS)}")


def parse_source(source: str) -> tuple[str | None, str, tuple[str, ...]]:
    """'[voters:]labels[@recipe[+recipe...]]' -> (voters prefix or None, labels, RECIPES names)."""
    voters, _, rest = source.rpartition(":")
    labels, _, recipe = rest.partition("@")
    recipes = tuple(recipe.split("+")) if recipe else ()
    if (voters and voters not in VOTERS) or labels not in LABELS or any(r not in RECIPES for r in recipes):
        raise ValueError(f"unknown source {source!r}: [{'|'.join(VOTERS)}:]{'|'.join(LABELS)}"
                         f"[@{'|'.join(RECIPES)}[+...]]")
    return voters or None, labels, recipes


def with_recipes(train_cfg, recipes: tuple[str, ...]):
    """`train_cfg` with the RECIPES overrides of `recipes` applied in order."""
    for name in recipes:
        train_cfg = train_cfg.model_copy(update=RECIPES[name])
    return train_cfg


def describe_recipes(recipes: tuple[str, ...]) -> str:
    return ", ".join(f"reward.train.{k} {v}" for name in recipes for k, v in RECIPES[name].items())


def voting_overrides(cfg, voters: str) -> dict:
    """The round's voting overrides of a VOTERS prefix (its "train" entry updates the round's voting.train)."""
    spec = dict(VOTERS[voters])
    train = spec.pop("train", {})
    return spec | {"train": cfg.voting.train.model_copy(update=train)}


def describe_voters(voters: str) -> str:
    spec = dict(VOTERS[voters])
    train = spec.pop("train", {})
    return ", ".join([*(f"voting.{k} {v}" for k, v in spec.items()),
                      *(f"voting.train.{k} {v}" for k, v in train.items())])


def other_votes(key: str, policy, pairs, cfg, work: Path, overrides: dict, seed_offset: int = 0):
    """The votes of the round's voting config with `overrides` on `pairs` (kept as parquet in `work` under
    `key`)."""
    from rlhf_core.artifacts import atomic_write
    from rlhf_core.reward.voting import vote
    from rlhf_core.schemas import read_table

    path = work / f"votes-{key}-seed{cfg.seed}.parquet"
    if not path.exists():
        votes, report = vote(policy, pairs, round_voting(cfg, overrides), seed=cfg.seed + seed_offset)
        print("voted", key, cfg.seed, report, flush=True)
        atomic_write(path, lambda f: votes.to_parquet(f, index=False))
    return read_table("votes", path)


def run_seed(cfg, sources: list[str], model_seeds: list[int], work: Path, annotator_error_max: float | None = None,
             annotator_temperature: float | None = None) -> list[dict]:
    from flows.round import rlhf_round
    from rlhf_core.artifacts import atomic_write_text
    from rlhf_core.reward.train import pair_reward_diffs, train_reward_model
    from rlhf_core.schemas import read_table
    from rlhf_core.sim.metrics import accuracy_by_pair_type, gold_difference

    seed = cfg.seed
    art = rlhf_round(config=cfg, stop_after="vote")["artifacts"]
    policy, pairs, eval_pairs = round_pairs(art, seed)
    if annotator_error_max is None:
        round_votes = read_table("votes", Path(art["vote"]["path"]) / "votes.parquet")
    else:  # the same pairs labelled by noisier annotators, and the round's voting recipe on those labels
        pairs, round_votes = noisier_labels(cfg, policy, pairs, annotator_error_max,
                                            work / f"votes-relabelled-seed{seed}.parquet", annotator_temperature)
    rows = []
    for source in sources:
        voters, labels, recipes = parse_source(source)
        overrides = voting_overrides(cfg, voters) if voters else {}
        votes = other_votes(voters, policy, pairs, cfg, work, overrides) if voters else round_votes

        def revote(flipped, second):
            return other_votes(f"{voters or 'round'}-{labels}", policy, flipped, cfg, work, overrides | second,
                               SECOND_VOTE_SEED)

        train, train_cfg = training_pairs(labels, pairs, votes, cfg.reward.train, revote, cfg.denoise)
        train_cfg = with_recipes(train_cfg, recipes)
        gold = gold_difference(train["prompt"], train["chosen"], train["rejected"])
        p = train["soft_label"].fillna(1.0).to_numpy() if "soft_label" in train else np.ones(len(train))
        # where the training labels are wrong: p > 0.5 says "chosen is better"; computed on every read, so the rows
        # kept before this column existed get it too
        labels_by_type = {f"labels_{t}": v for t, v in accuracy_by_pair_type(p - 0.5, train).items()
                          if t in TYPES}
        for model_seed in model_seeds:
            kept = work / f"seed{seed}" / f"{source.replace(':', '_')}-m{model_seed}.json"
            if not kept.exists():
                t0 = time.time()
                model, tok, _ = train_reward_model(policy, train, train_cfg, seed=seed + model_seed)
                row = {"seed": seed, "source": source, "model_seed": model_seed, "n": len(train),
                       "label_accuracy": float(np.mean(((p > 0.5) == (gold > 0))[gold != 0])),
                       **accuracy_by_pair_type(pair_reward_diffs(model, tok, eval_pairs, train_cfg.max_length),
                                               eval_pairs), "seconds": time.time() - t0}
                kept.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(kept, json.dumps(row))
                print(json.dumps(row), flush=True)
            rows.append(json.loads(kept.read_text()) | labels_by_type)
    return rows


def write_report(rows: list[dict], out: Path, annotator_error_max: float | None = None, command: str = "",
                 annotator_temperature: float | None = None) -> None:
    import pandas as pd

    df = pd.DataFrame(rows)
    per_seed = df.groupby(["source", "seed"]).mean(numeric_only=True)  # mean over model seeds
    base = per_seed.xs("baseline", level="source")["all"] if "baseline" in df["source"].values else None
    seeds, model_seeds = sorted(df["seed"].unique()), sorted(df["model_seed"].unique())
    lines = [
        "# Which labels from the round's votes make the best final reward model",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `{command or 'benchmarks/reward_label_sources.py'}`, seeds "
        f"{[int(s) for s in seeds]}, model seeds {[int(s) for s in model_seeds]}, {os.cpu_count()} cores "
        f"({platform.machine()}), no GPU. A source is `[voters:]labels[@recipe]` (the script's docstring).",
        "Cells: per seed the mean over its model seeds, then the mean over seeds (min..max over seeds). Δ is against "
        "the baseline (raw labels, the round's read) of the same seed, in points. Held-out gold accuracy; "
        "gold-tied pairs left out.",
        *([] if annotator_error_max is None else [
            f"Labels: the round's pairs labelled again by annotators who flip at a rate drawn in [0, "
            f"{annotator_error_max:g}] (`--annotator-error-max`; the world's: [0, 0.2])"
            + ("" if annotator_temperature is None else
               f" with Bradley-Terry temperature {annotator_temperature:g} (`--annotator-temperature`; the "
               "world's: 0.9)")
            + ", voted on by the round's voting recipe; every source is built from those labels and votes."]),
        "",
        "| source | what | overall | Δ vs baseline: mean (per seed) | " + " | ".join(t.replace("_", " ") for t in TYPES)
        + " | label accuracy | pairs |",
        "|---|---|---|---|" + "---|" * len(TYPES) + "---|---|",
    ]
    for source in dict.fromkeys(df["source"]):
        s = per_seed.xs(source, level="source")
        voters, labels, recipes = parse_source(source)
        what = LABELS[labels]
        if voters:
            what += "; votes of voters with " + describe_voters(voters)
        if recipes:
            what += "; final model with " + describe_recipes(recipes)
        gains = [] if base is None else [100 * (s["all"][k] - base[k]) for k in s.index if k in base.index]
        delta = "n/a" if not gains else f"{np.mean(gains):+.1f} (" + ", ".join(f"{g:+.1f}" for g in gains) + ")"
        cells = [_cell(s[t].tolist()) if t in s else "n/a" for t in TYPES]
        what = what.replace("|", "\\|")  # |z| in a table cell: escaped, or it splits the cell
        lines.append(f"| {source} | {what} | {_cell(s['all'].tolist())} | {delta} | " + " | ".join(cells)
                     + f" | {_cell(s['label_accuracy'].tolist())} | {_cell(s['n'].tolist(), '.0f')} |")
    lines += ["", "Where the training labels are wrong: their agreement with gold per pair type (mean over seeds, "
              "min..max; gold-tied pairs left out):", "",
              "| source | " + " | ".join(t.replace("_", " ") for t in TYPES) + " | all |",
              "|---|" + "---|" * (len(TYPES) + 1)]
    for source in dict.fromkeys(df["source"]):
        s = per_seed.xs(source, level="source")
        lines.append(f"| {source} | " + " | ".join(_cell(s[f"labels_{t}"].tolist()) if f"labels_{t}" in s else "n/a"
                                                   for t in TYPES) + f" | {_cell(s['label_accuracy'].tolist())} |")
    lines += ["", "Each model's overall accuracy (seed / model seed):", "",
              "| source | " + " | ".join(f"{s}/{m}" for s in seeds for m in model_seeds) + " |",
              "|---|" + "---|" * (len(seeds) * len(model_seeds))]
    one = df.set_index(["source", "seed", "model_seed"])["all"]
    for source in dict.fromkeys(df["source"]):
        lines.append(f"| {source} | " + " | ".join(
            f"{one[(source, s, m)]:.3f}" if (source, s, m) in one.index else "–" for s in seeds for m in model_seeds)
            + " |")
    out.parent.mkdir(parents=True, exist_ok=True)
    lines += ["", plot(rows, out)]
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))


def plot(rows: list[dict], out: Path) -> str:
    """Held-out gold accuracy per source: each (seed, model seed)'s model a dot, their mean a bar; the markdown line
    that shows it (the figure beside `out`, .png)."""
    sources = list(dict.fromkeys(r["source"] for r in rows))
    fig, (ax,) = figure_axes(1, width=7, height=0.32 * len(sources) + 1.2)
    dots(ax, {s: [r["all"] for r in rows if r["source"] == s] for s in sources}, "held-out gold accuracy",
         "Final reward model by label source", point="a seed and model seed")
    return save_figure(fig, out)


def check_work_dir_labels(work: Path, labels: dict) -> None:
    """`work` keeps the votes and models of one labelling (the round's, or one relabelling): record it there on
    first use, refuse another after (its kept votes and models would be read back as if they were the other's)."""
    work.mkdir(parents=True, exist_ok=True)
    keep_one_setting(work / "labels.json", labels, "give these labels their own --work-dir")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--model-seeds", type=int, nargs="+", default=[0, 100],
                        help="offsets of the final models' train seeds (seed + offset); 0 = the round's own model")
    parser.add_argument("--sources", nargs="+", default=list(SOURCES), metavar="SOURCE",
                        help="[voters:]labels[@recipe[+recipe]], e.g. flip_paper, gold@weighted, v2:flip_paper, "
                             "round@e4")
    parser.add_argument("--out", type=Path, default=Path("docs/reward-label-sources.md"))
    parser.add_argument("--work-dir", type=Path, default=Path("rlhf-runs/benchmarks/reward-label-sources"))
    parser.add_argument("--annotator-error-max", type=float, default=None,
                        help="label the round's pairs again with annotators who flip at a rate drawn in [0, this] "
                        "(the world's annotator_error_max: 0.2), vote on those labels with the round's recipe, and "
                        "build every source from them; use its own --work-dir and --out")
    parser.add_argument("--annotator-temperature", type=float, default=None,
                        help="with --annotator-error-max: the relabelling annotators' Bradley-Terry temperature (the "
                        "world's annotator_temperature: 0.9); lower = fewer close calls wrong, so more of the wrong "
                        "labels are careless flips")
    add_round_arguments(parser)
    args = parser.parse_args(argv)
    if args.annotator_temperature is not None and args.annotator_error_max is None:
        parser.error("--annotator-temperature relabels the pairs: give --annotator-error-max too")
    for source in args.sources:
        parse_source(source)  # an unknown name fails before any round runs
    check_work_dir_labels(args.work_dir, {"annotator_error_max": args.annotator_error_max,
                                          "annotator_temperature": args.annotator_temperature})
    rows = []
    for seed in args.seeds:
        cfg = round_config(args.config, seed, round_workdir(args.rounds_dir, seed, args.work_dir / f"round-seed{seed}"))
        rows += run_seed(cfg, args.sources, args.model_seeds, args.work_dir, args.annotator_error_max,
                         args.annotator_temperature)
    command = shlex.join(["benchmarks/reward_label_sources.py", *(sys.argv[1:] if argv is None else argv)])
    write_report(rows, args.out, args.annotator_error_max, command, args.annotator_temperature)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
