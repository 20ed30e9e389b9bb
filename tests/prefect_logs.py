"""What a Prefect flow or task run logged, read back from the API (the test harness's server)."""

from __future__ import annotations

import logging
from typing import Callable, Literal


def run_and_read_logs(run: Callable[[], str], of: Literal["flow", "task"]) -> list[str]:
    """Call `run` (it returns the id of the flow or task run to read) with Prefect's run logger at INFO (conftest
    quiets Prefect to WARNING), send the records to the API, and return the messages that run logged."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTaskRunId
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger(f"prefect.{of}_runs")
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        run_id = run()
    finally:
        logger.setLevel(level)
    APILogHandler().flush()  # the run loggers send their records to the API in batches
    which = {"flow": {"flow_run_id": LogFilterFlowRunId(any_=[run_id])},
             "task": {"task_run_id": LogFilterTaskRunId(any_=[run_id])}}[of]
    with get_client(sync_client=True) as client:
        return [log.message for log in client.read_logs(LogFilter(**which))]
