"""Prefect's local API for a command-line round, started as the process starts, beside the round's imports.

Without PREFECT_API_URL, Prefect starts an ephemeral API server (a uvicorn subprocess) at a flow's first call and
waits for it (~5 s on 2 cores). Its launcher, `SubprocessASGIServer`, lives in `prefect.server`, whose import costs
the launching process ~3 s of CPU for nothing but the launch (docs/benchmarks.md, "Orchestration overhead").
`start_local_api` launches the same server the same way (Prefect's app factory under uvicorn, in ephemeral mode,
no UI, the process's settings passed on) without importing `prefect.server`, and points this process's Prefect
settings at it: the flow then runs on it as on any configured server. The server stops when the process exits,
also when it is killed (Linux).
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from rlhf_core.workers import die_with_parent

log = logging.getLogger("rlhf")
START_ATTEMPTS = 3  # a server that exits at once is launched again, this many times in all
_started: LocalAPI | None = None  # the local API this process launched, if it did


class LocalAPIError(RuntimeError):
    """Prefect's local API did not come up, or the server PREFECT_API_URL names does not answer."""


class LocalAPI:
    """One uvicorn process serving `prefect.server.api.server:create_app` on 127.0.0.1 (as Prefect's ephemeral mode
    runs it: PREFECT__SERVER_EPHEMERAL=1, the UI off)."""

    def __init__(self) -> None:
        self.port = 0
        self.process: subprocess.Popen | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def launch(self) -> None:
        import prefect
        from prefect.settings import get_current_settings

        # the port is bound here and the listening socket handed to uvicorn (--fd): no other server can take it
        # between its choice and uvicorn's start, and answer the health check for ours
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        listener.set_inheritable(True)
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
               **get_current_settings().to_environment_variables(exclude_unset=True)}
        env.pop("PREFECT_API_URL", None)  # a relaunch: this process already points at the port that failed
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parents[1]), "--factory",
                 "prefect.server.api.server:create_app", "--fd", str(listener.fileno()), "--log-level", "error",
                 "--lifespan", "on"], env=env, pass_fds=(listener.fileno(),),
                preexec_fn=die_with_parent if sys.platform == "linux" else None)
        finally:
            listener.close()  # the server holds its own copy

    def wait_healthy(self, timeout_s: float) -> None:
        """Until /api/health answers 200; a server that exited early is launched again."""
        deadline, attempts = time.monotonic() + timeout_s, 1
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if attempts == START_ATTEMPTS:
                    break
                attempts += 1
                self.launch()
                _point_prefect_at(self.api_url)
                continue
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        code = self.process.poll()
        self.stop()
        state = (f"exited with code {code} (its error is above)" if code is not None
                 else f"no answer in {timeout_s:.0f} s")
        raise LocalAPIError(
            f"Prefect's local API on 127.0.0.1:{self.port} did not start: {state}. Start a Prefect server "
            "(bash infra/services.sh start) and set PREFECT_API_URL to it, or raise "
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS on a loaded machine.")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_local_api() -> Callable[[], None]:
    """Launch Prefect's local API now and point this process at it; returns the wait for it to answer (call it
    before the first flow: the launch returns at once, the server needs seconds). A no-op where PREFECT_API_URL
    names a server or Prefect's ephemeral API is turned off (PREFECT_SERVER_EPHEMERAL_ENABLED=false)."""
    from prefect.settings import (PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED,
                                  PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)

    if url := PREFECT_API_URL.value():
        check_prefect_api(url)
        return lambda: None
    if not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return lambda: None
    global _started
    server = _started = LocalAPI()
    server.launch()
    atexit.register(server.stop)
    _point_prefect_at(server.api_url)
    log.info("Prefect's local API starting on %s (set PREFECT_API_URL to use a long-lived server)", server.api_url)
    timeout_s = float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    return lambda: server.wait_healthy(timeout_s)


def check_prefect_api(api_url: str, timeout_s: float = 5.0) -> None:
    """Raise LocalAPIError when nothing answers at the configured Prefect API (any HTTP reply is an answer: a
    Prefect Cloud workspace may want its key for /health). Before, a server that was down failed the first flow
    call after ~20 s of retries, with a 430-line traceback."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise LocalAPIError(f"the Prefect API at {api_url} (PREFECT_API_URL) does not answer ({reason}): start it "
                            "(bash infra/services.sh start), or unset PREFECT_API_URL to run on a local API that "
                            "the command starts") from None


def runs_on_local_api() -> bool:
    """Whether this process's flows run on the local API it launched: that API and its run pages end with the
    process, so a link to them is dead once the command returns."""
    return _started is not None


def _point_prefect_at(api_url: str) -> None:
    """PREFECT_API_URL for this process (and its children) from now on. Prefect reads its settings into a global
    context at import: refreshing it makes the new value the one every later client, flow and task sees."""
    from prefect.context import refresh_global_settings_context

    os.environ["PREFECT_API_URL"] = api_url
    refresh_global_settings_context()
