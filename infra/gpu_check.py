"""Do the worker stages run on a GPU, and do they learn there what they learn on the CPU?

The stages that train (voting, the reward model, PPO) choose their device with `models.default_device()` in
one process and take `accelerator.device` as worker ranks. This check runs each of them on a round of the
simulated world, both ways on one device, and scores what they produce against the world's gold, so a GPU
run can be set beside the same run on the CPU. It needs rlhf_core and its libraries only (no Prefect, no
MLflow), so it runs on a bare GPU machine with PyTorch, transformers, accelerate, pandas and pydantic.

    # here, from a finished round (the demo's, seed 0): the inputs as plain files, with the gold eval pairs
    .venv/bin/python infra/gpu_check.py prepare --round rlhf-runs --out .gpu-inputs
    # on the machine to check (CUDA_VISIBLE_DEVICES= for the CPU column), one JSON of numbers and timings,
    # rewritten after each step, so a run stopped at a time limit keeps the steps it finished
    python infra/gpu_check.py run --inputs .gpu-inputs --out results.json

Each worker runs as `python -m rlhf_core.workers.<name>` in its own process: one rank, on the GPU when one
is present. Several ranks on several GPUs (NCCL) is `infra/gpu-smoke.sh`, which needs the whole stack.
Results: docs/workers.md, "On GPUs".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import accelerate
import numpy as np
import pandas as pd
import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlhf_core import models  # noqa: E402
from rlhf_core.artifacts import ArtifactRef, ArtifactStore, Manifest, atomic_write_text  # noqa: E402
from rlhf_core.config import PPOConfig, RewardTrainConfig, VotingConfig, load_config  # noqa: E402
from rlhf_core.reward.train import pair_reward_diffs, train_reward_model  # noqa: E402
from rlhf_core.reward.voting import collect_voters, shared_trunk_diffs  # noqa: E402
from rlhf_core.sim.metrics import accuracy_by_pair_type, gold_eval_pairs  # noqa: E402



def _one(found: list, what: str, round_dir: Path):
    if len(found) != 1:
        raise SystemExit(f"{round_dir}: expected one {what}, found {len(found)}: give the workdir of one "
                         "finished round (`rlhf demo`'s, or a config's with --config)")
    return found[0]


def prepare(round_dir: Path, config: Path | None, overrides: list[str], out: Path) -> None:
    """Copy what the check reads from a finished round into `out`: the SFT policy, the comparisons it voted on
    with its votes, the denoised pairs, the prompts, the round's configs, and the held-out gold pairs (drawn
    here once, so that every machine scores the same pairs). The artifacts are found by lineage from the
    round's one SFT policy; `config` and `overrides` are the round's (default: the defaults, as `rlhf demo`)."""
    cfg = load_config(config, overrides=overrides)
    store = ArtifactStore(round_dir / "artifacts")

    def made_by(kind: str, stage: str, **inputs: str) -> list[tuple[ArtifactRef, Manifest]]:
        """The store's `kind` artifacts made by `stage` from the given inputs (name=digest)."""
        found = [(ref, store.manifest(ref)) for ref in store.artifacts(kind)]
        return [(ref, m) for ref, m in found
                if m.stage == stage and {i.name: i.digest for i in m.inputs}.items() >= inputs.items()]

    sft, sft_manifest = _one(made_by("policy", "sft"), "SFT policy", round_dir)
    # the first round's pairs: of the SFT policy's responses (a later round of `rlhf rounds` votes on pairs that hold
    # its own policy's responses too)
    responses, _ = _one(made_by("responses", "generate", policy=sft.digest), "generation by the SFT policy",
                        round_dir)
    comparisons, _ = _one(made_by("comparisons", "import_annotations", responses=responses.digest),
                          "comparisons of the SFT policy's responses", round_dir)
    # the voting config and seed the votes were made with (an artifact keeps the manifest of its first making, so the
    # rest of the stage's key, e.g. `simulated` since 2026-11-28, may be missing from an older one)
    voting_config = {"voting": cfg.voting.model_dump(mode="json", exclude={"num_processes"}), "seed": cfg.seed}
    votes, _ = _one([(ref, m) for ref, m in made_by("votes", "vote", comparisons=comparisons.digest)
                     if {k: m.config.get(k) for k in voting_config} == voting_config],
                    "vote on them with the given config (--config, --set)", round_dir)
    denoised, _ = _one([(ref, m) for ref, m in made_by("denoised", "denoise", votes=votes.digest)
                        if m.config.get("denoise") == cfg.denoise.model_dump(mode="json")],  # the config's method
                       "denoised pairs of the given config's method", round_dir)
    _, reward = _one([(ref, m) for ref, m in made_by("reward_model", "reward", denoised=denoised.digest)
                      if m.config["reward"]["train"] == cfg.reward.train.model_dump(mode="json")],
                     "reward model of the round's recipe", round_dir)
    world = store.find("prompts", next(i.digest for i in sft_manifest.inputs if i.name == "prompts"))
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(sft.path, out / "policy", dirs_exist_ok=True)
    for artifact, file in ((votes, "votes.parquet"), (comparisons, "comparisons.parquet"),
                           (denoised, "denoised.parquet"), (world, "prompts.parquet")):
        shutil.copy(artifact.file(file), out / file)
    held_out = pd.read_parquet(world.file("eval_prompts.parquet"))["prompt"].tolist()
    gold_eval_pairs(out / "policy", held_out, seed=cfg.seed).to_parquet(out / "eval_pairs.parquet")  # the stage's
    (out / "configs.json").write_text(json.dumps({
        "seed": cfg.seed, "round_reward_gold_heldout": reward.metrics["reward/gold_accuracy_heldout"],
        "reward_train": cfg.reward.train.model_dump(mode="json"),
        "voting": cfg.voting.model_dump(mode="json"), "ppo": cfg.ppo.model_dump(mode="json")}, indent=1))
    print(f"inputs for the check in {out}")


