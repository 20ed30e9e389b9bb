"""What every stage task shares: the run context, the cache, the nested MLflow run, the commit.

`run_stage` is the one place that turns an rlhf_core call into a versioned, cached, tracked
stage execution:
  1. cache key = (stage, stage version, config digest, input digests);
  2. a nested MLflow run under the round's run, with params, input datasets and lineage tags;
  3. a cache hit returns the earlier artifact (tagged `rlhf.cache=hit`), else `produce` writes
     into a staging directory which is committed atomically;
  4. metrics, output tables, plots and models go to MLflow (a model as an MLflow 3 logged model of the
     run, registered with lineage tags; a hit logs the artifact's metrics and outputs again, and logs and
     registers its model if no version holds that digest yet, e.g. on a new tracking store);
  5. a Prefect markdown artifact (what the stage did, its numbers, its MLflow run), on a hit too.
"""

from __future__ import annotations

import fcntl
import gc
import json
import logging
import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd
from pydantic import BaseModel, ConfigDict

import rlhf_core
from rlhf_core.annotation.importer import is_export_name
from rlhf_core.artifacts import ArtifactRef, ArtifactStore, DamagedArtifactError, Manifest, cache_key, manifest_of
from rlhf_core.config import RESOLVED, ConfigError, config_digest
from rlhf_core.progress import lines_to
from tasks.tracking import Tracker, serving_config

log = logging.getLogger("rlhf")


class RunContext(BaseModel):
    """Everything a task needs to find the store and the round's MLflow run; serialisable."""

    model_config = ConfigDict(frozen=True)

    workdir: str
    tracking_uri: str
    experiment: str
    parent_run_id: str
    round_name: str
    round_no: int = 1
    flow_run_id: str = ""

    @property
    def store(self) -> ArtifactStore:
        return ArtifactStore(Path(self.workdir) / "artifacts")

    @property
    def tracker(self) -> Tracker:
        return _tracker(self.tracking_uri, self.experiment, str(Path(self.workdir) / "mlartifacts"))


@lru_cache(maxsize=8)
def _tracker(uri: str, experiment: str, artifact_root: str) -> Tracker:
    return Tracker(uri, experiment, artifact_root)


