"""Progress bars: a redraw per update on a terminal; elsewhere (a log file, a worker's pipe into the Prefect
run's log) plain lines, at most one per interval, and the final count when the bar closes."""

import io

from rlhf_core.progress import progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_bar_writes_a_few_plain_lines_ending_with_the_final_count(monkeypatch):
    monkeypatch.setenv("RLHF_PROGRESS_SECONDS", "3600")
    log = io.StringIO()
    bar = progress_bar(total=4800, desc="sft", stream=log)
    for _ in range(4800):
        bar.update(1)
        bar.set_postfix(loss="0.123", refresh=False)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and log.getvalue().endswith("\n")
    assert 1 <= len(lines) <= 3  # the first draw, perhaps one on the way, the last: not 4,800
    assert lines[-1].startswith("sft: 100%") and "4800/4800" in lines[-1] and "loss=0.123" in lines[-1]


def test_on_a_terminal_a_bar_redraws_in_place():
    screen = Terminal()
    bar = progress_bar(range(3), desc="ppo", stream=screen, mininterval=0)
    for _ in bar:
        pass
    assert screen.getvalue().count("\r") >= 3 and "ppo: 100%" in screen.getvalue()


def test_off_a_terminal_a_bar_that_would_not_stay_still_writes_its_last_line(monkeypatch):
    monkeypatch.setenv("RLHF_PROGRESS_SECONDS", "not a number")  # falls back to the default interval
    log = io.StringIO()
    bar = progress_bar(total=10, desc="reward", stream=log, leave=False)
    bar.update(10)
    bar.close()
    assert log.getvalue().splitlines()[-1].startswith("reward: 100%")
