"""Promotion: the round's policy becomes rlhf-policy@champion when the judge approves it.

Every trained policy is registered as rlhf-policy@candidate by its stage. After the evaluation, the
candidate is compared with the current champion (the SFT policy while there is none) through an
evaluation stage's judgements: a judged win rate above `iteration.promote_min_win_rate` moves the
`champion` alias to the candidate's version. A round may start from the champion
(`iteration.start_from`); the round's run and the new policy's version are tagged with the version
it started from, so the registry shows each policy's ancestry.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core.artifacts import ArtifactRef
from rlhf_core.config import ConfigError, IterationConfig, RoundConfig
from rlhf_core.models import architecture_differences
from tasks.common import RunContext, stage_logger
from tasks.evaluation import evaluate_vs_registered, registered_policy

POLICY_MODEL, SFT_MODEL, REWARD_MODEL, CHAMPION = "rlhf-policy", "rlhf-sft-policy", "rlhf-reward-model", "champion"


def judged_win_rate(metrics: dict[str, float]) -> float:
    """Wins plus half the ties, over the judged prompts (Chatbot Arena's and AlpacaEval's convention):
    0.5 = as many prompts won as lost."""
    return metrics["eval/judge/win_rate"] + 0.5 * metrics["eval/judge/tie_rate"]


def starting_policy(ctx: RunContext, cfg: IterationConfig, sft: ArtifactRef,
                    previous: ArtifactRef | None) -> tuple[ArtifactRef, str]:
    """The policy the round generates with and improves, and where it came from: the round before's
    (iterated rounds), the champion's (`start_from: champion`, while one is registered), else SFT."""
    if previous is not None:
        return previous, "previous_round"
    if cfg.start_from == CHAMPION:
        if ctx.tracker.aliased_version(POLICY_MODEL, CHAMPION) is not None:
            champion = registered_policy(ctx, POLICY_MODEL, CHAMPION)
            if differences := architecture_differences(champion.path, sft.path):  # one alias per tracking server
                raise ConfigError(
                    f"iteration.start_from is champion, but {POLICY_MODEL}@{CHAMPION} is another model than this "
                    f"config's SFT policy ({'; '.join(differences)}): a round of another config promoted it on this "
                    "tracking server. Give this config a tracking server of its own, or set iteration.start_from sft")
            return champion, CHAMPION
        stage_logger().warning("iteration.start_from is champion, and no policy is %s@%s yet: the round starts from SFT",
                          POLICY_MODEL, CHAMPION)
    return sft, "sft"


def lineage_tags(ctx: RunContext, policy: ArtifactRef, source: str) -> dict[str, str]:
    """rlhf.start_policy.{source,digest,model_version}: what the round's policy started from, by digest
    and by registered version (rlhf-policy/3, rlhf-sft-policy/1) when the registry holds it."""
    tags = {"rlhf.start_policy.source": source, "rlhf.start_policy.digest": policy.digest}
    if (version := _registered_as(ctx, policy, (POLICY_MODEL, SFT_MODEL))) is not None:
        tags["rlhf.start_policy.model_version"] = version
    return tags


def reward_model_tags(ctx: RunContext, reward_model: ArtifactRef) -> dict[str, str]:
    """rlhf.reward_model.{digest,model_version}: the reward model a policy was trained against (its own
    version's tags and run lead on to the votes and annotations it learned from)."""
    tags = {"rlhf.reward_model.digest": reward_model.digest}
    if (version := _registered_as(ctx, reward_model, (REWARD_MODEL,))) is not None:
        tags["rlhf.reward_model.model_version"] = version
    return tags


def _registered_as(ctx: RunContext, model: ArtifactRef, names: tuple[str, ...]) -> str | None:
    """"name/version" of the first of `names` with a version registered for the model's digest, or None."""
    for name in names:
        if (version := ctx.tracker.model_version(name, model.digest)) is not None:
            return f"{name}/{version.version}"
    return None


def tag_registered_policy(ctx: RunContext, policy: ArtifactRef, tags: dict[str, str]) -> None:
    """Tags on the registered rlhf-policy version of `policy` (its ppo stage registered it)."""
    version = ctx.tracker.model_version(POLICY_MODEL, policy.digest)
    if version is None:
        raise RuntimeError(f"the round's policy {policy.digest[:12]} is not registered as {POLICY_MODEL}: its ppo "
                           "stage registers it; re-run the round to register it")
    ctx.tracker.tag_model_version(POLICY_MODEL, version.version, tags)


def evaluation_against_champion(ctx: RunContext, config: RoundConfig, outputs: dict[str, ArtifactRef],
                                seed: int) -> tuple[ArtifactRef, str, str | None] | None:
    """The evaluation that decides promotion, what it judged against, and the champion's version then (None: no
    champion): the SFT evaluation while no champion is registered; else one of the round's evaluations whose
    baseline is the champion, or a new one (stage evaluate_vs_champion, added to `outputs`). None when the
    candidate already is the champion."""
    champion = ctx.tracker.aliased_version(POLICY_MODEL, CHAMPION)
    if champion is None:
        return outputs["evaluate"], "the SFT policy (no champion yet)", None
    against = f"{POLICY_MODEL} v{champion.version} (champion)"
    digest = champion.tags.get("rlhf.digest")
    if digest == outputs["ppo"].digest:
        return None
    for ref in (outputs.get("evaluate"), outputs.get("evaluate_vs_previous")):
        if ref is not None and _baseline_digest(ctx, ref) == digest:
            return ref, against, str(champion.version)
    outputs["evaluate_vs_champion"] = evaluate_vs_registered(
        ctx, config.evaluation, outputs["ppo"], POLICY_MODEL, CHAMPION, outputs["reward"], outputs["world"],
        config.reward.train, seed)
    return outputs["evaluate_vs_champion"], against, str(champion.version)