@lru_cache(maxsize=1)
def git_state() -> tuple[str, bool]:
    """(the commit, whether tracked files differ from it) of the checkout this code runs from; ("", False) outside
    one or without git (the container image has none: its runs say the package version only)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True,
                              timeout=5).stdout.strip()
    try:
        sha = git("rev-parse", "HEAD")
        return sha, bool(sha and git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return "", False


def code_version() -> str:
    """Package version plus the git commit when running from a checkout, ".dirty" when its tracked files were
    changed (the commit alone would then name code that did not run)."""
    sha, dirty = git_state()
    return f"{rlhf_core.__version__}+{sha[:7]}{'.dirty' if dirty else ''}" if sha else rlhf_core.__version__


def code_tags() -> dict[str, str]:
    """The code a run ran: rlhf.code_version, and MLflow's own source tags (the UI's Source and Version columns)."""
    sha, _ = git_state()
    return {"rlhf.code_version": code_version(), "mlflow.source.name": "rlhf-pipeline",
            "mlflow.source.type": "PROJECT"} | ({"mlflow.source.git.commit": sha} if sha else {})


class WorkdirBusyError(RuntimeError):
    """Another round holds the workdir; `holder` is what it wrote into the lock (pid, host, note)."""

    def __init__(self, message: str, holder: str = ""):
        super().__init__(message)
        self.holder = holder


MAINTENANCE = "maintenance:"  # the start of a store maintenance's note (rlhf verify / gc): a round waits for it
MAINTENANCE_WAIT_S = 600.0  # how long at most: gc plans again under the lock (every manifest read)


LEFT_BY_KILLED = "left by a killed holder:"  # a keep_left holder's note carries what it found after this
ROUND_LOCK, SERIES_LOCK = ".round.lock", ".rounds.lock"  # a round's; an rlhf-rounds series' (across its rounds)


def _series_holder(workdir: Path) -> str | None:
    """What holds the workdir's series lock (an rlhf-rounds series, or a store maintenance), or None when it is
    free. Never called by a series' own rounds: their process holds it."""
    if not (workdir / SERIES_LOCK).exists():
        return None
    with open(workdir / SERIES_LOCK, "a+") as g:
        try:
            fcntl.flock(g, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            g.seek(0)
            return g.read().strip() or "an rlhf-rounds series"
        fcntl.flock(g, fcntl.LOCK_UN)
        return None


@contextmanager
def lock_workdir(workdir: str | Path, note: str = "", name: str = ROUND_LOCK, what: str = "round",
                 keep_left: bool = False, maintenance_wait_s: float = MAINTENANCE_WAIT_S,
                 busy_wait_s: float = 0.0, yield_to_series: bool = False) -> Iterator[str]:
    """Hold `<workdir>/<name>` for the duration: a second round in the same workdir fails at once, or, given
    `busy_wait_s`, waits that long for the holder to finish (a round a schedule or an event started: its trigger
    does not come again). `yield_to_series` (a round not of a series): also wait while an `rlhf-rounds` series holds
    the workdir's SERIES_LOCK, whose rounds take the round lock one after the other: taken between two of them, it
    failed the series.

    Two rounds at once in one workdir race on the first creation of mlflow.db, on the scratch
    directories and on model registration. The lock is an flock, so a killed round releases it.
    The holder writes its pid, host and `note` into the file and empties it when it lets go; yields what a
    holder that never let go (a killed round) left there, "" otherwise: the next round knows which runs it left.
    The first round to take a workdir also leaves a `.gitignore` of `*` in it. `keep_left`: a holder that closes
    nothing of a killed round's (`rlhf verify`) puts its note back when it lets go, for the next round.
    A holder whose note starts with MAINTENANCE (`rlhf verify --remove`, `rlhf gc --remove`: seconds) is waited for,
    up to `maintenance_wait_s`: a round a Prefect event started (a new export, announced once) is not lost to it.
    """
    path = Path(workdir)
    path.mkdir(parents=True, exist_ok=True)
    if not (path / ".gitignore").exists() and not (path / ".git").exists():  # as a virtualenv does: a workdir
        # inside a checkout stays out of git (never the checkout's own root)
        (path / ".gitignore").write_text("# a round's workdir (artifacts, runs, caches), written by rlhf\n*\n")
    with open(path / name, "a+") as f:
        start, told = time.monotonic(), ""
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                holder = _series_holder(path) if yield_to_series else None
                if holder is None:
                    break
                fcntl.flock(f, fcntl.LOCK_UN)  # a series between its rounds: its next round takes the lock
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
            waited = time.monotonic() - start
            if waited > max(busy_wait_s, maintenance_wait_s if MAINTENANCE in holder else 0.0):
                more = f" (waited {waited / 60:.0f} min)" if busy_wait_s else ""
                raise WorkdirBusyError(f"another {what} is running in {path} ({holder}){more}: wait for it to "
                                       f"finish, or give this {what} its own workdir", holder)
            if holder != told:  # once per holder: a long wait shows in the run's log what it waits for
                stage_logger().info("waiting for the %s lock of %s, held by %s", what, path, holder)
                told = holder
            time.sleep(0.5)
        f.seek(0)
        left_by_killed = f.read().strip()
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}" + (f"; {note}" if note else ""))
        if keep_left and left_by_killed:  # in the file while held: killed too, this holder must not lose it
            f.write(f"; {LEFT_BY_KILLED} {left_by_killed}")
        f.flush()
        try:
            yield left_by_killed
        finally:
            f.truncate(0)
            if keep_left and left_by_killed:
                f.write(left_by_killed)
                f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)


