"""Stage 3: annotation. Comparison tasks go to annotators (simulated, or real exports are given)
and every export is imported into judgements + comparison pairs + quarantine."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from rlhf_core.annotation.importer import import_files
from rlhf_core.annotation.label_studio import ImportFormatError
from rlhf_core.annotation.tasks import make_comparison_tasks
from rlhf_core.artifacts import ArtifactRef, sha256_file
from rlhf_core.config import AnnotationConfig, WorldConfig
from rlhf_core.paths import allowed_roots, resolve_allowed
from rlhf_core.schemas import read_table, write_table
from rlhf_core.sim.annotators import simulate_label_studio_export
from rlhf_core.sim.metrics import gold_agreement_of_pairs
from tasks.common import RunContext, StageRun, in_prefect_run, run_stage

COLLECT_VERSION = "2"
# 4: a Label Studio task without data.task_id named by what it shows; pairs by their two responses;
# 5: one pair across pairwise labels and scores, one vote per annotator and pair, HH replies with a later Human
# turn quarantined; 6: a ranking's pairs from its own order (two rankings of other items were averaged), a reused
# task id named; 7: a task's shown texts checked against the responses under its ids (annotation.match_texts),
# a text pair of one text in two Unicode forms or spacings is a self_pair
IMPORT_VERSION = "7"
SIMULATED_EXPORT = "00-simulated-label-studio.json"


class ExportChangedError(ValueError):
    """An annotation export changed between the round hashing it and copying it."""


def export_files(cfg: AnnotationConfig, workdir: str) -> list[Path]:
    """The configured export files, resolved and checked to lie under the allowed roots."""
    roots = allowed_roots(workdir)
    files = [resolve_allowed(p, f"annotation.exports[{i}]", roots) for i, p in enumerate(cfg.exports)]
    for field, f in zip(cfg.exports, files):
        if not f.is_file():
            raise ValueError(f"annotation.exports: {field} is not a file")
    return files


@task(name="annotators", version=COLLECT_VERSION, cache_policy=NO_CACHE)
def collect_annotations(ctx: RunContext, cfg: AnnotationConfig, world: WorldConfig, responses: ArtifactRef,
                        seed: int) -> ArtifactRef:
    """The annotators' exports: the user's files (copied, in order), or the simulated crowd's."""
    files = export_files(cfg, ctx.workdir)
    keyed = [sha256_file(f) for f in files]  # the cache key: what the stage reads

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        (out / "exports").mkdir()
        if files:
            width = max(2, len(str(len(files) - 1)))  # the import reads them in name order: 100 after 99
            for i, (f, sha) in enumerate(zip(files, keyed)):
                copy = out / "exports" / f"{i:0{width}d}-{f.name}"
                shutil.copyfile(f, copy)
                if sha256_file(copy) != sha:  # else the copy would be committed under the key of other content
                    raise ExportChangedError(
                        f"annotation.exports: {f} changed while the round read it (is it still being written?): "
                        "nothing was committed; run the round again once the file is complete")
            return {"annotators/simulated": 0.0, "annotators/n_files": len(files)}
        table = read_table("responses", responses.file("responses.parquet"))
        tasks = make_comparison_tasks(table, cfg.pairs_per_prompt, seed=seed)
        export = simulate_label_studio_export(tasks, world, seed=seed)
        (out / "exports" / SIMULATED_EXPORT).write_text(json.dumps(export, indent=1))
        return {"annotators/simulated": 1.0, "annotators/n_tasks": len(tasks)}

    # The user's files are copied as they are: their content and names are the key, not the simulated crowd's
    # settings (the world) or the seed, which only the simulated export reads, nor the paths they were given by
    # (relative here, absolute from the on-new-export trigger). A changed file is never served from the cache.
    config = {"annotation": keyed_annotation_config(cfg), "export_sha256": keyed}
    if not files:
        config |= {"world": world.model_dump(), "seed": seed}
    return run_stage(ctx, stage="annotators", version=COLLECT_VERSION, kind="annotation_export", config=config,
                     inputs={"responses": responses}, produce=produce)


