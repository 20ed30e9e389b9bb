"""The stages from the import on (import_annotations, vote, denoise, reward, ppo, evaluate) as the round calls them,
and `rlhf-stage`, the flow that runs one of them alone on chosen input artifacts.

One code path: `rlhf_round` and `rlhf_stage` both call a stage through HEAVY_STAGES, with its inputs by name.
An input is named after the round's stage that makes it ("sft", "world", "vote", ...), except "pairs" (the
comparisons the reward models learn from) and "policy" (the policy PPO improves).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, get_args

from prefect import flow, get_run_logger

import rlhf_core
from rlhf_core.artifacts import MANIFEST, ArtifactRef, ArtifactStore, Manifest
from rlhf_core.config import ConfigError, RoundConfig
from rlhf_core.paths import allowed_roots, resolve_allowed
from tasks.annotation import collect_annotations, import_annotations
from tasks.common import RunContext, lock_workdir
from tasks.denoise import denoise_pairs
from tasks.evaluation import evaluate
from tasks.ppo import train_policy
from tasks.promotion import lineage_tags, reward_model_tags, starting_policy, tag_registered_policy
from tasks.reward import train_reward
from tasks.voting import vote_strength

Inputs = dict[str, ArtifactRef]


@dataclass(frozen=True)
class HeavyStage:
    """How the round calls one heavy stage: the artifact kind of each input it reads, and the call.

    `made_here`: an input that the stage run alone makes from its other inputs when it is not given, instead of
    running the round up to the stage that makes it (name -> how: (ctx, config, inputs, seed) -> artifact)."""

    inputs: dict[str, str]
    call: Callable[[RunContext, RoundConfig, Inputs, int, bool], ArtifactRef]
    made_here: dict[str, Callable[[RunContext, RoundConfig, Inputs, int], ArtifactRef]] = field(default_factory=dict)

    def inputs_for(self, config: RoundConfig) -> dict[str, str]:
        """The inputs this config makes it read: MetaRM's meta step also reads the generated responses."""
        if self.call is _reward and config.reward.train.meta.enabled:
            return self.inputs | {"generate": "responses"}
        return self.inputs


def _import(ctx: RunContext, config: RoundConfig, a: Inputs, seed: int, simulated: bool) -> ArtifactRef:
    return import_annotations(ctx, config.annotation, a["annotators"], a["generate"], simulated)


def _collect_beside(ctx: RunContext, config: RoundConfig, a: Inputs, seed: int) -> ArtifactRef:
    # the config's exports (or the simulated crowd's labels) collected beside the responses given: from the round,
    # they would wait for it to generate again, and the simulated crowd would label those other responses
    return collect_annotations(ctx, config.annotation, config.world, a["generate"], seed)


def _vote(ctx: RunContext, config: RoundConfig, a: Inputs, seed: int, simulated: bool) -> ArtifactRef:
    return vote_strength(ctx, config.voting, a["pairs"], a["sft"], seed, simulated, config.reward.holdout_fraction)


def _denoise(ctx: RunContext, config: RoundConfig, a: Inputs, seed: int, simulated: bool) -> ArtifactRef:
    return denoise_pairs(ctx, config.denoise, a["pairs"], a["vote"], simulated, config.reward.holdout_fraction)


def _reward(ctx: RunContext, config: RoundConfig, a: Inputs, seed: int, simulated: bool) -> ArtifactRef:
    return train_reward(ctx, config.reward, a["denoise"], a["pairs"], a["sft"], a["world"], seed, simulated,
                        config.world.max_operand, tuple(config.world.operations),
                        responses=a["generate"] if config.reward.train.meta.enabled else None,
                        policy_generators=tuple(g.name for g in config.generation.generators if g.model == "policy"))


def _ppo(ctx: RunContext, config: RoundConfig, a: Inputs, seed: int, simulated: bool) -> ArtifactRef:
    reference = a["policy"] if config.iteration.kl_reference == "start_policy" else a["sft"]
    return train_policy(ctx, config.ppo, a["policy"], a["reward"], a["world"], a["sft"], config.reward.train, seed,
                        reference=reference)


def _evaluate(ctx: RunContext, config: RoundConfig, a: Inputs, seed: int, simulated: bool) -> ArtifactRef:
    return evaluate(ctx, config.evaluation, a["ppo"], a["sft"], a["reward"], a["world"], config.reward.train, seed)


HEAVY_STAGES: dict[str, HeavyStage] = {
    # the annotators' exports joined to chosen responses: labels of tasks made from responses the round no longer
    # generates (other settings, or a pipeline version whose response ids differ) join the artifact that made them
    "import_annotations": HeavyStage({"annotators": "annotation_export", "generate": "responses"}, _import,
                                     made_here={"annotators": _collect_beside}),
    "vote": HeavyStage({"pairs": "comparisons", "sft": "policy"}, _vote),
    "denoise": HeavyStage({"pairs": "comparisons", "vote": "votes"}, _denoise),
    "reward": HeavyStage({"denoise": "denoised", "pairs": "comparisons", "sft": "policy", "world": "prompts"},
                         _reward),
    "ppo": HeavyStage({"policy": "policy", "reward": "reward_model", "world": "prompts", "sft": "policy"}, _ppo),
    "evaluate": HeavyStage({"ppo": "policy", "sft": "policy", "reward": "reward_model", "world": "prompts"},
                           _evaluate),
}
HeavyStageName = Literal["import_annotations", "vote", "denoise", "reward", "ppo", "evaluate"]
assert set(get_args(HeavyStageName)) == set(HEAVY_STAGES)

