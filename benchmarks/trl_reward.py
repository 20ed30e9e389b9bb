"""Reward-model training, the project's `train_reward_model` against TRL's RewardTrainer (issue 12, first goal).

    .venv/bin/pip install -e '.[bench]'   # TRL 1.16.0, benchmarks only
    .venv/bin/python benchmarks/trl_reward.py [--pairs-file ../shared/data/hh-rlhf-harmless-base/pairs.jsonl.gz]
        [--pairs 256] [--repeats 3] [--json docs/benchmarks-trl-reward.json] [--doc docs/benchmarks.md]

Same tiny Qwen2 backbone (built from a config, saved once, loaded by both), the project's byte tokenizer on
both sides, the same real HH-RLHF pairs (prompt = the dialogue up to its last "\\n\\nAssistant:", responses =
the two final replies; only pairs whose longer side fits in --max-length tokens are taken, so neither side
truncates or drops one), batch 16, fp32, 1 epoch. Each contender is timed from model load to the end of
training; the contenders run in turn within every repeat (the order rotated each repeat), and the result is
the median pairs/s of each, its model FLOP utilisation (MFU, over the fp32 GEMM peak measured in the same run)
and its ratio to TRL's best contender. Contenders (--contenders picks some):

- project: `train_reward_model` with the default config: read `end_token+logprob` (also the response's
  log-likelihood under the tied LM head, more work per batch than TRL), batching `random`;
- project_end_token: the same with read `end_token`, the like-for-like one with TRL's plain head;
- project_grouped, project_end_token_grouped: the same two with batching `length_grouped`;
- project_shared_prompt, project_end_token_shared_prompt: `length_grouped` with `share_prompt` (each pair's prompt
  run once for both replies, the replies regrouped by length: rlhf_core/reward/model.py `shared_prompt_rewards`);
- trl: `trl.RewardTrainer` (no gradient checkpointing, no bf16: its fastest setting on a CPU), random sampler;
- trl_grouped: the same with transformers' `train_sampling_strategy="group_by_length"`.

Writes the JSON (--json), a bar chart of pairs/s beside it (same name, .png) and its own section of --doc, between
markers, keeping the rest of that file.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import shlex
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_section import replace_section  # noqa: E402
from rlhf_core import models  # noqa: E402
from rlhf_core.annotation.text_pairs import split_hh_dialogue  # noqa: E402
from rlhf_core.artifacts import atomic_write_text  # noqa: E402
from rlhf_core.config import PolicyModelConfig, RewardTrainConfig  # noqa: E402
from rlhf_core.reward.model import encode  # noqa: E402
from rlhf_core.reward.train import train_reward_model  # noqa: E402

DEFAULT_PAIRS_FILE = Path(__file__).resolve().parents[2] / "shared/data/hh-rlhf-harmless-base/pairs.jsonl.gz"
# the project's contenders: (reward read, batching, share_prompt) of RewardTrainConfig
PROJECT = {"project": ("end_token+logprob", "random", False), "project_end_token": ("end_token", "random", False),
           "project_grouped": ("end_token+logprob", "length_grouped", False),
           "project_end_token_grouped": ("end_token", "length_grouped", False),
           "project_shared_prompt": ("end_token+logprob", "length_grouped", True),
           "project_end_token_shared_prompt": ("end_token", "length_grouped", True)}
TRL = {"trl": "random", "trl_grouped": "group_by_length"}  # TrainingArguments.train_sampling_strategy
CONTENDERS = (*PROJECT, *TRL)
GOAL_RATIO = 1.5  # issue 12: project pairs/s >= 1.5x TRL's RewardTrainer
SECTION_START, SECTION_END = "<!-- trl-reward:start -->", "<!-- trl-reward:end -->"


def hh_pairs(path: Path, n: int, tokenizer, max_length: int) -> pd.DataFrame:
    """The first n pairs of an HH-RLHF file whose longer query + response + eos fits in max_length tokens."""
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            obj = json.loads(line)
            prompt, chosen, rejected = split_hh_dialogue(obj["chosen"], obj["rejected"])
            lengths = encode(tokenizer, [prompt, prompt], [chosen, rejected], max_length=10**9)["attention_mask"].sum(1)
            if int(lengths.max()) <= max_length:
                rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
                if len(rows) == n:
                    break
    if len(rows) < n:
        raise ValueError(f"{path} has only {len(rows)} pairs that fit in {max_length} tokens; asked for {n}")
    return pd.DataFrame(rows)


def build_backbone(out_dir: Path, hidden_size: int, layers: int, max_length: int) -> None:
    """A tiny Qwen2 causal LM with the byte tokenizer, saved as a Hugging Face directory both sides load."""
    tokenizer = models.build_tokenizer()
    cfg = PolicyModelConfig(hidden_size=hidden_size, intermediate_size=3 * hidden_size, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_length)
    models.save_hf(models.build_policy(cfg, tokenizer, seed=0), tokenizer, out_dir)


def run_project(backbone: Path, pairs: pd.DataFrame, read: str, batching: str, share_prompt: bool, args) -> dict:
    cfg = RewardTrainConfig(read=read, batching=batching, share_prompt=share_prompt, epochs=1,
                            share_prompt_group_rows=args.share_prompt_group_rows,
                            batch_size=args.batch_size, max_length=args.max_length)
    t0, cpu0 = time.perf_counter(), time.process_time()
    _, _, metrics = train_reward_model(backbone, pairs, cfg, seed=args.seed)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "steps": metrics["steps"], "final_loss": metrics["loss"]}


def trl_dataset(pairs: pd.DataFrame, tokenizer):
    """TRL's explicit-prompt format with the project's query template, so both sides see the same token ids
    (TRL appends the eos itself)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [models.format_query(tokenizer, p) for p in pairs["prompt"]],
                              "chosen": pairs["chosen"].tolist(), "rejected": pairs["rejected"].tolist()})


