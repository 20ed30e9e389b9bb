#!/usr/bin/env bash
# GPU smoke test of the stages that run as worker groups (generate, vote, reward, ppo): the round up to
# PPO on SmolLM2-135M-Instruct (configs/smollm2.yaml) with 1 GPU, with N GPUs, with N GPUs and DeepSpeed
# ZeRO-2 for the reward model and PPO, and with N GPUs and ZeRO-3 for both. Each run has its own workdir
# (num_processes and deepspeed are kept out of the cache key, so a shared workdir would serve the later runs
# from the cache; SmolLM2 has no dropout, which would key the reward stage on num_processes). PPO samples 8
# prompts per rollout in every run (each rank needs at least one: N <= 8).
# Not run in the tests: they have no GPU. See docs/workers.md.
#
#   bash infra/gpu-smoke.sh [N]     # N: GPUs for the multi-GPU runs, default: every GPU nvidia-smi lists
#
# Needs the converted model once: .venv/bin/rlhf convert-gguf --out rlhf-runs/models/smollm2-135m-instruct
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-$(nvidia-smi -L | wc -l)}
OUT=${OUT:-rlhf-runs/gpu-smoke}
mkdir -p "$OUT"

run() {  # run LABEL NUM_PROCESSES [--set KEY=VALUE ...]
    local label=$1 n=$2 start
    shift 2
    start=$(date +%s)
    if ! .venv/bin/rlhf stage ppo --config configs/smollm2.yaml --set "workdir=$OUT/$label" \
            --set voting.mode=faithful --set "generation.num_processes=$n" --set "voting.num_processes=$n" \
            --set "reward.num_processes=$n" --set "ppo.num_processes=$n" \
            --set ppo.rollout_prompts=8 "$@" > "$OUT/$label.log" 2>&1; then
        echo "$label: FAILED, last lines of $OUT/$label.log:"
        tail -n 30 "$OUT/$label.log"
        exit 1
    fi
    echo "$label: $(( $(date +%s) - start )) s, log $OUT/$label.log"
}

run "gpus-1" 1
run "gpus-$N" "$N"
run "gpus-$N-zero2" "$N" --set reward.deepspeed=zero2 --set ppo.deepspeed=zero2
run "gpus-$N-zero3" "$N" --set reward.deepspeed=zero3 --set ppo.deepspeed=zero3
echo "Compare the runs' reward/gold_accuracy_heldout, PPO's objective/* curves and world_size in MLflow (or the"
echo "logs): world sizes equal to N and close numbers say the worker groups ran data parallel (PPO's N-rank"
echo "run should match the 1-GPU run up to float summation order, docs/workers.md); the DeepSpeed runs log"
echo "execution.deepspeed in each stage's run."