def damaged_message(inputs: dict[str, ArtifactRef], damaged: dict[str, list[str]], workdir: str) -> str:
    named = "; ".join(f"{name} ({inputs[name].kind}:{inputs[name].digest[:12]}: {', '.join(problems[:3])})"
                      for name, problems in damaged.items())
    return (f"the stage failed reading input artifacts whose files changed since they were committed: {named}. "
            f"Run `rlhf verify {workdir} --remove`, then the round again: it makes them again")


def _execution_note(execution: dict[str, Any] | None) -> str:
    """On a cache hit: worker ranks or DeepSpeed, which a user sets to run a stage differently, do not make it run
    again. Their defaults (1 rank, no DeepSpeed) and other execution settings (an HTTP judge's timeouts) go unsaid."""
    execution = execution or {}
    given = []
    if execution.get("deepspeed"):
        given.append(f"deepspeed={execution['deepspeed']}")
    if execution.get("num_processes", 1) > 1:
        given.append(f"num_processes={execution['num_processes']}")
    return f"; {', '.join(given)} change how it runs, not what it makes, so they do not run it again" if given else ""


SCRATCH = "scratch"  # <workdir>/scratch/<stage>-<cache key>: what an unfinished stage execution resumes from


def scratch_dirs(workdir: str | Path) -> list[tuple[Path, int, float]]:
    """The scratch directories of unfinished stage executions (committed ones remove theirs), each with its size in
    bytes and the days since a file in it was last written. A config changed since leaves its own behind."""
    found = []
    for path in sorted((Path(workdir) / SCRATCH).glob("*")):
        files = [f.stat() for f in path.rglob("*") if f.is_file()]
        newest = max((st.st_mtime for st in files), default=path.stat().st_mtime)
        found.append((path, sum(st.st_size for st in files), (time.time() - newest) / 86400))
    return found


@dataclass
class StageRun:
    """The nested MLflow run of one stage, handed to `produce` so it can log as it goes.

    `scratch` is a directory that survives a killed execution (it is named by the cache key) and
    is removed once the artifact is committed: shards or checkpoints a re-run resumes from.
    `plots` keeps the stage's figures and its per-step metrics (METRIC_HISTORY) beside the store (not in
    the artifact: they are presentation, not content), so a cache hit shows them in its MLflow run as the
    miss did.
    """

    tracker: Tracker
    run_id: str
    scratch: Path
    plots: Path

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        self.tracker.log_metrics(self.run_id, metrics, step)
        self.plots.mkdir(parents=True, exist_ok=True)
        with open(self.plots / METRIC_HISTORY, "a") as f:  # one line per call: a killed run leaves whole lines
            f.write(json.dumps({"step": step, "metrics": metrics}, default=float) + "\n")  # numpy numbers too

    def log_figure(self, fig, name: str) -> None:
        self.tracker.log_figure(self.run_id, fig, name, keep_in=self.plots)


Produce = Callable[[Path, StageRun], dict[str, float]]
METRIC_HISTORY = "metric_history.jsonl"


def replay_metric_history(tracker: Tracker, run_id: str, path: Path) -> None:
    """Log a stage's per-step metrics again (a cache hit's run), one value per (step, metric): the last one a
    run that was killed and resumed logged. A torn last line (a kill while writing) is skipped."""
    if not path.exists():
        return
    by_step: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        by_step.setdefault(int(record["step"]), {}).update(record["metrics"])
    for step in sorted(by_step):
        tracker.log_metrics(run_id, by_step[step], step)


def holdout_key(fraction: float) -> dict[str, float]:
    """The part of a stage's cache key that says which prompts were held out (reward.holdout_fraction): nothing
    when none were, so rounds that hold out nothing keep the keys they had before the option existed."""
    return {"holdout_fraction": fraction} if fraction else {}


