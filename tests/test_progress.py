"""Progress bars: a redraw per update on a terminal; elsewhere (a log file, a worker's pipe into the Prefect
run's log) plain lines, at most one per interval, and the final count when the bar closes."""

import io

from prefect_logs import run_and_read_logs

from rlhf_core.progress import lines_to, progress_bar


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


def test_inside_lines_to_the_lines_go_to_the_sink_and_a_terminal_keeps_its_bar():
    log, screen, sink = io.StringIO(), Terminal(), []
    with lines_to(sink.append):
        bar = progress_bar(total=3, desc="sft", stream=log)
        bar.update(3)
        bar.close()
        for _ in progress_bar(range(2), desc="ppo", stream=screen, mininterval=0):
            pass
    assert log.getvalue() == "" and sink[-1].startswith("sft: 100%") and "3/3" in sink[-1]
    assert "ppo: 100%" in screen.getvalue() and not any(line.startswith("ppo") for line in sink)
    bar = progress_bar(total=1, desc="after", stream=log)  # outside: written again
    bar.update(1)
    bar.close()
    assert log.getvalue().splitlines()[-1].startswith("after: 100%") and not any(x.startswith("after") for x in sink)


def test_a_stage_that_runs_in_the_prefect_process_shows_its_progress_in_the_runs_log(prefect_api, tmp_path):
    """Workers' lines reach the Prefect run's log through the launcher; a stage's own bars (SFT, single-process
    generation and voting, the reward model) reached only the process's stderr, which no UI shows."""
    from prefect import flow

    from tasks.common import RunContext, run_stage
    from tasks.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def produce(out, run):
        for _ in progress_bar(range(5), desc="probe", stream=io.StringIO()):  # as off a terminal, on a worker
            pass
        (out / "numbers.json").write_text("[5]")
        return {}

    @flow
    def one_stage() -> str:
        from prefect.runtime import flow_run

        ctx = RunContext(workdir=str(tmp_path), tracking_uri=uri, experiment="progress",
                         parent_run_id=Tracker(uri, "progress").start_run("round", {}), round_name="t")
        run_stage(ctx, stage="count", version="1", kind="numbers", config={}, inputs={}, produce=produce)
        return flow_run.id

    messages = run_and_read_logs(one_stage, of="flow")
    lines = [m for m in messages if m.startswith("probe: 100%")]
    assert lines and "5/5" in lines[-1], messages