@task(name="import_annotations", version=IMPORT_VERSION, cache_policy=NO_CACHE)
def import_annotations(ctx: RunContext, cfg: AnnotationConfig, export: ArtifactRef, responses: ArtifactRef,
                       simulated: bool) -> ArtifactRef:
    """Import every export: each row accepted or quarantined with a reason; pairs as configured."""
    if simulated:  # the simulated crowd writes a Label Studio export, whatever the configured format
        cfg = cfg.model_copy(update={"format": "label_studio"})

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        table = read_table("responses", responses.file("responses.parquet"))
        files = sorted((Path(export.path) / "exports").iterdir())
        result = import_files(files, table, cfg)
        if result.comparisons.empty:  # else the vote stage fails later with "no pairs to train on"
            raise ImportFormatError(no_pairs_message(result.quarantine, result.report))
        write_table("annotations", result.annotations, out / "annotations.parquet")
        write_table("scores", result.scores, out / "scores.parquet")
        write_table("comparisons", result.comparisons, out / "comparisons.parquet")
        result.quarantine.to_parquet(out / "quarantine.parquet", index=False)
        # agreement is NaN where no item has two annotators: not a number to record
        metrics = {f"annotation/{k}": float(v) for k, v in result.report.items() if not math.isnan(float(v))}
        counts = result.quarantine["reason"].value_counts()
        metrics.update({f"annotation/quarantine/{reason}": int(n) for reason, n in counts.items()})
        _quarantine_artifact(result.quarantine, result.report)
        if simulated:
            metrics["annotation/gold_agreement_excl_gold_ties"] = gold_agreement_of_pairs(result.comparisons)
        return metrics

    return run_stage(ctx, stage="import_annotations", version=IMPORT_VERSION, kind="comparisons",
                     config={"annotation": keyed_annotation_config(cfg), "simulated": simulated},
                     inputs={"export": export, "responses": responses}, produce=produce)


def keyed_annotation_config(cfg: AnnotationConfig) -> dict:
    """The annotation config as the cache keys hold it: the exports by file name (the path that led to a file is
    not what a stage reads; its content is keyed by digest)."""
    return cfg.model_dump() | {"exports": [Path(p).name for p in cfg.exports]}


def no_pairs_message(quarantine: pd.DataFrame, report: dict) -> str:
    """What to tell a user whose exports gave no comparison pair: the rows and why each file's were refused."""
    reasons = "; ".join(f"{Path(f).name}: {r} x{len(idx)}"
                        for (f, r), idx in quarantine.groupby(["source_file", "reason"]).groups.items())
    return (f"the annotation exports gave no comparison pair to train on: {int(report['accepted'])} of "
            f"{int(report['input_rows'])} rows accepted, {int(report['quarantined'])} quarantined"
            + (f" ({reasons})" if reasons else "") + ". Check the exports against annotation.format and "
            "the pairing settings (annotation.aggregate, pair_mode, min_score_gap, ties; README, \"Real "
            "annotations\"), or export again")


def _quarantine_artifact(quarantine: pd.DataFrame, report: dict) -> None:
    """Counts per quarantine reason and file as a Prefect table artifact (shown on the flow run); nothing outside
    a Prefect run."""
    if not in_prefect_run():
        return
    rows = [{"source_file": f, "reason": r, "rows": int(n), "example": str(quarantine.loc[idx[0], "detail"])[:200]}
            for (f, r), idx in quarantine.groupby(["source_file", "reason"]).groups.items()
            for n in [len(idx)]]
    description = (f"Annotation import: {int(report['input_rows'])} input rows, {int(report['accepted'])} "
                   f"accepted, {int(report['quarantined'])} quarantined, {int(report['n_pairs'])} pairs.")
    create_table_artifact(rows or [{"source_file": "-", "reason": "none", "rows": 0, "example": ""}],
                          key="annotation-quarantine", description=description)