def check_same_holdout(ref: ArtifactRef, fraction: float, what: str, remake: str) -> None:
    """Refuse an input made with other prompts held out (reward.holdout_fraction): votes or denoised pairs of voters
    that trained on pairs this config holds out would carry their labels to the reward model it measures on them
    (or lack pairs it trains on). An input without a manifest records nothing to compare."""
    manifest = manifest_of(ref)  # this store's, or another workdir's given by path
    made_with = manifest.config.get("holdout_fraction", 0.0) if manifest is not None else fraction
    if made_with != fraction:
        raise ConfigError(f"{what} {ref.digest[:12]} held out the pairs of reward.holdout_fraction {made_with} of the "
                          f"prompts, this config {fraction}: {remake} with this config, or set "
                          "reward.holdout_fraction to their value")


def warn_cut_rows(stage: str, share: float, key: str, max_length: int) -> None:
    """Warn when over 1 % of the pairs have a row of `max_length` tokens: cut from the left, the prompt's start
    lost (or exactly that long); a reward model that cannot see the question judges blind."""
    if share > 0.01:
        stage_logger().warning("%s: %.1f %% of the pairs have a row of %s (%d) tokens, cut from the left (the "
                                "prompt's start lost) or exactly that long: raise %s", stage, 100 * share, key,
                                max_length, key)


def stage_logger() -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run's logger (console and the UI's log view) inside a run, else the module's."""
    try:
        from prefect.logging import get_run_logger

        return get_run_logger()
    except Exception:  # outside a Prefect run (tests calling .fn, benchmarks)
        return log


def _prefect_task_run_id() -> str:
    try:
        from prefect.runtime import task_run

        return str(task_run.id or "")
    except Exception:  # outside Prefect (CLI stage runs, tests calling .fn)
        return ""


def in_prefect_run() -> bool:
    """Whether a Prefect flow or task run is running here: its artifacts (markdown, tables) go to the API only
    then; outside (tests calling .fn, benchmarks' direct path) a stage computes the same, untracked."""
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def publish_markdown(markdown: str, key: str, description: str) -> None:
    """A Prefect markdown artifact on the running flow or task; nothing outside a Prefect run (tests calling
    .fn, benchmarks). `key` is made of lower-case letters, digits and dashes, as Prefect requires."""
    from prefect.artifacts import create_markdown_artifact

    if not in_prefect_run():
        return
    key = "".join(c if c.isalnum() else "-" for c in key.lower())
    create_markdown_artifact(markdown=markdown, key=key, description=description)


def _what_the_stage_does() -> str:
    """The first paragraph of the running task's docstring (each stage task says what it produces)."""
    try:
        from prefect.context import TaskRunContext

        doc = TaskRunContext.get().task.fn.__doc__ or ""
    except Exception:  # outside a Prefect task
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def stage_markdown(stage: str, ctx: RunContext, ref: ArtifactRef, metrics: dict[str, Any], cached: bool,
                   link: str, max_numbers: int = 12) -> str:
    """The stage's Prefect artifact: what it did, how (ran or cache), its first headline numbers, its MLflow run."""
    how = "served from the cache" if cached else f"ran in {metrics.get('time/stage_seconds', 0.0):.0f} s"
    lines = [f"# Stage {stage}: round {ctx.round_name} #{ctx.round_no}", ""]
    if what := _what_the_stage_does():
        lines += [what, ""]
    lines += [f"Output `{ref.kind}:{ref.digest[:12]}` ({how}) at `{ref.path}`.", "", f"Tracking: {link}", ""]
    numbers = [(k, v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and not k.startswith("time/")][:max_numbers]  # in the order the stage reported them
    if numbers:
        lines += ["| metric | value |", "| --- | --- |"]
        lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in numbers]
    return "\n".join(lines)


