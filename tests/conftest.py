"""Test-wide isolation: Prefect and MLflow state live in a temp dir, never in ~/.prefect or the cwd."""

import os
import tempfile
from pathlib import Path

_ROOT = Path(tempfile.mkdtemp(prefix="rlhf-tests-"))
os.environ["PREFECT_HOME"] = str(_ROOT / "prefect")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"  # tests import mlflow before tasks/ does (it sets the same)
os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
os.environ.pop("PREFECT_API_URL", None)
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def prefect_api():
    """A real Prefect API (a temporary local server on a temp SQLite database), once per session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
