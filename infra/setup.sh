#!/usr/bin/env bash
# Set up a virtual environment in .venv with the project and its pinned dependencies.
#   bash infra/setup.sh           runtime only
#   bash infra/setup.sh --test    also pytest + hypothesis
# torch: a CUDA build where a GPU is present, else a CPU build (a local wheel where pip is set up
# with one, else PyTorch's CPU index; override with TORCH_INDEX_URL). Set TORCH_SPEC to change version.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VENV=${VENV:-.venv}
extras=""
[[ "${1:-}" == "--test" ]] && extras="[test]"

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip

if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') already installed"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "setup: GPU found, installing $TORCH_SPEC (CUDA build)"
  pip install -q "$TORCH_SPEC"
elif probe=$(mktemp -d) && pip download -q --no-index --no-deps -d "$probe" "$TORCH_SPEC" >/dev/null 2>&1 \
     && rm -rf "$probe"; then  # only asks whether pip has a local wheel: the copy (~180 MB) goes
  echo "setup: no GPU, installing $TORCH_SPEC from the local CPU wheel"
  pip install -q "$TORCH_SPEC"
else
  rm -rf "${probe:-}"
  echo "setup: no GPU, installing $TORCH_SPEC (CPU build)"
  pip install -q "$TORCH_SPEC" --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
fi

# constraints.txt pins every other package to versions tested together (torch stays as installed).
pip install -q -c constraints.txt -e ".$extras"
echo "setup: done ($("$VENV/bin/python" -c 'import torch, prefect, mlflow, transformers; print(f"torch {torch.__version__}, prefect {prefect.__version__}, mlflow {mlflow.__version__}, transformers {transformers.__version__}")'))"
