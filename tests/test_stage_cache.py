"""`run_stage`, the one place a stage is cached, tracked and committed: what it tells the user."""

import logging

import pandas as pd

from rlhf_core.artifacts import ArtifactRef
from tasks.common import RunContext, run_stage
from tasks.tracking import Tracker


def test_the_log_says_a_stage_ran_then_that_it_came_from_the_cache(tmp_path, caplog):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = Tracker(uri, "stage-log").start_run("round", {})
    ctx = RunContext(workdir=str(tmp_path), tracking_uri=uri, experiment="stage-log", parent_run_id=parent,
                     round_name="t")

    def produce(out, run):
        (out / "numbers.json").write_text("[1, 2, 3]")
        return {"count": 3.0}

    def once() -> ArtifactRef:
        return run_stage(ctx, stage="count", version="1", kind="numbers", config={"n": 3}, inputs={},
                         produce=produce, execution={"num_processes": 1})

    with caplog.at_level(logging.INFO, logger="rlhf"):
        first = once()
        second = once()
    messages = [r.getMessage() for r in caplog.records if r.name == "rlhf"]
    assert messages[0] == "stage count: running"
    assert messages[1].startswith("stage count: done in ") and messages[1].endswith(f"(numbers {first.digest[:12]})")
    assert messages[2] == f"stage count: served from the cache (numbers {first.digest[:12]}, stage version 1)"
    assert second == first and len(messages) == 3


