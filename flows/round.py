"""The RLHF round: sample -> generate -> annotate -> vote -> denoise -> reward -> PPO -> evaluate.

The flow body is a table of contents: each line is a versioned, cached, tracked task.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_client, get_run_logger
from prefect.events import emit_event
from prefect.exceptions import ObjectNotFound
from prefect.states import Crashed
from prefect.runtime import flow_run

import rlhf_core
from flows.chaining import round_completed
from flows.cli import load_round_config
from flows.local_api import runs_on_local_api
from flows.stages import HEAVY_STAGES
from rlhf_core.artifacts import ArtifactRef, ArtifactStore
from rlhf_core.config import (RESOLVED, ConfigError, RoundConfig, check_iterated_rounds, config_digest, deep_merge,
                               parse_config, url_without_userinfo)
from rlhf_core.annotation.importer import check_exports
from rlhf_core.chat_completions import check_chat_server, key_for
from rlhf_core.paths import allowed_roots, check_config_paths, resolve_allowed
from tasks.annotation import collect_annotations
from tasks.common import SERIES_LOCK, RunContext, code_tags, lock_workdir, publish_markdown
from tasks.evaluation import evaluate, http_api_key
from tasks.generation import generate
from tasks.iteration import (FinishedRound, check_new_import, check_round_inputs, forget_series_start,
                             last_finished_round, pairs_so_far, record_finished_round, rounds_series_key, series_base,
                             series_start, stop_reason, training_pairs)
from tasks.promotion import (earlier_promotion, evaluation_against_champion, lineage_tags, promote,
                             reward_model_tags, starting_policy, tag_registered_policy)
from tasks.sampling import sample_prompts
from tasks.tracking import Tracker, check_tracking_server, default_tracking_uri
from tasks.world import build_world, train_sft_policy

# The numbers a person wants first: (stage, metric) read from the stages' manifests after the round.
HEADLINE = {
    "annotator agreement with gold": ("import_annotations", "annotation/gold_agreement_excl_gold_ties"),
    "voters' gold accuracy": ("vote", "voting/voter_gold_accuracy_excl_gold_ties"),
    "pairs flipped by voting": ("denoise", "denoise/n_flipped"),
    "pairs in total": ("import_annotations", "annotation/n_pairs"),
    "pairs accumulated over rounds": ("accumulate_pairs", "pairs/n_pairs"),
    "flip precision": ("denoise", "denoise/flip_precision_excl_gold_ties"),
    "gold agreement before denoising": ("denoise", "denoise/gold_agreement_before_excl_gold_ties"),
    "gold agreement after denoising": ("denoise", "denoise/gold_agreement_after_excl_gold_ties"),
    "RM accuracy vs gold (held-out), raw labels": ("reward", "reward/baseline/gold_accuracy_heldout"),
    "RM accuracy vs gold (held-out)": ("reward", "reward/gold_accuracy_heldout"),
    "RM accuracy, correctness-only pairs": ("reward", "reward/gold_accuracy_heldout/correctness_only"),
    "RM agreement with held-out human labels, raw labels": ("reward", "reward/baseline/heldout/accuracy"),
    "RM agreement with held-out human labels": ("reward", "reward/heldout/accuracy"),
    "held-out human-labelled pairs": ("reward", "reward/heldout/n_pairs"),
    "RM score, SFT": ("evaluate", "eval/sft/reward"),
    "RM score, new policy": ("evaluate", "eval/policy/reward"),
    "gold score, SFT": ("evaluate", "eval/sft/gold"),
    "gold score, new policy": ("evaluate", "eval/policy/gold"),
    "KL(new policy || SFT)": ("evaluate", "eval/policy/kl_to_sft"),
    "judged win rate vs SFT": ("evaluate", "eval/judge/win_rate"),
    "judged tie rate vs SFT": ("evaluate", "eval/judge/tie_rate"),
    "judged lose rate vs SFT": ("evaluate", "eval/judge/lose_rate"),
    "judged win rate vs the round before": ("evaluate_vs_previous", "eval/judge/win_rate"),
    "judged tie rate vs the round before": ("evaluate_vs_previous", "eval/judge/tie_rate"),
    "judged win rate vs the champion": ("evaluate_vs_champion", "eval/judge/win_rate"),
    "judged tie rate vs the champion": ("evaluate_vs_champion", "eval/judge/tie_rate"),
}


def headline_metric(stage: str, key: str) -> str:
    """The parent run's metric of a headline number: evaluations against other baselines than SFT
    report under the same names as `evaluate` (eval/judge/...), so their stage goes into the name."""
    return f"headline/{stage}/{key}" if stage.startswith("evaluate_vs_") else f"headline/{key}"


def open_round(config: RoundConfig, round_no: int = 1, run_name: str | None = None,
               series_run_id: str | None = None, left_by_killed: str = "") -> RunContext:
    """Create the round's parent MLflow run (named `run_name`, default round-{name}-{round_no}), tagged with the
    Prefect flow run; nested under `series_run_id` (rlhf-rounds' run) when given. `left_by_killed`: what the
    workdir's lock held when this round took it (a killed holder's note, naming its flow runs)."""
    workdir, tracker = workdir_tracker(config)
    close_what_killed_rounds_left(workdir, tracker, flow_runs_in(left_by_killed))
    tags = {"rlhf.workdir": str(workdir), "rlhf.round_no": str(round_no), **run_tags(config)}
    parent = tracker.start_run(run_name or f"round-{config.name}-{round_no}", tags, parent_run_id=series_run_id)
    tracker.log_params(parent, config.model_dump(mode="json", context=RESOLVED))  # preset switches as values
    return RunContext(workdir=str(workdir), tracking_uri=tracker.tracking_uri, experiment=config.experiment,
                      parent_run_id=parent, round_name=config.name, round_no=round_no,
                      flow_run_id=tags["prefect.flow_run_id"])


def workdir_tracker(config: RoundConfig) -> tuple[Path, Tracker]:
    """The round's workdir (created) and the Tracker of its MLflow store (config.tracking_uri or the workdir's)."""
    workdir = Path(config.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    uri = config.tracking_uri or default_tracking_uri(workdir)
    return workdir, Tracker(uri, config.experiment, workdir / "mlartifacts")


def run_tags(config: RoundConfig) -> dict[str, str]:
    """The tags a round's and an rlhf-rounds' MLflow run share: the config and code, and the Prefect flow run (its
    UI link only where the Prefect API outlives the command: a command-line round's local API does not)."""
    return {"rlhf.round": config.name, "rlhf.config_digest": config_digest(config), **code_tags(),
            "prefect.flow_run_id": str(flow_run.id or ""), "prefect.flow_run_name": str(flow_run.name or ""),
            "prefect.flow_run_url": flow_run_ui_url()}


def flow_run_ui_url() -> str:
    """The flow run's page in the Prefect UI: "" where the API ends with the command (the CLI's local one)."""
    return "" if runs_on_local_api() else url_without_userinfo(str(flow_run.ui_url or ""))


def close_what_killed_rounds_left(workdir: Path, tracker: Tracker, killed_flow_runs: set[str] = frozenset()
                                  ) -> None:
    """The runs a killed holder of the workdir's lock left RUNNING (`killed_flow_runs`: the flow runs its note
    names): its MLflow runs become KILLED, its Prefect flow runs CRASHED; and half-written staging directories
    go. Called under the workdir's lock. Runs are matched by the note, not by the workdir's path: two machines
    (pods) may hold the same path on one shared MLflow or Prefect server, and the other's runs are live."""
    log = get_run_logger()
    if killed := tracker.close_killed_runs(str(workdir), killed_flow_runs):
        log.warning("marked %d MLflow run(s) of %s KILLED: left RUNNING by a killed round", killed, workdir)
    if crashed := crash_killed_flow_runs(workdir, killed_flow_runs):
        log.warning("marked %d Prefect flow run(s) of %s CRASHED: left RUNNING by a killed round", crashed, workdir)
    if swept := ArtifactStore(workdir / "artifacts").sweep_staging():
        log.warning("removed %d half-written artifact(s) a killed round left in %s", swept, workdir / "artifacts")


def crash_killed_flow_runs(workdir: Path, named: set[str]) -> int:
    """Mark CRASHED the flow runs `named` (by the workdir's lock, as its killed holder's) still RUNNING, but this
    one and those it runs inside. Returns how many."""
    crashed = 0
    with get_client(sync_client=True) as client:
        live = this_run_and_its_parents(client)  # rlhf-stage runs rlhf-round as a subflow: its parent is live
        for run_id in sorted(named - live):
            try:
                run = client.read_flow_run(run_id)
            except ObjectNotFound:  # another Prefect API's (the command line's local one, since gone)
                continue
            if run.state is None or not run.state.is_running():
                continue
            client.set_flow_run_state(run.id, Crashed(message=f"left RUNNING by a killed process; closed by the "
                                                              f"next round in {workdir}"), force=True)
            crashed += 1
    return crashed


FLOW_RUNS_NOTE = "prefect flow runs "


def flow_runs_note() -> str:
    """What a round notes in the workdir's lock: its flow run and those it runs inside, for the next round to
    close should this one be killed."""
    with get_client(sync_client=True) as client:
        return FLOW_RUNS_NOTE + ",".join(sorted(this_run_and_its_parents(client)))


def flow_runs_in(note: str) -> set[str]:
    """The flow run ids a lock's note names (flow_runs_note)."""
    _, found, ids = note.partition(FLOW_RUNS_NOTE)
    return set(ids.split(",")) - {""} if found else set()


def this_run_and_its_parents(client) -> set[str]:
    """The ids of this flow run and of every flow run it runs inside (as a subflow), up to the outermost."""
    live, run_id = set(), flow_run.id
    while run_id is not None and str(run_id) not in live:
        live.add(str(run_id))
        parent_task = client.read_flow_run(run_id).parent_task_run_id
        run_id = client.read_task_run(parent_task).flow_run_id if parent_task else None
    return live


def resolve_round_config(config: RoundConfig, config_path: str | None) -> RoundConfig:
    """The round's config: the form's `config`, or the YAML file `config_path` (under the allowed roots).

    The UI form always sends `config` (its defaults when untouched), so `config` counts as given when it
    differs from the default; a changed form together with a config file is refused rather than merged.
    """
    if not config_path:
        return config
    if config_digest(config) != config_digest(RoundConfig()):
        raise ConfigError(f"give the round's config either as config_path ({config_path}) or in the form's config, "
                          "not both: reset the form's config to its defaults, or clear config_path")
    path = resolve_allowed(config_path, "config_path", allowed_roots())
    return load_round_config(path)


def checked_round_config(config: RoundConfig, config_path: str | None,
                         annotation_exports: list[str] | None = None) -> RoundConfig:
    """The round's config (the form's or the file's, with `annotation_exports` as its annotation.exports when
    given), refused before any work when a file it names is missing or outside the allowed roots, an annotation
    export is unreadable, or the tracking server does not answer."""
    config = resolve_round_config(config, config_path)
    if annotation_exports:
        exports = {"annotation": {"exports": annotation_exports}}
        config = parse_config(deep_merge(config.model_dump(mode="json"), exports), source="(annotation_exports)")
    check_config_paths(config)  # every file the config names, before anything is created
    check_exports(config.annotation)  # and every annotation export readable as one
    check_tracking_server(config.tracking_uri or default_tracking_uri(Path(config.workdir).resolve()))
    check_chat_servers(config)
    return config


def check_chat_servers(config: RoundConfig) -> None:
    """The LLM judge's and the LLM tagger's servers answer and their keys are there and may go to them, before any
    work (else found at their stage: the judge's after SFT, voting, the reward model and PPO)."""
    from rlhf_core.sampling.taggers import LLMTagger

    if config.evaluation.judge == "http":
        http = config.evaluation.http
        check_chat_server(http.base_url, "evaluation.http.base_url")
        _check_key("evaluation.http", http.base_url, lambda: http_api_key(http))
    if config.sampling.tagger.source == "llm":
        tagger = config.sampling.tagger
        check_chat_server(tagger.base_url, "sampling.tagger.base_url")
        _check_key("sampling.tagger", tagger.base_url,
                   LLMTagger(tagger.base_url, tagger.model, api_key_env=tagger.api_key_env).api_key)


def _check_key(section: str, url: str, read_key) -> None:
    """The key `read_key()` gives is set and may be sent to `url`; a ConfigError naming `section` (never the key)."""
    try:
        key_for(url, read_key())
    except (ValueError, RuntimeError) as err:
        raise ConfigError(f"{section}: {err}") from None


StageName = Literal["world", "sft", "sample", "generate", "annotators", "import_annotations", "vote", "denoise",
                    "reward", "ppo", "evaluate"]


@flow(name="rlhf-round", version=rlhf_core.__version__, log_prints=True)
def rlhf_round(config: RoundConfig = RoundConfig(), stop_after: StageName | None = None, round_no: int = 1,
               start_policy: ArtifactRef | None = None, config_path: str | None = None,
               earlier_pairs: ArtifactRef | None = None, annotation_exports: list[str] | None = None,
               series_run_id: str | None = None, previous_round_run_id: str | None = None,
               wait_for_workdir_minutes: float = 0.0) -> dict[str, Any]:
    """One RLHF round on the configured world; returns the summary (also logged to MLflow).

    The world, the SFT policy, the reward-model backbone and the ptx data are those of round 1 in
    every round. The new policy is judged against SFT (and the round before's), and becomes
    rlhf-policy@champion when it beats the champion (iteration.promote_min_win_rate).

    Args:
        config: the whole round: world, sampling, generation, annotation, voting, denoising, reward
            model, PPO and evaluation (configs/demo.yaml holds these defaults; `rlhf schema` lists every key).
        stop_after: end the round after this stage; earlier stages come from the cache when they already
            ran with the same config. This is how one stage is run.
        round_no: the round's number in an iterated run; round k > 1 samples new prompts (seed + k - 1). With
            iteration.continue_series (and none of round_no, start_policy, earlier_pairs given) the round is the
            next of the last round of its name that finished in the workdir, with its pairs so far.
        start_policy: the policy artifact this round improves (the previous round's); empty = as
            iteration.start_from says (the SFT policy, or rlhf-policy@champion).
        config_path: a YAML config file (relative to the worker's directory, or under RLHF_ALLOWED_ROOTS)
            used instead of the form's config; leave the form's config at its defaults when you give one.
        earlier_pairs: the comparison pairs of the rounds before (the previous round's accumulation, or round
            1's pairs); with iteration.pairs accumulate, this round votes on and trains with them and its own.
        annotation_exports: annotation export files this round imports instead of the config's
            annotation.exports (rlhf-round/on-new-export sets it to the file rlhf-watch-exports announced).
        series_run_id: the MLflow run this round's run nests under (rlhf-rounds sets it to its own); empty = none.
        previous_round_run_id: the MLflow run of the round this one follows (rlhf-round/next-round's trigger and
            rlhf-rounds set it), kept as the tag rlhf.previous_round.run_id: chained rounds link back in MLflow.
        wait_for_workdir_minutes: how long to wait for another round that holds the workdir; 0 = fail at once
            (WorkdirBusyError naming it). The scheduled and triggered deployments wait (prefect.yaml): their
            schedule or event does not come again for this round.

    A round that runs to its evaluation emits the Prefect event rlhf.round.completed (flows/chaining.py),
    which rlhf-round/next-round's trigger turns into the next round.
    """
    if round_no < 1:  # round 0 of seed 0 sampled with seed -1, refused only after SFT
        raise ConfigError(f"round_no must be at least 1 (got {round_no})")
    config = checked_round_config(config, config_path, annotation_exports)
    check_round_inputs(config.workdir, start_policy, earlier_pairs)
    # one round at a time per workdir (its store, scratch, mlflow.db and finished-rounds record)
    if wait_for_workdir_minutes < 0:
        raise ValueError(f"wait_for_workdir_minutes must be at least 0 (got {wait_for_workdir_minutes:g})")
    with lock_workdir(config.workdir, note=flow_runs_note(), busy_wait_s=60 * wait_for_workdir_minutes,
                      yield_to_series=series_run_id is None) as left_by_killed:
        follows = None  # the last finished round of this name, which this one continues (a scheduled round)
        if config.iteration.continue_series and round_no == 1 and start_policy is None and earlier_pairs is None:
            follows = last_finished_round(config.workdir, config.name, series_base(config))
        if follows is not None:
            round_no, earlier_pairs = follows.round_no + 1, follows.pairs
            previous_round_run_id = previous_round_run_id or follows.mlflow_run_id
        summary = _run_stages(config, stop_after, round_no, start_policy, earlier_pairs, series_run_id,
                              previous_round_run_id, left_by_killed, follows) | {"stopped_after": stop_after}
        if stop_after is None and config.iteration.continue_series:
            record_finished_round(config.workdir, config.name, summary, series_base(config))
    if stop_after is None:
        emit_event(**round_completed(config, summary, subflow=flow_run.parent_flow_run_id is not None))
    return summary


def _run_stages(config: RoundConfig, stop_after: StageName | None, round_no: int, start_policy: ArtifactRef | None,
                earlier_pairs: ArtifactRef | None, series_run_id: str | None = None,
                previous_round_run_id: str | None = None, left_by_killed: str = "",
                follows: FinishedRound | None = None) -> dict[str, Any]:
    ctx = open_round(config, round_no, series_run_id=series_run_id, left_by_killed=left_by_killed)
    if previous_round_run_id:
        ctx.tracker.set_tags(ctx.parent_run_id, {"rlhf.previous_round.run_id": previous_round_run_id})
    if stop_after:  # a round run up to one stage (rlhf stage): not a whole round, though named as one
        ctx.tracker.set_tags(ctx.parent_run_id, {"rlhf.stop_after": stop_after})
    seed, simulated = config.seed + round_no - 1, not config.annotation.exports
    out: dict[str, ArtifactRef] = {}

    def done(name: str, ref: ArtifactRef) -> bool:
        out[name] = ref
        return name == stop_after

    try:
        if done("world", build_world(ctx, config.world, config.seed)):
            return finish_round(ctx, out)
        if done("sft", train_sft_policy(ctx, config.world, config.policy_model, config.sft, out["world"],
                                        config.seed)):
            return finish_round(ctx, out)
        def resolve() -> tuple[ArtifactRef, str]:  # what PPO improves
            return starting_policy(ctx, config.iteration, out["sft"], start_policy)

        # a series' round k starts where it first started: killed after its promotion, it would start from itself
        # (a weekly series' by its name; an rlhf-rounds series' round 1 until the series finishes: run again after a
        # failure, its round 1 started from the champion its own round 1 had made)
        pin = (config.name if config.iteration.continue_series else
               rounds_series_key(config.name) if series_run_id is not None else None)
        made_for = {"sft": out["sft"].digest, "start_from": config.iteration.start_from}
        policy, source = (series_start(config.workdir, pin, round_no, resolve, made_for)
                          if pin is not None and start_policy is None else resolve())
        lineage = lineage_tags(ctx, policy, source)
        ctx.tracker.set_tags(ctx.parent_run_id, lineage)
        if done("sample", sample_prompts(ctx, config.sampling, out["world"], seed)):
            return finish_round(ctx, out)
        if done("generate", generate(ctx, config.generation, out["sample"], policy, seed)):
            return finish_round(ctx, out)
        if done("annotators", collect_annotations(ctx, config.annotation, config.world, out["generate"], seed)):
            return finish_round(ctx, out)
        if follows is not None:
            check_new_import(follows, ctx.store, out["annotators"])
        if done("import_annotations", HEAVY_STAGES["import_annotations"].call(ctx, config, out, seed, simulated)):
            return finish_round(ctx, out)
        pairs = out["import_annotations"]  # what the reward models learn from: this round's pairs, or rounds 1..k's
        if (accumulated := training_pairs(ctx, config.iteration, pairs, earlier_pairs, round_no)) is not None:
            pairs = out["accumulate_pairs"] = accumulated
        inputs = out | {"pairs": pairs, "policy": policy}  # the heavy stages' inputs by name (flows/stages.py)
        for stage in ("vote", "denoise", "reward", "ppo"):
            inputs[stage] = HEAVY_STAGES[stage].call(ctx, config, inputs, seed, simulated)
            if done(stage, inputs[stage]):
                return finish_round(ctx, out)
        # its registered version says what it started from and which reward model trained it
        tag_registered_policy(ctx, out["ppo"], lineage | reward_model_tags(ctx, out["reward"]))
        if done("evaluate", HEAVY_STAGES["evaluate"].call(ctx, config, inputs, seed, simulated)):
            return finish_round(ctx, out)  # no comparison with the round before or the champion, no promotion
        stop = None
        if start_policy is not None:  # round k is also judged against round k - 1 (stage evaluate_vs_previous)
            out["evaluate_vs_previous"] = evaluate(ctx, config.evaluation, out["ppo"], start_policy, out["reward"],
                                                   out["world"], config.reward.train, seed, baseline_name="previous")
            stop = stop_reason(ctx, config.iteration, out["evaluate_vs_previous"])
        promotion = earlier_promotion(ctx, out["ppo"])  # run again after the champion moved: decided when judged
        if promotion is None:
            judged = evaluation_against_champion(ctx, config, out, seed)  # (evaluation, against, champion then)
            promotion = (promote(ctx, config.iteration, out["ppo"], *judged) if judged is not None else
                         {"promoted": False, "reason": "the round's policy already is the champion"})
        return finish_round(ctx, out, {"promotion": promotion, "stop": stop})
    except BaseException:
        ctx.tracker.end_run(ctx.parent_run_id, status="FAILED")
        raise


def finish_round(ctx: RunContext, outputs: dict[str, ArtifactRef],
                 decisions: dict[str, Any] | None = None) -> dict[str, Any]:
    """Summarise, close the round's MLflow run and publish its Prefect artifact. `decisions`: what a finished
    round decided, {"promotion": ..., "stop": why iterated rounds stop here, or None}."""
    summary = summarize_round(ctx, outputs, decisions or {"promotion": None, "stop": None})
    ctx.tracker.end_run(ctx.parent_run_id)
    publish_markdown(round_markdown(ctx, summary), key=f"round-{ctx.round_name}",
                     description=f"round {ctx.round_name}: headline numbers and its MLflow run")
    get_run_logger().info("round %s finished: %s", ctx.round_name, json.dumps(summary["headline"]))
    return summary


def round_markdown(ctx: RunContext, summary: dict[str, Any]) -> str:
    """The round's Prefect artifact: its headline numbers and a link to its parent MLflow run."""
    lines = [f"# RLHF round {ctx.round_name} #{ctx.round_no}", "",
             f"Tracking: {ctx.tracker.run_link(ctx.parent_run_id)} (one nested run per stage).", "",
             f"Stages run: {', '.join(summary['artifacts'])}.", "", "| headline | value |", "| --- | --- |"]
    if (promotion := summary["promotion"]) is not None:
        lines[4:4] = [f"Promotion: {promotion['reason']}.", ""]
    if summary["stop"]:
        lines[4:4] = [f"Iterated rounds stop here: {summary['stop']}.", ""]
    for name, value in summary["headline"].items():
        if value is not None:  # a `|` in a name ("KL(new policy || SFT)") would split the table's cell
            lines.append(f"| {name.replace('|', chr(92) + '|')} | {value:.4g} |")
    return "\n".join(lines)


def summarize_round(ctx: RunContext, outputs: dict[str, ArtifactRef], decisions: dict[str, Any]) -> dict[str, Any]:
    """Headline numbers and artifact paths, logged to the parent run as metrics and summary.json."""
    store, tracker = ctx.store, ctx.tracker
    metrics = {stage: store.manifest(ref).metrics for stage, ref in outputs.items()}
    headline = {name: metrics.get(stage, {}).get(key) for name, (stage, key) in HEADLINE.items()}
    summary = {
        "round": ctx.round_name,
        "round_no": ctx.round_no,
        "mlflow": {"tracking_uri": ctx.tracking_uri, "experiment": ctx.experiment, "run_id": ctx.parent_run_id,
                   "run_url": ctx.tracker.run_url(ctx.parent_run_id)},
        "prefect_flow_run_id": ctx.flow_run_id,
        "prefect_flow_run_url": flow_run_ui_url(),
        "artifacts": {name: {"kind": r.kind, "digest": r.digest, "path": r.path} for name, r in outputs.items()},
        "headline": headline,
        **decisions,
    }
    # under the stages' own metric names: MLflow would mangle the readable ones ("KL(new policy || SFT)")
    tracker.log_metrics(ctx.parent_run_id, {headline_metric(stage, key): headline[name]
                                            for name, (stage, key) in HEADLINE.items() if headline[name] is not None})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "summary.json"
        path.write_text(json.dumps(summary, indent=2))
        tracker.log_artifact(ctx.parent_run_id, path)
    return summary


@flow(name="rlhf-rounds", version=rlhf_core.__version__, log_prints=True)
def rlhf_rounds(config: RoundConfig = RoundConfig(), n_rounds: int = 2,
                config_path: str | None = None) -> list[dict[str, Any]]:
    """Iterated RLHF: round k + 1 annotates responses of round k's policy, votes on and trains its reward
    model with the pairs of rounds 1..k + 1 (iteration.pairs: accumulate) or its own, improves round k's
    policy by PPO and is judged against it as well as SFT; the rounds stop early after one that does not
    beat the round before (iteration.stop_min_win_rate).

    Args:
        config: the config of every round (see rlhf-round's `config`).
        n_rounds: how many rounds to run at most, one after the other.
        config_path: a YAML config file used instead of the form's config (see rlhf-round's `config_path`).
    """
    if n_rounds < 1:
        raise ValueError(f"n_rounds must be >= 1, got {n_rounds}")
    config = checked_round_config(config, config_path)  # before the series' lock, workdir and MLflow run
    check_iterated_rounds(config, n_rounds)
    # one rlhf-rounds at a time per workdir (its series run; each round still takes the round's lock)
    with lock_workdir(config.workdir, note=flow_runs_note(), name=SERIES_LOCK, what="rlhf-rounds"
                      ) as left_by_killed:
        return _run_series(config, n_rounds, left_by_killed)


def _run_series(config: RoundConfig, n_rounds: int, left_by_killed: str = "") -> list[dict[str, Any]]:
    tracker, series = open_series(config, n_rounds, left_by_killed)
    summaries: list[dict[str, Any]] = []
    start: ArtifactRef | None = None
    pairs: ArtifactRef | None = None  # the pairs of the rounds so far
    previous_run: str | None = None  # the round before's MLflow run
    try:
        for round_no in range(1, n_rounds + 1):
            # a minute's wait: a scheduled round waiting for the workdir may hold its lock for an instant while it
            # sees that this series is running (and lets go)
            summary = rlhf_round(config=config, round_no=round_no, start_policy=start, earlier_pairs=pairs,
                                 series_run_id=series, previous_round_run_id=previous_run, wait_for_workdir_minutes=1)
            previous_run = summary["mlflow"]["run_id"]
            summaries.append(summary)
            log_series_round(tracker, series, summary)
            if summary["stop"]:
                get_run_logger().warning("iterated rounds stop after round %d of %d: %s", round_no, n_rounds,
                                         summary["stop"])
                break
            start = ArtifactRef(**summary["artifacts"]["ppo"])
            pairs = ArtifactRef(**pairs_so_far(summary["artifacts"]))
    except BaseException:
        tracker.end_run(series, status="FAILED")
        raise
    forget_series_start(config.workdir, rounds_series_key(config.name))  # finished: a new series resolves anew
    tracker.set_tags(series, {"rlhf.series.rounds_run": str(len(summaries)),
                              "rlhf.series.stop_reason": summaries[-1]["stop"] or ""})
    tracker.end_run(series)
    return summaries


SERIES_WORKDIR_TAG = "rlhf.series_workdir"  # not rlhf.workdir: each round closes that tag's RUNNING runs as killed


def open_series(config: RoundConfig, n_rounds: int, left_by_killed: str = "") -> tuple[Tracker, str]:
    """The MLflow run of an rlhf-rounds flow run: each round's run nests under it, and it holds the headline
    numbers per round (step = round number), so the rounds compare as curves. The series run a killed
    rlhf-rounds left RUNNING (`left_by_killed`: its note in the workdir's rlhf-rounds lock) is marked KILLED
    first."""
    workdir, tracker = workdir_tracker(config)
    if killed := tracker.close_killed_runs(str(workdir), flow_runs_in(left_by_killed), tag=SERIES_WORKDIR_TAG):
        get_run_logger().warning("marked %d rlhf-rounds MLflow run(s) of %s KILLED: left RUNNING by a killed "
                                 "process", killed, workdir)
    series = tracker.start_run(f"rounds-{config.name}", {SERIES_WORKDIR_TAG: str(workdir), **run_tags(config)})
    tracker.log_params(series, {"n_rounds": n_rounds, **config.model_dump(mode="json", context=RESOLVED)})
    return tracker, series


def log_series_round(tracker: Tracker, series: str, summary: dict[str, Any]) -> None:
    """One round's headline numbers on the series run, at step = its round number."""
    headline = summary["headline"]
    metrics = {headline_metric(stage, key): headline[name] for name, (stage, key) in HEADLINE.items()
               if headline.get(name) is not None}
    metrics["series/promoted"] = float(bool((summary["promotion"] or {}).get("promoted")))
    tracker.log_metrics(series, metrics, step=summary["round_no"])
