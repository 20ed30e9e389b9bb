"""Cleaning a workdir's store: the artifacts that nothing recent or kept was made from (`rlhf gc`, `rlhf-gc`).

Kept: every artifact a stage committed, or found in its cache, in the last `keep_days` days (at least 1: a chained
round, the next round of `rlhf-rounds` or a stage given an input by digest starts from what the last one made); the
pairs and policy of each series' last finished round (finished-rounds.json: the next scheduled round starts from
them), the policy each series' round under way started from (started-rounds.json: its re-run starts there); the
responses no import has read yet (out for annotation: made again, on another machine they could differ
under the same ids, and the annotations would be joined to other texts); and everything upstream of these. With
`drop_registered_models` the walk up the lineage stops at the policies and reward models the MLflow registry holds: a
series that starts each round from the champion keeps only its recent models locally.

Models downloaded from the MLflow registry (`<workdir>/registry/<name>/<version>`, a champion the store does not hold)
go when no round has used them in `keep_days` (`tasks.evaluation.registered_policy` marks each use): a round that needs
that version again downloads it again. What a killed download left (`registry/<name>/download`) always goes.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rlhf_core.artifacts import ArtifactRef, ArtifactStore
from rlhf_core.config import ConfigError, no_credentials_in_url
from tasks.common import MAINTENANCE, SERIES_LOCK, WorkdirBusyError, lock_workdir
from tasks.iteration import finished_rounds, started_policies
from tasks.promotion import registered_models
from tasks.tracking import default_tracking_uri

MIN_KEEP_DAYS = 1.0
REGISTRY_DOWNLOADS = "registry"  # <workdir>/registry/<name>/<version>: tasks.evaluation.registered_policy's downloads


class NotAWorkdirError(ValueError):
    """A directory with no artifact store: nothing to clean there."""


@dataclass
class GarbagePlan:
    n_artifacts: int
    n_series: int  # series whose last finished round is kept
    garbage: list[ArtifactRef]  # what may go, in kind, digest order
    sizes: dict[str, int]  # digest -> bytes, of the garbage
    unreadable: list[ArtifactRef]  # manifests that do not read: never collected (`rlhf verify`)
    by_kind: list[dict[str, float | int | str]]  # a row per kind of garbage: how many, MiB, newest's age
    downloads: list[Path]  # registry downloads unused in keep_days, and killed downloads' leftovers
    download_bytes: int


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def store_of(workdir: str | Path) -> ArtifactStore:
    """The workdir's store; NotAWorkdirError naming the directory when it has none."""
    root = Path(workdir) / "artifacts"
    if not root.is_dir():
        raise NotAWorkdirError(f"{workdir} is not a round's workdir (it has no artifacts/)")
    return ArtifactStore(root)


def awaiting_annotation(store: ArtifactStore) -> list[ArtifactRef]:
    """The responses no import has read (no comparisons artifact lists them as an input): out for annotation."""
    imported = set()
    for pairs in store.artifacts("comparisons"):
        try:
            imported |= {i.digest for i in store.manifest(pairs).inputs if i.kind == "responses"}
        except (OSError, ValueError):  # unreadable: kept by the collection, and so what it was made from
            continue
    return [ref for ref in store.artifacts("responses") if ref.digest not in imported]


TRASH = ".trash-"  # a download being deleted: renamed first, so no round ever sees half a model


def stale_downloads(workdir: str | Path, used_since: float) -> list[Path]:
    """The registry downloads no round has used since `used_since` (seconds since the epoch: a use touches the
    version's folder), and every leftover of a killed download (`<name>/download`) or deletion (`.trash-*`)."""
    root = Path(workdir) / REGISTRY_DOWNLOADS
    versions = sorted(v for name in root.glob("*") if name.is_dir() for v in name.iterdir() if v.is_dir())
    return [v for v in versions
            if v.name == "download" or v.name.startswith(TRASH) or v.stat().st_mtime < used_since]


def _remove_download(path: Path) -> None:
    """Rename, then delete: a deletion killed half-way leaves a `.trash-*` folder (the next collection's), never a
    version folder with half its files, which a round would take for the model."""
    trash = path if path.name.startswith(TRASH) else path.rename(path.with_name(f"{TRASH}{path.name}"))
    shutil.rmtree(trash)


def _in_store(store: ArtifactStore, refs: list[ArtifactRef]) -> list[ArtifactRef]:
    """Those of `refs` the store holds (a champion downloaded from the registry is not the store's)."""
    held = []
    for ref in refs:
        try:
            held.append(store.find(ref.kind, ref.digest))
        except FileNotFoundError:
            continue
    return held


