#!/usr/bin/env bash
# Set up (as infra/setup.sh --test) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh --test
export PREFECT_SERVER_ANALYTICS_ENABLED=false
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
