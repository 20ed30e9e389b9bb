"""Time the embedded demo round end to end and per stage; write docs/demo-timing.md (and its .json and .png).

    .venv/bin/python benchmarks/demo_round.py [--config configs/demo.yaml] [--out docs/demo-timing.md] [--workdir DIR]

Runs in a fresh temporary workdir (nothing cached) with Prefect's ephemeral API and a local
MLflow store, exactly as `rlhf demo` does. --workdir runs it in DIR instead and keeps it (stages
already there come from its cache: the smoke test's shared miniature round).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from result_files import bars, figure_axes, save_figure, write_json  # noqa: E402


def _number(value: float) -> str:
    """A count as an integer (738 pairs), any other number to 3 decimals."""
    return str(int(value)) if float(value).is_integer() and abs(value) >= 1 else f"{value:.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=None, help="YAML config (default: the embedded demo)")
    parser.add_argument("--out", default="docs/demo-timing.md")
    parser.add_argument("--workdir", default=None, help="run the round here and keep it (default: a fresh temporary "
                        "workdir, nothing cached)")
    parser.add_argument("--note", action="append", help="a remark on this run (the machine's load, ...); repeatable")
    args = parser.parse_args(argv)

    import torch

    from flows.round import rlhf_round
    from rlhf_core.artifacts import ArtifactStore, atomic_write_text
    from rlhf_core.config import RoundConfig, load_config

    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or f"{tmp}/run"
        overrides = [f"workdir={workdir}"]
        cfg = load_config(args.config, overrides=overrides) if args.config else RoundConfig(workdir=workdir)
        start = time.time()
        summary = rlhf_round(config=cfg)
        total = time.time() - start
        store = ArtifactStore(Path(workdir) / "artifacts")
        stage_seconds = {
            stage: store.manifest(store.find(a["kind"], a["digest"])).metrics.get("time/stage_seconds", float("nan"))
            for stage, a in summary["artifacts"].items()
        }

    fig, (ax,) = figure_axes(1, width=7, height=4)
    bars(ax, stage_seconds, "seconds", f"Demo round by stage (total {total:.0f} s, the API's start included)")
    figure = save_figure(fig, args.out)
    lines = [
        "# Demo round timing",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d} by `benchmarks/demo_round.py` "
        f"({args.config or 'embedded defaults'}), "
        + (f"workdir {args.workdir} (stages it held before come from its cache)." if args.workdir
           else "fresh workdir, nothing cached."),
        f"Machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), no GPU.",
        "",
        f"**Total wall time: {total / 60:.1f} min** ({total:.0f} s, Prefect ephemeral API start included).",
        *(args.note or []),
        "",
        figure,
        "",
        "| stage | seconds |",
        "|---|---|",
        *[f"| {stage} | {sec:.1f} |" for stage, sec in stage_seconds.items()],
        "",
        "Headline numbers of that run:",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {_number(v)} |" for k, v in summary["headline"].items() if v is not None],  # None: not in a demo
        "",
    ]
    result = {"date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "config": args.config or "embedded defaults",
              "workdir": args.workdir, "cores": os.cpu_count(), "torch": torch.__version__,
              "torch_threads": torch.get_num_threads(), "total_seconds": total, "stage_seconds": stage_seconds,
              "headline": summary["headline"], "notes": args.note}
    write_json(args.out, result)
    atomic_write_text(args.out, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