# The round's stages in the order they run: an input the flow is not given comes from the round run up to
# the stage that makes it (served from the cache when that already ran with the same config).
ROUND_ORDER = ("world", "sft", "sample", "generate", "annotators", "import_annotations", "vote", "denoise", "reward",
               "ppo", "evaluate")
MADE_BY = {"pairs": "import_annotations", "policy": "sft"}  # other inputs are named after their stage


def find_artifact(reference: str, name: str, store: ArtifactStore) -> ArtifactRef:
    """The artifact `reference` names: `kind:digest` or a digest (or its first 12+ characters) in the workdir's
    store, or the path of an artifact directory (under the allowed roots). `name` is the input, for messages.
    Every byte is checked against its manifest: a user-given input is read as it was committed, or refused."""
    ref = _artifact_named(reference, name, store)
    if problems := store.damage(ref):
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise ConfigError(f"inputs.{name}: {ref.kind}:{ref.digest[:12]} at {ref.path} changed since it was committed "
                          f"({shown}): give another artifact, or run `rlhf verify <workdir> --remove` and let the "
                          "round make it again")
    return ref


def _artifact_named(reference: str, name: str, store: ArtifactStore) -> ArtifactRef:
    if "/" in reference or reference.startswith("."):
        path = resolve_allowed(reference, f"inputs.{name}", allowed_roots(store.root.parent, trust_workdir=True))
        if not (path / MANIFEST).is_file():
            raise ConfigError(f"inputs.{name}: {path} is not an artifact directory (it has no {MANIFEST})")
        try:
            manifest = Manifest.model_validate_json((path / MANIFEST).read_text())
        except ValueError:
            raise ConfigError(f"inputs.{name}: {path / MANIFEST} is not a manifest this version reads") from None
        return ArtifactRef(kind=manifest.kind, digest=manifest.digest, path=str(path))
    kind, _, digest = reference.rpartition(":")
    if len(digest) < 12:
        raise ConfigError(f"inputs.{name}: {reference!r} is neither kind:digest, a digest (12+ characters) nor an "
                          "artifact directory; copy the stage's output from its MLflow run (tag rlhf.output)")
    found = [d for d in store.root.glob(f"{kind or '*'}/{digest}*") if (d / MANIFEST).is_file()]
    if len(found) != 1:
        what = "no artifact" if not found else f"{len(found)} artifacts"
        raise ConfigError(f"inputs.{name}: {what} matching {reference!r} in {store.root}: give the whole "
                          "kind:digest of the stage's output (its MLflow run's tag rlhf.output)")
    return ArtifactRef(kind=found[0].parent.name, digest=found[0].name, path=str(found[0]))


def given_inputs(stage: str, config: RoundConfig, references: dict[str, str], store: ArtifactStore) -> Inputs:
    """The artifacts `references` name, each checked to be of the kind the stage reads under that name."""
    expected = HEAVY_STAGES[stage].inputs_for(config)
    if unknown := sorted(set(references) - set(expected)):
        raise ConfigError(f"inputs: stage {stage} reads {', '.join(expected)}; it has no input "
                          f"{', '.join(unknown)}")
    refs = {name: find_artifact(ref, name, store) for name, ref in references.items()}
    for name, ref in refs.items():
        if ref.kind != expected[name]:
            raise ConfigError(f"inputs.{name}: stage {stage} reads a {expected[name]} artifact as {name}, and "
                              f"{references[name]!r} is a {ref.kind} artifact ({ref.kind}:{ref.digest[:12]}): give "
                              f"the output of stage {MADE_BY.get(name, name)}")
    return refs


def round_inputs(missing: list[str], config: RoundConfig) -> Inputs:
    """The inputs the round gives: the round run up to the last stage that makes one of them."""
    from flows.round import rlhf_round  # the round imports this module for HEAVY_STAGES

    last = max((MADE_BY.get(name, name) for name in missing), key=ROUND_ORDER.index)
    artifacts = rlhf_round(config=config, stop_after=last)["artifacts"]
    return {name: ArtifactRef(**artifacts[MADE_BY.get(name, name)]) for name in missing}


def export_simulated(store: ArtifactStore, annotators: ArtifactRef) -> bool:
    """Whether an annotation export is the simulated crowd's (it copied no file of the user's): the import reads it
    as what it is, not as the config's exports would be."""
    return store.manifest(annotators).config.get("export_sha256") == []


