#!/usr/bin/env bash
# Shared mode on one machine: a Prefect server, a process worker and an MLflow server on 127.0.0.1.
#   bash infra/services.sh start    # prints the two environment variables to export
#   bash infra/services.sh status   # what runs where
#   bash infra/services.sh stop     # stops all three (and whatever they started)
# State lives under ./services/ (Prefect home, MLflow SQLite database and artifacts, logs, pids).
# MLFLOW_BACKEND_STORE_URI picks another MLflow database (e.g. postgresql://user@host/mlflow).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/.venv/bin
DIR=${RLHF_SERVICES_DIR:-$PWD/services}
# `status` and `stop` report the ports `start` used (kept in $DIR/ports), not this shell's defaults
if [[ "${1:-}" != start && -f "$DIR/ports" ]]; then source "$DIR/ports"; fi
PREFECT_PORT=${PREFECT_PORT:-4200}
MLFLOW_PORT=${MLFLOW_PORT:-5000}
MLFLOW_URI=http://127.0.0.1:$MLFLOW_PORT
export PREFECT_HOME=$DIR/prefect PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_DISABLE_TELEMETRY=true
export PREFECT_API_URL=http://127.0.0.1:$PREFECT_PORT/api

wait_for() {  # url seconds
  for _ in $(seq "$2"); do curl -fs "$1" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "services: $1 did not answer within $2 s (see $DIR/*.log)" >&2; return 1
}

launch() {  # name command...: in its own session (process group), so stop reaches its children too
  local name=$1; shift
  setsid nohup "$@" >"$DIR/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/$name.pid"
  started_at $! >"$DIR/$name.start"
}

# pid: when it started (ticks since boot, /proc/PID/stat field 22); empty when it does not run
started_at() { [[ -r /proc/$1/stat ]] && sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f20; }

# pid file: the process started no later than its pid file was written (seconds since the epoch, to 1 s)
started_before() {
  local ticks boot hz; ticks=$(started_at "$1") || return 1
  [[ -n "$ticks" ]] || return 1
  boot=$(awk '/^btime/ {print $2}' /proc/stat); hz=$(getconf CLK_TCK)
  (( boot + ticks / hz <= $(stat -c %Y "$2") + 1 ))
}

# name: the pid file's process runs and is the one `launch` started: after a reboot or a crash the pid may be
# another process's, which `stop` would otherwise kill with its whole process group. A pid file without a start
# time (written by this script before it recorded them) is trusted when its process is older than the file.
alive() {
  [[ -f "$DIR/$1.pid" ]] || return 1
  local pid; pid=$(cat "$DIR/$1.pid")
  kill -0 "$pid" 2>/dev/null || return 1
  if [[ -f "$DIR/$1.start" ]]; then [[ "$(started_at "$pid")" == "$(cat "$DIR/$1.start")" ]]
  else started_before "$pid" "$DIR/$1.pid"; fi
}

in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }  # port: something accepts connections there

halt() {  # name: SIGTERM to its process group, SIGKILL after 15 s
  local name=$1 pid
  [[ -f "$DIR/$name.pid" ]] || return 0
  pid=$(cat "$DIR/$name.pid")
  if kill -0 "$pid" 2>/dev/null && ! alive "$name"; then
    echo "services: $name's pid $pid is another process now (started after ours): not stopped" >&2
  else  # ours, or its leader gone: a pid is not reused while its process group lives, so the group is ours
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$DIR/$name.pid" "$DIR/$name.start"
}

case "${1:-}" in
  start)
    mkdir -p "$DIR"
    for name in prefect mlflow worker; do
      alive "$name" && { echo "services: $name already runs (pid $(cat "$DIR/$name.pid")); stop first" >&2; exit 1; }
    done
    # a server already on a port would answer the health checks below for ours, which would have died at once
    for port in "$PREFECT_PORT" "$MLFLOW_PORT"; do
      in_use "$port" && { echo "services: port $port is in use (another Prefect or MLflow server?): stop it, or" \
        "choose free ports with PREFECT_PORT / MLFLOW_PORT" >&2; exit 1; }
    done
    printf 'PREFECT_PORT=%s\nMLFLOW_PORT=%s\n' "$PREFECT_PORT" "$MLFLOW_PORT" >"$DIR/ports"
    launch prefect "$BIN/prefect" server start --host 127.0.0.1 --port "$PREFECT_PORT"
    # the store's URI through the environment (mlflow server reads MLFLOW_BACKEND_STORE_URI), not the command line,
    # where `ps` would show a password in it to every user of the machine
    MLFLOW_BACKEND_STORE_URI=${MLFLOW_BACKEND_STORE_URI:-sqlite:///$DIR/mlflow.db} launch mlflow "$BIN/mlflow" server \
      --artifacts-destination "$DIR/mlartifacts" --host 127.0.0.1 --port "$MLFLOW_PORT"
    wait_for "$PREFECT_API_URL/health" 60
    "$BIN/prefect" work-pool inspect rlhf >/dev/null 2>&1 || "$BIN/prefect" work-pool create rlhf --type process >/dev/null
    wait_for "$MLFLOW_URI/health" 90
    for name in prefect mlflow; do  # answered, and by ours
      alive "$name" || { echo "services: $name exited (see $DIR/$name.log)" >&2; exit 1; }
    done
    # the worker's flow runs log to the MLflow server, not to a SQLite file in their workdir
    launch worker env MLFLOW_TRACKING_URI="$MLFLOW_URI" RLHF_REPO_DIR="$PWD" "$BIN/prefect" worker start --pool rlhf
    echo "export PREFECT_API_URL=$PREFECT_API_URL"
    echo "export MLFLOW_TRACKING_URI=$MLFLOW_URI"
    echo "deploy with: $BIN/prefect --no-prompt deploy --all"
    echo "UIs: Prefect http://127.0.0.1:$PREFECT_PORT, MLflow $MLFLOW_URI/#/experiments?workflowType=machine_learning"
    ;;
  status)
    for name in prefect mlflow worker; do
      if alive "$name"; then echo "$name: running (pid $(cat "$DIR/$name.pid"), log $DIR/$name.log)"
      else echo "$name: stopped"; fi
    done
    echo "Prefect API $PREFECT_API_URL, MLflow $MLFLOW_URI"
    ;;
  stop)
    for name in worker prefect mlflow; do halt "$name"; done
    ;;
  *) echo "usage: $0 start|status|stop" >&2; exit 2 ;;
esac