def run_trl(backbone: Path, pairs: pd.DataFrame, sampling: str, args, work_dir: Path) -> dict:
    import datasets
    from trl import RewardConfig, RewardTrainer

    datasets.disable_progress_bars()

    tokenizer = models.load_tokenizer(backbone)
    dataset = trl_dataset(pairs, tokenizer)
    config = RewardConfig(
        output_dir=str(work_dir / "trl-out"), per_device_train_batch_size=args.batch_size, num_train_epochs=1,
        learning_rate=1e-4, max_length=args.max_length, bf16=False, gradient_checkpointing=False,
        model_init_kwargs={"dtype": torch.float32}, use_cpu=True, seed=args.seed, save_strategy="no",
        report_to="none", disable_tqdm=True, logging_steps=10**6, train_sampling_strategy=sampling,
        remove_unused_columns=sampling != "group_by_length",  # keep the `length` column for the sampler
    )
    t0, cpu0 = time.perf_counter(), time.process_time()
    trainer = RewardTrainer(model=str(backbone), args=config, train_dataset=dataset, processing_class=tokenizer)
    if sampling == "group_by_length":
        # transformers' LengthGroupedSampler reads a `length` column (it cannot infer one from chosen_ids and
        # rejected_ids): the longer side, which the collator pads the pair to; computed inside the timed span
        trainer.train_dataset = trainer.train_dataset.map(
            lambda ex: {"length": max(len(ex["chosen_ids"]), len(ex["rejected_ids"]))})
    result = trainer.train()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    kept = len(trainer.train_dataset)
    if kept != len(pairs):
        raise RuntimeError(f"TRL kept {kept} of {len(pairs)} pairs (its max_length filter): the sides differ")
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "steps": result.global_step,
            "final_loss": result.training_loss,
            "_dataset": trainer.train_dataset}


def same_token_ids(trl_train_dataset, pairs: pd.DataFrame, tokenizer, max_length: int) -> bool:
    """Whether TRL's tokenised pairs are exactly the ids the project's `encode` gives (unpadded)."""
    prompts = pairs["prompt"].tolist()
    for side in ("chosen", "rejected"):
        batch = encode(tokenizer, prompts, pairs[side].tolist(), max_length)
        ours = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
        if ours != list(trl_train_dataset[f"{side}_ids"]):
            return False
    return True