def pairs_simulated(store: ArtifactStore, pairs: ArtifactRef) -> bool:
    """Whether `pairs` are the simulated world's (their import stage says; accumulated pairs are their current round's):
    a stage alone on given pairs adds gold metrics by what the pairs are, not by the config (gold of real prompts
    failed after the voters trained; simulated pairs under a config with exports lost every gold metric)."""
    manifest = store.manifest(pairs)
    if manifest.stage == "accumulate_pairs":
        current = next(i for i in manifest.inputs if i.name == "current")
        return pairs_simulated(store, store.find(current.kind, current.digest))
    return bool(manifest.config.get("simulated", False))


@flow(name="rlhf-stage", version=rlhf_core.__version__, log_prints=True)
def rlhf_stage(stage: HeavyStageName = "denoise", inputs: dict[str, str] | None = None,
               config: RoundConfig = RoundConfig(), config_path: str | None = None) -> dict[str, Any]:
    """One heavy stage of a round alone, on chosen input artifacts; returns its output artifact.

    The stage is the round's own task with the round's config: on the same inputs it is a cache hit on
    what the round made, with the same digest.

    Args:
        stage: the stage to run: import_annotations, vote, denoise, reward, ppo or evaluate.
        inputs: input artifacts by name, each `kind:digest` (a stage's MLflow run shows its output as the
            tag rlhf.output), a digest or an artifact directory. import_annotations reads annotators
            (annotation_export: the config's exports, or the simulated crowd's) and generate (responses: the ones
            the tasks were made from); vote reads pairs (comparisons) and sft
            (policy); denoise reads pairs and vote (votes); reward reads denoise (denoised), pairs, sft and
            world (prompts); ppo reads policy, reward (reward_model), world and sft; evaluate reads ppo
            (policy), sft, reward and world. An input not given is the round's, from the cache; except
            import_annotations' annotators, collected beside the responses given (the config's exports).
        config: the round's config (see rlhf-round's `config`); the stage reads its own section.
        config_path: a YAML config file used instead of the form's config (see rlhf-round's `config_path`).
    """
    from flows.round import checked_round_config, flow_runs_note, open_round  # the round imports this module

    config = checked_round_config(config, config_path)
    if config.iteration.continue_series:  # its inputs would come from round k + 1, the stage run as round 1
        raise ConfigError("rlhf-stage runs a stage of round 1 of its config, and iteration.continue_series makes the "
                          "round that finds its inputs the series' next one: set it false for a stage run alone")
    store = ArtifactStore(Path(config.workdir).resolve() / "artifacts")
    refs = given_inputs(stage, config, inputs or {}, store)  # refused before any work
    made_here = HEAVY_STAGES[stage].made_here
    if missing := [name for name in HEAVY_STAGES[stage].inputs_for(config) if name not in refs | made_here]:
        get_run_logger().info("stage %s: inputs %s from the round (its cache)", stage, ", ".join(missing))
        refs |= round_inputs(missing, config)
    # between two rounds of an rlhf-rounds series the workdir is the series': its next round would fail on this lock
    with lock_workdir(config.workdir, note=flow_runs_note(), yield_to_series=True) as left_by_killed:
        gone = [f"{name} ({ref.kind}:{ref.digest[:12]})" for name, ref in refs.items() if not Path(ref.path).is_dir()]
        if gone:  # checked before the lock was taken
            raise ConfigError(f"inputs: {', '.join(gone)} left the store after they were checked (`rlhf gc`, or "
                              "deleted by hand): nothing ran; give inputs the store holds, or run the round again")
        ctx = open_round(config, run_name=f"stage-{stage}-{config.name}", left_by_killed=left_by_killed)
        try:
            source = "stage_input"  # a policy given to rlhf-stage
            if "policy" in missing:  # the policy the round would improve: SFT, or the champion
                refs["policy"], source = starting_policy(ctx, config.iteration, refs["policy"], None)
            refs |= {name: make(ctx, config, refs, config.seed) for name, make in made_here.items() if name not in refs}
            simulated = (pairs_simulated(store, refs["pairs"]) if "pairs" in refs else
                         export_simulated(store, refs["annotators"]) if "annotators" in refs else
                         not config.annotation.exports)
            ref = HEAVY_STAGES[stage].call(ctx, config, refs, config.seed, simulated)
            if stage == "ppo":  # its registered version names what it started from and its reward model, as a round's
                lineage = lineage_tags(ctx, refs["policy"], source)
                ctx.tracker.set_tags(ctx.parent_run_id, lineage)
                tag_registered_policy(ctx, ref, lineage | reward_model_tags(ctx, refs["reward"]))
        except BaseException:
            ctx.tracker.end_run(ctx.parent_run_id, status="FAILED")
            raise
        ctx.tracker.end_run(ctx.parent_run_id)
    return {"stage": stage, "artifact": ref.model_dump(), "inputs": {n: r.model_dump() for n, r in refs.items()},
            "mlflow": {"tracking_uri": ctx.tracking_uri, "experiment": ctx.experiment, "run_id": ctx.parent_run_id}}
