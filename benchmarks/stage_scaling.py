"""Issue 12's scaling goal: each stage's time at 1x, 2x, 4x the prompts / pairs, the slope of time vs size, and
each stage's peak memory.

    .venv/bin/python benchmarks/stage_scaling.py [--config configs/mini.yaml] [--base-scale 1.0] [--factors 1 2 4]
        [--json docs/stage-scaling.json] [--doc docs/benchmarks.md] [--note TEXT] [--runs-dir DIR]

Size: the round's prompt counts (SCALED: the pool, the prompts sent to annotation and so the responses and pairs,
PPO's rollout prompts, the held-out and judged prompts) times base-scale x factor; every other setting is the
round's (SFT and voting steps follow the data: epochs over the pairs; SFT's steps are fixed). Each size runs in a
fresh process and workdir, through the stages' direct path (benchmarks/orchestration_overhead.py's `direct_round`:
the stages' own bodies, no Prefect or MLflow), seed 0.

Peak memory per stage: this process's peak RSS while the stage ran, read exactly: the kernel's high-water mark
(VmHWM) is reset before each stage (writing 5 to /proc/self/clear_refs) and read after it. Worker processes a
stage launches (num_processes > 1) are separate: their summed RSS is sampled every 50 ms with psutil (a peak
shorter than that can be missed); not getrusage(RUSAGE_CHILDREN), whose ru_maxrss is the largest child's peak
since this process started, not the stage's. The demo's stages run in-process, so their worker column is 0.

Writes the JSON (--json), a log-log plot of time vs size per stage beside it (same name, .png) and its own section
of --doc.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from orchestration_overhead import ROUND_STAGES, add_run_arguments, direct_round, machine, write_outputs  # noqa: E402

SECTION_START, SECTION_END = "<!-- stage-scaling:start -->", "<!-- stage-scaling:end -->"
SCALED = ("world.n_prompts", "world.n_eval_prompts", "sampling.n_samples", "ppo.rollout_prompts",
          "evaluation.n_prompts")
SAMPLE_SECONDS = 0.05  # how often the workers' RSS is read


def status_kb(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in kB: VmHWM (peak RSS since the last reset),
    VmRSS (now)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status: this needs Linux")


def reset_peak_rss() -> None:
    """Set this process's peak RSS back to its current RSS (Linux >= 4.0: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


