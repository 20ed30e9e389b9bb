"""Stage 4: preference strength from an ensemble of M reward models (Secrets of RLHF, Part II)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import VotingConfig
from rlhf_core.reward.voting import vote
from rlhf_core.schemas import read_table, write_table
from rlhf_core.sim.metrics import gold_difference
from tasks.common import RunContext, StageRun, run_stage
from tasks.plots import agreement_by_bucket, strength_histogram

VERSION = "1"


@task(name="vote", version=VERSION, cache_policy=NO_CACHE)
def vote_strength(ctx: RunContext, cfg: VotingConfig, comparisons: ArtifactRef, policy: ArtifactRef, seed: int,
                  simulated: bool) -> ArtifactRef:
    """Train M reward models on the pairs with different seeds/orders; mean and std of r(c) - r(r)."""

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        pairs = read_table("comparisons", comparisons.file("comparisons.parquet"))
        votes, report = vote(policy.path, pairs, cfg, seed=seed, progress=True)
        write_table("votes", votes, out / "votes.parquet")
        run.log_figure(strength_histogram(votes["mean"], votes["bucket"]), "preference_strength.png")
        metrics = {f"voting/{k}": float(v) for k, v in report.items() if isinstance(v, (int, float))}
        if simulated:
            metrics.update(_gold_by_bucket(pairs, votes, run))
        return metrics

    return run_stage(ctx, stage="vote", version=VERSION, kind="votes",
                     config={"voting": cfg.model_dump(), "seed": seed},
                     inputs={"comparisons": comparisons, "policy": policy}, produce=produce)


def _gold_by_bucket(pairs: pd.DataFrame, votes: pd.DataFrame, run: StageRun) -> dict[str, float]:
    """Does preference strength predict label correctness? Gold agreement per bucket."""
    joined = pairs.merge(votes, on="pair_id")
    correct = gold_difference(joined["prompt"], joined["chosen"], joined["rejected"]) > 0
    shares = {b: float(correct[(joined["bucket"] == b).to_numpy()].mean())
              for b in ("incorrect", "ambiguous", "normal") if (joined["bucket"] == b).any()}
    run.log_figure(agreement_by_bucket(shares), "gold_agreement_by_bucket.png")
    return {f"voting/gold_agreement/{b}": v for b, v in shares.items()}