def _publish_stage(stage: str, ctx: RunContext, ref: ArtifactRef, metrics: dict[str, Any], cached: bool,
                   run_id: str) -> None:
    markdown = stage_markdown(stage, ctx, ref, metrics, cached, ctx.tracker.run_link(run_id))
    publish_markdown(markdown, key=f"stage-{stage}-{ctx.round_name}",
                     description=f"stage {stage} of round {ctx.round_name}: what it did and its MLflow run")


def stage_key(stage: str, version: str, config: BaseModel | dict[str, Any],
              inputs: dict[str, ArtifactRef]) -> tuple[dict[str, Any], str, str]:
    """A stage execution's config as logged, its digest, and the cache key of (stage, version, config, inputs)."""
    cfg_dict = config.model_dump(mode="json", context=RESOLVED) if isinstance(config, BaseModel) else dict(config)
    cfg_digest = config_digest(cfg_dict)
    return cfg_dict, cfg_digest, cache_key(stage, version, cfg_digest, {n: r.digest for n, r in inputs.items()})


def run_stage(
    ctx: RunContext,
    *,
    stage: str,
    version: str,
    kind: str,
    config: BaseModel | dict[str, Any],
    inputs: dict[str, ArtifactRef],
    produce: Produce,
    register_as: str | None = None,
    execution: dict[str, Any] | None = None,
) -> ArtifactRef:
    """Run (or reuse) one stage execution and return its output artifact.

    `execution`: settings that change how the stage runs but not what it produces (e.g. the
    number of worker ranks, whose results are tested equal): logged as `execution.*` params, kept
    out of the cache key, so changing them reuses the artifact.
    """
    cfg_dict, cfg_digest, key = stage_key(stage, version, config, inputs)
    store, tracker = ctx.store, ctx.tracker
    tags = {
        "rlhf.workdir": str(Path(ctx.workdir).resolve()),
        "rlhf.stage": stage,
        "rlhf.stage_version": version,
        "rlhf.round": ctx.round_name,
        "rlhf.round_no": str(ctx.round_no),
        "rlhf.cache_key": key,
        **code_tags(),
        "prefect.flow_run_id": ctx.flow_run_id,
        "prefect.task_run_id": _prefect_task_run_id(),
        **{f"rlhf.input.{n}": f"{r.kind}:{r.digest}" for n, r in inputs.items()},
    }
    plots = store.root / "plots" / key  # the stage's figures, kept for cache hits
    run_id = tracker.start_run(stage, tags, parent_run_id=ctx.parent_run_id)
    try:
        tracker.log_params(run_id, cfg_dict | ({"execution": execution} if execution else {}))
        _log_input_tables(tracker, run_id, inputs)
        tracker.log_model_inputs(run_id, [ref.digest for ref in inputs.values() if ref.kind in MODEL_KINDS])
        hit = store.lookup(key)
        if hit is not None:
            stage_logger().info("stage %s: served from the cache (%s %s, stage version %s)%s", stage, hit.kind,
                                 hit.digest[:12], version, _execution_note(execution))
            tracker.set_tags(run_id, {"rlhf.cache": "hit", "rlhf.output": f"{hit.kind}:{hit.digest}",
                                      "rlhf.output_path": hit.path})
            if (maker := tracker.producing_run(f"{hit.kind}:{hit.digest}")) is not None:  # who made it, and where
                tracker.set_tags(run_id, {"rlhf.made_by.run_id": maker.info.run_id,
                                          "rlhf.made_by.device": maker.data.tags.get("rlhf.device", "")})
            for figure in sorted(plots.glob("*.png")):
                tracker.log_artifact(run_id, figure, "plots")
            replay_metric_history(tracker, run_id, plots / METRIC_HISTORY)  # e.g. PPO's curves, per iteration
            # metrics and outputs as on a miss, but the time the maker took (its run, made_by, has it): this run
            # took none of it. This also registers a model whose first run was killed before it could
            made = store.manifest(hit).metrics
            _log_outputs(store, tracker, run_id, hit, {k: v for k, v in made.items() if k != "time/stage_seconds"},
                         register_as)
            tracker.end_run(run_id)
            _publish_stage(stage, ctx, hit, made, cached=True, run_id=run_id)
            return hit

        start = time.time()
        scratch = Path(ctx.workdir) / SCRATCH / f"{stage}-{key[:16]}"
        resuming = " (resuming from its scratch directory)" if scratch.exists() else ""
        stage_logger().info("stage %s: running%s", stage, resuming)
        # the progress lines of work done in this process, when not on a terminal, go to the run's log (the UI's)
        logger = stage_logger()
        with store.staging() as staged, lines_to(lambda line: logger.info("%s", line)):  # the task run names the stage
            freeze_long_lived_objects()
            metrics = dict(produce(staged, StageRun(tracker, run_id, scratch, plots)))
            metrics["time/stage_seconds"] = time.time() - start
            ref = store.commit(
                staged, kind=kind, stage=stage, stage_version=version, code_version=code_version(),
                config=cfg_dict, config_digest=cfg_digest, inputs=inputs, cache_key=key, metrics=metrics,
            )
        shutil.rmtree(scratch, ignore_errors=True)  # committed: nothing left to resume
        from rlhf_core.models import device_description  # it imports torch, which the CLI must not pay for

        tracker.set_tags(run_id, {"rlhf.cache": "miss", "rlhf.output": f"{ref.kind}:{ref.digest}",
                                  "rlhf.output_path": ref.path, "rlhf.device": device_description()})
        _log_outputs(store, tracker, run_id, ref, metrics, register_as)
        tracker.end_run(run_id)
        _publish_stage(stage, ctx, ref, metrics, cached=False, run_id=run_id)
        stage_logger().info("stage %s: done in %.0f s (%s %s)", stage, metrics["time/stage_seconds"], ref.kind,
                             ref.digest[:12])
        return ref
    except BaseException as err:
        tracker.end_run(run_id, status="FAILED")
        # a damaged input fails as "Parquet magic bytes not found" or "Corrupt snappy data", naming nothing
        # (only the store's own artifacts: a registry download has no manifest, and is no damaged artifact)
        if isinstance(err, Exception) and (damaged := {name: problems for name, ref in inputs.items()
                                                       if store.holds(ref) and (problems := store.damage(ref))}):
            raise DamagedArtifactError(damaged_message(inputs, damaged, ctx.workdir)) from err
        raise