def plan_garbage(workdir: str | Path, keep_days: float, drop_registered_models: bool = False,
                 tracking_uri: str | None = None) -> GarbagePlan:
    """What a collection would delete now. Raises ConfigError for a series record that does not read, and
    TrackingUnavailableError for a registry that does not answer (with `drop_registered_models`)."""
    if keep_days < MIN_KEEP_DAYS:
        raise ValueError(f"keep_days must be at least {MIN_KEEP_DAYS:g} (got {keep_days:g}): a chained round starts "
                         "from what the round before made")
    if tracking_uri is not None:
        try:  # a round's config refuses these; the URI given here would reach the flow's parameters and errors
            no_credentials_in_url(tracking_uri)
        except ValueError as err:
            raise ConfigError(f"tracking_uri: {err}") from None
        if not drop_registered_models:
            raise ConfigError("tracking_uri names the registry that drop_registered_models asks; without "
                              "drop_registered_models it is not read: leave it out, or add drop_registered_models")
    store = store_of(workdir)
    heads = [ref for last in finished_rounds(workdir).values() for ref in (last.pairs, last.policy)]
    held = registered_models(tracking_uri or default_tracking_uri(workdir)) if drop_registered_models else frozenset()
    started = started_policies(workdir)  # a series' round under way started from these: its re-run starts there
    roots = heads + _in_store(store, started) + awaiting_annotation(store)
    used_since = time.time() - keep_days * 86400
    garbage, unreadable = store.unreferenced(roots, used_since=used_since, held_elsewhere=held)
    sizes = {ref.digest: _size(Path(ref.path)) for ref in garbage}
    pinned = {Path(ref.path).resolve() for ref in started}
    downloads = [path for path in stale_downloads(workdir, used_since) if path.resolve() not in pinned]
    download_bytes = sum(_size(path) for path in downloads)
    by_kind = []
    for kind in sorted({ref.kind for ref in garbage}):
        refs = [ref for ref in garbage if ref.kind == kind]
        newest = max(store.manifest(ref).created_at for ref in refs)
        mib = round(sum(sizes[r.digest] for r in refs) / 2**20, 1)
        by_kind.append({"kind": kind, "unreferenced": len(refs), "MiB": mib,
                        "newest (days ago)": round((time.time() - newest) / 86400, 1)})
    if downloads:
        by_kind.append({"kind": "registry download", "unreferenced": len(downloads),
                        "MiB": round(download_bytes / 2**20, 1),
                        "newest (days ago)": round((time.time() - max(p.stat().st_mtime for p in downloads)) / 86400, 1)})
    return GarbagePlan(n_artifacts=len(store.committed()), n_series=len(heads) // 2, garbage=garbage, sizes=sizes,
                       unreadable=unreadable, by_kind=by_kind, downloads=downloads, download_bytes=download_bytes)


def collect_garbage(workdir: str | Path, keep_days: float, drop_registered_models: bool = False,
                    tracking_uri: str | None = None, note: str = "rlhf gc") -> tuple[GarbagePlan, int, int]:
    """Delete what `plan_garbage` lists, planned again under the workdir's locks (WorkdirBusyError while a round or
    an `rlhf-rounds` series runs there; a round that finished meanwhile counts), with the cache entries that point at
    it and the figures kept for those entries. Returns the plan, the cache entries and the figure folders removed."""
    store = store_of(workdir)
    try:  # a series holds .rounds.lock between its rounds; a killed holder's note stays in each for the next round
        note, wait = f"{MAINTENANCE} {note}", {"keep_left": True, "maintenance_wait_s": 0}
        with lock_workdir(workdir, note=note, name=SERIES_LOCK, what="rlhf-rounds", **wait), \
                lock_workdir(workdir, note=note, **wait):
            plan = plan_garbage(workdir, keep_days, drop_registered_models, tracking_uri)
            # only the removed entries' figures, each with its entry: a killed stage's curves wait in plots/ for its
            # resumption
            with_figures = {p.name for p in (store.root / "plots").glob("*") if p.is_dir()}
            keys = store.remove(*plan.garbage, figures=True)
            figures = [key for key in keys if key in with_figures]
            for path in plan.downloads:
                _remove_download(path)
    except WorkdirBusyError as err:
        raise WorkdirBusyError(f"nothing removed: another round or rlhf-rounds is running in {workdir} ({err.holder}); "
                               "clean up when it has finished", err.holder) from None
    return plan, len(keys), len(figures)