def gemm_peak_flops(size: int = 1024, repeats: int = 10) -> float:
    """The fp32 GEMM peak of this machine on torch's current threads: the best of `repeats` square matmuls, FLOP/s."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def non_embedding_parameters(backbone: Path) -> int:
    """Parameters of the trunk without its token embeddings (the convention of model FLOP utilisation)."""
    model = models.load_policy(backbone)
    embeddings = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p is not embeddings)


def run_contender(name: str, backbone: Path, pairs: pd.DataFrame, args, work_dir: Path) -> dict:
    if name in TRL:
        return run_trl(backbone, pairs, TRL[name], args, work_dir)
    return run_project(backbone, pairs, *PROJECT[name], args)


def run_benchmark(args) -> dict:
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    contenders = tuple(args.contenders)
    tokenizer = models.build_tokenizer()
    pairs = hh_pairs(Path(args.pairs_file), args.pairs, tokenizer, args.max_length)
    lengths = {side: encode(tokenizer, pairs["prompt"].tolist(), pairs[side].tolist(), args.max_length)
               ["attention_mask"].sum(1) for side in ("chosen", "rejected")}
    real_tokens = int(lengths["chosen"].sum() + lengths["rejected"].sum())
    runs = {name: [] for name in contenders}
    peaks = [gemm_peak_flops()]
    with tempfile.TemporaryDirectory(prefix="trl-reward-") as tmp:
        work_dir = Path(tmp)
        backbone = work_dir / "backbone"
        build_backbone(backbone, args.hidden_size, args.layers, args.max_length)
        n_params = non_embedding_parameters(backbone)
        same_ids = None
        for repeat in range(args.repeats):
            shift = repeat % len(contenders)
            for name in contenders[shift:] + contenders[:shift]:  # rotated: no contender always runs first
                run = run_contender(name, backbone, pairs, args, work_dir)
                dataset = run.pop("_dataset", None)
                if dataset is not None and same_ids is None:
                    same_ids = same_token_ids(dataset, pairs, tokenizer, args.max_length)
                run["pairs_per_s"] = len(pairs) / run["seconds"]
                runs[name].append(run)
                print(f"repeat {repeat}: {name:26s} {run['seconds']:7.2f} s  {run['pairs_per_s']:6.2f} pairs/s",
                      flush=True)
            peaks.append(gemm_peak_flops())  # between repeats too: the best is the machine's least-loaded moment
    peak = max(peaks)
    median = {name: statistics.median(r["pairs_per_s"] for r in runs[name]) for name in contenders}
    # CPU seconds of this process (every torch thread): the work done, much less moved by other load than the wall
    cpu_median = {name: statistics.median(len(pairs) / r["cpu_seconds"] for r in runs[name]) for name in contenders}
    # model FLOPs of one training pass over the real (non-pad) tokens: 6 per non-embedding parameter per token
    mfu = {name: 6 * n_params * real_tokens * median[name] / len(pairs) / peak for name in contenders}
    trl_best = max((name for name in contenders if name in TRL), key=median.get, default=None)
    return {
        "benchmark": "trl_reward",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "arch": platform.machine(),
                    "processor": platform.processor() or platform.machine(), "python": platform.python_version(),
                    "torch": torch.__version__, "transformers": _version("transformers"), "trl": _version("trl"),
                    "fp32_gemm_peak_gflops": peak / 1e9, "load_average_at_start": args.load_at_start},
        "command": shlex.join(["python", "benchmarks/trl_reward.py", *args.argv]),
        "setup": {"pairs": len(pairs), "pairs_file": Path(args.pairs_file).name, "batch_size": args.batch_size,
                  "epochs": 1, "dtype": "float32", "max_length": args.max_length, "hidden_size": args.hidden_size,
                  "layers": args.layers, "repeats": args.repeats, "seed": args.seed,
                  "share_prompt_group_rows": args.share_prompt_group_rows,
                  "non_embedding_parameters": n_params,
                  "longest_pair_tokens": int(max(lengths["chosen"].max(), lengths["rejected"].max())),
                  "real_tokens": real_tokens, "same_token_ids": same_ids},
        "runs": runs,
        "median_pairs_per_s": median,
        "mfu": mfu,
        "median_pairs_per_cpu_s": cpu_median,
        "trl_best": trl_best,
        "ratio_vs_trl": {name: median[name] / median[trl_best] for name in contenders if name in PROJECT}
                        if trl_best else {},
        "cpu_ratio_vs_trl": {name: cpu_median[name] / cpu_median[trl_best] for name in contenders if name in PROJECT}
                            if trl_best else {},
        "goal_ratio": GOAL_RATIO,
        "notes": args.note or [],
    }


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _describe(name: str, setup: dict) -> str:
    if name in TRL:
        return f"TRL sequence-classification head | {TRL[name]}"
    read, batching, share_prompt = PROJECT[name]
    rows = setup.get("share_prompt_group_rows", 4)  # runs before the option existed used the config default, 4
    return f"{read} | {batching}{f', prompt shared, groups of {rows} rows' if share_prompt else ''}"


def _times(values: dict, name: str, trl_best: str | None) -> str:
    """values[name] as a multiple of TRL's best contender's; a dash when no TRL contender ran (--contenders)."""
    return f"{values[name] / values[trl_best]:.2f}x" if trl_best else "–"


def markdown_section(result: dict) -> str:
    s, m, med, ratio = result["setup"], result["machine"], result["median_pairs_per_s"], result["ratio_vs_trl"]
    cpu, trl_best = result["median_pairs_per_cpu_s"], result["trl_best"]
    rows = "\n".join(
        f"| {name} | {_describe(name, s)} | " + ", ".join(f"{r['seconds']:.1f}" for r in runs)
        + f" | {med[name]:.2f} | {result['mfu'][name]:.3f} | {_times(med, name, trl_best)} | "
        + ", ".join(f"{r['cpu_seconds']:.1f}" for r in runs) + f" | {_times(cpu, name, trl_best)} |"
        for name, runs in result["runs"].items()
    )
    mega = s["batch_size"] * max(1, min(s["pairs"] // (4 * s["batch_size"]), 50))
    notes = "".join(f"\n- {note}" for note in result.get("notes", []))
    notes = f"\nNotes on this run:\n{notes}\n" if notes else ""
    figure = f"\n![pairs per second by contender]({result['figure']})\n" if result.get("figure") else ""
    verdict = ""
    if ratio:
        best = max(ratio, key=ratio.get)
        default = f"{ratio['project']:.2f}x with the default config, " if "project" in ratio else ""
        gap = ("the goal is met" if ratio[best] >= result["goal_ratio"]
               else f"it needs {result['goal_ratio'] / ratio[best]:.2f}x more pairs/s to reach it")
        cpu_ratio = result["cpu_ratio_vs_trl"]
        verdict = (f"\n**Goal (issue 12): >= {result['goal_ratio']}x TRL's best ({trl_best}). Now "
                   f"{default}{ratio[best]:.2f}x at best ({best}): {gap}.** In CPU seconds (the work done, less "
                   f"moved by other load): {cpu_ratio[best]:.2f}x ({best}), best "
                   f"{max(cpu_ratio.values()):.2f}x ({max(cpu_ratio, key=cpu_ratio.get)}).\n")
    return f"""{SECTION_START}
