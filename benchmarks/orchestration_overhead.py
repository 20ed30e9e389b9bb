"""Issue 12's orchestration-overhead goal: a round through the Prefect flow with MLflow tracking against the same
stages called directly; the goal is <= 5 %.

    .venv/bin/python benchmarks/orchestration_overhead.py [--config configs/mini.yaml] [--repeats 3]
        [--json docs/orchestration-overhead.json] [--doc docs/benchmarks.md] [--note TEXT] [--runs-dir DIR]

orchestrated: `rlhf_round` as `rlhf demo` runs it: Prefect's ephemeral API (started by the run), a local MLflow
store in the workdir, a fresh workdir, nothing cached.
direct: the same stage tasks' own bodies (`task.fn`: the same rlhf_core calls and worker launches, configs and
seeds, in the round's order), with `run_stage` swapped for `run_produce`, which runs the stage's `produce` into a
directory and names it by its content digest, and nothing else: no Prefect task or flow run, no MLflow, no cache
lookup, manifest, input logging or Prefect artifact.

Every run is a fresh process in a fresh workdir, timed as a whole and from the round's call to its return; the
contenders alternate, the first one swapped every repeat. Medians over the repeats, the ratio and the per-stage
breakdown (the Prefect task's wall time from the API, the stage's body inside it, the direct stage) go to the JSON
(--json), a plot beside it (same name, .png) and this benchmark's section of --doc. Both paths must give the same
artifacts: every stage's content digest is compared across all runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Callable, ContextManager, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# a first ephemeral API creates its database: on a loaded 2-core machine that outlasts Prefect's 20 s default
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from doc_section import replace_section  # noqa: E402

SECTION_START, SECTION_END = "<!-- orchestration-overhead:start -->", "<!-- orchestration-overhead:end -->"
GOAL_PERCENT = 5.0
CONTENDERS = ("orchestrated", "direct")
# the modules of the round's stage tasks: the direct path swaps their `run_stage`
STAGE_MODULES = ("tasks.world", "tasks.sampling", "tasks.generation", "tasks.annotation", "tasks.voting",
                 "tasks.denoise", "tasks.reward", "tasks.ppo", "tasks.evaluation")
PHASES = {"before_flow_start": "before the flow run started (its creation; the local API is up by then)",
          "flow_start_to_first_task": "flow start to the first task (config checks, workdir lock, the round's MLflow "
                                      "run and store)",
          "between_tasks": "between tasks (the flow's lineage and model tags)",
          "after_last_task": "after the last task (summary, promotion, the round's artifact)"}
ROUND_STAGES = ("world", "sft", "sample", "generate", "annotators", "import_annotations", "vote", "denoise", "reward",
                "ppo", "evaluate")


# ---------------------------------------------------------------- the direct path


def untracked_run(scratch: Path):
    """The StageRun a direct stage gets: it logs nowhere (no MLflow, no metric history for cache hits); a figure
    the stage made is closed unsaved (saving it as a PNG is the tracker's work)."""
    import matplotlib.pyplot as plt

    from tasks.common import StageRun

    class UntrackedRun(StageRun):
        def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
            pass

        def log_figure(self, fig, name: str) -> None:
            plt.close(fig)

    return UntrackedRun(tracker=None, run_id="", scratch=scratch, plots=scratch / "plots")


def run_produce(ctx, *, stage: str, kind: str, produce, metrics: dict[str, dict], **bookkeeping):
    """What `run_stage` computes, without what only orchestration needs: `produce` writes the stage's output into
    <workdir>/direct/<stage> (its scratch beside it, removed afterwards as run_stage does), and the output is named
    by its content digest with the provenance run_stage's commit adds (the generate stage names responses by the
    policy's). The stage's metrics go to `metrics`[stage]. `bookkeeping` (version, config, inputs, registration,
    execution settings) otherwise only makes run_stage's cache key, manifest and MLflow run."""
    from rlhf_core.artifacts import ArtifactRef, content_digest, write_provenance
    from tasks.common import stage_key

    out = Path(ctx.workdir) / "direct" / stage
    out.mkdir(parents=True)
    scratch = Path(ctx.workdir) / "scratch" / stage
    metrics[stage] = dict(produce(out, untracked_run(scratch)))
    shutil.rmtree(scratch, ignore_errors=True)
    version, inputs = bookkeeping["version"], bookkeeping["inputs"]
    _, cfg_digest, _ = stage_key(stage, version, bookkeeping["config"], inputs)
    write_provenance(out, stage, version, cfg_digest, {n: r.digest for n, r in inputs.items()})
    return ArtifactRef(kind=kind, digest=content_digest(out)[0], path=str(out))


@contextmanager
def stages_untracked(metrics: dict[str, dict]) -> Iterator[None]:
    """Within: each stage task's module calls `run_produce` where its body calls `run_stage`."""
    import tasks.common

    modules = [importlib.import_module(name) for name in STAGE_MODULES]
    for module in modules:
        if module.run_stage is not tasks.common.run_stage:  # a stage that runs some other way would go untimed
            raise RuntimeError(f"{module.__name__}.run_stage is not tasks.common.run_stage")
        module.run_stage = partial(run_produce, metrics=metrics)
    try:
        yield
    finally:
        for module in modules:
            module.run_stage = tasks.common.run_stage


@dataclass
class DirectRound:
    outputs: dict = field(default_factory=dict)  # stage -> ArtifactRef
    seconds: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, dict] = field(default_factory=dict)


