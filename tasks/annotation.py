"""Stage 3: annotation. Comparison tasks go to annotators (simulated, or a real export is given)
and their Label Studio export is imported into annotations + comparison pairs + quarantine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlhf_core.annotation.label_studio import import_label_studio, read_export
from rlhf_core.annotation.pairs import aggregate_majority
from rlhf_core.annotation.tasks import make_comparison_tasks
from rlhf_core.artifacts import ArtifactRef, sha256_file
from rlhf_core.config import AnnotationConfig, WorldConfig
from rlhf_core.schemas import read_table, write_table
from rlhf_core.sim.annotators import simulate_label_studio_export
from rlhf_core.sim.metrics import gold_agreement_of_pairs
from tasks.common import RunContext, StageRun, run_stage

COLLECT_VERSION = "1"
IMPORT_VERSION = "1"


@task(name="annotators", version=COLLECT_VERSION, cache_policy=NO_CACHE)
def collect_annotations(ctx: RunContext, cfg: AnnotationConfig, world: WorldConfig, responses: ArtifactRef,
                        seed: int) -> ArtifactRef:
    """The annotators' export: a user-given file, or the simulated crowd labelling our tasks."""

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        if cfg.export_path:
            shutil.copyfile(cfg.export_path, out / "export.json")
            return {"annotators/simulated": 0.0}
        table = read_table("responses", responses.file("responses.parquet"))
        tasks = make_comparison_tasks(table, cfg.pairs_per_prompt, seed=seed)
        export = simulate_label_studio_export(tasks, world, seed=seed)
        (out / "export.json").write_text(json.dumps(export, indent=1))
        return {"annotators/simulated": 1.0, "annotators/n_tasks": len(tasks)}

    config = {"annotation": cfg.model_dump(), "world": world.model_dump(), "seed": seed}
    if cfg.export_path:  # a changed export file must not be served from cache
        config["export_sha256"] = sha256_file(Path(cfg.export_path))
    return run_stage(ctx, stage="annotators", version=COLLECT_VERSION, kind="annotation_export", config=config,
                     inputs={"responses": responses}, produce=produce)


@task(name="import_annotations", version=IMPORT_VERSION, cache_policy=NO_CACHE)
def import_annotations(ctx: RunContext, cfg: AnnotationConfig, export: ArtifactRef, responses: ArtifactRef,
                       simulated: bool) -> ArtifactRef:
    """Import the export: every row accepted or quarantined with a reason; pairs by majority."""

    def produce(out: Path, run: StageRun) -> dict[str, float]:
        table = read_table("responses", responses.file("responses.parquet"))
        annotations, quarantine = import_label_studio(read_export(export.file("export.json")), table)
        comparisons, report = aggregate_majority(annotations, table)
        write_table("annotations", annotations, out / "annotations.parquet")
        write_table("comparisons", comparisons, out / "comparisons.parquet")
        quarantine.to_parquet(out / "quarantine.parquet", index=False)
        metrics = {f"annotation/{k}": float(v) for k, v in report.items()}
        metrics["annotation/accepted"] = len(annotations)
        metrics["annotation/quarantined"] = len(quarantine)
        for reason, n in quarantine["reason"].value_counts().items():
            metrics[f"annotation/quarantine/{reason}"] = int(n)
        if simulated:
            metrics["annotation/gold_agreement"] = gold_agreement_of_pairs(comparisons)
        return metrics

    return run_stage(ctx, stage="import_annotations", version=IMPORT_VERSION, kind="comparisons",
                     config={"annotation": cfg.model_dump(), "simulated": simulated},
                     inputs={"export": export, "responses": responses}, produce=produce)