class WorkersPeak(threading.Thread):
    """Samples the summed RSS of this process's descendants (the stage's worker group) until stopped."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak_bytes, self._done = 0, threading.Event()

    def run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._done.wait(SAMPLE_SECONDS):
            total = 0
            for child in me.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:  # it exited between the listing and the read
                    pass
            self.peak_bytes = max(self.peak_bytes, total)

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak_bytes


@contextmanager
def stage_memory(stage: str, into: dict[str, dict]) -> Iterator[None]:
    """Record the stage's peak RSS (this process), what it added to the RSS it started at, and its workers' peak
    (sampled) in into[stage], in MB."""
    reset_peak_rss()
    start_kb = status_kb("VmRSS")
    workers = WorkersPeak()
    workers.start()
    try:
        yield
    finally:
        peak_kb = status_kb("VmHWM")
        into[stage] = {"peak_rss_mb": peak_kb / 1024, "added_rss_mb": (peak_kb - start_kb) / 1024,
                       "workers_peak_rss_mb": workers.stop() / 2**20}


def scaled_overrides(config_path: str | None, scale: float) -> dict[str, int]:
    """The SCALED settings of the round at `scale` times their value (at least 1 each)."""
    from reward_modelling import round_config

    base = round_config(config_path, 0, Path(tempfile.gettempdir()))
    values = {}
    for key in SCALED:
        section, name = key.split(".")
        values[key] = max(1, round(getattr(getattr(base, section), name) * scale))
    return values


def run_size(config_path: str | None, scale: float, workdir: Path, result_path: Path) -> None:
    """One size in this process: each stage's seconds and peak memory, and the round's pair count."""
    from reward_modelling import round_config

    sizes = scaled_overrides(config_path, scale)
    config = round_config(config_path, 0, workdir, tuple(f"{k}={v}" for k, v in sizes.items()))
    memory: dict[str, dict] = {}
    result = direct_round(config, watch=lambda stage: stage_memory(stage, memory))
    n_pairs = int(result.metrics["import_annotations"]["annotation/n_pairs"])
    stages = {stage: {"seconds": result.seconds[stage], **memory[stage]} for stage in ROUND_STAGES}
    result_path.write_text(json.dumps({"scale": scale, "sizes": sizes, "n_pairs": n_pairs, "stages": stages}))


def measure(config_path: str | None, base_scale: float, factors: list[float], runs_dir: Path | None) -> list[dict]:
    """Each size in a fresh process and workdir, smallest first; each size's result kept in `runs_dir` (default: a
    temporary directory), so a killed benchmark resumes there with the sizes it has not run."""
    results = []
    with tempfile.TemporaryDirectory(prefix="stage-scaling-") as tmp:
        folder = runs_dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for factor in factors:
            scale = base_scale * factor
            workdir, result_path = folder / f"scale{scale:g}", folder / f"scale{scale:g}.json"
            print(f"== {factor:g}x", flush=True)
            if not result_path.exists():
                shutil.rmtree(workdir, ignore_errors=True)  # a killed run's workdir
                argv = [sys.executable, __file__, "--one-scale", str(scale), "--workdir", str(workdir),
                        "--result", str(result_path.with_suffix(".partial"))]
                subprocess.run(argv + (["--config", config_path] if config_path else []), cwd=ROOT, check=True)
                result_path.with_suffix(".partial").rename(result_path)
                shutil.rmtree(workdir, ignore_errors=True)
            results.append(json.loads(result_path.read_text()) | {"factor": factor})
    return results


def loglog_slope(factors: list[float], seconds: list[float]) -> float:
    """The least-squares slope of log(seconds) on log(factor): 1 = linear in the size, 0 = constant."""
    import numpy as np

    if len(factors) < 2 or min(seconds) <= 0:
        return float("nan")
    return float(np.polyfit(np.log(factors), np.log(seconds), 1)[0])


def summarise(runs: list[dict], args: argparse.Namespace) -> dict:
    factors = [r["factor"] for r in runs]
    stages = {stage: {"seconds": [r["stages"][stage]["seconds"] for r in runs],
                      "peak_rss_mb": [r["stages"][stage]["peak_rss_mb"] for r in runs],
                      "added_rss_mb": [r["stages"][stage]["added_rss_mb"] for r in runs],
                      "workers_peak_rss_mb": [r["stages"][stage]["workers_peak_rss_mb"] for r in runs]}
              for stage in ROUND_STAGES}
    for stage, v in stages.items():
        v["slope"] = loglog_slope(factors, v["seconds"])
    return {
        "benchmark": "stage_scaling",
        "command": "python benchmarks/stage_scaling.py " + shlex.join(args.argv),
        "config": args.config or "the embedded demo", "seed": 0, "base_scale": args.base_scale, "factors": factors,
        "date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "machine": machine(args.load_at_start),
        "sizes": [r["sizes"] for r in runs], "n_pairs": [r["n_pairs"] for r in runs],
        "total_seconds": [sum(r["stages"][s]["seconds"] for s in ROUND_STAGES) for r in runs],
        "stages": stages, "notes": args.note or [],
    }


def plot(result: dict, path: Path) -> None:
    """Seconds vs size factor per stage, log-log, with a slope-1 guide through the largest stage's first point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    factors = result["factors"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for stage, v in result["stages"].items():
        if min(v["seconds"]) > 0:
            ax.plot(factors, v["seconds"], marker="o", label=f"{stage} (slope {v['slope']:.2f})")
    first = max(v["seconds"][0] for v in result["stages"].values())
    ax.plot(factors, [first * f / factors[0] for f in factors], "k:", lw=1, label="linear (slope 1)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(factors, [f"{f:g}x" for f in factors])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # only the sizes measured
    ax.set_xlabel(f"prompts / pairs (x {result['base_scale']:g} of {result['config']})")
    ax.set_ylabel("stage seconds")
    ax.set_title("Stage time vs size")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def verdict(result: dict) -> str:
    """What the slopes say: the stages that grow faster than linear, and which dominate at the largest size."""
    stages, last = result["stages"], len(result["factors"]) - 1
    total = result["total_seconds"][last]
    top = sorted(stages, key=lambda s: -stages[s]["seconds"][last])[:3]
    shares = [(s, stages[s]["seconds"][last] / total) for s in top]
    superlinear = [f"{s} ({v['slope']:.2f})" for s, v in stages.items() if v["slope"] > 1.1]
    biggest = max(stages, key=lambda s: max(stages[s]["peak_rss_mb"]))
    return (f"**Goal (issue 12): each stage's time at {', '.join(f'{f:g}x' for f in result['factors'])} the prompts "
            f"/ pairs, with its slope and peak memory: reported below.** At {result['factors'][last]:g}x the round's "
            f"stages take {total:.0f} s, {', '.join(f'{s} {share:.0%}' for s, share in shares)}. "
            + (f"Faster than linear (slope > 1.1): {', '.join(superlinear)}. " if superlinear
               else "No stage grows faster than linear (every slope <= 1.1). ")
            + f"The largest peak RSS: {biggest}, {max(stages[biggest]['peak_rss_mb']):.0f} MB.")


def section(result: dict) -> str:
    m, stages, factors = result["machine"], result["stages"], result["factors"]
    head = " | ".join(f"{f:g}x s" for f in factors)
    mem_head = " | ".join(f"peak RSS {f:g}x MB" for f in factors)
    rows = "\n".join(
        f"| {stage} | {' | '.join(f'{s:.1f}' for s in v['seconds'])} | {v['slope']:.2f} | "
        f"{' | '.join(f'{x:.0f}' for x in v['peak_rss_mb'])} | {v['added_rss_mb'][-1]:.0f} | "
        f"{max(v['workers_peak_rss_mb']):.0f} |"
        for stage, v in stages.items())
    sizes = "; ".join(f"{f:g}x: " + ", ".join(f"{k} {v}" for k, v in s.items()) + f" ({n} pairs)"
                      for f, s, n in zip(factors, result["sizes"], result["n_pairs"]))
    notes = "".join(f"- {n}\n" for n in result["notes"])
    return f"""{SECTION_START}
## Scaling: each stage's time and peak memory at {', '.join(f'{f:g}x' for f in factors)} the prompts / pairs

Machine: {m['cores']} CPU cores ({m['processor']}), torch {m['torch']}, OMP_NUM_THREADS={m['OMP_NUM_THREADS']}; load
average {m['load_average_at_start']:.1f} at the start; {result['date']}. This machine is shared with other
engineers' jobs: the absolute times are context, the slopes are the result.

    {result['command']}

Round: {result['config']} at {result['base_scale']:g}x its prompt counts as the base, seed {result['seed']}; each
size a fresh process and workdir; the stages called directly (their own bodies, no Prefect or MLflow: see the
orchestration-overhead section). Sizes: {sizes}.

{verdict(result)}

| stage | {head} | slope (log-log) | {mem_head} | added at {factors[-1]:g}x MB | workers' peak MB |
|---|{'---|' * (len(factors) * 2 + 3)}
{rows}

Slope: least squares of log(seconds) on log(size); 1 = linear, 0 = constant (SFT's steps do not depend on the
prompts). Peak RSS: the benchmark process's high-water mark while the stage ran (VmHWM, reset before each stage
through /proc/self/clear_refs), so it includes what earlier stages left allocated (torch, the models, the
tables); added: that peak minus the RSS the stage started at, what the stage itself needed; workers' peak: the
summed RSS of the stage's worker processes, sampled every 50 ms with psutil (0: the stage ran in-process).
![each stage's seconds against size, log-log]({result['figure']})
{notes}{SECTION_END}
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(parser, "stage-scaling.json")
    parser.add_argument("--base-scale", type=float, default=1.0, help="the base size: this times the round's counts")
    parser.add_argument("--factors", type=float, nargs="+", default=[1.0, 2.0, 4.0], help="sizes, times the base")
    parser.add_argument("--runs-dir", type=Path, default=None, help="keep each size's result here; a re-run with the "
                        "same config reads back the sizes it holds (default: a temporary directory)")
    parser.add_argument("--one-scale", type=float, help=argparse.SUPPRESS)  # a single size, in this process
    args = parser.parse_args(argv)
    if args.one_scale is not None:
        run_size(args.config, args.one_scale, args.workdir, args.result)
        return
    if sorted(args.factors) != args.factors or min(args.factors) <= 0:
        parser.error("--factors must be positive and increasing")
    args.argv, args.load_at_start = list(sys.argv[1:] if argv is None else argv), os.getloadavg()[0]
    result = summarise(measure(args.config, args.base_scale, args.factors, args.runs_dir), args)
    figure = args.json.with_suffix(".png")
    result["figure"] = os.path.relpath(figure, args.doc.parent)
    figure.parent.mkdir(parents=True, exist_ok=True)
    plot(result, figure)
    text = section(result)
    write_outputs(result, args.json, args.doc, text, SECTION_START, SECTION_END)
    print(text)


if __name__ == "__main__":
    main()
