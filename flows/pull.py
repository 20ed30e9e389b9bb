"""The deployments' pull step (prefect.yaml `pull:`): where a worker's flow run finds the repository.

Prefect's own `set_working_directory` with `directory: "{{ $RLHF_REPO_DIR }}"` resolves the variable when
`prefect deploy` runs, if it is set there: a deploy from a developer's checkout baked that path into every run, and
each Kubernetes pod (whose image has the repository at /opt/rlhf) failed before its flow loaded. Unset at deploy
time and at run time, the run failed on a flow file it could not find in the worker's temporary directory. This step
reads the variable where the flow runs, when it runs, and says what to do when it is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_DIR_ENV = "RLHF_REPO_DIR"


def enter_repo_dir() -> dict[str, str]:
    """chdir into $RLHF_REPO_DIR of the worker (or pod) running the flow; returns {"directory": it}."""
    directory = os.environ.get(REPO_DIR_ENV, "")
    if not directory:
        raise RuntimeError(f"{REPO_DIR_ENV} is not set where this flow run starts: start the worker as "
                           f"`{REPO_DIR_ENV}=<the repository> prefect worker start --pool rlhf` (infra/services.sh "
                           "and the image set it)")
    if not (Path(directory) / "flows" / "round.py").is_file():
        raise RuntimeError(f"{REPO_DIR_ENV}={directory} holds no checkout of this repository (no flows/round.py): "
                           "point it at the repository the worker runs the flows from")
    os.chdir(directory)
    return {"directory": directory}
