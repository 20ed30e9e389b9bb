"""Progress bars for long work: tqdm on a terminal, a plain line every LOG_SECONDS elsewhere.

Where stderr is not a terminal (a log file, a Prefect worker, a worker rank's pipe to the launcher, which copies
each line into the Prefect run's log) a redraw every 0.1 s is a line every 0.1 s: the demo's log was 535 kB, most
of it the SFT bar. There each refresh is written as its own line, at most one every LOG_SECONDS
(RLHF_PROGRESS_SECONDS overrides it), and the last one when the bar closes. Inside `lines_to(sink)` those lines go
to `sink` instead (a stage running in the Prefect process sends them to its run's log, as the launcher does with a
worker's lines; a bar on a terminal stays a bar).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO, Any, Callable, Iterator

from tqdm import tqdm

LOG_SECONDS = 30.0


_LINE_SINK: ContextVar[Callable[[str], None] | None] = ContextVar("rlhf_progress_line_sink", default=None)


@contextmanager
def lines_to(sink: Callable[[str], None]) -> Iterator[None]:
    """Within: the bars that are not on a terminal hand each line to `sink` rather than writing it."""
    token = _LINE_SINK.set(sink)
    try:
        yield
    finally:
        _LINE_SINK.reset(token)


class _Lines:
    """A file for tqdm that writes each redraw as one line (tqdm redraws with a carriage return), or hands it to
    `sink`."""

    def __init__(self, stream: IO[str], sink: Callable[[str], None] | None = None):
        self.stream, self.sink = stream, sink

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        if text and self.sink is not None:
            self.sink(text)
        elif text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def log_seconds() -> float:
    """RLHF_PROGRESS_SECONDS when it is a number > 0, else LOG_SECONDS."""
    try:
        seconds = float(os.environ.get("RLHF_PROGRESS_SECONDS", LOG_SECONDS))
    except ValueError:
        return LOG_SECONDS
    return seconds if seconds > 0 else LOG_SECONDS


def progress_bar(iterable: Any = None, *, stream: IO[str] | None = None, **kwargs: Any) -> tqdm:
    """tqdm(iterable, **kwargs) on a terminal; elsewhere the same bar as a line every LOG_SECONDS. Update its
    postfix with refresh=False, or every update is a redraw whatever the interval."""
    stream = stream or sys.stderr
    if not stream.isatty():
        seconds = log_seconds()
        kwargs = {"mininterval": seconds, "maxinterval": max(seconds, 10.0), "ncols": 100, "ascii": True,
                  **kwargs, "file": _Lines(stream, _LINE_SINK.get()), "leave": True}  # leave=False would end on a
        # cleared line
    return tqdm(iterable, **({"file": stream} | kwargs))
