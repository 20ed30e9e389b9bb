"""Iterated rounds: the pairs a round's reward model learns from, and when the rounds stop.

Round k > 1 of `rlhf_rounds` (Secrets of RLHF Part II's iterated RLHF) votes on and trains its
reward model with its own pairs (`iteration.pairs: per_round`) or with the pairs of rounds 1..k
(`accumulate`, as Llama 2 retrains its reward model on all the preference data so far). The rounds
stop after one whose policy does not beat the round before's (`iteration.stop_min_win_rate`):
Part II saw gains for 3-4 rounds, then a decline.

A single round with `iteration.continue_series` (a scheduled one) follows the last round of its name that
finished in its workdir with the same setting, as round k + 1 of that series: `<workdir>/finished-rounds.json`
records each series' last finished round (its number, the pairs so far, every annotation export it learned from,
its policy and MLflow run); rounds without the setting neither follow nor change it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from rlhf_core.artifacts import ArtifactRef, ArtifactStore, atomic_write_text
from rlhf_core.config import ConfigError, IterationConfig, RoundConfig
from rlhf_core.schemas import read_table, write_table
from tasks.common import RunContext, StageRun, stage_logger, run_stage
from tasks.promotion import judged_win_rate
from tasks.world import POOL_FIELDS, SFT_FIELDS

ACCUMULATE_VERSION = "1"
FINISHED_ROUNDS = "finished-rounds.json"  # in the workdir: each round name's last finished round


def round_pairs(pairs: pd.DataFrame, round_no: int) -> pd.DataFrame:
    """A round's comparisons as part of an accumulation: a `round_no` column, and pair ids prefixed
    `r<k>-` (a pair id hashes the prompt and response ids, and two rounds that write the same text for a prompt
    with the same model and settings give it the same response id).
    A table that already has `round_no` is an accumulation: returned as it is."""
    if "round_no" in pairs.columns:
        return pairs
    return pairs.assign(pair_id=f"r{round_no}-" + pairs["pair_id"], round_no=round_no)


@task(name="accumulate_pairs", version=ACCUMULATE_VERSION, cache_policy=NO_CACHE)
def accumulate_pairs(ctx: RunContext, earlier: ArtifactRef, current: ArtifactRef, round_no: int) -> ArtifactRef:
    """The comparison pairs of rounds 1..k: the earlier rounds' (round k - 1's accumulation, or round 1's
    pairs) followed by this round's, each row tagged with its round."""

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        before = round_pairs(read_table("comparisons", earlier.file("comparisons.parquet")), round_no - 1)
        now = round_pairs(read_table("comparisons", current.file("comparisons.parquet")), round_no)
        pairs = pd.concat([before, now], ignore_index=True)
        write_table("comparisons", pairs, out / "comparisons.parquet")
        return {"pairs/n_pairs": len(pairs), "pairs/n_earlier_rounds": len(before), "pairs/n_this_round": len(now),
                "pairs/n_rounds": pairs["round_no"].nunique()}

    return run_stage(ctx, stage="accumulate_pairs", version=ACCUMULATE_VERSION, kind="comparisons",
                     config={"round_no": round_no}, inputs={"earlier": earlier, "current": current}, produce=produce)


def training_pairs(ctx: RunContext, cfg: IterationConfig, current: ArtifactRef, earlier: ArtifactRef | None,
                   round_no: int) -> ArtifactRef | None:
    """The accumulated pairs round k votes on and trains with, or None when it uses its own pairs (round 1,
    or iteration.pairs: per_round)."""
    if earlier is None or cfg.pairs == "per_round":
        return None
    return accumulate_pairs(ctx, earlier, current, round_no)