## Reward-model training vs TRL's RewardTrainer

Machine: {m['cpus']} CPU cores ({m['processor']}), torch {m['torch']} on {m['torch_threads']} thread(s), transformers
{m['transformers']}, TRL {m['trl']}; fp32 GEMM peak measured in the run {m['fp32_gemm_peak_gflops']:.0f} GFLOP/s;
load average {m['load_average_at_start']:.1f} at the start; {result['date']}. Absolute times are context (the notes
below say how busy the machine was); the ratios come from contenders run in turn within each repeat (order
rotated), medians over {s['repeats']} repeats.

    {result['command']}

Setup: the first {s['pairs']} pairs of `{s['pairs_file']}` (HH-RLHF harmless-base) whose longer side fits in
{s['max_length']} tokens (the longest is {s['longest_pair_tokens']}, so neither side truncates and TRL's length
filter drops none; {s['real_tokens']:,} real tokens in all), tiny Qwen2 (hidden {s['hidden_size']},
{s['layers']} layers, {s['non_embedding_parameters']:,} non-embedding parameters) built from a config with the
project's byte tokenizer, used by both; batch {s['batch_size']} pairs, {s['dtype']}, {s['epochs']} epoch, seed
{s['seed']}; each run timed from model load to the end of training. Both sides train on the same token ids:
`{models.QUERY_TEMPLATE!r}` around the prompt, the reply, eos (checked: {s['same_token_ids']}). TRL runs without
gradient checkpointing and without bf16: its defaults turn both on, which the issue measured ~3x slower on this
CPU. Learning rates differ (project: trunk 1e-4, head 3e-3; TRL: 1e-4 for all), which changes no work per step.
CPU seconds: this process's CPU time over the run (all torch threads), the "vs TRL's best, CPU" column the ratio
of median pairs per CPU second. MFU: 6 x non-embedding parameters x real tokens per second over the GEMM peak (the reads' LM-head product and
the attention scores are not counted, padding is not either).

