"""reward.train.share_prompt measured (issue 12): padded tokens and epoch time per reply-group size on HH-RLHF pairs,
and one reward model trained with and without it on a simulated round: writes docs/shared-prompt.md, its JSON and
its figure.

    .venv/bin/python benchmarks/shared_prompt.py [--pairs-file ../shared/data/hh-rlhf-harmless-base/pairs.jsonl.gz]
        [--pairs 256] [--group-rows 4 8 16 32] [--repeats 2] [--seed 0] [--config C] [--rounds-dir DIR]

Part 1, HH-RLHF (trl_reward.py's setup: the first --pairs pairs that fit in 512 tokens, its tiny Qwen2, batch 16,
`length_grouped`): padded tokens the trunk runs per epoch (mean over 5 batch orders), plain rows against the prompt
shared with each group size; then one epoch of forward, backward and AdamW per setting, CPU seconds, the best of
--repeats. Part 2, the simulated world: seed --seed's round (its SFT policy and comparisons), the round's reward
recipe trained plain and shared, random and length-grouped batches: CPU seconds and held-out gold-pair accuracy.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_files import bars, figure_axes, save_figure, write_json  # noqa: E402
from reward_modelling import add_round_arguments, round_config, round_pairs, round_workdir  # noqa: E402
from rlhf_core.artifacts import atomic_write_text  # noqa: E402
from trl_reward import DEFAULT_PAIRS_FILE, build_backbone, hh_pairs  # noqa: E402


def hh_part(args) -> dict:
    from rlhf_core import models
    from rlhf_core.config import RewardTrainConfig
    from rlhf_core.reward.model import RewardModel
    from rlhf_core.reward.train import (encode_pairs, epoch_batches, make_optimizer, pair_batch,
                                        shared_prompt_batch)

    cfg = RewardTrainConfig(read="end_token", batching="length_grouped", batch_size=16, max_length=args.max_length)
    with tempfile.TemporaryDirectory(prefix="shared-prompt-") as tmp:
        backbone = Path(tmp) / "backbone"
        build_backbone(backbone, args.hidden_size, args.layers, args.max_length)
        tokenizer = models.load_tokenizer(backbone)
        pairs = hh_pairs(Path(args.pairs_file), args.pairs, tokenizer, args.max_length)
        encoded = encode_pairs(tokenizer, pairs, args.max_length)
        model = RewardModel.from_policy(backbone, 0, cfg.read)
        optimizer = make_optimizer(model, cfg)
        settings = [0, *args.group_rows]  # 0: the plain rows

        def batch(rows, group_rows):
            return pair_batch(encoded, rows) if group_rows == 0 else shared_prompt_batch(encoded, rows, group_rows)

        def tokens(b):
            if "continuations" not in b:
                return b["input_ids"].numel()
            length = b["prompt_mask"].sum(1)  # each prompt pass runs to its own longest prompt
            prompts = sum(len(g) * max(1, int(length[g].max())) for g in b["prompt_groups"])
            return prompts + sum(g["input_ids"].numel() for g in b["continuations"])

        padded, seconds = {}, {g: [] for g in settings}
        for g in settings:
            orders = [epoch_batches(len(pairs), cfg, np.random.default_rng(s), encoded.batching_lengths(g > 0))
                      for s in range(5)]
            padded[g] = float(np.mean([sum(tokens(batch(rows, g)) for rows in order) for order in orders]))
        for _ in range(args.repeats):
            for g in settings:
                order = epoch_batches(len(pairs), cfg, np.random.default_rng(0), encoded.batching_lengths(g > 0))
                cpu0 = time.process_time()
                for rows in order:
                    optimizer.zero_grad()
                    model(**batch(rows, g)).sum().backward()
                    optimizer.step()
                seconds[g].append(time.process_time() - cpu0)
                print("hh", g, f"{seconds[g][-1]:.2f} CPU s", flush=True)
    real = sum(len(c) + len(r) for c, r in zip(encoded.chosen, encoded.rejected))
    unique = real - sum(encoded.prompt)
    return {"pairs": len(pairs), "real_tokens": real, "unique_tokens": unique,
            "mean_prompt_tokens": float(np.mean(encoded.prompt)),
            "settings": {str(g): {"padded_tokens": padded[g], "cpu_seconds": seconds[g],
                                  "best_cpu_seconds": min(seconds[g])} for g in settings}}


def sim_part(args) -> dict:
    from flows.round import rlhf_round
    from rlhf_core.reward.train import pair_reward_diffs, train_reward_model
    from rlhf_core.sim.metrics import accuracy_by_pair_type

    cfg = round_config(args.config, args.seed, round_workdir(args.rounds_dir, args.seed,
                                                             Path(args.work_dir) / f"round-seed{args.seed}"))
    art = rlhf_round(config=cfg, stop_after="import_annotations")["artifacts"]
    policy, pairs, eval_pairs = round_pairs(art, args.seed)
    out = {"pairs": len(pairs), "runs": {}}
    for batching in ("random", "length_grouped"):
        for share in (False, True):
            train_cfg = cfg.reward.train.model_copy(update={"batching": batching, "share_prompt": share})
            cpu0 = time.process_time()
            model, tokenizer, _ = train_reward_model(policy, pairs, train_cfg, seed=args.seed)
            cpu = time.process_time() - cpu0
            accuracy = accuracy_by_pair_type(pair_reward_diffs(model, tokenizer, eval_pairs, train_cfg.max_length),
                                             eval_pairs)["all"]
            name = f"{batching}{', prompt shared' if share else ''}"
            out["runs"][name] = {"cpu_seconds": cpu, "held_out_accuracy": accuracy}
            print("sim", name, out["runs"][name], flush=True)
    return out


def write_report(result: dict, out: Path) -> None:
    hh, sim = result["hh"], result["sim"]
    plain = hh["settings"]["0"]
    lines = [
        "# Sharing the prompt between chosen and rejected (`reward.train.share_prompt`, issue 12)",
        "",
        f"Measured {result['date']} by `{result['command']}` on {result['machine']}.",
        "",
        f"## 1. HH-RLHF: {hh['pairs']} pairs, tiny Qwen2, batch 16, length-grouped, `end_token` read",
        "",
        f"Real tokens {hh['real_tokens']:,}; with each prompt once {hh['unique_tokens']:,} (prompts "
        f"{hh['mean_prompt_tokens']:.0f} tokens on average). Padded tokens: mean over 5 batch orders; CPU seconds: one "
        "epoch of forward, backward and AdamW, each run listed, the best against the plain rows' best.",
        "",
        "| rows | padded tokens per epoch | CPU seconds per epoch | best vs plain |",
        "|---|---|---|---|",
    ]
    for g, row in hh["settings"].items():
        name = "plain (chosen and rejected rows)" if g == "0" else f"prompt shared, prompts and replies in passes of {g}"
        lines.append(f"| {name} | {row['padded_tokens']:,.0f} | " + ", ".join(f"{s:.2f}" for s in row["cpu_seconds"])
                     + f" | {row['best_cpu_seconds'] / plain['best_cpu_seconds']:.2f} |")
    lines += ["", f"## 2. The simulated world: seed {result['seed']}'s round, {sim['pairs']:,} pairs, the round's "
              "reward recipe", "",
              "| batching | CPU seconds | held-out gold-pair accuracy |", "|---|---|---|"]
    for name, row in sim["runs"].items():
        lines.append(f"| {name} | {row['cpu_seconds']:.1f} | {row['held_out_accuracy']:.3f} |")
    lines += ["", plot(result, out), ""]
    atomic_write_text(out, "\n".join(lines))
    write_json(out, result)


def plot(result: dict, out: Path) -> str:
    """HH-RLHF: padded tokens and CPU seconds per epoch by rows a pass; the world: CPU seconds per batching."""
    hh, sim = result["hh"], result["sim"]
    names = {g: "plain rows" if g == "0" else f"shared, {g} rows a pass" for g in hh["settings"]}
    fig, (tokens, seconds, world) = figure_axes(3, width=4.6)
    bars(tokens, {names[g]: row["padded_tokens"] for g, row in hh["settings"].items()}, "padded tokens per epoch",
         "HH-RLHF: tokens the trunk runs")
    bars(seconds, {names[g]: row["best_cpu_seconds"] for g, row in hh["settings"].items()}, "CPU seconds (best)",
         "HH-RLHF: one epoch")
    bars(world, {name: row["cpu_seconds"] for name, row in sim["runs"].items()}, "CPU seconds",
         f"Simulated world, seed {result['seed']}: training")
    return save_figure(fig, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs-file", default=str(DEFAULT_PAIRS_FILE))
    parser.add_argument("--pairs", type=int, default=256)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--group-rows", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default="rlhf-runs/benchmarks/shared-prompt")
    parser.add_argument("--out", type=Path, default=Path("docs/shared-prompt.md"))
    add_round_arguments(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    result = {"date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}",
              "command": " ".join(["benchmarks/shared_prompt.py", *(sys.argv[1:] if argv is None else argv)]),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} on "
                         f"{torch.get_num_threads()} thread(s), no GPU",
              "seed": args.seed, "hh": hh_part(args), "sim": sim_part(args)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_report(result, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