def direct_round(config, watch: Callable[[str], ContextManager] | None = None) -> DirectRound:
    """Round 1 of `config` with every stage's body called directly, in the round's order (flows/round.py's
    _run_stages and flows/stages.py's HEAVY_STAGES: the same arguments); `watch(stage)` wraps each stage (the
    scaling benchmark's memory probe). Starts from the SFT policy, as round 1 does in a fresh workdir."""
    from rlhf_core.artifacts import ArtifactStore
    from tasks.annotation import collect_annotations, import_annotations
    from tasks.common import RunContext
    from tasks.denoise import denoise_pairs
    from tasks.evaluation import evaluate
    from tasks.generation import generate
    from tasks.ppo import train_policy
    from tasks.reward import train_reward
    from tasks.sampling import sample_prompts
    from tasks.voting import vote_strength
    from tasks.world import build_world, train_sft_policy

    workdir = Path(config.workdir).resolve()
    ArtifactStore(workdir / "artifacts")  # made as the round makes it (sampling may keep caches beside it)
    ctx = RunContext(workdir=str(workdir), tracking_uri="", experiment="", parent_run_id="", round_name=config.name)
    seed, simulated = config.seed, not config.annotation.exports
    world, reward_train = config.world, config.reward.train
    result = DirectRound()
    o = result.outputs
    calls = {
        "world": lambda: build_world.fn(ctx, world, config.seed),
        "sft": lambda: train_sft_policy.fn(ctx, world, config.policy_model, config.sft, o["world"], config.seed),
        "sample": lambda: sample_prompts.fn(ctx, config.sampling, o["world"], seed),
        "generate": lambda: generate.fn(ctx, config.generation, o["sample"], o["sft"], seed),
        "annotators": lambda: collect_annotations.fn(ctx, config.annotation, world, o["generate"], seed),
        "import_annotations": lambda: import_annotations.fn(ctx, config.annotation, o["annotators"], o["generate"],
                                                            simulated),
        "vote": lambda: vote_strength.fn(ctx, config.voting, o["import_annotations"], o["sft"], seed, simulated),
        "denoise": lambda: denoise_pairs.fn(ctx, config.denoise, o["import_annotations"], o["vote"], simulated),
        "reward": lambda: train_reward.fn(ctx, config.reward, o["denoise"], o["import_annotations"], o["sft"],
                                          o["world"], seed, simulated, world.max_operand, tuple(world.operations),
                                          responses=o["generate"] if reward_train.meta.enabled else None),
        "ppo": lambda: train_policy.fn(ctx, config.ppo, o["sft"], o["reward"], o["world"], o["sft"], reward_train,
                                       seed),
        "evaluate": lambda: evaluate.fn(ctx, config.evaluation, o["ppo"], o["sft"], o["reward"], o["world"],
                                        reward_train, seed),
    }
    with stages_untracked(result.metrics):
        for stage, call in calls.items():
            with watch(stage) if watch else nullcontext():
                start = time.perf_counter()
                o[stage] = call()
                result.seconds[stage] = time.perf_counter() - start
    assert set(result.metrics) == set(calls), "every stage ran through run_produce"
    return result


