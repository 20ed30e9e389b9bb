#!/usr/bin/env bash
# Shared mode on one machine: a Prefect server, a process worker and an MLflow server on 127.0.0.1.
#   bash infra/services.sh start    # prints the two environment variables to export
#   bash infra/services.sh stop
# State lives under ./services/ (Prefect home, MLflow SQLite database and artifacts, logs, pids).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
DIR=${RLHF_SERVICES_DIR:-$PWD/services}
PREFECT_PORT=${PREFECT_PORT:-4200}
MLFLOW_PORT=${MLFLOW_PORT:-5000}
export PREFECT_HOME=$DIR/prefect PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_API_URL=http://127.0.0.1:$PREFECT_PORT/api

wait_for() {  # url seconds
  for _ in $(seq "$2"); do curl -fs "$1" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "services: $1 did not answer within $2 s (see $DIR/*.log)" >&2; return 1
}

case "${1:-}" in
  start)
    mkdir -p "$DIR"
    nohup $BIN/prefect server start --host 127.0.0.1 --port "$PREFECT_PORT" >"$DIR/prefect.log" 2>&1 &
    echo $! >"$DIR/prefect.pid"
    nohup $BIN/mlflow server --backend-store-uri "sqlite:///$DIR/mlflow.db" --artifacts-destination "$DIR/mlartifacts" \
      --host 127.0.0.1 --port "$MLFLOW_PORT" >"$DIR/mlflow.log" 2>&1 &
    echo $! >"$DIR/mlflow.pid"
    wait_for "$PREFECT_API_URL/health" 60
    $BIN/prefect work-pool inspect rlhf >/dev/null 2>&1 || $BIN/prefect work-pool create rlhf --type process >/dev/null
    RLHF_REPO_DIR=$PWD nohup $BIN/prefect worker start --pool rlhf >"$DIR/worker.log" 2>&1 &
    echo $! >"$DIR/worker.pid"
    wait_for "http://127.0.0.1:$MLFLOW_PORT/health" 90
    echo "export PREFECT_API_URL=$PREFECT_API_URL"
    echo "export MLFLOW_TRACKING_URI=http://127.0.0.1:$MLFLOW_PORT"
    echo "deploy with: RLHF_REPO_DIR=$PWD $BIN/prefect --no-prompt deploy --all"
    ;;
  stop)
    for name in worker prefect mlflow; do
      [[ -f "$DIR/$name.pid" ]] && { kill "$(cat "$DIR/$name.pid")" 2>/dev/null || true; rm -f "$DIR/$name.pid"; }
    done
    ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