def freeze_long_lived_objects() -> None:
    """Collect garbage, then keep every object still alive out of the cyclic garbage collector (gc.freeze) while
    a stage's body runs. The flow's own state, made after the process's import-time freeze (MLflow's SQLAlchemy
    store, Prefect's engines and client: ~170k objects in a demo round), would otherwise be walked by every full
    collection the body triggers, and tokenising pairs triggers one per call: the vote, reward and PPO bodies ran
    ~10 % slower in the flow than called directly (docs/benchmarks.md, "Orchestration overhead"). The body's own
    objects are collected as before; only objects alive now and cyclic garbage later would stay uncollected."""
    gc.collect()
    gc.freeze()


def _log_input_tables(tracker: Tracker, run_id: str, inputs: dict[str, ArtifactRef]) -> None:
    """The tables of the run's data inputs as MLflow dataset inputs. A model input is a logged model input instead
    (its folder's tables, e.g. the SFT policy's demonstrations, are what made it, not what this stage reads), and a
    quarantine table holds the rows the import refused, which no stage reads."""
    for name, ref in inputs.items():
        if ref.kind in MODEL_KINDS:
            continue
        for table in sorted(Path(ref.path).glob("*.parquet")):
            if table.name == "quarantine.parquet":
                continue
            df = pd.read_parquet(table)
            tracker.log_table_input(run_id, df, path=table, name=f"{name}/{table.stem}", digest=ref.digest)