# ---------------------------------------------------------------- one run of each contender (its own process)


def prefect_runs(flow_run_id: str, stages: int):
    """The flow run `flow_run_id` and its task runs (those that ended), as the API recorded them; task runs report
    through events, so this waits (up to 30 s) until `stages` of them have ended."""
    from uuid import UUID

    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_runs = FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)]))
    deadline = time.time() + 30
    while True:
        with get_client(sync_client=True) as client:
            flow = client.read_flow_run(UUID(flow_run_id))
            ended = [r for r in client.read_task_runs(flow_run_filter=flow_runs) if r.start_time and r.end_time]
        if len(ended) >= stages or time.time() > deadline:
            return flow, sorted(ended, key=lambda r: r.start_time)


def flow_phases(flow, task_runs, called: datetime, returned: datetime) -> dict[str, float]:
    """Where the round's time outside its tasks went: before its flow run started (the ephemeral API's start, the
    flow run's creation), from that start to the first task (config checks, the workdir lock, the round's MLflow
    run), between tasks (the flow's own lines: lineage tags, model tags), and after the last task (summary,
    finish, promotion) until the call returned."""
    gaps = [(b.start_time - a.end_time).total_seconds() for a, b in zip(task_runs, task_runs[1:])]
    return {"before_flow_start": (flow.start_time - called).total_seconds(),
            "flow_start_to_first_task": (task_runs[0].start_time - flow.start_time).total_seconds(),
            "between_tasks": sum(gaps),
            "after_last_task": (returned - max(r.end_time for r in task_runs)).total_seconds()}


def run_orchestrated(config) -> dict:
    """The round through the flow: its stages' content digests, body seconds (manifests) and task seconds (the
    API's), and where the flow's time outside its tasks went."""
    from flows.round import rlhf_round
    from rlhf_core.artifacts import ArtifactStore

    called, start = datetime.now(timezone.utc), time.perf_counter()
    summary = rlhf_round(config=config)
    seconds, returned = time.perf_counter() - start, datetime.now(timezone.utc)
    returned_at = time.perf_counter()  # what follows is the benchmark's reading, not the round's work
    store = ArtifactStore(Path(config.workdir).resolve() / "artifacts")
    manifests = {stage: store.manifest(store.find(a["kind"], a["digest"])) for stage, a in summary["artifacts"].items()}
    flow, task_runs = prefect_runs(summary["prefect_flow_run_id"], len(manifests))
    tasks = {r.name.rsplit("-", 1)[0]: (r.end_time - r.start_time).total_seconds() for r in task_runs}
    return {"seconds": seconds, "phases": flow_phases(flow, task_runs, called, returned), "stages": {
        stage: {"digest": m.digest, "body_seconds": m.metrics["time/stage_seconds"], "task_seconds": tasks.get(stage),
                "metrics": m.metrics} for stage, m in manifests.items()},
        "reading_seconds": time.perf_counter() - returned_at}


