"""Prefect tasks: one per stage, each caching, tracking and storing what its rlhf_core algorithm makes."""

import os

# Offline by construction: MLflow reports usage to mlflow-telemetry.io from `import mlflow` on (a DNS lookup and an
# HTTPS request in every round). Every module of this project that imports mlflow is in this package, so this runs
# first; a user's own MLFLOW_DISABLE_TELEMETRY / DO_NOT_TRACK still wins.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
