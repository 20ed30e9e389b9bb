"""PPO steps, the project's `train_ppo` against TRL 1.12's PPOTrainer (issue 12, third goal).

    .venv/bin/pip install --no-deps --target .bench/trl-1.12.0 trl==1.12.0   # TRL's last PPO, benchmarks only
    .venv/bin/python benchmarks/trl_ppo.py [--iterations 4] [--repeats 3] [--hidden-size 64] [--layers 2]
        [--json docs/benchmarks-trl-ppo.json] [--doc docs/benchmarks.md]

Writes the JSON (--json), a bar chart of the phases beside it (same name, .png) and its section of --doc.

TRL removed its PPOTrainer after 1.12 and the `bench` extra pins 1.16 (RewardTrainer), so TRL 1.12 is installed
beside it into .bench/trl-1.12.0 (its dependencies are the project's own) and the TRL contender runs in a
subprocess with that folder first on its path. Every contender runs in a fresh subprocess, the order rotated
each repeat; the result is the median seconds per PPO iteration and its ratio to TRL.

Same on both sides: the tiny Qwen2 policy (the round's `policy_model` shape unless --hidden-size/--layers say
otherwise, random weights, saved once), the byte tokenizer, the simulated world's prompts, 64 rows per rollout
(32 prompts x 2 responses; TRL gets each prompt twice), 24 new tokens at temperature 1, 2 PPO epochs over
minibatches of 16, one optimiser step per minibatch, fp32, KL coefficient 0.05, learning rate 1e-5. The reward
model is the policy's trunk with a scalar head read at the last token (`read: end_token`, TRL's own reward read),
and the critic/value model starts from it on both sides. Contenders:

- project: `train_ppo` with the round's PPO-max switches, critic warm-up off (so every iteration trains both
  models, as TRL's does), top-p 1.0 (TRL samples with top-p 1.0);
- project_top_p_0.9: the same with the round's top-p 0.9 (Qwen's);
- trl: `trl.experimental.ppo.PPOTrainer` (fp32, no gradient checkpointing: its fastest setting on a CPU).

The breakdown of each iteration is measured by wrapping the loop's own functions, not by copying them:
generation (`sample_batch` / TRL's `batch_generation`), scoring (the rest of the rollout: policy, reference,
critic and reward forwards; TRL's `forward`/`get_reward` calls without gradients), training (`update` / the rest
of TRL's loop). TRL reuses generation's logits as the policy's log-probs; the project runs a policy forward
after sampling (counted in scoring).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

TRL_VERSION = "1.12.0"
TRL_TARGET = REPO / ".bench" / f"trl-{TRL_VERSION}"
TRL_INSTALL = f".venv/bin/pip install --no-deps --target .bench/trl-{TRL_VERSION} trl=={TRL_VERSION}"
CONTENDERS = ("project", "project_top_p_0.9", "trl")
GOAL_RATIO = 1.5  # issue 12: PPO step >= 1.5x TRL's PPOTrainer
SECTION_START = "<!-- trl_ppo:start -->"
SECTION_END = "<!-- trl_ppo:end -->"


class Timers:
    """Seconds spent in named phases, accumulated by wrapping the loop's own functions (`when` filters calls),
    and a mark at the end of every iteration: (time, the phases' seconds so far)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.marks: list[tuple[float, float, dict[str, float]]] = []

    def mark(self, *_args, **_kwargs) -> None:
        self.marks.append((time.perf_counter(), time.process_time(), dict(self.seconds)))

    def steady_state(self) -> dict:
        """Seconds per iteration after the first (which pays one-off costs: lazy imports, allocator warm-up),
        split into generation, scoring and training (the rest of the iteration: advantages and the update)."""
        (t_first, cpu_first, first), (t_last, cpu_last, last) = self.marks[0], self.marks[-1]
        n = len(self.marks) - 1
        per_iteration = {name: (last.get(name, 0.0) - first.get(name, 0.0)) / n for name in ("generation", "scoring")}
        total = (t_last - t_first) / n
        return {"seconds_per_iteration": total, "cpu_seconds_per_iteration": (cpu_last - cpu_first) / n,
                "phases": per_iteration | {
            "training": total - per_iteration["generation"] - per_iteration["scoring"]}}

    def wrap(self, name: str, fn, when=lambda: True):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if not when():
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
        return timed


# ---------------------------------------------------------------- the shared setup (parent process)


def build_models(work_dir: Path, hidden_size: int, layers: int, seed: int) -> None:
    """The policy (random tiny Qwen2 + byte tokenizer) and a reward model on its trunk, as HF directories."""
    from rlhf_core import models
    from rlhf_core.config import PolicyModelConfig
    from rlhf_core.reward.model import RewardModel

    tokenizer = models.build_tokenizer()
    cfg = PolicyModelConfig(hidden_size=hidden_size, intermediate_size=3 * hidden_size, num_hidden_layers=layers,
                            max_position_embeddings=256)
    models.save_hf(models.build_policy(cfg, tokenizer, seed=seed), tokenizer, work_dir / "policy")
    RewardModel.from_policy(work_dir / "policy", seed=seed, read="end_token").save(work_dir / "reward", tokenizer)


def world_prompts(n: int, seed: int) -> list[str]:
    from rlhf_core.sim.world import make_prompt_pool

    return make_prompt_pool(n, seed)["prompt"].tolist()


# ---------------------------------------------------------------- one contender (child process)


def run_project(spec: dict, top_p: float) -> dict:
    import torch

    from rlhf_core.config import PPOConfig
    from rlhf_core.ppo import trainer
    from rlhf_core.ppo.scoring import reward_scorer

    work_dir = Path(spec["work_dir"])
    cfg = PPOConfig(iterations=spec["iterations"], rollout_prompts=spec["rows"] // 2, responses_per_prompt=2,
                    mini_batch_size=spec["mini_batch_size"], ppo_epochs=2, max_new_tokens=spec["new_tokens"],
                    temperature=1.0, top_p=top_p, kl_coef=spec["kl_coef"], policy_lr=spec["lr"],
                    critic_warmup_steps=0)
    timers = Timers()
    generation_only = trainer.sample_batch
    trainer.sample_batch = timers.wrap("generation", generation_only)
    rollout = timers.wrap("rollout", trainer.rollout)

    def timed_rollout(*args, **kwargs):  # scoring = the rollout without its sampling
        result = rollout(*args, **kwargs)
        timers.seconds["scoring"] = timers.seconds["rollout"] - timers.seconds["generation"]
        return result

    trainer.rollout = timed_rollout
    t0, cpu0 = time.perf_counter(), time.process_time()
    reward_fn = reward_scorer(work_dir / "reward", max_length=256)
    _, _, history = trainer.train_ppo(work_dir / "policy", reward_fn, spec["prompts"], cfg, seed=spec["seed"],
                                      critic_init_dir=work_dir / "reward", on_iteration=timers.mark)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, **timers.steady_state(),
            "torch_threads": torch.get_num_threads(), "iterations": len(history), "final_kl": history[-1]["objective/kl"]}


