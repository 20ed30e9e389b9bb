"""Stage 5: flip incorrect pairs, smooth ambiguous ones, attach adaptive margins."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core.artifacts import ArtifactRef, manifest_of
from rlhf_core.config import ConfigError, DenoiseConfig
from rlhf_core.reward.denoise import denoise
from rlhf_core.reward.holdout import training_side
from rlhf_core.schemas import read_table, write_table
from rlhf_core.sim.metrics import flip_report
from tasks.common import RunContext, StageRun, check_same_holdout, holdout_key, run_stage

VERSION = "2"


@task(name="denoise", version=VERSION, cache_policy=NO_CACHE)
def denoise_pairs(ctx: RunContext, cfg: DenoiseConfig, comparisons: ArtifactRef, votes: ArtifactRef,
                  simulated: bool, holdout_fraction: float = 0.0) -> ArtifactRef:
    """The training pairs of the reward model, with flips, soft labels and margins; the pairs of prompts held out
    to measure it (reward.holdout_fraction, not voted on either) are left out."""
    check_votes_measured_on(votes, comparisons)
    check_same_holdout(votes, holdout_fraction, "votes", "vote again (rlhf stage vote)")

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        pairs = training_side(read_table("comparisons", comparisons.file("comparisons.parquet")), holdout_fraction)
        table, report = denoise(pairs, read_table("votes", votes.file("votes.parquet")), cfg)
        write_table("denoised", table, out / "denoised.parquet")
        metrics = {f"denoise/{k}": float(v) for k, v in report.items() if isinstance(v, (int, float))}
        if simulated:
            metrics.update({f"denoise/{k}": float(v) for k, v in flip_report(pairs, table).items()})
        return metrics

    return run_stage(ctx, stage="denoise", version=VERSION, kind="denoised",
                     config={"denoise": cfg.model_dump(), "simulated": simulated}  # gold metrics: hit reports as miss
                     | holdout_key(holdout_fraction),
                     inputs={"comparisons": comparisons, "votes": votes}, produce=produce)


def check_votes_measured_on(votes: ArtifactRef, comparisons: ArtifactRef) -> None:
    """Refuse votes measured on other comparisons. A vote is r(chosen) - r(rejected) of the pair as it was
    oriented then, and a pair_id does not name an orientation (a re-import can swap a pair's majority): votes
    joined to other comparisons by pair_id alone would flip the wrong pairs, silently."""
    manifest = manifest_of(votes)  # this store's, or another workdir's given by path
    if manifest is None:  # a copy without a manifest: nothing records what it was measured on
        return
    measured_on = next((i.digest for i in manifest.inputs if i.name == "comparisons"), None)
    if measured_on is not None and measured_on != comparisons.digest:
        raise ConfigError(f"votes {votes.digest[:12]} were measured on comparisons {measured_on[:12]}, not on "
                          f"the comparisons given ({comparisons.digest[:12]}): a vote's sign is its pair's "
                          "orientation then; vote again on these comparisons (rlhf stage vote), or give the "
                          "comparisons the votes were measured on")
