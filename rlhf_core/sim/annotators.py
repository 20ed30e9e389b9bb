"""Simulated crowd annotators who write a real Label Studio JSON export (pairwise template).

Annotator k has an error rate e_k ~ U[0, annotator_error_max], drawn once per seed. Each
comparison task is labelled by `annotators_per_pair` distinct annotators. One label:

    P(prefer A) = sigmoid((gold(A) - gold(B)) / annotator_temperature)    (Bradley-Terry)
    then the annotator flips the label with probability e_k.

With the defaults, raw labels agree with gold on about 63-75 % of pairs of demonstrations,
the agreement reported for real crowd annotation (see tests/test_sim.py).

The export is what Label Studio writes for the pairwise template

    <View>
      <Text name="prompt" value="$prompt"/>
      <Text name="answer1" value="$answer1"/>
      <Text name="answer2" value="$answer2"/>
      <Pairwise name="comparison" toName="pairwise" .../>
    </View>

with the pipeline's ids in `data`; "selected": "left" prefers answer1 (= response A).
"""

from __future__ import annotations

import math
import random
import string
from datetime import datetime, timedelta, timezone

import pandas as pd

from rlhf_core.annotation.tasks import label_studio_task_data
from rlhf_core.config import WorldConfig
from rlhf_core.sim.world import GOLD_TIE, gold_score

# Fixed clock of the simulated project, shifted by the seed, so an export is a function of its seed.
_EPOCH = datetime(2026, 1, 5, 9, 0, 0, tzinfo=timezone.utc)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def annotator_error_rates(cfg: WorldConfig, seed: int) -> dict[int, float]:
    """Annotator id (1..n_annotators, Label Studio user ids) -> label-flip rate in [0, max]."""
    rng = random.Random(f"annotators-{seed}")
    return {k: rng.uniform(0.0, cfg.annotator_error_max) for k in range(1, cfg.n_annotators + 1)}


def label_pair(gold_diff: float, error_rate: float, temperature: float, rng: random.Random) -> str:
    """One noisy label: "left" (A preferred) with prob sigmoid(gold_diff / T), flipped with prob e."""
    left = rng.random() < sigmoid(gold_diff / temperature)
    if rng.random() < error_rate:
        left = not left
    return "left" if left else "right"


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _result_id(rng: random.Random) -> str:
    """Label Studio's 10-character region id."""
    return "".join(rng.choices(string.ascii_letters + string.digits + "_-", k=10))


def simulate_label_studio_export(tasks: pd.DataFrame, cfg: WorldConfig, seed: int) -> list[dict]:
    """Label every comparison task and return the Label Studio export (a list of task objects).

    `tasks`: task_id, prompt_id, prompt, response_a_id, response_a, response_b_id, response_b.
    Deterministic for a seed, timestamps included.
    """
    if cfg.annotators_per_pair > cfg.n_annotators:
        raise ValueError(
            f"annotators_per_pair ({cfg.annotators_per_pair}) exceeds n_annotators ({cfg.n_annotators}): "
            "each task needs that many distinct annotators"
        )
    error_rates = annotator_error_rates(cfg, seed)
    rng = random.Random(f"labels-{seed}")
    clock = _EPOCH + timedelta(days=seed % 1000)
    export, annotation_id = [], 0
    for i, row in enumerate(tasks.itertuples(index=False), start=1):
        gold_diff = gold_score(row.prompt, row.response_a) - gold_score(row.prompt, row.response_b)
        task_created = clock
        annotations = []
        for annotator in sorted(rng.sample(sorted(error_rates), cfg.annotators_per_pair)):
            annotation_id += 1
            lead_time = round(rng.uniform(4.0, 40.0), 3)  # seconds spent reading and choosing
            clock += timedelta(seconds=lead_time)
            selected = label_pair(gold_diff, error_rates[annotator], cfg.annotator_temperature, rng)
            annotations.append(
                {
                    "id": annotation_id,
                    "completed_by": annotator,
                    "result": [
                        {
                            "id": _result_id(rng),
                            "type": "pairwise",
                            "from_name": "comparison",
                            "to_name": "pairwise",
                            "origin": "manual",
                            "value": {"selected": selected},
                        }
                    ],
                    "was_cancelled": False,
                    "ground_truth": False,
                    "created_at": _iso(clock),
                    "updated_at": _iso(clock),
                    "lead_time": lead_time,
                }
            )
        export.append(
            {
                "id": i,
                "data": label_studio_task_data(row),
                "annotations": annotations,
                "predictions": [],
                "meta": {},
                "created_at": _iso(task_created),
                "updated_at": _iso(clock),
                "inner_id": i,
                "total_annotations": len(annotations),
                "cancelled_annotations": 0,
                "total_predictions": 0,
                "project": 1,
            }
        )
    return export


def gold_agreement(tasks: pd.DataFrame, export: list[dict]) -> float:
    """Share of (non-cancelled) labels whose choice matches the sign of gold(A) - gold(B).

    Pairs with a gold tie are skipped (no label can be right or wrong). NaN if nothing counts.
    """
    by_task = {row.task_id: row for row in tasks.itertuples(index=False)}
    agree = total = 0
    for task in export:
        row = by_task[task["data"]["task_id"]]
        gold_diff = gold_score(row.prompt, row.response_a) - gold_score(row.prompt, row.response_b)
        if abs(gold_diff) < GOLD_TIE:
            continue
        for annotation in task["annotations"]:
            if annotation.get("was_cancelled"):
                continue
            selected = annotation["result"][0]["value"]["selected"]
            agree += (selected == "left") == (gold_diff > 0)
            total += 1
    return agree / total if total else float("nan")