# on a registered rlhf-policy version: its promotion decision, and the champion version it was judged against
DECISION_TAG, JUDGED_AGAINST_TAG, NO_CHAMPION = "rlhf.promotion", "rlhf.promotion.judged_against", "none"
PROMOTED = "promoted to champion"  # the decision's verdict when it moved the alias (earlier_promotion reads it back)


def earlier_promotion(ctx: RunContext, candidate: ArtifactRef) -> dict[str, Any] | None:
    """The decision a round made for this policy (the tags on its registered version) when the champion has changed
    since, as this run's decision; None when none was made or the champion is still the one it was judged against
    (its round run again decides again: the same evaluation, perhaps another promote_min_win_rate). Run again after
    the champion moved (a killed round, an rlhf-rounds series resumed after a failure), its round would judge it
    against a later champion and could move the alias back to it. To promote it then, set the alias in the registry."""
    version = ctx.tracker.model_version(POLICY_MODEL, candidate.digest)
    decided = None if version is None else version.tags.get(DECISION_TAG)
    if not decided:
        return None
    champion = ctx.tracker.aliased_version(POLICY_MODEL, CHAMPION)
    if (NO_CHAMPION if champion is None else str(champion.version)) == version.tags.get(JUDGED_AGAINST_TAG):
        return None
    since = ("it is the champion since" if champion is not None and champion.version == version.version else
             "the champion has changed since")
    reason = f"decided when it was first judged ({since}), not again: {decided}"
    ctx.tracker.set_tags(ctx.parent_run_id, {"rlhf.promotion": "decided before", "rlhf.promotion.reason": reason})
    stage_logger().info(reason)
    # promoted then (a resumed rlhf-rounds logs series/promoted from this), whether or not it is the champion now
    return {"promoted": f" {PROMOTED}: " in decided, "version": int(version.version), "reason": reason}


def _baseline_digest(ctx: RunContext, evaluation: ArtifactRef) -> str | None:
    return next((i.digest for i in ctx.store.manifest(evaluation).inputs if i.name == "baseline"), None)


@task(name="promote", cache_policy=NO_CACHE)
def promote(ctx: RunContext, cfg: IterationConfig, candidate: ArtifactRef, evaluation: ArtifactRef,
            against: str, champion_version: str | None = None) -> dict[str, Any]:
    """rlhf-policy@champion moves to the candidate when its judged win rate against `against` is above
    iteration.promote_min_win_rate, and the champion is still `champion_version` (the one judged against; None:
    there was none); the decision and its numbers go to the round's MLflow run."""
    tracker = ctx.tracker
    version = tracker.model_version(POLICY_MODEL, candidate.digest)
    if version is None:
        raise RuntimeError(f"the round's policy {candidate.digest[:12]} is not registered as {POLICY_MODEL}: "
                           "its ppo stage registers it; re-run the round to register it")
    win_rate = judged_win_rate(ctx.store.manifest(evaluation).metrics)
    promoted = win_rate > cfg.promote_min_win_rate
    verdict = PROMOTED if promoted else "not promoted"
    reason = (f"{POLICY_MODEL} v{version.version} {verdict}: judged win rate {win_rate:.3f} (a tie half a win) "
              f"against {against} {'>' if promoted else '<='} iteration.promote_min_win_rate "
              f"{cfg.promote_min_win_rate}")
    now = tracker.aliased_version(POLICY_MODEL, CHAMPION)  # judging took minutes; another round may have promoted
    if promoted and (None if now is None else str(now.version)) != champion_version:
        promoted, verdict = False, "not promoted"
        reason = (f"{POLICY_MODEL} v{version.version} not promoted: it won against {against} (judged win rate "
                  f"{win_rate:.3f}), but the champion is now v{now.version if now else '(none)'}, which it was not "
                  "judged against (another round promoted it meanwhile); the next round judges against it")
    if promoted:
        tracker.set_alias(POLICY_MODEL, CHAMPION, version.version)
    # every decision, on the version, with the champion it was judged against: a re-run of its round (a killed
    # round, a resumed rlhf-rounds) does not decide again against a champion that came later (earlier_promotion)
    tracker.tag_model_version(POLICY_MODEL, version.version,
                              {DECISION_TAG: reason, JUDGED_AGAINST_TAG: champion_version or NO_CHAMPION})
    tracker.set_tags(ctx.parent_run_id, {"rlhf.promotion": verdict, "rlhf.promotion.reason": reason})
    tracker.log_metrics(ctx.parent_run_id, {"promotion/win_rate": win_rate, "promotion/promoted": float(promoted),
                                            "promotion/threshold": cfg.promote_min_win_rate})
    stage_logger().info(reason)
    return {"promoted": promoted, "win_rate": win_rate, "against": against, "version": int(version.version),
            "reason": reason}


REGISTERED_KINDS = {POLICY_MODEL: "policy", SFT_MODEL: "policy", REWARD_MODEL: "reward_model"}  # name -> artifact kind


def registered_models(tracking_uri: str) -> frozenset[tuple[str, str]]:
    """(digest, kind) of every model version the registry at `tracking_uri` holds under the names the stages register
    as (their `rlhf.digest` tag): the models a workdir's store may let go of (`rlhf gc --drop-registered-models`)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tasks.tracking import check_tracking_server

    check_tracking_server(tracking_uri)
    client, held = MlflowClient(tracking_uri), set()
    for name, kind in REGISTERED_KINDS.items():
        try:
            versions = client.search_model_versions(f"name = '{name}'")
        except MlflowException:  # no such registered model
            continue
        held |= {(v.tags["rlhf.digest"], kind) for v in versions if "rlhf.digest" in v.tags}
    return frozenset(held)
