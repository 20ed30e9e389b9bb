"""The benchmarks/ suite in one command (issue 12): every benchmark in turn, then which wrote what.

    .venv/bin/python benchmarks/run_all.py [--only NAME ...] [--smoke [--out-dir DIR]]

Default size: each script with its own defaults, results in docs/ (hours on 2 cores: reward_modelling,
ppo_max and hh_rlhf_trained_trunk take about an hour each; trl_reward needs the `bench` extra, trl_ppo TRL 1.12
in .bench/ (see its docstring), the two HH-RLHF ones the pairs file under ../shared/data and the `test` extra's
MiniLM).
--smoke: every benchmark at its minimal size, the same code end to end: the round benchmarks share one
miniature round (configs/mini.yaml, seed 0, kept in DIR/rounds, so only the first runs its stages), the
HH-RLHF and TRL ones read a few synthetic pairs; everything is written under --out-dir (default: a new
temporary directory), never docs/. tests/test_benchmarks_smoke.py runs the same arguments in-process.
Each benchmark runs as its own process; a failing one is reported and the suite goes on. Every benchmark writes a
JSON result and a figure beside its report (same name, .json and .png; `result_files.py`, or the script's own
`plot`); reward_backbone_depth, a one-run probe with no markdown report, writes both into its work dir.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "configs" / "mini.yaml"
HH_PAIRS = ROOT.parent / "shared/data/hh-rlhf-harmless-base/pairs.jsonl.gz"
SMOKE_HH_PAIRS = 20  # synthetic HH-RLHF pairs: an 80/20 split leaves 4 held out
SMOKE_LABEL_SOURCES = ("baseline", "gold", "flip_paper_ls0.1", "v2:drop0.2@weighted+e1",  # every part of a source name
                       "flip2oof_paper", "round",  # a second vote, the round's own denoising
                       "flip_sym_simcse")  # a changed nested config (the contrastive loss)
SMOKE_PPO_RUNS = ("ppo-max", "vanilla", "no KL, baseline RM", "vanilla, weak RM",  # every reward model, both presets
                  "no KL, noisy-label denoised RM, policy lr 1e-4")

# name -> the arguments of its default-size run (docs/ outputs are each script's defaults)
DEFAULTS = {
    "sampling_select": [],
    "generation_throughput": [],
    "annotation_import": [],
    "demo_round": [],
    "orchestration_overhead": [],
    "stage_scaling": [],
    "reward_modelling": [],
    "voting_modes": [],
    "reward_read": [],
    "reward_ensemble": [],
    "reward_label_sources": [],
    "reward_backbone_depth": ["--layers", "4"],  # the run docs/reward-modelling.md quotes
    "reward_data_budget": [],
    "reward_holdout": [],
    "metarm_shift": [],
    "iterated_rounds": [],
    "ppo_max": [],
    "hh_rlhf_voting": ["--pairs", str(HH_PAIRS)],
    "hh_rlhf_trained_trunk": ["--pairs", str(HH_PAIRS)],
    "trl_reward": [],
    "shared_prompt": [],
    "trl_ppo": [],
    "scale_out": [],
}


def write_hh_pairs(path: Path, n: int) -> Path:
    """n HH-RLHF-style pairs (gzipped JSONL): dialogues sharing every turn but the last Assistant reply."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i in range(n):
            prompt = f"\n\nHuman: What is {i} plus {i}?\n\nAssistant:"
            f.write(json.dumps({"chosen": f"{prompt} It is {2 * i}.", "rejected": f"{prompt} No idea."}) + "\n")
    return path