def stop_reason(ctx: RunContext, cfg: IterationConfig, vs_previous: ArtifactRef) -> str | None:
    """Why the iterated rounds stop after this round (its judged win rate against the round before is under
    iteration.stop_min_win_rate), or None; the decision and its numbers go to the round's MLflow run."""
    win_rate = judged_win_rate(ctx.store.manifest(vs_previous).metrics)
    metrics = {"iteration/win_rate_vs_previous": win_rate}
    reason = None
    if cfg.stop_min_win_rate is not None:
        metrics["iteration/stop_min_win_rate"] = cfg.stop_min_win_rate
        if win_rate < cfg.stop_min_win_rate:
            reason = (f"round {ctx.round_no}'s judged win rate against round {ctx.round_no - 1} is {win_rate:.3f} "
                      f"(a tie half a win), under iteration.stop_min_win_rate {cfg.stop_min_win_rate}")
    ctx.tracker.log_metrics(ctx.parent_run_id, metrics)
    ctx.tracker.set_tags(ctx.parent_run_id, {"rlhf.iteration.stop": "yes" if reason else "no"}
                         | ({"rlhf.iteration.stop_reason": reason} if reason else {}))
    if reason:
        stage_logger().warning("iterated rounds stop after this round: %s", reason)
    return reason


def check_round_inputs(workdir: str | Path, start_policy: ArtifactRef | None,
                       earlier_pairs: ArtifactRef | None) -> None:
    """Refuse a round's given start_policy or earlier_pairs that is not there, before any stage runs: a missing one
    failed only at the stage that read it (generate, or accumulate_pairs after six stages), as a transformers repo-id
    error or a "damaged artifact" that `rlhf verify` cannot find."""
    for name, ref, kind in (("start_policy", start_policy, "policy"), ("earlier_pairs", earlier_pairs, "comparisons")):
        if ref is None:
            continue
        store = ArtifactStore(Path(workdir) / "artifacts")  # only then: a round given neither makes nothing here
        if ref.kind != kind:
            raise ConfigError(f"{name} is a {ref.kind} artifact ({ref.path}); give a {kind} artifact")
        problems = store.damage(ref, hash_files=False) if store.holds(ref) else (
            [] if Path(ref.path).is_dir() else ["no such directory"])
        if problems:
            raise ConfigError(f"{name} {ref.kind}:{ref.digest[:12]} at {ref.path} is not there intact "
                              f"({'; '.join(problems[:3])}): give the {kind} artifact of a finished round of this "
                              "workdir (the paths in its summary's artifacts), or leave it empty")


def pairs_so_far(artifacts: dict[str, Any]) -> dict[str, Any]:
    """The pairs a finished round's reward model learned from, from its summary's artifacts: the accumulation of
    rounds 1..k, or its own pairs (round 1, or iteration.pairs: per_round). What the next round accumulates onto."""
    return artifacts.get("accumulate_pairs", artifacts["import_annotations"])


class FinishedRound(BaseModel):
    """A series' last finished round, as `<workdir>/finished-rounds.json` keeps it under the round's name."""

    round_no: int = Field(ge=1)
    pairs: ArtifactRef  # the pairs its reward model learned from (rounds 1..k): what round k + 1 accumulates onto
    imports: list[str] = []  # the digests of every round's imported pairs (comparisons)
    exports: dict[str, str] = {}  # sha256 -> file name of every annotation export the series imported
    policy: ArtifactRef
    mlflow_run_id: str
    base: dict[str, Any] | None = None  # series_base of its config (None in a record written before 2026-11-29)


def series_base(config: RoundConfig) -> dict[str, Any]:
    """What every round of a series shares: the seed and the config the world and SFT stages are keyed on (the
    prompt pool, the SFT policy). Two configs of one name that differ here are two series, not one: the second
    would accumulate its pairs onto pairs of another world and start from another lineage's policy."""
    return {"seed": config.seed, "world": config.world.model_dump(mode="json", include=POOL_FIELDS | SFT_FIELDS),
            "policy_model": config.policy_model.model_dump(mode="json"), "sft": config.sft.model_dump(mode="json")}


