"""The Prefect UI's run form: what Prefect builds from the flows' signatures and docstrings.

Prefect reads each parameter's description from the docstring's Args section and renders a pydantic
parameter (RoundConfig) as a nested form from its JSON schema, field descriptions included. The UI
renders descriptions as HTML, so a `<word>` in one disappears from the form.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import pytest
from prefect.utilities.callables import parameter_schema

from flows.chaining import watch_exports
from flows.round import rlhf_round, rlhf_rounds
from flows.stages import rlhf_stage

FLOWS = [rlhf_round, rlhf_rounds, rlhf_stage, watch_exports]

# What an HTML renderer takes for the start of a tag: `<` then a letter, `/`, `!` or `?` ("mean < 0" is kept).
HTML_TAG = re.compile(r"<[A-Za-z/!?]")


def schema_of(flow) -> dict[str, Any]:
    return parameter_schema(flow.fn).model_dump()


def descriptions(schema: dict[str, Any]) -> Iterator[tuple[str, str | None]]:
    """(where, description) of every top-level parameter, every model and every model's field."""
    for name, prop in schema["properties"].items():
        yield f"parameter {name}", prop.get("description")
    for model, definition in schema.get("definitions", {}).items():
        yield f"model {model}", definition.get("description")
        for name, prop in definition.get("properties", {}).items():
            yield f"{model}.{name}", prop.get("description")


def test_the_tag_pattern_catches_what_html_eats():
    assert HTML_TAG.search("store under <workdir>/artifacts")
    assert HTML_TAG.search("round-</name>")
    assert not HTML_TAG.search("flip pairs whose mean < 0; {workdir}/mlflow.db; `name`")


@pytest.mark.parametrize("flow", FLOWS, ids=lambda f: f.name)
def test_every_parameter_and_field_has_a_description(flow):
    missing = [where for where, text in descriptions(schema_of(flow)) if not (text or "").strip()]
    assert missing == []


@pytest.mark.parametrize("flow", FLOWS, ids=lambda f: f.name)
def test_no_description_holds_what_the_ui_would_render_as_a_tag(flow):
    tags = {where: text for where, text in descriptions(schema_of(flow)) if HTML_TAG.search(text or "")}
    assert tags == {}


def test_the_round_form_puts_what_changes_per_round_first():
    fields = list(schema_of(rlhf_round)["definitions"]["RoundConfig"]["properties"])
    assert fields[:7] == ["name", "seed", "workdir", "tracking_uri", "experiment", "annotation", "iteration"]
    # then the stage sections in the order the round runs them
    assert fields[7:] == ["world", "policy_model", "sft", "sampling", "generation", "voting", "denoise", "reward",
                          "ppo", "evaluation"]


def test_the_flow_parameters_keep_their_signature_order():
    properties = schema_of(rlhf_round)["properties"]
    assert [name for name, _ in sorted(properties.items(), key=lambda item: item[1]["position"])] == [
        "config", "stop_after", "round_no", "start_policy", "config_path", "earlier_pairs", "annotation_exports",
        "series_run_id", "previous_round_run_id", "wait_for_workdir_minutes"]
    assert properties["config"]["description"].startswith("the whole round")