| contender | reward read / head | batching | seconds per run | median pairs/s | MFU | vs TRL's best | CPU seconds per run | vs TRL's best, CPU |
|---|---|---|---|---|---|---|---|---|
{rows}
{verdict}{figure}
What each side does per batch (read in the code: rlhf_core/reward/train.py and model.py; TRL 1.16
trl/trainer/reward_trainer.py, transformers' trainer_pt_utils.py):

- project: tokenises every pair once before the first epoch (`encode_pairs`: query and reply tokenised
  separately, eos appended), then per step right-pads the batch's chosen and rejected together to its longest
  (`pair_batch`, 2B rows), runs the trunk once, reads the head at each eos; with `end_token+logprob` it also
  runs the tied LM head at the positions that predict a reply token (only those) and sums their log-probs. Then clipping,
  AdamW, linear decay. Batching `random`: a numpy permutation per epoch cut into batches; `length_grouped`:
  that permutation cut into mega-batches (here of {mega} pairs: transformers' rule, 50 batches or fewer so that
  there are at least 4), each sorted by the pair's longer side and cut into batches, the batches shuffled.
- TRL: tokenises the whole data set once in the trainer's constructor (`datasets.map`: prompt + reply + eos
  string, inside the timed span), then per step its `DataCollatorForPreference` right-pads chosen and rejected
  together to the batch's longest (2B rows); the model is a plain `Qwen2ForSequenceClassification` (the score
  head applied at every position, then the last non-pad one read); the loss is -log sigmoid(r_c - r_r);
  transformers' Trainer loop (clipping 1.0, AdamW, linear decay). `random`: its random sampler;
  `group_by_length`: transformers' `LengthGroupedSampler` on a `length` column (the longer side; added inside
  the timed span), the same mega-batch rule, longest batch first.
{notes}{SECTION_END}
"""


def plot(result: dict, path: Path) -> None:
    """Median pairs/s per contender (TRL's grey), each bar's MFU at its end, and the goal's line (TRL's best x the
    goal ratio)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med, trl_best = result["median_pairs_per_s"], result["trl_best"]
    names = list(med)
    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(names) + 1.5))
    ax.barh(names, [med[n] for n in names], color=["tab:gray" if n in TRL else "tab:blue" for n in names])
    for i, name in enumerate(names):
        ax.text(med[name], i, f" MFU {result['mfu'][name]:.2f}", va="center", fontsize=7)
    if trl_best:
        ax.axvline(med[trl_best] * result["goal_ratio"], color="k", ls=":", lw=1,
                   label=f"goal: {result['goal_ratio']:g}x {trl_best}")
        ax.legend(fontsize=8, loc="lower right")
    ax.invert_yaxis()
    ax.set_xlim(0, max(med.values()) * 1.25)
    s = result["setup"]
    ax.set_xlabel("pairs per second (median)")
    ax.set_title(f"Reward-model training vs TRL (hidden {s['hidden_size']}, {s['layers']} layers, "
                 f"{s['pairs']} pairs; {result['date']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_doc(doc: Path, section: str) -> None:
    """Put this benchmark's section into `doc`, replacing its earlier one; the other sections stay."""
    replace_section(doc, section, SECTION_START, SECTION_END, (
        "# Benchmarks against TRL (issue 12)\n\nEach section is written by its benchmark script; ratios are the "
        "result, absolute times context.\n\n"))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs-file", default=str(DEFAULT_PAIRS_FILE), help="HH-RLHF jsonl(.gz), chosen/rejected")
    parser.add_argument("--pairs", type=int, default=256)
    parser.add_argument("--max-length", type=int, default=512, help="tokens; only pairs that fit are taken")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--share-prompt-group-rows", type=int, default=RewardTrainConfig().share_prompt_group_rows,
                        help="rows per trunk pass of the shared-prompt contenders (default: the config's, 4; on "
                             "2026-11-27 at hidden 128, 4 rows gave 1.86x TRL's best, 8 rows 1.54x, 16 rows 1.33x)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = all cores")
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--json", default="docs/benchmarks-trl-reward.json")
    parser.add_argument("--doc", default="docs/benchmarks.md")
    parser.add_argument("--note", action="append", help="a remark on this run (the machine's load, ...); repeatable")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    args.load_at_start = os.getloadavg()[0]
    result = run_benchmark(args)
    figure = Path(args.json).with_suffix(".png")
    result["figure"] = os.path.relpath(figure, Path(args.doc).parent)  # as the section links it
    atomic_write_text(args.json, json.dumps(result, indent=2) + "\n")
    plot(result, figure)
    write_doc(Path(args.doc), markdown_section(result))
    print(json.dumps({"median_pairs_per_s": result["median_pairs_per_s"], "ratio_vs_trl": result["ratio_vs_trl"]}))
    return result


if __name__ == "__main__":
    main()
