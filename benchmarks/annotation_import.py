"""Time a streamed import of text pairs at 100k, 300k and 1M rows, with peak memory; write
docs/benchmark-annotation-import.md (and its .json and .png).

    .venv/bin/python benchmarks/annotation_import.py [--sizes 100000,300000,1000000] [--in-memory-sizes 100000,300000]
        [--batch-rows 20000] [--style hh]

For each size a synthetic JSONL file is written row by row into a temporary directory (never held
in memory), then imported in a fresh Python process: `import_text_pairs_to` (streamed to Parquet)
for every size, and the in-memory `import_text_pairs` for --in-memory-sizes, for comparison. Peak
memory is the child's own ru_maxrss (os.wait4 reports it per child); "baseline" is the child's
ru_maxrss after its imports (Python, pandas, pyarrow), so peak - baseline is what the import adds.

Synthetic rows (seeded): HH-style by default (`{"chosen": dialogue, "rejected": dialogue}`, 1-3
Human/Assistant turns of 8-30 and 15-45 words, replies of 10-50 words: prompts of about 390
characters and replies of about 150 on average, 1.1 kB a line; the real HH harmless-base pairs
average 485, 165-205 and 1.4 kB), or TRL-style with --style trl (`{"prompt", "chosen", "rejected",
"margin_label"}`). 0.5% of the lines are cut short (malformed_json) and 0.5% repeat one of the
previous 1,000 lines (duplicate).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections import deque
from datetime import datetime, timezone
from pathlib import Path

from rlhf_core.artifacts import atomic_write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_files import figure_axes, save_figure, write_json  # noqa: E402

WORDS = [
    "the", "a", "of", "to", "and", "in", "is", "it", "you", "that", "for", "on", "with", "as", "was", "be", "can",
    "this", "have", "not", "are", "but", "they", "my", "your", "how", "what", "do", "about", "would", "if", "we",
    "there", "which", "when", "one", "all", "will", "so", "some", "more", "like", "just", "people", "time", "know",
    "make", "good", "think", "help", "could", "should", "water", "home", "work", "food", "health", "money", "car",
    "dog", "recipe", "garden", "bread", "history", "question", "answer", "reason", "because", "maybe", "really",
    "sorry", "sure", "please", "thanks", "idea", "story", "music", "school", "friend",
]
MARGIN_LABELS = ("significantly better", "better", "slightly better", "negligibly better", "unsure")
READING = (
    "A streamed import's peak is set by batch_rows (one batch of rows as Python objects, then as an "
    "Arrow table), not by the file. What still grows with the file is the duplicate check: 8 bytes per "
    "accepted row (16 for a moment while a merge copies the sorted array), plus a set of at most 65,536 "
    "recent digests; see the docstring of `rlhf_core/annotation/text_pairs.py`. The in-memory import "
    "holds every row. The stage holds what it must hand on: the accepted pairs as one table (about 1.8 kB "
    "per 1.1 kB row here: the text as Python strings once pandas reads it), about two thirds of the in-memory "
    "import's peak; a file larger than memory needs the streamed import without the read-back, i.e. reward "
    "training that reads Parquet in batches (not built yet)."
)
MALFORMED_SHARE = 0.005
DUPLICATE_SHARE = 0.005


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(low, high))).capitalize() + "."


def _hh_row(rng: random.Random) -> dict:
    turns = []
    for _ in range(rng.randint(1, 3)):
        turns += [f"\n\nHuman: {_text(rng, 8, 30)}", f"\n\nAssistant: {_text(rng, 15, 45)}"]
    prompt = "".join(turns[:-1]) + "\n\nAssistant:"
    return {"chosen": f"{prompt} {_text(rng, 10, 50)}", "rejected": f"{prompt} {_text(rng, 10, 50)}"}


def _trl_row(rng: random.Random) -> dict:
    return {
        "prompt": _text(rng, 20, 120),
        "chosen": _text(rng, 15, 80),
        "rejected": _text(rng, 15, 80),
        "margin_label": rng.choice(MARGIN_LABELS),
    }


def write_synthetic_jsonl(path: Path, n_rows: int, style: str, seed: int) -> dict[str, int]:
    """Write n_rows lines to `path`, one at a time; return how many of each kind were written."""
    rng = random.Random(seed)
    make_row = _hh_row if style == "hh" else _trl_row
    recent: deque[bytes] = deque(maxlen=1_000)  # lines a duplicate may repeat
    counts = {"good": 0, "malformed": 0, "duplicate": 0}
    with open(path, "wb") as f:
        for _ in range(n_rows):
            draw = rng.random()
            if draw < MALFORMED_SHARE:
                line, kind = json.dumps(make_row(rng)).encode()[:40], "malformed"
            elif draw < MALFORMED_SHARE + DUPLICATE_SHARE and recent:
                line, kind = rng.choice(recent), "duplicate"
            else:
                line, kind = json.dumps(make_row(rng)).encode(), "good"
                recent.append(line)
            f.write(line + b"\n")
            counts[kind] += 1
    return counts


def child(mode: str, path: str, out_dir: str, fmt: str, batch_rows: int) -> None:
    """Run one import in this (fresh) process and print its figures as one JSON line."""
    from rlhf_core.annotation.text_pairs import import_text_pairs, import_text_pairs_to

    baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if mode == "streaming":
        summary = import_text_pairs_to(path, out_dir, fmt, batch_rows=batch_rows)
        counts = {"rows": summary.rows, "accepted": summary.accepted, "reasons": summary.reasons}
        counts["comparisons_mb"] = summary.comparisons_path.stat().st_size / 1e6
    elif mode == "stage":  # what the annotation stage runs: streamed to Parquet, read back as one table
        import pandas as pd

        from rlhf_core.annotation.importer import import_files
        from rlhf_core.config import AnnotationConfig

        responses = pd.DataFrame(columns=["prompt_id", "response_id", "prompt", "response"])
        result = import_files([path], responses, AnnotationConfig(format=fmt))
        counts = {"rows": int(result.report["input_rows"]), "accepted": int(result.report["accepted"])}
        counts["reasons"] = result.quarantine["reason"].value_counts().to_dict()
    else:
        comparisons, quarantine = import_text_pairs(path, fmt)
        counts = {"rows": len(comparisons) + len(quarantine), "accepted": len(comparisons)}
        counts["reasons"] = quarantine["reason"].value_counts().to_dict()
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "baseline_kb": baseline_kb, **counts}))


def measure(mode: str, path: Path, out_dir: Path, fmt: str, batch_rows: int) -> dict:
    """Run `child` in a fresh interpreter; add its peak RSS (from os.wait4, this child only)."""
    command = [sys.executable, __file__, "--child", mode, str(path), str(out_dir), fmt, str(batch_rows)]
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile() as stdout:
        process = subprocess.Popen(command, stdout=stdout, env={**os.environ, "OMP_NUM_THREADS": "1"})
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            raise RuntimeError(f"{mode} import of {path} failed with exit code {process.returncode}")
        stdout.seek(0)
        result = json.loads(stdout.read().decode().strip().splitlines()[-1])
    label = {"streaming": f"streamed, batch_rows {batch_rows:,}", "stage": "the stage (importer.import_files)",
             "in_memory": "in memory (import_text_pairs)"}[mode]
    return {**result, "import": label, "peak_kb": usage.ru_maxrss, "load": load}


def _mb(kb: float) -> str:
    return f"{kb / 1024:,.0f}"


def report(args: argparse.Namespace, command: str, results: list[dict], files: dict[int, dict], figure: str) -> str:
    lines = [
        "# Annotation import benchmark: text pairs, streamed vs in memory",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `{command}`.",
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}; shared with "
        + "other jobs while it ran (the load average at each start is in the table), so seconds are upper bounds.",
        "",
        f"Input: synthetic {args.style.upper()}-style JSONL (seed {args.seed}), 0.5% malformed lines and 0.5% "
        + "repeats of a recent line; each file written row by row to a temporary directory, then deleted.",
        "Each import runs in a fresh Python process. Peak = the child's ru_maxrss (os.wait4); baseline = its "
        + "ru_maxrss after importing Python, pandas and pyarrow, before reading; added = peak - baseline; "
        + "growth = the change in peak RSS from the previous size of the same import, per extra row.",
        "Streamed = `import_text_pairs_to` (Parquet, batch_rows rows at a time); in memory = `import_text_pairs` "
        + "(DataFrames; the only import before this benchmark); the stage = `importer.import_files`, what the "
        + "annotation stage runs (streamed to Parquet, then read back as the one comparisons table the "
        + "reward-model stages train on, so it holds the accepted pairs' text once, as Arrow/pandas columns).",
        "",
        figure,
        "",
        "| rows | file MB | import | seconds | rows/s | peak RSS MB | baseline MB | added MB | growth B/extra row "
        + "| accepted | quarantined | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    previous: dict[str, dict] = {}
    for r in sorted(results, key=lambda r: (r["rows"], r["import"])):
        before = previous.get(r["import"])
        growth = "-"
        if before is not None:
            growth = f"{(r['peak_kb'] - before['peak_kb']) * 1024 / (r['rows'] - before['rows']):,.0f}"
        previous[r["import"]] = r
        lines.append(
            f"| {r['rows']:,} | {files[r['size']]['mb']:,.0f} | {r['import']} | {r['seconds']:.1f} "
            + f"| {r['rows'] / r['seconds']:,.0f} | {_mb(r['peak_kb'])} | {_mb(r['baseline_kb'])} "
            + f"| {_mb(r['peak_kb'] - r['baseline_kb'])} | {growth} | {r['accepted']:,} "
            + f"| {r['rows'] - r['accepted']:,} | {r['load']:.1f} |"
        )
    lines += ["", "Peak RSS from the smallest to the largest file, per import:", ""]
    for label in sorted({r["import"] for r in results}):
        runs = sorted((r for r in results if r["import"] == label), key=lambda r: r["rows"])
        first, last = runs[0], runs[-1]
        lines.append(
            f"- {label}: {_mb(first['peak_kb'])} MB at {first['rows']:,} rows, {_mb(last['peak_kb'])} MB at "
            + f"{last['rows']:,} rows ({_mb(last['peak_kb'] - first['peak_kb'])} MB more for "
            + f"{last['rows'] / first['rows']:.0f}x the rows)."
        )
    lines += ["", READING, "", "Quarantine reasons (the same for every import of a file):", ""]
    lines += [f"- {size:,} rows: {dict(sorted(counts['reasons'].items()))}" for size, counts in files.items()]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        mode, path, out_dir, fmt, batch_rows = sys.argv[2:]
        child(mode, path, out_dir, fmt, int(batch_rows))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100000,300000,1000000", help="rows per file, comma-separated")
    parser.add_argument("--in-memory-sizes", default="100000,300000", help="sizes also run in memory ('' for none)")
    parser.add_argument("--stage-sizes", default="100000,1000000", help="sizes also run through the stage's "
                        "import_files ('' for none)")
    parser.add_argument("--batch-rows", default="20000", help="batch_rows of the streamed import, comma-separated")
    parser.add_argument("--style", choices=["hh", "trl"], default="hh")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="docs/benchmark-annotation-import.md")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    in_memory = {int(s) for s in args.in_memory_sizes.split(",") if s}
    stage = {int(s) for s in args.stage_sizes.split(",") if s}
    batch_rows = [int(b) for b in args.batch_rows.split(",")]
    command = "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/annotation_import.py " + " ".join(argv)

    results, files = [], {}
    with tempfile.TemporaryDirectory(prefix="annotation-import-") as tmp:
        for size in sizes:
            path = Path(tmp) / f"pairs-{size}.jsonl"
            start = time.perf_counter()
            files[size] = write_synthetic_jsonl(path, size, args.style, args.seed)
            files[size]["mb"] = path.stat().st_size / 1e6
            print(f"{size:,} rows: wrote {files[size]} in {time.perf_counter() - start:.0f} s", flush=True)
            runs = [("streaming", b) for b in batch_rows] + ([("in_memory", 0)] if size in in_memory else []) + (
                [("stage", 0)] if size in stage else [])
            for mode, batch in runs:
                result = {**measure(mode, path, Path(tmp) / f"out-{size}", args.style, batch), "size": size}
                print(f"  {result['import']}: {result['seconds']:.1f} s, peak {_mb(result['peak_kb'])} MB", flush=True)
                results.append(result)
                files[size]["reasons"] = result["reasons"]
            path.unlink()
    write_json(args.out, {"date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "command": command,
                          "runs": results, "files": {str(size): f for size, f in files.items()}})
    atomic_write_text(args.out, report(args, command, results, files, plot(results, args.out)))
    print(f"wrote {args.out}")


def plot(results: list[dict], out: str) -> str:
    """Seconds and peak RSS against rows, one line per import, log-log; the markdown line that shows it."""
    fig, (time_ax, memory_ax) = figure_axes(2)
    for label in sorted({r["import"] for r in results}):
        runs = sorted((r for r in results if r["import"] == label), key=lambda r: r["rows"])
        rows = [r["rows"] for r in runs]
        time_ax.plot(rows, [r["seconds"] for r in runs], marker="o", label=label)
        memory_ax.plot(rows, [r["peak_kb"] / 1024 for r in runs], marker="o", label=label)
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for ax, ylabel in ((time_ax, "seconds"), (memory_ax, "peak RSS MB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["rows"] for r in results}))
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers, not powers of ten
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("rows in the file")
        ax.set_ylabel(ylabel)
    time_ax.set_title("Import time", fontsize=10)
    memory_ax.set_title("Peak memory of the importing process", fontsize=10)
    time_ax.legend(fontsize=7)
    return save_figure(fig, out)


if __name__ == "__main__":
    main()
