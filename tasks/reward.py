"""Stage 6: the reward model trained on the denoised pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE
from transformers import PreTrainedTokenizerBase

from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import EXECUTION_SETTINGS, RewardConfig
from rlhf_core.models import dropout_probability, load_tokenizer
from rlhf_core.reward.holdout import agreement_with_labels, held_out_side, training_side
from rlhf_core.reward.model import RewardModel, score_texts
from rlhf_core.reward.train import pair_reward_diffs, train_reward_model
from rlhf_core.schemas import read_table
from rlhf_core.sim.metrics import accuracy_by_pair_type, answer_probe, gold_eval_pairs
from tasks.common import RunContext, StageRun, check_same_holdout, run_stage, stage_logger, warn_cut_rows
from tasks.launch import group_world_size, run_worker

VERSION = "3"


@task(name="reward", version=VERSION, cache_policy=NO_CACHE)
def train_reward(ctx: RunContext, cfg: RewardConfig, denoised: ArtifactRef, comparisons: ArtifactRef,
                 policy: ArtifactRef, world: ArtifactRef, seed: int, simulated: bool, max_operand: int = 4,
                 operations: tuple[str, ...] = ("+", "-"), responses: ArtifactRef | None = None,
                 policy_generators: tuple[str, ...] = ("policy",)) -> ArtifactRef:
    """Bradley-Terry with soft labels and margins; on the simulated world, accuracy against gold on held-out
    pairs (overall and per pair type), the answer probe, and the same for a baseline trained on the raw labels.
    With cfg.holdout_fraction > 0, agreement with the annotators' labels of the held-out prompts' pairs (which
    neither model, nor the voters, trained on): reward/heldout/... and reward/baseline/heldout/...

    `responses` (the round's generated responses) feed MetaRM's meta step and are required when
    cfg.train.meta.enabled: the rows of the generators named `policy_generators` (generation.generators whose model
    is "policy"), samples of the policy PPO starts from; other models' responses are no samples of it."""
    if cfg.train.meta.enabled and responses is None:
        raise ValueError("reward.train.meta.enabled needs the round's generated responses as policy samples")
    check_same_holdout(denoised, cfg.holdout_fraction, "denoised pairs", "denoise again (rlhf stage denoise, its votes "
                       "too: rlhf stage vote)")

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        fraction = cfg.holdout_fraction
        raw = read_table("comparisons", comparisons.file("comparisons.parquet"))
        labelled_held_out = held_out_side(raw, fraction) if fraction else None  # checked before any training
        if not simulated and not fraction:
            stage_logger().warning("reward: no human-labelled pairs held out (reward.holdout_fraction 0): "
                                   "reward/accuracy is training accuracy, and nothing measures this reward model; "
                                   "set reward.holdout_fraction (0.1 is a good start)")
        # held-out prompts are out of the denoised pairs already (checked above by their manifest); a copy without
        # one records nothing, and the reward model must never train on them
        pairs = training_side(read_table("denoised", denoised.file("denoised.parquet")), fraction)
        samples = (policy_samples(read_table("responses", responses.file("responses.parquet")), policy_generators)
                   if cfg.train.meta.enabled else None)
        model, tokenizer, report = train_on_ranks(cfg, policy.path, pairs, seed, samples, run.scratch / "denoised")
        warn_cut_rows("reward", report["share_at_max_length"], "reward.train.max_length", cfg.train.max_length)
        model.save(out, tokenizer)
        metrics = {f"reward/{k}": float(v) for k, v in report.items() if isinstance(v, (int, float))}
        metrics["reward/n_train_pairs"] = len(pairs)
        baseline = None
        if cfg.compare_baseline and (simulated or fraction):  # what voting + denoising bought: the raw labels
            baseline, _, _ = train_on_ranks(cfg, policy.path, training_side(raw, fraction), seed, samples,
                                            run.scratch / "baseline")
        if labelled_held_out is not None:
            for prefix, rm in (("reward", model), ("reward/baseline", baseline)):
                if rm is not None:
                    diffs = pair_reward_diffs(rm, tokenizer, labelled_held_out, cfg.train.max_length)
                    metrics.update({f"{prefix}/heldout/{k}": float(v)
                                    for k, v in agreement_with_labels(diffs, labelled_held_out).items()})
        if simulated:
            held_out = read_table("prompts", world.file("eval_prompts.parquet"))
            eval_pairs = gold_eval_pairs(policy.path, held_out["prompt"].tolist(), seed=seed)
            metrics.update(_gold_metrics("reward", model, tokenizer, eval_pairs, cfg, max_operand, operations))
            if baseline is not None:
                metrics.update(_gold_metrics("reward/baseline", baseline, tokenizer, eval_pairs, cfg, max_operand,
                                             operations))
        return metrics

    # with dropout, N data-parallel ranks draw other masks than one process does (rlhf_core/reward/train.py): they
    # train another model, so the number of ranks is part of the key
    same_model = EXECUTION_SETTINGS if dropout_probability(policy.path) == 0 else EXECUTION_SETTINGS - {"num_processes"}
    return run_stage(ctx, stage="reward", version=VERSION, kind="reward_model",
                     config={"reward": cfg.model_dump(exclude=same_model | ({"holdout_fraction"}
                                                                            if not cfg.holdout_fraction else set())),
                             "seed": seed, "simulated": simulated,
                             "world": {"max_operand": max_operand, "operations": list(operations)}}
                     | ({"meta_policy_generators": sorted(policy_generators)} if cfg.train.meta.enabled else {}),
                     inputs={"denoised": denoised, "comparisons": comparisons, "policy": policy, "world": world}
                     | ({"responses": responses} if cfg.train.meta.enabled else {}),
                     produce=produce, register_as="rlhf-reward-model",
                     execution={"num_processes": cfg.num_processes, "deepspeed": cfg.deepspeed})  # same model


def policy_samples(responses: pd.DataFrame, policy_generators: tuple[str, ...]) -> pd.DataFrame:
    """The rows written by the named generators (a row's generator is "{name}:{digest}"). A text another generator
    also wrote for the prompt is one row, the smallest response_id's (generation deduplicates), so it may count as
    the other's: a prompt can have fewer policy samples than the plan gives, and meta_groups leaves out those with
    fewer than reward.train.meta.samples_per_prompt."""
    return responses[responses["generator"].str.partition(":")[0].isin(policy_generators)]


def train_on_ranks(cfg: RewardConfig, policy_dir: Path, pairs: pd.DataFrame, seed: int,
                   samples: pd.DataFrame | None, scratch: Path
                   ) -> tuple[RewardModel, PreTrainedTokenizerBase, dict[str, float]]:
    """`train_reward_model` in this process, or as cfg.num_processes data-parallel worker ranks (through
    DeepSpeed when cfg.deepspeed) that leave the model and its metrics in `scratch`/model (rank 0 writes)."""
    if cfg.num_processes == 1 and cfg.deepspeed is None:
        return train_reward_model(policy_dir, pairs, cfg.train, seed=seed, progress=True, meta_samples=samples)
    scratch.mkdir(parents=True, exist_ok=True)
    pairs.to_parquet(scratch / "pairs.parquet", index=False)
    (scratch / "train.json").write_text(cfg.train.model_dump_json())
    model_dir = scratch / "model"
    run_worker("rlhf_core.workers.train_reward",
               ["--init-dir", str(policy_dir), "--pairs", str(scratch / "pairs.parquet"), "--config",
                str(scratch / "train.json"), "--seed", str(seed), "--out", str(model_dir), "--progress"],
               cfg.num_processes, scratch / "worker.log", deepspeed=cfg.deepspeed)
    world_size = group_world_size(model_dir, cfg.num_processes, "reward training", scratch / "worker.log")
    metrics = json.loads((model_dir / "metrics.json").read_text()) | {"world_size": world_size}
    return RewardModel.load(model_dir), load_tokenizer(model_dir), metrics


def _gold_metrics(prefix: str, model, tokenizer, eval_pairs, cfg: RewardConfig, max_operand: int,
                  operations: tuple[str, ...]) -> dict[str, float]:
    """Held-out gold accuracy overall and per pair type, and the answer probe (names in the metric)."""
    diffs = pair_reward_diffs(model, tokenizer, eval_pairs, cfg.train.max_length)
    by_type = accuracy_by_pair_type(diffs, eval_pairs)
    metrics = {f"{prefix}/gold_accuracy_heldout": by_type.pop("all"), f"{prefix}/n_heldout_pairs": len(eval_pairs)}
    metrics.update({f"{prefix}/gold_accuracy_heldout/{k}": float(v) for k, v in by_type.items()})

    def score(prompts, responses):
        return score_texts(model, tokenizer, prompts, responses, cfg.train.max_length).numpy()

    probe = answer_probe(score, max_operand, tuple(operations))
    metrics.update({f"{prefix}/probe/{k}": v for k, v in probe.items()})
    return metrics
