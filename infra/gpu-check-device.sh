#!/usr/bin/env bash
# The GPU check's one call on a lent GPU machine (docs/workers.md, "On GPUs"), from the repository root, with
# .gpu-inputs (`infra/gpu_check.py prepare`) and .whl (pydantic's four wheels for the image's Python 3.12) carried:
#
#   run(command="bash infra/gpu-check-device.sh", carry=[".gpu-inputs", ".whl"], timeout_s=540)
#
# It writes into $OUT: nvidia-smi.txt; gpu.json, the check on the default device (the GPU); cpu.json, the same
# check on that machine's CPU (CUDA_VISIBLE_DEVICES=), stopped after CPU_SECONDS; and each run's log. Each JSON
# is rewritten after every step, so a run stopped at a limit still returns the steps it finished.
# Here, to try it on the CPU (both runs then on the CPU):
#   OUT=/tmp/gpu-check PYTHON=.venv/bin/python VOTERS=2 PPO_ITERATIONS=8 bash infra/gpu-check-device.sh
set -uo pipefail

OUT=${OUT:-gpu-check-out}
PYTHON=${PYTHON:-python3}
VOTERS=${VOTERS:-4}
PPO_ITERATIONS=${PPO_ITERATIONS:-60}
CPU_SECONDS=${CPU_SECONDS:-240}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if ! "$PYTHON" -c "import pydantic" 2>/dev/null; then  # the GPU image has no pydantic: install the carried wheels
    [ -d .whl ] || { echo "pydantic is missing and no .whl was carried (docs/workers.md: the download command)"; exit 1; }
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
[ -d .gpu-inputs ] || { echo "no .gpu-inputs: make them here with infra/gpu_check.py prepare, and carry them"; exit 1; }
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true

check() {  # check NAME [env...]: one run of the check, its log beside its JSON, the JSON printed at the end
    local name=$1
    shift
    env "$@" "$PYTHON" infra/gpu_check.py run --inputs .gpu-inputs --out "$OUT/$name.json" --work "/tmp/gpu-check-$name" \
        --voters "$VOTERS" --ppo-iterations "$PPO_ITERATIONS" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc"
    [ -f "$OUT/$name.json" ] && cat "$OUT/$name.json" || tail -n 20 "$OUT/$name.log"
    return $rc
}

check gpu
gpu_rc=$?
check cpu CUDA_VISIBLE_DEVICES= timeout "$CPU_SECONDS"
exit $gpu_rc