def run_direct(config) -> dict:
    """The round's stages called directly: their content digests, seconds and metrics."""
    from flows.cli import freeze_imported_objects

    for name in STAGE_MODULES:  # imported before the clock starts, as the orchestrated run imports the flow
        importlib.import_module(name)
    freeze_imported_objects()  # as `prepare_round` does for the orchestrated one: the same garbage collection
    start = time.perf_counter()
    result = direct_round(config)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "stages": {
        stage: {"digest": ref.digest, "seconds": result.seconds[stage], "metrics": result.metrics[stage]}
        for stage, ref in result.outputs.items()}}


class GarbageCollectionClock:
    """Seconds this process spends in the garbage collector, and its collections per generation (gc.callbacks)."""

    def __init__(self) -> None:
        import gc

        self.seconds, self.collections, self._start = 0.0, [0, 0, 0], 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1


def cpu_by_thread() -> dict[str, float]:
    """This process's CPU seconds so far by thread: the main thread, each live Python thread by name (Prefect's and
    MLflow's workers), the native threads (torch's intra-op pool and the like), threads that have ended; and the CPU
    of its child processes (the local Prefect API; worker groups once they are reaped)."""
    import threading

    import psutil

    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    by_group: dict[str, float] = {}
    for entry in os.scandir("/proc/self/task"):
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        tid = int(entry.name)
        name = names.get(tid, "")
        name = "ThreadPoolExecutor workers" if name.startswith("ThreadPoolExecutor") else name  # one group per kind
        group = "main" if tid == os.getpid() else f"python: {name}" if name else "native threads"
        by_group[group] = by_group.get(group, 0.0) + seconds
    times = os.times()
    by_group["ended threads"] = times.user + times.system - sum(by_group.values())
    live_children = sum(sum(c.cpu_times()[:2]) for c in psutil.Process().children(recursive=True))
    by_group["child processes"] = times.children_user + times.children_system + live_children
    return by_group


def run_one(contender: str, config_path: str | None, workdir: Path, result_path: Path) -> None:
    """One contender's round in this process (a fresh workdir), its result as JSON. The orchestrated one is
    prepared as `rlhf demo` prepares it (flows/cli.py `prepare_round`: Prefect's local API starts while the flows
    import; then the imported objects are frozen out of the garbage collector, as the direct one's are), so its
    round call no longer holds the server's start: the process's wall time is what compares the two."""
    from reward_modelling import round_config

    config = round_config(config_path, 0, workdir)
    if contender == "orchestrated":
        from flows.cli import prepare_round

        prepare_round(config)
    gc_clock = GarbageCollectionClock()
    result = (run_orchestrated if contender == "orchestrated" else run_direct)(config)
    result["cpu_seconds"] = cpu_by_thread()  # the orchestrated one's includes the benchmark's reading (< 0.1 s)
    result["gc"] = {"seconds": gc_clock.seconds, "collections": gc_clock.collections}
    result_path.write_text(json.dumps(result, default=float))


def spawn(contender: str, config_path: str | None, runs_dir: Path, label: str) -> dict:
    """Run one contender in a fresh process and workdir; its result, with the process's wall time. A result kept
    in `runs_dir` by an earlier, killed benchmark is read back instead (the same run: that config, that label)."""
    workdir, result_path = runs_dir / label, runs_dir / f"{label}.json"
    if not result_path.exists():
        shutil.rmtree(workdir, ignore_errors=True)  # a killed run's stages: nothing may come from its cache
        argv = [sys.executable, __file__, "--one", contender, "--workdir", str(workdir), "--result",
                str(result_path.with_suffix(".partial"))]
        start = time.perf_counter()
        subprocess.run(argv + (["--config", config_path] if config_path else []), cwd=ROOT, check=True)
        partial = result_path.with_suffix(".partial")
        result = json.loads(partial.read_text())
        # the process's wall time, less the benchmark's own reading after the orchestrated round (manifests, the
        # Prefect API; the direct round returns what it reports)
        result["process_seconds"] = time.perf_counter() - start - result.get("reading_seconds", 0.0)
        result_path.write_text(json.dumps(result))
        partial.unlink()
        shutil.rmtree(workdir, ignore_errors=True)  # disk: a demo round's store is ~100 MB
    return json.loads(result_path.read_text())