def _log_outputs(store: ArtifactStore, tracker: Tracker, run_id: str, ref: ArtifactRef, metrics: dict[str, float],
                 register_as: str | None) -> None:
    """The run's metrics, and the artifact's model (a logged model registered as `register_as`@candidate, the
    metrics linked to it) or its output tables. `metrics`: this execution's (an artifact committed again with
    the same content keeps its first manifest) or, on a cache hit, the manifest's."""
    manifest = store.manifest(ref)
    if register_as:
        tags = {"rlhf.digest": ref.digest, "rlhf.stage": manifest.stage,
                **{f"rlhf.input.{i.name}": f"{i.kind}:{i.digest}" for i in manifest.inputs},
                **data_lineage(store, manifest)}
        params = {"config_digest": manifest.config_digest, "code_version": manifest.code_version,
                  "stage_version": manifest.stage_version, "base_model": _base_model(manifest)}
        tracker.register_model(run_id, Path(ref.path), register_as, alias="candidate", tags=tags, params=params,
                               metrics=metrics, pyfunc=serving_config(ref.kind, manifest.config))
        return
    tracker.log_metrics(run_id, metrics)
    root = Path(ref.path)
    for f in sorted(root.rglob("*")):  # sub-folders too: the annotators' exports (the labels paid for) are in exports/
        if f.is_file() and (f.suffix == ".png" or is_export_name(f.name)):  # tables, figures, exports, the manifest
            folder = f.parent.relative_to(root)
            tracker.log_artifact(run_id, f, "outputs" if folder == Path(".") else f"outputs/{folder.as_posix()}")


MODEL_KINDS = {"policy", "reward_model"}
LINEAGE_KINDS = ("votes", "comparisons", "annotation_export")  # the data a model learned from, as the registry shows


def data_lineage(store: ArtifactStore, manifest: Manifest) -> dict[str, str]:
    """rlhf.lineage.<kind>: the digests (comma-separated, nearest first) of the votes, comparison pairs and
    annotation exports upstream of an artifact, walked through data artifacts only (a model input has its own
    registered version and lineage). rlhf.lineage.unresolved: the inputs (kind:digest) whose own inputs are not in
    this store (an artifact given from another work dir), where the walk had to stop: the lineage is partial there."""
    found: dict[str, list[str]] = {kind: [] for kind in LINEAGE_KINDS}
    unresolved: list[str] = []
    todo, seen = [i for i in manifest.inputs if i.kind not in MODEL_KINDS], set()
    while todo:
        item = todo.pop(0)
        if item.digest in seen:
            continue
        seen.add(item.digest)
        if item.kind in found:
            found[item.kind].append(item.digest)
        try:
            upstream = store.manifest(store.find(item.kind, item.digest)).inputs
        except FileNotFoundError:  # an input from outside the store: say so rather than stop silently
            unresolved.append(f"{item.kind}:{item.digest}")
            continue
        todo += [i for i in upstream if i.kind not in MODEL_KINDS]
    found["unresolved"] = unresolved
    return {f"rlhf.lineage.{kind}": ",".join(digests) for kind, digests in found.items() if digests}


def _base_model(manifest: Manifest) -> str:
    """What a model was initialised from: its input policy (the reward model and PPO start from one), else the
    pretrained directory its config names, else nothing (built from its config)."""
    policy = next((i for i in manifest.inputs if i.name == "policy"), None)
    if policy is not None:
        return f"{policy.kind}:{policy.digest}"
    return str(manifest.config.get("model", {}).get("pretrained") or "none (built from its config)")


__all__ = ["RunContext", "StageRun", "run_stage", "publish_markdown", "in_prefect_run", "config_digest", "code_version",
           "lock_workdir", "WorkdirBusyError", "SCRATCH", "scratch_dirs", "ROUND_LOCK", "SERIES_LOCK"]