def _differences(recorded: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested dicts."""
    keys = sorted(set(recorded) | set(now))
    out = []
    for key in keys:
        a, b = recorded.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} ({a!r} then, {b!r} now)")
    return out


def finished_rounds(workdir: str | Path) -> dict[str, FinishedRound]:
    """The workdir's record of finished series rounds; a record that is not JSON of FinishedRound's shape (edited
    by hand, written by a foreign tool) is a ConfigError naming the file and the entry, not a KeyError mid-round."""
    path = Path(workdir) / FINISHED_ROUNDS
    if not path.is_file():
        return {}
    try:
        rounds = TypeAdapter(dict[str, FinishedRound]).validate_json(path.read_text())
    except (OSError, ValueError) as err:
        first = err.errors()[0] if isinstance(err, ValidationError) else {"loc": (), "msg": str(err)}
        at = f"at {'.'.join(map(str, first['loc']))}: " if first["loc"] else ""  # no place when it is not JSON
        where = f" ({at}{first['msg']})"
        raise ConfigError(f"iteration.continue_series: {path} is not a record of finished rounds{where}; restore it, "
                          f"or remove it (or the damaged entry) to start those series again at round 1") from None
    return rounds


def export_files(store: ArtifactStore, export: ArtifactRef) -> dict[str, str]:
    """sha256 -> file name of each annotation export an annotators artifact holds (its `exports/` copies, hashed in
    its manifest: the user's files byte for byte, or the simulated crowd's export)."""
    files = store.manifest(export).files
    return {sha: rel.removeprefix("exports/") for rel, sha in files.items() if rel.startswith("exports/")}


def series_exports(store: ArtifactStore, last: FinishedRound) -> dict[str, str]:
    """Every annotation export the series learned from. A record written before exports were kept (2026-11-28) has
    only its imports: their exports are read back from the imports' manifests, for those the store still holds."""
    if last.exports or not last.imports:
        return last.exports
    exports: dict[str, str] = {}
    for digest in last.imports:
        try:
            inputs = store.manifest(store.find("comparisons", digest)).inputs
            exports |= {sha: name for i in inputs if i.kind == "annotation_export"
                        for sha, name in export_files(store, store.find(i.kind, i.digest)).items()}
        except FileNotFoundError:
            continue
    return exports


def record_finished_round(workdir: str | Path, name: str, summary: dict[str, Any],
                          base: dict[str, Any] | None = None) -> None:
    """Note a round of a series (iteration.continue_series) that ran to its end as its name's last finished round in
    `workdir` (atomically; the caller holds the workdir's lock): what the series' next round follows. A round
    numbered at or below the one recorded (a late chained round) leaves the record as it is."""
    rounds = finished_rounds(workdir)
    last = rounds.get(name)
    if last is not None and summary["round_no"] <= last.round_no:
        return
    artifacts = summary["artifacts"]
    store = ArtifactStore(Path(workdir) / "artifacts")
    exports = export_files(store, ArtifactRef(**artifacts["annotators"]))
    rounds[name] = FinishedRound(
        round_no=summary["round_no"],
        pairs=ArtifactRef(**pairs_so_far(artifacts)),
        imports=[*(last.imports if last else []), artifacts["import_annotations"]["digest"]],
        exports=(series_exports(store, last) if last else {}) | exports,
        policy=ArtifactRef(**artifacts["ppo"]),
        mlflow_run_id=summary["mlflow"]["run_id"],
        base=base if base is not None else (last.base if last else None),
    )
    record = {n: r.model_dump(mode="json") for n, r in rounds.items()}
    atomic_write_text(Path(workdir) / FINISHED_ROUNDS, json.dumps(record, indent=2))


STARTED_ROUNDS = "started-rounds.json"  # in the workdir: per series name, its round under way and where it started


class StartedRound(BaseModel):
    """The policy a series' round k started from (resolved once: `iteration.start_from: champion` asks the registry).
    A round killed after its promotion moved the champion, run again as round k, started from its own policy."""

    round_no: int = Field(ge=1)
    policy: ArtifactRef
    source: str  # "sft" or "champion": starting_policy's word for it
    # what resolve() read besides the registry (the SFT policy's digest, iteration.start_from); None in records
    # from before it was kept: trusted
    made_for: dict[str, str] | None = None


def series_start(workdir: str | Path, name: str, round_no: int, resolve: Callable[[], tuple[ArtifactRef, str]],
                 made_for: dict[str, str] | None = None) -> tuple[ArtifactRef, str]:
    """The start of round `round_no` of series `name`: as it was when that round first started (still on disk, and
    pinned for the same `made_for`: a series of another config, e.g. another seed, under the name of one that never
    finished would otherwise start from that one's policy), else `resolve()`, noted for its re-runs (atomically; the
    caller holds the workdir's lock)."""
    started = _started_rounds(workdir)
    pinned = started.get(name)
    if (pinned is not None and pinned.round_no == round_no and Path(pinned.policy.path).is_dir()
            and pinned.made_for in (None, made_for)):
        stage_logger().info("round %s #%d starts where it first started: %s %s (%s)", name, round_no,
                             pinned.policy.kind, pinned.policy.digest[:12], pinned.source)
        return pinned.policy, pinned.source
    policy, source = resolve()
    started[name] = StartedRound(round_no=round_no, policy=policy, source=source, made_for=made_for)
    _write_started_rounds(workdir, started)
    return policy, source


def rounds_series_key(name: str) -> str:
    """The key of an rlhf-rounds series' pinned round-1 start in STARTED_ROUNDS (a weekly series keeps `name`)."""
    return f"rlhf-rounds:{name}"


def forget_series_start(workdir: str | Path, key: str) -> None:
    """Drop `key`'s pinned start (an rlhf-rounds series that finished: the next series resolves its start anew)."""
    started = _started_rounds(workdir)
    if started.pop(key, None) is not None:
        _write_started_rounds(workdir, started)


def _write_started_rounds(workdir: str | Path, started: dict[str, StartedRound]) -> None:
    atomic_write_text(Path(workdir) / STARTED_ROUNDS,
                      json.dumps({n: r.model_dump(mode="json") for n, r in started.items()}, indent=2))


def _started_rounds(workdir: str | Path) -> dict[str, StartedRound]:
    """The record of series rounds under way; one that does not read is empty (with a warning): its rounds' starts
    are resolved again and it is written anew."""
    path = Path(workdir) / STARTED_ROUNDS
    try:
        return TypeAdapter(dict[str, StartedRound]).validate_json(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        stage_logger().warning("%s does not read: the rounds' starts are resolved again and it is rewritten", path)
        return {}


def started_policies(workdir: str | Path) -> list[ArtifactRef]:
    """The policies the series' rounds under way started from (for the store's cleanup: kept)."""
    return [r.policy for r in _started_rounds(workdir).values()]


def last_finished_round(workdir: str | Path, name: str, base: dict[str, Any] | None = None) -> FinishedRound | None:
    """The last round named `name` that finished in `workdir` (record_finished_round's record), or None; its
    pairs must still be in the store, as a later round accumulates them. `base`: the continuing round's
    series_base, refused when it is not the series' (another seed, world or SFT policy under the same name)."""
    last = finished_rounds(workdir).get(name)
    if last is None:
        return None
    if base is not None and last.base is not None and (changed := _differences(last.base, base)):
        raise ConfigError(f"iteration.continue_series: round {name} #{last.round_no} in {workdir} was made with "
                          f"another seed, world or SFT policy than this round's ({'; '.join(changed)}), so this "
                          "round would learn from pairs of another world: give it another name (a series of its "
                          f"own) or workdir, or remove {name!r} from {Path(workdir) / FINISHED_ROUNDS} to start the "
                          "series again at round 1")
    kind, digest = last.pairs.kind, last.pairs.digest
    store = ArtifactStore(Path(workdir) / "artifacts")
    try:
        pairs = store.find(kind, digest)
    except FileNotFoundError:
        raise ConfigError(f"iteration.continue_series: the pairs of round {name} #{last.round_no} ({kind} "
                          f"{digest[:12]}) are no longer in {workdir}'s store, so the next round cannot learn from "
                          f"them: restore them, or remove {name!r} from {Path(workdir) / FINISHED_ROUNDS} to start "
                          "the series again at round 1") from None
    return last.model_copy(update={"pairs": pairs, "exports": series_exports(store, last)})


def check_new_import(last: FinishedRound, store: ArtifactStore, export: ArtifactRef) -> None:
    """A continued series learns from new annotations each round: refuse a round that imports an export file an
    earlier round of the series already learned from (the same bytes under any name: a fixed annotation.exports
    list, or last week's file left in this week's list), before it is imported: each such round would add the
    same judgements to the accumulated pairs once more."""
    again = {sha: name for sha, name in export_files(store, export).items() if sha in last.exports}
    if again:
        files = ", ".join(f"{name} (as {last.exports[sha]})" for sha, name in sorted(again.items(), key=lambda x: x[1]))
        raise ConfigError(f"iteration.continue_series: round #{last.round_no + 1} imports annotations an earlier "
                          f"round of the series already learned from: {files}; give it only new annotation exports, "
                          "or set iteration.continue_series false")
