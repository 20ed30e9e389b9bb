"""Chaining rounds with Prefect events: what a finished round and a new annotation export announce.

Two events, each the trigger of a deployment in prefect.yaml (a deployment trigger is a Prefect automation
whose action runs that deployment, its parameters rendered from the event):

- `rlhf.round.completed`, emitted by a round that ran to its evaluation: its payload is what the next round
  needs (the config, the policy to improve, the pairs so far, the next round's number); `rlhf-round/next-round`
  runs on it while the round's resource says `rlhf.next: "yes"` (its rounds do not say stop);
- `rlhf.annotations.exported`, emitted by `rlhf-watch-exports` for each new export file in a folder:
  `rlhf-round/on-new-export` runs a round that imports it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.events import emit_event

import rlhf_core
from rlhf_core.annotation.importer import is_export_name
from rlhf_core.artifacts import atomic_write_text, sha256_file
from rlhf_core.config import RoundConfig
from tasks.iteration import pairs_so_far

ROUND_COMPLETED = "rlhf.round.completed"
EXPORTED = "rlhf.annotations.exported"
SEEN_FILE = ".rlhf-exports-seen.json"  # in the watched folder: the exports already announced, by name and digest


def round_completed(config: RoundConfig, summary: dict[str, Any], subflow: bool) -> dict[str, Any]:
    """The event a round that ran to its evaluation emits (emit_event's arguments).

    Resource labels are what a trigger can match: the round's name and number, `rlhf.next` ("no" when
    iterated rounds stop here: its policy did not beat the round before) and `rlhf.subflow` ("yes" inside
    rlhf-rounds, which chains its rounds itself). The payload holds the next round's parameters.
    """
    artifacts = summary["artifacts"]
    pairs = pairs_so_far(artifacts)
    return {
        "event": ROUND_COMPLETED,
        "resource": {
            "prefect.resource.id": f"rlhf.round.{config.name}",
            "prefect.resource.name": config.name,
            "rlhf.round_no": str(summary["round_no"]),
            # a round over real exports has no next round to run by itself: the next one waits for annotations of
            # this round's responses (on-new-export); run again, it would import the same files a second time. Nor
            # has a round of a series (iteration.continue_series, the weekly deployment's): its schedule starts the
            # next, and chaining it too would run next week's round now, then the schedule's again
            "rlhf.next": "no" if summary["stop"] or config.annotation.exports or config.iteration.continue_series
            else "yes",
            "rlhf.subflow": "yes" if subflow else "no",
        },
        "payload": {
            "config": config.model_dump(mode="json"),
            "round_no": summary["round_no"],
            "next_round_no": summary["round_no"] + 1,
            "policy": artifacts["ppo"],
            "pairs": pairs,
            "stop": summary["stop"],
            "mlflow_run_id": summary["mlflow"]["run_id"],
        },
    }


def new_exports(folder: Path, min_age_seconds: float, now: float) -> list[tuple[Path, str]]:
    """(file, sha256) of the export files in `folder` not announced yet (new, or changed since), oldest first;
    files younger than `min_age_seconds` wait for the next look (an annotation tool may still be writing)."""
    seen = _read_seen(folder)
    files = sorted((f for f in folder.iterdir()  # hidden files: our record, or a tool's file being written
                    if f.is_file() and is_export_name(f.name) and not f.name.startswith(".")),
                   key=lambda f: (f.stat().st_mtime, f.name))
    ready = [f for f in files if now - f.stat().st_mtime >= min_age_seconds]
    digests = [(f, sha256_file(f)) for f in ready]
    return [(f, digest) for f, digest in digests if seen.get(f.name) != digest]


def _read_seen(folder: Path) -> dict[str, str]:
    path = folder / SEEN_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _mark_seen(folder: Path, file: Path, digest: str) -> None:
    atomic_write_text(folder / SEEN_FILE, json.dumps(_read_seen(folder) | {file.name: digest}, indent=1))


def exported(file: Path, digest: str) -> dict[str, Any]:
    """The event announcing one new export file (emit_event's arguments)."""
    return {
        "event": EXPORTED,
        "resource": {"prefect.resource.id": f"rlhf.annotations.{digest[:16]}", "prefect.resource.name": file.name,
                     "rlhf.folder": str(file.parent)},
        "payload": {"path": str(file), "digest": digest},
    }


@flow(name="rlhf-watch-exports", version=rlhf_core.__version__, log_prints=True)
def watch_exports(folder: str = "annotation-exports", min_age_seconds: float = 30.0) -> list[str]:
    """Announce each new annotation export in a folder with the Prefect event rlhf.annotations.exported, once;
    returns the files announced. Deployed on a schedule, it makes rlhf-round/on-new-export run a round per
    export.

    Args:
        folder: the folder annotation tools export into (relative to the worker's directory); files ending in
            .jsonl, .ndjson, .json, .csv or .parquet, in any letter case, .gz-compressed too, are exports (hidden
            files are not). Which were announced is kept in its
            .rlhf-exports-seen.json (name and sha256: a changed file is announced again).
        min_age_seconds: a file modified more recently than this waits for the next look, so a file still
            being written is not announced half-written.
    """
    root = Path(folder)
    if not root.is_dir():
        raise NotADirectoryError(f"folder: {root.resolve()} is not a directory: create it, or give the folder "
                                 "the annotation tool exports into")
    announced = []
    for file, digest in new_exports(root, min_age_seconds, time.time()):
        emit_event(**exported(file.resolve(), digest))
        _mark_seen(root, file, digest)  # after the event: a crash in between announces it twice, never not at all
        announced.append(str(file.resolve()))
        get_run_logger().info("announced %s (%s) as %s", file, digest[:12], EXPORTED)
    return announced