def smoke_argv(name: str, out: Path) -> list[str]:
    """The arguments of `name` at its minimal size, writing under out/<name> (out/rounds: the shared round,
    out/hh-pairs.jsonl.gz: the synthetic pairs, written by `smoke_inputs`)."""
    own, rounds, hh = out / name, out / "rounds", str(out / "hh-pairs.jsonl.gz")
    seed0_round = ["--seeds", "0", "--config", str(MINI), "--rounds-dir", str(rounds), "--work-dir", str(own)]
    return {
        "sampling_select": ["--n-prompts", "2000", "--n-tags", "60", "--budget", "100", "--min-tag-count", "2",
                            "--fuzzy", "--out", str(own / "benchmark-sampling.md")],
        "generation_throughput": ["--prompts", "8", "--max-new-tokens", "4", "--repeats", "1",
                                  "--out", str(own / "benchmark-generation.md")],
        "annotation_import": ["--sizes", "200,400", "--in-memory-sizes", "200", "--stage-sizes", "400",
                              "--batch-rows", "100", "--out", str(own / "benchmark-annotation-import.md")],
        "demo_round": ["--config", str(MINI), "--workdir", str(rounds / "round-seed0"),
                       "--out", str(own / "demo-timing.md")],
        "orchestration_overhead": ["--config", str(MINI), "--repeats", "1", "--json",
                                   str(own / "orchestration-overhead.json"), "--doc", str(own / "benchmarks.md")],
        "stage_scaling": ["--config", str(MINI), "--factors", "1", "2", "--json", str(own / "stage-scaling.json"),
                          "--doc", str(own / "benchmarks.md")],
        "reward_modelling": [*seed0_round, "--out", str(own / "reward-modelling-benchmark.md")],
        "voting_modes": ["--seed", "0", "--config", str(MINI), "--rounds-dir", str(rounds), "--repeats", "2",
                         "--json", str(own / "benchmarks-voting.json"), "--doc", str(own / "benchmarks.md")],
        "reward_read": [*seed0_round, "--out", str(own / "reward-read-benchmark.md")],
        "reward_ensemble": [*seed0_round, "--members", "2", "--gold-members", "2",
                            "--out", str(own / "reward-ensemble.md")],
        "reward_label_sources": [*seed0_round, "--model-seeds", "0", "1", "--sources", *SMOKE_LABEL_SOURCES,
                                 "--out", str(own / "reward-label-sources.md")],
        "reward_backbone_depth": ["--layers", "1", "--seed", "0", "--config", str(MINI), "--rounds-dir", str(rounds),
                                  "--work-dir", str(own)],  # 1 layer: configs/mini.yaml's own, so the shared round
        "reward_data_budget": [*seed0_round, "--variants", "demo", "flip-type noise",
                               "--out", str(own / "reward-data-budget.md")],
        "reward_holdout": [*seed0_round, "--fraction", "0.3", "--out", str(own / "reward-holdout.md")],
        "metarm_shift": [*seed0_round, "--etas", "0.1", "--eval-samples", "2", "--out", str(own / "metarm-shift.md")],
        "ppo_max": [*seed0_round, "--runs", *SMOKE_PPO_RUNS, "--out", str(own / "ppo-max-benchmark.md")],
        "iterated_rounds": [*seed0_round, "--out", str(own / "iterated-rounds.md")],  # round 2 after the shared one
        "hh_rlhf_voting": ["--pairs", hh, "--seeds", "0", "--steps", "20", "--out", str(own / "hh-rlhf-voting.md")],
        "hh_rlhf_trained_trunk": ["--pairs", hh, "--seeds", "0", "--work-dir", str(own),
                                  "--out", str(own / "hh-rlhf-trained-trunk.md")],
        "trl_reward": ["--pairs-file", hh, "--pairs", "16", "--repeats", "1", "--hidden-size", "32", "--layers", "1",
                       "--max-length", "64", "--json", str(own / "benchmarks-trl-reward.json"),
                       "--doc", str(own / "benchmarks.md"), *trl_contenders()],
        "shared_prompt": ["--pairs-file", hh, "--pairs", "16", "--max-length", "64", "--hidden-size", "32", "--layers", "1",
                          "--group-rows", "4", "--repeats", "1", "--seed", "0", "--config", str(MINI), "--rounds-dir",
                          str(rounds), "--work-dir", str(own), "--out", str(own / "shared-prompt.md")],
        "trl_ppo": ["--iterations", "2", "--rows", "4", "--mini-batch-size", "2", "--new-tokens", "4", "--hidden-size",
                    "32", "--layers", "1", "--repeats", "1", "--json", str(own / "benchmarks-trl-ppo.json"),
                    "--doc", str(own / "benchmarks.md")],  # TRL's contender only where .bench/trl-1.12.0 is
        "scale_out": ["--json", str(own / "scale-out.json"), "--doc", str(own / "scale-out.md"),
                      "--figure", str(own / "figures" / "scale-out-ppo.png")],  # a model on paper: its size is fixed
    }[name]


def trl_contenders() -> list[str]:
    """No --contenders where TRL (the `bench` extra) is installed; else the project's own contenders only."""
    if importlib.util.find_spec("trl") is not None:
        return []
    from trl_reward import PROJECT

    return ["--contenders", *PROJECT]


def smoke_inputs(out: Path) -> None:
    """What the smoke arguments need besides the repo: the synthetic HH-RLHF pairs, a folder per benchmark."""
    for name in DEFAULTS:
        (out / name).mkdir(parents=True, exist_ok=True)
    write_hh_pairs(out / "hh-pairs.jsonl.gz", SMOKE_HH_PAIRS)


def files_under(folder: Path) -> dict[Path, float]:
    """Every file under `folder` with its modification time."""
    return {p: p.stat().st_mtime for p in folder.rglob("*") if p.is_file()} if folder.exists() else {}


def run(name: str, argv: list[str], watched: Path) -> tuple[int, float, list[Path]]:
    """Run one benchmark as its own process: (exit code, seconds, files under `watched` it created or changed)."""
    before = files_under(watched)
    start = time.time()
    code = subprocess.call([sys.executable, str(Path(__file__).parent / f"{name}.py"), *argv], cwd=ROOT)
    after = files_under(watched)
    return code, time.time() - start, sorted(p for p, t in after.items() if before.get(p) != t)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(DEFAULTS), metavar="NAME",
                        help=f"these benchmarks only, in the suite's order: {', '.join(DEFAULTS)}")
    parser.add_argument("--smoke", action="store_true", help="minimal size, outputs under --out-dir")
    parser.add_argument("--out-dir", type=Path, default=None, help="--smoke's outputs (default: a new temporary dir)")
    args = parser.parse_args(argv)
    names = [name for name in DEFAULTS if not args.only or name in args.only]
    if args.smoke:
        out = (args.out_dir or Path(tempfile.mkdtemp(prefix="benchmarks-smoke-"))).resolve()
        smoke_inputs(out)
        plan = {name: (smoke_argv(name, out), out / name) for name in names}  # the shared round left out
    else:
        plan = {name: (DEFAULTS[name], ROOT / "docs") for name in names}
    failed = []
    for name, (bench_argv, watched) in plan.items():
        print(f"== {name}: {' '.join(bench_argv)}", flush=True)
        code, seconds, wrote = run(name, bench_argv, watched)
        if code:
            failed.append(name)
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"== {name}: {status} in {seconds:.0f} s; wrote: " + (", ".join(map(str, wrote)) or "nothing"),
              flush=True)
    print(f"{len(plan) - len(failed)} of {len(plan)} benchmarks ok" + (f"; failed: {', '.join(failed)}" if failed
                                                                        else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