def run_trl(spec: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, TrainerCallback

    import trl
    from rlhf_core import models
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl.experimental.ppo import ppo_trainer as trl_loop

    if trl.__version__ != TRL_VERSION:
        raise RuntimeError(f"TRL {trl.__version__} imported, {TRL_VERSION} wanted: {TRL_INSTALL}")
    work_dir = Path(spec["work_dir"])
    timers = Timers()
    no_grad = lambda: not torch.is_grad_enabled()  # noqa: E731  (the rollout's forwards, not the update's)
    trl_loop.batch_generation = timers.wrap("generation", trl_loop.batch_generation)
    trl_loop.forward = timers.wrap("scoring", trl_loop.forward, when=no_grad)
    trl_loop.get_reward = timers.wrap("scoring", trl_loop.get_reward, when=no_grad)

    t0, cpu0 = time.perf_counter(), time.process_time()
    tokenizer = models.load_tokenizer(work_dir / "policy")
    tokenizer.padding_side = "left"  # TRL generates from left-padded queries
    queries = [models.format_query(tokenizer, p) for p in spec["prompts"] for _ in range(2)]  # 2 responses each
    dataset = Dataset.from_dict({"input_ids": [tokenizer(q, add_special_tokens=False)["input_ids"] for q in queries]})
    rows = spec["rows"]
    args = PPOConfig(
        output_dir=str(work_dir / "trl-out"), per_device_train_batch_size=rows, gradient_accumulation_steps=1,
        num_mini_batches=rows // spec["mini_batch_size"], num_ppo_epochs=2, total_episodes=rows * spec["iterations"],
        local_rollout_forward_batch_size=rows, response_length=spec["new_tokens"], temperature=1.0,
        stop_token="eos", kl_coef=spec["kl_coef"], learning_rate=spec["lr"], num_sample_generations=0,
        bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=True, report_to="none", save_strategy="no",
        disable_tqdm=True, seed=spec["seed"], dataloader_num_workers=0)
    trainer = PPOTrainer(
        args=args, processing_class=tokenizer,
        model=AutoModelForCausalLM.from_pretrained(work_dir / "policy", dtype=torch.float32),
        ref_model=AutoModelForCausalLM.from_pretrained(work_dir / "policy", dtype=torch.float32),
        reward_model=AutoModelForSequenceClassification.from_pretrained(work_dir / "reward", dtype=torch.float32),
        value_model=AutoModelForSequenceClassification.from_pretrained(work_dir / "reward", dtype=torch.float32),
        train_dataset=dataset, eval_dataset=dataset.select(range(rows)),
        callbacks=[type("Marks", (TrainerCallback,), {"on_step_end": lambda self, *a, **k: timers.mark()})()])
    trainer.train()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    kl = [entry["objective/kl"] for entry in trainer.state.log_history if "objective/kl" in entry]
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, **timers.steady_state(),
            "torch_threads": torch.get_num_threads(), "iterations": trainer.state.global_step,
            "final_kl": kl[-1] if kl else None}