def test_the_experiment_opens_on_mlflows_model_training_view(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    client.create_experiment("made-elsewhere")  # an experiment this project did not create gets the tag too
    for name in ("ours", "made-elsewhere"):
        Tracker(uri, name)
        assert client.get_experiment_by_name(name).tags["mlflow.experimentKind"] == "custom_model_development"


def test_a_cache_hit_on_a_new_mlflow_store_logs_the_per_step_metrics_the_miss_logged(tmp_path):
    """As PPO's per-iteration curves: the hit's run gets one value per (step, metric), the last one logged,
    even when the miss was killed and resumed (the history then holds a step twice) or left a torn line."""
    from mlflow import MlflowClient

    from tasks.common import METRIC_HISTORY

    def context(store: str) -> RunContext:
        uri = f"sqlite:///{tmp_path / store}"
        parent = Tracker(uri, "history").start_run("round", {})
        return RunContext(workdir=str(tmp_path / "work"), tracking_uri=uri, experiment="history",
                          parent_run_id=parent, round_name="t")

    def produce(out, run):
        for step, value in [(1, 0.5), (2, 0.25), (2, 0.3)]:  # step 2 again: a resumed run's last word counts
            run.log_metrics({"ppo/loss": value, "iteration": float(step)}, step=step)
        with open(run.plots / METRIC_HISTORY, "a") as f:
            f.write('{"step": 3, "metr')  # a kill in the middle of a line
        (out / "numbers.json").write_text("[1]")
        return {"count": 1.0}

    def once(ctx: RunContext) -> str:
        run_stage(ctx, stage="count", version="1", kind="numbers", config={}, inputs={}, produce=produce)
        client = MlflowClient(ctx.tracking_uri)
        run = client.search_runs([client.get_experiment_by_name("history").experiment_id],
                                 filter_string="tags.`rlhf.stage` = 'count'")[0]
        history = client.get_metric_history(run.info.run_id, "ppo/loss")
        return run.data.tags["rlhf.cache"], sorted((m.step, m.value) for m in history)

    assert once(context("miss.db")) == ("miss", [(1, 0.5), (2, 0.25), (2, 0.3)])  # as logged, live
    assert once(context("hit.db")) == ("hit", [(1, 0.5), (2, 0.3)])


def test_a_noisier_crowd_reuses_the_prompt_pool_and_the_sft_policy_but_other_demonstrations_do_not(tmp_path):
    """The world and SFT stages are keyed on the world fields they read (tasks.world.POOL_FIELDS,
    SFT_FIELDS): the annotators' settings change the labels only."""
    from rlhf_core.config import PolicyModelConfig, SFTConfig, WorldConfig
    from tasks.world import build_world, train_sft_policy

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ctx = RunContext(workdir=str(tmp_path), tracking_uri=uri, experiment="world-keys",
                     parent_run_id=Tracker(uri, "world-keys").start_run("round", {}), round_name="t")
    model, sft = PolicyModelConfig(hidden_size=16, intermediate_size=32), SFTConfig(steps=2, batch_size=4)

    def stages(world: WorldConfig) -> tuple[ArtifactRef, ArtifactRef]:
        prompts = build_world.fn(ctx, world, seed=0)
        return prompts, train_sft_policy.fn(ctx, world, model, sft, prompts, seed=0)

    base = WorldConfig(n_prompts=10, n_eval_prompts=4)
    records: list[logging.LogRecord] = []  # on the logger itself: Prefect's logging setup replaces the root's handlers
    handler, logger = logging.Handler(logging.INFO), logging.getLogger("rlhf")
    handler.emit, old_level = records.append, logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        first = stages(base)
        noisier = stages(base.model_copy(update={"annotator_error_max": 0.4, "annotator_temperature": 2.0,
                                                  "n_annotators": 3}))
        other_demos = stages(base.model_copy(update={"demo_correct_prob": 0.9}))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    served = [r.getMessage().split(":")[0] for r in records if "served from the cache" in r.getMessage()]
    assert noisier == first
    assert served == ["stage world", "stage sft", "stage world"]  # the third SFT ran: its demonstrations changed
    assert other_demos[0] == first[0] and other_demos[1] != first[1]
    # held out by text: the SFT policy (and every pair drawn from the pool) never sees a held-out prompt, even in a
    # world of ~160 texts (four problems), where 200 draws would otherwise repeat some
    small = build_world.fn(ctx, WorldConfig(n_prompts=200, n_eval_prompts=4, max_operand=1, operations=["+"]), seed=0)
    pool, held_out = (pd.read_parquet(small.file(name)) for name in ("prompts.parquet", "eval_prompts.parquet"))
    assert len(pool) == 200 and len(held_out) == 4 and not pool["prompt"].isin(set(held_out["prompt"])).any()


def test_a_stage_body_runs_with_the_live_objects_frozen_and_the_garbage_collected(tmp_path):
    """`freeze_long_lived_objects`: the tracking state made before a stage's body stays out of the collections
    the body triggers (the young generations are empty when it starts), cyclic garbage made before is collected,
    not frozen (nothing leaks), and what the body makes is collected as usual."""
    import gc
    import weakref

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = Tracker(uri, "freeze").start_run("round", {})
    ctx = RunContext(workdir=str(tmp_path), tracking_uri=uri, experiment="freeze", parent_run_id=parent,
                     round_name="t")

    class Node:
        pass

    def cycle() -> weakref.ref:
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    alive = Node()  # alive across the stage: frozen
    before = cycle()  # garbage made before the stage, only a collection can free it
    seen = {}

    def produce(out, run):
        seen["generations"] = [len(gc.get_objects(generation=g)) for g in range(3)]
        seen["alive_tracked"] = any(o is alive for o in gc.get_objects())
        seen["garbage_before"] = before()
        during = cycle()
        gc.collect()
        seen["garbage_during"] = during()
        (out / "x.json").write_text("1")
        return {}

    run_stage(ctx, stage="freeze", version="1", kind="numbers", config={}, inputs={}, produce=produce)
    assert seen["garbage_before"] is None and seen["garbage_during"] is None
    assert not seen["alive_tracked"]  # in the permanent generation, which gc.get_objects leaves out
    assert seen["generations"][2] < 1000, seen["generations"]  # only what the stage's own start made


def test_a_cache_hit_says_that_ranks_or_deepspeed_just_set_do_not_run_the_stage_again():
    """`--set generation.num_processes=2` on a workdir that already holds the stage's output changed nothing, and
    nothing said so; the defaults (1 rank, no DeepSpeed) go unsaid."""
    from tasks.common import _execution_note

    assert _execution_note({"num_processes": 1, "deepspeed": None}) == "" and _execution_note(None) == ""
    assert _execution_note({"http": {"timeout_s": 60.0, "max_retries": 4}, "prompt_source": None}) == ""
    assert _execution_note({"num_processes": 2, "deepspeed": "zero3"}) == (
        "; deepspeed=zero3, num_processes=2 change how it runs, not what it makes, so they do not run it again")


def test_a_stage_that_fails_on_a_damaged_input_names_it_and_the_command_that_repairs_it(tmp_path):
    """A byte changed in a cached votes table: the next stage failed with "Corrupt snappy compressed data"."""
    import pytest

    from rlhf_core.artifacts import DamagedArtifactError

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = Tracker(uri, "damaged").start_run("round", {})
    ctx = RunContext(workdir=str(tmp_path), tracking_uri=uri, experiment="damaged", parent_run_id=parent,
                     round_name="t")

    def make_table(out, run):
        pd.DataFrame({"x": range(100)}).to_parquet(out / "votes.parquet")
        return {}

    def read_table(out, run):
        (out / "n.txt").write_text(str(len(pd.read_parquet(votes.file("votes.parquet")))))
        return {}

    votes = run_stage(ctx, stage="vote", version="1", kind="votes", config={}, inputs={}, produce=make_table)
    data = votes.file("votes.parquet").read_bytes()
    votes.file("votes.parquet").write_bytes(data[: len(data) // 2])  # cut short, as by a full disk or a bad copy
    with pytest.raises(DamagedArtifactError, match=rf"votes \(votes:{votes.digest[:12]}: votes.parquet: changed .*"
                                                   rf"rlhf verify {tmp_path} --remove"):
        run_stage(ctx, stage="denoise", version="1", kind="denoised", config={}, inputs={"votes": votes},
                  produce=read_table)
    with pytest.raises(ZeroDivisionError):  # a stage's own bug, inputs intact: its own error, untouched
        run_stage(ctx, stage="other", version="1", kind="x", config={}, inputs={}, produce=lambda out, run: 1 / 0)
