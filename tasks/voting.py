"""Stage 4: preference strength from an ensemble of M reward models (Secrets of RLHF, Part II)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import VotingConfig
from rlhf_core.reward.holdout import held_out_side, training_side
from rlhf_core.reward.voting import vote
from rlhf_core.schemas import read_table, write_table
from rlhf_core.sim.metrics import agreement_by_strength_decile, gold_difference
from tasks.common import RunContext, StageRun, holdout_key, run_stage, warn_cut_rows
from tasks.launch import group_world_size, run_worker
from tasks.plots import agreement_by_bucket, agreement_by_strength, strength_histogram, strength_std_by_group

VERSION = "3"


@task(name="vote", version=VERSION, cache_policy=NO_CACHE)
def vote_strength(ctx: RunContext, cfg: VotingConfig, comparisons: ArtifactRef, policy: ArtifactRef, seed: int,
                  simulated: bool, holdout_fraction: float = 0.0) -> ArtifactRef:
    """Train M reward models on the pairs with different seeds/orders; mean and std of r(c) - r(r).

    The pairs of prompts held out to measure the reward model (reward.holdout_fraction) are neither trained on
    nor voted on: the voters choose the reward model's flips and margins, so what they learn reaches it."""

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        pairs = read_table("comparisons", comparisons.file("comparisons.parquet"))
        if holdout_fraction:
            held_out_side(pairs, holdout_fraction)  # an empty held-out side fails here, not after the voters trained
        pairs = training_side(pairs, holdout_fraction)
        # Finished voters are kept in the scratch dir, which survives a killed run: a re-run resumes there.
        voter_dir = run.scratch / "voters"
        t0 = time.perf_counter()
        world_size = 1
        if cfg.mode == "faithful" and cfg.num_processes > 1:
            run.scratch.mkdir(parents=True, exist_ok=True)
            pairs.to_parquet(run.scratch / "pairs.parquet", index=False)
            (run.scratch / "voting.json").write_text(cfg.model_dump_json())
            args = ["--init-dir", str(policy.path), "--pairs", str(run.scratch / "pairs.parquet"),
                    "--config", str(run.scratch / "voting.json"), "--seed", str(seed), "--voter-dir", str(voter_dir),
                    "--progress"]
            run_worker("rlhf_core.workers.vote", args, cfg.num_processes, run.scratch / "worker.log")
            world_size = group_world_size(voter_dir, cfg.num_processes, "voting", run.scratch / "worker.log")
        votes, report = vote(policy.path, pairs, cfg, seed=seed, progress=True, voter_dir=voter_dir)
        warn_cut_rows("vote", report["share_at_max_length"], "voting.train.max_length", cfg.train.max_length)
        seconds = time.perf_counter() - t0  # the workers' time included
        report |= {"seconds": seconds, "seconds_per_model": seconds / cfg.n_models, "world_size": world_size}
        write_table("votes", votes, out / "votes.parquet")
        run.log_figure(strength_histogram(votes["mean"], votes["bucket"], votes["std"]), "preference_strength.png")
        run.log_figure(strength_std_by_group(votes["mean"], votes["std"]), "strength_std_by_group.png")
        metrics = {f"voting/{k}": float(v) for k, v in report.items() if isinstance(v, (int, float))}
        if simulated:
            metrics.update(_gold_report(pairs, votes, run))
        return metrics

    return run_stage(ctx, stage="vote", version=VERSION, kind="votes",
                     config={"voting": cfg.model_dump(exclude={"num_processes"}), "seed": seed,
                             "simulated": simulated}  # gold metrics or not: a hit reports what a miss would
                     | holdout_key(holdout_fraction),
                     inputs={"comparisons": comparisons, "policy": policy}, produce=produce,
                     execution={"num_processes": cfg.num_processes})  # 1 and N ranks give the same votes


def _gold_report(pairs: pd.DataFrame, votes: pd.DataFrame, run: StageRun) -> dict[str, float]:
    """Does preference strength predict label correctness? (gold-tied pairs left out everywhere)"""
    joined = pairs.merge(votes, on="pair_id")
    gold = gold_difference(joined["prompt"], joined["chosen"], joined["rejected"])
    decided = gold != 0
    correct = gold > 0
    metrics = {}
    shares = {b: float(correct[decided & (joined["bucket"] == b).to_numpy()].mean())
              for b in ("incorrect", "ambiguous", "normal") if (decided & (joined["bucket"] == b).to_numpy()).any()}
    run.log_figure(agreement_by_bucket(shares), "gold_agreement_by_bucket.png")
    metrics.update({f"voting/gold_agreement_excl_gold_ties/{b}": v for b, v in shares.items()})
    deciles = agreement_by_strength_decile(joined["mean"].to_numpy(), joined)
    run.log_figure(agreement_by_strength(deciles), "gold_agreement_by_strength_decile.png")
    metrics.update({f"voting/gold_agreement_excl_gold_ties/decile_{i + 1:02d}": v for i, v in enumerate(deciles)})
    # each voter's and the ensemble's agreement with gold on the direction of the pairs
    diffs = np.array(joined["diffs"].tolist(), dtype=np.float64)  # (N, M), NaN where a voter did not vote
    per_voter = {k: float(((diffs[m, k] > 0) == correct[m]).mean())
                 for k in range(diffs.shape[1]) for m in [decided & ~np.isnan(diffs[:, k])] if m.any()}
    metrics["voting/voter_gold_accuracy_excl_gold_ties"] = float(np.mean(list(per_voter.values())))
    metrics.update({f"voting/voter_gold_accuracy_excl_gold_ties/voter_{k:02d}": v for k, v in per_voter.items()})
    metrics["voting/ensemble_gold_accuracy_excl_gold_ties"] = float(
        ((joined["mean"].to_numpy() > 0) == correct)[decided].mean())
    return metrics
