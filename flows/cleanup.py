"""The flow that cleans a workdir's store on a schedule (deployment rlhf-gc/weekly-cleanup): `rlhf gc` in Prefect."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

import rlhf_core
from tasks.cleanup import GarbagePlan, collect_garbage, plan_garbage
from tasks.common import publish_markdown


@flow(name="rlhf-gc", version=rlhf_core.__version__)
def rlhf_gc(workdir: str = "rlhf-runs", keep_days: float = 30.0, drop_registered_models: bool = False,
            remove: bool = True, tracking_uri: str | None = None) -> dict[str, Any]:
    """Delete the artifacts of a round's workdir that nothing recent or kept was made from (tasks/cleanup.py);
    returns what it found and removed, also shown as the run's markdown artifact `gc`.

    Args:
        workdir: the rounds' workdir (relative to the worker's directory); it must hold an artifacts/ store.
        keep_days: every artifact a stage made, or found in its cache, in the last this many days (at least 1)
            stays, with the pairs and policy of each series' last finished round, the responses out for annotation
            and everything they were made from.
        drop_registered_models: also collect the older policies and reward models that only the lineage of kept
            artifacts reaches, when the MLflow registry holds them.
        remove: false lists what would go and deletes nothing.
        tracking_uri: the registry drop_registered_models asks (the rounds' tracking_uri when their config sets
            one); default MLFLOW_TRACKING_URI, else <workdir>/mlflow.db.
    """
    options = {"keep_days": keep_days, "drop_registered_models": drop_registered_models, "tracking_uri": tracking_uri}
    if remove:  # waits for no round: a round running in the workdir fails this run (WorkdirBusyError), not the round
        plan, entries, figures = collect_garbage(workdir, **options, note="rlhf-gc flow")
    else:
        plan, entries, figures = plan_garbage(workdir, **options), 0, 0
    mib = sum(plan.sizes.values()) / 2**20
    get_run_logger().info("%s: %d artifacts, %d unreferenced (%.1f MiB), %d unused registry downloads (%.1f MiB)%s",
                          workdir, plan.n_artifacts, len(plan.garbage), mib, len(plan.downloads),
                          plan.download_bytes / 2**20, ", removed" if remove else "; nothing removed (remove: false)")
    publish_markdown(_markdown(workdir, keep_days, plan, remove), key="gc", description=f"store cleanup of {workdir}")
    return {"artifacts": plan.n_artifacts, "unreferenced": len(plan.garbage), "MiB": round(mib, 1),
            "registry_downloads": len(plan.downloads), "registry_downloads_MiB": round(plan.download_bytes / 2**20, 1),
            "removed": remove, "cache_entries_removed": entries, "figure_dirs_removed": figures,
            "unreadable": [f"{ref.kind}:{ref.digest}" for ref in plan.unreadable]}


def _markdown(workdir: str, keep_days: float, plan: GarbagePlan, removed: bool) -> str:
    lines = [f"# Store cleanup of `{workdir}`", "",
             f"{plan.n_artifacts} artifacts; kept: used in the last {keep_days:g} days, the last finished round of "
             f"{plan.n_series} series, and what they were made from. {len(plan.garbage)} unreferenced "
             f"({sum(plan.sizes.values()) / 2**20:.1f} MiB), and {len(plan.downloads)} registry downloads that no "
             f"round used in that time or a killed download left ({plan.download_bytes / 2**20:.1f} MiB): "
             f"{'removed' if removed else 'not removed'}.", ""]
    if plan.by_kind:
        lines += ["| " + " | ".join(plan.by_kind[0]) + " |", "|" + " --- |" * len(plan.by_kind[0])]
        lines += ["| " + " | ".join(map(str, row.values())) + " |" for row in plan.by_kind]
    if plan.unreadable:
        lines += ["", f"Unreadable manifests, kept: {len(plan.unreadable)} (run `rlhf verify {workdir}`)."]
    return "\n".join(lines)