# ---------------------------------------------------------------- the measurement and its report


def measure(config_path: str | None, repeats: int, runs_dir: Path | None) -> dict[str, list[dict]]:
    """`repeats` runs of each contender, alternating, the one that goes first swapped every repeat; each run's
    result kept in `runs_dir` (default: a temporary directory), so a killed benchmark resumes there."""
    runs: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    with tempfile.TemporaryDirectory(prefix="orchestration-overhead-") as tmp:
        folder = runs_dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for repeat in range(repeats):
            order = CONTENDERS if repeat % 2 == 0 else CONTENDERS[::-1]
            for contender in order:
                print(f"== repeat {repeat + 1}/{repeats}: {contender}", flush=True)
                runs[contender].append(spawn(contender, config_path, folder, f"{contender}-{repeat}"))
    return runs


def same_results(runs: dict[str, list[dict]]) -> dict[str, bool]:
    """Per stage: did every run of both contenders write the same content (digest)?"""
    every = [r for contender in CONTENDERS for r in runs[contender]]
    return {stage: len({r["stages"][stage]["digest"] for r in every}) == 1 for stage in ROUND_STAGES}


def breakdown(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Per stage, medians over the repeats: the direct stage, the Prefect task and the stage's body inside it."""
    def median(contender: str, stage: str, key: str) -> float:
        values = [r["stages"][stage][key] for r in runs[contender] if r["stages"][stage].get(key) is not None]
        return statistics.median(values) if values else float("nan")

    return {stage: {"direct_seconds": median("direct", stage, "seconds"),
                    "task_seconds": median("orchestrated", stage, "task_seconds"),
                    "body_seconds": median("orchestrated", stage, "body_seconds")} for stage in ROUND_STAGES}


def outside_stage_bodies(run: dict) -> float:
    """A run's seconds outside its stages' own bodies: for the orchestrated round the flow, its tasks' bookkeeping
    and Prefect/MLflow; for the direct one the loop between its stage calls. Unlike the round's seconds, it does not
    move with the stage bodies' own spread."""
    bodies = sum(s.get("body_seconds", s.get("seconds")) for s in run["stages"].values())
    return run["seconds"] - bodies


def summarise(runs: dict[str, list[dict]], args: argparse.Namespace) -> dict:
    direct = statistics.median(r["seconds"] for r in runs["direct"])
    orchestrated = statistics.median(r["seconds"] for r in runs["orchestrated"])
    process = {c: statistics.median(r["process_seconds"] for r in runs[c]) for c in CONTENDERS}
    outside = {c: statistics.median(outside_stage_bodies(r) for r in runs[c]) for c in CONTENDERS}
    stages = breakdown(runs)
    phases = {phase: statistics.median(r["phases"][phase] for r in runs["orchestrated"]) for phase in PHASES}
    headline = {key: [r["stages"][stage]["metrics"].get(key) for c in CONTENDERS for r in runs[c]]
                for stage, key in (("reward", "reward/gold_accuracy_heldout"), ("evaluate", "eval/judge/win_rate"))}
    return {
        "benchmark": "orchestration_overhead",
        "command": "python benchmarks/orchestration_overhead.py " + shlex.join(args.argv),
        "config": args.config or "the embedded demo", "seed": 0, "repeats": args.repeats,
        "date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "machine": machine(args.load_at_start),
        "seconds": {c: [r["seconds"] for r in runs[c]] for c in CONTENDERS},
        "process_seconds": {c: [r["process_seconds"] for r in runs[c]] for c in CONTENDERS},
        "median_seconds": {"orchestrated": orchestrated, "direct": direct},
        "round_call_ratio": orchestrated / direct, "round_call_overhead_percent": 100 * (orchestrated / direct - 1),
        # the rated figure: whole processes, imports and (for the orchestrated one) the Prefect API's start included
        "median_process_seconds": process,
        "ratio": process["orchestrated"] / process["direct"],
        "overhead_percent": 100 * (process["orchestrated"] / process["direct"] - 1),
        "median_seconds_outside_stage_bodies": outside,
        "outside_stage_bodies_percent": 100 * (outside["orchestrated"] - outside["direct"]) / direct,
        "goal_percent": GOAL_PERCENT, "flow_phases_seconds": phases,
        "stages": stages, "same_digest": same_results(runs), "headline_by_run": headline,
        "median_gc_seconds": {c: statistics.median(r["gc"]["seconds"] for r in runs[c]) for c in CONTENDERS
                              if all("gc" in r for r in runs[c])},
        "median_cpu_seconds": {c: {group: statistics.median(r["cpu_seconds"].get(group, 0.0) for r in runs[c])
                                   for group in sorted({g for r in runs[c] for g in r["cpu_seconds"]})}
                               for c in CONTENDERS if all("cpu_seconds" in r for r in runs[c])},
        "notes": args.note or [],
    }


def verdict(result: dict) -> str:
    """The sentence on the goal: met or not, by how much, and where the extra time goes."""
    pct, goal = result["overhead_percent"], result["goal_percent"]
    status = (f"met ({goal - pct:.1f} points to spare)" if pct <= goal else f"missed by {pct - goal:.1f} points")
    costs = {stage: s["task_seconds"] - s["direct_seconds"] for stage, s in result["stages"].items()}
    costs |= {f"flow: {PHASES[phase]}": seconds for phase, seconds in result["flow_phases_seconds"].items()}
    process = result["median_process_seconds"]
    extra = process["orchestrated"] - process["direct"]
    top = sorted(costs.items(), key=lambda kv: -kv[1])[:3]
    where = ", ".join(f"{name} {seconds:+.1f} s" for name, seconds in top)
    outside = result["median_seconds_outside_stage_bodies"]
    return (f"**Goal (issue 12): orchestration overhead <= {goal:.0f} %. Measured {pct:+.1f} % in whole-process "
            f"time ({result['ratio']:.3f}x, {extra:+.1f} s a round): {status}.** From the round's call to its "
            f"return: {result['round_call_overhead_percent']:+.1f} %. Outside the stages' own bodies the "
            f"orchestrated round spends {outside['orchestrated']:.1f} s and the direct one {outside['direct']:.1f} s: "
            f"{result['outside_stage_bodies_percent']:+.1f} % of the direct round, the part of the overhead that does "
            f"not move with the stage bodies' own spread. The largest extra times (the Prefect task's wall time minus "
            f"the direct stage's; the flow's time outside its tasks): {where}.")


def cpu_sentence(result: dict) -> str:
    """Where each contender's CPU went (medians): the main thread, torch's native threads, Prefect's and MLflow's
    Python threads, child processes (the local API), and the garbage collector's share."""
    cpu, gc_seconds = result.get("median_cpu_seconds", {}), result.get("median_gc_seconds", {})
    if not all(c in cpu and c in gc_seconds for c in CONTENDERS):  # runs kept from before they were recorded
        return ""

    def groups(c: str) -> str:
        return ", ".join(f"{g} {s:.1f}" for g, s in sorted(cpu[c].items(), key=lambda kv: -kv[1]) if s >= 0.05)
    return ("CPU seconds by thread (medians; `cpu_by_thread`): orchestrated " + groups("orchestrated") +
            "; direct " + groups("direct") + ". In the garbage collector (`gc.callbacks`): orchestrated "
            f"{gc_seconds['orchestrated']:.2f} s, direct {gc_seconds['direct']:.2f} s.")


def section(result: dict) -> str:
    m, s = result["machine"], result["stages"]
    same = result["same_digest"]
    agree = ("every stage wrote the same content (the same digest) in all runs of both paths"
             if all(same.values()) else
             f"the content differed between runs in: {', '.join(k for k, v in same.items() if not v)}")
    rows = "\n".join(
        f"| {stage} | {v['direct_seconds']:.1f} | {v['task_seconds']:.1f} | {v['body_seconds']:.1f} | "
        f"{v['task_seconds'] - v['direct_seconds']:+.1f} | {'yes' if same[stage] else 'no'} |"
        for stage, v in s.items())
    phases = "; ".join(f"{PHASES[k]} {v:.1f} s" for k, v in result["flow_phases_seconds"].items())
    acc = ", ".join(f"{x:.3f}" for x in result["headline_by_run"]["reward/gold_accuracy_heldout"])
    notes = "".join(f"- {n}\n" for n in result["notes"])
    return f"""{SECTION_START}
## Orchestration overhead: the round through Prefect and MLflow vs its stages called directly

Machine: {m['cores']} CPU cores ({m['processor']}), torch {m['torch']}, OMP_NUM_THREADS={m['OMP_NUM_THREADS']}; load
average {m['load_average_at_start']:.1f} at the start; {result['date']}. This machine is shared with other
engineers' jobs: the absolute times are context, the ratio is the result (contenders alternated, the first swapped
every repeat, medians over {result['repeats']} repeats).

    {result['command']}

Round: {result['config']}, seed {result['seed']}, a fresh workdir and a fresh process per run, timed as a whole
(the rated figure) and from the round's call to its return. **orchestrated**: `rlhf_round` as `rlhf demo` runs it
(`prepare_round`, as the CLI: Prefect's local API launched at the process's start while the round's modules import,
flows/local_api.py; MLflow in the workdir, nothing cached). **direct**: the same stage tasks' bodies (`task.fn`, the
same rlhf_core calls, configs and seeds, in the round's order) with `run_stage` replaced by `run_produce` (the
stage's `produce` into a directory named by its content digest; no Prefect, MLflow, cache, manifest or lineage).
Both freeze the objects their imports made out of the garbage collector before the round (flows/cli.py
`freeze_imported_objects`).

{verdict(result)}

Process seconds (a fresh process's start to its exit, less the benchmark's reading of the round's results after it returned): orchestrated
{', '.join(f'{x:.1f}' for x in result['process_seconds']['orchestrated'])} (median
{result['median_process_seconds']['orchestrated']:.1f}); direct
{', '.join(f'{x:.1f}' for x in result['process_seconds']['direct'])} (median
{result['median_process_seconds']['direct']:.1f}). Round seconds (the round's call to its return): orchestrated
{', '.join(f'{x:.1f}' for x in result['seconds']['orchestrated'])} (median
{result['median_seconds']['orchestrated']:.1f}); direct {', '.join(f'{x:.1f}' for x in result['seconds']['direct'])}
(median {result['median_seconds']['direct']:.1f}). The flow's time outside its tasks (medians):
{phases}.

{cpu_sentence(result)}

{f"![the process and each stage, orchestrated vs direct]({result['figure']})" if result.get("figure") else ""}

| stage | direct s | Prefect task s | stage body in the task s | task - direct s | same digest |
|---|---|---|---|---|---|
{rows}

Prefect task s: the task run's start to end time as the API recorded it; the stage body: `produce` inside
`run_stage` (the manifest's time/stage_seconds), so task - body is the stage's cache lookup, MLflow run, input
logging, manifest and model registration. Same results: {agree}; held-out reward-model gold accuracy per run
(orchestrated runs first): {acc}.
{notes}{SECTION_END}
"""


def plot(result: dict, path: Path) -> None:
    """Left: the whole process per contender, the orchestrated one split into its stage bodies, its tasks' and flow's
    bookkeeping and the rest of the process, with the goal's line. Right: each stage, direct vs its Prefect task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    process, stages = result["median_process_seconds"], result["stages"]
    bodies = sum(v["body_seconds"] for v in stages.values())
    round_call = result["median_seconds"]["orchestrated"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [1, 1.4]})
    parts = (("stage bodies", bodies, "tab:blue"), ("flow and task bookkeeping", round_call - bodies, "tab:orange"),
             ("process outside the round", process["orchestrated"] - round_call, "tab:gray"))
    start = 0.0
    for label, seconds, colour in parts:
        left.barh(["orchestrated"], [seconds], left=[start], color=colour, label=label)
        start += seconds
    left.barh(["direct"], [process["direct"]], color="tab:green", label="direct (whole process)")
    left.axvline(process["direct"] * (1 + result["goal_percent"] / 100), color="k", ls=":", lw=1,
                 label=f"goal: direct + {result['goal_percent']:g} %")
    left.set_xlim(0.8 * process["direct"], 1.1 * max(process.values()))  # the differences, not the common part
    left.set_xlabel("process seconds (median; the axis starts at 0.8x direct)")
    left.set_title(f"{result['overhead_percent']:+.1f} % ({result['date']})", fontsize=10)
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    names = list(stages)
    y = range(len(names))
    right.barh([i - 0.2 for i in y], [stages[n]["direct_seconds"] for n in names], height=0.4, color="tab:green",
               label="direct")
    right.barh([i + 0.2 for i in y], [stages[n]["task_seconds"] for n in names], height=0.4, color="tab:blue",
               label="Prefect task")
    right.set_yticks(list(y), names)
    right.invert_yaxis()
    right.set_xscale("log")
    right.set_xlabel("stage seconds (median, log scale)")
    right.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def machine(load_at_start: float) -> dict:
    """What the doc says of the machine: cores, processor, torch, its threads' setting and the load at the start."""
    import torch

    return {"cores": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
            "load_average_at_start": load_at_start}


def add_run_arguments(parser: argparse.ArgumentParser, json_default: str) -> None:
    """The arguments both round benchmarks share: the round, where they write, notes, and the hidden ones of the
    single run a benchmark starts in a fresh process (--workdir, --result)."""
    parser.add_argument("--config", default=None, help="the round's YAML config (default: the embedded demo)")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / json_default)
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--note", action="append", help="a remark on this run (the machine's load, ...); repeatable")
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)