def _worker(module: str, args: list[str], log: Path) -> float:
    """Run `python -m module args` as one worker rank; returns its wall-clock seconds."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, "-m", module, *args], stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        raise SystemExit(f"{module} failed ({done.returncode}); its log:\n{log.read_text()[-3000:]}")
    return time.perf_counter() - t0


def _gold(model, tokenizer, eval_pairs: pd.DataFrame, max_length: int) -> dict[str, float]:
    by_type = accuracy_by_pair_type(pair_reward_diffs(model, tokenizer, eval_pairs, max_length), eval_pairs)
    return {k: round(float(v), 4) for k, v in by_type.items() if not k.startswith("n_")}


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(pd.Series(a).rank().corr(pd.Series(b).rank()))


def _save(out: Path, result: dict) -> None:
    """Print the result so far and write it (atomically) to `out`: a check stopped at the device's time limit
    still leaves the steps it finished."""
    text = json.dumps(result, indent=1)
    print(text, flush=True)
    atomic_write_text(out, text)


def run(inputs: Path, out: Path, work: Path, voters: int, ppo_iterations: int) -> dict:
    configs = json.loads((inputs / "configs.json").read_text())
    seed = configs["seed"]
    device = models.default_device()
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"device": models.device_description(), "device_type": device.type, "torch": torch.__version__,
                    "transformers": transformers.__version__, "accelerate": accelerate.__version__,
                    "torch_threads": torch.get_num_threads()}
    print(f"checking on {result['device']} ({device})", flush=True)
    policy, pairs = inputs / "policy", pd.read_parquet(inputs / "denoised.parquet")
    eval_pairs = pd.read_parquet(inputs / "eval_pairs.parquet")
    train_cfg = RewardTrainConfig.model_validate(configs["reward_train"])

    # 1. The reward model: the worker (one rank) and in this process; both should be the same model.
    (work / "reward.json").write_text(train_cfg.model_dump_json())
    seconds = _worker("rlhf_core.workers.train_reward",
                      ["--init-dir", str(policy), "--pairs", str(inputs / "denoised.parquet"), "--config",
                       str(work / "reward.json"), "--seed", str(seed), "--out", str(work / "reward")],
                      work / "reward.log")
    from rlhf_core.reward.model import RewardModel

    worker_model = RewardModel.load(work / "reward").to(device)
    tokenizer = models.load_tokenizer(work / "reward")
    result["reward_worker"] = {"seconds": round(seconds, 1), "gold_heldout": _gold(worker_model, tokenizer,
                                                                                    eval_pairs, train_cfg.max_length),
                               "round_gold_heldout": round(configs["round_reward_gold_heldout"], 4)}
    t0 = time.perf_counter()
    model, tokenizer, metrics = train_reward_model(policy, pairs, train_cfg, seed)
    result["reward_in_process"] = {
        "seconds": round(time.perf_counter() - t0, 1), "model_device": str(next(model.parameters()).device),
        "train_accuracy": round(metrics["accuracy"], 4),
        "gold_heldout": _gold(model, tokenizer, eval_pairs, train_cfg.max_length),
        "max_abs_weight_diff_vs_worker": float(max((a - b).abs().max() for a, b in
                                                   zip(model.state_dict().values(),
                                                       worker_model.state_dict().values())))}
    del model, worker_model
    _save(out, result)

    # 2. Voting: the first `voters` faithful voters through the worker, against the round's own votes of the
    #    same voters (voter k has the same seed everywhere); fast mode in this process.
    voting = VotingConfig.model_validate(configs["voting"] | {"n_models": voters})
    (work / "voting.json").write_text(voting.model_dump_json())
    comparisons = pd.read_parquet(inputs / "comparisons.parquet")  # in the round's votes table's order
    seconds = _worker("rlhf_core.workers.vote",
                      ["--init-dir", str(policy), "--pairs", str(inputs / "comparisons.parquet"), "--config",
                       str(work / "voting.json"), "--seed", str(seed), "--voter-dir", str(work / "voters")],
                      work / "vote.log")
    diffs, _ = collect_voters(work / "voters", len(comparisons), voters)
    round_votes = pd.read_parquet(inputs / "votes.parquet")
    round_diffs = np.stack(round_votes["diffs"].to_numpy())[:, :voters]  # (N, voters) of the round's machine
    mean, round_mean = diffs.mean(axis=1), round_diffs.mean(axis=1)
    result["vote_worker"] = {"voters": voters, "seconds": round(seconds, 1),
                             "spearman_mean_vs_round": round(_spearman(mean, round_mean), 4),
                             "sign_agreement_vs_round": round(float(((mean < 0) == (round_mean < 0)).mean()), 4),
                             "share_mean_below_0": round(float((mean < 0).mean()), 4),
                             "round_share_mean_below_0": round(float((round_mean < 0).mean()), 4)}
    fast = VotingConfig.model_validate(configs["voting"] | {"mode": "fast"})
    t0 = time.perf_counter()
    fast_diffs, _ = shared_trunk_diffs(policy, comparisons, fast, seed)
    result["vote_fast_in_process"] = {
        "heads": fast.n_models, "seconds": round(time.perf_counter() - t0, 1),
        "spearman_mean_vs_round_faithful": round(_spearman(fast_diffs.mean(axis=1),
                                                           np.stack(round_votes["diffs"].to_numpy()).mean(axis=1)),
                                                 4)}
    _save(out, result)

    # 3. PPO through the worker, against the reward model trained above (the round's recipe).
    ppo = PPOConfig.model_validate(configs["ppo"] | {"iterations": ppo_iterations})
    (work / "ppo.json").write_text(ppo.model_dump_json())
    seconds = _worker("rlhf_core.workers.ppo",
                      ["--policy-dir", str(policy), "--reward-model", str(work / "reward"), "--reward-max-length",
                       str(train_cfg.max_length), "--prompts", str(inputs / "prompts.parquet"), "--ptx",
                       str(policy / "demonstrations.parquet"), "--config", str(work / "ppo.json"), "--seed",
                       str(seed), "--checkpoint-dir", str(work / "ppo-scratch"), "--out", str(work / "ppo")],
                      work / "ppo.log")
    history = json.loads((work / "ppo" / "history.json").read_text())
    first, last = history[:10], history[-10:]

    def mean_of(rows, key):
        return round(float(np.mean([r[key] for r in rows])), 4)

    result["ppo_worker"] = {"iterations": len(history), "seconds": round(seconds, 1),
                            "gold_first_10": mean_of(first, "objective/gold"),
                            "gold_last_10": mean_of(last, "objective/gold"),
                            "score_first_10": mean_of(first, "objective/score"),
                            "score_last_10": mean_of(last, "objective/score"),
                            "kl_last_10": mean_of(last, "objective/kl"),
                            "perplexity_last_10": mean_of(last, "objective/perplexity")}
    _save(out, result)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="gather a finished round's inputs (run where the round ran)")
    prep.add_argument("--round", type=Path, required=True, help="the round's workdir")
    prep.add_argument("--config", type=Path, default=None, help="the round's YAML config (default: the defaults)")
    prep.add_argument("--set", dest="overrides", action="append", default=[], help="the round's overrides, key=value")
    prep.add_argument("--out", type=Path, required=True)
    check = sub.add_parser("run", help="run the stages on this machine's default device")
    check.add_argument("--inputs", type=Path, required=True)
    check.add_argument("--out", type=Path, required=True, help="the results JSON")
    check.add_argument("--work", type=Path, default=None, help="scratch directory (default: beside --out)")
    check.add_argument("--voters", type=int, default=4, help="faithful voters to train (the round's first ones)")
    check.add_argument("--ppo-iterations", type=int, default=60)
    args = p.parse_args(argv)
    if args.command == "run" and args.voters < 2:
        p.error("--voters: at least 2 (the mean and std of the strength need two voters)")
    if args.command == "prepare":
        prepare(args.round, args.config, args.overrides, args.out)
    else:
        run(args.inputs, args.out, args.work or args.out.with_suffix(".work"), args.voters, args.ppo_iterations)


if __name__ == "__main__":
    main()