def run_child(name: str, spec_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    if name == "trl":
        result = run_trl(spec)
    else:
        result = run_project(spec, top_p=0.9 if name == "project_top_p_0.9" else 1.0)
    Path(spec["work_dir"], f"result-{name}.json").write_text(json.dumps(result))


def spawn(name: str, spec_path: Path, work_dir: Path) -> dict:
    """Run one contender in a fresh Python; TRL's with TRL 1.12 first on its path."""
    env = dict(os.environ, TRL_EXPERIMENTAL_SILENCE="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    if name == "trl":
        env["PYTHONPATH"] = os.pathsep.join([str(TRL_TARGET), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = work_dir / f"result-{name}.json"
    out.unlink(missing_ok=True)
    subprocess.run([sys.executable, __file__, "--child", name, "--spec", str(spec_path)], env=env, check=True)
    return json.loads(out.read_text())


def trl_available() -> bool:
    return (TRL_TARGET / "trl" / "experimental" / "ppo").is_dir()


# ---------------------------------------------------------------- the benchmark (parent process)


def run_benchmark(args) -> dict:
    contenders = [c for c in args.contenders if c != "trl" or trl_available()]
    skipped = [c for c in args.contenders if c not in contenders]
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    with tempfile.TemporaryDirectory(prefix="trl-ppo-") as tmp:
        work_dir = Path(tmp)
        build_models(work_dir, args.hidden_size, args.layers, args.seed)
        prompts = world_prompts(args.rows // 2 * args.iterations, args.seed)
        spec = {"work_dir": str(work_dir), "prompts": prompts, "rows": args.rows, "iterations": args.iterations,
                "mini_batch_size": args.mini_batch_size, "new_tokens": args.new_tokens, "kl_coef": 0.05,
                "lr": 1e-5, "seed": args.seed}
        spec_path = work_dir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        for repeat in range(args.repeats):
            shift = repeat % len(contenders)
            for name in contenders[shift:] + contenders[:shift]:  # rotated: no contender always runs first
                run = spawn(name, spec_path, work_dir)
                runs[name].append(run)
                print(f"repeat {repeat}: {name:18s} {run['seconds']:7.2f} s  "
                      + "  ".join(f"{k} {v:.2f}" for k, v in run["phases"].items()), flush=True)
    median = {name: statistics.median(r["seconds_per_iteration"] for r in runs[name]) for name in contenders}
    phases = {name: {phase: statistics.median(r["phases"][phase] for r in runs[name])
                     for phase in ("generation", "scoring", "training")} for name in contenders}
    cpu = {name: statistics.median(r["cpu_seconds_per_iteration"] for r in runs[name]) for name in contenders}
    whole_run = {name: statistics.median(r["seconds"] for r in runs[name]) for name in contenders}
    ratio = {name: median["trl"] / median[name] for name in contenders if name != "trl"} if "trl" in median else {}
    return {
        "benchmark": "trl_ppo",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"cpus": os.cpu_count(), "arch": platform.machine(), "python": platform.python_version(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "load_average_at_start": args.load_at_start,
                    "trl": TRL_VERSION if "trl" in contenders else None},
        "command": shlex.join(["python", "benchmarks/trl_ppo.py", *args.argv]),
        "setup": {"rows_per_rollout": args.rows, "iterations": args.iterations, "mini_batch_size": args.mini_batch_size,
                  "ppo_epochs": 2, "new_tokens": args.new_tokens, "hidden_size": args.hidden_size,
                  "layers": args.layers, "repeats": args.repeats, "seed": args.seed, "dtype": "float32"},
        "skipped": {name: f"TRL {TRL_VERSION} is not installed: {TRL_INSTALL}" for name in skipped},
        "runs": runs,
        "median_seconds_per_iteration": median,
        "median_phase_seconds_per_iteration": phases,
        "median_cpu_seconds_per_iteration": cpu,
        "median_seconds_per_run": whole_run,
        "speedup_vs_trl": ratio,
        "cpu_speedup_vs_trl": {name: cpu["trl"] / cpu[name] for name in ratio},
        "goal_ratio": GOAL_RATIO,
        "notes": args.note or [],
    }


def plot(result: dict, path: Path) -> None:
    """Seconds per iteration per contender, stacked by phase (generation, scoring, training), TRL's total marked
    and the goal's line (TRL's total / the goal ratio: a contender whose bar ends left of it meets the goal)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["median_seconds_per_iteration"])
    phases = result["median_phase_seconds_per_iteration"]
    fig, ax = plt.subplots(figsize=(7, 0.7 * len(names) + 1.6))
    left = [0.0] * len(names)
    for phase, colour in (("generation", "tab:blue"), ("scoring", "tab:orange"), ("training", "tab:green")):
        widths = [phases[n][phase] for n in names]
        ax.barh(names, widths, left=left, color=colour, label=phase)
        left = [a + b for a, b in zip(left, widths)]
    if "trl" in result["median_seconds_per_iteration"]:
        goal = result["median_seconds_per_iteration"]["trl"] / result["goal_ratio"]
        ax.axvline(goal, color="k", ls=":", lw=1, label=f"goal: TRL / {result['goal_ratio']:g}")
    ax.invert_yaxis()
    ax.set_xlabel("seconds per PPO iteration (median, steady state)")
    ax.set_title(f"PPO step vs TRL {result['machine'].get('trl') or ''} ({result['date']})", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown_section(result: dict) -> str:
    setup, machine = result["setup"], result["machine"]
    lines = [
        SECTION_START,
        "## PPO steps vs TRL's PPOTrainer (issue 12's PPO goal; written by `benchmarks/trl_ppo.py`)",
        "",
        f"Measured {result['date']}, {machine['cpus']} cores ({machine['arch']}), OMP_NUM_THREADS="
        f"{machine['omp_num_threads']}, load average {machine['load_average_at_start']:.1f} at the start: "
        f"`{result['command']}`. Tiny Qwen2 (hidden {setup['hidden_size']}, {setup['layers']} layers, byte "
        f"tokenizer), {setup['rows_per_rollout']} rows per rollout, {setup['new_tokens']} new tokens, "
        f"{setup['ppo_epochs']} PPO epochs over minibatches of {setup['mini_batch_size']}, fp32, "
        f"{setup['iterations']} iterations per run, median of {setup['repeats']} runs per contender (each in a fresh "
        "process, order rotated). Per iteration: the steady state, iterations 2 to the last (the first pays one-off "
        "costs, e.g. TRL's lazy import of DeepSpeed); a whole run, start-up and model loading included, beside it.",
        "",
        "| contender | s / iteration | generation | scoring | training | CPU s / iteration | speed-up vs TRL "
        "| CPU speed-up | whole run, s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, seconds in result["median_seconds_per_iteration"].items():
        phases = result["median_phase_seconds_per_iteration"][name]
        speedup, cpu_speedup = result["speedup_vs_trl"].get(name), result["cpu_speedup_vs_trl"].get(name)
        lines.append(f"| {name} | {seconds:.2f} | {phases['generation']:.2f} | {phases['scoring']:.2f} | "
                     f"{phases['training']:.2f} | {result['median_cpu_seconds_per_iteration'][name]:.2f} | "
                     + (f"{speedup:.2f}x | {cpu_speedup:.2f}x" if speedup else "– | –")
                     + f" | {result['median_seconds_per_run'][name]:.1f} |")
    for name, why in result["skipped"].items():
        lines.append(f"| {name} | not run: {why} | | | | | | | |")
    speedup = result["speedup_vs_trl"].get("project")
    if speedup is not None:
        verdict = "met" if speedup >= result["goal_ratio"] else f"missed by {result['goal_ratio'] - speedup:.2f}x"
        lines += ["", f"Goal: the project's PPO step >= {result['goal_ratio']}x TRL's, like for like (top-p 1.0): "
                      f"{speedup:.2f}x wall, {result['cpu_speedup_vs_trl']['project']:.2f}x CPU; {verdict}."]
    if result.get("figure"):
        lines += ["", f"![seconds per PPO iteration by phase]({result['figure']})"]
    lines += [f"- {note}" for note in result["notes"]]
    lines.append(SECTION_END)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=4, help="PPO iterations (rollout + update) per run")
    parser.add_argument("--rows", type=int, default=64, help="rows per rollout: half as many prompts x 2 responses")
    parser.add_argument("--mini-batch-size", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--hidden-size", type=int, default=64, help="the round's policy_model.hidden_size")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--json", default="docs/benchmarks-trl-ppo.json")
    parser.add_argument("--doc", default="docs/benchmarks.md")
    parser.add_argument("--note", action="append", help="a remark on this run (the machine's load, ...); repeatable")
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)  # internal: run one contender
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_child(args.child, Path(args.spec))
        return None
    if args.rows % 2 or args.rows % args.mini_batch_size:
        parser.error("--rows must be even and a multiple of --mini-batch-size")
    if args.iterations < 2:
        parser.error("--iterations must be at least 2: the first iteration is start-up, the steady state is the rest")
    args.argv = sys.argv[1:] if argv is None else list(argv)
    args.load_at_start = os.getloadavg()[0]

    from doc_section import replace_section
    from rlhf_core.artifacts import atomic_write_text

    result = run_benchmark(args)
    figure = Path(args.json).with_suffix(".png")
    result["figure"] = os.path.relpath(figure, Path(args.doc).parent)  # as the section links it
    atomic_write_text(args.json, json.dumps(result, indent=2) + "\n")
    plot(result, figure)
    replace_section(Path(args.doc), markdown_section(result), SECTION_START, SECTION_END,
                    "# Benchmarks against TRL (issue 12)\n\n")
    print(json.dumps({"median_seconds_per_iteration": result["median_seconds_per_iteration"],
                      "speedup_vs_trl": result["speedup_vs_trl"]}))
    return result


if __name__ == "__main__":
    main()