def write_outputs(result: dict, json_path: Path, doc: Path, text: str, start: str, end: str) -> None:
    """The result as JSON, and `text` (a section between `start` and `end`) into `doc`, both written atomically."""
    from rlhf_core.artifacts import atomic_write_text

    json_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(json_path, json.dumps(result, indent=2, default=float))
    replace_section(doc, text, start, end,
                    "# Benchmarks (issue 12)\n\nEach section is written by its benchmark script.\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(parser, "orchestration-overhead.json")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each contender")
    parser.add_argument("--runs-dir", type=Path, default=None, help="keep each run's result here; a re-run with the "
                        "same config reads back the runs it holds (default: a temporary directory)")
    parser.add_argument("--one", choices=CONTENDERS, help=argparse.SUPPRESS)  # a single run, in this process
    args = parser.parse_args(argv)
    if args.one:
        run_one(args.one, args.config, args.workdir, args.result)
        return
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    args.argv, args.load_at_start = list(sys.argv[1:] if argv is None else argv), os.getloadavg()[0]
    result = summarise(measure(args.config, args.repeats, args.runs_dir), args)
    figure = args.json.with_suffix(".png")
    result["figure"] = os.path.relpath(figure, args.doc.parent)  # as the section links it
    text = section(result)
    write_outputs(result, args.json, args.doc, text, SECTION_START, SECTION_END)
    plot(result, figure)
    print(text)


if __name__ == "__main__":
    main()
