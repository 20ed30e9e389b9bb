"""Process entry points launched by tasks (`python -m rlhf_core.workers.<name>`, or under accelerate / torchrun).

Each worker parses its arguments, does one job through rlhf_core, and writes its outputs to disk; no Prefect,
no MLflow. Importing this package imports nothing heavy.
"""

import os
import signal
import sys

if sys.platform == "linux":
    import ctypes

    _LIBC = ctypes.CDLL(None, use_errno=True)  # loaded now: a preexec_fn should do as little as it can after fork
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: this process gets `sig` when the thread that started it ends, its parent SIGKILLed included, so no
    launcher or rank outlives the round that started it (a SIGKILLed round left its voters training and writing into
    the scratch directory the next round resumes from). Called in the child: as Popen's preexec_fn, or first thing in
    a rank (whose parent, torch elastic's agent, may itself be SIGKILLed). Elsewhere a no-op."""
    if sys.platform != "linux":
        return
    parent = os.getppid()  # not "is it 1": in a container the round itself may be pid 1
    _LIBC.prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:  # the parent died before the line above: the signal would never come
        os.kill(os.getpid(), sig)
